"""The `auto` policy: its cost model, its choices, bounded exploration, and that switching
structure between cycles never changes the output (greedy: token-identical to AR)."""
from __future__ import annotations

import pytest

from engine.decoding.policy import EXPLORE_CYCLES, OUTLIER, REFRESH_CYCLES, Policy, StepCosts, Structure, expected_tokens
from engine.decoding.session import ChatSession
from engine.events import ChatMessage, DocumentText
from engine.model.loading import load_folder
from engine.settings import DecodeSettings, Mode
from streams import answer_tokens
from test_lossless import assert_identical_or_near_tie

AUTO = DecodeSettings(mode="auto", budget=64, chunk=16)
FIXED = [Structure(Mode.AR), Structure(Mode.DRAFT_ONLY, 3, 1), Structure(Mode.RETRIEVAL_ONLY, 1, 4),
         Structure(Mode.TRIFORCE, 2, 5)]


def test_expected_tokens_matches_the_geometric_series():
    assert expected_tokens(0.0, 5) == 1.0
    assert abs(expected_tokens(0.5, 2) - (1 + 0.5 + 0.25)) < 1e-12


def test_step_costs_fit_a_line_through_measured_forwards():
    costs = StepCosts()
    assert costs.estimate("l2", 4) is None
    costs.record("l2", 1, 0.100)
    assert costs.estimate("l2", 1) == pytest.approx(0.100)
    assert costs.estimate("l2", 8) > 0.100  # one point: a prior slope, never free extra tokens
    costs.record("l2", 5, 0.180)
    assert costs.estimate("l2", 9) == pytest.approx(0.260)  # 20 ms per extra checked token
    assert costs.estimate("l2", 3) == pytest.approx(0.140)


def _measured_policy(l0_l2: float, l1_l2: float, l0_l1: float, l1_share: float, l0_s: float = 0.0) -> Policy:
    """A policy that has seen plenty of cycles with these acceptances and costs (L2: 100 ms + 15 ms
    per extra token; L1: l1_share of that)."""
    p = Policy()
    for n in range(1, 14):
        p.costs.record("l2", n, 0.100 + 0.015 * (n - 1))
        p.costs.record("l1", n, l1_share * (0.100 + 0.015 * (n - 1)))
        p.costs.record("l0", n, l0_s * n)
    for boundary, rate in (("l0_l2", l0_l2), ("l1_l2", l1_l2), ("l0_l1", l0_l1)):
        for _ in range(200):
            accepted = round(10 * rate)
            p.observe(boundary, 10, accepted)
    for m in Mode:
        p.tried[m] = EXPLORE_CYCLES
    return p


def test_auto_picks_draft_only_when_the_drafter_is_good_and_free():
    p = _measured_policy(l0_l2=0.9, l1_l2=0.6, l0_l1=0.9, l1_share=0.9)
    chosen = p.choose(AUTO, has_l0=True, context_tokens=8000)
    assert chosen.mode is Mode.DRAFT_ONLY and chosen.gamma1 > 2
    assert {c.structure.split()[0] for c in p.candidates} == {"ar", "draft-only", "retrieval-only", "triforce"}


def test_auto_picks_retrieval_when_l1_is_cheap_and_l0_misses():
    p = _measured_policy(l0_l2=0.05, l1_l2=0.9, l0_l1=0.05, l1_share=0.3)
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is Mode.RETRIEVAL_ONLY


def test_auto_falls_back_to_ar_when_nothing_is_accepted():
    p = _measured_policy(l0_l2=0.0, l1_l2=0.0, l0_l1=0.0, l1_share=0.9, l0_s=0.01)
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is Mode.AR


def test_auto_without_a_drafter_never_runs_l0():
    p = _measured_policy(l0_l2=0.9, l1_l2=0.9, l0_l1=0.9, l1_share=0.5)
    assert not p.choose(AUTO, has_l0=False, context_tokens=8000).mode.uses_l0 or \
        p.current.mode is Mode.RETRIEVAL_ONLY


