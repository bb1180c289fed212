"""Under sampling, TriForce's output is distributed exactly as the target's own sampling.

A tiny model with a 12-token vocabulary lets us compute the exact distribution of the generated
tokens and compare it with many TriForce samples (chi-square). The same test run with the
reference code's L1 bug (correction drawn from p instead of the residual) must fail it, which
shows the test has the power to catch that bug.
"""
from __future__ import annotations

import math

import pytest
import torch
from gguf import GGMLQuantizationType, quants

from engine import native
from engine.model import draft_vocab
from engine.model.fused_layers import FusedLayers
from engine.decoding.acceptance import Verdict, target_probs, verify
from engine.kv.full import FullCache
from engine.decoding.drafters import ModelDrafter, NgramDrafter
from engine.decoding.structure import Structure
from engine.model.quant import QuantWeight
from engine.model.runner import LlamaRunner
from engine.settings import DecodeSettings, Mode, Sampling
from engine.decoding.speculative import HierarchicalDecoder
from random_models import random_runner

VOCAB = 12
SAMPLES = 2000
SAMPLING = Sampling(temperature=1.0, top_p=1.0, top_k=0)


def tiny_runner(seed: int, logit_scale: float) -> LlamaRunner:
    return random_runner(seed, vocab=VOCAB, hidden=32, logit_scale=logit_scale)


def buggy_l1_verify(draft, draft_probs, target_logits, sampling, generator=None, target=None) -> Verdict:
    """The published reference code's L1 rule: on rejection it resamples from p, not the residual."""
    verdict = verify(draft, draft_probs, target_logits, sampling, generator, target)
    if verdict.accepted < len(draft):
        p = target if target is not None else target_probs(target_logits, sampling)
        token = int(torch.multinomial(p[verdict.accepted], 1, generator=generator))
        return Verdict(verdict.accepted, token, p[verdict.accepted])
    return verdict


PROMPT = [3, 7, 1, 4, 4, 9, 2, 0, 5, 11, 6, 8, 3, 3, 10, 1, 2, 7, 7, 5, 9, 0, 4, 6, 8, 1, 2, 3, 10, 11, 5, 6,
          7, 2, 9, 4, 1, 0, 8, 3]


def exact_distribution(target: LlamaRunner, first: int, steps: int) -> list[torch.Tensor]:
    """Exact marginals of the next `steps` tokens after PROMPT + [first] under plain sampling."""
    marginals = []
    frontier = {(first,): 1.0}
    for _ in range(steps):
        nxt: dict[tuple, float] = {}
        marginal = torch.zeros(VOCAB, dtype=torch.float64)
        for seq, mass in frontier.items():
            ids = PROMPT + list(seq)
            cache = FullCache(2, 2, 8, len(ids), torch.float32, "cpu")
            logits = target.forward(torch.tensor(ids), torch.arange(len(ids)), cache, last_only=True)
            probs = target_probs(logits, SAMPLING)[0].double()
            marginal += mass * probs
            for tok in range(VOCAB):
                nxt[seq + (tok,)] = mass * float(probs[tok])
        frontier = nxt
        marginals.append(marginal)
    return marginals


