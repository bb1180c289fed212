"""Draft lengths priced off an L2 check timed in a slow spell get re-timed (size_retime.py): every
SIZE_RETIME cycles the best other length whose check is stale runs one cycle, each length twice as
seldom each time."""
from __future__ import annotations

from engine.decoding.policy import EXPLORE_CYCLES, Policy
from engine.decoding.size_retime import SIZE_RETIME, check_size
from engine.decoding.structure import Structure
from engine.settings import DecodeSettings, Mode
from test_policy import _iid

AUTO = DecodeSettings(mode="auto")


def _quiet(n: int) -> float:
    """L2's check of n tokens on a quiet machine: 30 ms + 8 per extra token (1K on a Zen 1)."""
    return 0.030 + 0.008 * (n - 1)


def _policy() -> Policy:
    """draft-only at acceptance 0.9, every check size timed, those of 4-7 tokens in a slow spell
    (1.5x their cost: the most the table lets a new size's first timing stand at)."""
    p = Policy()
    for n in range(1, 8):
        p.costs.record("l2", n, _slow(n))
    for _ in range(200):
        p.observe("l0_l2", 10, 9)
    _iid(p.acceptance["l0_l2"])
    for m in Mode:
        p.tried[m] = EXPLORE_CYCLES
    return p


def _slow(n: int) -> float:
    """The slow spell: checks of 4 tokens or more at 1.5x."""
    return (1.5 if n >= 4 else 1.0) * _quiet(n)


def _run(p: Policy, cycles: int, cost=_quiet) -> list[Structure]:
    """`cycles` choices, each cycle's check taking `cost` of its size (and re-timing it)."""
    ran = []
    for _ in range(cycles):
        s = p.choose(AUTO, has_l0=True, context_tokens=1024)
        size = check_size(s)
        p.costs.record("l2", size, cost(size))
        p.realized(s, cost(size), max(1, round(p.cycle_cost(s)[1])), checked=size, forwards=[("l2", size)])
        ran.append(s)
    return ran


def test_a_draft_length_priced_off_a_check_timed_in_a_slow_spell_is_re_timed_and_then_run():
    """Quiet, γ1 = 4-6 yield the most per second; with their checks held at 1.5x, γ1 = 2 looks
    best and, never leaving it, auto never re-timed them (continue 1K: γ1 = 2 for the session,
    0.87x fixed draft-only at γ1 = 4)."""
    p = _policy()
    first = _run(p, 1)[0]
    assert first.mode is Mode.DRAFT_ONLY and first.gamma1 <= 2
    ran = _run(p, 6 * SIZE_RETIME)
    assert any(s.gamma1 >= 3 for s in ran[: 2 * SIZE_RETIME])  # a longer length re-timed
    assert all(s.gamma1 >= 3 for s in ran[-SIZE_RETIME:] if s.mode is Mode.DRAFT_ONLY)  # and, quiet, it runs
    assert sum(s.mode is Mode.DRAFT_ONLY for s in ran[-SIZE_RETIME:]) >= SIZE_RETIME - 2  # (ar re-timed)


def test_a_length_that_stays_dear_is_re_timed_ever_more_seldom():
    """The slow spell lasts: each re-time reads the same dear check, and the length waits 16, 32,
    64 ... cycles before the next."""
    p = _policy()
    ran = _run(p, 16 * SIZE_RETIME, cost=_slow)
    probes = [i for i, s in enumerate(ran) if s.mode is Mode.DRAFT_ONLY and s.gamma1 >= 3]
    assert 3 <= len(probes) <= 12, probes
    assert all(ran[i + 1].gamma1 <= 2 for i in probes[:-1])  # each one cycle, then back
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[-1] >= 4 * SIZE_RETIME  # backed off
