"""The retrieval level's side of the `auto` policy (engine/decoding/policy.py): whether an L1
structure can pay at all at this context, the retrieval budget for the next turn, what a switch to
L1 costs while its cache is not built for the prompt, whether to build it before the first token,
and how long a draft an L1 structure is explored with.
"""
from __future__ import annotations

from engine.decoding.structure import Structure
from engine.settings import DecodeSettings, Mode

L1_MAX_SHARE = 0.5  # under auto, L1 structures only while the retrieval cache holds < half the context
SETUP_HORIZON = 64  # a retrieval cache built to switch to an L1 structure must pay for itself in 64 tokens
# shrink the budget only where that is predicted to cut L1's forward by 15 % or more (its KV's share)
SHRINK_SAVING = 0.15
MAX_GAMMA2 = 12  # gamma1 + gamma2 + 2 stays inside the retrieval cache's minimum headroom (128 / 2)
EXPLORE_CHECK = 2.5  # an L1 structure is explored with drafts whose L2 check costs <= 2.5 one-token checks (at least 2 tokens)
PROBE_SETUP_STEPS = 2.0  # a refresh may probe an L1 structure from ar where building its cache costs <= 2 steps


class RetrievalChoices:
    """Methods of Policy (its base class) about the retrieval cache. They read and set Policy's
    fields: acceptance, costs, setup_s, _l1_live, _budget_moved, _memo; and call its scoring
    (_auto_modes, _best_of, _explored, _gain, _c)."""

    def l1_built(self) -> None:
        """The retrieval cache was selected for this prompt before its first token: a switch to an
        L1 structure in this turn has no build to pay for."""
        self._l1_live = True

    def l1_setup(self, seconds: float) -> None:
        """A cycle first built the retrieval cache for this prompt (or budget) in `seconds`."""
        self.setup_s = seconds if self.setup_s is None else 0.5 * (self.setup_s + seconds)

    def l1_ahead(self, settings: DecodeSettings, has_l0: bool, context_tokens: int, budget: int | None = None) -> bool:
        """Under auto, at a new prompt: would the best structure use L1 if its retrieval cache cost
        nothing to build? Then the session builds it before the first token, as a fixed L1 mode
        does, instead of charging the build to the answer. (Built only when the last structure ran
        L1, an answer that ended on ar or a probe left the next paying the build, and auto ran ar
        where a fixed L1 mode beat it.) Only L1 structures measured in earlier
        turns count: an unexplored one is explored in its own cycles. At a session's first turn
        (no cycle yet, L1 never timed) it is built up front too: the first answer explores the L1
        structures anyway, as fixed L1 modes build before the first token. Its time prices later
        builds (setup_s)."""
        if Mode.of(settings.mode) is not Mode.AUTO or not self.retrieval_pays(budget or settings.budget, context_tokens):
            return False
        if not self._cycles and not self.costs.measured("l1"):
            return True
        self._memo.clear()
        modes = self._auto_modes(settings, has_l0, context_tokens, budget)
        scored = [(ms, s) for ms, s in (self._best_of(m, settings) for m in modes) if ms is not None]
        if not scored:
            return False
        best_ms, best = min(scored, key=lambda x: x[0])
        plain = next((ms for ms, s in scored if s.mode is Mode.AR), None)
        return (best.mode.uses_l1 and self._explored(best.mode)
                and (plain is None or best_ms <= self._gain(best, Structure(Mode.AR)) * plain))

    @staticmethod
    def retrieval_pays(budget: int, context_tokens: int) -> bool:
        """Can a structure with an L1 level beat ar and draft-only at all? Not while the retrieval
        cache holds L1_MAX_SHARE of the context or more: its forwards then cost nearly what L2's do
        (the weights dominate a small model's forward on a CPU, so a short context leaves L1 no
        margin). Left in, noise in a few timings would make auto explore and re-pick them."""
        return min(budget, context_tokens) < L1_MAX_SHARE * context_tokens

    def choose_budget(self, settings: DecodeSettings, budget: int, context_tokens: int) -> int:
        """The retrieval budget for the next turn (a whole number of chunks): larger when L1 is cheap
        next to L2 but misses, smaller when it hardly misses, costs nearly as much as L2, and a
        smaller cache would make its forward markedly cheaper."""
        acc, c1, c2 = self.acceptance["l1_l2"], self.costs.estimate("l1", 1), self.costs.estimate("l2", 1)
        if not acc.known or c1 is None or c2 is None:
            return budget
        chunk = settings.chunk
        new = budget
        if acc.rate < 0.7 and c1 < 0.5 * c2:
            new = max(budget, min(budget * 2, context_tokens // 2 // chunk * chunk))
        elif acc.rate > 0.95 and c1 > 0.5 * c2 and budget >= 4 * chunk:
            half = budget // 2 // chunk * chunk
            if self._l1_cost_at(half, budget, context_tokens, c1, c2) > (1.0 - SHRINK_SAVING) * c1:
                return budget  # L1's forward is its weights, not its cache: halving saves little
            new = half
        direction = (new > budget) - (new < budget)
        if direction and direction == -self._budget_moved:
            return budget  # never back: each rule fired on acceptance measured at the other budget
        if new != budget:  # (else the two rules could take turns, doubling and halving, each
            self._budget_moved = direction  # time forgetting L1's costs)
            # L1's timings carried over, scaled to its new size: forgotten, L1 was priced by the
            # optimistic prior but counted as explored, and auto ran ar for the rest of the session
            # even where retrieval-only had been cheaper before the move
            self.costs.scale("l1", self._l1_cost_at(new, budget, context_tokens, c1, c2) / c1)
        return new

    @staticmethod
    def _l1_cost_at(budget: int, now: int, context_tokens: int, c1: float, c2: float) -> float:
        """L1's 1-token forward with a retrieval cache of `budget` tokens, from its cost `c1` at `now`
        tokens and L2's `c2` over the whole context: both read the same weights, so the difference
        is at most the KV of the tokens L2 reads and L1 does not (an upper bound on the per-token KV
        cost: the two heads differ too)."""
        per_token = max(0.0, c2 - c1) / max(1, context_tokens - now)
        return max(0.0, c1 + per_token * (budget - now))

    def _setup_cheap(self) -> bool:
        """Does building L1's cache for this prompt cost at most PROBE_SETUP_STEPS target steps? Then
        a refresh may probe an L1 structure from ar. (Excluded always, auto that left L1 for ar after
        a slow spell would never measure L1 again; a build of many steps stays excluded.)"""
        step = self._c("l2", 1)
        return self.setup_s is not None and step is not None and self.setup_s <= PROBE_SETUP_STEPS * step

    def _switch_cost(self, s: Structure, remaining: int | None) -> float:
        """Seconds per token a switch to `s` adds: an L1 structure whose cache is not built for this
        prompt pays the build over SETUP_HORIZON tokens, or the answer's last ones if fewer. (Left
        out, auto would go back to L1 structures, each time rebuilding, where ar is faster, or build
        one for an answer's last few tokens.)"""
        if not s.mode.uses_l1 or self._l1_live or self.setup_s is None:
            return 0.0
        horizon = SETUP_HORIZON if remaining is None else max(1, min(SETUP_HORIZON, remaining))
        return self.setup_s / horizon

    def _explored_at(self, s: Structure, settings: DecodeSettings, remaining: int | None) -> Structure:
        """The gammas an L1 structure is explored (or refreshed) at: drafts of settings.gamma2 tokens
        for L2 to check, fewer where such a check costs over EXPLORE_CHECK one-token checks, and
        never the model's longer best. Short drafts leave L1's acceptance near its prior, so a
        structure explored short is never chosen: a long first draft times a long check and reads
        the acceptance. But each checked token costs L2 a fixed share more, so at long contexts a
        long exploration check costs several one-token steps, and one grown to the model's best
        costs more still."""
        want = min(settings.gamma2, MAX_GAMMA2, MAX_GAMMA2 if remaining is None else remaining - 1)
        if not s.mode.uses_l1 or want < 1:
            return s
        one = self._c("l2", 1)
        while want > 2 and one is not None and self._c("l2", want + 1) > EXPLORE_CHECK * one:
            want -= 1
        return s if s.gamma2 == want else Structure(s.mode, s.gamma1, want)
