"""`AutoPolicy`: the structure and draft lengths of each verification cycle, composed of a cost model
(what each structure costs per token), a schedule (what runs when) and one draft-length rule."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from engine.decoding.auto.cost_model import CostModel
from engine.decoding.auto.schedule import SWITCH_MARGIN, Schedule
from engine.decoding.lookup_replay import lookup_outcome
from engine.decoding.structure import Structure
from engine.events import CandidateCost
from engine.settings import MAX_DRAFT, DecodeSettings, Mode

L1_MAX_SHARE = 0.5  # L1 reads L2's weights: a retrieval cache over half the context saves too few bytes to pay

# which boundary's checks set which draft length of a mode
LENGTH_OF = {(Mode.DRAFT_ONLY, "l0_l2"): "gamma1", (Mode.TRIFORCE, "l0_l1"): "gamma1",
             (Mode.RETRIEVAL_ONLY, "l1_l2"): "gamma2", (Mode.TRIFORCE, "l1_l2"): "gamma2"}


def next_length(length: int, asked: int, proposed: int, accepted: int, ceiling: int = MAX_DRAFT) -> int:
    """transformers' assistant rule: 2 tokens longer (up to `ceiling`) after a draft of the `asked`
    length accepted whole, 1 shorter after a rejection; a shorter draft accepted whole (an n-gram
    lookup that found fewer) leaves it."""
    if accepted < proposed:
        return max(1, length - 1)
    return max(length, min(ceiling, length + 2)) if proposed >= asked else length


class AutoPolicy:
    """Chooses the structure of the next cycle. Every cycle's output is an exact sample whichever
    structure ran it, so a switch between cycles never changes what is generated."""

    def __init__(self, step_bytes: Callable[[int], int] | None = None) -> None:
        self.step_bytes = step_bytes  # bytes a target forward reads with n tokens held (None: unknown)
        self.model = CostModel()
        self.schedule = Schedule()
        self.lengths: dict[Mode, Structure] = {}  # each mode at its current draft lengths
        self.current: Structure | None = None
        self.candidates: tuple[CandidateCost, ...] = ()
        self.forced: list[Structure] | None = None  # tests: a script of structures, one per cycle, repeated
        self._ceiling = {"gamma1": MAX_DRAFT, "gamma2": MAX_DRAFT}  # the rule grows a length up to the settings'
        self._shadows: list[tuple[int, list[int], int]] = []  # open shadow drafts: (position, tokens, length asked)

    @property
    def running(self) -> Structure | None:
        """The structure that runs between probes (the schedule's incumbent at its draft lengths)."""
        mode = self.schedule.incumbent
        return None if mode is None else self.lengths.get(mode)

    def new_turn(self) -> None:
        """A new prompt: acceptance, costs and the refresh waits carry over (the same model and machine);
        the last answer's open shadow drafts are dropped."""
        self._shadows = []

    def wants_shadow(self, settings: DecodeSettings, chosen: Structure) -> int:
        """How many tokens of an n-gram lookup to score as a shadow draft-only check for a cycle that
        `chosen` runs (0: none, e.g. draft-only runs it itself)."""
        if Mode.of(settings.mode) is not Mode.AUTO or chosen.mode is Mode.DRAFT_ONLY:
            return 0
        rule = self.lengths.get(Mode.DRAFT_ONLY)
        return 0 if rule is None else rule.gamma1

    def shadow(self, position: int, lookup: list[int], asked: int) -> None:
        """What the n-gram drafter proposes at `position` (a cycle's start) where draft-only does not
        run it. A lookup draws nothing and costs microseconds, and a deterministic draft is accepted
        exactly when the target's token equals it (under sampling with probability p(x)), so checked
        against the tokens the target emits it is a draft-only check for free, and draft-only's price
        stays current while another structure runs."""
        self._shadows.append((position, lookup[:asked], asked))

    @property
    def shadows_open(self) -> bool:
        return bool(self._shadows)

    def settle(self, seq: list[int]) -> None:
        """The sequence is now `seq`: score each open shadow draft whose fate it decides (a token
        differs, or every token it offered is there), as draft-only's own cycles are scored."""
        still_open = []
        for position, tokens, asked in self._shadows:
            _, matched, settled = lookup_outcome(tokens, seq, position)
            if settled:
                self.model.observe("l0_l2", asked, matched)
            else:
                still_open.append((position, tokens, asked))
        self._shadows = still_open

    def wants_l1(self, settings: DecodeSettings, context_tokens: int, budget: int) -> bool:
        """Build the retrieval cache with the prompt, before the first token (as a fixed L1 mode
        does)? Where an L1 structure may run and is running or not yet explored."""
        if not self._l1_allowed(context_tokens, budget):
            return False
        running, explored = self.running, self.schedule.last_run
        return (running is not None and running.mode.uses_l1) or not any(
            m in explored for m in (Mode.RETRIEVAL_ONLY, Mode.TRIFORCE))

    @staticmethod
    def _l1_allowed(context_tokens: int, budget: int) -> bool:
        return min(budget, context_tokens) < L1_MAX_SHARE * context_tokens

    def modes(self, settings: DecodeSettings, has_l0: bool, context_tokens: int, budget: int) -> list[Mode]:
        """The modes auto may run: with L0 only given a drafter, with L1 only where it can pay;
        a fixed mode with `settings.auto`: that one, its draft lengths tuned."""
        mode = Mode.of(settings.mode)
        if not mode.chosen_online:
            return [mode]
        l1 = self._l1_allowed(context_tokens, budget)
        return [m for m in (Mode.AR, Mode.DRAFT_ONLY, Mode.TRIFORCE, Mode.RETRIEVAL_ONLY)
                if (has_l0 or not m.uses_l0) and (l1 or not m.uses_l1)]

    def choose(self, settings: DecodeSettings, has_l0: bool, context_tokens: int,
               budget: int | None = None, remaining: int | None = None) -> Structure:
        """The structure for the next cycle (`settings.mode` fixed and not settings.auto: that mode)."""
        if self.forced:
            chosen = self.forced.pop(0)
            self.forced.append(chosen)
            return self._ran(chosen)
        if not Mode.of(settings.mode).chosen_online and not settings.auto:
            return Structure(Mode.of(settings.mode), settings.gamma1, settings.gamma2)
        budget = budget or settings.budget
        modes = self.modes(settings, has_l0, context_tokens, budget)
        self._ceiling = {"gamma1": settings.gamma1, "gamma2": settings.gamma2}
        if self.step_bytes is not None:
            self.model.l1_share = self.step_bytes(min(budget, context_tokens)) / self.step_bytes(context_tokens)
        for m in modes:
            rule = self.lengths.setdefault(m, Structure(m, settings.gamma1, settings.gamma2))
            if m not in self.schedule.last_run:  # never ran: its exploration tries the lengths priced cheapest
                rule = self.lengths[m] = self.model.best_lengths(rule, step=MAX_DRAFT)
            modelled = self.model.best_lengths(rule)  # the model's lengths where it prices them clearly cheaper
            if modelled != rule and (self.model.price(modelled) or 0.0) < SWITCH_MARGIN * (self.model.price(rule) or 0.0):
                self.lengths[m] = modelled
        prices = {m: self.model.price(self.lengths[m]) for m in modes}
        self.candidates = tuple(CandidateCost(self.lengths[m].label, p * 1000.0, m in self.schedule.last_run)
                                for m, p in prices.items() if p is not None)
        floors = {m: self.model.floor(self.lengths[m]) for m in modes if m not in self.schedule.last_run}
        return self._ran(self.lengths[self.schedule.next(prices, prices | floors)])

    def _ran(self, chosen: Structure) -> Structure:
        self.current = chosen
        return chosen

    # --- what the decoder reports ------------------------------------------------------------
    def timed(self, level: str, tokens: int, seconds: float) -> None:
        """A forward at `level` ("l0": a whole proposal) that checked `tokens` took `seconds`."""
        self.model.times.record(level, tokens, seconds)

    def observe(self, boundary: str, proposed: int, accepted: int) -> None:
        """A check at `boundary` accepted `accepted` of `proposed` drafted tokens; the running
        structure's draft length at that boundary follows the +2/-1 rule, growing up to the settings'
        length (a longer one runs only where the model prices it cheaper). A draft shorter than asked
        (an n-gram lookup that found fewer tokens) counts as rejected where it stopped: the model
        prices yield per length asked."""
        s = self.current  # what this cycle runs; the rule moves the mode's next lengths
        field = LENGTH_OF.get((s.mode, boundary)) if s is not None else None
        asked = getattr(s, field) if field is not None else proposed
        self.model.observe(boundary, max(proposed, asked) if boundary.startswith("l0") else proposed, accepted)
        if field is not None and s.mode in self.lengths:
            rule = self.lengths[s.mode]
            length = next_length(getattr(rule, field), asked, proposed, accepted, self._ceiling[field])
            self.lengths[s.mode] = dataclasses.replace(rule, **{field: length})

    def realized(self, s: Structure, seconds: float, tokens: int, **_) -> None:
        """A cycle of `s` took `seconds` of wall time and yielded `tokens`."""
        self.model.realized(s, seconds)

    def observe_novel(self, novel: int, emitted: int) -> None:
        """(Tokens new to L1's vocabulary subset: priced through the realized ratio, not apart.)"""
