"""A/B of auto's policy against the one before it, interleaved in one process, with the fixed modes.

Usage (from the repo root):
    OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. .venv/bin/python docs/notes/policy_ab.py CONTEXTS WORKLOADS REPEATS METHODS [NEW_TOKENS]
e.g. docs/notes/policy_ab.py 1024,2048,4096,8000 continue,qa 5 ar,auto,auto-ratio,auto-old,triforce,draft-only,retrieval-only

Methods: our fixed modes, `auto` (the shipped policy), `auto-prev` (the policy before the
fifteenth pass: slow samples taken whole by the step costs and ar's ratio, L1 structures scored at
any retrieval-cache share, no charge for building the retrieval cache on a switch, all 96 triforce
pairs scored; its step costs take a new size's first sample whole; only the faster replay loop is auto's), `auto-noreplay` (the shipped policy with
draft-only priced by the acceptance model, as before the fourteenth pass: its lookup log never
counts as ready), `auto-censored` (the shipped policy with
the shadow lookups of before the thirteenth pass: checked against the cycle's own tokens only),
`auto-reopen` (the shipped policy with an interrupted exploration re-opened by a later scoring, as
before the seventeenth pass), `auto-combined` (the shipped policy with one wall/model ratio per mode and
structure, a cycle's wall time over the predicted seconds per token times the tokens it yielded, as
before the twenty-sixth pass; engine/decoding/realized.py keeps time and yield apart), `auto-mean`
(the twenty-sixth pass's policy: the speculative modes' time ratios as decayed means, noise
averaged in, and 6 cycles of a mode before the 5 % bar to leave ar), `auto-onestep` (the
twenty-seventh pass's policy: a time ratio's filter moves one step per sample, however long its
mode, structure or ar sat idle before it), `auto-shortrefresh` (the twenty-eighth pass's policy: an L1
runner-up refreshed at the model's best gammas, not the settings' γ2; a faster sample of a stale
step-cost size believed half of the way, not whole),
`auto-s4` (ar priced from its step-cost
table and its mode's wall/model ratio, never re-timed beside a speculative structure: the policy
of 2026-11-30 in that respect), `auto-rt` (re-timed like auto, priced like auto-s4), `auto-min` (re-timed, priced at the lower of auto's price and auto-median3's), `auto-median3` (ar priced at the
median wall time of its last 3 cycles and a probe cycle kept as the incumbent: the policy before 658e597), `auto-ratio` (the previous cost model and no
shadow lookups, with the per-structure wall/model ratio) and `auto-old` (the policy before
2026-11-30 evening: a least-squares line through the measured step costs, gammas not bounded by
the sizes timed, one wall/model ratio per mode, no shadow lookups). Each auto variant keeps its
own Policy object across repeats, as one user's session would; they share the prefilled session.
Prints per cell each method's median ms/token, its runs, whether its tokens equal ar's, the
structure each auto answer ran, and each auto variant's final predictions.
"""
import collections
import os
import statistics
import sys
from dataclasses import dataclass, field

import torch

from engine.cli.chat_cmd import default_budget
from engine.decoding import measurements as M
from engine.decoding import policy as P
from engine.decoding.drafters import common_prefix
from engine.decoding.lookup_replay import LookupLog
from engine.decoding.realized import RATIO_PRIOR_CYCLES, Realized, clip
from engine.decoding.session import ChatSession
from engine.model.loading import load_folder
from engine.settings import DecodeSettings
from engine.store.models import resolve_model
from engine.tools.bench import _run_ours, build_prompt
from engine.tools.sample_text import sample_text


class LineCosts(P.StepCosts):
    """The previous estimate: one least-squares line through every measured size."""

    def estimate(self, level, tokens):
        row = self.table[level]
        if not row:
            return None
        if tokens in row:
            return row[tokens]
        points = list(row.items())
        if len(points) == 1:
            n0, t0 = points[0]
            mean_n, mean_t, slope = n0, t0, M.PRIOR_SLOPE * t0 / (1.0 + M.PRIOR_SLOPE * (n0 - 1))
        else:
            mean_n = sum(n for n, _ in points) / len(points)
            mean_t = sum(t for _, t in points) / len(points)
            var = sum((n - mean_n) ** 2 for n, _ in points)
            slope = max(0.0, sum((n - mean_n) * (t - mean_t) for n, t in points) / var)
        return max(1e-6, mean_t + slope * (tokens - mean_n))


