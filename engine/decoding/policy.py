"""The `auto` policy: which level structure (ar, draft-only, retrieval-only, triforce) and which
gammas to run next, chosen online by expected tokens per second.

Inputs, all measured in this session: seconds per forward at each level as a function of the tokens
that forward checks (on a CPU, checking 8 tokens costs far more than 1), and per-boundary acceptance
with exponential forgetting (so a shift in acceptance moves the estimate within ~20 cycles). A
structure is scored as E(a, g) / cost, E(a, g) = (1 - a^(g+1)) / (1 - a) tokens per verification.

Exploration is bounded: a structure not yet measured is tried for EXPLORE_CYCLES verification
cycles, once per session, and only while its optimistic score is within EXPLORE_MARGIN of the best.
The choice is re-scored at each turn, every RESCORE_EVERY cycles and whenever an acceptance estimate
moves by SHIFT, and changes only between cycles; a switch that rebuilds the retrieval cache needs a
SWITCH_GAIN advantage (others cost nothing). Every cycle's output is an
exact sample whatever structure ran it, so switching never changes what is generated.

With a lookup drafter (n-gram), each guess says how much context it matched; guesses are pooled
by that (2, 3, 4-7, 8+ tokens), each class keeps its own acceptance, and a guess is checked only
as far as it pays for itself against a plain step (`draft_length`). Draft-only is then scored as
the mixture of its classes, so it is never predicted slower than ar.

The model counts forwards only. Each cycle's wall time against the model's prediction for the
tokens it yielded is kept per mode (decayed sums) and scales that mode's score, so drafting,
rollback, rebuilds, Python and acceptance that is not i.i.d. all count. After REFRESH_CYCLES
cycles the runner-up (within REFRESH_MARGIN, and not needing an L1 cache that is not live) runs
one cycle, so the estimates of a structure left long ago do not go stale.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.events import CandidateCost
from engine.settings import MAX_DRAFT, DecodeSettings, Mode

EXPLORE_CYCLES = 3
EXPLORE_MARGIN = 1.2  # explore an untried structure if its optimistic ms/token <= 1.2x the best's
RESCORE_EVERY = 4  # re-score at least every 4 cycles ...
SHIFT = 0.1  # ... or as soon as any acceptance estimate moved this much since the last scoring
SWITCH_GAIN = 0.92  # build L1 only if the best predicts <= 92% of the current structure's ms/token
FORGET = 0.95  # per-observation decay of the acceptance counts
MAX_GAMMA1 = 8
MAX_GAMMA2 = 12  # gamma1 + gamma2 + 2 stays inside the retrieval cache's minimum headroom (128 / 2)
PRIOR_SLOPE = 0.15  # cost of each extra checked token, as a share of a 1-token forward (CPU: 0.1-0.2)
PRIOR_L1_SHARE = 0.6  # an unmeasured L1 forward is guessed at this share of L2's (optimistic) ...
# ... unless the cost of a forward over an empty cache is known (`floor`): then L1 is that plus
# L2's attention scaled to the keys L1 holds (at 1K tokens on a CPU attention is a small part of a
# forward, and L1 saves next to nothing; at 8K it is over half)
PRIOR_ACCEPTANCE = {"l0_l1": 0.6, "l1_l2": 0.85, "l0_l2": 0.5}
PRIOR_HIT = 0.5  # share of L0 proposals that are not empty (n-gram lookups often find nothing)
REFRESH_CYCLES = 48  # after 48 cycles on one choice, the runner-up runs one cycle ...
REFRESH_MARGIN = 1.3  # ... if predicted within 1.3x of the best
SPEED_WEIGHT = 0.4  # how far one forward moves the machine-wide speed factor (log space) ...
ENTRY_WEIGHT = 0.1  # ... and its own level's entry, once divided by that factor
OUTLIER = 3.0  # a mode's wall/model ratio is held within [0.5, 3]
STALL = 10.0  # one cycle counts for at most 10x its modelled time (a stall of the machine, not the mode)
RATIO_PRIOR_CYCLES = 2.0  # a mode's wall/model ratio starts as 2 cycles' worth of 1.0
# lookup guesses, pooled by how much context they matched (match_class): per-token acceptance and
# share of offers before any is measured (a copy in progress, 8+ matching tokens, is usually right)
PRIOR_MATCH_ACCEPTANCE = {2: 0.35, 3: 0.45, 4: 0.6, 8: 0.85}
PRIOR_MATCH_SHARE = {0: 0.5, 2: 0.3, 3: 0.1, 4: 0.05, 8: 0.05}


def match_class(match: int) -> int:
    """A lookup guess's class by the context it matched: 0 (no guess), 2, 3, 4 (4-7) or 8 (8 or more)."""
    if match <= 0:
        return 0
    return 8 if match >= 8 else 4 if match >= 4 else max(2, match)


