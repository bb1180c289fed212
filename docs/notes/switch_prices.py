"""Where auto switches modes at one bench cell: every cycle as structure:ms/tokens, and at each
switch what auto weighed and the parts of retrieval-only γ2 = 2's price (ms/token; time, work and
yield ratios; L1's acceptance; expected tokens) beside ar's price and time ratio.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/switch_prices.py CONTEXT WORKLOAD REPEATS OTHERS   (e.g. 1024 qa 6 retrieval-only)"""
import sys
import time

from engine.decoding.structure import Structure
from engine.settings import Mode
from engine.tools.bench_steps import run_side_by_side
from side_cell import short_label, side_cell

reps, methods, prompt, sessions = side_cell(sys.argv)
decoder = sessions["auto"].decoder
policy = decoder.policy
plain_step = decoder.step
cells: list[str] = []
previous: list = [None]


def parts() -> str:
    policy.reprice()
    r2, ar = Structure(Mode.RETRIEVAL_ONLY, 1, 2), Structure(Mode.AR)
    if policy.seconds_per_token(r2) is None:
        return ""
    ratios = policy.ratios
    return (f" [r2 {policy.seconds_per_token(r2) * 1e3:.1f} t{ratios.time_ratio(r2):.2f} w{ratios.work_ratio(r2):.2f}"
            f" y{ratios.yield_ratio(r2):.2f} a{policy.acceptance['l1_l2'].rate:.3f} e{policy.cycle_cost(r2)[1]:.2f}"
            f" ar {policy.seconds_per_token(ar) * 1e3:.1f} ar ratio {policy._ar_ratio or 1.0:.2f}]")


def step(seq):
    started = time.perf_counter()
    out = plain_step(seq)
    st = decoder.structure
    cell = f"{short_label(st.label)}:{(time.perf_counter() - started) * 1e3:.0f}/{len(out)}"
    if previous[0] is not None and st.mode is not previous[0].mode:
        weighed = [(c.structure, round(c.ms_per_token, 1)) for c in policy.candidates]
        cell = f"\n      SWITCH {cell} weighed {weighed}{parts()}\n     "
    previous[0] = st
    cells.append(cell)
    return out


decoder.step = step
for r in range(reps):
    cells.clear()
    got = run_side_by_side(sessions, methods, prompt)
    print(r, {m: round(got[m].ms_per_token, 2) for m in methods})
    print("    ", " ".join(cells))
