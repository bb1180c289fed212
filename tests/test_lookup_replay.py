"""auto prices draft-only by replaying its n-gram lookups over the tokens the target emitted
(engine/decoding/lookup_replay.py): the log's bookkeeping, the replay's arithmetic, the choices it
leads to, and that logging a lookup at every position leaves the output exactly ar's."""
from __future__ import annotations

import random

import pytest

from engine.decoding.drafters import NgramDrafter, common_prefix
from engine.decoding.lookup_replay import LOOKUP_TOKENS, MIN_REPLAY, REPLAY_POSITIONS, LookupLog
from engine.decoding.policy import AR_RETIME, EXPLORE_CYCLES, REPLAY_GAIN, Policy, Structure
from engine.decoding.session import ChatSession
from engine.events import ChatMessage, DocumentText
from engine.model.loading import load_folder
from engine.settings import DecodeSettings, Mode
from streams import answer_tokens

AUTO = DecodeSettings(mode="auto", budget=64, chunk=16)


def test_a_lookup_settles_at_its_first_wrong_token_or_when_all_it_offered_is_known():
    log = LookupLog()
    seq = list(range(100, 110))  # positions 0-9
    log.add(10, [1, 2, 3])  # guesses for positions 10-12
    log.add(11, [])  # found nothing: settled as soon as its turn comes
    log.add(12, [7])
    log.settle(seq + [1, 2])  # 10 and 11 confirmed: the first lookup still needs position 12
    assert list(log.settled) == []  # the later ones wait behind it, so the log stays in position order
    log.settle(seq + [1, 2, 3])
    assert list(log.settled) == [(3, 3), (0, 0), (1, 0)]
    log.add(13, [4, 5])
    log.settle(seq + [1, 2, 3, 9])  # differs at once
    assert list(log.settled)[-1] == (2, 0)
    log.add(14, [5])
    log.close()  # a new prompt: what is open is dropped
    log.settle(seq + [1, 2, 3, 9, 5])
    assert len(log.settled) == 4


def test_the_replay_runs_draft_only_cycle_by_cycle_over_the_logged_positions():
    """Positions: a run of 6 that an 8-token lookup gets right, then 4 positions where lookups find
    nothing, then 6 where they offer 8 and miss at once, counted cycle by cycle."""
    log = LookupLog()
    history = [(8, 6), (8, 5), (8, 4), (8, 3), (8, 2), (8, 1)] + [(0, 0)] * 4 + [(8, 0)] * 6
    log.settled.extend(history)
    cost = lambda n: 0.010 * (1 + 0.2 * (n - 1))  # noqa: E731  seconds of a forward checking n tokens
    seconds, tokens, cycles = log.replay(4, cost)
    # cycle 1 at position 0 checks 4 drafts (5 tokens) and keeps 4 + 1: next at position 5 (8, 1);
    # it keeps 1 + 1: position 7, whose empty lookup and the next two are plain steps: position 10;
    # then six cycles of 4 drafts that each yield the target's one token
    assert (cycles, tokens) == (2 + 3 + 6, 16)
    assert seconds == pytest.approx(8 * cost(5) + 3 * cost(1))
    s1, t1, c1 = log.replay(1, cost)  # gamma 1: pairs at positions 0, 2, 4, then singles
    assert (t1, c1) == (16, 3 + 4 + 6) and s1 == pytest.approx(9 * cost(2) + 4 * cost(1))


def _replayed_from_scratch(history: list[tuple[int, int]], gamma: int, forward,
                           after_full: int = 0) -> tuple[float, int, int]:
    """draft-only over `history`, walked from its first position (what LookupLog.replay keeps):
    `after_full` tokens drafted right after a cycle that kept its whole draft (0: `gamma` always)."""
    i = seconds = tokens = cycles = 0
    whole = False
    while i < len(history):
        offered, matched = history[i]
        checked = min(offered, after_full if whole and after_full else gamma)
        got = min(matched, checked) + 1
        whole = checked > 0 and got == checked + 1
        seconds, tokens, cycles, i = seconds + forward(checked + 1), tokens + got, cycles + 1, i + got
    return seconds, tokens, cycles


