"""What the `auto` policy measures: seconds per forward at each level by tokens checked
(`StepCosts`), and per-token acceptance at each boundary with old cycles forgotten (`Acceptance`)."""
from __future__ import annotations

from dataclasses import dataclass, field

FORGET = 0.95  # per-cycle decay of the policy's wall-time sums
# per-observation decay of the acceptance counts: ~50 cycles, two or three answers. With 0.95 (~20)
# the few rejections at an answer's start (L1's cache and vocabulary not yet fitted to it) read as a
# shift, and auto would leave an L1 structure for ar on a start-of-answer dip
ACCEPTANCE_FORGET = 0.98
DEPTHS = 16  # draft depths whose acceptance is kept apart (the longest draft auto runs: 16)
DEPTH_PRIOR = 2.0  # a depth's acceptance counts 2 more checks at the depth above's
PRIOR_SLOPE = 0.15  # cost of each extra checked token, as a share of a 1-token forward (CPU: 0.1-0.2)
PRIOR_HIT = 0.5  # share of L0 proposals that are not empty (n-gram lookups often find nothing)
SLOWER_WEIGHT = 0.1  # weight of a forward slower than its estimate (faster ones: 0.5) ...
SLOW_CLIP = 1.5  # ... counted as at most 1.5x the estimate
STALE = 8  # a size not timed in the level's last 8 forwards moves with the level's smallest size