def test_exploration_is_bounded():
    """A structure that measures badly is tried at most EXPLORE_CYCLES cycles."""
    p = Policy()
    runs = {m: 0 for m in Mode}
    for _ in range(60):
        s = p.choose(AUTO, has_l0=True, context_tokens=8000)
        runs[s.mode] += 1
        n = {Mode.AR: 1, Mode.DRAFT_ONLY: s.gamma1 + 1, Mode.RETRIEVAL_ONLY: s.gamma2 + 1}.get(s.mode, s.gamma2 + 1)
        p.costs.record("l2", n, 0.1 + 0.02 * (n - 1))
        if s.mode in (Mode.RETRIEVAL_ONLY, Mode.TRIFORCE):
            p.costs.record("l1", 1, 0.095)  # L1 as dear as L2: never worth it
            p.observe("l1_l2", s.gamma2, 0)
        if s.mode.uses_l0 and s.mode is not Mode.AR:
            p.costs.record("l0", s.gamma1, 0.01 * s.gamma1)  # a model drafter: 10 ms a token
            p.observe("l0_l2" if s.mode is Mode.DRAFT_ONLY else "l0_l1", s.gamma1, 0)  # L0 always wrong
    # beyond exploration, only the runner-up's one-cycle refresh every REFRESH_CYCLES cycles
    refreshes = 60 // REFRESH_CYCLES
    assert runs[Mode.AR] >= 60 - 3 * EXPLORE_CYCLES - refreshes
    for m in (Mode.DRAFT_ONLY, Mode.RETRIEVAL_ONLY, Mode.TRIFORCE):
        assert runs[m] <= EXPLORE_CYCLES + refreshes
    assert runs[Mode.RETRIEVAL_ONLY] + runs[Mode.TRIFORCE] <= 2 * EXPLORE_CYCLES  # no L1 rebuilt for one cycle


def test_fixed_mode_without_auto_runs_its_own_gammas():
    p = Policy()
    s = DecodeSettings(mode="triforce", gamma1=3, gamma2=7)
    assert p.choose(s, has_l0=True, context_tokens=100) == Structure(Mode.TRIFORCE, 3, 7)


def test_fixed_mode_with_auto_keeps_its_structure():
    p = _measured_policy(l0_l2=0.9, l1_l2=0.6, l0_l1=0.9, l1_share=0.9)
    chosen = p.choose(DecodeSettings(mode="retrieval-only", auto=True), has_l0=True, context_tokens=8000)
    assert chosen.mode is Mode.RETRIEVAL_ONLY


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_folder(tiny_model_dir("llama"))


@pytest.mark.parametrize("drafter", ["ngram", "self"])
def test_forced_switches_every_cycle_stay_identical_to_ar(tiny, sample_text, drafter):
    """The policy scripted to change structure at every cycle: still exactly AR's tokens."""
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    messages = [ChatMessage("user", "Repeat the first line of the play.")]
    ar = ChatSession(tiny, DecodeSettings(mode="ar", max_new_tokens=48), draft="none", capacity=2048)
    reference, _ = answer_tokens(ar, messages, doc)
    session = ChatSession(tiny, AUTO.replace(max_new_tokens=48), draft=tiny if drafter == "self" else drafter,
                          capacity=2048)
    session.decoder.policy.forced = list(FIXED)
    got, final = answer_tokens(session, messages, doc)
    assert got == reference
    assert final.metrics.structure_switches >= 4


def test_auto_reports_what_it_runs_and_weighs(tiny, sample_text):
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    messages = [ChatMessage("user", "Go on.")]
    session = ChatSession(tiny, AUTO.replace(max_new_tokens=40), draft="ngram", capacity=2048)
    ar = ChatSession(tiny, DecodeSettings(mode="ar", max_new_tokens=40), draft="none", capacity=2048)
    reference, _ = answer_tokens(ar, messages, doc)
    got, final = answer_tokens(session, messages, doc)
    assert got == reference
    m = final.metrics
    assert m.mode == "auto" and m.structure.split()[0] in {"ar", "draft-only", "retrieval-only", "triforce"}
    assert len(m.candidates) == 4 and all(c.ms_per_token > 0 for c in m.candidates)
    second, final2 = answer_tokens(session, messages + [ChatMessage("assistant", final.text),
                                                        ChatMessage("user", "Again.")], doc)
    assert final2.metrics.candidates  # re-evaluated on the next turn from what the first measured


def test_budget_grows_when_l1_is_cheap_but_misses_and_shrinks_when_dear_and_exact():
    cheap_missing = _measured_policy(l0_l2=0.5, l1_l2=0.2, l0_l1=0.5, l1_share=0.3)  # 2 of 3 checked
    assert cheap_missing.choose_budget(AUTO, 512, context_tokens=8000) == 1024
    assert cheap_missing.choose_budget(AUTO, 4000, context_tokens=8000) == 4000  # at most half the context
    dear_exact = _measured_policy(l0_l2=0.5, l1_l2=1.0, l0_l1=0.5, l1_share=0.9)
    assert dear_exact.choose_budget(AUTO, 512, context_tokens=8000) == 256
    assert not dear_exact.costs.measured("l1")  # L1's cost is measured again at its new size
    assert Policy().choose_budget(AUTO, 512, context_tokens=8000) == 512  # nothing measured: unchanged