class RatioPolicy(P.Policy):
    """Gammas not bounded by the sizes timed (with LineCosts: the previous cost model)."""

    def _within_measured(self, s, l2, l1):
        return True


class UnreadyLog(LookupLog):
    """A lookup log that never has enough positions: draft-only priced by the acceptance model."""

    def ready(self):
        return False


class S4Policy(P.Policy):
    """ar priced from its step-cost table and its mode's decayed wall/model ratio, and never
    re-timed beside a speculative structure (as at c0a7149)."""

    def _ran(self, chosen):
        out = super()._ran(chosen)
        self._since_ar = 0
        return out

    def realized(self, s, seconds, tokens):
        super().realized(s, seconds, tokens)
        self._ar_ratio = None


class RetimedTablePolicy(P.Policy):
    """ar re-timed every AR_RETIME cycles beside a speculative structure, but priced as auto-s4
    prices it (its step-cost table times its mode's decayed wall/model ratio)."""

    def realized(self, s, seconds, tokens):
        super().realized(s, seconds, tokens)
        self._ar_ratio = None


class Median3Policy(P.Policy):
    """ar priced at the median wall time of its last 3 cycles, a probe cycle kept as the incumbent:
    the policy before 658e597."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._walls = collections.deque(maxlen=3)

    def seconds_per_token(self, s, corrected=True):
        if s.mode is P.Mode.AR and corrected and self._walls and self.cycle_cost(s) is not None:
            return statistics.median(self._walls)
        return super().seconds_per_token(s, corrected)

    def realized(self, s, seconds, tokens):
        super().realized(s, seconds, tokens)
        if s.mode is P.Mode.AR and tokens == 1:
            self._walls.append(seconds)

    def _probe(self, chosen):
        return self._ran(chosen)


class LowerPricePolicy(Median3Policy):
    """Re-timed like auto, with ar priced at the lower of its last 3 cycles' median and auto's price."""

    def seconds_per_token(self, s, corrected=True):
        got = super().seconds_per_token(s, corrected)
        if got is None or s.mode is not P.Mode.AR or not corrected:
            return got
        return min(got, P.Policy.seconds_per_token(self, s, corrected))


class PrevCosts(P.StepCosts):
    """The step costs before the fifteenth pass: a slower sample, and a new size's first one, counted whole."""

    def record(self, level, tokens, seconds):
        clip, M.SLOW_CLIP = M.SLOW_CLIP, float("inf")
        try:
            super().record(level, tokens, seconds)
        finally:
            M.SLOW_CLIP = clip


class PrevPolicy(P.Policy):
    """The policy before the fifteenth pass: ar's ratio takes a slow cycle whole (no AR_CLIP), L1
    structures are scored whatever share of the context the retrieval cache holds, a switch to one
    is not charged for building its cache, and triforce scores all 96 (g1, g2) pairs."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("costs", PrevCosts())
        super().__init__(*args, **kwargs)

    def realized(self, s, seconds, tokens, checked=0):
        clip, P.AR_CLIP = P.AR_CLIP, float("inf")
        try:
            super().realized(s, seconds, tokens, checked)
        finally:
            P.AR_CLIP = clip

    @staticmethod
    def retrieval_pays(budget, context_tokens):
        return True

    def _switch_cost(self, s):
        return 0.0

    def _best_of(self, mode, settings):  # triforce: every (g1, g2) pair scored (its lookup replay is auto's)
        if mode is not P.Mode.TRIFORCE:
            return super()._best_of(mode, settings)
        l2 = self.costs.largest("l2")
        l1 = self.costs.largest("l1") or l2
        grid = [P.Structure(mode, g1, g2) for g1 in range(1, P.MAX_GAMMA1 + 1) for g2 in range(1, P.MAX_GAMMA2 + 1)]
        grid = [s for s in grid if self._within_measured(s, l2, l1)] or grid[:1]
        scored = [(t, s) for t, s in ((self.seconds_per_token(s), s) for s in grid) if t is not None]
        return min(scored, key=lambda x: x[0]) if scored else (None, grid[0])


class ReopenPolicy(P.Policy):
    """Before the seventeenth pass: an interrupted exploration is re-opened by a later scoring."""

    def _close_explorations(self, but=None):
        pass


@dataclass
class MeanRealized(Realized):
    """Before the twenty-seventh pass: a mode's and a structure's time ratio as decayed means of
    wall over modelled seconds (noise averaged in), where ar's was filtered (realized.settle)."""

    means: dict = field(default_factory=dict)  # mode or structure -> [wall, model, last cycle's model]

    def add(self, s, wall, model, expected, tokens):
        for key in (s.mode, s):
            sums = self.means.setdefault(key, [0.0, 0.0, 0.0])
            sums[:] = [M.FORGET * sums[0] + wall, M.FORGET * sums[1] + model, model]
        super().add(s, wall, model, expected, tokens)

    def mode_time(self, mode):
        if mode not in self.modes:
            return min((clip(w / m) for key, (w, m, _) in self.means.items() if key in self.modes), default=1.0)
        (wall, model, _), n = self.means[mode], self.modes[mode].cycles
        return 1.0 + (clip(wall / model) - 1.0) * n / (n + RATIO_PRIOR_CYCLES)

    def ratio(self, s):
        time = self.mode_time(s.mode)
        if s in self.means:  # the mean over its own cycles, weighed against one cycle at the mode's ratio
            wall, model, last = self.means[s]
            time = clip((wall + time * last) / (model + last))
        return clip(time * self.yield_ratio(s))