def test_the_replay_kept_between_calls_equals_a_walk_from_the_window_start():
    """The replay keeps each draft length's cycles and walks only new positions (and, where the
    window's start moved past a cycle, from the new start until it meets the old walk): at every
    step of a growing, sliding window, and for every length, it must equal a walk from scratch."""
    rng = random.Random(3)
    log, cost = LookupLog(), (lambda n: 0.010 + 0.003 * n)  # noqa: E731
    for step in range(300):
        for _ in range(rng.randint(1, 9)):  # one cycle's positions settle
            offered = rng.choice([0, 0, rng.randint(1, LOOKUP_TOKENS)])
            log.settled.append((offered, rng.randint(0, offered) if rng.random() < 0.5 else offered))
        if step % 3:  # not every length is replayed at every step: some walks catch up on many positions
            continue
        rules = [(g, 0) for g in range(1, LOOKUP_TOKENS + 1)] + [(1, 6), (3, 8), (2, 2), (6, 2)]
        for gamma, after_full in rules:  # single lengths, and rules whose cycles depend on the last
            got = log.replay(gamma, cost, after_full)
            if got is None:
                assert len(log.settled) < MIN_REPLAY
                continue
            seconds, tokens, cycles = _replayed_from_scratch(list(log.settled), gamma, cost, after_full)
            assert got[1:] == (tokens, cycles) and got[0] == pytest.approx(seconds)
    assert log.settled.total > 3 * REPLAY_POSITIONS  # the window slid many times


def test_a_rule_drafts_its_long_length_only_right_after_a_cycle_that_kept_its_whole_draft():
    """(1, 6): a one-token draft, six right after a draft kept whole. Positions: a 1-token draft kept
    (yields 2), then six kept (yields 7), then a miss at once, then 1 drafted again."""
    log = LookupLog()
    log.settled.extend([(8, 8), (8, 7), (8, 8), (8, 8), (8, 8), (8, 8), (8, 8), (8, 8), (8, 8), (8, 0),
                        (8, 8), (8, 8)] + [(0, 0)] * 4)
    cost = lambda n: 0.010 + 0.002 * n  # noqa: E731
    seconds, tokens, cycles = log.replay(1, cost, after_full=6)
    # cycle at 0: 1 drafted, kept (2 tokens) -> at 2: 6 drafted, kept (7) -> at 9: 6 drafted, none
    # kept (1) -> at 10: 1 drafted, kept (2) -> at 12: four plain steps
    assert (tokens, cycles) == (16, 8)
    assert seconds == pytest.approx(2 * cost(2) + 2 * cost(7) + 4 * cost(1))


def test_no_replay_before_enough_positions_are_settled():
    log = LookupLog()
    log.settled.extend([(8, 8)] * (MIN_REPLAY - 1))
    assert log.replay(4, lambda n: 0.01) is None
    log.settled.append((8, 8))
    assert log.replay(4, lambda n: 0.01) is not None
    log.settled.extend([(0, 0)] * (2 * REPLAY_POSITIONS))
    assert len(log.settled) == REPLAY_POSITIONS  # only the latest positions count


def _policy_with_log(history: list[tuple[int, int]], slope: float = 0.2) -> Policy:
    """A policy whose L2 forward costs 10 ms + `slope` of that per extra token, every size timed,
    with `history` as its logged lookups and an n-gram acceptance prior that says nothing."""
    p = Policy()
    for n in range(1, 14):
        p.costs.record("l2", n, 0.010 * (1 + slope * (n - 1)))
        p.costs.record("l1", n, 0.009 * (1 + slope * (n - 1)))  # L1 nearly as dear as L2: never worth it
    for m in Mode:
        p.tried[m] = EXPLORE_CYCLES
    p.lookups.settled.extend(history)
    return p


def test_bursts_of_copies_that_the_acceptance_model_undervalues_make_draft_only_win():
    """Every third position starts an 8-token copy, the rest find nothing: draft-only gains a lot by
    the replay. The per-token acceptance model, fed the same lookups, had priced it near ar's."""
    burst = [(8, 8), (8, 7), (8, 6), (8, 5), (8, 4), (8, 3), (8, 2), (8, 1), (0, 0), (0, 0), (0, 0), (0, 0)]
    p = _policy_with_log(burst * 5)
    chosen = p.choose(AUTO, has_l0=True, context_tokens=4000)
    assert chosen.mode is Mode.DRAFT_ONLY and chosen.gamma1 >= 4
    ar = p.seconds_per_token(Structure(Mode.AR))
    assert p.seconds_per_token(chosen) < 0.6 * ar


def test_lookups_that_miss_keep_ar_and_a_small_replayed_gain_is_taken():
    misses = [(8, 0), (0, 0), (3, 0), (0, 0)] * 16
    p = _policy_with_log(misses)
    assert p.choose(AUTO, has_l0=True, context_tokens=4000).mode is Mode.AR
    # one position in 16 offers one token that holds: draft-only replays at 0.95x ar, a gain the
    # acceptance model's margin (SPECULATION_GAIN) would not take and the replay's does
    some = ([(1, 1)] + [(0, 0)] * 15) * 4
    p = _policy_with_log(some)
    chosen = p.choose(AUTO, has_l0=True, context_tokens=4000)
    ratio = p.seconds_per_token(Structure(Mode.DRAFT_ONLY, 1)) / p.seconds_per_token(Structure(Mode.AR))
    assert ratio == pytest.approx(0.95) and ratio < REPLAY_GAIN
    assert chosen.mode is Mode.DRAFT_ONLY