class StepCosts:
    """Seconds per forward at each level ("l0": one whole proposal, "l1", "l2"), per tokens checked,
    as moving averages; `estimate` interpolates between measured sizes and extrapolates a little.

    A size not timed for STALE forwards at its level is read relative to the level's smallest size
    (its ratio to that size when it was timed, times that size's cost now): the machine's speed moves
    every size alike, and the sizes that keep running track it. (Else a size timed once in a slow
    spell keeps its slow price while its neighbours fall, and prices its draft length out.)"""

    def __init__(self) -> None:
        self.table: dict[str, dict[int, float]] = {"l0": {}, "l1": {}, "l2": {}}  # as last timed
        self._lines: dict[str, tuple[list[tuple[int, float]], float]] = {}  # level -> (points, slope), cached
        self._timed: dict[str, dict[int, tuple[int, int, float]]] = {"l0": {}, "l1": {}, "l2": {}}
        # level -> size -> (the level's forward count when this size was timed, the smallest size
        # then, its cost then)
        self._count = {"l0": 0, "l1": 0, "l2": 0}

    def _stale(self, level: str, tokens: int) -> bool:
        """Was timed size `tokens` left untimed for the level's last STALE forwards?"""
        return self._count[level] - self._timed[level][tokens][0] >= STALE

    def _now(self, level: str, tokens: int) -> float:
        """The cost of a timed size as of now: as timed, or moved with the level's smallest size."""
        row, (_, ref, ref_then) = self.table[level], self._timed[level][tokens]
        if not self._stale(level, tokens) or ref == tokens or ref not in row:
            return row[tokens]
        return row[tokens] * self._now(level, ref) / max(ref_then, 1e-9)

    def record(self, level: str, tokens: int, seconds: float) -> None:
        """Noise on a shared machine only ever adds time, so a faster sample is believed at once (half
        of the way, or whole for a size not timed for STALE forwards) and a slower one only moves the
        estimate a little (a burst of load must not price a structure out for good: it may not run
        again to correct it)."""
        row = self.table[level]
        old = self._now(level, tokens) if tokens in row else None
        stale = old is not None and self._stale(level, tokens)
        if old is None:  # a new size: capped by what the sizes timed so far predict for it (a first
            # sample taken in a spike priced draft-only out for good), the fresh ones where two are:
            # stale ones read low made the cap a third under a quiet check's cost, believed for many cycles
            prior = self.fresh_estimate(level, tokens) or self.estimate(level, tokens)
            row[tokens] = seconds if prior is None else min(seconds, SLOW_CLIP * prior)
        elif seconds < old or (stale and seconds <= row[tokens]):  # believed whole where the size sat
            # stale: it runs seldom, so a slow first timing would hold for long; and up to its last
            # timing, since its price then was inferred (moved with the smallest size, it can read
            # far below its cost, and slower timings moving it 10 % each would take many cycles)
            row[tokens] = seconds if stale else 0.5 * old + 0.5 * seconds
        else:  # one spike (a forward at several times its cost) moves it by 5 % at most
            row[tokens] = old + SLOWER_WEIGHT * (min(seconds, SLOW_CLIP * old) - old)
        self._count[level] += 1
        ref = min(row)
        self._timed[level][tokens] = (self._count[level], ref, row[tokens] if ref == tokens else self._now(level, ref))
        self._lines.pop(level, None)

    def scale(self, level: str, factor: float) -> None:
        """Every timing at `level` times `factor` (the level's forward changed size by a known share)."""
        self.table[level] = {n: t * factor for n, t in self.table[level].items()}
        self._timed[level] = {n: (at, ref, cost * factor) for n, (at, ref, cost) in self._timed[level].items()}
        self._lines.pop(level, None)

    def fresh(self, level: str, tokens: int) -> bool:
        """Was size `tokens` timed at `level` within the level's last STALE forwards?"""
        return tokens in self._timed[level] and not self._stale(level, tokens)

    def until_stale(self, level: str) -> list[int]:
        """For each size timed at `level`: how many more of the level's forwards leave it fresh
        (0 or less: stale already)."""
        count = self._count[level]
        return [STALE - (count - at) for at, _, _ in self._timed[level].values()]

    def fresh_estimate(self, level: str, tokens: int) -> float | None:
        """Seconds for a forward of `tokens` tokens as the sizes timed in the level's last STALE
        forwards alone put it (read as `estimate` reads every size), or None (fewer than two fresh
        sizes, or `tokens` under them all)."""
        row = self.table[level]
        fresh = {n: t for n, t in row.items() if self.fresh(level, n)}
        if len(fresh) < 2 or tokens < min(fresh):
            return None
        return self._on_line(*self._fit(fresh), tokens)

    def measured(self, level: str) -> bool:
        return bool(self.table[level])

    def largest(self, level: str) -> int:
        """The most tokens one timed forward at `level` has checked (0: never timed)."""
        return max(self.table[level], default=0)

    def estimate(self, level: str, tokens: int) -> float | None:
        """Seconds for a forward checking `tokens` tokens, or None if this level was never timed.
        Between two measured sizes: the straight line through them (on a CPU the cost is a
        staircase: the int4 kernel works in blocks of 4 rows, so one line through every point
        priced a 4-token check like a 5-token one). Above them: the slope from the smallest to the
        largest measured size, or with one point the prior slope; the policy only extrapolates a
        little (GROW). Below them: scaled from the smallest as L2's forwards scale (`_shrink`)."""
        row = self.table[level]
        if not row:
            return None
        if tokens in row:
            return self._now(level, tokens)
        line = self._lines.get(level)
        if line is None:
            self._lines[level] = line = self._fit({n: self._now(level, n) for n in row})
        points, slope = line
        n0, t0 = points[0]
        if tokens < n0:  # under the smallest timed size
            return t0 * self._shrink(level, tokens, n0)
        return self._on_line(points, slope, tokens)

    @staticmethod
    def _on_line(points: list[tuple[int, float]], slope: float, tokens: int) -> float:
        """`tokens` read off sorted `points` (size, seconds), none of them smaller: the line through
        the nearest two around it, or above them all the last plus `slope` per token."""
        below = [p for p in points if p[0] <= tokens]
        above = [p for p in points if p[0] > tokens]
        (n0, t0) = below[-1]
        if above and n0 != tokens:
            (n1, t1) = above[0]
            return t0 + (t1 - t0) * (tokens - n0) / (n1 - n0)
        return max(1e-6, t0 + slope * (tokens - n0))

    def _shrink(self, level: str, tokens: int, timed: int) -> float:
        """A forward of `tokens` tokens over one of `timed` (more), at `level`: as at L2 where L2 has
        timed down to `tokens` (the same weights checking the same tokens), else as the prior slope
        says. Not the line through the level's sizes: from two long sizes that line can price a
        1-token forward near 0 ms, and a structure priced so would be explored at far below its
        cost."""
        l2 = self.table["l2"]
        if level != "l2" and l2 and min(l2) <= tokens:
            small, large = self.estimate("l2", tokens), self.estimate("l2", timed)
            if small and large:
                return min(1.0, small / large)
        return (1.0 + PRIOR_SLOPE * (tokens - 1)) / (1.0 + PRIOR_SLOPE * (timed - 1))

    @staticmethod
    def _fit(row: dict[int, float]) -> tuple[list[tuple[int, float]], float]:
        """The measured points in size order and the slope to extrapolate with (never negative)."""
        points = sorted(row.items())
        if len(points) == 1:
            n0, t0 = points[0]
            return points, PRIOR_SLOPE * t0 / (1.0 + PRIOR_SLOPE * (n0 - 1))
        (n0, t0), (n1, t1) = points[0], points[-1]
        return points, max(0.0, (t1 - t0) / (n1 - n0))


