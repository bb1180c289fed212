"""The inputs of `auto`'s cost model (engine/decoding/policy.py), memoized for one choice, which
scores ~130 structures over the same few of them: a level's forward at a number of tokens, a
boundary's acceptance, the n-gram drafter's hit rate and draft-only's replayed forwards."""
from __future__ import annotations

from engine.decoding.lookup_replay import LOOKUP_TOKENS
from engine.decoding.measurements import DEPTHS, Acceptance
from engine.offload.cost import expected_tokens

PRIOR_L1_SHARE = 0.6  # an unmeasured L1 forward is guessed at this share of L2's (optimistic)
STRETCH_GAMMA = 4  # the draft length that rates how hard a stretch of text is for n-gram drafts ...
MIN_STRETCH = 8  # ... once a mode's stretches in the window yield this many replayed tokens (one long cycle)
STRETCH_BOUNDS = (0.5, 2.0)


class CostInputs:
    """Methods of Policy (its subclass): they read its costs, acceptance, novelty, lookups and _memo."""

    def reprice(self) -> None:
        """Forget the memoized inputs: prices read the tables afresh. Each choice and each realized
        cycle starts so; a caller that records timings or acceptance and then prices must too."""
        self._memo.clear()

    def _c(self, level: str, tokens: int) -> float | None:
        key = (level, tokens)
        try:  # one choice scores ~130 structures over the same few inputs
            return self._memo[key]
        except KeyError:
            got = self._memo[key] = self._c_fresh(level, tokens)
            return got

    def _c_fresh(self, level: str, tokens: int) -> float | None:
        got = self.costs.estimate(level, tokens)
        if got is None and level == "l1":
            l2 = self.costs.estimate("l2", tokens)
            return None if l2 is None else PRIOR_L1_SHARE * l2
        if got is None and level == "l0":
            return 0.0  # a drafter never timed costs nothing visible yet (n-gram lookups)
        return got

    def _l1_per_token(self, g1: int) -> float:
        """triforce's L1 seconds per token it hands to L2 at γ1 = `g1` (Policy._l1_per_token_fresh)."""
        key = ("l1_per_token", g1)
        if key not in self._memo:  # (every γ2 of a γ1 reads it)
            self._memo[key] = self._l1_per_token_fresh(g1)
        return self._memo[key]

    def _rate(self, boundary: str) -> float:
        if boundary not in self._memo:
            self._memo[boundary] = self._rate_fresh(boundary)
        return self._memo[boundary]

    def _measured(self, boundary: str) -> tuple[Acceptance | None, float]:
        """The acceptance that prices `boundary` and the factor on its rate (L1 misses the tokens new
        to its vocabulary); None: L0 -> L2 not yet measured, priced as L0 -> L1 then L1 -> L2."""
        acc = self.acceptance
        if boundary == "l0_l2" and not acc["l0_l2"].known and acc["l0_l1"].known:
            return None, 1.0
        if boundary == "l0_l1" and not acc["l0_l1"].known and acc["l0_l2"].known:
            return acc["l0_l2"], 1.0
        return acc[boundary], 1.0 - (self.novelty.rate if boundary == "l1_l2" else 0.0)

    def _rate_fresh(self, boundary: str) -> float:
        measured, scale = self._measured(boundary)
        if measured is None:
            return self.acceptance["l0_l1"].rate * self.acceptance["l1_l2"].rate
        return measured.rate * scale

    def _expected(self, boundary: str, gamma: int) -> float:
        """Tokens a verification of `gamma` drafted tokens yields at `boundary`: per draft depth as
        measured (Acceptance.expected); the i.i.d. model where the boundary is priced from others."""
        key = ("expected", boundary)
        totals = self._memo.get(key)
        if totals is None or len(totals) <= gamma:  # every length up to `gamma` (at least DEPTHS) in one pass
            self._memo[key] = totals = self._expected_fresh(boundary, max(gamma, DEPTHS))
        return totals[gamma]

    def _expected_fresh(self, boundary: str, gamma: int) -> list[float]:
        """`_expected` for every length 0..`gamma`."""
        measured, scale = self._measured(boundary)
        if measured is None:  # a product of two boundaries' rates: no depths of its own
            rate = self._rate(boundary)
            return [expected_tokens(rate, g) for g in range(gamma + 1)]
        return measured.expected_upto(gamma, scale)

    def _replay(self, gamma: int, after_full: int = 0) -> tuple[float, int, int] | None:
        """draft-only's forwards replayed over the logged lookups (engine/decoding/lookup_replay.py),
        drafting `gamma` tokens (`after_full` right after a draft kept whole; 0: `gamma` always)."""
        key = ("replay", gamma, after_full)
        if key not in self._memo:  # (callers checked c2(1))
            self._memo[key] = self.lookups.replay(gamma, self._l2_row().__getitem__, after_full)
        return self._memo[key]

    def _l2_row(self) -> list[float | None]:
        """L2's forward by tokens checked, 0..LOOKUP_TOKENS + 1 (index 0 unused), for the replays."""
        row = self._memo.get("l2_row")
        if row is None:
            self._memo["l2_row"] = row = [None] + [self._c("l2", n) for n in range(1, LOOKUP_TOKENS + 2)]
        return row

    def _stretch(self, mode) -> float:
        """How much dearer draft-only's replay runs over the whole window than over the stretches
        `mode`'s cycles emitted (STRETCH_BOUNDS; the last value while those stretches are too few,
        1 before any): triforce's L1 drafts are its n-gram drafts, so its measured acceptance and
        time per token come from the stretches it ran, and its price, scaled by this, is for text
        as hard as the window's. (Priced from easy stretches alone, such as an answer's copied
        tail, it would look cheaper than draft-only replayed over the whole window, and then run
        the next answer's hard opening.)"""
        key = ("stretch", mode)
        if key not in self._memo:
            whole = self._replay(STRETCH_GAMMA) if self._c("l2", 1) is not None else None
            if whole is not None and whole[1]:
                seconds, tokens = self.lookups.replay_tagged(mode, STRETCH_GAMMA, self._l2_row().__getitem__)
                if tokens >= MIN_STRETCH and seconds > 0:
                    low, high = STRETCH_BOUNDS
                    self._stretches[mode] = min(high, max(low, (whole[0] / whole[1]) / (seconds / tokens)))
            self._memo[key] = self._stretches.get(mode, 1.0)
        return self._memo[key]

    def _hit(self) -> float:
        if "hit" not in self._memo:
            self._memo["hit"] = self._hit_fresh()
        return self._memo["hit"]

    def _hit_fresh(self) -> float:
        acc = self.acceptance
        return acc["l0_l1"].hit if acc["l0_l1"].proposals >= acc["l0_l2"].proposals else acc["l0_l2"].hit
