"""auto's draft-only rules: γ1 tokens drafted, a longer draft right after a cycle that kept its whole
draft (n-gram drafts hold or fail in stretches). The replay prices a rule exactly; auto runs one where
it replays clearly cheaper than every single length; the decoder drafts the rule's lengths as the
replay assumed, and the output stays exactly ar's."""
from __future__ import annotations

import pytest

from engine.decoding.policy import EXPLORE_CYCLES, Policy, Structure
from engine.decoding.session import ChatSession
from engine.decoding.lookup_replay import REPLAY_POSITIONS
from engine.decoding.measurements import STALE
from engine.decoding.size_retime import LENGTH_GAIN, RULE_LONG, RULE_SHORT, RULE_STALE_SHARE
from engine.events import ChatMessage, DocumentText
from engine.model.loading import load_folder
from engine.settings import DecodeSettings, Mode
from streams import answer_tokens

AUTO = DecodeSettings(mode="auto", budget=64, chunk=16)


def _policy_with_log(history: list[tuple[int, int]]) -> Policy:
    """A policy whose L2 check costs 10 ms + 2.5 ms per extra token (every size timed, L1 as dear,
    so never worth it), `history` its logged lookups."""
    p = Policy()
    for n in [*range(1, 14), *range(1, 9)]:  # checks of 1-8 tokens timed last: fresh (measurements.STALE)
        p.costs.record("l2", n, 0.010 + 0.0025 * (n - 1))
        p.costs.record("l1", n, 0.009 + 0.0025 * (n - 1))
    for m in Mode:
        p.tried[m] = EXPLORE_CYCLES
    p.lookups.settled.extend(history)
    return p


# text that copies in stretches: runs of 20 positions an 8-token lookup gets right, each followed by
# 6 positions whose lookups miss at once (the copy ends, the text goes its own way)
STRETCHES = ([(8, 8)] * 12 + [(8, 7), (8, 6), (8, 5), (8, 4), (8, 3), (8, 2), (8, 1), (8, 0)] + [(8, 0)] * 6) * 6


def test_text_that_copies_in_stretches_runs_a_rule_cheaper_than_any_single_length():
    p = _policy_with_log(STRETCHES)
    singles = {g: p.seconds_per_token(Structure(Mode.DRAFT_ONLY, g)) for g in range(1, 9)}
    rules = {(a, b): p.seconds_per_token(Structure(Mode.DRAFT_ONLY, a, 1, b)) for a in RULE_SHORT for b in RULE_LONG}
    assert min(rules.values()) < LENGTH_GAIN * min(singles.values())  # a clear gain, not noise
    chosen = p.choose(AUTO, has_l0=True, context_tokens=4000)
    assert chosen.mode is Mode.DRAFT_ONLY and chosen.after_full > chosen.gamma1
    assert p.seconds_per_token(chosen) == pytest.approx(min(rules.values()))
    assert "/" in chosen.label  # what --stats, the Live panel and the bench show


def test_where_drafts_fail_at_random_a_single_length_runs():
    """Lookups that hold for 0-3 tokens with no stretches: a kept draft says nothing of the next,
    and the settings' single length stays (no rule clears LENGTH_GAIN)."""
    history = [(8, k) for k in (0, 2, 1, 3, 0, 1, 2, 0, 3, 1)] * 8
    p = _policy_with_log(history)
    chosen = p.choose(AUTO, has_l0=True, context_tokens=4000)
    assert chosen.mode is not Mode.DRAFT_ONLY or chosen.after_full == 0


def test_a_rule_with_stale_checks_is_re_timed_one_length_then_the_other_and_then_runs():
    """A rule is weighed at fresh prices only once both its checks are fresh: a size re-time runs its
    longer length while that check is stale (its long draft may not come in the one cycle), then
    its shorter one, and the rule, cheapest by the replay, then runs."""
    p = _policy_with_log(STRETCHES)
    for _ in range(8):  # only 5-token checks timed lately (the settings' γ1 = 4 ran)
        p.costs.record("l2", 5, 0.020)
    rule = min((Structure(Mode.DRAFT_ONLY, a, 1, b) for a in RULE_SHORT for b in RULE_LONG), key=p.seconds_per_token)
    ran = []
    for cycle in range(40):  # the policy's own cycles (a rule's alternate its two lengths here)
        s = p.choose(AUTO, has_l0=True, context_tokens=4000)
        ran.append(s)
        drafted = s.after_full if s.after_full and cycle % 2 else s.gamma1
        p.costs.record("l2", drafted + 1, 0.010 + 0.0025 * drafted)
        p.realized(s, 0.010 + 0.0025 * drafted, 2, checked=drafted + 1)
    labels = [s.label for s in ran]  # (γ2 is the settings', whatever runs)
    first_rule = labels.index(rule.label)
    long, short = Structure(Mode.DRAFT_ONLY, rule.after_full), Structure(Mode.DRAFT_ONLY, rule.gamma1)
    assert labels.index(long.label) < labels.index(short.label) < first_rule, labels
    assert labels[:labels.index(long.label)] == ["draft-only g1=4"] * labels.index(long.label)  # the settings' γ1
    assert set(labels[first_rule:]) == {rule.label}, labels


