"""When `auto` runs what: the cheapest priced structure, a switch only for a clear gain, each
unmeasured structure explored once, and a stale price re-timed on a schedule that backs off."""
from __future__ import annotations

from engine.settings import Mode

PROBE_CYCLES = 2  # an exploration or a refresh runs 2 cycles: one is a single noisy sample
SWITCH_MARGIN = 0.95  # leave the running mode only for one predicted >= 5 % cheaper: a shared host's noise
REFRESH_EVERY = 16  # a mode not run for 16 cycles is re-timed (at first): 2 of 16 cycles at most


class Schedule:
    """Picks the mode of each verification cycle from the modes' prices (seconds per token; None:
    not yet priceable). Owns exploration (a mode never run runs PROBE_CYCLES cycles, once), refresh
    (a mode not run for its wait runs PROBE_CYCLES cycles, the least recently run first; its wait
    starts at REFRESH_EVERY, doubles after a refresh that loses and resets after one that wins or at a
    new turn) and the switch margin."""

    def __init__(self) -> None:
        self.cycle = 0
        self.incumbent: Mode | None = None  # what runs between probes
        self.last_run: dict[Mode, int] = {}
        self.wait: dict[Mode, int] = {}  # mode -> cycles without it before it is re-timed
        self.explorations = 0  # cycles spent exploring or refreshing (bounded: tests read it)
        self._probe: Mode | None = None
        self._probe_left = 0
        self._refreshing = False

    def next(self, prices: dict[Mode, float | None]) -> Mode:
        """The mode for the next cycle. `prices`: every mode auto may run (None: not priceable)."""
        self.cycle += 1
        if self._probe_left and self._probe in prices:
            return self._ran(self._probe, probe=True)
        if self._refreshing:
            self._judge(prices)
        unexplored = [m for m in prices if m not in self.last_run]
        if unexplored:  # exploration: each mode once, in the order given
            return self._start_probe(unexplored[0], refresh=False)
        priced = {m: p for m, p in prices.items() if p is not None}
        if not priced:
            return self._ran(next(iter(prices)))
        best = min(priced, key=priced.get)
        current = self.incumbent if self.incumbent in priced else None
        if current is None or (best is not current and priced[best] < SWITCH_MARGIN * priced[current]):
            self.incumbent = best
        due = [m for m in prices if m is not self.incumbent
               and self.cycle - self.last_run[m] > self.wait.setdefault(m, REFRESH_EVERY)]
        if due:
            return self._start_probe(min(due, key=self.last_run.get), refresh=True)
        return self._ran(self.incumbent)

    def new_turn(self) -> None:
        """A new prompt may change which structure wins: every wait starts over."""
        self.wait.clear()

    def _start_probe(self, mode: Mode, refresh: bool) -> Mode:
        self._probe, self._probe_left, self._refreshing = mode, PROBE_CYCLES, refresh
        return self._ran(mode, probe=True)

    def _judge(self, prices: dict[Mode, float | None]) -> None:
        """A refresh just ended: it wins if its mode is now predicted cheaper than the incumbent by the
        margin (then it runs and its wait resets), else it lost and its wait doubles."""
        self._refreshing = False
        mode = self._probe
        mine, theirs = prices.get(mode), prices.get(self.incumbent)
        if mine is not None and theirs is not None and mine < SWITCH_MARGIN * theirs:
            self.incumbent, self.wait[mode] = mode, REFRESH_EVERY
        else:
            self.wait[mode] = 2 * self.wait.get(mode, REFRESH_EVERY)

    def _ran(self, mode: Mode, probe: bool = False) -> Mode:
        if probe:
            self._probe_left -= 1
            self.explorations += 1
        self.last_run[mode] = self.cycle
        if self.incumbent is None and not probe:
            self.incumbent = mode
        return mode