def test_replayed_draft_only_cycles_re_time_ar_so_no_ar_probes_interrupt_them():
    p = _policy_with_log([(8, 8), (8, 7), (8, 6), (8, 5), (8, 4), (8, 3), (8, 2), (8, 1)] * 8)
    p.realized(Structure(Mode.AR), 0.011, 1)  # ar's wall time: 1.1x its forward
    ran = []
    for _ in range(2 * AR_RETIME + 1):
        s = p.choose(AUTO, has_l0=True, context_tokens=4000)
        ran.append(s)
        p.realized(s, 1.3 * p.costs.estimate("l2", s.gamma1 + 1), 3, checked=s.gamma1 + 1)
    assert all(s.mode is Mode.DRAFT_ONLY for s in ran)  # no ar cycle every AR_RETIME
    assert 1.25 < p._ar_ratio <= 1.3  # re-timed by the draft-only cycles' wall time


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_folder(tiny_model_dir("llama"))


def test_auto_logs_a_lookup_at_every_position_and_stays_identical_to_ar(tiny, sample_text):
    """Whatever auto runs, each position of the answer gets an n-gram lookup, settled against the
    tokens the target went on to emit; a recount over the final sequence gives the same log."""
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    messages = [ChatMessage("user", "Repeat the first line of the play.")]
    ar = ChatSession(tiny, DecodeSettings(mode="ar", max_new_tokens=48), draft="none", capacity=2048)
    reference, _ = answer_tokens(ar, messages, doc)
    session = ChatSession(tiny, AUTO.replace(mode="auto-legacy", max_new_tokens=48), draft="ngram", capacity=2048)
    session.decoder.policy.forced = [Structure(Mode.AR), Structure(Mode.DRAFT_ONLY, 3, 1),
                                     Structure(Mode.TRIFORCE, 2, 3), Structure(Mode.DRAFT_ONLY, 6, 1)]
    script = [s.mode for s in session.decoder.policy.forced]  # (the list rotates as it runs)
    steps, starts, step = [], [], session.decoder.step

    def logged_step(seq):
        starts.append(len(seq))
        out = step(seq)
        steps.append(list(seq) + [token for token, _ in out])
        return out
    session.decoder.step = logged_step
    got, _ = answer_tokens(session, messages, doc)
    assert got == reference
    sequence = steps[-1]  # everything the target emitted, the last cycle's tokens included
    recount, expected = NgramDrafter(), []
    for position in range(starts[0], len(sequence)):
        draft = recount.propose(sequence[:position], LOOKUP_TOKENS, AUTO.sampling, None).tokens
        known = sequence[position:position + len(draft)]
        matched = common_prefix(draft, known)
        if matched < len(known) or len(known) == len(draft):
            expected.append((len(draft), matched))
        else:
            break  # this one and the later ones still wait for tokens
    log = list(session.decoder.policy.lookups.settled)
    assert len(log) >= 20 and log == expected
    # each position is tagged with the mode of the cycle that emitted its token (the forced script)
    emitted_by = {p: script[i % len(script)] for i, (a, b) in enumerate(zip(starts, starts[1:])) for p in range(a, b)}
    tags = list(session.decoder.policy.lookups.settled.tags)
    assert tags == [emitted_by[starts[0] + i] for i in range(len(tags))]
    assert {Mode.AR, Mode.DRAFT_ONLY, Mode.TRIFORCE} <= set(tags)


def test_the_draft_length_the_replay_rates_best_changes_seldom_over_three_answers_of_positions():
    """Answers of 64 positions, each with a stretch of 40 where lookups copy 8 tokens right, placed
    anywhere, the rest missing at the second token. Over a window of one answer the best length
    follows the stretches the window holds (γ1 = 1-6 here); over REPLAY_POSITIONS (three answers) it
    changes far less often."""
    rng = random.Random(1)
    seq = []
    for _ in range(10):
        start = rng.randrange(0, 24)
        seq += [(8, 1)] * start + [(8, 8)] * 40 + [(8, 1)] * (24 - start)
    cost = lambda n: 0.010 * (1 + 0.25 * (n - 1))  # noqa: E731  (a check's seconds, steep as a CPU's)

    def best(window: list[tuple[int, int]]) -> int:
        log = LookupLog()
        log.settled.extend(window)
        rated = {g: log.replay(g, cost) for g in range(1, LOOKUP_TOKENS + 1)}
        return min(rated, key=lambda g: rated[g][0] / rated[g][1])

    def changes(window: int) -> int:
        picks = [best(seq[:n][-window:]) for n in range(4 * 64, 10 * 64, 8)]
        return sum(a != b for a, b in zip(picks, picks[1:]))

    assert REPLAY_POSITIONS >= 3 * 64
    assert 2 * changes(REPLAY_POSITIONS) < changes(64), (changes(REPLAY_POSITIONS), changes(64))


