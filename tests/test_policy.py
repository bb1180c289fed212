"""The `auto` policy: its cost model, its choices, bounded exploration, and that switching
structure between cycles never changes the output (greedy: token-identical to AR)."""
from __future__ import annotations

import time

import pytest

from engine.decoding import measurements
from engine.model import draft_vocab
from engine.decoding.measurements import PRIOR_SLOPE, STALE, StepCosts
from engine.decoding.realized import IDLE_CAP, SLOW_CLIP, SLOWER, CycleSums
from engine.decoding.size_retime import REFRESH_CYCLES
from engine.offload.cost import expected_tokens
from engine.decoding.policy import (AR_RETIME, EXPLORE_CYCLES, EXPLORE_MARGIN, GROW, MEASURED_GAIN, OUTLIER,
                                     REALIZED_CYCLES, SURPRISE, SWITCH_GAIN, Policy, Structure)
from engine.decoding.drafters import NgramDrafter, common_prefix
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


def test_step_costs_follow_a_staircase_between_measured_sizes():
    """The CPU's int4 kernel works in blocks of 4 rows: checking 2-4 tokens costs about the same,
    5 jumps. Between measured sizes the estimate is the line through its two neighbours, not one
    line through every point (which priced a 4-token check near a 5-token one)."""
    costs = StepCosts()
    for n, t in ((1, 0.028), (4, 0.0335), (5, 0.049)):
        costs.record("l2", n, t)
    assert costs.estimate("l2", 3) == pytest.approx(0.028 + 2 * 0.0055 / 3)
    assert costs.estimate("l2", 3) < 0.034
    assert costs.estimate("l2", 7) == pytest.approx(0.049 + 2 * (0.049 - 0.028) / 4)  # the secant beyond


def test_a_size_not_timed_for_a_while_moves_with_the_smallest_size():
    """Continue 1K: a 5-token check timed once in a slow first spell stayed at 53 ms while the
    1-token forward, re-timed every few cycles, fell from 30 to 22 ms; the replay then priced draft
    length 4 out. A size left untimed for STALE forwards keeps its ratio to the smallest size."""
    costs = StepCosts()
    costs.record("l2", 1, 0.030)
    costs.record("l2", 5, 0.053)  # 1.77x the 1-token forward, timed in the same spell
    assert costs.estimate("l2", 5) == pytest.approx(0.053)
    for _ in range(STALE):  # the machine quietens: 1-token forwards at 22 ms
        costs.record("l2", 1, 0.022)
    one = costs.estimate("l2", 1)
    assert one < 0.023
    assert costs.estimate("l2", 5) == pytest.approx(0.053 * one / 0.030)
    assert costs.estimate("l2", 3) < 0.053 * one / 0.030  # (between them, the line through both)
    fresh = StepCosts()  # a size timed within the last STALE forwards keeps its own cost
    fresh.record("l2", 1, 0.030)
    fresh.record("l2", 5, 0.053)
    fresh.record("l2", 1, 0.022)
    assert fresh.estimate("l2", 5) == pytest.approx(0.053)
    costs.record("l2", 5, 0.030)  # timed again, faster: believed whole (it runs seldom: a refresh probe)
    assert costs.estimate("l2", 5) == pytest.approx(0.030)
    fresh.record("l2", 5, 0.030)  # within STALE forwards of its last timing: half of the way
    assert fresh.estimate("l2", 5) == pytest.approx(0.5 * 0.053 + 0.5 * 0.030)
    costs.record("l2", 5, 0.045)  # and a slower one moves it a little, as ever
    assert 0.030 < costs.estimate("l2", 5) < 0.032


def test_gammas_grow_only_as_far_as_their_forwards_were_timed():
    """With only 1-token forwards timed, no structure checks more than 1 + GROW tokens at a level;
    once a larger forward is timed, the next size up is open to it."""
    p = Policy()
    p.costs.record("l2", 1, 0.100)
    for _ in range(200):
        p.observe("l0_l2", 10, 10)  # a drafter that is always right: longer would look better
    p.tried[Mode.DRAFT_ONLY] = EXPLORE_CYCLES
    chosen = p.choose(AUTO, has_l0=True, context_tokens=8000)
    assert chosen.mode is Mode.DRAFT_ONLY and chosen.gamma1 + 1 == 1 + GROW
    p.costs.record("l2", 1 + GROW, 0.110)
    p.new_turn()
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).gamma1 + 1 == 1 + 2 * GROW
    for c in p.candidates:
        if c.structure.startswith("triforce") or c.structure.startswith("retrieval"):
            g2 = int(c.structure.split("g2=")[1].split()[0])
            assert g2 + 1 <= 1 + 2 * GROW


def _iid(acc) -> None:
    """Make every draft depth of `acc` accept at its overall rate: i.i.d. acceptance (the same
    accepted count every cycle would read as certain up to it and a sure rejection after)."""
    acc.passed = [acc.rate * n for n in acc.reached]


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
        _iid(p.acceptance[boundary])
    for m in Mode:
        p.tried[m] = EXPLORE_CYCLES
    return p


def test_auto_picks_draft_only_when_the_drafter_is_good_and_free():
    p = _measured_policy(l0_l2=0.9, l1_l2=0.6, l0_l1=0.9, l1_share=0.9)
    chosen = p.choose(AUTO, has_l0=True, context_tokens=8000)
    assert chosen.mode is Mode.DRAFT_ONLY and chosen.gamma1 > 2
    assert {c.structure.split()[0] for c in p.candidates} == {"ar", "draft-only", "retrieval-only", "triforce"}


@pytest.mark.parametrize("rate,expect", [(0.2, Mode.AR), (0.5, Mode.DRAFT_ONLY)])
def test_auto_leaves_ar_only_for_a_gain_larger_than_its_models_error(rate, expect):
    """L2 costs 100 ms + 15 ms per extra checked token. An n-gram drafter right on 20 % of tokens
    predicts draft-only ~4 % faster than ar: within the model's error, so ar runs. Right on 50 %,
    ~25 % faster: draft-only runs."""
    p = Policy()
    for n in range(1, 14):
        p.costs.record("l2", n, 0.100 + 0.015 * (n - 1))
        p.costs.record("l1", n, 0.095 + 0.015 * (n - 1))  # L1 about as dear as L2: never worth it
    for i in range(200):
        p.observe("l0_l2", 1, 1 if i % 10 < 10 * rate else 0)
        p.observe("l1_l2", 4, 0)
        p.observe("l0_l1", 1, 0)
    for m in Mode:
        p.tried[m] = EXPLORE_CYCLES
    chosen = p.choose(AUTO, has_l0=True, context_tokens=8000)
    draft_only = min(c.ms_per_token for c in p.candidates if c.structure.startswith("draft-only"))
    ar = next(c.ms_per_token for c in p.candidates if c.structure == "ar")
    assert draft_only < ar  # the model does predict a gain in both cases
    assert chosen.mode is expect


