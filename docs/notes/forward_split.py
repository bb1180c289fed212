"""auto's cycles at one cell, split into the forwards' own timed seconds and the rest of the cycle
(drafting glue, rollback, sampling, Python), per structure; and every forward's timed seconds by
level and size, as the model priced them. Usage as docs/notes/auto_trace_side.py, e.g.
8000 qa 3 ar,retrieval-only"""
import collections, statistics, sys
from side_cell import cycle_forwards, run_reps, side_cell

reps, methods, prompt, sessions = side_cell(sys.argv)
dec = sessions["auto"].decoder
pol = dec.policy
samples = collections.defaultdict(list)  # (level, tokens) -> [(seconds, model's estimate before)]
cycle_forwards = cycle_forwards(dec, lambda level, tokens, seconds: samples[(level, tokens)].append(
    (seconds, pol.costs.estimate(level, tokens))))
rows = collections.defaultdict(list)
orig_real = pol.realized
def realized(s, seconds, tokens, checked=0, **kw):
    cyc = pol.cycle_cost(s)
    timed_s = sum(x[2] for x in cycle_forwards)
    priced = sum(pol._c(l, n) or 0.0 for l, n, _ in cycle_forwards)
    model = cyc[0] if cyc else float("nan")
    rows[s.label].append((seconds, timed_s, priced, model, tokens, len(cycle_forwards)))
    return orig_real(s, seconds, tokens, checked, **kw)
pol.realized = realized
run_reps(reps, methods, prompt, sessions)
print("per structure (medians over cycles, ms): wall | forwards as timed | forwards as priced | model's cycle | rest = wall - timed")
for label, rs in sorted(rows.items()):
    col = list(zip(*rs))
    med = lambda i: 1000 * statistics.median(col[i])
    print(f"  {label:26s} {len(rs):3d} cycles  wall {med(0):6.1f}  timed {med(1):6.1f}  priced {med(2):6.1f}  "
          f"model {med(3):6.1f}  rest {1000*statistics.median([a-b for a, b in zip(col[0], col[1])]):6.1f}  "
          f"tokens {statistics.mean(col[4]):.2f}  forwards {statistics.mean(col[5]):.1f}")
print("forwards by level and size (ms): samples, median as timed, median of the model's estimate just before")
for (level, n), xs in sorted(samples.items()):
    est = [e for _, e in xs if e is not None]
    print(f"  {level} x{n:2d}: {len(xs):3d}  timed {1000*statistics.median([s for s, _ in xs]):6.1f}  "
          f"estimate {1000*statistics.median(est) if est else float('nan'):6.1f}")
