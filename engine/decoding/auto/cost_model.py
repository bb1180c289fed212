"""What `auto` knows: seconds per forward at each level by tokens checked (`StepTimes`), acceptance
per boundary and draft depth (`Acceptance`), and the price of every structure built from them
(`CostModel`): expected seconds per generated token, corrected by what the structure's own cycles
really took."""
from __future__ import annotations

import dataclasses
import statistics
from collections import deque

from engine.decoding.structure import Structure
from engine.settings import MAX_DRAFT as DEPTHS  # draft depths kept apart: the longest draft
from engine.settings import Mode

TIMING_WINDOW = 3  # a forward size is priced at the (low) median of its last 3 timings: one spike moves nothing, two re-time it
PRIOR_SLOPE = 0.15  # an untimed extra checked token costs 15 % of a 1-token forward (CPU: 0.1-0.2, GPU: ~0)
PRIOR_DRAFTER = 0.6  # acceptance of L0 (an n-gram lookup or a small model) before it is measured: no basis to trust it
PRIOR_RETRIEVAL = 0.9  # acceptance of L1 at L2 before it is measured: L1 is the target itself on a subset of its K/V
PRIOR_WEIGHT = 2.0  # a draft depth's rate counts 2 pseudo-checks at the depth above's rate (depth 1: at the prior)
ACCEPTANCE_DECAY = 0.98  # per verification: acceptance remembers ~50 checks, two or three answers
REALIZED_DECAY = 0.95  # per cycle of a mode: its wall-time ratio remembers ~20 of its cycles
LENGTH_STEP = 2  # the model moves a draft length by at most 2 a cycle, as the rule does (a local search)
SPIKE_CLIP = 3.0  # a timing or a cycle counts at most 3x what was expected of it: a spike moves a price a little,
# while an overhead the forwards miss (a head slice, a cache sync) shows in a mode's first cycle


class StepTimes:
    """Seconds per forward at each level ("l0": one whole proposal of n tokens, "l1", "l2": a forward
    checking n tokens), each size the median of its last TIMING_WINDOW timings (the lower of two), each
    timing at most SPIKE_CLIP times what the table expected of it."""

    def __init__(self) -> None:
        self._samples: dict[str, dict[int, deque]] = {"l0": {}, "l1": {}, "l2": {}}
        self._rows: dict[str, dict[int, float]] = {}  # level -> size -> median, until the next record
        self._lines: dict[str, tuple[float, float, float]] = {}  # level -> (mean size, mean seconds, slope)

    def record(self, level: str, tokens: int, seconds: float) -> None:
        expected = self.estimate(level, tokens)
        if expected is not None:
            seconds = min(seconds, SPIKE_CLIP * expected)
        self._samples[level].setdefault(tokens, deque(maxlen=TIMING_WINDOW)).append(seconds)
        self._rows.pop(level, None)
        self._lines.pop(level, None)

    def measured(self, level: str) -> bool:
        return bool(self._samples[level])

    def estimate(self, level: str, tokens: int) -> float | None:
        """Seconds for a forward of `tokens` at `level`: its median if timed, else the least-squares
        line through the timed sizes (slope >= 0; one size: PRIOR_SLOPE), None if never timed."""
        row = self._rows.get(level)
        if row is None:
            row = self._rows[level] = {n: statistics.median_low(s) for n, s in self._samples[level].items()}
        if not row:
            return None
        if tokens in row:
            return row[tokens]
        if len(row) == 1:
            (n0, t0), = row.items()
            return t0 * (1 + PRIOR_SLOPE * (tokens - 1)) / (1 + PRIOR_SLOPE * (n0 - 1))
        line = self._lines.get(level)
        if line is None:
            mean_n, mean_t = statistics.fmean(row), statistics.fmean(row.values())
            spread = sum((n - mean_n) ** 2 for n in row)
            slope = max(0.0, sum((n - mean_n) * (t - mean_t) for n, t in row.items()) / spread)
            line = self._lines[level] = (mean_n, mean_t, slope)
        mean_n, mean_t, slope = line
        return max(min(row.values()) * 0.5, mean_t + slope * (tokens - mean_n))


