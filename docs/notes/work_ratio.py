"""auto's cycles at one cell, side by side with fixed methods: each cycle's wall time over its modelled
forwards, split into wall / (the forwards it ran, each priced by the model) and (those forwards) / (the
forwards the model expected). Usage as docs/notes/auto_trace_side.py, e.g. 8000 continue 4 triforce,draft-only"""
import collections, sys, statistics
from side_cell import cycle_forwards, run_reps, side_cell

reps, methods, prompt, sessions = side_cell(sys.argv)
dec = sessions["auto"].decoder
pol = dec.policy
forwards = cycle_forwards(dec)  # (level, tokens, seconds) of the cycle under way
rows = collections.defaultdict(list)
orig_real = pol.realized
def realized(s, seconds, tokens, checked=0, **kw):
    cyc = pol.cycle_cost(s)
    if cyc is not None and s.mode.value != "ar":
        model, expected = cyc
        ran = sum(pol._c(l, n) or 0.0 for l, n, _ in forwards)
        before = pol.ratios.time_ratio(s)
        rows[s.mode.value].append((seconds / model, seconds / ran, ran / model, tokens / expected, before, seconds / tokens, model / expected))
    return orig_real(s, seconds, tokens, checked, **kw)
pol.realized = realized
run_reps(reps, methods, prompt, sessions)
for mode, rs in rows.items():
    col = list(zip(*rs))
    print(f"{mode}: {len(rs)} cycles; wall/model mean {statistics.mean(col[0]):.2f} median {statistics.median(col[0]):.2f}; "
          f"wall/ran mean {statistics.mean(col[1]):.2f} median {statistics.median(col[1]):.2f}; ran/model mean {statistics.mean(col[2]):.2f} "
          f"sd {statistics.pstdev(col[2]):.2f}; tokens/expected {statistics.mean(col[3]):.2f}; filtered time ratio (median) {statistics.median(col[4]):.2f}; "
          f"realized ms/token {1000*sum(x[5]*1 for x in rs)/len(rs):.1f} (mean of cycles); model ms/token mean {1000*statistics.mean(col[6]):.1f}")
