"""draft-only's n-gram draft length as auto prices it by replay, against the same replay priced
with the median of the check times this run measured. Runs auto and OTHERS side by side; after each
repeat, for γ1 = 1..8: auto's price (ms/token: replayed check seconds with its step-cost table, over
the tokens, times ar's wall/model ratio) and the replay at the medians of every L2 check timed so
far by any session, by size. Usage as docs/notes/auto_trace_side.py, e.g. 8000 continue 3 draft-only"""
import collections, statistics, sys
from side_cell import cycle_forwards, run_reps, side_cell

reps, methods, prompt, sessions = side_cell(sys.argv)
timed = collections.defaultdict(list)  # size -> seconds of every L2 check, any session
for name in methods:
    cycle_forwards(sessions[name].decoder, lambda level, n, s: timed[n].append(s) if level == "l2" else None)
pol = sessions["auto"].decoder.policy
def report():
    medians = {n: statistics.median(xs) for n, xs in timed.items()}
    print("  L2 check ms by size, auto's table | median timed (samples): " + "; ".join(
        f"{n}: {1000 * (pol.costs.estimate('l2', n) or 0):.1f} | {1000 * medians[n]:.1f} ({len(timed[n])})" for n in sorted(medians)))
    ratio = pol._ar_ratio or 1.0
    for g in range(1, 9):
        priced = pol.lookups.replay(g, lambda n: pol.costs.estimate("l2", n) or 0.0)
        measured = pol.lookups.replay(g, lambda n: medians.get(n, float("nan")))
        if priced is None:
            continue
        print(f"  γ1={g}: auto prices {1000 * priced[0] / priced[1] * ratio:6.1f} ms/token; at the timed medians "
              f"{1000 * measured[0] / measured[1]:6.1f} (x ar ratio {ratio:.2f}: {1000 * measured[0] / measured[1] * ratio:6.1f}); "
              f"{priced[1] / priced[2]:.2f} tokens a cycle")


run_reps(reps, methods, prompt, sessions, after=report)