@pytest.mark.parametrize("l1_over_ar,running,expect", [
    (0.97, Mode.RETRIEVAL_ONLY, Mode.RETRIEVAL_ONLY),  # running and measured: it stays while cheaper than ar
    (1.02, Mode.RETRIEVAL_ONLY, Mode.AR),  # ar predicted cheaper: it leaves
    (0.97, Mode.AR, Mode.AR)])  # on ar, L1 is entered only MEASURED_GAIN cheaper
def test_a_measured_structure_auto_runs_stays_until_ar_is_predicted_cheaper(monkeypatch, l1_over_ar, running, expect):
    """The margin over ar guards leaving ar for a structure whose prediction may flatter it. Asked of a
    structure auto already runs, whose own cycles corrected its price, it left no band to stay in: at
    qa 1K one rejected cycle priced retrieval-only at 10.9 ms/token beside ar's 11.0, and four ar cycles
    ran before L1 was 5 % cheaper again. The decision is the one before any probe: `running`."""
    assert l1_over_ar > MEASURED_GAIN
    p = _measured_policy(l0_l2=0.1, l1_l2=0.95, l0_l1=0.1, l1_share=0.5)
    l1 = Structure(Mode.RETRIEVAL_ONLY, AUTO.gamma1, AUTO.gamma2)
    for _ in range(REALIZED_CYCLES):
        p.ratios.add(l1, 0.3, 0.3, 6.0, 6)
    prices = {Mode.AR: 0.010, Mode.RETRIEVAL_ONLY: 0.010 * l1_over_ar}
    monkeypatch.setattr(p, "seconds_per_token", lambda s, corrected=True: prices.get(s.mode, 1.0))
    p._l1_live, p.current, p._since_ar = True, l1 if running is Mode.RETRIEVAL_ONLY else Structure(Mode.AR), 0
    p.choose(AUTO, has_l0=True, context_tokens=1024)
    assert p.running.mode is expect


def test_auto_picks_retrieval_when_l1_is_cheap_and_l0_misses():
    p = _measured_policy(l0_l2=0.05, l1_l2=0.9, l0_l1=0.05, l1_share=0.3)
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is Mode.RETRIEVAL_ONLY


def test_auto_leaves_out_retrieval_while_its_cache_holds_half_the_context_or_more():
    """The same measurements that pick retrieval-only at 8K with a 1024-token budget: with that
    budget over a 2K context, or one that holds half an 8K context, no L1 structure is scored."""
    p = _measured_policy(l0_l2=0.05, l1_l2=0.9, l0_l1=0.05, l1_share=0.3)
    assert p.choose(AUTO, has_l0=True, context_tokens=8000, budget=1024).mode is Mode.RETRIEVAL_ONLY
    for context, budget in ((2048, 1024), (8000, 4000)):
        p = _measured_policy(l0_l2=0.05, l1_l2=0.9, l0_l1=0.05, l1_share=0.3)
        assert not p.choose(AUTO, has_l0=True, context_tokens=context, budget=budget).mode.uses_l1
        assert {c.structure.split()[0] for c in p.candidates} == {"ar", "draft-only"}
    fixed = AUTO.replace(mode="retrieval-only")  # a mode the user fixed is run as asked
    assert p.choose(fixed, has_l0=True, context_tokens=2048).mode is Mode.RETRIEVAL_ONLY


@pytest.mark.parametrize("setup_s,expect", [(0.64, Mode.RETRIEVAL_ONLY), (6.4, Mode.AR)])
def test_a_switch_to_retrieval_pays_for_building_its_cache(setup_s, expect):
    """L1 at 0.3x L2's cost and accepted 90 %: retrieval-only wins by far at 8K. Its cache, not built
    for this prompt, is charged over SETUP_HORIZON tokens: a 0.64 s build still pays, a 6.4 s one
    (a whole ar token per token) does not. Once built in this turn, the build is not charged."""
    p = _measured_policy(l0_l2=0.05, l1_l2=0.9, l0_l1=0.05, l1_share=0.3)
    p.l1_setup(setup_s)
    p.new_turn()
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is expect
    p.forced = [Structure(Mode.RETRIEVAL_ONLY, 1, 2)]
    p.choose(AUTO, has_l0=True, context_tokens=8000)  # the cache is built in this turn
    p.forced, p._settled = None, False
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is Mode.RETRIEVAL_ONLY


def test_a_cache_build_is_charged_over_the_tokens_the_answer_has_left():
    """The retrieval cache serves one prompt: with 4 tokens left in the answer, a 0.64 s build is
    160 ms per token, and ar stays (at qa 4K auto built one for the last 2 cycles of an answer)."""
    p = _measured_policy(l0_l2=0.05, l1_l2=0.9, l0_l1=0.05, l1_share=0.3)
    p.l1_setup(0.64)
    p.new_turn()
    assert p.choose(AUTO, has_l0=True, context_tokens=8000, remaining=4).mode is Mode.AR
    p._settled = False
    assert p.choose(AUTO, has_l0=True, context_tokens=8000, remaining=400).mode is Mode.RETRIEVAL_ONLY


def test_one_slow_ar_cycle_moves_ars_price_a_few_per_cent():
    """At qa 2K one ar cycle ran 117 ms against ~25 quiet and moved ar's price from 23 to 39 ms,
    and auto left ar for triforce (33-35 ms/token). The step-cost table and ar's wall/model ratio
    each count a slow sample as at most 1.5x / 1.25x their estimate."""
    p = _measured_policy(l0_l2=0.0, l1_l2=0.0, l0_l1=0.0, l1_share=0.95)
    ar = Structure(Mode.AR)
    for _ in range(10):
        p.realized(ar, 1.05 * p.seconds_per_token(ar, corrected=False), 1)
    quiet = p.seconds_per_token(ar)
    p.costs.record("l2", 1, 4.7 * p.costs.estimate("l2", 1))  # the spike, as the decoder times it ...
    p.realized(ar, 4.7 * quiet, 1)  # ... and as its cycle
    assert quiet < p.seconds_per_token(ar) < 1.08 * quiet


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
    session = ChatSession(tiny, AUTO.replace(mode="auto-legacy", max_new_tokens=48), draft=tiny if drafter == "self" else drafter,
                          capacity=2048)
    session.decoder.policy.forced = list(FIXED)
    got, final = answer_tokens(session, messages, doc)
    assert got == reference
    assert final.metrics.structure_switches >= 4