@pytest.mark.bundled
def test_bundled_auto_and_forced_switches_match_ar(bundled_model_dir, sample_passage):
    """The bundled model on ~2K tokens, greedy: auto (its own choices, then scripted to switch every
    cycle) gives AR's tokens, over two turns of one session."""
    model = load_folder(bundled_model_dir)
    doc = [DocumentText("Hamlet", sample_passage(2000))]
    messages = [ChatMessage("user", "Continue the play from where the text stops.")]
    session = ChatSession(model, DecodeSettings(mode="ar", max_new_tokens=24), draft="ngram", capacity=4096)
    reference, _ = answer_tokens(session, messages, doc)
    session.update_settings(DecodeSettings(mode="auto", budget=256, chunk=16, max_new_tokens=24))
    for script in (None, list(FIXED)):
        session.decoder.policy.forced = script
        got, final = answer_tokens(session, messages, doc)
        assert_identical_or_near_tie(model, session.prompt_tokens(messages, doc), reference, got)


def test_wall_time_beyond_the_modelled_forwards_steers_the_choice():
    """Two structures scored by the model alone: the one whose cycles really take longer per token
    (drafting, rollback, rebuilds, acceptance below E(a, g)) loses once that is seen; a one-off
    spike is ignored."""
    policy = Policy()
    for n in (1, 2, 3, 4, 5):
        policy.costs.record("l2", n, 0.010 * (1 + 0.15 * (n - 1)))
    ar, draft = Structure(Mode.AR), Structure(Mode.DRAFT_ONLY, gamma1=3)
    before = policy.seconds_per_token(draft)
    assert before < policy.seconds_per_token(ar)
    policy.realized(draft, OUTLIER * 2 * before * 3, 3)  # an n-gram index built over the whole book
    assert policy.seconds_per_token(draft) == pytest.approx(before)
    policy.realized(ar, 0.010, 1)
    for _ in range(12):
        policy.realized(draft, 2.0 * before * 3, 3)
    assert policy.seconds_per_token(draft) == pytest.approx(2.0 * before)
    assert policy.seconds_per_token(ar) == pytest.approx(0.010)
    assert policy.seconds_per_token(draft, corrected=False) == pytest.approx(before)


def test_a_close_runner_up_is_run_again_now_and_then():
    """Settled on the best structure, auto still re-measures a runner-up within REFRESH_MARGIN one
    cycle at a time (its estimates would go stale), and one far behind never."""
    # ar best (100 ms/token), draft-only 1.19x, retrieval-only 1.15x (but no L1 cache is live)
    close = _measured_policy(l0_l2=0.05, l1_l2=0.5, l0_l1=0.0, l1_share=0.95, l0_s=0.01)
    far = _measured_policy(l0_l2=0.0, l1_l2=0.5, l0_l1=0.0, l1_share=0.95, l0_s=0.05)  # draft-only 1.58x
    for policy, expect_refresh in ((close, True), (far, False)):
        modes = [policy.choose(AUTO, has_l0=True, context_tokens=8000).mode for _ in range(60)]
        assert modes.count(Mode.AR) > 50
        assert (Mode.DRAFT_ONLY in modes) is expect_refresh, modes
        assert Mode.TRIFORCE not in modes and Mode.RETRIEVAL_ONLY not in modes  # no L1 built for one cycle


def test_decode_starts_with_the_ngram_index_built_and_l1_selected_when_auto_ran_it_last(tiny, sample_text):
    """Work that belongs to the new prompt happens before the first token, not in the first cycle:
    the n-gram index over the prompt, and (auto, when its last structure ran L1) the retrieval
    cache's selection, as a fixed triforce mode does."""
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    session = ChatSession(tiny, DecodeSettings(mode="auto", budget=64, chunk=16, max_new_tokens=8),
                          draft="ngram", capacity=2048)
    session.decoder.policy.forced = [Structure(Mode.TRIFORCE, 2, 3)]
    answer_tokens(session, [ChatMessage("user", "Who is Horatio?")], doc)
    rebuilds, seen = session.decoder.rebuilds, []
    original_step = session.decoder.step

    def first_step(seq):
        if not seen:
            seen.append((session.drafter._indexed, len(seq), session.decoder.rebuilds, session.decoder._stale))
        return original_step(seq)

    session.decoder.step = first_step
    answer_tokens(session, [ChatMessage("user", "Who is Ophelia?")], doc)
    indexed, length, rebuilt, stale = seen[0]
    assert indexed == length  # every n-gram of prompt + first token indexed before the first cycle
    assert rebuilt == rebuilds + 1 and not stale  # L1 re-selected with the new question, up front


def test_a_burst_of_load_moves_a_cost_estimate_little_and_a_fast_forward_a_lot():
    costs = StepCosts()
    costs.record("l2", 1, 0.040)
    costs.record("l2", 1, 0.120)  # the machine was busy for one forward
    assert costs.estimate("l2", 1) == pytest.approx(0.048)
    costs.record("l2", 1, 0.030)  # quieter than ever: believed half at once
    assert costs.estimate("l2", 1) == pytest.approx(0.039)
