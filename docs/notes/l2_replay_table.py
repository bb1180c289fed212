"""auto's L2 step-cost table and its draft-only replay beside what the L2 checks really cost: after
each repeat, per check size, the median ms of the checks auto and the fixed methods ran in it, auto's
table for 1-9 tokens, the replay's ms/token for draft lengths 1-8 at that table, and the draft
lengths auto ran (cycles each). Shows whether auto's draft length follows the table or the table
strays from the checks. Usage as docs/notes/auto_trace_side.py, e.g. 1024 continue 5 draft-only"""
import collections
import statistics
import sys

from side_cell import cycle_forwards, run_reps, side_cell

reps, methods, prompt, sessions = side_cell(sys.argv)
pol = sessions["auto"].decoder.policy
seen = {m: collections.defaultdict(list) for m in methods}
for m in methods:
    cycle_forwards(sessions[m].decoder, lambda level, n, s, m=m: seen[m][n].append(s) if level == "l2" else None)
ran = collections.Counter()
dec = sessions["auto"].decoder
step = dec.step


def counted(seq):
    out = step(seq)
    ran[dec.structure.label] += 1
    return out


dec.step = counted


def report():
    for m in methods:
        sizes = sorted(seen[m])
        print(f"  {m} L2 checks (size: median ms x count): " + ", ".join(
            f"{n}:{1000 * statistics.median(seen[m][n]):.1f}x{len(seen[m][n])}" for n in sizes))
        seen[m].clear()
    print("  auto table 1-9: " + ", ".join(
        "-" if (e := pol.costs.estimate("l2", n)) is None else f"{1000 * e:.1f}" for n in range(1, 10)))
    replay = []
    for g in range(1, 9):
        got = pol.lookups.replay(g, lambda n: pol.costs.estimate("l2", n))
        replay.append("-" if got is None else f"{g}:{1000 * got[0] / got[1]:.2f}")
    print("  replay ms/token by draft length: " + ", ".join(replay))
    print("  auto ran: " + ", ".join(f"{k} x{v}" for k, v in ran.most_common()), flush=True)
    ran.clear()


run_reps(reps, methods, prompt, sessions, after=report)
