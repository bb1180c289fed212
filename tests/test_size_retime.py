"""Draft lengths priced off an L2 check timed in a slow spell get re-timed (size_retime.py): every
SIZE_RETIME cycles the best other length whose check is stale runs one cycle, each length twice as
seldom each time. And a choice that stays on its mode keeps its draft length unless another is
LENGTH_GAIN cheaper; and a runner-up that keeps losing its refresh is refreshed ever more seldom,
one whose price goes stale before one whose price keeps current; on ar, a mode priced close to it
runs a cycle every CLOSE_EVERY cycles away from it, ever more seldom while it loses."""
from __future__ import annotations

import pytest

from engine.decoding.lookup_replay import MIN_REPLAY
from engine.decoding.measurements import Acceptance
from engine.decoding.policy import EXPLORE_CYCLES, REFRESH_MARGIN, Policy
from engine.decoding.size_retime import (CLOSE_EVERY, CLOSE_MARGIN, LENGTH_GAIN, REFRESH_CYCLES, SIZE_RETIME,
                                         check_size)
from engine.decoding.structure import Structure
from engine.settings import DecodeSettings, Mode
from test_policy import _iid, _measured_policy

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


def _quiet_policy() -> Policy:
    """draft-only at acceptance 0.9, every check size timed quiet (and fresh)."""
    p = _policy()
    for _ in range(20):  # (believed half-way at each faster sample)
        for n in range(1, 8):
            p.costs.record("l2", n, _quiet(n))
    return p


def test_auto_runs_the_settings_draft_length_or_the_running_one_unless_another_is_clearly_cheaper():
    """Lengths the model prices within LENGTH_GAIN of its best are noise apart (continue 1K, Zen 4:
    a stale check made γ1 = 6 look 4.6 % cheaper than γ1 = 4, and it ran at 1.07x γ1 = 4's
    ms/token). The running length runs if within it, else the settings' one if within it, else
    the model's best. (The settings' length came first until a draft rule, once running and
    cheapest, gave way to γ1 = 4 within 4 % of it: continue 1K, Zen 4, fortieth pass.)"""
    p = _quiet_policy()
    price = {g: p.seconds_per_token(Structure(Mode.DRAFT_ONLY, g, AUTO.gamma2)) for g in range(1, 7)}
    best = min(price, key=price.get)
    close = [g for g in price if g != best and price[best] > LENGTH_GAIN * price[g]]
    far = [g for g in price if price[best] < 0.9 * price[g]]
    assert close and far, price  # (the ladder has both kinds)
    for named, running, expect in ((close[0], far[0], close[0]), (far[0], close[0], close[0]),
                                   (far[0], far[-1], best), (close[0], best, best)):
        q = _quiet_policy()
        q._ran(Structure(Mode.DRAFT_ONLY, running, AUTO.gamma2))
        chosen = q.choose(AUTO.replace(gamma1=named), has_l0=True, context_tokens=1024)
        assert chosen.mode is Mode.DRAFT_ONLY and chosen.gamma1 == expect, (named, running, price)
        shown = {c.structure.split()[0]: c for c in q.candidates}["draft-only"]  # (--stats, the Live panel)
        assert shown.structure == chosen.label and shown.ms_per_token == pytest.approx(1000 * price[expect])


def test_a_runner_up_that_keeps_losing_its_refresh_is_refreshed_ever_more_seldom():
    """On ar, draft-only is the runner-up within REFRESH_MARGIN by the model, and each of its
    refresh cycles runs 1.5x the model: it is refreshed after REFRESH_CYCLES cycles, then after
    twice as many each time (continue 1K, Zen 4: triforce, 3x draft-only's ms/token, one cycle every
    48); a mode that wins a choice starts over."""
    p = _measured_policy(l0_l2=0.0, l1_l2=0.0, l0_l1=0.0, l1_share=0.95)
    ar = Structure(Mode.AR)
    refreshed = []
    for cycle in range(8 * REFRESH_CYCLES):
        s = p.choose(AUTO, has_l0=True, context_tokens=8000)
        slow = 1.0 if s.mode is Mode.AR else 1.5
        p.realized(s, slow * p.seconds_per_token(s, corrected=False), 1)
        if s != ar:
            refreshed.append(cycle)
    gaps = [b - a for a, b in zip(refreshed, refreshed[1:])]
    assert refreshed[0] <= REFRESH_CYCLES + 1 and len(refreshed) == 3, refreshed
    assert 2 * REFRESH_CYCLES <= gaps[0] < gaps[1], gaps  # (the global cadence rounds each wait up)
    p.refresh_won(Mode.DRAFT_ONLY)
    assert p.refresh_due(Mode.DRAFT_ONLY)


