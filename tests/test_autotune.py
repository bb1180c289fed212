"""Auto-tuning picks gammas and budgets from measurements; output stays identical to AR."""
from __future__ import annotations

from engine.decoding.autotune import best_gamma, expected_tokens, retune
from engine.events import ChatMessage, DocumentText
from engine.model.loading import load_folder
from engine.decoding.session import ChatSession
from engine.settings import DecodeSettings
from streams import answer_tokens


def test_expected_tokens_matches_the_geometric_series():
    assert expected_tokens(0.0, 5) == 1.0
    assert abs(expected_tokens(0.5, 2) - (1 + 0.5 + 0.25)) < 1e-12


def test_best_gamma_grows_with_acceptance_and_cheap_drafts():
    low = best_gamma(0.3, draft_s_per_token=0.01, verify_s=0.1, max_gamma=16)
    high = best_gamma(0.95, draft_s_per_token=0.01, verify_s=0.1, max_gamma=16)
    assert low < high
    assert best_gamma(0.95, draft_s_per_token=1.0, verify_s=0.1, max_gamma=16) == 1  # drafting costs too much


def test_retune_raises_budget_when_l1_is_cheap_but_misses():
    s = DecodeSettings(budget=256, chunk=16, auto=True)
    tuned = retune(s, context_tokens=8000, l1_acceptance=0.5, l0_acceptance=None, l0_s=None, l1_s=0.02, l2_s=0.2)
    assert tuned.budget == 512 and tuned.budget % tuned.chunk == 0
    tuned.validate(8000)


def test_auto_mode_output_identical_to_ar(tiny_model_dir, sample_text):
    model = load_folder(tiny_model_dir("llama"))
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    messages = [ChatMessage("user", "Go on.")]
    ar = ChatSession(model, DecodeSettings(mode="ar", max_new_tokens=48), draft="none", capacity=2048)
    auto = ChatSession(model, DecodeSettings(mode="triforce", budget=64, chunk=16, max_new_tokens=48, auto=True),
                       draft=model, capacity=2048)

    reference, _ = answer_tokens(ar, messages, doc)
    got, final = answer_tokens(auto, messages, doc)
    assert got == reference
    assert "auto" in final.metrics.settings_summary
