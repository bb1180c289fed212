"""One fixed mode at several draft lengths, side by side with ar as the bench runs our methods (one
session each on one prefill, asked for tokens in turn, the order rotated by one each repeat): which
length the fixed mode would want at this cell, and how far apart the lengths run. Prints each
repeat's ms/token, then the medians and the paired ratios to ar over the answers after the first.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/length_sweep.py CONTEXT WORKLOAD REPEATS MODE LENGTHS
e.g. docs/notes/length_sweep.py 2048 qa 7 retrieval-only 2,3,4,6,8 (LENGTHS: γ2, or γ1 for draft-only)"""
import sys

from side_cell import cell, print_later_medians, timed_reps
from engine.tools.bench_steps import named_sessions_on_one_prefill

reps, mode = int(sys.argv[3]), sys.argv[4]
lengths = [int(x) for x in sys.argv[5].split(",")]
model, base, prompt = cell(int(sys.argv[1]), sys.argv[2])
named = {"ar": base.replace(mode="ar")}
for g in lengths:
    named[f"g{g}"] = base.replace(mode=mode, **({"gamma1": g} if mode == "draft-only" else {"gamma2": g}))
names = list(named)
sessions = named_sessions_on_one_prefill(model, named, prompt, "ngram", len(prompt) + 128)
print_later_medians(timed_reps(sessions, names, prompt, reps))