def _runs(*runs: tuple[tuple[int, int], int]) -> list[tuple[int, int]]:
    return [item for item, count in runs for _ in range(count)]


# the lookups settled over one answer at continue 2K (bundled model, the bench's prompt; every answer
# the same): (tokens offered, of them the target kept), and L2's check by tokens checked there (ms,
# docs/notes/check_sizes_ms.py 2048, Zen 4)
CONTINUE_2K = _runs(((0, 0), 1), ((8, 0), 2), ((0, 0), 2), ((8, 0), 1), ((0, 0), 2), ((8, 0), 1), ((0, 0), 4),
                    ((8, 0), 1), ((0, 0), 2), ((8, 0), 1), ((0, 0), 2), ((3, 3), 2), ((3, 2), 1), ((3, 1), 1),
                    ((3, 0), 1), ((8, 1), 1), ((8, 0), 1), ((0, 0), 1), ((8, 0), 2), ((0, 0), 1), ((8, 2), 1),
                    ((8, 1), 1), ((8, 0), 1), ((0, 0), 4), ((8, 1), 1), ((8, 0), 2), ((0, 0), 1), ((8, 2), 1),
                    ((8, 1), 1), ((8, 0), 1), ((8, 2), 1), ((8, 1), 1), ((3, 3), 5), ((3, 2), 1), ((3, 1), 1),
                    ((3, 0), 1), ((8, 8), 2))
CHECK_MS_2K = (15.5, 17.4, 19.3, 21.4, 24.7, 28.6, 32.9, 34.3, 39.2)


def _stale_but(history: list[tuple[int, int]], fresh: tuple[int, ...]) -> Policy:
    """A policy that timed every check size (CHECK_MS_2K; L1 as dear, never worth it), then only
    the sizes in `fresh` for STALE forwards, `history` its logged lookups."""
    p = Policy()
    for n, ms in enumerate(CHECK_MS_2K, 1):
        p.costs.record("l2", n, ms / 1e3)
        p.costs.record("l1", n, ms / 1e3)
    for _ in range(STALE):
        for n in fresh:
            p.costs.record("l2", n, CHECK_MS_2K[n - 1] / 1e3)
    for m in Mode:
        p.tried[m] = EXPLORE_CYCLES
    p.lookups.settled.extend(history[-REPLAY_POSITIONS:])
    return p


def test_a_rule_whose_stale_long_checks_weigh_little_runs_at_its_price():
    """A rule's long checks come only after a draft kept whole: at continue 2K, 2/8 checked 9
    tokens twice in an answer's 39 cycles, so its long check was seldom fresh, a fresh length stood
    in for it, and 2/8, forced, ran at 0.96x γ1 = 2's ms/token and 0.92x γ1 = 4's. Stale
    long checks that weigh at most RULE_STALE_SHARE of the rule's replayed time let it run."""
    p = _stale_but(CONTINUE_2K * 4, fresh=(1, 3))  # (γ1 = 2 ran: its checks alone are fresh)
    rule = Structure(Mode.DRAFT_ONLY, 2, AUTO.gamma2, 8)
    singles = [p.seconds_per_token(Structure(Mode.DRAFT_ONLY, g, AUTO.gamma2)) for g in range(1, 9)]
    rules = [p.seconds_per_token(Structure(Mode.DRAFT_ONLY, a, AUTO.gamma2, b)) for a in RULE_SHORT for b in RULE_LONG]
    assert p.seconds_per_token(rule) == min(rules) < LENGTH_GAIN * min(singles)
    assert not p.costs.fresh("l2", 9) and 0 < p._stale_share(rule) <= RULE_STALE_SHARE
    chosen = p.choose(AUTO, has_l0=True, context_tokens=2048)
    assert chosen.label == rule.label, p.candidates