def test_auto_scores_the_ngram_drafter_on_cycles_it_took_no_part_in(tiny, sample_text, monkeypatch):
    """While auto runs ar, every cycle also asks the n-gram drafter what it would have proposed and
    checks it against the tokens the target goes on to emit (that cycle's and the next ones'), as a
    verification would have: draft-only's acceptance is learned without a draft-only cycle, from
    whole drafts rather than their first token, and the output is still exactly ar's."""
    monkeypatch.setattr(measurements, "ACCEPTANCE_FORGET", 1.0)  # plain counts, to compare with a recount
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    messages = [ChatMessage("user", "Repeat the first line of the play.")]
    ar = ChatSession(tiny, DecodeSettings(mode="ar", max_new_tokens=64), draft="none", capacity=2048)
    reference, _ = answer_tokens(ar, messages, doc)
    session = ChatSession(tiny, AUTO.replace(mode="auto-legacy", max_new_tokens=64), draft="ngram", capacity=2048)
    session.decoder.policy.forced = [Structure(Mode.AR)]
    lookups = session.decoder.legacy_lookups
    seen, learn = [], lookups.learn  # each ar cycle: (sequence before it, its tokens)
    lookups.learn = lambda seq, emitted, *rest: (seen.append((list(seq), list(emitted))), learn(seq, emitted, *rest))
    got, _ = answer_tokens(session, messages, doc)
    assert got == reference
    assert len(seen) >= 20 and all(len(emitted) == 1 for _, emitted in seen)  # one token per ar cycle
    final = seen[-1][0] + seen[-1][1]  # the whole sequence: every lookup is checked against it
    recount = NgramDrafter()
    proposals = nonempty = accepted = tested = 0
    still_open = []
    for seq, _ in seen:
        draft = recount.propose(seq, 8, AUTO.sampling, None).tokens
        proposals += 1
        if not draft:
            continue
        nonempty += 1
        known = final[len(seq):len(seq) + len(draft)]
        matched = common_prefix(draft, known)
        if matched < len(known) or len(known) == len(draft):
            accepted, tested = accepted + matched, tested + matched + (matched < len(known))
        else:
            still_open.append(matched)
    acc = session.decoder.policy.acceptance["l0_l2"]
    assert acc.proposals == proposals - len(still_open) and acc.nonempty == nonempty - len(still_open) > 0
    assert (acc.accepted, acc.tested) == (accepted, tested)
    assert [m for _, _, m in lookups.shadows] == still_open  # the last ones wait for more tokens
    lookups.close()  # as the next prompt does: what matched so far counts
    assert acc.accepted == accepted + sum(still_open) and acc.proposals == proposals


def test_a_shadow_draft_is_settled_by_the_tokens_of_later_cycles(tiny, monkeypatch):
    """A lookup made at an ar cycle is followed over the next cycles: credited with every token the
    target confirms, settled at the first that differs, and counted as matched so far if the
    answer ends first."""
    monkeypatch.setattr(measurements, "ACCEPTANCE_FORGET", 1.0)
    decoder = ChatSession(tiny, AUTO.replace(mode="auto-legacy"), draft="ngram", capacity=256).decoder
    acc = decoder.policy.acceptance["l0_l2"]
    shadows = decoder.legacy_lookups
    prompt = [7] * 10
    shadows.shadows = [(10, [1, 2, 3, 4], 0)]  # guesses for positions 10-13
    shadows.settle(prompt + [1])  # an ar cycle confirms position 10
    shadows.settle(prompt + [1, 2, 3])  # a longer cycle confirms 11 and 12
    assert acc.tested == 0 and shadows.shadows == [(10, [1, 2, 3, 4], 3)]
    shadows.settle(prompt + [1, 2, 3, 9])  # position 13 differs: 3 of 4 accepted
    assert (acc.accepted, acc.tested, acc.proposals) == (3, 4, 1) and shadows.shadows == []
    shadows.shadows = [(14, [5, 6], 0)]
    shadows.settle(prompt + [1, 2, 3, 9, 5])
    shadows.close()  # the answer ended after one confirmed token
    assert (acc.accepted, acc.tested, acc.proposals) == (4, 5, 2) and shadows.shadows == []


def test_auto_reports_what_it_runs_and_weighs(tiny, sample_text):
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    messages = [ChatMessage("user", "Go on.")]
    session = ChatSession(tiny, AUTO.replace(mode="auto-legacy", max_new_tokens=40), draft="ngram", capacity=2048)
    ar = ChatSession(tiny, DecodeSettings(mode="ar", max_new_tokens=40), draft="none", capacity=2048)
    reference, _ = answer_tokens(ar, messages, doc)
    got, final = answer_tokens(session, messages, doc)
    assert got == reference
    m = final.metrics
    assert m.mode == "auto-legacy" and m.structure.split()[0] in {"ar", "draft-only", "retrieval-only", "triforce"}
    assert len(m.candidates) == 4 and all(c.ms_per_token > 0 for c in m.candidates)
    second, final2 = answer_tokens(session, messages + [ChatMessage("assistant", final.text),
                                                        ChatMessage("user", "Again.")], doc)
    assert final2.metrics.candidates  # re-evaluated on the next turn from what the first measured


def test_budget_grows_when_l1_is_cheap_but_misses_and_shrinks_when_dear_and_exact():
    cheap_missing = _measured_policy(l0_l2=0.5, l1_l2=0.2, l0_l1=0.5, l1_share=0.3)  # 2 of 3 checked
    assert cheap_missing.choose_budget(AUTO, 512, context_tokens=8000) == 1024
    assert cheap_missing.choose_budget(AUTO, 4000, context_tokens=8000) == 4000  # at most half the context
    dear_exact = _measured_policy(l0_l2=0.5, l1_l2=1.0, l0_l1=0.5, l1_share=0.6)
    c1 = dear_exact.costs.estimate("l1", 1)
    assert dear_exact.choose_budget(AUTO, 3072, context_tokens=8000) == 1536
    # L1's timings are kept, scaled by the KV it no longer reads: at most (c2 - c1) per 4,928 tokens
    assert dear_exact.costs.estimate("l1", 1) == pytest.approx(c1 - 1536 * (0.100 - c1) / 4928)
    assert Policy().choose_budget(AUTO, 512, context_tokens=8000) == 512  # nothing measured: unchanged


def test_the_budget_stays_when_a_smaller_cache_would_hardly_make_l1_cheaper():
    """L1 at 0.9x L2's cost with an eighth of its context: its forward is the weights, so halving
    the cache saves under 1 % and costs acceptance (at qa 1K, 128 -> 64, then ar for the session)."""
    weights_bound = _measured_policy(l0_l2=0.5, l1_l2=1.0, l0_l1=0.5, l1_share=0.9)
    assert weights_bound.choose_budget(AUTO, 1024, context_tokens=8000) == 1024
    assert weights_bound.costs.estimate("l1", 1) == pytest.approx(0.090)


