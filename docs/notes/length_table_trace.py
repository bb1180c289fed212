"""The L2 step-cost table behind each draft length auto chose at one bench cell, side by side with
fixed methods as the bench runs them: per answer, how many cycles ran each structure, and for an
answer where the settings' draft length (γ1 = 4) ran under 80 % of the cycles, each choice: what
ran, the cycle, L2's forward by tokens checked 1-9 as priced then (ms; * a size timed but stale,
~ one never timed, read off the line), the L2 forwards the cycle before ran (ran=tokens:ms), and
the price of draft-only at γ1 = 2-6 (ms/token). Shows whether a length slower than γ1 = 4 won on
the table's prices (forty-eighth pass).
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/length_table_trace.py CONTEXT WORKLOAD REPEATS OTHERS   (e.g. 1024 continue 40 draft-only)"""
import collections
import sys

from side_cell import cycle_forwards, run_reps, short_label, side_cell
from engine.decoding.structure import Structure
from engine.settings import Mode

reps, methods, prompt, sessions = side_cell(sys.argv)
decoder = sessions["auto"].decoder
policy = decoder.policy
plain_choose = policy.choose
held = cycle_forwards(decoder)
lines: list[str] = []


def choose(*args, **kwargs):
    if held and lines:
        lines[-1] += " ran=" + ",".join(f"{n}:{s * 1e3:.1f}" for level, n, s in held if level == "l2")
    got = plain_choose(*args, **kwargs)
    costs = policy.costs
    row = " ".join(f"{n}:{(costs.estimate('l2', n) or 0) * 1e3:.1f}"
                   f"{'' if costs.fresh('l2', n) else '*' if n in costs.table['l2'] else '~'}" for n in range(1, 10))
    policy.reprice()  # (the choice's memo holds what it weighed; read the lengths afresh)
    prices = " ".join(f"{g}:{(policy.seconds_per_token(Structure(Mode.DRAFT_ONLY, g, 6)) or 0) * 1e3:.2f}"
                      for g in (2, 3, 4, 5, 6))
    lines.append(f"{short_label(got.label):10s} cyc={policy._cycles} l2[{row}] p[{prices}]")
    return got


def after() -> None:
    ran = collections.Counter(line.split()[0] for line in lines)
    print("    ran:", dict(ran.most_common()))
    if ran.get("dg1=4", 0) < 0.8 * len(lines):
        for line in lines:
            print("   ", line)
    lines.clear()


policy.choose = choose
run_reps(reps, methods, prompt, sessions, after)