def test_a_tagged_replay_walks_each_run_of_one_modes_positions_from_its_first():
    log = LookupLog()
    log.settled.extend([(8, 8)] * 3)  # untagged: left out
    for item in [(8, 2), (8, 0), (0, 0)]:
        log.settled.append(item, "copy")
    log.settled.append((8, 8), "other")
    for item in [(8, 8), (8, 7)]:
        log.settled.append(item, "copy")
    cost = lambda n: 0.010 * n  # noqa: E731
    # run 1 at gamma 4: 5 tokens checked, 2 + 1 kept (the run's end); run 2: 5 checked, 4 + 1 kept
    assert log.replay_tagged("copy", 4, cost) == (pytest.approx(2 * cost(5)), 3 + 5)
    assert log.replay_tagged("none", 4, cost) == (0.0, 0)


def _triforce_ran_the_copies(tagged: bool) -> Policy:
    """96 positions that n-gram drafts miss, which draft-only emitted, then 96 of copies that
    triforce emitted (its L0 and L1 drafts all held there); L1 a little cheaper than L2."""
    p = Policy()
    for n in range(1, 14):
        p.costs.record("l2", n, 0.010 * (1 + 0.2 * (n - 1)))
        p.costs.record("l1", n, 0.008 * (1 + 0.2 * (n - 1)))
    for m in Mode:
        p.tried[m] = EXPLORE_CYCLES
    copy = [(8, 8), (8, 7), (8, 6), (8, 5), (8, 4), (8, 3), (8, 2), (8, 1)]
    for item in [(8, 0), (0, 0), (2, 0), (0, 0)] * 24:
        p.lookups.settled.append(item, Mode.DRAFT_ONLY if tagged else None)
    for item in copy * 12:
        p.lookups.settled.append(item, Mode.TRIFORCE if tagged else None)
    for _ in range(40):
        p.observe("l0_l1", 4, 4)
        p.observe("l1_l2", 6, 6)
    return p


def test_triforce_measured_on_the_copies_is_priced_for_text_as_hard_as_the_windows():
    """triforce's acceptance comes from the stretch it ran, all copies; draft-only's replay covers the
    whole window, half of it misses. Priced as measured, triforce beats draft-only; priced for the
    window's text (draft-only's replay there runs ~2x dearer than over triforce's stretch), it
    does not. (Without the tags nothing tells the stretches apart: the old price.)"""
    untagged = _triforce_ran_the_copies(tagged=False)
    assert untagged.choose(AUTO, has_l0=True, context_tokens=4000).mode is Mode.TRIFORCE
    p = _triforce_ran_the_copies(tagged=True)
    assert p.choose(AUTO, has_l0=True, context_tokens=4000).mode is Mode.DRAFT_ONLY
    t = Structure(Mode.TRIFORCE, 4, 6)
    ratio = p.seconds_per_token(t) / untagged.seconds_per_token(t)
    assert 1.8 < ratio <= 2.0
    # the refresh judges by the model alone, its realized ratios left out, but on these inputs too:
    # at continue 1K (Zen 4) triforce, its stretches 1.4x easier than the window, was refreshed at
    # ~cycle 48, 61-79 ms for 7-8 tokens where draft-only yields 5 in ~20
    ms, best = p._best_of(Mode.TRIFORCE, AUTO)
    plain = untagged.seconds_per_token(best, corrected=False)
    assert p.seconds_per_token(best, corrected=False) == pytest.approx(ratio * plain)
    within = (1 + ratio) / 2 * plain  # a margin that takes the model's price on the copies, not the window's
    assert untagged.runner_up([best], within) == best and p.runner_up([best], within) is None
    # the stretches age out of the window: the last factor stays (nothing newer says otherwise)
    p.lookups.settled.extend([(0, 0)] * REPLAY_POSITIONS)
    p._memo.clear()
    assert p.seconds_per_token(t) / untagged.seconds_per_token(t) == pytest.approx(ratio)