def test_the_budget_never_moves_back():
    """Each budget rule fires on acceptance measured at the budget before: at qa 8K the two took
    turns (992 -> 496 -> 992 -> 496). Once moved, never back."""
    p = _measured_policy(l0_l2=0.5, l1_l2=1.0, l0_l1=0.5, l1_share=0.6)  # L1 dear and exact: shrink
    assert p.choose_budget(AUTO, 3072, context_tokens=8000) == 1536
    for _ in range(200):
        p.observe("l1_l2", 10, 1)  # at the smaller budget L1 misses ...
    for n in range(1, 14):
        p.costs.record("l1", n, 0.3 * (0.100 + 0.015 * (n - 1)))  # ... and is cheap: the rule to grow
    assert p.choose_budget(AUTO, 1536, context_tokens=8000) == 1536
    grown = _measured_policy(l0_l2=0.5, l1_l2=0.2, l0_l1=0.5, l1_share=0.3)
    assert grown.choose_budget(AUTO, 512, context_tokens=8000) == 1024  # that rule, where nothing shrank


@pytest.mark.bundled
def test_bundled_auto_and_forced_switches_match_ar(bundled_model_dir, sample_passage):
    """The bundled model on ~2K tokens, greedy: auto (its own choices, then scripted to switch every
    cycle) gives AR's tokens, over two turns of one session."""
    model = load_folder(bundled_model_dir)
    doc = [DocumentText("Hamlet", sample_passage(2000))]
    messages = [ChatMessage("user", "Continue the play from where the text stops.")]
    session = ChatSession(model, DecodeSettings(mode="ar", max_new_tokens=24), draft="ngram", capacity=4096)
    reference, _ = answer_tokens(session, messages, doc)
    session.update_settings(DecodeSettings(mode="auto-legacy", budget=256, chunk=16, max_new_tokens=24))
    for script in (None, list(FIXED)):
        session.decoder.policy.forced = script
        got, final = answer_tokens(session, messages, doc)
        assert_identical_or_near_tie(model, session.prompt_tokens(messages, doc), reference, got)


def _as_promised(i: int, expected: float) -> int:
    """Cycle i's yield in a run of cycles that yields `expected` tokens on average (to a tenth)."""
    return int(expected) + (1 if i % 10 < round(10 * (expected % 1)) else 0)


def test_wall_time_beyond_the_modelled_forwards_steers_the_choice():
    """Two structures scored by the model alone: the one whose cycles really take longer than their
    modelled forwards (drafting, rollback, rebuilds, Python) loses once that is seen; a one-off
    spike is ignored."""
    policy = Policy()
    for n in (1, 2, 3, 4, 5):
        policy.costs.record("l2", n, 0.010 * (1 + 0.15 * (n - 1)))
    ar, draft = Structure(Mode.AR), Structure(Mode.DRAFT_ONLY, gamma1=3)
    before = policy.seconds_per_token(draft)
    assert before < policy.seconds_per_token(ar)
    model, expected = policy.cycle_cost(draft)
    policy.realized(draft, OUTLIER * 1.1 * model, 1)  # an n-gram index built over the whole book
    assert policy.seconds_per_token(draft) == pytest.approx(before)
    policy.realized(ar, 0.010, 1)
    policy.realized(draft, 2.0 * model, 1)  # twice its modelled time, and 1 token where E promised 1.44
    one = policy.seconds_per_token(draft)  # one cycle is drawn toward the model (the priors) ...
    assert 1.2 * before < one < 2.0 * before
    assert one > policy.seconds_per_token(ar)  # ... and already loses to ar
    for _ in range(99):
        policy.realized(draft, 2.0 * model, 1)
    # ... many are not: twice the time, and 1 token a cycle against the 1.44 promised
    assert policy.seconds_per_token(draft) == pytest.approx(2.0 * before * expected, rel=0.03)
    assert policy.seconds_per_token(ar) == pytest.approx(0.010)
    assert policy.seconds_per_token(draft, corrected=False) == pytest.approx(before)


def test_one_unlucky_cycle_does_not_price_a_mode_out_its_boundary_pools_the_yield():
    """At qa 1K, retrieval-only's one exploration cycle checked 7 tokens and yielded 2, in 1.18x its
    modelled time. Read as one wall/model ratio per mode (2.66x), it priced the mode out for the
    session, while triforce ran the same L1 -> L2 check for 70 cycles at its model. Time and yield
    are now kept apart, the yield pooled per boundary: the mode's price moves by its time only."""
    p = _measured_policy(l0_l2=0.0, l1_l2=0.95, l0_l1=0.5, l1_share=0.3)
    tri, ro = Structure(Mode.TRIFORCE, 1, 6), Structure(Mode.RETRIEVAL_ONLY, 1, 6)
    for i in range(70):  # triforce yields what E(a, g) promises, on average, in its modelled time
        model, expected = p.cycle_cost(tri)
        p.realized(tri, model, _as_promised(i, expected))
    fresh, _ = p._best_of(Mode.RETRIEVAL_ONLY, AUTO)
    model, expected = p.cycle_cost(ro)
    p.realized(ro, 1.18 * model, 2)
    assert p.ratios.mode_time(Mode.RETRIEVAL_ONLY) == pytest.approx(1.0 + 0.18 / 3, rel=0.02)  # drawn to 1
    assert p._best_of(Mode.RETRIEVAL_ONLY, AUTO)[0] < 1.1 * fresh  # the mode is not priced out ...
    assert p.seconds_per_token(ro) < 1.3 * p.seconds_per_token(ro, corrected=False)  # ... nor that structure
    # a shortfall every cycle at the boundary is seen, by every structure checking there
    for _ in range(30):
        p.realized(tri, p.cycle_cost(tri)[0], 2)
    assert p._best_of(Mode.RETRIEVAL_ONLY, AUTO)[0] > 1.6 * fresh


