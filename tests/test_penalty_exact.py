"""The repetition penalty keeps every mode lossless: token-identical to ar under greedy, and
distributed exactly as the penalized target under sampling (with a known-buggy variant, counting
no earlier drafts of the same forward at L2, shown to fail the same test)."""
from __future__ import annotations

import pytest
import torch

import engine.decoding.speculative as speculative
from engine.decoding.acceptance import penalty_counts, target_probs
from engine.decoding.drafters import ModelDrafter
from engine.decoding.session import ChatSession
from engine.decoding.speculative import HierarchicalDecoder
from engine.events import ChatMessage, DocumentText
from engine.kv.full import FullCache
from engine.model.loading import load_folder
from engine.settings import DecodeSettings, Sampling
from streams import answer_tokens
from test_lossless import assert_identical_or_near_tie
from test_sampling_exact import PROMPT, VOCAB, chi_square_p_value, tiny_runner

PENALTY = dict(presence_penalty=1.0, frequency_penalty=1.0)
SAMPLING = Sampling(temperature=1.0, **PENALTY)
SAMPLES, FIRST = 2000, 5


# -- greedy: token-identical to ar with the penalty on ---------------------------------------

@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_folder(tiny_model_dir("llama"))


@pytest.mark.parametrize("overrides, drafter", [
    (dict(mode="triforce", budget=32, chunk=8, gamma1=2, gamma2=4), "self"),
    (dict(mode="triforce", budget=64, chunk=16, gamma1=4, gamma2=8), "ngram"),
    (dict(mode="retrieval-only", budget=32, chunk=8, gamma2=3), "none"),
    (dict(mode="draft-only", gamma1=4), "self"),
    (dict(mode="auto", budget=64, chunk=16), "self"),
])
def test_greedy_with_penalty_matches_ar(tiny, sample_text, overrides, drafter):
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    messages = [ChatMessage("user", "Repeat the first line of the play.")]
    # a random model rarely repeats a token by itself: a negative presence penalty makes it, and the
    # frequency penalty then pushes back, so both terms shape the answer
    base = DecodeSettings(max_new_tokens=40, sampling=Sampling(presence_penalty=-1.5, frequency_penalty=0.5))
    reference, _ = answer_tokens(ChatSession(tiny, base.replace(mode="ar"), draft="none", capacity=2048), messages, doc)
    plain, _ = answer_tokens(ChatSession(tiny, base.replace(mode="ar", sampling=Sampling()), draft="none",
                                         capacity=2048), messages, doc)
    assert plain != reference  # the penalty changes the answer: the comparison below is not vacuous
    fast = ChatSession(tiny, base.replace(**overrides), draft=tiny if drafter == "self" else drafter, capacity=2048)
    got, _ = answer_tokens(fast, messages, doc)
    prompt = fast.prompt_tokens(messages, doc)
    if got != reference:  # a near-tie must be one of the penalized logits, as ar saw them
        assert_identical_or_near_tie(tiny, prompt, reference, got)


# -- sampling: the exact distribution of the penalized target ---------------------------------

def exact_joint(target) -> torch.Tensor:
    """Exact joint distribution [VOCAB * VOCAB] of the two tokens after PROMPT + [FIRST] (the answer
    starts at FIRST): the joint, not the marginals, shows whether a repeat was penalized."""
    joint = torch.zeros(VOCAB, VOCAB, dtype=torch.float64)
    first = _next_probs(target, (FIRST,))
    for t1 in range(VOCAB):
        joint[t1] = float(first[t1]) * _next_probs(target, (FIRST, t1))
    return joint.flatten()


def _next_probs(target, answer: tuple[int, ...]) -> torch.Tensor:
    ids = PROMPT + list(answer)
    cache = FullCache(2, 2, 8, len(ids), torch.float32, "cpu")
    logits = target.forward(torch.tensor(ids), torch.arange(len(ids)), cache, last_only=True)
    return target_probs(logits, SAMPLING, penalty_counts(SAMPLING, answer, [], VOCAB))[0].double()


def sampled_joint(target, draft) -> torch.Tensor:
    """SAMPLES triforce runs from the same prefilled prompt; counts of the two tokens' pairs [VOCAB * VOCAB]."""
    settings = DecodeSettings(mode="triforce", budget=16, chunk=8, gamma1=2, gamma2=3, sampling=SAMPLING,
                              max_new_tokens=4)
    full = FullCache(2, 2, 8, 256, torch.float32, "cpu")
    full.capture_query = True
    target.forward(torch.tensor(PROMPT), torch.arange(len(PROMPT)), full)
    query = list(full.last_query)
    decoder = HierarchicalDecoder(target, full, ModelDrafter(draft, sinks=2, window=8), settings,
                                  torch.Generator().manual_seed(4321))
    counts = torch.zeros(VOCAB * VOCAB, dtype=torch.float64)
    for _ in range(SAMPLES):
        full.rollback(len(PROMPT))
        decoder.after_prefill(query)
        seq = PROMPT + [FIRST]
        while len(seq) < len(PROMPT) + 3:
            seq += [tok for tok, _ in decoder.step(seq)]
        t1, t2 = seq[len(PROMPT) + 1:len(PROMPT) + 3]
        counts[t1 * VOCAB + t2] += 1
    return counts


@pytest.fixture(scope="module")
def models():
    # flat logits (scale 0.3): with the sampling tests' peaky ones (1.5) a repeat has P ~ 1e-5 and a
    # penalty of 1-2 logits changes nothing measurable; here a repeat is common unless penalized
    return tiny_runner(seed=0, logit_scale=0.3), tiny_runner(seed=1, logit_scale=0.3)


def test_triforce_with_penalty_samples_the_penalized_target_exactly(models):
    target, draft = models
    p = chi_square_p_value(sampled_joint(target, draft), exact_joint(target))
    assert p > 1e-3, f"the two tokens' joint distribution differs from the penalized target's (p={p:.2e})"


def test_the_test_catches_a_penalty_that_ignores_the_same_forwards_drafts(models, monkeypatch):
    target, draft = models
    right = penalty_counts

    def stale(sampling, answer, drafts, vocab, device="cpu"):  # every row counts the answer only
        rows = right(sampling, answer, [], vocab, device)
        return None if rows is None else rows.repeat(len(drafts) + 1, 1)

    monkeypatch.setattr(speculative, "penalty_counts", stale)  # at L2 only
    p = chi_square_p_value(sampled_joint(target, draft), exact_joint(target))
    assert p < 1e-6, f"the stale-count penalty went undetected (p={p:.2e})"
