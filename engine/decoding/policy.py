"""The `auto` policy: which level structure (ar, draft-only, retrieval-only, triforce) and which
gammas to run next, chosen online by expected tokens per second.

Inputs, all measured in this session (engine/decoding/measurements.py): seconds per forward at each
level as a function of the tokens it checks (on a CPU, checking 8 tokens costs far more than 1), and
per-boundary acceptance forgotten over ~50 cycles. A structure is scored as E(g) / cost, E(g) = 1 +
sum over k <= g of a_1 ... a_k tokens per verification, a_d the acceptance of a draft's d-th token
among the drafts that reached it (i.i.d., one a for every depth, which overprices long drafts; the
realized yield corrects it, below). L1's a leaves out
rejections at tokens new to its vocabulary subset (each joins it) and is scaled by the share of new
tokens instead (Novelty).

Exploration is bounded: a structure not yet measured is tried for EXPLORE_CYCLES verification
cycles, once per session, and only while its optimistic score is within EXPLORE_MARGIN of the best
(one under way in this turn: while its score with its cycles' time but not their yield is).
The choice is re-scored at each turn, whenever an acceptance estimate moves by SHIFT, and at least
every RESCORE_EVERY cycles, backing off to RESCORE_MAX while scorings agree (rescore.py); it
changes only between cycles; a switch needs a SWITCH_GAIN advantage, and leaving ar a
SPECULATION_GAIN one (MEASURED_GAIN once the structure's own cycles have corrected its prediction);
a running structure so corrected stays until ar is predicted cheaper (STAY_ON_MEASURED).
The draft length kept for the choice (the running one, the settings', or at a stale check's price a
fresh length's: size_retime.kept_length) must be priced under ar too, else ar runs, or one cycle of
the model's best times its stale check (KEPT_UNDER_AR), so a stand-in dearer than ar never keeps
running beside it.
An L1 structure is explored with drafts of the settings' γ2 tokens, fewer where such a check costs
over EXPLORE_CHECK one-token checks. Every cycle's output is an exact sample whatever structure ran
it, so switching never changes what is generated.

With an n-gram drafter, draft-only is not priced by that acceptance model: the decoder logs a
lookup at every position and what of it the target then emitted, and draft-only's forwards are
replayed over the last positions (engine/decoding/lookup_replay.py), exact under greedy. It runs the
same forwards as ar, so it shares ar's wall/forward ratio (and its cycles re-time ar), and a smaller
margin (REPLAY_GAIN) decides between the two. The replay also prices rules that draft longer right
after a draft kept whole (size_retime.draft_rules).
triforce, whose L1 drafts are its n-gram drafts, is priced for text as hard as the window's: times
how much dearer that replay runs over the whole window than over the stretches it emitted (_stretch).

The model counts forwards only. What each cycle really took scales its structure's score, in two
parts (engine/decoding/realized.py): its wall time against its modelled forwards, per mode and per
structure (drafting, rollback, rebuilds, Python), and its tokens against E(a, g), per boundary and
per structure (acceptance that is not i.i.d.). After REFRESH_CYCLES
cycles the runner-up (within REFRESH_MARGIN; one needing an L1 cache that is not live only where
building it costs under PROBE_SETUP_STEPS target steps, retrieval_choice.py; one priced by the model
before ar and a replayed draft-only, whose prices keep current: size_retime.runner_up) runs one
cycle, so the estimates of a structure left long ago do not go stale (and on ar, one priced within CLOSE_MARGIN of ar
runs a cycle once CLOSE_EVERY ran without it: size_retime.close_contender). An L1 runner-up runs it with the draft
its exploration would (the settings' γ2 tokens, fewer where such a check is dear: _explored_at):
the model's best gammas for it may be short only because its long checks were timed in a slow
spell and never again, and a short probe would re-time neither them nor L1's acceptance on a
long draft. Every SIZE_RETIME cycles another draft length of the running
mode whose L2 check sat untimed runs one cycle where it would win were that check to cost what the
fresh sizes say (size_retime.py): a check timed once in a slow spell priced its length out for good.
A choice runs the running draft length (or the settings') unless another is LENGTH_GAIN cheaper.

ar is priced at its forward's quiet cost (StepCosts) times a ratio of its cycles' wall time to that
cost which believes a faster cycle mostly at once and a slower one only a little (noise on a shared
machine only adds time): a burst of load does not price ar out, while its real overhead (Python,
sampling) shows in every cycle. (A median of its last few cycles, or a ratio kept from a turn's
first cycles, would let a slow spell price ar out in favour of structures just as slow in it.)
While a speculative structure runs, one ar cycle every AR_RETIME cycles keeps that ratio
current, and moves it as the cycles since the last would have (a structure that kept running took
a slow spell in cycle by cycle, so ar, priced from before the spell, looked cheap: realized.settle).
The speculative structures' time is filtered the same way (one estimator for every mode,
so that noise does not favour the one read near its quiet cost); their yield varies with
acceptance, which must be averaged, not filtered, and is kept as decayed sums. A probe cycle (ar
re-timed, the runner-up refreshed) does not become the incumbent: the next choice weighs the structure it interrupted,
so a probe cannot keep itself running by SWITCH_GAIN.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.decoding.lookup_replay import LOOKUP_TOKENS, LookupLog
from engine.decoding.measurements import Acceptance, Novelty, StepCosts
from engine.decoding.policy_inputs import CostInputs
from engine.decoding.realized import OUTLIER, Realized, settle
from engine.decoding.rescore import AR_RETIME, RESCORE_EVERY, RescoreSchedule
from engine.decoding.retrieval_choice import MAX_GAMMA2, RetrievalChoices
from engine.decoding.size_retime import SizeRetimes, SizeRetimeState, draft_rules
from engine.decoding.structure import Structure
from engine.events import CandidateCost
from engine.settings import MAX_DRAFT, DecodeSettings, Mode

EXPLORE_CYCLES = 3
EXPLORE_MARGIN = 1.5  # explore an untried structure if its optimistic ms/token <= 1.5x the best's
SWITCH_GAIN = 0.92  # switch only if the best predicts <= 92% of the current structure's ms/token
# leave ar only for a structure predicted at <= 90% of its ms/token: ar's cost is timed directly,
# while the others' are predictions, which run optimistic until their own cycles correct them
SPECULATION_GAIN = 0.9
# ... and at <= 95 % once REALIZED_CYCLES of its mode's own cycles (its exploration's count) corrected its prediction
# (the optimism is then corrected, so 10 % would keep ar where a structure is truly ~10 % cheaper)
MEASURED_GAIN = 0.95
# STAY_ON_MEASURED: a measured running structure stays until ar is cheaper (else no band to stay in, and it flaps)
REALIZED_CYCLES = 3
MAX_GAMMA1 = 8
GROW = 2  # a forward may check at most 2 tokens more than the largest one timed at its level
PRIOR_ACCEPTANCE = {"l0_l1": 0.6, "l1_l2": 0.85, "l0_l2": 0.5}
REFRESH_MARGIN = 1.3  # the runner-up refreshed (every REFRESH_CYCLES cycles at first) if predicted within 1.3x of the best
SURPRISE = 1.5  # a cycle over 1.5x its predicted ms/token (a replayed draft-only one: its check's time) re-scores at once
# ar against a draft-only priced by replaying its lookups (engine/decoding/lookup_replay.py): both
# run the same forwards, timed in one table, and the replay knows which drafts held, so the margin
# only guards against noise in the step costs (the model-priced structures need SPECULATION_GAIN)
REPLAY_GAIN = 0.97


@dataclass
class Policy(RetrievalChoices, SizeRetimes, RescoreSchedule, CostInputs):
    """Chooses the structure for the next verification cycle from `StepCosts` and `Acceptance`."""

    costs: StepCosts = field(default_factory=StepCosts)
    acceptance: dict[str, Acceptance] = field(
        default_factory=lambda: {k: Acceptance(v) for k, v in PRIOR_ACCEPTANCE.items()})
    tried: dict[Mode, int] = field(default_factory=dict)  # cycles run per structure (bounds exploration)
    current: Structure | None = None
    candidates: tuple[CandidateCost, ...] = ()
    switches: int = 0
    ratios: Realized = field(default_factory=Realized)  # what cycles really took against the model
    forced: list[Structure] | None = None  # tests: a script of structures to run, one per cycle
    _memo: dict = field(default_factory=dict, repr=False)  # inputs of the current choice
    _settled: bool = False  # the last scoring chose without exploring
    _since_score: int = 0  # cycles since the last scoring (rescore.py)
    _rescore_every: int = RESCORE_EVERY  # cycles between scorings now, backing off while they agree
    _score_wait: int = RESCORE_EVERY  # ... bounded by the first probe to come due
    _since_refresh: int = 0  # cycles since the runner-up last ran
    _scored_rates: dict = field(default_factory=dict)  # acceptance at the last scoring
    _budget_moved: int = 0  # +1 / -1 once choose_budget grew / shrank the budget
    _ar_ratio: float | None = None  # ar cycles' wall time / modelled time, noise-robust
    _cycles: int = 0  # cycles realized
    _ar_at: int = 0  # _cycles when _ar_ratio last moved
    _since_ar: int = 0  # cycles since ar last ran
    _sizes: SizeRetimeState = field(default_factory=SizeRetimeState)  # re-times of other draft lengths
    _exploring: Mode | None = None  # the mode whose exploration is under way this turn
    _incumbent: Structure | None = None  # what a probe cycle interrupted (None: the current structure)
    lookups: LookupLog = field(default_factory=LookupLog)  # n-gram lookups at every position, for the replay
    novelty: Novelty = field(default_factory=Novelty)  # the share of new tokens L1's vocabulary lacked
    setup_s: float | None = None  # seconds to build the retrieval cache for a prompt (moving average)
    _l1_live: bool = False  # the retrieval cache is built for this turn's prompt (up front, or an L1 structure ran)
    _stretches: dict = field(default_factory=dict)  # mode -> how much harder the window's text is than its stretches

    @property
    def running(self) -> Structure | None:
        """The structure auto is running: the current one, or the one a probe cycle interrupted (an answer
        that ended on ar's re-timing cycle ran retrieval-only: the next turn builds its cache up front)."""
        return self._incumbent or self.current

    def new_turn(self) -> None:
        """A new prompt: score afresh at the next cycle (an L1 structure must first build its cache)."""
        self._settled = False
        self._l1_live = False
        self._exploring = None  # an exploration is one run of cycles within a turn

    def observe(self, boundary: str, proposed: int, accepted: int) -> None:
        self.acceptance[boundary].add(proposed, accepted)

    def observe_novel(self, novel: int, emitted: int) -> None:
        """`novel` of the `emitted` tokens of a cycle were outside L1's vocabulary subset when they came."""
        self.novelty.add(novel, emitted)

    def choose(self, settings: DecodeSettings, has_l0: bool, context_tokens: int,
               budget: int | None = None, remaining: int | None = None) -> Structure:
        """The structure for the next cycle (`settings.mode` fixed: that mode, gammas tuned if
        settings.auto). `budget`: the retrieval budget (None: the settings'); `remaining`: tokens
        this answer may still yield (None: unknown)."""
        mode = Mode.of(settings.mode)
        self._memo.clear()
        if self.forced:
            chosen = self.forced.pop(0)
            self.forced.append(chosen)
            return self._ran(chosen)
        if mode is not Mode.AUTO and not settings.auto:  # a fixed mode leaves the policy as it was:
            return Structure(mode, settings.gamma1, settings.gamma2)  # (the bench runs ar between auto's answers)
        modes = [mode] if mode is not Mode.AUTO else self._auto_modes(settings, has_l0, context_tokens, budget)
        if not has_l0 and mode in (Mode.DRAFT_ONLY,):
            return self._ran(Structure(mode, settings.gamma1, settings.gamma2))
        if self.scoring_skipped(modes, {b: a.rate for b, a in self.acceptance.items()}):
            return self._ran(self.current)  # nothing moved: scoring ~50 structures again is wasted work
        scored = [self._best_of(m, settings) for m in modes]
        scored = [(ms + self._switch_cost(s, remaining), s) for ms, s in scored if ms is not None]
        if not scored:  # nothing timed yet: one plain step measures the target
            return self._ran(Structure(Mode.AR) if mode is Mode.AUTO else Structure(mode, settings.gamma1, settings.gamma2))
        self.candidates = tuple(CandidateCost(s.label, ms * 1000.0, self._explored(s.mode)) for ms, s in scored)
        best_ms, best = min(scored, key=lambda x: x[0])
        self._settled = False
        # bounded exploration of structures never measured, the one under way this turn first: it
        # runs its EXPLORE_CYCLES cycles unless its time (not its yield) puts it out of the margin
        for ms, s in sorted(scored, key=lambda x: x[1].mode is not self._exploring):
            if self.tried.get(s.mode, 0) < EXPLORE_CYCLES and not self._explored(s.mode) and (
                    ms <= EXPLORE_MARGIN * best_ms
                    or s.mode is self._exploring and self._unyielded(s) <= EXPLORE_MARGIN * best_ms):
                self._close_explorations(but=s.mode)  # (s.mode: the exploration under way)
                return self._ran(self._explored_at(s, settings, remaining))
        self._close_explorations()
        self._settled = True
        if (Mode.AR in modes and self.current is not None and self.current.mode is not Mode.AR
                and self._since_ar >= AR_RETIME):
            self._settled = False  # re-time ar next to the structure it competes with: one token
            return self._probe(Structure(Mode.AR))
        l1_ok = self._l1_live or self._setup_cheap()  # no dear L1 cache built for one cycle
        close = self.close_contender(scored, self.running, l1_ok)  # (a stale price near the running one's)
        if close is not None or self.refresh_time():  # re-measure the runner-up once: estimates of a
            self._since_refresh = 0  # structure left long ago go stale (costs move with the context)
            runner_up = close or self.runner_up(  # (the others backed off: size_retime.py)
                [s for _, s in scored if (self.current is None or s.mode is not self.current.mode)
                 and (l1_ok or not s.mode.uses_l1) and self.refresh_due(s.mode)], REFRESH_MARGIN * best_ms)
            if runner_up is not None:  # an L1 one at a long draft, as it was explored: a short
                self._settled = False  # one would re-time neither its long checks nor L1's acceptance
                if close is None:
                    self.refreshed(runner_up.mode)
                return self._probe(self._explored_at(runner_up, settings, remaining))
        incumbent = self.running  # (_ran clears _incumbent below)
        if incumbent is not None and incumbent.mode in modes:
            now = next((ms for ms, s in scored if s.mode is incumbent.mode), None)
            if now is not None and best.mode is not incumbent.mode and best_ms > self._gain(best, incumbent) * now:
                best = next(s for ms, s in scored if s.mode is incumbent.mode)  # not worth a switch
        plain = next((ms for ms, s in scored if s.mode is Mode.AR), None)
        predicted = {s: ms for ms, s in scored}
        stay = incumbent is not None and best.mode is incumbent.mode and self.ratios.cycles(best.mode) >= REALIZED_CYCLES
        if plain is not None and best.mode is not Mode.AR and predicted[best] > (
                1.0 if stay else self._gain(best, Structure(Mode.AR))) * plain:  # (STAY_ON_MEASURED)
            best = Structure(Mode.AR)  # a predicted gain smaller than the model's own error
        kept = self.kept_length(best, incumbent, settings)  # the settings' or the running draft length
        if plain and kept != best and (self.seconds_per_token(kept) or 0.0) + self._switch_cost(kept, remaining) > plain:
            probe = self.untimed_probe(l1_ok)  # (KEPT_UNDER_AR) the length kept is priced over ar: the
            if probe is not None:  # model's best, priced off a stale check, runs one cycle to time it
                self._settled = False
                return self._probe(probe)
            kept = Structure(Mode.AR)
        best = kept
        if incumbent is not None and best.mode is incumbent.mode:  # unless another is clearly cheaper;
            retime = self.size_probe(best)  # staying on a mode, a length priced off a stale check runs once
            if retime is not None:
                self._settled = False
                return self._probe(retime)
        self.refresh_won(best.mode)
        self._ran(best)
        self.scored(best, incumbent)  # (rescore.py: the wait till the next scoring)
        return best

    def _auto_modes(self, settings: DecodeSettings, has_l0: bool, context_tokens: int, budget: int | None) -> list[Mode]:
        """The modes auto weighs: those with L0 only given a drafter, with L1 only where it can pay."""
        pays = self.retrieval_pays(budget or settings.budget, context_tokens)
        return [m for m in (Mode.AR, Mode.DRAFT_ONLY, Mode.RETRIEVAL_ONLY, Mode.TRIFORCE)
                if (has_l0 or not m.uses_l0) and (pays or not m.uses_l1)]

    def _gain(self, best: Structure, current: Structure) -> float:
        """The predicted share of `current`'s ms/token that `best` must reach to replace it."""
        if {best.mode, current.mode} == {Mode.AR, Mode.DRAFT_ONLY} and self.lookups.ready():
            return REPLAY_GAIN
        if current.mode is not Mode.AR:
            return SWITCH_GAIN
        return MEASURED_GAIN if self.ratios.cycles(best.mode) >= REALIZED_CYCLES else SPECULATION_GAIN

    def _close_explorations(self, but: Mode | None = None) -> None:
        """A structure's exploration is one run of consecutive cycles: once a scoring leaves it
        (out of EXPLORE_MARGIN, or another structure's turn), it is over for the session, and the
        structure is judged by its measurements and the model from then on. (Else a new turn could
        re-open it, rebuilding a retrieval cache for a single leftover cycle.)"""
        for mode, cycles in self.tried.items():
            if mode is not but and 0 < cycles < EXPLORE_CYCLES:
                self.tried[mode] = EXPLORE_CYCLES
        self._exploring = but  # the one under way, if any

    def _unyielded(self, s: Structure) -> float:
        """`s`'s predicted seconds per token with its cycles' time taken in but not their yield. An
        exploration's first cycles come at an answer's start, where L1's cache and vocabulary are
        not yet fitted to it, and their rejections already weigh in the acceptance; counting them
        twice would close an exploration after one cycle and price L1 out for the session."""
        seconds, tokens = self.cycle_cost(s)
        return seconds * self.ratios.time_ratio(s) * self.ratios.work_ratio(s) / tokens

    def _probe(self, chosen: Structure) -> Structure:
        """Run `chosen` for one cycle, to measure it; the next choice weighs what it interrupted."""
        incumbent = self.running
        self._ran(chosen)
        self._incumbent = incumbent
        return chosen

    def _ran(self, chosen: Structure) -> Structure:
        self._incumbent = None
        self._since_refresh += 1
        self._sizes.since += 1
        times_ar = chosen.mode is Mode.AR or (chosen.mode is Mode.DRAFT_ONLY and self.lookups.ready())
        self._since_ar = 0 if times_ar else self._since_ar + 1  # (a replayed draft-only cycle re-times ar too)
        if self.current is not None and chosen.mode is not self.current.mode:
            self.switches += 1
        self.current = chosen
        self._l1_live = self._l1_live or chosen.mode.uses_l1
        self.tried[chosen.mode] = self.tried.get(chosen.mode, 0) + 1
        return chosen

    def _explored(self, mode: Mode) -> bool:
        """Has `mode` been measured enough to trust its score?"""
        acc = self.acceptance
        if mode is Mode.AR:
            return self.costs.measured("l2")
        if mode is Mode.DRAFT_ONLY:
            return self.lookups.ready() or acc["l0_l2"].known or self.tried.get(mode, 0) >= EXPLORE_CYCLES
        if mode is Mode.RETRIEVAL_ONLY:  # all its exploration cycles, even once L1's acceptance is known:
            # one long draft makes it known, and one unlucky stretch must not price L1 out for the
            # session
            return self.costs.measured("l1") and self.tried.get(mode, 0) >= EXPLORE_CYCLES
        return (self.costs.measured("l1") and acc["l1_l2"].known and acc["l0_l1"].known) or \
            self.tried.get(mode, 0) >= EXPLORE_CYCLES

    # --- the cost model (its inputs, memoized per choice: policy_inputs.py) --------------------
    def seconds_per_token(self, s: Structure, corrected: bool = True) -> float | None:
        """Predicted seconds per generated token of structure `s`, or None before any L2 timing:
        its cycle cost over the tokens a cycle yields, corrected by what its cycles really took."""
        if s.mode is Mode.DRAFT_ONLY and corrected:  # (the ~18 lengths of each scoring: cycle_cost's replay, read once)
            replayed = self._replay(s.gamma1, s.after_full) if self._c("l2", 1) is not None else None
            if replayed is not None:  # the same forwards as ar's, the same overhead
                seconds, tokens, cycles = replayed
                return seconds / cycles * (self._ar_ratio or 1.0) / (tokens / cycles)
        cycle = self.cycle_cost(s)
        if cycle is None:
            return None
        seconds, tokens = cycle
        if s.mode is Mode.AR and corrected and self._ar_ratio is not None:
            return seconds * self._ar_ratio
        stretch = self._stretch(s.mode) if s.mode is Mode.TRIFORCE else 1.0  # (the model's inputs, corrected or not)
        return seconds * (self.ratios.ratio(s) if corrected else 1.0) * stretch / tokens

    def cycle_cost(self, s: Structure) -> tuple[float, float] | None:
        """(seconds of the forwards one cycle of `s` runs, tokens it yields), from the timed levels."""
        c = self._c
        one = c("l2", 1)
        if one is None:
            return None
        if s.mode is Mode.AR:
            return one, 1.0
        if s.mode is Mode.DRAFT_ONLY:
            replayed = self._replay(s.gamma1, s.after_full)
            if replayed is not None:
                seconds, tokens, cycles = replayed
                return seconds / cycles, tokens / cycles
            h, g = self._hit(), s.gamma1
            tokens = h * self._expected("l0_l2", g) + (1 - h)
            return c("l0", g) + h * c("l2", g + 1) + (1 - h) * one, tokens
        g2 = s.gamma2
        if s.mode is Mode.RETRIEVAL_ONLY:
            return g2 * c("l1", 1) + c("l2", g2 + 1), self._expected("l1_l2", g2)
        return g2 * self._l1_per_token(s.gamma1) + c("l2", g2 + 1), self._expected("l1_l2", g2)

    def _l1_per_token_fresh(self, g1: int) -> float:
        """triforce's L1 level: seconds of drafting and L1 forwards per token it hands to L2, with
        L0 drafting g1 tokens per L1 forward. It does not depend on g2."""
        h = self._hit()
        per_l1_forward = h * self._expected("l0_l1", g1) + (1 - h)
        return (self._c("l0", g1) + h * self._c("l1", g1 + 1) + (1 - h) * self._c("l1", 1)) / per_l1_forward

    def realized(self, s: Structure, seconds: float, tokens: int, checked: int = 0,
                 forwards: Sequence[tuple[str, int]] = ()) -> None:
        """A cycle of `s` took `seconds` of wall time, ran `forwards` ((level, tokens checked) each;
        empty: unknown, taken as the model's) and yielded `tokens` tokens. Learn how far that is
        from the model (engine/decoding/realized.py): its time against the model's seconds for the
        forwards it ran (drafting, rollback, retrieval rebuilds, Python), those forwards against
        the ones the model expected, and its tokens against E(a, g) (acceptance that is not i.i.d.:
        n-gram drafts are accepted whole or not at all)."""
        self._memo.clear()
        self._cycles += 1
        believed, per = self.seconds_per_token(s), tokens
        if s.mode is Mode.DRAFT_ONLY and checked and (checked == 1 or self.lookups.ready()):
            # a plain step (its lookup found nothing: read against draft-only's ms/token, it would look
            # like a miss), or a replayed cycle, whose yield is its lookup's,
            # priced over the replay's window (its yield is no surprise): judged by time
            believed, per = (self._c("l2", checked) or 0.0) * (self._ar_ratio or 1.0) or None, 1
        if believed is not None and tokens >= 1 and seconds > SURPRISE * believed * per:
            self.rescore_soon()  # do not wait RESCORE_EVERY cycles on a structure this far off
            # from its prediction: every cycle until the re-score runs at the surprising price
        cycle = self.cycle_cost(s)
        if cycle is None or tokens < 1:
            return
        model, expected = cycle
        plain = None
        if s.mode is Mode.AR and tokens == 1:
            plain = model
        elif s.mode is Mode.DRAFT_ONLY and checked and self.lookups.ready():
            plain = self._c("l2", checked)  # one forward, as ar's cycle: its wall time re-times ar
        if plain:
            # the step-cost table took in part of a slow spell already: one slow cycle must not
            # price ar out; the same filter as every mode's time (realized.settle),
            # a re-time standing for the cycles since the last
            self._ar_ratio = settle(self._ar_ratio, seconds / plain, self._cycles - self._ar_at)
            self._ar_at = self._cycles
        if seconds > OUTLIER * model:  # a one-off (an n-gram index built over the whole book)
            return
        ran = sum(self._c(level, n) or 0.0 for level, n in forwards) if forwards else None
        self.ratios.add(s, seconds, model, expected, tokens, ran)

    def _within_measured(self, s: Structure, l2: int, l1: int) -> bool:
        """Are the forwards `s` runs at most GROW tokens larger than the largest timed at their level
        (`l2`, `l1`: those sizes)? Larger ones rest on extrapolation, which misjudged long checks both
        ways (a line through a staircase), so gammas grow as their forwards get measured."""
        if s.mode is Mode.AR:
            return True
        if s.mode is Mode.DRAFT_ONLY:
            return s.longest_draft + 1 <= l2 + GROW
        if s.mode is Mode.RETRIEVAL_ONLY:
            return s.gamma2 + 1 <= l2 + GROW
        return s.gamma2 + 1 <= l2 + GROW and s.gamma1 + 1 <= l1 + GROW

    def _lengths(self, s: Structure) -> list[Structure]:
        """`s`'s mode at each draft length auto weighs for the L2 check (draft-only: γ1, and the
        rules that draft longer right after a draft kept whole once the replay prices them:
        size_retime.draft_rules; retrieval-only and triforce: γ2, the other as `s`'s)."""
        if s.mode is Mode.DRAFT_ONLY:
            if self.lookups.ready():
                return [Structure(s.mode, g, s.gamma2) for g in range(1, LOOKUP_TOKENS + 1)] + draft_rules(s)
            return [Structure(s.mode, g, s.gamma2) for g in range(1, min(MAX_DRAFT, 2 * MAX_GAMMA1) + 1)]
        return [Structure(s.mode, s.gamma1, g) for g in range(1, MAX_GAMMA2 + 1)]

    def _best_of(self, mode: Mode, settings: DecodeSettings) -> tuple[float | None, Structure]:
        """The best gammas for `mode` and their predicted seconds per token."""
        if mode is Mode.AR:
            grid = [Structure(Mode.AR)]
        elif mode is not Mode.TRIFORCE:
            grid = self._lengths(Structure(mode, settings.gamma1, settings.gamma2))
        l2 = self.costs.largest("l2")
        l1 = self.costs.largest("l1") or l2  # an untimed L1 is priced from L2's timings
        if mode is Mode.TRIFORCE:  # a cycle costs g2 x (L1's seconds per token, set by g1) + L2's
            # check, so the model's best g1 is the same for every g2: 8 + 12 scores, not 8 x 12
            # (scoring every pair costs a noticeable share of a short token's time, every few cycles)
            if self._c("l1", 1) is None:
                return None, Structure(mode, 1, 1)
            g1s = [g for g in range(1, MAX_GAMMA1 + 1) if self._within_measured(Structure(mode, g, 1), l2, l1)]
            g1 = min(g1s or [1], key=self._l1_per_token)
            grid = [Structure(mode, g1, g2) for g2 in range(1, MAX_GAMMA2 + 1)]
            if self.current is not None and self.current.mode is mode and self.current.gamma1 != g1:
                grid += [Structure(mode, self.current.gamma1, g2) for g2 in range(1, MAX_GAMMA2 + 1)]
        grid = [s for s in grid if self._within_measured(s, l2, l1)] or grid[:1]
        scored = [(self.seconds_per_token(s), s) for s in grid]
        scored = [(t, s) for t, s in scored if t is not None]
        if not scored:
            return None, grid[0]
        return min(scored, key=lambda x: x[0])