class MeanPolicy(P.Policy):
    """The policy of the twenty-sixth pass: MeanRealized, and the 5 % bar to leave ar only after 6
    cycles of the mode (3 now)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("ratios", MeanRealized())
        super().__init__(*args, **kwargs)

    def _gain(self, best, current):
        if current.mode is P.Mode.AR and not ({best.mode, current.mode} == {P.Mode.AR, P.Mode.DRAFT_ONLY}
                                              and self.lookups.ready()):
            return P.MEASURED_GAIN if self.ratios.cycles(best.mode) >= 6 else P.SPECULATION_GAIN
        return super()._gain(best, current)


class CombinedRatios(MeanRealized):
    """Before the twenty-sixth pass: one wall/model ratio, a cycle's wall time over the predicted
    seconds per token times the tokens it yielded, per mode and per structure (no yield pooled
    per boundary)."""

    def add(self, s, wall, model, expected, tokens):
        per_token = model / expected
        super().add(s, wall, per_token * tokens, tokens, tokens)  # yield ratio 1: all in the time


class CombinedPolicy(P.Policy):
    """The policy of the twenty-fifth pass: one combined ratio, and a cycle over OUTLIER x the
    predicted seconds per token times its tokens dropped as a one-off."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("ratios", CombinedRatios())
        super().__init__(*args, **kwargs)

    def realized(self, s, seconds, tokens, checked=0):
        predicted = self.seconds_per_token(s, corrected=False)
        if predicted is not None and tokens >= 1 and seconds > P.OUTLIER * predicted * tokens:
            self._memo.clear()
            return
        super().realized(s, seconds, tokens, checked)


class OldPolicy(RatioPolicy):
    """...and one wall/model ratio per mode."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("ratios", CombinedRatios())
        super().__init__(*args, **kwargs)

    def seconds_per_token(self, s, corrected=True):
        self.ratios.structures.clear()
        return super().seconds_per_token(s, corrected)


class OneStepRealized(Realized):
    """Before the twenty-eighth pass: every sample one step of realized.settle."""

    def add(self, s, wall, model, expected, tokens):
        for table in (self.modes, self.structures, self.boundaries):
            for sums in table.values():
                sums.last_cycle = self.count  # as if every key had run the cycle before
        super().add(s, wall, model, expected, tokens)


class OneStepPolicy(P.Policy):
    """The twenty-seventh pass's policy: OneStepRealized, and ar's ratio one step per re-time."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("ratios", OneStepRealized())
        super().__init__(*args, **kwargs)

    def realized(self, s, seconds, tokens, checked=0):
        self._ar_at = self._cycles  # (realized counts this cycle first: ar's idle reads 1)
        super().realized(s, seconds, tokens, checked)