class Acceptance:
    """Acceptance at one boundary by draft depth: a_d = P(the d-th drafted token is accepted | the
    ones before it were), from decayed counts; a depth with few checks leans on the depth above."""

    def __init__(self, prior: float, by_depth: bool = True) -> None:
        self.prior = prior  # the rate at depth 1 before any check (PRIOR_WEIGHT pseudo-checks)
        self.by_depth = by_depth  # False: one rate for every depth, from all the checks of every depth
        self.reached = [0.0] * DEPTHS
        self.accepted = [0.0] * DEPTHS
        self._expected: list[float] | None = None  # tokens yielded per draft length 0..DEPTHS, until the next add

    def add(self, proposed: int, accepted: int) -> None:
        if proposed <= 0:
            return
        self._expected = None
        for d in range(DEPTHS):
            self.reached[d] *= ACCEPTANCE_DECAY
            self.accepted[d] *= ACCEPTANCE_DECAY
        for d in range(min(accepted + 1, proposed, DEPTHS)):  # depths checked: up to the first rejection
            self.reached[d] += 1.0
            self.accepted[d] += 1.0 if d < accepted else 0.0

    @property
    def known(self) -> bool:
        return self.reached[0] > 0.0

    def rates(self, depth: int) -> list[float]:
        """a_1 .. a_depth."""
        if not self.by_depth:
            rate = (sum(self.accepted) + PRIOR_WEIGHT * self.prior) / (sum(self.reached) + PRIOR_WEIGHT)
            return [rate] * depth
        out, above = [], self.prior
        for d in range(min(depth, DEPTHS)):
            above = (self.accepted[d] + PRIOR_WEIGHT * above) / (self.reached[d] + PRIOR_WEIGHT)
            out.append(above)
        return out + [above] * (depth - len(out))

    def expected(self, draft: int) -> float:
        """Tokens one check of a `draft`-token draft yields: 1 + sum_k a_1 ... a_k. With one rate a
        for every depth this is E(a, g) = (1 - a^(g+1)) / (1 - a)."""
        if self._expected is None:
            self._expected, run = [1.0], 1.0
            for a in self.rates(DEPTHS):
                run *= a
                self._expected.append(self._expected[-1] + run)
        return self._expected[min(draft, DEPTHS)]


