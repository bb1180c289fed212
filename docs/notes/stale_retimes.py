"""A stale check re-timed slower than its last timing while its inferred price sat lower: at one
bench cell, side by side with OTHERS, every such re-time of auto's step-cost table as (level, size,
inferred ms, last timing ms, re-time ms), and after each answer the table and what auto ran.
(StepCosts moves a stale size's price with the smallest size's; a re-time above its last timing
then moves it 10 % from that inferred price: engine/decoding/measurements.py.)
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/stale_retimes.py CONTEXT WORKLOAD REPEATS OTHERS   (e.g. 1024 continue 6 draft-only)"""
import sys

from engine.decoding import measurements
from side_cell import run_reps, side_cell

cases = []
record = measurements.StepCosts.record


def logged(self, level, tokens, seconds):
    row = self.table[level]
    if tokens in row and self._stale(level, tokens):
        inferred, last = self._now(level, tokens), row[tokens]
        if seconds > last and inferred < 0.9 * last:
            cases.append((level, tokens, round(inferred * 1e3, 1), round(last * 1e3, 1), round(seconds * 1e3, 1)))
    return record(self, level, tokens, seconds)


measurements.StepCosts.record = logged
reps, methods, prompt, sessions = side_cell(sys.argv)
decoder = sessions["auto"].decoder


def after() -> None:
    costs = decoder.policy.costs
    print("   cases so far", len(cases), cases[-4:], "table",
          {n: round(costs.estimate("l2", n) * 1e3, 1) for n in sorted(costs.table["l2"])}, "ran", decoder.structure.label)


run_reps(reps, methods, prompt, sessions, after)
