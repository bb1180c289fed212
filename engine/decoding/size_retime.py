"""Re-timing the L2 checks a structure's other draft lengths would run (a side of the `auto` policy,
engine/decoding/policy.py).

A draft length is priced by the step-cost table at the check size it makes L2 run. A size timed
once in a slow spell keeps that spell's ratio to the sizes that still run (measurements.StepCosts:
a stale size moves with the smallest one), and one never timed is read off the line between such
sizes; a length priced off them is never chosen, so never re-timed, and a slow first spell
could pin a session to a short length whose neighbours' checks were never timed quietly.

So every SIZE_RETIME cycles on a structure, one other draft length of its mode whose L2 check was
not timed in the level's last STALE forwards runs one cycle: the one that would beat the structure
by the most if its check cost what the fresh sizes put it at (StepCosts.fresh_estimate), if any
would. Each length then waits twice as long before its next re-time, and so does the next re-time
of any length unless this one won the next choice: where long checks really are dear (a staircase
the fresh sizes' line runs under), re-times come ever more seldom.

The runner-up's refresh (policy.py, every REFRESH_CYCLES cycles at first) backs off the same way:
a mode refreshed waits twice as long before its next refresh (`refresh_due`, `refreshed`) until it
wins a choice, and a refresh that loses the choice after it makes the next refresh of any mode
wait twice as long (`refresh_time`, `refresh_won`). Judged by the model alone, a mode may stay within
REFRESH_MARGIN of the best while really running far dearer, and a refresh that keeps losing must
cost ever less. While ar runs, a mode whose price
goes stale, priced within CLOSE_MARGIN of ar's, runs one cycle sooner, once CLOSE_EVERY cycles have
run without it (`close_contender`), then twice as seldom each time until it wins a choice: where it
loses, such a cycle costs at most a tenth of one.

Near the best draft length the model's predictions differ by a few per cent, as little as the
step-cost table's own noise, so a choice runs the length it is running unless the model's best is
LENGTH_GAIN cheaper, or else the settings' length under the same test (`kept_length`). Lengths
are weighed at fresh prices, so stale checks' drifting prices do not move the choice among them.
The running length comes before the settings': a draft rule (draft_rules) whose replayed price
varies from answer to answer keeps running rather than falling back at every close scoring."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from engine.decoding.structure import Structure
from engine.settings import DecodeSettings, Mode

REFRESH_CYCLES = 48  # after 48 cycles on one choice, the runner-up runs one cycle (ever more seldom while refreshes lose)
REFRESH_MAX = 768  # ... at least one in 768
SIZE_RETIME = 16  # on one structure, one cycle in 16 may re-time another draft length's L2 check ...
SIZE_RETIME_MAX = 512  # ... one in up to 512 once re-times keep losing
UNTIMED_SPACING = 4  # ... and the best length by a stale price at most once in 4 (each length ever more seldom)
LENGTH_GAIN = 0.96  # the model's best draft length replaces the running one (or the settings') at <= 96 %
CLOSE_MARGIN = 1.1  # while ar runs, a mode whose price goes stale, priced within 1.1x of ar's, ...
CLOSE_EVERY = 16  # ... runs one cycle once 16 have run without it (ever more seldom while it keeps losing)


# draft-only rules auto weighs beside the single lengths: γ1 in RULE_SHORT, RULE_LONG right after a
# cycle that kept its whole draft (copying text makes the long draft pay; elsewhere a single
# length wins, and the replay prices both)
RULE_SHORT = range(1, 6)
RULE_LONG = (6, 8)
# a rule's long checks come only after a draft kept whole, so they are seldom all fresh and the
# rule, cheapest, would seldom run. Stale, they may still weigh where they are at most this share of
# the rule's replayed seconds, so a stale price's error moves the rule's price only a little
RULE_STALE_SHARE = 0.25


def draft_rules(s: Structure) -> list[Structure]:
    """The draft-only rules (γ1 then a longer draft after one kept whole), `s`'s γ2 kept."""
    return [Structure(s.mode, short, s.gamma2, long) for short in RULE_SHORT for long in RULE_LONG]


def due(waits: dict, key, now: int) -> bool:
    """Has `key`'s wait in `waits` (key -> (cycle it may come next, its wait)) run out by cycle `now`?"""
    return now >= waits.get(key, (0, 0))[0]


