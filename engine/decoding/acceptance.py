"""The speculative acceptance rule, used unchanged at L1 (L0's drafts) and at L2 (L1's drafts).

Given draft tokens x_1..x_k drawn from q and the verifier's distributions p_1..p_{k+1}:
accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection draw the
correction from normalize(max(p_i - q_i, 0)); if all k are accepted draw a bonus from p_{k+1}.
The output is then distributed exactly as sampling from p alone (Leviathan et al., 2023).
Greedy (temperature 0) is the argmax special case: no division, no NaN.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.settings import Sampling


def target_probs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """logits [N, V] -> the target distribution [N, V] (float32) after temperature, top-k, top-p.

    Every level applies this same warp, so p and q are comparable and the output is exactly the
    warped target's. Not used under greedy.
    """
    logits = logits.float() / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]  # [N, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it included)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before >= sampling.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many draft tokens were accepted (0..k)
    next_token: int  # the correction (on rejection) or the bonus (on full acceptance)
    next_probs: torch.Tensor | None  # [V] the distribution next_token was drawn from (None under greedy)


def verify(draft: list[int], draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
           sampling: Sampling, generator: torch.Generator | None = None,
           target: torch.Tensor | None = None) -> Verdict:
    """Check `draft` (k tokens) against the verifier.

    draft_probs: [k, V] the distributions the drafts were drawn from; None means each draft was a
      deterministic proposal (n-gram lookup), i.e. q is one-hot on the drafted token.
    target_logits: [k+1, V] the verifier's logits at the k draft positions and one more.
    target: optional precomputed target_probs(target_logits) (sampling only).
    """
    k = len(draft)
    if sampling.greedy:
        best = target_logits.argmax(dim=-1).tolist()  # [k+1]
        n = 0
        while n < k and draft[n] == best[n]:
            n += 1
        return Verdict(n, int(best[n]), None)
    p = target if target is not None else target_probs(target_logits, sampling)  # [k+1, V]
    if draft_probs is not None and draft_probs.device != p.device:  # a draft model on another card
        draft_probs = draft_probs.to(p.device)
    for i, token in enumerate(draft):
        p_x = float(p[i, token])
        q_x = float(draft_probs[i, token]) if draft_probs is not None else 1.0
        u = float(torch.rand((), generator=generator))
        if u * q_x < p_x:  # u < p/q without dividing; q_x > 0 since the draft was drawn from q
            continue
        if draft_probs is not None:
            residual = (p[i] - draft_probs[i]).clamp_min(0.0)
        else:
            residual = p[i].clone()
            residual[token] = 0.0
        total = residual.sum()
        if total <= 0:  # p == q exactly on the support: rejection has probability 0; guard anyway
            residual, total = p[i], p[i].sum()
        residual = residual / total
        return Verdict(i, _draw(residual, generator), residual)
    return Verdict(k, _draw(p[k], generator), p[k])


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    # the generator lives on the CPU so runs are reproducible across devices
    return int(torch.multinomial(probs.float().cpu(), 1, generator=generator).item())


def sample_token(logits: torch.Tensor, sampling: Sampling,
                 generator: torch.Generator | None = None) -> tuple[int, torch.Tensor | None]:
    """One token from logits [V]; returns (token, the distribution it came from or None if greedy)."""
    if sampling.greedy:
        return int(logits.argmax().item()), None
    probs = target_probs(logits[None], sampling)[0]
    return _draw(probs, generator), probs