class HalfCosts(P.StepCosts):
    """The step costs before the twenty-ninth pass: a faster sample moves a size half of the way even
    after it sat stale for STALE forwards (now: believed whole)."""

    def record(self, level, tokens, seconds):
        row = self.table[level]
        if tokens in row and self._stale(level, tokens):
            now = self._now(level, tokens)  # made fresh at its current price: the blend then starts there
            if seconds < now:
                row[tokens] = now
                ref = min(row)
                self._timed[level][tokens] = (self._count[level], ref, now if ref == tokens else self._now(level, ref))
        super().record(level, tokens, seconds)


class ShortRefreshPolicy(P.Policy):
    """The twenty-eighth pass's policy: an L1 runner-up refreshed at the model's best gammas (now: at
    the settings' γ2, as explored), with HalfCosts."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("costs", HalfCosts())
        super().__init__(*args, **kwargs)

    def choose(self, settings, *args, **kwargs):
        self._ab_settings = settings
        return super().choose(settings, *args, **kwargs)

    def _probe(self, chosen):
        if chosen.mode.uses_l1:
            chosen = self._best_of(chosen.mode, self._ab_settings)[1]
        return super()._probe(chosen)


def main() -> None:
    contexts = [int(x) for x in sys.argv[1].split(",")]
    workloads, repeats, methods = sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4].split(",")
    torch.set_num_threads(2)
    model = load_folder(resolve_model("bundled"))
    new_tokens = int(sys.argv[5]) if len(sys.argv) > 5 else 32
    base = DecodeSettings().replace(max_new_tokens=new_tokens, stop=(), ignore_eos=True)
    for workload in workloads:
        for context in contexts:
            prompt = build_prompt(model, sample_text(), context, workload)
            base = base.replace(budget=default_budget(context, base.chunk))  # the bench's retrieval budget
            session = ChatSession(model, base.replace(mode="ar"), draft="ngram", capacity=len(prompt) + new_tokens + 64)
            policies = {"auto": P.Policy(), "auto-prev": PrevPolicy(), "auto-noreplay": P.Policy(lookups=UnreadyLog()), "auto-censored": P.Policy(), "auto-s4": S4Policy(), "auto-rt": RetimedTablePolicy(), "auto-min": LowerPricePolicy(), "auto-median3": Median3Policy(), "auto-old": OldPolicy(costs=LineCosts()),
                        "auto-ratio": RatioPolicy(costs=LineCosts()), "auto-reopen": ReopenPolicy(), "auto-combined": CombinedPolicy(),
                        "auto-mean": MeanPolicy(), "auto-onestep": OneStepPolicy(),
                        "auto-shortrefresh": ShortRefreshPolicy()}
            shadow = session.decoder._shadow_l0
            dec = session.decoder

            def censored_shadow(seq, emitted, lookup=None):  # the shadow lookups before the thirteenth pass
                draft = dec.drafter.propose(seq, dec.SHADOW_TOKENS, dec.settings.sampling, None, dec.answer_start)
                dec.policy.observe("l0_l2", min(len(draft.tokens), len(emitted)), common_prefix(draft.tokens, emitted))
            runs, tokens, structures = collections.defaultdict(list), {}, collections.defaultdict(list)
            for _ in range(repeats):
                for method in methods:
                    if method in policies:
                        session.decoder.policy = policies[method]
                        session.decoder._shadow_l0 = shadow if method in ("auto", "auto-prev", "auto-noreplay", "auto-s4", "auto-rt", "auto-min", "auto-median3", "auto-reopen", "auto-combined", "auto-mean", "auto-onestep", "auto-shortrefresh") \
                            else censored_shadow if method == "auto-censored" else (lambda *a: None)
                    mode = "auto" if method.startswith("auto") else method
                    got, ms, _, metrics = _run_ours(session, prompt, base.replace(mode=mode))
                    runs[method].append(ms)
                    tokens[method] = got
                    if method in policies:
                        structures[method].append(metrics.structure)
            print(f"== {workload} {context} load {os.getloadavg()[0]:.1f}")
            for method in methods:
                print(f"  {method:15s} median {statistics.median(runs[method]):6.1f}  "
                      f"runs {[round(x, 1) for x in runs[method]]}  same_as_ar {tokens[method] == tokens['ar']}  "
                      f"{structures.get(method, '')}")
            for name in (m for m in methods if m in policies):
                print("  ", name, "cands", [(c.structure, round(c.ms_per_token, 1)) for c in policies[name].candidates])


if __name__ == "__main__":
    main()