def triforce_samples(target: LlamaRunner, draft: LlamaRunner | None, first: int, steps: int, l1_rule,
                     mode: str = "triforce", script: list[Structure] | None = None) -> torch.Tensor:
    """SAMPLES runs of TriForce (or `mode`, its policy scripted by `script`) from the same
    prefilled prompt (draft None: n-gram lookups as L0); returns counts [steps, VOCAB]."""
    settings = DecodeSettings(mode=mode, budget=16, chunk=8, gamma1=2, gamma2=3, sampling=SAMPLING,
                              max_new_tokens=steps + 1)
    full = FullCache(2, 2, 8, 256, torch.float32, "cpu")
    full.capture_query = True
    target.forward(torch.tensor(PROMPT), torch.arange(len(PROMPT)), full)
    query = list(full.last_query)
    generator = torch.Generator().manual_seed(1234)
    drafter = ModelDrafter(draft, sinks=2, window=8) if draft is not None else NgramDrafter()
    decoder = HierarchicalDecoder(target, full, drafter, settings, generator)
    decoder.l1_verify = l1_rule
    decoder.policy.forced = list(script) if script else None
    counts = torch.zeros(steps, VOCAB, dtype=torch.float64)
    for _ in range(SAMPLES):
        full.rollback(len(PROMPT))
        decoder.after_prefill(query)
        seq = PROMPT + [first]
        while len(seq) < len(PROMPT) + 1 + steps:
            seq += [tok for tok, _ in decoder.step(seq)]
        for i in range(steps):
            counts[i, seq[len(PROMPT) + 1 + i]] += 1
    return counts


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit, bins with expected count < 5 merged."""
    expected = probs * counts.sum()
    order = torch.argsort(expected)
    obs_bins, exp_bins, acc_o, acc_e = [], [], 0.0, 0.0
    for i in order.tolist():
        acc_o += float(counts[i])
        acc_e += float(expected[i])
        if acc_e >= 5:
            obs_bins.append(acc_o)
            exp_bins.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0:
        obs_bins[-1] += acc_o
        exp_bins[-1] += acc_e
    stat = sum((o - e) ** 2 / e for o, e in zip(obs_bins, exp_bins))
    dof = len(obs_bins) - 1
    return _chi2_sf(stat, dof)


def _chi2_sf(x: float, k: int) -> float:
    """Survival function of chi-square with k degrees of freedom (regularized upper gamma)."""
    a, z = k / 2.0, x / 2.0
    # series for the lower incomplete gamma
    term = total = 1.0 / a
    n = 1
    while abs(term) > 1e-15 * abs(total) and n < 10000:
        term *= z / (a + n)
        total += term
        n += 1
    lower = total * math.exp(-z + a * math.log(z) - math.lgamma(a)) if z > 0 else 0.0
    return max(0.0, 1.0 - lower)


@pytest.fixture(scope="module")
def models():
    target = tiny_runner(seed=0, logit_scale=1.5)
    draft = tiny_runner(seed=1, logit_scale=1.5)  # a different model: many L1 rejections
    return target, draft


STEPS = 2


def test_triforce_sampling_matches_exact_target_distribution(models):
    target, draft = models
    first = 5
    exact = exact_distribution(target, first, STEPS)
    counts = triforce_samples(target, draft, first, STEPS, verify)
    for i in range(STEPS):
        p_value = chi_square_p_value(counts[i], exact[i])
        tv = 0.5 * (counts[i] / SAMPLES - exact[i]).abs().sum().item()
        assert p_value > 1e-3, f"token {i + 2}: TriForce's distribution differs (p={p_value:.2e}, TV={tv:.3f})"


# auto switching structure at every cycle, in an order that does not divide the cycle count
SWITCHING = [Structure(Mode.TRIFORCE, 2, 3), Structure(Mode.AR), Structure(Mode.DRAFT_ONLY, 2, 1),
             Structure(Mode.RETRIEVAL_ONLY, 1, 2), Structure(Mode.TRIFORCE, 1, 1)]


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("script", [SWITCHING, None], ids=["switching-every-cycle", "unscripted"])
def test_auto_matches_exact_target_distribution(models, script, drafter):
    """auto scripted to switch structure at every cycle, and auto left to its own choices, with a
    draft model or n-gram lookups (one-hot q) as L0."""
    target, draft = models
    first = 5
    exact = exact_distribution(target, first, STEPS)
    counts = triforce_samples(target, draft if drafter == "model" else None, first, STEPS, verify, mode="auto",
                              script=script)
    for i in range(STEPS):
        p_value = chi_square_p_value(counts[i], exact[i])
        assert p_value > 1e-3, f"token {i + 2}: auto's distribution differs (p={p_value:.2e})"


def quantized(runner: LlamaRunner) -> LlamaRunner:
    """`runner` with its layers' projections as Q4_1 blocks: a quantized target, whose L1 drafts
    with int16 activations (an approximation of it, as a retrieval cache is)."""
    for layer in runner.layers:
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            w = getattr(layer, name)
            blocks = quants.quantize(w.numpy(), GGMLQuantizationType.Q4_1)
            setattr(layer, name, QuantWeight("Q4_1", blocks, w.shape[1]))
        layer.gate_up_packed = None
    return runner


@pytest.mark.skipif(not native.available(), reason="no native kernels")
@pytest.mark.parametrize("mode", ["retrieval-only", "triforce"])
def test_an_int16_l1_keeps_the_quantized_targets_distribution(mode, monkeypatch):
    """L1's projections on int16 activations change only the drafts: the output is still distributed
    as the quantized target's own sampling. (Its layers run in one native call each where the cache
    allows, else in Python: both paths are watched.)"""
    target = quantized(tiny_runner(seed=0, logit_scale=1.5))
    assert target.drafts_int16
    calls = []
    real = native.BlockMatrix.matmul_int16
    monkeypatch.setattr(native.BlockMatrix, "matmul_int16", lambda self, x: calls.append(1) or real(self, x))
    fused = FusedLayers.forward
    monkeypatch.setattr(FusedLayers, "forward",
                        lambda self, *a: (calls.append(1) if a[4] else None) or fused(self, *a))
    first = 5
    exact = exact_distribution(target, first, STEPS)
    assert not calls  # the target's own forwards never take it
    counts = triforce_samples(target, None, first, STEPS, verify, mode=mode)
    assert calls
    for i in range(STEPS):
        p_value = chi_square_p_value(counts[i], exact[i])
        assert p_value > 1e-3, f"token {i + 2}: {mode} with an int16 L1 differs (p={p_value:.2e})"


@pytest.mark.parametrize("mode", ["retrieval-only", "triforce"])
def test_an_l1_scoring_part_of_the_vocabulary_keeps_the_targets_distribution(mode, monkeypatch):
    """On the CPU L1 scores only a subset of the vocabulary (engine/model/draft_vocab.py): its q is 0
    outside it, so the target's tokens there come only from the residual. Here the subset is held at
    tokens 0-5 of 12 (the prompt's tokens not added): the first token's mass lies mostly inside it,
    the second's mostly outside."""
    monkeypatch.setattr(draft_vocab, "COMMON_TOKENS", 6)
    monkeypatch.setattr(draft_vocab, "MAX_SHARE", 0.75)
    monkeypatch.setattr(draft_vocab.DraftVocabulary, "cover", lambda self, seq: None)
    sizes = []
    real = draft_vocab.DraftVocabulary.logits
    monkeypatch.setattr(draft_vocab.DraftVocabulary, "logits", lambda self, h: sizes.append(self.count) or real(self, h))
    target = tiny_runner(seed=0, logit_scale=1.5)
    first = 5
    exact = exact_distribution(target, first, STEPS)
    assert float(exact[0][:6].sum()) > 0.9 and float(exact[1][6:].sum()) > 0.9
    counts = triforce_samples(target, None, first, STEPS, verify, mode=mode)
    assert sizes and set(sizes) == {6}
    for i in range(STEPS):
        p_value = chi_square_p_value(counts[i], exact[i])
        assert p_value > 1e-3, f"token {i + 2}: {mode} with L1 on 6 of 12 tokens differs (p={p_value:.2e})"


def test_the_test_catches_the_reference_l1_correction_bug(models):
    target, draft = models
    first = 5
    exact = exact_distribution(target, first, STEPS)
    counts = triforce_samples(target, draft, first, STEPS, buggy_l1_verify)
    p_values = [chi_square_p_value(counts[i], exact[i]) for i in range(STEPS)]
    assert min(p_values) < 1e-6, f"the buggy L1 rule went undetected (p={p_values})"


def test_chi_square_helper_is_calibrated():
    probs = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    assert chi_square_p_value(torch.tensor([500.0, 300.0, 200.0]), probs) > 0.99
    assert chi_square_p_value(torch.tensor([600.0, 250.0, 150.0]), probs) < 1e-6
