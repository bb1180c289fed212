"""How far `auto`'s verification cycles run from its cost model, in two parts kept apart.

- Time: a cycle's wall time against the seconds the model gives its forwards (drafting, rollback,
  retrieval rebuilds and Python show here). Kept per mode, and per structure (how far the model
  misses grows with the draft lengths, so a ratio learned at short drafts must not flatter long
  ones). Filtered as ar's
  ratio is (`settle`): noise on a shared machine only adds time, so a faster cycle is believed mostly
  at once and a slower one a little, a cycle after the key sat idle standing for the cycles it
  missed (`IDLE_CAP` at most: see `settle`). (Kept as decayed means, the speculative modes would
  read their average cycle, noise included, while ar reads near its quiet cost, which favours ar.)
- Work: the forwards a cycle ran (each priced by the model at its size) against the forwards the
  model expected it to run. triforce's L1 runs forwards until its draft has γ2 tokens, and the last
  may accept past them, so its cycles run more forwards than modelled. Inside the time ratio, that
  steady share would be filtered as noise, believed low like a fast cycle, and underprice the
  structure. So the time ratio is a cycle's wall time against the forwards it ran,
  noise and overhead alone, and the work ratio is kept as decayed sums, per mode and per structure,
  as the yield is.
- Yield: the tokens E(a, g) promised against the tokens the cycle yielded (acceptance that is not
  i.i.d.: n-gram drafts are accepted whole or not at all, hard passages bunch the rejections).
  Kept per boundary, pooled over the modes that check there (retrieval-only and triforce both
  yield through L1 -> L2), and refined per structure against a prior of YIELD_PRIOR_CYCLES cycles at the boundary's ratio.

Both were one ratio, wall time over the predicted seconds per token times the tokens yielded, per
mode. A cycle's yield swings far more than its time (checking 7 tokens at acceptance 0.95 yields 2
about one cycle in 20), so one unlucky cycle could set a mode's price for the session. Apart, a
cycle's time moves its mode's filter one step, and its yield joins every cycle at the same
boundary.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.decoding.measurements import FORGET
from engine.decoding.structure import Structure
from engine.settings import Mode

OUTLIER = 3.0  # a cycle over 3x its modelled time is a one-off, not the structure's cost
FASTER = 0.7  # a cycle's time ratio below the filtered one moves it 70% of the way at once ...
SLOWER = 0.1  # ... one above it 10%, counted as at most SLOW_CLIP times the filtered ratio
SLOW_CLIP = 1.25
IDLE_CAP = 8  # a sample after k idle cycles moves the filter as k samples would, k <= 8
RATIO_PRIOR_CYCLES = 2  # a mode's time ratio and a boundary's yield ratio count 2 more cycles at 1.0
YIELD_PRIOR_CYCLES = 6  # a structure's own yield counts as 6 more cycles at its boundary's ratio
BOUNDARY = {Mode.DRAFT_ONLY: "l0_l2", Mode.RETRIEVAL_ONLY: "l1_l2", Mode.TRIFORCE: "l1_l2"}  # where L2 checks


def clip(ratio: float) -> float:
    return max(0.5, min(OUTLIER, ratio))


def settle(old: float | None, ratio: float, idle: int = 1) -> float:
    """A time ratio filtered against noise that only adds time: the first is believed whole, a
    faster one FASTER of the way, a slower one SLOWER of the way to at most SLOW_CLIP x `old`.

    `idle`: the cycles since this filter last moved. A sample after k of them moves it as k samples
    would (k <= IDLE_CAP), since it stands for what that time was like: the filter of what kept
    running took every cycle of a slow spell in, one step each, while one idle re-time moved its own
    a single step, and the idle one would look cheap on a busy host. The clip stays a
    single sample's: one spike at a re-time counts as at most SLOW_CLIP x `old`."""
    ratio = clip(ratio)
    if old is None:
        return ratio
    steps = max(1, min(idle, IDLE_CAP))
    if ratio < old:
        return old + (1.0 - (1.0 - FASTER) ** steps) * (ratio - old)
    return old + (1.0 - (1.0 - SLOWER) ** steps) * (min(ratio, SLOW_CLIP * old) - old)


def toward_one(ratio: float, cycles: int) -> float:
    """`ratio`, read over `cycles` cycles, drawn toward 1 as if RATIO_PRIOR_CYCLES more read 1."""
    return 1.0 + (ratio - 1.0) * cycles / (cycles + RATIO_PRIOR_CYCLES)


def refined(num: float, den: float, prior: float, pooled: float) -> float:
    """A structure's own sums num / den, weighed against `prior` more of den at the `pooled` ratio."""
    return (num + prior * pooled) / (den + prior)


