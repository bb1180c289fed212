"""When `auto` runs what: the cheapest priced structure, a switch only for a clear gain, each
unmeasured structure explored once, and a stale price re-timed on a schedule that backs off."""
from __future__ import annotations

from engine.settings import Mode

PROBE_CYCLES = 2  # an exploration or a refresh runs 2 cycles: one is a single noisy sample
SWITCH_MARGIN = 0.95  # leave the running mode only for one predicted >= 5 % cheaper: a shared host's noise
REFRESH_EVERY = 16  # at most one refresh in 16 cycles (2 of 18), each mode's ever more rarely


class Schedule:
    """Picks the mode of each verification cycle from the modes' prices (seconds per token; None:
    not yet priceable). Owns exploration (a mode never run runs PROBE_CYCLES cycles, once, unless the
    model already prices it above the cheapest measured mode; until then it is priced from priors on
    every cycle), refresh (at most every REFRESH_EVERY cycles, the least recently run mode that is due
    runs PROBE_CYCLES cycles; a mode is due once it has not run for its own wait times r, r being its
    price over the running mode's (its probe costs r times as much); each mode's wait starts at
    REFRESH_EVERY, doubles after its refresh loses and starts over after one that wins) and the switch
    margin."""

    def __init__(self) -> None:
        self.cycle = 0
        self.incumbent: Mode | None = None  # what runs between probes
        self.last_run: dict[Mode, int] = {}
        self.waits: dict[Mode, int] = {}  # each mode's refresh wait (REFRESH_EVERY until its first refresh)
        self.since_refresh = 0
        self.explorations = 0  # cycles spent exploring or refreshing (bounded: tests read it)
        self._probe: Mode | None = None
        self._probe_left = 0
        self._refreshing = False

    def next(self, prices: dict[Mode, float | None], floors: dict[Mode, float | None] | None = None) -> Mode:
        """The mode for the next cycle. `prices`: every mode auto may run (None: not priceable);
        `floors`: the least each could cost (default: its price); a mode never run is explored,
        cheapest first, unless its floor is above the cheapest measured price."""
        self.cycle += 1
        if self._probe_left and self._probe in prices:
            return self._ran(self._probe, probe=True)
        if self._refreshing:
            self._judge(prices)
        priced = {m: p for m, p in prices.items() if p is not None}
        measured = [p for m, p in priced.items() if m in self.last_run]
        floors = floors or prices
        unexplored = [m for m, p in prices.items() if m not in self.last_run and (
            p is None or floors[m] is None or not measured or floors[m] < min(measured))]
        if unexplored:  # the unpriceable first, in the order given, then the one priced cheapest
            return self._start_probe(min(unexplored, key=lambda m: (prices[m] is not None, prices[m] or 0.0)),
                                     refresh=False)
        if not priced:
            return self._ran(next(iter(prices)))
        best = min(priced, key=priced.get)
        current = self.incumbent if self.incumbent in priced else None
        if current is None or (best is not current and priced[best] < SWITCH_MARGIN * priced[current]):
            self.incumbent = best
        self.since_refresh += 1
        if self.since_refresh >= REFRESH_EVERY:  # a mode priced r times the running one waits r times as long
            own = priced[self.incumbent]
            due = [m for m, p in prices.items() if m is not self.incumbent and m in self.last_run
                   and self.cycle - self.last_run[m] >= self.waits.get(m, REFRESH_EVERY) * max(1.0, (p or own) / own)]
            if due:
                return self._start_probe(min(due, key=lambda m: self.last_run.get(m, 0)), refresh=True)
        return self._ran(self.incumbent)

    def _start_probe(self, mode: Mode, refresh: bool) -> Mode:
        self._probe, self._probe_left, self._refreshing = mode, PROBE_CYCLES, refresh
        self.since_refresh = 0
        return self._ran(mode, probe=True)

    def _judge(self, prices: dict[Mode, float | None]) -> None:
        """A refresh just ended: it wins if its mode is now priced under the incumbent by the margin
        (then it runs and its wait starts over), else it lost and its wait doubles."""
        self._refreshing = False
        mine, theirs = prices.get(self._probe), prices.get(self.incumbent)
        if mine is not None and theirs is not None and mine < SWITCH_MARGIN * theirs:
            self.incumbent, self.waits[self._probe] = self._probe, REFRESH_EVERY
        else:
            self.waits[self._probe] = 2 * self.waits.get(self._probe, REFRESH_EVERY)

    def _ran(self, mode: Mode, probe: bool = False) -> Mode:
        if probe:
            self._probe_left -= 1
            self.explorations += 1
        self.last_run[mode] = self.cycle
        if self.incumbent is None and not probe:
            self.incumbent = mode
        return mode