def test_a_rule_whose_short_check_is_stale_re_times_that_one_when_its_long_ones_weigh_little():
    """γ1 = 4 ran (its checks alone fresh) where 2/8 is cheapest: the stand-in runs, then one cycle
    of γ1 = 2 times the rule's short check, and the rule runs. (Its long length first, as where
    the long checks weigh much, would time a 9-token check only where the lookup offers 8 tokens:
    at continue 1K auto ran γ1 = 8 one cycle an answer and stayed on γ1 = 4.)"""
    p = _stale_but(CONTINUE_2K * 4, fresh=(1, 5))
    rule = Structure(Mode.DRAFT_ONLY, 2, AUTO.gamma2, 8)
    assert not p.costs.fresh("l2", 3) and p._stale_share(rule) <= RULE_STALE_SHARE
    ran = []
    for _ in range(12):
        s = p.choose(AUTO, has_l0=True, context_tokens=2048)
        ran.append(s.label)
        size = s.gamma1 + 1  # (a rule's short draft)
        p.costs.record("l2", size, CHECK_MS_2K[size - 1] / 1e3)
        p.realized(s, CHECK_MS_2K[size - 1] / 1e3, 2, checked=size)
    assert "draft-only g1=8" not in ran, ran
    assert ran.index("draft-only g1=2") < ran.index(rule.label) and set(ran[-4:]) == {rule.label}, ran


def test_a_rule_whose_stale_long_checks_weigh_much_waits_for_their_re_time():
    """Text that copies in long stretches runs its long checks for much of a rule's time: stale,
    they could move its price by much of their own error, so a length whose checks are fresh runs
    until they are re-timed (test_a_rule_with_stale_checks_is_re_timed_...)."""
    p = _stale_but(STRETCHES, fresh=tuple(range(1, 6)))
    rules = {(a, b): p.seconds_per_token(Structure(Mode.DRAFT_ONLY, a, AUTO.gamma2, b)) for a in RULE_SHORT for b in RULE_LONG}
    a, b = min(rules, key=rules.get)
    rule = Structure(Mode.DRAFT_ONLY, a, AUTO.gamma2, b)
    assert not p.costs.fresh("l2", b + 1) and p.costs.fresh("l2", a + 1)
    assert p._stale_share(rule) > RULE_STALE_SHARE
    chosen = p.choose(AUTO, has_l0=True, context_tokens=2048)
    assert chosen.mode is Mode.DRAFT_ONLY and not chosen.after_full and p.costs.fresh("l2", chosen.gamma1 + 1)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_folder(tiny_model_dir("llama"))


def test_the_decoder_drafts_the_long_length_exactly_after_a_kept_draft_and_stays_ar(tiny, sample_text):
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    messages = [ChatMessage("user", "Repeat the first lines of the play.")]
    ar = ChatSession(tiny, DecodeSettings(mode="ar", max_new_tokens=64), draft="none", capacity=2048)
    reference, _ = answer_tokens(ar, messages, doc)
    session = ChatSession(tiny, AUTO.replace(mode="auto-legacy", max_new_tokens=64), draft="ngram", capacity=2048)
    decoder = session.decoder
    decoder.policy.forced = [Structure(Mode.DRAFT_ONLY, 1, 1, 6)]
    asked, outcomes, propose = [], [], decoder.drafter.propose
    step = decoder.step

    def spied_propose(seq, count, *args, **kwargs):
        draft = propose(seq, count, *args, **kwargs)
        asked.append(count)
        outcomes.append([len(draft.tokens)])
        return draft

    def spied_step(seq):
        out = step(seq)
        outcomes[-1].append(len(out))  # tokens the cycle yielded: drafted + 1 when all were kept
        return out
    decoder.drafter.propose, decoder.step = spied_propose, spied_step
    got, _ = answer_tokens(session, messages, doc)
    assert got == reference
    whole = [drafted > 0 and out == drafted + 1 for drafted, out in outcomes]
    assert asked[0] == 1 and all(count == (6 if before else 1) for count, before in zip(asked[1:], whole))
    assert 6 in asked and 1 in asked[1:]  # both lengths ran
