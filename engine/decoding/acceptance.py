"""The speculative acceptance rule, used unchanged at L1 (L0's drafts) and at L2 (L1's drafts).

Given draft tokens x_1..x_k drawn from q and the verifier's distributions p_1..p_{k+1}:
accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection draw the
correction from normalize(max(p_i - q_i, 0)); if all k are accepted draw a bonus from p_{k+1}.
The output is then distributed exactly as sampling from p alone (Leviathan et al., 2023).
Greedy (temperature 0) is the argmax special case: no division, no NaN.

The repetition penalty (presence/frequency, as OpenAI's) is part of the warp that defines the
target: at a position whose preceding answer tokens hold token v c_v times,
    logit'(v) = logit(v) - frequency * c_v - presence * [c_v > 0].
It depends on the tokens before the position, so a verification of k drafts warps its row i with
the answer so far plus drafts[:i] (`penalty_counts`), and every level warps the same way: then p
and q are distributions of the same warped target and the output is exactly its.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.settings import Sampling


def penalty_counts(sampling: Sampling, answer: Sequence[int], drafts: Sequence[int], vocab: int,
                   device: torch.device | str = "cpu") -> torch.Tensor | None:
    """[k+1, V] float32 occurrence counts before each of the k+1 positions one forward checks:
    `answer` (the answer's tokens so far, the pending one included), then drafts[:i] at row i.
    None when `sampling` has no penalty (nothing to count)."""
    if not sampling.penalized:
        return None
    ids = torch.as_tensor(list(answer), dtype=torch.int64)
    base = torch.bincount(ids, minlength=vocab)[:vocab].to(device=device, dtype=torch.float32)  # [V]
    counts = base.repeat(len(drafts) + 1, 1)  # [k+1, V]
    for i, token in enumerate(drafts):
        counts[i + 1:, token] += 1  # a draft counts for every later position of the same forward
    return counts


def penalize(logits: torch.Tensor, sampling: Sampling, counts: torch.Tensor | None) -> torch.Tensor:
    """logits [N, V] minus the repetition penalty for `counts` [N, V] (None: unchanged)."""
    if counts is None:
        return logits
    counts = counts.to(logits.device)
    return logits.float() - sampling.frequency_penalty * counts - sampling.presence_penalty * (counts > 0).float()


def target_probs(logits: torch.Tensor, sampling: Sampling, counts: torch.Tensor | None = None) -> torch.Tensor:
    """logits [N, V] -> the target distribution [N, V] (float32) after the repetition penalty
    (`counts` [N, V] from penalty_counts), temperature, top-k, top-p.

    Every level applies this same warp, so p and q are comparable and the output is exactly the
    warped target's. Not used under greedy.
    """
    logits = penalize(logits, sampling, counts).float() / sampling.temperature
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
           target: torch.Tensor | None = None, counts: torch.Tensor | None = None) -> Verdict:
    """Check `draft` (k tokens) against the verifier.

    draft_probs: [k, V] the distributions the drafts were drawn from; None means each draft was a
      deterministic proposal (n-gram lookup), i.e. q is one-hot on the drafted token.
    target_logits: [k+1, V] the verifier's logits at the k draft positions and one more.
    target: optional precomputed target_probs(target_logits, sampling, counts) (sampling only).
    counts: [k+1, V] penalty_counts for the k+1 positions (None: no repetition penalty).
    """
    k = len(draft)
    if sampling.greedy:
        best = penalize(target_logits, sampling, counts).argmax(dim=-1).tolist()  # [k+1]
        n = 0
        while n < k and draft[n] == best[n]:
            n += 1
        return Verdict(n, int(best[n]), None)
    p = target if target is not None else target_probs(target_logits, sampling, counts)  # [k+1, V]
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


def sample_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None,
                 counts: torch.Tensor | None = None) -> tuple[int, torch.Tensor | None]:
    """One token from logits [V] (`counts` [V] or [1, V]: the penalty's occurrence counts); returns
    (token, the distribution it came from or None if greedy)."""
    counts = counts.reshape(1, -1) if counts is not None else None
    if sampling.greedy:
        return int(penalize(logits[None], sampling, counts)[0].argmax().item()), None
    probs = target_probs(logits[None], sampling, counts)[0]
    return _draw(probs, generator), probs
