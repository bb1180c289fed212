"""When `auto` scores its choice again (a side of engine/decoding/policy.py).

A scoring weighs ~50 structures (every draft length and rule of draft-only, retrieval-only's γ2,
triforce's γ1 and γ2), a cost in Python that is paid on the decode step; scoring every few
cycles when nothing has changed repeats that cost for the same answer.

So the wait between scorings backs off while they agree: it starts at RESCORE_EVERY cycles and
doubles, up to RESCORE_MAX, each time a settled scoring keeps the structure that was running; it
starts over when one changes the choice, and when a cycle runs SURPRISE times its prediction
(policy.realized). An acceptance estimate that moves by SHIFT since the last scoring, a new turn,
an exploration or a probe cycle still score the next cycle, as before.

The probes that a scoring decides (ar re-timed every AR_RETIME cycles, the runner-up refreshed,
another draft length re-timed: policy.py, size_retime.py) count their own cycles; a wait never
runs past the cycle at which one of them comes due, so backing off does not delay them (a longer
unbounded wait would starve the re-times that find a better draft length or rule).
"""
from __future__ import annotations

from engine.decoding.size_retime import CLOSE_EVERY, UNTIMED_SPACING
from engine.decoding.structure import Structure
from engine.settings import Mode

AR_RETIME = 16  # on a speculative structure, one ar cycle every 16 cycles re-times ar (policy.py)
RESCORE_EVERY = 4  # score at least every 4 cycles at first ...
RESCORE_MAX = 16  # ... and at least every 16 once scorings keep agreeing
SHIFT = 0.1  # ... or as soon as any acceptance estimate moved this much since the last scoring


class RescoreSchedule:
    """Methods of Policy (its subclass). They read and set its _settled, _since_score, _scored_rates,
    _rescore_every and _score_wait, and read the probe counters (_since_ar, _since_refresh, _sizes)."""

    def scoring_skipped(self, modes: list[Mode], rates: dict[str, float]) -> bool:
        """May this cycle run the current structure without scoring (`rates`: each boundary's
        acceptance now)? Counts the cycle if so."""
        if (self._settled and self.current is not None and self.current.mode in modes
                and self._since_score < self._score_wait
                and all(abs(rates[b] - r) < SHIFT for b, r in self._scored_rates.items())):
            self._since_score += 1
            return True
        self._since_score, self._scored_rates = 1, rates
        return False

    def scored(self, chosen: Structure, running: Structure | None) -> None:
        """A settled scoring chose `chosen` where `running` ran: back off if they agree, else start
        over; then bound the wait by the first probe to come due. Call after `_ran(chosen)`."""
        steady = running is not None and chosen == running
        self._rescore_every = min(RESCORE_MAX, 2 * self._rescore_every) if steady else RESCORE_EVERY
        self._score_wait = min(self._rescore_every, self._until_probe())

    def rescore_soon(self) -> None:
        """Something moved (a cycle far over its prediction): waits start over from RESCORE_EVERY."""
        self._settled = False
        self._rescore_every = RESCORE_EVERY // 2  # (the scoring next doubles it, if it agrees)

    def _until_probe(self) -> int:
        """The value of _since_score at which a probe may first come due: the soonest that any of
        the probes' conditions turns true, a counter reaching its bound or a wait running out (k
        below: the cycles skipped until then; counters moved by _ran count this cycle already,
        those moved by realized not yet; a mode's realized count may move less than one a cycle,
        so this errs early). A condition true at this scoring (its probe did not run: nothing to
        probe, or another condition false) does not bound the wait: the regular scorings look again."""
        sizes, ratios, now = self._sizes, self.ratios, self._cycles + 1
        gates = [at - now for at, _ in sizes.next_at.values()]  # (a draft length's next re-time)
        ahead = [sizes.refresh_every - self._since_refresh]  # (refresh_time; its per-mode waits only filter)
        if self.current is not None and self.current.mode is Mode.AR:  # close_contender
            ahead += [CLOSE_EVERY - self._since_refresh] + [at - now for at, _ in sizes.close_at.values()]
            ahead += [CLOSE_EVERY - (ratios.count + 1 - sums.last_cycle) for sums in ratios.modes.values()]
        else:  # ar re-timed; size_probe, whose lengths' own waits and L2 checks going stale (one L2
            ahead += [AR_RETIME - self._since_ar, sizes.every - sizes.since]  # forward a cycle) count once its wait has run out
            if sizes.since >= sizes.every:
                ahead += gates + [n - 1 for n in self.costs.until_stale("l2")]
        if sizes.untimed_best is not None:  # untimed_probe
            ahead += [UNTIMED_SPACING - sizes.since] + gates
        return 1 + min((k for k in ahead if k >= 0), default=RESCORE_MAX)
