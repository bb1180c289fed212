"""How often `auto` scores its choice (engine/decoding/rescore.py): less often while scorings agree,
never so seldom that a probe comes late."""
from __future__ import annotations

import pytest

from engine.decoding.policy import Policy
from engine.decoding.rescore import RESCORE_EVERY, RESCORE_MAX
from engine.decoding.size_retime import CLOSE_EVERY
from engine.decoding.structure import Structure
from engine.settings import Mode
from test_size_retime import AUTO, _cycle, _measured_policy


def _settled_policy(setup: str) -> Policy:
    """`replay`: draft-only priced by replayed lookups (ar re-timed by its own cycles); `l1`:
    retrieval-only, with ar re-timed every AR_RETIME cycles and triforce refreshed; `close`: on ar
    after retrieval-only's price rose near ar's (test_size_retime: it comes back as a close contender)."""
    if setup == "replay":
        p = _measured_policy(l0_l2=0.8, l1_l2=0.5, l0_l1=0.5, l1_share=0.9)
        p.lookups.settled.extend([(6, 3)] * 64)
    else:
        p = _measured_policy(l0_l2=0.0, l1_l2=0.9, l0_l1=0.0, l1_share=0.4)
        p._l1_live = True
    ar = Structure(Mode.AR)
    p.realized(ar, p.seconds_per_token(ar, corrected=False), 1)
    if setup == "close":
        for slow, tokens in [(1.0, None)] * 12 + [(1.3, 2)] * 6:
            _cycle(p, slow, tokens)
        assert p.current == ar
    return p


def _scoring_cycles(p: Policy, cycles: int) -> list[int]:
    """Run `cycles` cycles; the indices of those whose choice scored (rescore: _since_score back at 1)."""
    scored = []
    for i in range(cycles):
        _cycle(p)
        if p._since_score == 1:
            scored.append(i)
    return scored


def test_scorings_back_off_to_rescore_max_while_they_agree():
    """Steady on draft-only, auto scored every RESCORE_EVERY (4) cycles: ~0.75 ms of Python each at
    continue 1K on a Zen 3, most of what it spent a step beyond a fixed mode. Scorings that keep the
    running structure now wait twice as long each time, up to RESCORE_MAX."""
    scored = _scoring_cycles(_settled_policy("replay"), 100)
    gaps = [b - a for a, b in zip(scored, scored[1:])]
    assert max(gaps) == RESCORE_MAX, scored
    assert len(scored) <= 100 // RESCORE_EVERY * 2 // 3, scored  # (every 4: 25 or more)


@pytest.mark.parametrize("setup", ["replay", "l1", "close"])
def test_a_backed_off_wait_never_delays_a_probe(setup):
    """Probes are decided at scorings (ar re-timed, the runner-up refreshed, a draft length's stale
    check re-timed) and count their own cycles: a wait ends where one may come due. With prices that
    do not move, auto runs the same structures, cycle by cycle, as one that scores every cycle
    (scoring every 4, its untimed length's re-times came at cycles 21 and 54 against 20 and 52);
    on ar, a close contender comes back on the same cycle."""
    eager = _settled_policy(setup)
    plain = eager.scored

    def every_cycle(chosen, running):
        plain(chosen, running)
        eager._score_wait = 1
    eager.scored = every_cycle
    lazy = _settled_policy(setup)
    ran, eagerly = [_cycle(lazy).label for _ in range(200)], [_cycle(eager).label for _ in range(200)]
    if setup == "close":  # (after the slow cycles, retrieval-only's price settles cycle by cycle, and
        back = eagerly.index("retrieval-only g2=6")  # a price on the move is what the scorings look at)
        assert back < CLOSE_EVERY and ran[:back + 1] == eagerly[:back + 1]
    else:
        assert ran == eagerly
    assert len(set(ran)) > 1  # (probes ran: the test saw some)


def test_a_surprise_starts_the_waits_over():
    """A cycle SURPRISE times over its prediction scores the next choice, and the waits after it
    start again at RESCORE_EVERY."""
    p = _settled_policy("replay")
    _scoring_cycles(p, 100)
    assert p._rescore_every == RESCORE_MAX
    s = p.choose(AUTO, has_l0=True, context_tokens=8000)
    _, expected = p.cycle_cost(s)
    p.realized(s, 3.0 * p.seconds_per_token(s) * max(1, round(expected)), max(1, round(expected)))
    scored = _scoring_cycles(p, 12)
    assert scored[0] == 0 and scored[1] - scored[0] <= RESCORE_EVERY, scored


def test_a_replayed_draft_only_cycle_is_a_surprise_in_time_only():
    """A replayed draft-only cycle yields what its lookup offered and the target then emitted, which
    the replay prices over its whole window: one that kept 1 token of a 5-token check at that
    check's cost is no news (at continue 1K ~2 such cycles an answer re-scored the choice, Zen 3);
    one at twice its check's time is."""
    p = _settled_policy("replay")
    s = p.choose(AUTO, has_l0=True, context_tokens=8000)
    assert s.mode is Mode.DRAFT_ONLY and p._settled
    check = s.gamma1 + 1
    step = p.costs.estimate("l2", check) * p.seconds_per_token(Structure(Mode.AR)) / p.costs.estimate("l2", 1)
    p.realized(s, step, 1, checked=check)
    assert p._settled
    p.realized(s, 2.0 * step, 1, checked=check)
    assert not p._settled
