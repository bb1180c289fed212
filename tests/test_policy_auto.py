"""`auto` in simulated sessions: a fake clock with scripted forward costs and acceptance stands in for
the decoder, so each test states what the policy does, not how (engine/decoding/auto/)."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from engine.decoding.auto import AutoPolicy
from engine.decoding.structure import Structure
from engine.settings import DecodeSettings, Mode

AUTO = DecodeSettings(mode="auto", gamma1=4, gamma2=6)


class FakeDecoder:
    """Runs the cycles a policy chooses against scripted costs: `l2(n)` / `l1(n)` seconds for a
    forward checking n tokens, per-token acceptance at each boundary, and each mode's overhead (wall
    time over its forwards). Reports to the policy what HierarchicalDecoder reports."""

    def __init__(self, l2=lambda n: 0.020 + 0.003 * n, l1=lambda n: 0.018 + 0.003 * n,
                 accept=None, overhead=None, seed=0, shadows=False) -> None:
        self.l2, self.l1 = l2, l1
        self.shadows = shadows  # score n-gram lookups over cycles draft-only does not run, as the decoder does
        self.position = 0  # the text is the token stream 0, 1, 2, ...: the token at position p is p
        self.accept = {"l0_l2": 0.5, "l1_l2": 0.5, "l0_l1": 0.5, **(accept or {})}
        self.overhead = {m: 1.05 for m in Mode} | (overhead or {})
        self.rng = random.Random(seed)
        self.spike = 1.0  # the next cycle's forwards take this many times their cost

    def _accepted(self, boundary: str, proposed: int) -> int:
        k = 0
        while k < proposed and self.rng.random() < self.accept[boundary]:
            k += 1
        return k

    def _forward(self, policy: AutoPolicy, level: str, n: int) -> float:
        seconds = (self.l2 if level == "l2" else self.l1)(n) * self.spike
        policy.timed(level, n, seconds)
        return seconds

    def cycle(self, policy: AutoPolicy, settings: DecodeSettings = AUTO, context: int = 8000,
              budget: int = 1024) -> Structure:
        s = policy.choose(settings, True, context, budget)
        asked = policy.wants_shadow(settings, s) if self.shadows else 0
        if asked:  # a lookup right for its first k tokens (k drawn at draft-only's acceptance), then wrong
            k = self._accepted("l0_l2", asked)
            policy.shadow(self.position, [self.position + i for i in range(k)] + [-1] * (asked - k), asked)
        wall, tokens = 0.0, 1
        if s.mode is Mode.AR:
            wall = self._forward(policy, "l2", 1)
        elif s.mode is Mode.DRAFT_ONLY:
            k = self._accepted("l0_l2", s.gamma1)
            wall = self._forward(policy, "l2", s.gamma1 + 1)
            policy.observe("l0_l2", s.gamma1, k)
            tokens = k + 1
        else:
            drafted = 0
            while drafted < s.gamma2:
                if s.mode is Mode.TRIFORCE:
                    k = self._accepted("l0_l1", s.gamma1)
                    wall += self._forward(policy, "l1", s.gamma1 + 1)
                    policy.observe("l0_l1", s.gamma1, k)
                    drafted += k + 1
                else:
                    wall += self._forward(policy, "l1", 1)
                    drafted += 1
            k = self._accepted("l1_l2", drafted)
            wall += self._forward(policy, "l2", drafted + 1)
            policy.observe("l1_l2", drafted, k)
            tokens = k + 1
        self.spike = 1.0
        policy.realized(s, wall * self.overhead[s.mode], tokens)
        self.position += tokens
        if self.shadows:
            policy.settle(list(range(self.position)))
        return s

    def run(self, policy: AutoPolicy, cycles: int, **kw) -> list[Mode]:
        return [self.cycle(policy, **kw).mode for _ in range(cycles)]


# regimes whose winner is clear by construction: text that copies (n-gram drafts hold), a question
# (a cheap retrieval level that agrees with the target), and text no drafter predicts
REGIMES = {
    Mode.DRAFT_ONLY: dict(accept={"l0_l2": 0.9, "l1_l2": 0.6, "l0_l1": 0.6}),
    Mode.RETRIEVAL_ONLY: dict(l1=lambda n: 0.004 + 0.003 * n, accept={"l0_l2": 0.1, "l1_l2": 0.9, "l0_l1": 0.1}),
    Mode.AR: dict(accept={"l0_l2": 0.05, "l1_l2": 0.2, "l0_l1": 0.05}),
}


@pytest.mark.parametrize("winner", list(REGIMES), ids=lambda m: m.value)
def test_the_structure_that_should_win_wins(winner):
    policy = AutoPolicy()
    modes = FakeDecoder(**REGIMES[winner]).run(policy, 300)
    late = Counter(modes[100:])
    assert late[winner] >= 0.9 * 200, late
    assert policy.running.mode is winner


def test_every_structure_is_explored_once_then_the_cheapest_runs():
    policy = AutoPolicy()
    modes = FakeDecoder(**REGIMES[Mode.RETRIEVAL_ONLY]).run(policy, 40)
    assert [modes[i] for i in range(0, 8, 2)] == [Mode.AR, Mode.DRAFT_ONLY, Mode.TRIFORCE, Mode.RETRIEVAL_ONLY]
    assert modes[:8:2] == modes[1:8:2]  # two cycles each
    assert Counter(modes[8:]).most_common(1)[0][0] is Mode.RETRIEVAL_ONLY


def test_exploration_is_bounded():
    """Over a long stable session the cycles off the winner are a few per cent, and grow with the log
    of the session's length (a mode's refresh wait doubles after each of its refreshes that loses)."""
    policy = AutoPolicy()
    modes = FakeDecoder(**REGIMES[Mode.DRAFT_ONLY]).run(policy, 2000)
    off = sum(m is not Mode.DRAFT_ONLY for m in modes)
    # 4 explorations of 2 cycles, then refreshes of 2: a mode priced r times draft-only's is refreshed
    # at most log2(2000 / (16 r)) times, and every mode here is priced at least ~2x
    assert off <= 4 * 2 + 7 * 2, off
    assert off <= policy.schedule.explorations <= off + 2  # (+ the winner's own exploration)


def test_a_stale_price_gets_retimed():
    """L1 gets cheaper while auto runs draft-only (another process left the machine): a refresh
    re-times it (it was priced within reach of draft-only) and auto moves to the structure that now wins."""
    sim = FakeDecoder(accept={"l0_l2": 0.55, "l1_l2": 0.9, "l0_l1": 0.3}, l1=lambda n: 0.012 + 0.003 * n)
    policy = AutoPolicy()
    sim.run(policy, 150)
    assert policy.running.mode is Mode.DRAFT_ONLY
    wait = max(policy.schedule.waits.values())
    sim.l1 = lambda n: 0.003 + 0.002 * n
    modes = sim.run(policy, 6 * wait + 100)  # the modes off the incumbent take turns: two refreshes at most
    assert policy.running.mode in (Mode.RETRIEVAL_ONLY, Mode.TRIFORCE)
    assert sum(m.uses_l1 for m in modes[-100:]) >= 80  # (the rest: refreshes of the others)


def test_draft_only_is_scored_while_another_structure_runs():
    """n-gram lookups cost nothing, so while ar runs auto checks what draft-only would have drafted
    against the target's tokens: when the text starts to copy, it moves to draft-only within a few
    cycles without probing it (the scheduled refreshes of other modes go on as they would)."""
    sim = FakeDecoder(**REGIMES[Mode.AR], shadows=True)
    policy = AutoPolicy()
    sim.run(policy, 100)
    assert policy.running.mode is Mode.AR
    sim.accept["l0_l2"] = 0.9
    probed = []  # the modes of the cycles the schedule spent probing
    for _ in range(12):
        before = policy.schedule.explorations
        mode = sim.cycle(policy).mode
        if policy.schedule.explorations > before:
            probed.append(mode)
    assert policy.running.mode is Mode.DRAFT_ONLY
    assert Mode.DRAFT_ONLY not in probed, probed


def test_a_dear_mode_is_re_timed_more_rarely():
    """A refresh costs its cycles at the probed mode's price: a mode priced r times the running one
    waits r times as long, so the dearer the mode, the fewer cycles go to it (here L1 costs about what
    L2 does and the text copies: ar is ~3x draft-only's price, the L1 structures ~6x)."""
    sim = FakeDecoder(accept={"l0_l2": 0.9, "l1_l2": 0.6, "l0_l1": 0.6}, l1=lambda n: 0.030 + 0.003 * n)
    policy = AutoPolicy()
    modes = sim.run(policy, 1000)[8:]  # after exploring each mode once
    l1, ar = sum(m.uses_l1 for m in modes), modes.count(Mode.AR)
    assert 0 < l1 <= ar <= 8, (l1, ar)


def test_a_cost_spike_does_not_flip_the_choice():
    """Forwards 10x slower for a few cycles (a burst of load) change neither what runs between probes
    nor what runs after."""
    sim = FakeDecoder(accept={"l0_l2": 0.75, "l1_l2": 0.6, "l0_l1": 0.6})
    policy = AutoPolicy()
    sim.run(policy, 100)
    held = policy.running.mode
    assert held is Mode.DRAFT_ONLY
    for _ in range(3):
        sim.spike = 10.0
        sim.cycle(policy)
        assert policy.running.mode is held
    sim.run(policy, 30)
    assert policy.running.mode is held


def test_the_draft_length_follows_plus_two_minus_one():
    """A fixed mode with its lengths tuned: 1 shorter after a rejection, 2 longer after a draft
    accepted whole, up to the settings' length."""
    settings = DecodeSettings(mode="draft-only", gamma1=8, auto=True)
    policy = AutoPolicy()
    lengths = []
    for accepted_whole in (True, False, False, False, True, True, False, True, True, True):
        s = policy.choose(settings, True, 4000, 1024)
        lengths.append(s.gamma1)
        policy.observe("l0_l2", s.gamma1, s.gamma1 if accepted_whole else 0)
    assert lengths == [8, 8, 7, 6, 5, 7, 8, 7, 8, 8]
    for _ in range(30):
        s = policy.choose(settings, True, 4000, 1024)
        policy.observe("l0_l2", s.gamma1, 0)
    assert policy.choose(settings, True, 4000, 1024).gamma1 == 1
    s = policy.choose(settings, True, 4000, 1024)
    policy.observe("l0_l2", 0, 0)  # an empty lookup: neither longer nor shorter
    policy.observe("l0_l2", 1, 1)  # ... nor a short draft accepted whole (asked 1, got 1: longer)
    assert policy.choose(settings, True, 4000, 1024).gamma1 == 3


def test_triforce_tunes_both_lengths_each_at_its_own_boundary():
    policy = AutoPolicy()
    settings = DecodeSettings(mode="triforce", gamma1=3, gamma2=5, auto=True)
    s = policy.choose(settings, True, 8000, 1024)
    policy.observe("l0_l1", 3, 1)  # L0's draft cut at L1: gamma1 - 1
    policy.observe("l1_l2", 5, 5)  # L1's draft accepted whole at L2: gamma2 stays at the settings'
    s = policy.choose(settings, True, 8000, 1024)
    assert (s.gamma1, s.gamma2) == (2, 5)
    policy.observe("l0_l1", 2, 2)  # accepted whole: 2 longer, but no longer than the settings' 3
    policy.observe("l1_l2", 5, 0)
    s = policy.choose(settings, True, 8000, 1024)
    assert (s.gamma1, s.gamma2) == (3, 4)


def test_no_retrieval_level_where_its_cache_holds_most_of_the_context():
    """A retrieval cache over half the context reads nearly L2's bytes: auto weighs ar and draft-only only."""
    policy = AutoPolicy()
    sim = FakeDecoder(**REGIMES[Mode.RETRIEVAL_ONLY])
    modes = [sim.cycle(policy, context=1500, budget=1024).mode for _ in range(60)]
    assert not any(m.uses_l1 for m in modes)


def step_bytes(n: int) -> int:
    """A target forward's bytes with n tokens held: 100 MB of weights, 40 KB of K/V a token."""
    return 100_000_000 + 40_000 * n


def test_l1_is_not_explored_where_its_bytes_say_it_cannot_pay():
    """At a short context L1 reads nearly L2's bytes (here its forwards cost 0.85x L2's): while the
    text copies, auto never spends a cycle on triforce or retrieval-only, before or after timing them."""
    sim = FakeDecoder(accept={"l0_l2": 0.8, "l1_l2": 0.9, "l0_l1": 0.8}, l1=lambda n: 0.85 * (0.020 + 0.003 * n))
    policy = AutoPolicy(step_bytes)
    modes = [sim.cycle(policy, context=1024, budget=128).mode for _ in range(300)]
    assert not any(m.uses_l1 for m in modes), Counter(modes)
    assert Counter(modes[50:]).most_common(1)[0][0] is Mode.DRAFT_ONLY


def test_l1_is_explored_where_its_bytes_say_it_may_pay_and_wins_there():
    """At a long context the retrieval cache's bytes are a small share of L2's: L1 gets priced under
    ar before it runs, is explored at short drafts, and retrieval-only wins the question regime."""
    policy = AutoPolicy(step_bytes)
    sim = FakeDecoder(**REGIMES[Mode.RETRIEVAL_ONLY])
    modes = [sim.cycle(policy, context=32_000, budget=1024).mode for _ in range(300)]
    assert Mode.RETRIEVAL_ONLY in modes[:12]
    assert Counter(modes[100:])[Mode.RETRIEVAL_ONLY] >= 0.9 * 200, Counter(modes[100:])


def test_a_fixed_mode_runs_as_set():
    policy = AutoPolicy()
    settings = DecodeSettings(mode="triforce", gamma1=2, gamma2=7)
    assert policy.choose(settings, True, 8000, 1024) == Structure(Mode.TRIFORCE, 2, 7)
    policy.observe("l1_l2", 7, 7)
    assert policy.choose(settings, True, 8000, 1024) == Structure(Mode.TRIFORCE, 2, 7)


def long_context_session(seed: int, l1_l2: float, cycles: int, l0: float = 0.4) -> tuple[list[Mode], AutoPolicy]:
    """A 16K-token context on text no drafter predicts well, costed like the bundled model there: L2's
    forwards cost more per token checked than at a short context, L1's forwards about half of L2's (far
    more than the 0.38x their bytes say), draft-only and triforce carry 20 % overhead; L1 agrees with
    L2 at `l1_l2` per token, L0 with either at `l0`."""
    sim = FakeDecoder(l2=lambda n: 0.034 + 0.008 * n, l1=lambda n: 0.017 + 0.004 * n, shadows=True, seed=seed,
                      accept={"l0_l2": l0, "l0_l1": l0, "l1_l2": l1_l2},
                      overhead={Mode.TRIFORCE: 1.2, Mode.DRAFT_ONLY: 1.2})
    policy = AutoPolicy(lambda n: 140_000_000 + 21_000 * n)  # the bundled model's bytes: weights + K/V per token
    return [sim.cycle(policy, context=16_384, budget=2048).mode for _ in range(cycles)], policy


def test_a_retrieval_level_that_agrees_with_the_target_is_found_at_a_long_context():
    """L1 agreeing 95 % of the time makes retrieval-only the cheapest (~0.87x ar and draft-only, as
    measured at 16K). Whatever the first checks happen to say, every session explores it within its
    first few cycles (a price from priors, or from another mode's few checks, cannot rule it out while
    full agreement would make it the cheapest), and most sessions end on it."""
    sessions = [long_context_session(seed, 0.95, 40) for seed in range(20)]
    assert all(Mode.RETRIEVAL_ONLY in modes[:8] for modes, _ in sessions)
    ended = sum(policy.running.mode is Mode.RETRIEVAL_ONLY for _, policy in sessions)
    assert ended >= 15, ended


def test_exploration_stays_bounded_at_a_long_context_where_nothing_pays():
    """Where L1 agrees only half the time and L0 is right one time in ten, no structure beats ar: L1
    is explored once (it could have paid), then every mode off ar is re-timed on the backed-off
    schedule, a few per cent of cycles."""
    modes, policy = long_context_session(0, 0.5, 1000, l0=0.1)
    assert policy.running.mode is Mode.AR
    off = sum(m is not Mode.AR for m in modes)
    # 4 explorations of 2 cycles; each of 3 modes then waits >= 16 cycles, twice as long after each loss
    assert off <= 4 * 2 + 3 * 2 * 6, off
