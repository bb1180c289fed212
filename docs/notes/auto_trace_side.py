"""auto's verification cycles at one bench cell, its answers run side by side with fixed methods as
the bench does since the thirty-first pass (engine/tools/bench_steps.py): each method in its own
session on one prefill, asked for tokens in turn. Per auto answer: what each structure cost, the
sequence of cycles (structure, wall ms / tokens it yielded), what the policy weighed at each switch,
and per repeat every method's ms/token, so auto's loss shows against the same seconds' fixed modes.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=. .venv/bin/python \
    docs/notes/auto_trace_side.py CONTEXT WORKLOAD REPEATS OTHERS
e.g. docs/notes/auto_trace_side.py 8000 continue 5 ar,triforce,draft-only"""
import collections
import statistics
import sys
import time

from engine.tools.bench_steps import run_side_by_side
from side_cell import side_cell

reps, methods, prompt, sessions = side_cell(sys.argv)
dec = sessions["auto"].decoder
orig = dec.step
cycles = []  # (label, wall ms, tokens, weighed candidates when the structure changed)


def step(seq):
    t = time.perf_counter()
    previous = dec.structure.label if dec.structure is not None else None
    out = orig(seq)
    label = dec.structure.label
    weighed = None
    if label != previous:
        weighed = " | ".join(f"{c.structure} {c.ms_per_token:.1f}{'' if c.measured else '?'}"
                             for c in dec.policy.candidates)
    cycles.append((label, (time.perf_counter() - t) * 1000, len(out), weighed))
    return out


dec.step = step
runs = collections.defaultdict(list)
for r in range(reps):
    cycles.clear()
    turn = r % len(methods)
    order = methods[turn:] + methods[:turn]
    got = run_side_by_side(sessions, order, prompt)
    line = ", ".join(f"{m} {got[m].ms_per_token:.1f}" for m in methods)
    print(f"rep {r}: {line}; same tokens: {all(got[m].tokens == got[methods[1]].tokens for m in methods)}")
    for m in methods:
        runs[m].append(got[m].ms_per_token)
    by = collections.defaultdict(lambda: [0, 0.0, 0])
    for label, ms, n, _ in cycles:
        by[label][0] += 1
        by[label][1] += ms
        by[label][2] += n
    for label, (k, total, n) in by.items():
        print(f"    {label:28s} {k:3d} cycles {total:7.1f} ms {n:3d} tokens  {total / max(n, 1):5.1f} ms/token")
    print("    sequence:", " ".join(f"{label.split(' ')[0][:5]}:{ms:.0f}/{n}" for label, ms, n, _ in cycles))
    for i, (label, ms, n, weighed) in enumerate(cycles):
        if weighed:
            print(f"    cycle {i} -> {label}; weighed {weighed}")
    sys.stdout.flush()
for m in methods:
    paired = statistics.median(a / b for a, b in zip(runs[methods[1]], runs[m]))
    print(f"{m:15s} median {statistics.median(runs[m]):6.1f} {[round(x, 1) for x in runs[m]]} "
          f"paired vs {methods[1]} {paired:.2f}x")