@dataclass
class Acceptance:
    """Per-token acceptance at one boundary, accepted / checked, with old cycles forgotten; and the
    same per depth in the draft (`expected`), since acceptance is not i.i.d.: one rate overprices
    long drafts, whose deep tokens are accepted less often than the first."""

    prior: float
    accepted: float = 0.0
    tested: float = 0.0
    proposals: float = 0.0
    nonempty: float = 0.0
    # per depth d = 1..DEPTHS: drafts that reached token d (it was checked) and that had it accepted
    reached: list[float] = field(default_factory=lambda: [0.0] * DEPTHS)
    passed: list[float] = field(default_factory=lambda: [0.0] * DEPTHS)

    def add(self, proposed: int, accepted: int) -> None:
        f = ACCEPTANCE_FORGET
        self.accepted = f * self.accepted + accepted
        self.tested = f * self.tested + (accepted + (1 if accepted < proposed else 0) if proposed else 0)
        self.proposals = f * self.proposals + 1
        self.nonempty = f * self.nonempty + (1 if proposed else 0)
        checked = min(proposed, accepted + 1, DEPTHS)  # tokens 1..checked were looked at ...
        held = min(accepted, checked)  # ... and 1..held accepted
        for d in range(DEPTHS):
            self.reached[d] = f * self.reached[d] + (d < checked)
            self.passed[d] = f * self.passed[d] + (d < held)

    def expected(self, gamma: int, scale: float = 1.0) -> float:
        """Tokens one verification of `gamma` drafted tokens yields (accepted + correction/bonus):
        1 + sum over k of the chance that tokens 1..k all pass, each depth's acceptance read from
        the drafts that reached it, with DEPTH_PRIOR checks more at the depth above's (the first:
        at `rate`), times `scale` (misses not counted here). No data: the i.i.d. model. (A depth no
        draft reached priced at `rate` promised a 6-token draft 4.2 tokens where its third token
        failed in every draft, and the drafts held 2.)"""
        return self.expected_upto(gamma, scale)[gamma]

    def expected_upto(self, gamma: int, scale: float = 1.0) -> list[float]:
        """`expected(g, scale)` for every g = 0..`gamma`, in one pass (auto prices 12 draft lengths
        at a boundary per choice)."""
        rate_d, total, alive = self.rate, 1.0, 1.0
        totals = [total]
        for d in range(gamma):
            if d < DEPTHS:
                rate_d = (self.passed[d] + DEPTH_PRIOR * rate_d) / (self.reached[d] + DEPTH_PRIOR)
            alive *= rate_d * scale  # (past DEPTHS: the deepest depth's rate)
            total += alive
            totals.append(total)
        return totals

    @property
    def known(self) -> bool:
        return self.tested >= 4

    @property
    def rate(self) -> float:
        # a few prior pseudo-checks keep one lucky cycle from reading as certainty
        return (self.accepted + 2 * self.prior) / (self.tested + 2)

    @property
    def hit(self) -> float:
        """Share of proposals that offered at least one token."""
        return (self.nonempty + PRIOR_HIT) / (self.proposals + 1)


NOVEL_FORGET = 0.98  # per token: the share of new tokens over about the last 50


@dataclass
class Novelty:
    """The share of emitted tokens that were new to L1's vocabulary subset (engine/model/draft_vocab.py)
    when they came, old tokens forgotten: L1 cannot propose such a token, so each is a rejection
    its acceptance (counted without these misses) does not show. In a session the share falls as
    the subset learns the answers' words (a repeated question brings none). 0 until measured (no
    subset: no such misses)."""

    novel: float = 0.0
    seen: float = 0.0

    def add(self, novel: int, emitted: int) -> None:
        f = NOVEL_FORGET ** emitted
        self.novel = f * self.novel + novel
        self.seen = f * self.seen + emitted

    @property
    def rate(self) -> float:
        return self.novel / self.seen if self.seen > 0 else 0.0