def wait_twice(waits: dict, key, now: int, first: int) -> None:
    """`key` came at cycle `now`: its next may come after twice its last wait (at first 2 x `first`)."""
    _, wait = waits.get(key, (0, first))
    waits[key] = (now + 2 * wait, 2 * wait)


def check_size(s: Structure) -> int:
    """The most tokens one L2 check of `s` verifies (its draft and the bonus token)."""
    return 1 if s.mode is Mode.AR else (s.longest_draft if s.mode is Mode.DRAFT_ONLY else s.gamma2) + 1


@dataclass
class SizeRetimeState:
    since: int = 0  # cycles since the last re-time
    every: int = SIZE_RETIME  # cycles between re-times now
    probed: Structure | None = None  # the last re-time, until a choice has weighed it
    next_at: dict = field(default_factory=dict)  # (mode, check size) -> (cycle it may re-time next, its wait)
    refresh_at: dict = field(default_factory=dict)  # mode -> (cycle it may be refreshed next, its wait)
    refresh_every: int = REFRESH_CYCLES  # cycles between refreshes of any mode now
    refreshing: Mode | None = None  # the mode last refreshed, until a choice has weighed it
    close_at: dict = field(default_factory=dict)  # mode -> (cycle it may be refreshed as close next, its wait)
    untimed_best: Structure | None = None  # the model's best length, kept from running on a stale check's price


