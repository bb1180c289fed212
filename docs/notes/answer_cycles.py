"""Every cycle of auto's answers at one bench cell, side by side with fixed methods as the bench
runs them: per answer each method's ms/token, auto's cycles as structure:ms/tokens (d = draft-only
γ1, t = triforce γ1 γ2, r = retrieval-only γ2), triforce's stretch factor (how much harder the
window's text is for n-gram drafts than the stretches it emitted, policy_inputs._stretch) and what
auto weighed last. Shows which answers carry a probe (an exploration, a refresh) and what it cost.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=. .venv/bin/python \
    docs/notes/answer_cycles.py CONTEXT WORKLOAD REPEATS OTHERS   (e.g. 1024 continue 10 draft-only,triforce)"""
import sys
import time

from side_cell import short_label, side_cell
from engine.tools.bench_steps import run_side_by_side

reps, methods, prompt, sessions = side_cell(sys.argv)
decoder = sessions["auto"].decoder
policy = decoder.policy
plain_step = decoder.step
cycles: list[str] = []


def step(seq):
    started = time.perf_counter()
    out = plain_step(seq)
    label = short_label(decoder.structure.label)
    cycles.append(f"{label}:{(time.perf_counter() - started) * 1e3:.0f}/{len(out)}")
    return out


decoder.step = step
for r in range(reps):
    cycles.clear()
    got = run_side_by_side(sessions, methods, prompt)
    print(r, {m: round(got[m].ms_per_token, 2) for m in methods},
          "stretch", {k.value: round(v, 2) for k, v in policy._stretches.items()})
    print("   ", " ".join(cycles))
    print("    weighed", [(c.structure, round(c.ms_per_token, 1)) for c in policy.candidates])
