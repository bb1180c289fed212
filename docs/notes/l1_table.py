"""auto's step-cost table for L1 beside the L1 forwards it timed: after each repeat, every L1
forward timed in it (tokens: ms) and auto's estimate for 1-8 tokens. Shows where an L1 size never
timed is priced from (below the smallest timed size the table extrapolates). Usage as
docs/notes/auto_trace_side.py, e.g. 1024 continue 5 draft-only"""
import sys
from side_cell import cycle_forwards, run_reps, side_cell

reps, methods, prompt, sessions = side_cell(sys.argv)
pol = sessions["auto"].decoder.policy
seen = []
cycle_forwards(sessions["auto"].decoder, lambda level, n, s: seen.append((n, s)) if level == "l1" else None)


def report():
    print("  L1 forwards timed: " + ", ".join(f"{n}:{1000 * s:.1f}" for n, s in seen))
    seen.clear()
    print("  table: " + ", ".join(f"{n}:{1000 * t:.1f}" for n, t in sorted(pol.costs.table["l1"].items())))
    est = [pol.costs.estimate("l1", n) for n in range(1, 9)]
    print("  estimate 1-8: " + ", ".join("-" if e is None else f"{1000 * e:.1f}" for e in est), flush=True)


run_reps(reps, methods, prompt, sessions, after=report)