def _time_in_a_spell_on_one_token(p: Policy) -> None:
    """Every check size timed (20 times) while the 1-token check ran at twice its cost."""
    for _ in range(20):
        for n in range(1, 8):
            p.costs.record("l2", n, (2.0 if n == 1 else 1.0) * _quiet(n))


def _skewed_policy() -> Policy:
    """As _quiet_policy, but every size timed while the 1-token check ran at twice its cost (a
    slow spell that hit it alone), then γ1 = 4 run quiet for 12 cycles: the 1-token check falls
    to its cost, and the untimed sizes, read as moving with it, fall to about half of theirs."""
    p = _policy()
    _time_in_a_spell_on_one_token(p)
    _run(p, 12)
    for _ in range(4):  # (the empty lookups' plain steps)
        p.costs.record("l2", 1, _quiet(1))
    p.reprice()  # (as the next choice reads them)
    return p


def test_a_length_cheap_only_at_a_stale_check_price_runs_one_cycle_to_time_it_not_the_answer():
    """A check size left untimed is read as moving with the smallest size, and the sizes do not move
    alike: at continue 1K on a Zen 4 a 7-token check went stale at 26 ms, the 1-token check fell by
    a third, the table read 20.7, and auto ran γ1 = 6 for whole answers at 1.09x γ1 = 4's forward
    time. A length cheaper only at a stale price runs one cycle, which times its check; then the
    choice weighs it at that price."""
    p = _skewed_policy()
    assert not p.costs.fresh("l2", 7) and p.costs.estimate("l2", 7) < 0.7 * _quiet(7)
    six, four = (p.seconds_per_token(Structure(Mode.DRAFT_ONLY, g, AUTO.gamma2)) for g in (6, 4))
    assert six < 0.9 * four  # (γ1 = 6 looks clearly best)
    ran = _run(p, 2 * SIZE_RETIME)
    assert [s.gamma1 for s in ran].count(6) == 1  # one cycle timed the check at its cost
    # the other lengths, all read low, each re-timed once, one at a time (ar re-timed too)
    assert sum(s.gamma1 == 4 for s in ran[-SIZE_RETIME:] if s.mode is Mode.DRAFT_ONLY) >= SIZE_RETIME - 4


def test_a_length_whose_check_is_timed_cheaper_runs_after_its_re_time():
    """The same, where the stale price was right: after its one cycle the length runs."""
    p = _skewed_policy()

    def seven_cheap(n: int) -> float:  # checks of 7 tokens as cheap as 4 (a staircase step)
        return _quiet(4 if n == 7 else n)

    ran = _run(p, 2 * SIZE_RETIME, cost=seven_cheap)
    assert sum(s.gamma1 == 6 for s in ran[-SIZE_RETIME:] if s.mode is Mode.DRAFT_ONLY) >= SIZE_RETIME - 4


def test_a_refresh_that_loses_makes_the_next_refresh_of_any_mode_wait_twice_as_long():
    """Three runner-ups within REFRESH_MARGIN of ar by the model, each refresh cycle 1.5x the model:
    each mode's own doubling wait alone let the others in between (continue 1K and 8K: a triforce
    refresh near cycle 48 and a retrieval-only one near 96, each costing its answer 7-17 %). A
    refresh that loses makes the next one, of any mode, wait twice as long."""
    p = _measured_policy(l0_l2=0.05, l1_l2=0.5, l0_l1=0.0, l1_share=0.7)  # all three within the margin
    p._l1_live = True  # (the retrieval cache built: an L1 runner-up may be refreshed)
    ar = Structure(Mode.AR)
    away = []  # cycles off ar
    for cycle in range(8 * REFRESH_CYCLES):
        s = p.choose(AUTO, has_l0=True, context_tokens=8000)
        slow = 1.0 if s.mode is Mode.AR else 1.5
        p.realized(s, slow * p.seconds_per_token(s, corrected=False), 1)
        p._l1_live = True
        if s != ar:
            away.append(cycle)
    starts = [c for i, c in enumerate(away) if i == 0 or c - away[i - 1] > 3]  # each refresh (and what follows it)
    # on the old code: at cycles 48, 99, 148, 197, 246 and 343, the three runner-ups in turn
    assert len(starts) == 3 and starts[0] <= REFRESH_CYCLES + 1, away
    assert all(b - a >= 2 * REFRESH_CYCLES for a, b in zip(starts, starts[1:])), away