def expected_tokens(acceptance: float, gamma: int) -> float:
    """Tokens one verification of `gamma` drafts yields when each is accepted with prob `acceptance`
    (accepted prefix + the correction/bonus token)."""
    a = min(max(acceptance, 0.0), 0.999)
    return (1.0 - a ** (gamma + 1)) / (1.0 - a)


@dataclass(frozen=True)
class Structure:
    """One fixed way to decode: a mode that is not auto, with its draft lengths."""

    mode: Mode
    gamma1: int = 1
    gamma2: int = 1
    by_match: bool = False  # draft-only over lookups: gamma1 is a cap, each guess checked as far as it pays

    @property
    def label(self) -> str:
        if self.mode is Mode.AR:
            return "ar"
        if self.mode is Mode.DRAFT_ONLY:
            return f"draft-only g1<={self.gamma1}" if self.by_match else f"draft-only g1={self.gamma1}"
        if self.mode is Mode.RETRIEVAL_ONLY:
            return f"retrieval-only g2={self.gamma2}"
        return f"triforce g1={self.gamma1} g2={self.gamma2}"

    def speculation_tokens(self) -> int:
        """Slots one cycle may add past the held tokens (as DecodeSettings.speculation_tokens)."""
        return {Mode.AR: 1, Mode.DRAFT_ONLY: self.gamma1 + 1, Mode.RETRIEVAL_ONLY: self.gamma2 + 1}.get(
            self.mode, self.gamma1 + self.gamma2 + 2)


class StepCosts:
    """Seconds per forward at each level ("l0": one whole proposal, "l1", "l2"), per tokens checked,
    as moving averages; `estimate` fits cost(n) = base + slope * (n - 1) through what was measured.

    A shared machine runs in phases (the same forward took 30 ms for a minute, then 43 ms for the
    next), and the levels are timed at different moments: L1 in a fast phase, then L2 for a minute
    in a slow one, would make L1 look far cheaper than it is. So every sample also moves one
    machine-wide `speed` factor (SPEED_WEIGHT, in log space); the table holds costs divided by the
    factor at the time, and estimates multiply it back, so a phase moves every level alike."""

    def __init__(self) -> None:
        self.table: dict[str, dict[int, float]] = {"l0": {}, "l1": {}, "l2": {}}
        self._lines: dict[str, tuple[float, float, float]] = {}  # level -> (mean n, mean t, slope), cached
        self.speed = 1.0  # how slow the machine runs now, relative to when the first sample was taken

    def record(self, level: str, tokens: int, seconds: float) -> None:
        """Most of a sample's surprise goes into the machine-wide factor, so a burst of load moves
        every level alike and decays as the next forwards come in; it cannot price one structure
        out for good (a structure priced out may never run again to correct it)."""
        row = self.table[level]
        old = row.get(tokens)
        if old is None:
            row[tokens] = seconds / self.speed
        else:
            self.speed *= (seconds / (old * self.speed)) ** SPEED_WEIGHT
            row[tokens] = old + ENTRY_WEIGHT * (seconds / self.speed - old)
        self._lines.pop(level, None)

    def forget(self, level: str) -> None:
        self.table[level].clear()
        self._lines.pop(level, None)

    def measured(self, level: str) -> bool:
        return bool(self.table[level])

    def estimate(self, level: str, tokens: int) -> float | None:
        """Seconds for a forward checking `tokens` tokens, or None if this level was never timed."""
        row = self.table[level]
        if not row:
            return None
        if tokens in row:
            return self.speed * row[tokens]
        line = self._lines.get(level)
        if line is None:
            self._lines[level] = line = self._fit(row)
        mean_n, mean_t, slope = line
        return self.speed * max(1e-6, mean_t + slope * (tokens - mean_n))

    @staticmethod
    def _fit(row: dict[int, float]) -> tuple[float, float, float]:
        """Least squares through the measured points; one point: the prior slope."""
        points = list(row.items())
        if len(points) == 1:
            n0, t0 = points[0]
            base = t0 / (1.0 + PRIOR_SLOPE * (n0 - 1))
            return float(n0), t0, PRIOR_SLOPE * base
        mean_n = sum(n for n, _ in points) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        var = sum((n - mean_n) ** 2 for n, _ in points)
        return mean_n, mean_t, max(0.0, sum((n - mean_n) * (t - mean_t) for n, t in points) / var)