class SizeRetimes:
    """Methods of Policy (its base class). They read its costs, lookups, _cycles and _sizes (a
    SizeRetimeState), call its scoring (seconds_per_token, _within_measured, _lengths, _c, _l2_row, _memo), and
    kept_length rewrites its candidates' entry for the length it keeps."""

    def refresh_time(self) -> bool:
        """Have refresh_every cycles run since the last refresh (of any mode)?"""
        return self._since_refresh >= self._sizes.refresh_every

    def refresh_due(self, mode: Mode) -> bool:
        """May `mode` be the runner-up refreshed now (never refreshed, or its wait is over)?"""
        return due(self._sizes.refresh_at, mode, self._cycles)

    def refreshed(self, mode: Mode) -> None:
        """`mode` is refreshed now: its next refresh waits twice as long as the last (at first
        2 x REFRESH_CYCLES), unless it wins a choice first (`refresh_won`)."""
        wait_twice(self._sizes.refresh_at, mode, self._cycles, REFRESH_CYCLES)
        self._sizes.refreshing = mode

    def refresh_won(self, mode: Mode) -> None:
        """`mode` is the choice: its refreshes start over at the shortest wait, and so do those of
        every mode if it is the one just refreshed; if another mode was, the next refresh of any
        mode waits twice as long (each mode's own wait alone would let every losing mode in, one
        after another, each refresh costing its answer)."""
        state = self._sizes
        state.refresh_at.pop(mode, None)
        state.close_at.pop(mode, None)
        if state.refreshing is not None:
            won = state.refreshing is mode
            state.refresh_every = REFRESH_CYCLES if won else min(REFRESH_MAX, 2 * state.refresh_every)
            state.refreshing = None

    def runner_up(self, others: list[Structure], within: float) -> Structure | None:
        """The structure to refresh among `others` (the best of each mode that may be refreshed now),
        or None. Judged by the model alone (a mode once measured badly must get its
        chance; triforce's price still read for the window's text, policy_inputs._stretch, since
        its own stretches run easier than the window's), within `within` seconds per token; a
        structure whose price goes stale before one
        whose price keeps current whatever runs: ar (re-timed every AR_RETIME cycles) and draft-only
        priced by its replayed lookups (logged at every position, its checks on ar's table) come
        last. (Else, on ar after L1's price rose in a slow spell, a refresh would go to draft-only,
        whose price is already current, and the stale L1 structure would wait another round.)"""
        priced = [(self.seconds_per_token(s, corrected=False), s) for s in others]
        priced = [(ms, s) for ms, s in priced if ms is not None and ms <= within]
        if not priced:
            return None
        return min(priced, key=lambda x: (self._keeps_current(x[1].mode), x[0]))[1]

    def close_contender(self, scored: list[tuple[float, Structure]], running: Structure | None,
                        l1_ok: bool) -> Structure | None:
        """While ar is the `running` structure: one to run for one cycle because its price, which
        goes stale while it does not run, is within CLOSE_MARGIN of ar's (`scored`: each mode's
        best, priced as the choice weighs them), and CLOSE_EVERY cycles have run since it last ran
        and since the last refresh; None if none is. Such a cycle costs at most CLOSE_MARGIN - 1 of
        one cycle where it loses (and the next such cycle of that mode waits twice as long until it
        wins a choice), while a price read high over a few cycles, never run again, keeps auto on
        ar: short of the MEASURED_GAIN that leaving ar asks, and the refresh, backing off, may not
        come for answers. (Between speculative modes, which need only SWITCH_GAIN to switch, it is
        left out: there it only adds switches.)"""
        if running is None or running.mode is not Mode.AR or self._since_refresh < CLOSE_EVERY:
            return None
        now = next((ms for ms, s in scored if s.mode is Mode.AR), None)
        if now is None:
            return None
        ratios, state = self.ratios, self._sizes
        close = [(ms, s) for ms, s in scored
                 if not self._keeps_current(s.mode) and ms <= CLOSE_MARGIN * now  # (ar keeps current)
                 and (l1_ok or not s.mode.uses_l1) and s.mode in ratios.modes
                 and ratios.count - ratios.modes[s.mode].last_cycle >= CLOSE_EVERY
                 and due(state.close_at, s.mode, self._cycles)]
        if not close:
            return None
        chosen = min(close, key=lambda x: x[0])[1]
        wait_twice(state.close_at, chosen.mode, self._cycles, CLOSE_EVERY // 2)
        return chosen

    def _keeps_current(self, mode: Mode) -> bool:
        """Does `mode`'s price stay current while another mode runs (see runner_up)?"""
        return mode is Mode.AR or (mode is Mode.DRAFT_ONLY and self.lookups.ready())

    def kept_length(self, best: Structure, incumbent: Structure | None, settings: DecodeSettings) -> Structure:
        """The gammas to run `best`'s mode at: `incumbent`'s where it runs that mode and the model's
        `best` is not LENGTH_GAIN cheaper than it (and its check is within GROW of those timed), else
        the settings' draft length under the same test, else `best`'s. Lengths are weighed
        at fresh prices: where `best`'s check was not timed in L2's last STALE forwards, the best
        length whose check was stands in for it, and `best`, if LENGTH_GAIN cheaper than that one,
        runs one cycle first to time its check (size_probe)."""
        self._sizes.untimed_best = None
        new = self.seconds_per_token(best) if best.mode is not Mode.AR else None
        if new is None:
            return best
        l2 = self.costs.largest("l2")
        l1 = self.costs.largest("l1") or l2
        if not self._checks_fresh(best):
            timed = [(self.seconds_per_token(s), s) for s in self._lengths(best)
                     if self._checks_fresh(s) and self._within_measured(s, l2, l1)]
            timed = [(ms, s) for ms, s in timed if ms is not None]
            if timed:
                price, stand_in = min(timed, key=lambda x: x[0])
                if new <= LENGTH_GAIN * price:
                    self._sizes.untimed_best = best
                best, new = self._shown_as(best, new, stand_in, price), price
        named = (Structure(best.mode, settings.gamma1, best.gamma2) if best.mode is Mode.DRAFT_ONLY
                 else Structure(best.mode, best.gamma1, settings.gamma2))
        for s in (incumbent, named):
            if s is None or s.mode is not best.mode or not self._within_measured(s, l2, l1):
                continue
            if s == best:  # what runs is the best (no length cheaper at a stale price): it stays
                if self._sizes.untimed_best is None:
                    return best
                continue
            price = self.seconds_per_token(s)
            if price is not None and new > LENGTH_GAIN * price:
                return self._shown_as(best, new, s, price)
        return best

    def _checks_fresh(self, s: Structure) -> bool:
        """Were the L2 checks `s` runs timed in L2's last STALE forwards? A rule's short check must
        be; its long ones, which come only after a draft kept whole, may be stale where they are at
        most RULE_STALE_SHARE of its replayed seconds (so `s` prices within about that share of
        their error)."""
        if not s.after_full:
            return self.costs.fresh("l2", check_size(s))
        return self.costs.fresh("l2", s.gamma1 + 1) and self._long_checks_weigh(s)

    def _long_checks_weigh(self, s: Structure) -> bool:
        """May rule `s`'s long checks weigh in its price: its longest fresh, or its stale ones at most
        RULE_STALE_SHARE of its replayed seconds?"""
        return self.costs.fresh("l2", check_size(s)) or self._stale_share(s) <= RULE_STALE_SHARE

    def _stale_share(self, s: Structure) -> float:
        """The share of rule `s`'s replayed L2 seconds spent in checks longer than its short one that
        were not timed in L2's last STALE forwards (1.0 before a replay); memoized per choice."""
        key = ("stale_share", s.gamma1, s.after_full)
        if key not in self._memo:  # (kept_length weighs each rule, _stale_part the one set aside)
            row = self._l2_row()
            seconds = {n: count * (row[n] or 0.0)
                       for n, count in self.lookups.replay_checks(s.gamma1, s.after_full).items()}
            total = sum(seconds.values())
            stale = sum(t for n, t in seconds.items() if n > s.gamma1 + 1 and not self.costs.fresh("l2", n))
            self._memo[key] = stale / total if total > 0 else 1.0
        return self._memo[key]

    def _shown_as(self, best: Structure, new: float, s: Structure, price: float) -> Structure:
        """`s` (at `price` s/token) runs in `best`'s place (at `new`): the weighed list (--stats, the
        Live panel, the bench) shows what runs, at its own price."""
        self.candidates = tuple(replace(c, structure=s.label, ms_per_token=c.ms_per_token + 1000.0 * (
            price - new)) if c.structure == best.label else c for c in self.candidates)
        return s

    def size_probe(self, incumbent: Structure) -> Structure | None:
        """Another draft length of `incumbent`'s mode (the choice, staying on its mode) to run for one
        cycle, or None (not yet time, or no length with a stale check would beat `incumbent` were
        its check as the fresh sizes say)."""
        state = self._sizes
        if state.probed is not None and incumbent.mode is state.probed.mode:
            won = check_size(incumbent) == check_size(state.probed)  # (the choice after the re-time)
            state.every = SIZE_RETIME if won else min(SIZE_RETIME_MAX, 2 * state.every)
            state.probed = None
        if state.untimed_best is not None and state.untimed_best.mode is incumbent.mode:
            waiting = self.untimed_probe(True)  # the best length by a stale price: its check timed first
            if waiting is not None:
                return waiting
        if state.since < state.every or incumbent.mode is Mode.AR:
            return None
        now = self.seconds_per_token(incumbent)
        if now is None:
            return None
        l2 = self.costs.largest("l2")
        l1 = self.costs.largest("l1") or l2
        best: tuple[float, Structure] | None = None
        for s in self._lengths(incumbent):
            size = check_size(s)
            if (s.after_full or size == check_size(incumbent) or self.costs.fresh("l2", size)
                    or not due(state.next_at, (s.mode, size), self._cycles)
                    or not self._within_measured(s, l2, l1)):
                continue
            ms, table, fresh = self.seconds_per_token(s), self._c("l2", size), self.costs.fresh_estimate("l2", size)
            if ms is None or not table or fresh is None or fresh >= table:
                continue
            hoped = ms * fresh / table  # (its whole price scaled as its check: hopeful where L1 runs too)
            if hoped < now and (best is None or hoped < best[0]):
                best = (hoped, s)
        return None if best is None else self._retime(best[1])

    def untimed_probe(self, l1_ok: bool) -> Structure | None:
        """The model's best length, which kept_length set aside for a fresh length because its check
        is stale, to run for one cycle that times that check (at most once in UNTIMED_SPACING
        cycles, each check size ever more seldom; an L1 one only where `l1_ok`), or None."""
        state = self._sizes
        waiting = state.untimed_best and self._stale_part(state.untimed_best)
        if (waiting is None or state.since < UNTIMED_SPACING or (waiting.mode.uses_l1 and not l1_ok)
                or not due(state.next_at, (waiting.mode, check_size(waiting)), self._cycles)):
            return None
        return self._retime(waiting)

    def _stale_part(self, s: Structure) -> Structure:
        """What times `s`'s stale check in one cycle: `s`, or for a rule (whose long draft may not
        come in that cycle) its longer length if its long checks keep it from weighing (stale, and
        over RULE_STALE_SHARE of its time), else its shorter one."""
        if not s.after_full:
            return s
        return Structure(s.mode, s.gamma1 if self._long_checks_weigh(s) else s.longest_draft, s.gamma2)

    def _retime(self, s: Structure) -> Structure:
        """Run `s` (a single length: a rule's goes through _stale_part first) for one cycle to time
        its check; its check size waits twice as long for the next."""
        state = self._sizes
        wait_twice(state.next_at, (s.mode, check_size(s)), self._cycles, SIZE_RETIME // 2)
        state.since, state.probed, state.untimed_best = 0, s, None
        return s