def test_a_refresh_goes_to_a_structure_priced_by_the_model_before_one_priced_by_its_replay():
    """On ar, the lookups found nothing: replayed, draft-only costs what ar does, the model's
    cheapest runner-up; retrieval-only, priced by the model a little above it, is within the margin.
    draft-only's price keeps current while ar runs (its lookups are logged at every position, its
    checks priced on ar's table), retrieval-only's does not: the refresh runs retrieval-only. (qa 4K,
    Zen 4: auto refreshed draft-only at cycle 51 and ran ar for two answers at 0.69-0.83x fixed
    retrieval-only.) Where no structure priced by the model is within the margin, draft-only is."""
    for l1_share, probed in ((0.8, Mode.RETRIEVAL_ONLY), (1.5, Mode.DRAFT_ONLY)):
        p = _measured_policy(l0_l2=0.0, l1_l2=0.5, l0_l1=0.0, l1_share=l1_share)
        p.lookups.settled.extend([(0, 0)] * MIN_REPLAY)  # every lookup empty: a plain step each
        p._l1_live = True  # (its cache built: an L1 runner-up may be refreshed)
        ar = Structure(Mode.AR)
        p.realized(ar, p.seconds_per_token(ar, corrected=False), 1)
        assert p.choose(AUTO, has_l0=True, context_tokens=8000) == ar
        replayed = p.seconds_per_token(Structure(Mode.DRAFT_ONLY, 1, AUTO.gamma2), corrected=False)
        modelled = min(p.seconds_per_token(Structure(Mode.RETRIEVAL_ONLY, 1, g), corrected=False) for g in range(1, 13))
        assert replayed == pytest.approx(p.seconds_per_token(ar, corrected=False))
        assert (replayed < modelled <= REFRESH_MARGIN * replayed) is (probed is Mode.RETRIEVAL_ONLY)
        p._since_refresh, p._settled = REFRESH_CYCLES, False  # a refresh is due at this scoring
        assert p.choose(AUTO, has_l0=True, context_tokens=8000).mode is probed, l1_share


def _cycle(p: Policy, slow: float = 1.0, tokens: int | None = None) -> Structure:
    """One choice at 8K whose cycle takes `slow` x its modelled forwards and yields `tokens` (None:
    the model's), the retrieval cache kept built."""
    s = p.choose(AUTO, has_l0=True, context_tokens=8000)
    seconds, expected = p.cycle_cost(s)
    p.realized(s, slow * seconds, tokens or max(1, round(expected)))
    p._l1_live = True
    return s


def test_an_l1_structure_priced_up_near_ar_runs_again_within_close_every_cycles():
    """retrieval-only runs at 0.82x ar by the model; six cycles that yield 2 tokens of 7 at 1.3x
    their time price it at 1.03x ar, and auto falls back to ar (a running structure stays while it
    is priced under ar: policy.STAY_ON_MEASURED; four such cycles priced it at 0.99x, where it now
    stays). Its cycles then cost what the model says again, but its price does not move while it does not run: at qa 1K (Zen 4) auto ran ar for
    the answer's last 24 cycles, that answer at 1.07x fixed retrieval-only's ms/token. Within 1.1x of
    ar's price, it runs one cycle once CLOSE_EVERY have run without it, and auto goes back to it.
    (On the old code: 36 ar cycles, until the runner-up's refresh.)"""
    p = _measured_policy(l0_l2=0.0, l1_l2=0.9, l0_l1=0.0, l1_share=0.4)
    p._l1_live = True
    ar = Structure(Mode.AR)
    p.realized(ar, p.seconds_per_token(ar, corrected=False), 1)
    assert {_cycle(p).mode for _ in range(12)} == {Mode.RETRIEVAL_ONLY}
    for _ in range(6):
        _cycle(p, slow=1.3, tokens=2)
    prices = {c.structure.split()[0]: c.ms_per_token for c in p.candidates}
    assert prices["ar"] < prices["retrieval-only"] <= CLOSE_MARGIN * prices["ar"] and p.current == ar
    ran = [_cycle(p).mode for _ in range(CLOSE_EVERY + 8)]
    back = ran.index(Mode.RETRIEVAL_ONLY)
    assert back <= CLOSE_EVERY and set(ran[:back]) == {Mode.AR}, ran
    assert ran[-4:] == [Mode.RETRIEVAL_ONLY] * 4, ran  # (its quiet cycle priced it back under ar)