def test_noise_that_only_adds_time_prices_ar_and_a_speculative_mode_alike():
    """At qa 1K auto weighed retrieval-only at 0.957x ar where the fixed mode ran 0.86-0.90x, and
    stayed on ar: ar's time was filtered against noise (read near its quiet cost), retrieval-only's
    averaged it. The same spells of noise in both now leave both near their quiet price, and the
    three cycles of an exploration are enough to leave ar for a 12 % gain."""
    p = _measured_policy(l0_l2=0.0, l1_l2=0.95, l0_l1=0.0, l1_share=0.6)
    ar, ro = Structure(Mode.AR), Structure(Mode.RETRIEVAL_ONLY, 1, 2)
    quiet_ar, quiet_ro = p.seconds_per_token(ar), p.seconds_per_token(ro)
    assert quiet_ro < 0.9 * quiet_ar  # L1 at 0.6x L2: g2 = 2 predicted at 0.876x ar
    noise = [1.0, 1.5, 1.0, 1.5, 1.0, 1.5, 1.0, 1.5, 1.0]  # every other cycle in a busy spell
    for slow in noise:
        p.realized(ar, slow * p.cycle_cost(ar)[0], 1)
    for i, slow in enumerate(noise[:EXPLORE_CYCLES]):  # retrieval-only's exploration, in the same spells
        model, expected = p.cycle_cost(ro)
        p.realized(ro, slow * model, _as_promised(i, expected))
    assert p.seconds_per_token(ar) < 1.03 * quiet_ar
    assert p.seconds_per_token(ro) < 1.03 * quiet_ro  # averaged: 1.1x, and 0.96x ar's price
    p._ran(ar)
    p._l1_live = True  # the cache is built: no switch cost
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is Mode.RETRIEVAL_ONLY


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
    session = ChatSession(tiny, DecodeSettings(mode="auto-legacy", budget=64, chunk=16, max_new_tokens=8),
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


def test_a_long_draft_that_ran_slow_is_not_flattered_by_the_short_ones_of_its_mode():
    """The wall/model ratio is kept per structure as well as per mode: triforce at g2 = 11 measured
    2x its model must not be scored with the 1.0 its g2 = 3 cycles earned; a g2 never run gets the mode's."""
    p = _measured_policy(l0_l2=0.0, l1_l2=0.95, l0_l1=0.8, l1_share=0.3)
    short, long, unrun = (Structure(Mode.TRIFORCE, 2, g2) for g2 in (3, 11, 7))
    for structure, slowdown, cycles in ((short, 1.0, 30), (long, 2.0, 4)):
        for i in range(cycles):
            model, expected = p.cycle_cost(structure)
            p.realized(structure, slowdown * model, _as_promised(i, expected))
    assert p.seconds_per_token(short) == pytest.approx(p.seconds_per_token(short, corrected=False), rel=0.05)
    assert p.seconds_per_token(long) > 1.7 * p.seconds_per_token(long, corrected=False)
    mode_ratio = p.seconds_per_token(unrun) / p.seconds_per_token(unrun, corrected=False)
    assert 1.0 < mode_ratio < 1.5  # 30 cycles at 1.0 and 4 at 2.0, filtered as noise (a slower cycle moves the ratio a little)


def test_a_re_time_after_a_slow_spell_on_another_structure_weighs_as_the_spell_did():
    """qa 1K on a busy host: L1 structures ran at 40 ms/token through a slow spell and their time
    filter took it in cycle by cycle; ar, idle since before the spell, kept its quiet price (41),
    so auto switched to ar, and ran it for four cycles at 53-59 while its one-step filter caught up.
    Its first cycle after the spell now moves its price as the spell's cycles would have, and auto
    goes back. A spike at a re-time still counts as at most SLOW_CLIP x the old ratio."""
    p = _measured_policy(l0_l2=0.0, l1_l2=0.95, l0_l1=0.0, l1_share=0.6)
    ar, ro = Structure(Mode.AR), Structure(Mode.RETRIEVAL_ONLY, 1, 2)
    for _ in range(3):
        p.realized(ar, p.cycle_cost(ar)[0], 1)
    quiet_ar = p.seconds_per_token(ar)
    for i in range(EXPLORE_CYCLES):
        model, expected = p.cycle_cost(ro)
        p.realized(ro, model, _as_promised(i, expected))
    quiet_ro = p.seconds_per_token(ro)
    assert quiet_ro < 0.9 * quiet_ar
    for i in range(11):  # the spell: everything 1.3x slower
        model, expected = p.cycle_cost(ro)
        p.realized(ro, 1.3 * model, _as_promised(i, expected))
    spelled_ro = p.seconds_per_token(ro)
    assert spelled_ro > 1.15 * quiet_ro  # taken in (and still 0.88x of ar, 1.3x slower too)
    p._ran(ar)  # priced from before the spell, ar looked cheaper: one cycle of it, in the spell
    p.realized(ar, 1.3 * p.cycle_cost(ar)[0], 1)
    assert p.seconds_per_token(ar) > 1.12 * quiet_ar  # (one step of the filter: 1.025x)
    assert p.seconds_per_token(ar) <= (1.0 + (SLOW_CLIP - 1.0) * (1.0 - (1.0 - SLOWER) ** IDLE_CAP)) * quiet_ar * 1.001
    p._l1_live = True  # the cache is built: no switch cost
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is Mode.RETRIEVAL_ONLY
    for i in range(4):  # the spell is over: a quiet re-time after L1's cycles is believed at once
        model, expected = p.cycle_cost(ro)
        p.realized(ro, model, _as_promised(i, expected))
    p.realized(ar, p.cycle_cost(ar)[0], 1)
    assert p.seconds_per_token(ar) < 1.01 * quiet_ar


def test_a_burst_of_load_moves_a_cost_estimate_little_and_a_fast_forward_a_lot():
    costs = StepCosts()
    costs.record("l2", 1, 0.040)
    costs.record("l2", 1, 0.120)  # the machine was busy for one forward: counted as 1.5x, weighed 0.1
    assert costs.estimate("l2", 1) == pytest.approx(0.042)
    for _ in range(30):  # a slow spell that lasts: the estimate follows it, 5 % a forward at most
        costs.record("l2", 1, 0.120)
    spell = costs.estimate("l2", 1)
    assert spell > 0.100
    costs.record("l2", 1, 0.030)  # quieter than ever: believed half at once
    assert costs.estimate("l2", 1) == pytest.approx(0.5 * 0.030 + 0.5 * spell)
    fresh = StepCosts()
    fresh.record("l2", 1, 0.040)
    fresh.record("l2", 2, 0.300)  # a new size first timed in a spike: capped at 1.5x its prediction
    assert fresh.estimate("l2", 2) == pytest.approx(1.5 * 0.040 * (1 + PRIOR_SLOPE))
    fresh.record("l2", 3, 0.045)  # a quiet first sample is believed whole
    assert fresh.estimate("l2", 3) == pytest.approx(0.045)


def test_ar_is_priced_by_its_own_cycles_and_re_timed_beside_a_speculative_structure():
    """A slow spell during ar's first cycles made draft-only look better than it is. While
    draft-only runs, ar gets one cycle every AR_RETIME cycles; its price believes the quieter
    re-timed cycles at once, and it wins back once draft-only's own cycles cost more."""
    p = _measured_policy(l0_l2=0.5, l1_l2=0.0, l0_l1=0.0, l1_share=0.95)
    ar, modelled = Structure(Mode.AR), p.seconds_per_token(Structure(Mode.AR), corrected=False)
    for _ in range(3):
        p.realized(ar, 2.5 * modelled, 1)  # the slow spell
    assert p.seconds_per_token(ar) == pytest.approx(2.5 * modelled)
    runs = [p.choose(AUTO, has_l0=True, context_tokens=8000) for _ in range(AR_RETIME + 1)]
    assert all(s.mode is Mode.DRAFT_ONLY for s in runs[:-1]) and runs[-1] == ar
    draft = runs[0]
    for s in runs[:-1]:  # draft-only really costs 1.2x ar's quiet forward per token
        p.realized(s, 1.2 * modelled * 2, 2)
    for _ in range(3):  # re-timed cycles, in a quiet spell
        p.realized(ar, 1.05 * modelled, 1)
    assert p.seconds_per_token(ar) < 1.1 * modelled
    assert p.seconds_per_token(draft) > p.seconds_per_token(ar)
    assert [p.choose(AUTO, has_l0=True, context_tokens=8000).mode for _ in range(8)] == [Mode.AR] * 8


def test_a_burst_of_load_during_ar_does_not_price_it_out():
    """Noise only adds time: two slow ar cycles in a row (at qa 2K, 53 and 49 ms against 27 quiet)
    must not make a structure slower than ar in the same spell look cheaper."""
    p = _measured_policy(l0_l2=0.0, l1_l2=0.0, l0_l1=0.0, l1_share=0.95)
    ar, modelled = Structure(Mode.AR), p.seconds_per_token(Structure(Mode.AR), corrected=False)
    for _ in range(10):
        p.realized(ar, 1.05 * modelled, 1)
    quiet = p.seconds_per_token(ar)
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is Mode.AR
    p.realized(ar, 1.9 * modelled, 1)
    p.realized(ar, 1.8 * modelled, 1)
    assert p.seconds_per_token(ar) < 1.25 * quiet
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is Mode.AR


def test_a_probe_cycle_does_not_become_the_incumbent():
    """After one refresh cycle of the runner-up, the next choice weighs the structure it interrupted:
    the runner-up must beat it by SWITCH_GAIN to stay (it had kept itself for four cycles at 1.5x)."""
    p = _measured_policy(l0_l2=0.0, l1_l2=0.0, l0_l1=0.0, l1_share=0.95)
    ar = Structure(Mode.AR)
    p.realized(ar, p.seconds_per_token(ar, corrected=False), 1)
    assert p.choose(AUTO, has_l0=True, context_tokens=8000) == ar
    p._since_refresh, p._settled = REFRESH_CYCLES, False  # a refresh is due at this scoring
    probe = p.choose(AUTO, has_l0=True, context_tokens=8000)
    assert probe.mode is Mode.DRAFT_ONLY
    # the probe ran faster than modelled (one cycle, drawn toward the model): now predicted just
    # under ar, by less than the gain
    p.realized(probe, 0.80 * p.seconds_per_token(probe, corrected=False), 1)
    assert SWITCH_GAIN * p.seconds_per_token(ar) < p.seconds_per_token(probe) < p.seconds_per_token(ar)
    assert p.choose(AUTO, has_l0=True, context_tokens=8000) == ar


def test_a_refresh_probes_an_l1_structure_from_ar_only_where_its_cache_is_cheap_to_build():
    """On ar with no L1 cache live, the runner-up's refresh may be an L1 structure when building its
    cache costs at most PROBE_SETUP_STEPS target steps (qa 1K: 10-25 ms, one step), not at 8K
    (300-700 ms): excluded everywhere, auto that had fallen back to ar never measured L1 again."""
    for setup, l1_probed in ((0.5, False), (0.15, True)):  # 5 and 1.5 steps of 100 ms
        p = _measured_policy(l0_l2=0.0, l1_l2=0.6, l0_l1=0.0, l1_share=0.5)
        ar = Structure(Mode.AR)
        p.realized(ar, p.seconds_per_token(ar, corrected=False), 1)
        p.l1_setup(setup)
        assert p.choose(AUTO, has_l0=True, context_tokens=8000) == ar and not p._l1_live
        p._since_refresh, p._settled = REFRESH_CYCLES, False  # a refresh is due at this scoring
        probe = p.choose(AUTO, has_l0=True, context_tokens=8000)
        assert probe != ar and probe.mode.uses_l1 is l1_probed, (setup, probe)


def test_an_l1_runner_up_is_refreshed_at_the_settings_draft_length():
    """At qa 1K auto sat on ar for three answers weighing L1 at γ2 = 1 (its long checks and its
    acceptance last read in a slow first answer); a refresh at γ2 = 1 re-read neither. The refresh
    runs an L1 runner-up with a draft of the settings' γ2 tokens, as its exploration did."""
    for remaining, draft in ((None, AUTO.gamma2), (5, 4)):  # (never past the answer's end)
        p = _measured_policy(l0_l2=0.0, l1_l2=0.6, l0_l1=0.0, l1_share=0.5)
        ar = Structure(Mode.AR)
        p.realized(ar, p.seconds_per_token(ar, corrected=False), 1)
        p.l1_setup(0.15)  # cheap to build: an L1 structure may be the probe (the test above)
        assert p.choose(AUTO, has_l0=True, context_tokens=8000) == ar
        by_model = min((p.seconds_per_token(Structure(Mode.RETRIEVAL_ONLY, 1, g), corrected=False), g)
                       for g in range(1, 13))[1]
        assert by_model < draft  # at acceptance 0.6 the model's best draft is short
        p._since_refresh, p._settled = REFRESH_CYCLES, False  # a refresh is due at this scoring
        probe = p.choose(AUTO, has_l0=True, context_tokens=8000, remaining=remaining)
        assert probe.mode.uses_l1 and probe.gamma2 == draft, probe


def test_a_cycle_far_over_its_prediction_re_scores_at_once():
    """Re-scoring waits RESCORE_EVERY cycles while nothing moves, but not after a cycle that ran
    SURPRISE times its prediction (triforce at g2 = 8 ran four cycles at 2-3x before a re-score)."""
    p = _measured_policy(l0_l2=0.0, l1_l2=0.9, l0_l1=0.0, l1_share=0.3)
    chosen = p.choose(AUTO, has_l0=True, context_tokens=8000)
    assert chosen.mode is Mode.RETRIEVAL_ONLY and p._settled
    believed = p.seconds_per_token(chosen)
    p.realized(chosen, 1.2 * believed * 4, 4)  # a little slow: no re-score
    assert p._settled
    p.realized(chosen, 1.1 * SURPRISE * p.seconds_per_token(chosen) * 4, 4)
    assert not p._settled


def test_a_draft_only_cycle_whose_lookup_found_nothing_is_judged_as_a_plain_step():
    """An empty n-gram lookup makes the cycle one plain step: at ar's cost for one token, about twice
    draft-only's ms/token, that is what was expected, not a surprise that re-scores the choice."""
    p = _measured_policy(l0_l2=0.9, l1_l2=0.6, l0_l1=0.9, l1_share=0.9)
    chosen = p.choose(AUTO, has_l0=True, context_tokens=8000)
    assert chosen.mode is Mode.DRAFT_ONLY and p._settled
    step = p.seconds_per_token(Structure(Mode.AR))
    assert step > SURPRISE * p.seconds_per_token(chosen)  # (a surprise, read as draft-only's tokens)
    p.realized(chosen, step, 1, checked=1)
    assert p._settled
    p.realized(chosen, 1.1 * SURPRISE * step, 1, checked=1)  # a slow plain step still is one
    assert not p._settled


def test_a_fixed_mode_leaves_the_policy_as_auto_left_it():
    """The bench runs ar, triforce, ... between auto's answers in one session: their cycles must not
    move auto's state (which structure it runs, what it tried, when it re-times ar)."""
    p = _measured_policy(l0_l2=0.5, l1_l2=0.0, l0_l1=0.0, l1_share=0.95)
    for _ in range(5):
        p.choose(AUTO, has_l0=True, context_tokens=8000)
    before = (p.current, dict(p.tried), p._since_ar, p._since_refresh, p.switches)
    for fixed in ("ar", "triforce", "draft-only"):
        assert p.choose(DecodeSettings(mode=fixed), has_l0=True, context_tokens=8000).mode is Mode.of(fixed)
    assert (p.current, dict(p.tried), p._since_ar, p._since_refresh, p.switches) == before


def test_setting_up_the_retrieval_cache_is_not_charged_to_the_cycle_that_needed_it(tiny, sample_text):
    """Selecting L1's cache for its first use (or a new prompt or budget) is a one-off: the cycle's wall
    time the policy learns from leaves it out (it made retrieval-only look 2x dearer at qa 8K after
    its one exploration cycle)."""
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    session = ChatSession(tiny, AUTO.replace(mode="auto-legacy", max_new_tokens=24), draft="ngram", capacity=2048)
    decoder = session.decoder
    decoder.policy.forced = [Structure(Mode.AR), Structure(Mode.AR), Structure(Mode.RETRIEVAL_ONLY, 1, 3)]
    rebuild, walls = decoder.rebuild, []

    def slow_rebuild():  # the setup (the first build) is slow; a later rebuild (L1's acceptance fell
        time.sleep(0.3 if not decoder.rebuilds else 0.0)  # under the threshold) is a cycle's own cost
        rebuild()

    decoder.rebuild = slow_rebuild
    realized = decoder.policy.realized
    decoder.policy.realized = lambda s, seconds, tokens, **kw: (walls.append((s.mode, seconds)), realized(s, seconds, tokens, **kw))
    answer_tokens(session, [ChatMessage("user", "Repeat the first line of the play.")], doc)
    assert decoder.rebuilds >= 1 and Mode.RETRIEVAL_ONLY in [m for m, _ in walls]
    assert max(seconds for _, seconds in walls) < 0.3, walls


def test_an_interrupted_exploration_is_not_resumed_in_a_later_turn():
    """A structure's exploration is one run of consecutive cycles. Once a scoring leaves it, a new
    turn does not re-open it, even when its L1 costs fall (choose_budget scales them when it shrinks
    the retrieval cache) and it is priced within the exploration margin again: at
    continue 1K that re-opening cost a retrieval cache rebuilt for one triforce cycle."""
    p = Policy()
    for n in range(1, 14):
        p.costs.record("l2", n, 0.100 + 0.015 * (n - 1))
    for _ in range(200):
        p.observe("l0_l2", 4, 2)
    _iid(p.acceptance["l0_l2"])
    for m in (Mode.AR, Mode.DRAFT_ONLY, Mode.RETRIEVAL_ONLY):
        p.tried[m] = EXPLORE_CYCLES
    first = p.choose(AUTO, has_l0=True, context_tokens=8000)
    assert first.mode is Mode.TRIFORCE  # never measured, priced by the optimistic prior
    for n in range(1, 14):
        p.costs.record("l1", n, 3 * (0.100 + 0.015 * (n - 1)))  # L1 timed at 3x L2's (a loaded spell)
    p.observe("l0_l1", first.gamma1, first.gamma1)  # its drafts held: only its cost is bad
    p.observe("l1_l2", first.gamma2, first.gamma2)
    left = p.choose(AUTO, has_l0=True, context_tokens=8000)
    assert left.mode is not Mode.TRIFORCE
    p.costs.scale("l1", 0.2)  # as choose_budget does on a smaller budget: within the margin again
    p.new_turn()
    for _ in range(8):
        assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is not Mode.TRIFORCE


def test_an_exploration_runs_its_cycles_when_only_its_yield_was_unlucky():
    """At qa 1K auto explored retrieval-only and triforce for one cycle each at the session's first
    answer (2 and 1 tokens of 7), the boundary read 2.57 in yield on top of acceptance 0.673, both
    explorations closed, and no L1 structure ran again. An exploration under way now runs its
    EXPLORE_CYCLES cycles in the turn unless its time, yield aside, puts it out of the margin
    (the cost case: test_an_interrupted_exploration_is_not_resumed_in_a_later_turn)."""
    p = Policy()
    for n in range(1, 14):
        p.costs.record("l2", n, 0.100 + 0.015 * (n - 1))
        p.costs.record("l1", n, 0.6 * (0.100 + 0.015 * (n - 1)))
    for _ in range(200):
        p.observe("l0_l2", 4, 0)  # no n-gram draft holds
    for m in (Mode.AR, Mode.DRAFT_ONLY, Mode.TRIFORCE):
        p.tried[m] = EXPLORE_CYCLES
    runs = []
    for i in range(EXPLORE_CYCLES):
        s = p.choose(AUTO, has_l0=True, context_tokens=8000)
        runs.append(s.mode)
        if i == 0:  # the unlucky first cycle: its first draft token rejected
            p.observe("l1_l2", s.gamma2, 0)
            p.realized(s, p.cycle_cost(s)[0], 1)
            assert p.seconds_per_token(s) > EXPLORE_MARGIN * p.seconds_per_token(Structure(Mode.AR))
        else:
            p.observe("l1_l2", s.gamma2, s.gamma2)
            p.realized(s, p.cycle_cost(s)[0], s.gamma2 + 1)
    assert runs == [Mode.RETRIEVAL_ONLY] * EXPLORE_CYCLES
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is Mode.RETRIEVAL_ONLY  # measured: it wins


def test_a_turn_starts_with_l1_selected_when_auto_would_run_it_if_free():
    """An answer that ended on ar left the next one charging the retrieval cache's build to any L1
    structure, so auto stayed on ar where retrieval-only was faster. At a new prompt the session now
    builds the cache up front when the best structure, the build aside, is an L1 one already
    measured; a switch to it then pays nothing."""
    p = _measured_policy(l0_l2=0.05, l1_l2=0.9, l0_l1=0.05, l1_share=0.3)
    p.l1_setup(6.4)  # dear enough that, charged, ar stays
    p.new_turn()
    p.ratios.modes[Mode.RETRIEVAL_ONLY] = CycleSums(time=1.0)  # measured in an earlier turn
    assert p.l1_ahead(AUTO, has_l0=True, context_tokens=8000)
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is Mode.AR  # the build charged
    p.new_turn()
    p.l1_built()
    p._settled = False
    assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is Mode.RETRIEVAL_ONLY
    # not where L1 loses, nor where its cache would hold half the context, nor under a fixed mode
    assert not _measured_policy(l0_l2=0.05, l1_l2=0.3, l0_l1=0.05, l1_share=0.9).l1_ahead(AUTO, True, 8000)
    assert not p.l1_ahead(AUTO, has_l0=True, context_tokens=8000, budget=4000)
    assert not p.l1_ahead(AUTO.replace(mode="ar"), has_l0=True, context_tokens=8000)


def test_a_session_selects_l1_up_front_when_the_policy_expects_it(tiny, sample_text, monkeypatch):
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    session = ChatSession(tiny, DecodeSettings(mode="auto-legacy", budget=64, chunk=16, max_new_tokens=8),
                          draft="ngram", capacity=2048)
    session.decoder.policy.forced = [Structure(Mode.AR)]
    answer_tokens(session, [ChatMessage("user", "Who is Horatio?")], doc)
    rebuilds = session.decoder.rebuilds
    monkeypatch.setattr(Policy, "l1_ahead", lambda self, *a, **k: True)
    answer_tokens(session, [ChatMessage("user", "Who is Ophelia?")], doc)
    assert session.decoder.rebuilds == rebuilds + 1 and session.decoder.policy._l1_live
    monkeypatch.setattr(Policy, "l1_ahead", lambda self, *a, **k: False)
    answer_tokens(session, [ChatMessage("user", "Who is Laertes?")], doc)
    assert session.decoder.rebuilds == rebuilds + 1  # ar last, nothing expected: left lazy


def test_a_sessions_first_turn_builds_the_retrieval_cache_up_front_and_times_it(tiny, sample_text):
    """The first answer explores the L1 structures, and the build it paid mid-answer (13 ms at 1K,
    47 at 8K on a Zen 4, in answers of 340 and 700 ms) is built before the first token instead, as
    fixed L1 modes do; its time prices later builds. Later turns that did not run L1 stay lazy."""
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    session = ChatSession(tiny, DecodeSettings(mode="auto-legacy", budget=64, chunk=16, max_new_tokens=8),
                          draft="ngram", capacity=2048)
    policy = session.decoder.policy
    policy.forced = [Structure(Mode.AR)]  # the answers themselves never touch L1
    assert policy.setup_s is None
    answer_tokens(session, [ChatMessage("user", "Who is Horatio?")], doc)
    assert session.decoder.rebuilds == 1 and policy.setup_s is not None and policy.setup_s > 0
    answer_tokens(session, [ChatMessage("user", "Who is Ophelia?")], doc)
    assert session.decoder.rebuilds == 1 and not policy._l1_live


def test_an_answer_that_ended_on_a_probe_of_ar_still_counts_as_run_on_l1(tiny, sample_text, monkeypatch):
    """ar's re-timing cycle often falls at an answer's end. The next turn must see the structure it
    interrupted: read as ar, the turn left the retrieval cache lazy, charged its build to L1, and auto
    stayed on ar (qa 1K: 25-26 ms/token beside retrieval-only's 23-24, 2026-12-04)."""
    p = _measured_policy(l0_l2=0.05, l1_l2=0.95, l0_l1=0.05, l1_share=0.3)
    incumbent = Structure(Mode.RETRIEVAL_ONLY, 4, 2)
    p.current = incumbent
    p._probe(Structure(Mode.AR))
    assert p.current.mode is Mode.AR and p.running == incumbent
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    session = ChatSession(tiny, DecodeSettings(mode="auto-legacy", budget=64, chunk=16, max_new_tokens=8),
                          draft="ngram", capacity=2048)
    monkeypatch.setattr(Policy, "l1_ahead", lambda self, *a, **k: False)
    session.decoder.policy.forced = [Structure(Mode.AR)]
    answer_tokens(session, [ChatMessage("user", "Who is Horatio?")], doc)
    rebuilds = session.decoder.rebuilds
    session.decoder.policy._incumbent = incumbent  # the last cycle was a probe of ar within retrieval-only
    answer_tokens(session, [ChatMessage("user", "Who is Ophelia?")], doc)
    assert session.decoder.rebuilds == rebuilds + 1  # selected up front, as after retrieval-only itself


def test_l1_is_priced_with_the_share_of_tokens_new_to_its_vocabulary(monkeypatch):
    """L1 cannot propose a token outside its vocabulary subset (engine/model/draft_vocab.py): its
    acceptance is scaled by the share of new tokens, which falls as the session repeats its words."""
    monkeypatch.setattr(measurements, "NOVEL_FORGET", 1.0)
    p = _measured_policy(l0_l2=0.05, l1_l2=0.9, l0_l1=0.05, l1_share=0.3)
    rate, s = p.acceptance["l1_l2"].rate, Structure(Mode.RETRIEVAL_ONLY, 4, 6)
    assert p.cycle_cost(s)[1] == pytest.approx(expected_tokens(rate, 6))  # nothing measured: no misses
    p.observe_novel(3, 30)  # a tenth of the answer's tokens were new to L1
    p._memo.clear()
    assert p.cycle_cost(s)[1] == pytest.approx(expected_tokens(0.9 * rate, 6))
    p.observe_novel(0, 270)
    p._memo.clear()
    assert p.cycle_cost(s)[1] == pytest.approx(expected_tokens(0.99 * rate, 6))


def test_a_rejection_at_a_token_l1_could_not_propose_is_priced_as_new_not_as_l1_missing(tiny, sample_text, monkeypatch):
    """In the bench's first answer at qa 2K, 7 of fixed retrieval-only's 8 rejections were at tokens
    outside L1's vocabulary subset; the same question again, with those tokens in it, had 0-1. auto
    explored L1 in that first answer, read an acceptance of 0.79 into it, and ran ar for the session
    where retrieval-only was 5 % faster. Such a miss now counts as the accepted prefix alone, and the
    new tokens as such (Policy.observe_novel); the answer's own counters keep the rejection."""
    monkeypatch.setattr(draft_vocab, "COMMON_TOKENS", 300)  # the tiny target often wants a token past it
    monkeypatch.setattr(measurements, "ACCEPTANCE_FORGET", 1.0)
    monkeypatch.setattr(measurements, "NOVEL_FORGET", 1.0)
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    session = ChatSession(tiny, DecodeSettings(mode="auto-legacy", budget=64, chunk=16, max_new_tokens=40),
                          draft="ngram", capacity=2048)
    session.decoder.policy.forced = [Structure(Mode.RETRIEVAL_ONLY, 1, 4)]
    got, _ = answer_tokens(session, [ChatMessage("user", "Repeat the first line of the play.")], doc)
    stats, seen = session.decoder.stats.l1_l2, session.decoder.policy.acceptance["l1_l2"]
    novelty = session.decoder.policy.novelty
    assert novelty.seen == len(got) - 1 and novelty.novel > 0  # every token after the first, by cycle
    assert seen.accepted == stats.accepted
    misses = (stats.tested - stats.accepted) - (seen.tested - seen.accepted)
    assert 0 < misses <= novelty.novel  # a new token comes as a correction (a miss) or as a bonus