@dataclass
class Acceptance:
    """Per-token acceptance at one boundary, accepted / checked, with old cycles forgotten."""

    prior: float
    accepted: float = 0.0
    tested: float = 0.0
    proposals: float = 0.0
    nonempty: float = 0.0

    def add(self, proposed: int, accepted: int) -> None:
        self.accepted = FORGET * self.accepted + accepted
        self.tested = FORGET * self.tested + (accepted + (1 if accepted < proposed else 0) if proposed else 0)
        self.proposals = FORGET * self.proposals + 1
        self.nonempty = FORGET * self.nonempty + (1 if proposed else 0)

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


@dataclass
class Policy:
    """Chooses the structure for the next verification cycle from `StepCosts` and `Acceptance`."""

    costs: StepCosts = field(default_factory=StepCosts)
    acceptance: dict[str, Acceptance] = field(
        default_factory=lambda: {k: Acceptance(v) for k, v in PRIOR_ACCEPTANCE.items()})
    tried: dict[Mode, int] = field(default_factory=dict)  # cycles run per structure (bounds exploration)
    current: Structure | None = None
    candidates: tuple[CandidateCost, ...] = ()
    switches: int = 0
    _realized: dict = field(default_factory=dict, repr=False)  # mode -> (wall s, predicted s, cycles), decayed
    forced: list[Structure] | None = None  # tests: a script of structures to run, one per cycle
    _memo: dict = field(default_factory=dict, repr=False)  # inputs of the current choice
    _settled: bool = False  # the last scoring chose without exploring
    _since_score: int = 0  # cycles since the last scoring
    _since_refresh: int = 0  # cycles since the runner-up last ran
    _scored_rates: dict = field(default_factory=dict)  # acceptance at the last scoring
    lookup: bool = False  # L0 is a lookup (n-gram): its guesses are weighed one by one (draft_length)
    floor: float | None = None  # seconds of a 1-token target forward over an empty cache (weights, no attention)
    l1_keys: float = 1.0  # keys L1 attends over, as a share of the full cache's
    # lookup guesses, pooled over L1 and L2 (L1 agrees with L2 on ~0.8-0.97 of tokens, and a guess
    # offered inside triforce must inform draft-only's score, and the other way round)
    by_match: dict = field(default_factory=dict)  # match class -> Acceptance of lookup guesses
    match_counts: dict = field(default_factory=dict)  # match class -> decayed count of offers

    def new_turn(self) -> None:
        """A new prompt: score afresh at the next cycle."""
        self._settled = False

    def observe(self, boundary: str, proposed: int, accepted: int, match: int | None = None) -> None:
        """A verification at `boundary` accepted `accepted` of `proposed` drafts; `match`: the
        lookup guess's match length (its offer counts even when none of it was checked)."""
        self.acceptance[boundary].add(proposed, accepted)
        if match is None:
            return
        cls = match_class(match)
        counts = self.match_counts
        for key in counts:
            counts[key] *= FORGET
        counts[cls] = counts.get(cls, 0.0) + 1.0
        if proposed:
            self._match_acceptance(cls).add(proposed, accepted)

    def _match_acceptance(self, cls: int) -> "Acceptance":
        if cls not in self.by_match:
            self.by_match[cls] = Acceptance(PRIOR_MATCH_ACCEPTANCE[cls])
        return self.by_match[cls]

    def draft_length(self, level: str, match: int, offered: int) -> int:
        """How many of a lookup guess's `offered` tokens one forward at `level` should check: the t
        that maximizes E(a, t) - cost(t + 1) / cost(1), a = this match class's acceptance, i.e. the
        tokens gained over a plain step of the same cost; 0 when no length pays for itself. The
        choice uses only the guess and past measurements, never the target's verdict on it, so the
        output stays exact whatever it picks."""
        cls = match_class(match)
        base = self._c(level, 1)
        if offered <= 0 or cls == 0:
            return 0
        if base is None:
            return offered
        a = self._match_acceptance(cls).rate
        best_t, best_gain = 0, 0.0
        for t in range(1, offered + 1):
            gain = expected_tokens(a, t) - self._c(level, t + 1) / base
            if gain > best_gain:
                best_t, best_gain = t, gain
        return best_t

    def _match_shares(self) -> dict[int, float]:
        """Share of offers per match class, with one offer's worth of prior."""
        counts = self.match_counts
        merged = {cls: counts.get(cls, 0.0) + prior for cls, prior in PRIOR_MATCH_SHARE.items()}
        total = sum(merged.values())
        return {cls: n / total for cls, n in merged.items()}

    def choose(self, settings: DecodeSettings, has_l0: bool, context_tokens: int) -> Structure:
        """The structure for the next cycle (`settings.mode` fixed: that mode, gammas tuned if
        settings.auto)."""
        mode = Mode.of(settings.mode)
        self._memo.clear()
        if self.forced:
            chosen = self.forced.pop(0)
            self.forced.append(chosen)
            return self._ran(chosen)
        if mode is not Mode.AUTO and not settings.auto:
            return self._ran(Structure(mode, settings.gamma1, settings.gamma2))
        modes = [mode] if mode is not Mode.AUTO else [
            m for m in (Mode.AR, Mode.DRAFT_ONLY, Mode.RETRIEVAL_ONLY, Mode.TRIFORCE)
            if has_l0 or not m.uses_l0 or m is Mode.AR]
        if not has_l0 and mode in (Mode.DRAFT_ONLY,):
            return self._ran(Structure(mode, settings.gamma1, settings.gamma2))
        rates = {b: a.rate for b, a in self.acceptance.items()}
        if (self._settled and self.current is not None and self.current.mode in modes
                and self._since_score < RESCORE_EVERY
                and all(abs(rates[b] - r) < SHIFT for b, r in self._scored_rates.items())):
            self._since_score += 1  # nothing moved: scoring ~130 structures again would cost a few ms
            return self._ran(self.current)
        self._since_score, self._scored_rates = 1, rates
        scored = [self._best_of(m, settings) for m in modes]
        scored = [(ms, s) for ms, s in scored if ms is not None]
        if not scored:  # nothing timed yet: one plain step measures the target
            return self._ran(Structure(Mode.AR) if mode is Mode.AUTO else Structure(mode, settings.gamma1, settings.gamma2))
        self.candidates = tuple(CandidateCost(s.label, ms * 1000.0, self._explored(s.mode)) for ms, s in scored)
        best_ms, best = min(scored, key=lambda x: x[0])
        self._settled = False
        for ms, s in scored:  # bounded exploration of structures never measured
            if self.tried.get(s.mode, 0) < EXPLORE_CYCLES and not self._explored(s.mode) and ms <= EXPLORE_MARGIN * best_ms:
                return self._ran(s)
        self._settled = True
        if self._since_refresh >= REFRESH_CYCLES:  # re-measure the runner-up once: estimates of a
            self._since_refresh = 0  # structure left long ago go stale (costs move with the context)
            live_l1 = self.current is not None and self.current.mode.uses_l1
            others = [(ms, s) for ms, s in scored  # no L1 cache rebuilt for one cycle
                      if (self.current is None or s.mode is not self.current.mode) and (live_l1 or not s.mode.uses_l1)]
            if others:  # judged by the model alone: a mode once measured badly must get its chance
                ms, runner_up = min(((self.seconds_per_token(s, corrected=False), s) for _, s in others),
                                    key=lambda x: x[0])
                if ms <= REFRESH_MARGIN * best_ms:
                    self._settled = False
                    return self._ran(runner_up)
        if self.current is not None and self.current.mode in modes:
            now = next((ms for ms, s in scored if s.mode is self.current.mode), None)
            rebuild = best.mode.uses_l1 and not self.current.mode.uses_l1  # the only switch that costs
            if now is not None and rebuild and best_ms > SWITCH_GAIN * now:
                best = next(s for ms, s in scored if s.mode is self.current.mode)  # not worth a rebuild
        return self._ran(best)

    def choose_budget(self, settings: DecodeSettings, budget: int, context_tokens: int) -> int:
        """The retrieval budget for the next turn (a whole number of chunks): larger when L1 is cheap
        next to L2 but misses, smaller when it hardly misses and costs nearly as much as L2."""
        acc, c1, c2 = self.acceptance["l1_l2"], self.costs.estimate("l1", 1), self.costs.estimate("l2", 1)
        if not acc.known or c1 is None or c2 is None:
            return budget
        chunk = settings.chunk
        new = budget
        if acc.rate < 0.7 and c1 < 0.5 * c2:
            new = max(budget, min(budget * 2, context_tokens // 2 // chunk * chunk))
        elif acc.rate > 0.95 and c1 > 0.5 * c2 and budget >= 4 * chunk:
            new = budget // 2 // chunk * chunk
        if new != budget:
            self.costs.forget("l1")  # L1's cost changes with its size: measure it again
        return new

    def _ran(self, chosen: Structure) -> Structure:
        self._since_refresh += 1
        if self.current is not None and chosen.mode is not self.current.mode:
            self.switches += 1
        self.current = chosen
        self.tried[chosen.mode] = self.tried.get(chosen.mode, 0) + 1
        return chosen

    def _explored(self, mode: Mode) -> bool:
        """Has `mode` been measured enough to trust its score?"""
        acc = self.acceptance
        if mode is Mode.AR:
            return self.costs.measured("l2")
        if mode is Mode.DRAFT_ONLY:
            return acc["l0_l2"].known or self.tried.get(mode, 0) >= EXPLORE_CYCLES
        if mode is Mode.RETRIEVAL_ONLY:
            return self.costs.measured("l1") and (acc["l1_l2"].known or self.tried.get(mode, 0) >= EXPLORE_CYCLES)
        return (self.costs.measured("l1") and acc["l1_l2"].known and acc["l0_l1"].known) or \
            self.tried.get(mode, 0) >= EXPLORE_CYCLES

    # --- the cost model ------------------------------------------------------------------------
    def _c(self, level: str, tokens: int) -> float | None:
        key = (level, tokens)
        if key not in self._memo:  # one choice scores ~130 structures over the same few inputs
            self._memo[key] = self._c_fresh(level, tokens)
        return self._memo[key]

    def _c_fresh(self, level: str, tokens: int) -> float | None:
        got = self.costs.estimate(level, tokens)
        if got is None and level == "l1":
            l2 = self.costs.estimate("l2", tokens)
            return None if l2 is None else self.l1_share() * l2
        if got is None and level == "l0":
            return 0.0  # a drafter never timed costs nothing visible yet (n-gram lookups)
        return got

    def l1_share(self) -> float:
        """An unmeasured L1 forward's cost as a share of L2's: the empty-cache floor plus the rest
        (attention) scaled by the share of keys L1 keeps; PRIOR_L1_SHARE while the floor is unknown."""
        l2 = self.costs.estimate("l2", 1)
        if self.floor is None or l2 is None:
            return PRIOR_L1_SHARE
        fixed = min(1.0, self.floor / l2)
        return fixed + (1.0 - fixed) * min(1.0, self.l1_keys)

    def _rate(self, boundary: str) -> float:
        if boundary not in self._memo:
            self._memo[boundary] = self._rate_fresh(boundary)
        return self._memo[boundary]

    def _rate_fresh(self, boundary: str) -> float:
        acc = self.acceptance
        if boundary == "l0_l2" and not acc["l0_l2"].known and acc["l0_l1"].known:
            return acc["l0_l1"].rate * acc["l1_l2"].rate  # L0 vs the target ~ L0 vs L1, then L1 vs L2
        if boundary == "l0_l1" and not acc["l0_l1"].known and acc["l0_l2"].known:
            return acc["l0_l2"].rate
        return acc[boundary].rate

    def _hit(self) -> float:
        if "hit" not in self._memo:
            self._memo["hit"] = self._hit_fresh()
        return self._memo["hit"]

    def _hit_fresh(self) -> float:
        acc = self.acceptance
        return acc["l0_l1"].hit if acc["l0_l1"].proposals >= acc["l0_l2"].proposals else acc["l0_l2"].hit

    def seconds_per_token(self, s: Structure, corrected: bool = True) -> float | None:
        """Predicted seconds per generated token of structure `s`, or None before any L2 timing:
        its cycle cost over the tokens a cycle yields, corrected by what its cycles really took."""
        cycle = self.cycle_cost(s)
        if cycle is None:
            return None
        seconds, tokens = cycle
        return seconds * (self._overhead(s.mode) if corrected else 1.0) / tokens

    def cycle_cost(self, s: Structure) -> tuple[float, float] | None:
        """(seconds of the forwards one cycle of `s` runs, tokens it yields), from the timed levels."""
        c2 = lambda n: self._c("l2", n)  # noqa: E731
        if c2(1) is None:
            return None
        if s.mode is Mode.AR:
            return c2(1), 1.0
        if s.mode is Mode.DRAFT_ONLY and s.by_match:  # each class of guess checked as far as it pays
            seconds = tokens = 0.0
            for cls, share in self._match_shares().items():
                t = self.draft_length("l2", cls, s.gamma1) if cls else 0
                a = self._match_acceptance(cls).rate if t else 0.0
                seconds += share * c2(t + 1)
                tokens += share * expected_tokens(a, t)
            return seconds, tokens
        h = self._hit()
        if s.mode is Mode.DRAFT_ONLY:
            g = s.gamma1
            tokens = h * expected_tokens(self._rate("l0_l2"), g) + (1 - h)
            return self._c("l0", g) + h * c2(g + 1) + (1 - h) * c2(1), tokens
        if s.mode is Mode.RETRIEVAL_ONLY:
            g = s.gamma2
            return g * self._c("l1", 1) + c2(g + 1), expected_tokens(self._rate("l1_l2"), g)
        g1, g2 = s.gamma1, s.gamma2
        per_l1_forward = h * expected_tokens(self._rate("l0_l1"), g1) + (1 - h)
        l1_cost = self._c("l0", g1) + h * self._c("l1", g1 + 1) + (1 - h) * self._c("l1", 1)
        return g2 * l1_cost / per_l1_forward + c2(g2 + 1), expected_tokens(self._rate("l1_l2"), g2)

    def realized(self, s: Structure, seconds: float, tokens: int) -> None:
        """A cycle of `s` took `seconds` of wall time and yielded `tokens` tokens. Learn how far
        that is from the model, per mode: wall time over predicted time for those tokens. It takes
        in what the forwards do not show (drafting, acceptance, rollback, retrieval rebuilds,
        Python) and how far real acceptance runs from the i.i.d. E(a, g) (n-gram drafts are
        accepted whole or not at all)."""
        self._memo.clear()
        predicted = self.seconds_per_token(s, corrected=False)
        if predicted is None or tokens < 1:
            return
        expected = predicted * tokens
        # no cycle is skipped: one that yields 3 tokens where 9 were expected (L1 rejected early)
        # is the mode's real cost, and leaving such cycles out priced triforce at 27 ms/token at 8K
        # where it ran at 35-45; the n-gram index over a new prompt is built before decoding
        seconds = min(seconds, STALL * expected)
        wall, model, cycles = self._realized.get(s.mode, (0.0, 0.0, 0.0))
        self._realized[s.mode] = (FORGET * wall + seconds, FORGET * model + expected, FORGET * cycles + 1.0)

    def _overhead(self, mode: Mode) -> float:
        """Measured wall time / modelled forward time of `mode`'s cycles, pulled toward 1 by
        RATIO_PRIOR_CYCLES cycles' worth of prior (one unlucky cycle, a 4-token check rejected at
        its first token, must not price a mode out). A structure still within its exploration
        cycles gets the smallest ratio seen (optimistic, so that it is measured before it is judged)."""
        ratios = {}
        for m, (wall, model, cycles) in self._realized.items():
            prior = RATIO_PRIOR_CYCLES * model / cycles
            ratios[m] = max(0.5, min(OUTLIER, (wall + prior) / (model + prior)))
        optimistic = min(ratios.values(), default=1.0)
        if mode not in ratios or self.tried.get(mode, 0) < EXPLORE_CYCLES:
            return min(optimistic, ratios.get(mode, optimistic))
        return ratios[mode]

    def _best_of(self, mode: Mode, settings: DecodeSettings) -> tuple[float | None, Structure]:
        """The best gammas for `mode` and their predicted seconds per token."""
        if mode is Mode.AR:
            grid = [Structure(Mode.AR)]
        elif mode is Mode.DRAFT_ONLY and self.lookup:
            grid = [Structure(mode, min(MAX_DRAFT, 2 * MAX_GAMMA1), settings.gamma2, by_match=True)]
        elif mode is Mode.DRAFT_ONLY:
            grid = [Structure(mode, g, settings.gamma2) for g in range(1, min(MAX_DRAFT, 2 * MAX_GAMMA1) + 1)]
        elif mode is Mode.RETRIEVAL_ONLY:
            grid = [Structure(mode, settings.gamma1, g) for g in range(1, MAX_GAMMA2 + 1)]
        else:
            grid = [Structure(mode, g1, g2) for g1 in range(1, MAX_GAMMA1 + 1) for g2 in range(1, MAX_GAMMA2 + 1)]
        scored = [(self.seconds_per_token(s), s) for s in grid]
        scored = [(t, s) for t, s in scored if t is not None]
        if not scored:
            return None, grid[0]
        return min(scored, key=lambda x: x[0])