def test_a_close_contender_runs_ever_more_seldom_until_it_wins():
    """On ar, a mode priced within CLOSE_MARGIN of ar's (whose price goes stale) runs one cycle once
    CLOSE_EVERY have run without it, then after twice as many each time; one that wins a choice
    starts over. Those further off, an L1 one whose cache is dear to build (`l1_ok` False), and any
    while a speculative structure runs (switching between those needs only SWITCH_GAIN) are never
    taken."""
    p = Policy()
    ar, l1 = Structure(Mode.AR), Structure(Mode.RETRIEVAL_ONLY, 1, 6)
    far = Structure(Mode.TRIFORCE, 1, 6)
    for s in (l1, far):
        p.ratios.add(s, 0.1, 0.1, 4.0, 4)
    scored = [(0.100, ar), (0.100 * CLOSE_MARGIN - 1e-6, l1), (0.100 * CLOSE_MARGIN + 1e-6, far)]
    p._since_refresh = CLOSE_EVERY
    p.ratios.count = 2 * CLOSE_EVERY
    assert p.close_contender(scored, far, l1_ok=True) is None  # (not on ar)
    p._since_refresh = p.ratios.count = 0

    def probes(cycles: int, l1_ok: bool = True) -> list[int]:
        ran = []
        for cycle in range(cycles):
            p._cycles += 1
            p.ratios.count += 1
            p._since_refresh += 1
            chosen = p.close_contender(scored, ar, l1_ok)
            if chosen is not None:
                assert chosen == l1
                ran.append(cycle)
                p._since_refresh = 0
                p.ratios.modes[l1.mode].last_cycle = p.ratios.count
        return ran

    assert probes(3 * CLOSE_EVERY, l1_ok=False) == []
    ran = probes(8 * CLOSE_EVERY)
    assert ran[0] == 0 and [b - a for a, b in zip(ran, ran[1:])] == [CLOSE_EVERY, 2 * CLOSE_EVERY, 4 * CLOSE_EVERY]
    p.refresh_won(l1.mode)  # (its last cycle CLOSE_EVERY ago: it may run at once)
    assert probes(4 * CLOSE_EVERY) == [0, CLOSE_EVERY, 3 * CLOSE_EVERY]


def _stand_in_policy() -> Policy:
    """draft-only whose lookups find drafts the target never keeps (acceptance 0): every length
    costs its check per token, over ar's 30 ms. Its checks were timed while the 1-token one ran at
    twice its cost; that one has since fallen to its cost, so the stale sizes read at about half
    theirs (a 2-token check at 19 ms), and four cycles at γ1 = 4 keep its 5-token check fresh."""
    p = _policy()
    p.acceptance["l0_l2"] = Acceptance(0.0)
    for _ in range(200):
        p.observe("l0_l2", 10, 0)
    _time_in_a_spell_on_one_token(p)
    for _ in range(8):
        p.costs.record("l2", 1, _quiet(1))
    four = Structure(Mode.DRAFT_ONLY, 4, AUTO.gamma2)
    for _ in range(4):
        p._ran(four)
        p.costs.record("l2", 5, _quiet(5))
        p.realized(four, _quiet(5), 1, checked=5, forwards=[("l2", 5)])
    p.reprice()
    return p


def test_a_length_kept_for_the_best_one_runs_only_if_it_too_is_cheaper_than_ar():
    """The model's best length, priced off a stale check, beats ar; the length kept in its place
    (one whose check is fresh) costs more than ar. That one must not run: ar runs, and the best
    length runs one cycle at a time to time its check. (continue 2K, Zen 4: a first answer ran a
    stand-in priced 12.4-13.4 ms/token beside ar's 10.3-10.5 for 11 cycles; on the old code here
    γ1 = 1 at 37.9 ms/token ran 8 of 12 cycles beside ar's 30.)"""
    p = _stand_in_policy()
    ar_price = p.seconds_per_token(Structure(Mode.AR))
    assert p.seconds_per_token(Structure(Mode.DRAFT_ONLY, 1, AUTO.gamma2)) < 0.9 * ar_price  # (at the stale price)
    ran, probes = [], 0
    for _ in range(24):
        s = p.choose(AUTO, has_l0=True, context_tokens=1024)
        if s.mode is not Mode.AR:
            assert not p.costs.fresh("l2", check_size(s)), [x.label for x in ran + [s]]  # a re-time, or nothing
            probes += 1
        size = check_size(s)
        p.costs.record("l2", size, _quiet(size))
        p.realized(s, _quiet(size), 1, checked=size, forwards=[("l2", size)])
        ran.append(s)
    assert 1 <= probes <= 6 and sum(s.mode is Mode.AR for s in ran) >= 18, [s.label for s in ran]