class CostModel:
    """Prices each structure by seconds per generated token: the seconds of the forwards one cycle
    runs over the tokens it yields, times the mode's realized ratio (what its cycles really took
    against those forwards: Python, drafting, rollback, rebuilds, drafts shorter than asked)."""

    def __init__(self) -> None:
        self.times = StepTimes()
        # what a drafter is sets its prior and its shape: L0 (a lookup that is right for a run of tokens
        # or not at all, or another model) is kept per depth; L1 is the target on part of its context,
        # wrong only where the attention outside its cache decides a token, so at any depth alike
        self.acceptance = {"l0_l1": Acceptance(PRIOR_DRAFTER), "l0_l2": Acceptance(PRIOR_DRAFTER),
                           "l1_l2": Acceptance(PRIOR_RETRIEVAL, by_depth=False)}
        self._realized: dict[Mode, list[float]] = {}  # mode -> [decayed wall seconds, decayed predicted seconds]
        # bytes an L1 forward reads over an L2 forward's (the weights and the retrieval cache against the
        # weights and the whole context); where known, it prices L1 before L1 ever ran, so an L1
        # structure is explored only where it could pay (None: L1 structures wait for exploration)
        self.l1_share: float | None = None

    def observe(self, boundary: str, proposed: int, accepted: int) -> None:
        self.acceptance[boundary].add(proposed, accepted)

    def cycle(self, s: Structure) -> tuple[float, float] | None:
        """(seconds of the forwards one cycle of `s` runs, tokens it yields), None where a level it
        needs was never timed (it must be explored first)."""
        return self._cycle(s.mode, s.gamma1, s.gamma2)

    def _cycle(self, mode: Mode, g1: int, g2: int) -> tuple[float, float] | None:
        t, acc = self.times.estimate, self.acceptance
        one = t("l2", 1)
        if one is None:
            return None
        if mode is Mode.AR:
            return one, 1.0
        if mode is Mode.DRAFT_ONLY:  # an n-gram lookup is free: "l0" is timed for model drafters only
            if not acc["l0_l2"].known:
                return None
            return (t("l0", g1) or 0.0) + t("l2", g1 + 1), acc["l0_l2"].expected(g1)
        l1_one = self._l1(1)
        if l1_one is None or not (acc["l1_l2"].known or self.l1_share is not None):
            return None
        check, tokens = t("l2", g2 + 1), acc["l1_l2"].expected(g2)
        if mode is Mode.RETRIEVAL_ONLY:
            return g2 * l1_one + check, tokens
        # triforce: L1 forwards of g1 + 1 tokens, each yielding E(l0_l1, g1), until g2 tokens are drafted
        return g2 * self._l1_per_token(g1) + check, tokens

    def _l1_per_token(self, g1: int) -> float:
        """triforce's seconds of L0 and L1 per token L1 drafts, L0 drafting g1 tokens per L1 forward."""
        return ((self.times.estimate("l0", g1) or 0.0) + self._l1(g1 + 1)) / self.acceptance["l0_l1"].expected(g1)

    def _l1(self, tokens: int) -> float | None:
        """Seconds of an L1 forward checking `tokens`: timed, else L2's scaled by the bytes each reads."""
        timed = self.times.estimate("l1", tokens)
        if timed is not None or self.l1_share is None:
            return timed
        l2 = self.times.estimate("l2", tokens)
        return None if l2 is None else self.l1_share * l2

    def best_lengths(self, s: Structure, step: int = LENGTH_STEP) -> Structure:
        """`s` with each draft length moved to the cheapest within `step` of it (triforce: g1 by
        L1's seconds per drafted token, which g2 does not change, then g2)."""
        if s.mode is Mode.AR or self._cycle(s.mode, s.gamma1, s.gamma2) is None:
            return s
        near = lambda g: range(max(1, g - step), min(DEPTHS, g + step) + 1)
        if s.mode is Mode.DRAFT_ONLY:
            return dataclasses.replace(s, gamma1=min(near(s.gamma1), key=lambda g: self._per_token(s.mode, g, 1)))
        g1 = min(near(s.gamma1), key=self._l1_per_token) if s.mode is Mode.TRIFORCE else s.gamma1
        return dataclasses.replace(s, gamma1=g1, gamma2=min(near(s.gamma2), key=lambda g: self._per_token(s.mode, g1, g)))

    def _per_token(self, mode: Mode, g1: int, g2: int) -> float:
        seconds, tokens = self._cycle(mode, g1, g2)
        return seconds / tokens

    def floor(self, s: Structure) -> float | None:
        """The least `s` could cost a token where a bound is known: retrieval-only's forwards are
        timed or priced by their bytes, and its one unmeasured input, L1's agreement with L2, is at
        most full (L1 is the target on part of its own K/V), so its floor prices every L1 draft
        accepted at the best length. Elsewhere the price (L0's acceptance has no such bound)."""
        if s.mode is not Mode.RETRIEVAL_ONLY or self.price(s) is None:
            return self.price(s)
        l1_one, t = self._l1(1), self.times.estimate
        return self.ratio(s.mode) * min((g * l1_one + t("l2", g + 1)) / (g + 1) for g in range(1, DEPTHS + 1))

    def modelled(self, s: Structure) -> float | None:
        """Seconds per token the forwards alone predict (no realized correction)."""
        c = self.cycle(s)
        return None if c is None else c[0] / c[1]

    def price(self, s: Structure) -> float | None:
        """Predicted seconds per generated token of `s`, or None while it cannot be priced."""
        per_token = self.modelled(s)
        return None if per_token is None else per_token * self.ratio(s.mode)

    def ratio(self, mode: Mode) -> float:
        """Realized over modelled seconds for `mode`'s cycles (1.0 before any ran)."""
        wall, model = self._realized.get(mode, (0.0, 0.0))
        return wall / model if model > 0.0 else 1.0

    def realized(self, s: Structure, seconds: float) -> None:
        """A cycle of `s` took `seconds` of wall time: fold it into `s.mode`'s ratio of wall time to
        the forwards the model prices (its yield is the acceptance estimates' to learn)."""
        c = self.cycle(s)
        if c is None:
            return
        sums = self._realized.setdefault(s.mode, [0.0, 0.0])
        sums[0] = REALIZED_DECAY * sums[0] + min(seconds, SPIKE_CLIP * self.ratio(s.mode) * c[0])
        sums[1] = REALIZED_DECAY * sums[1] + c[0]