@dataclass
class CycleSums:
    """Over cycles: the wall/model time ratio filtered by `settle`, and decayed sums of promised
    and yielded tokens."""

    time: float | None = None
    modelled: float = 0.0  # decayed sums of the forwards' seconds the model expected ...
    ran: float = 0.0  # ... and of those the cycles ran (each forward priced by the model)
    expected: float = 0.0
    tokens: float = 0.0
    cycles: int = 0
    last_expected: float = 0.0  # the latest cycle's promised tokens
    last_cycle: int = 0  # Realized's cycle count at the latest cycle

    def add(self, wall: float, model: float, expected: float, tokens: int, idle: int = 1,
            ran: float | None = None) -> None:
        """One cycle, `idle` cycles (of any key) after this key's last one; `ran`: the model's
        seconds for the forwards it ran (None: those it expected, `model`)."""
        ran = model if ran is None or ran <= 0 else ran
        self.time = settle(self.time, wall / ran, idle)
        self.modelled, self.ran = FORGET * self.modelled + model, FORGET * self.ran + ran
        self.expected, self.tokens = FORGET * self.expected + expected, FORGET * self.tokens + tokens
        self.cycles += 1
        self.last_expected = expected


@dataclass
class Realized:
    """What the cycles of each mode, structure and boundary really took against the model."""

    modes: dict[Mode, CycleSums] = field(default_factory=dict)
    structures: dict[Structure, CycleSums] = field(default_factory=dict)
    boundaries: dict[str, CycleSums] = field(default_factory=dict)
    count: int = 0  # cycles added
    _pooled: dict = field(default_factory=dict, repr=False, compare=False)  # per mode or boundary, until the next add

    def add(self, s: Structure, wall: float, model: float, expected: float, tokens: int,
            ran: float | None = None) -> None:
        """A cycle of `s` took `wall` seconds where the model gave its forwards `model` seconds (and
        `ran` seconds to the forwards it really ran; None: the same), and yielded `tokens` where
        E(a, g) promised `expected`."""
        keyed = [(self.modes, s.mode), (self.structures, s)]
        if s.mode in BOUNDARY:
            keyed.append((self.boundaries, BOUNDARY[s.mode]))
        self.count += 1
        self._pooled.clear()
        for table, key in keyed:
            sums = table.setdefault(key, CycleSums())
            sums.add(wall, model, expected, tokens, self.count - sums.last_cycle, ran)  # (a first sample: whole)
            sums.last_cycle = self.count

    def cycles(self, mode: Mode) -> int:
        return self.modes[mode].cycles if mode in self.modes else 0

    def mode_time(self, mode: Mode) -> float:
        """The mode's filtered wall/model time ratio, drawn toward 1 while its cycles are few (a mode
        not yet run: the smallest ratio seen, optimistic, so that bounded exploration still tries it)."""
        key = ("time", mode)
        if key not in self._pooled:  # (scoring reads it for each of ~40 structures)
            sums = self.modes.get(mode)
            self._pooled[key] = (min((m.time for m in self.modes.values()), default=1.0) if sums is None
                                 else toward_one(sums.time, sums.cycles))
        return self._pooled[key]

    def ratio(self, s: Structure) -> float:
        """Predicted wall time per token of `s` over the model's: time x work x yield ratios."""
        return clip(self.time_ratio(s) * self.work_ratio(s) * self.yield_ratio(s))

    def work_ratio(self, s: Structure) -> float:
        """The forwards `s`'s cycles ran over those the model expected: its mode's, drawn toward 1
        while its cycles are few, refined by its own cycles (1 before any)."""
        key = ("work", s.mode)
        if key not in self._pooled:
            sums = self.modes.get(s.mode)
            self._pooled[key] = (None if sums is None or sums.modelled <= 0
                                 else toward_one(sums.ran / sums.modelled, sums.cycles))
        pooled = self._pooled[key]
        if pooled is None:
            return 1.0
        own = self.structures.get(s)
        if own is not None and own.modelled > 0:
            decayed = (1.0 - FORGET ** own.cycles) / (1.0 - FORGET)  # the cycles the sums hold, decayed
            prior = YIELD_PRIOR_CYCLES * own.modelled / decayed  # cycles' modelled seconds at the mode's ratio
            pooled = refined(own.ran, own.modelled, prior, pooled)
        return clip(pooled)

    def time_ratio(self, s: Structure) -> float:
        """`s`'s cycles' wall time over their modelled forwards: its own, weighed against one cycle
        at its mode's ratio."""
        own = self.structures.get(s)
        time = self.mode_time(s.mode)
        if own is not None:
            time = (own.cycles * own.time + time) / (own.cycles + 1)
        return time

    def yield_ratio(self, s: Structure) -> float:
        """The tokens E(a, g) promises over those `s`'s cycles yield: its boundary's, pooled over
        the modes checking there, refined by its own cycles (1 for ar, or before any cycle)."""
        key = ("yield", BOUNDARY.get(s.mode, ""))
        if key not in self._pooled:
            boundary = self.boundaries.get(key[1])
            # drawn toward 1 while the boundary's cycles are few, as the time
            self._pooled[key] = None if boundary is None else toward_one(
                clip(boundary.expected / boundary.tokens), boundary.cycles)
        pooled = self._pooled[key]
        if pooled is None:
            return 1.0
        own = self.structures.get(s)
        if own is not None and own.last_expected > 0:
            prior = YIELD_PRIOR_CYCLES * own.last_expected / pooled  # yielded tokens at the boundary's ratio
            pooled = clip(refined(own.expected, own.tokens, prior, pooled))
        return pooled
