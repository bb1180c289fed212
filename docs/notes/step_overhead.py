"""Where a verification step's time goes, auto against fixed methods side by side (as the bench runs
our methods): per method and answer, its steps, their wall time, the L2 forwards' time and the rest
(outside), and L2's forward by tokens checked (median ms); for auto, its policy's share of a step
(choose, realized, the lookups it logs, observe). Shows what auto pays a step beyond a fixed mode
running the same structure.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/step_overhead.py CONTEXT WORKLOAD REPEATS OTHERS   (e.g. 1024 continue 7 draft-only)"""
import collections
import statistics
import sys

from side_cell import run_reps, side_cell, timer

reps, methods, prompt, sessions = side_cell(sys.argv)
steps: dict[str, dict] = {}
policy_s: dict[str, float] = collections.defaultdict(float)


for name in methods:
    d = sessions[name].decoder
    got = steps[name] = {"wall": collections.defaultdict(float), "count": 0, "l2": collections.defaultdict(list)}
    timer(d, "step", "step", got["wall"])
    plain_timed, plain_step = d.timed, d.step

    def l2_timed(level, tokens, seconds, got=got, plain=plain_timed):
        if level == "l2":
            got["wall"]["l2"] += seconds
            got["l2"][tokens].append(seconds)
        return plain(level, tokens, seconds)

    def counted(seq, got=got, plain=plain_step):
        got["count"] += 1
        return plain(seq)
    d.timed, d.step = l2_timed, counted
auto = sessions["auto"].decoder
for obj, name in ((auto.policy, "choose"), (auto.policy, "realized"), (auto, "_learn_lookups"), (auto.policy, "observe")):
    timer(obj, name, name, policy_s)


def after() -> None:
    for name, got in steps.items():
        n, wall = got["count"], got["wall"]
        if not n:
            continue
        line = (f"    {name}: steps {n}, ms a step: wall {wall['step'] / n * 1e3:.2f}, L2 forwards {wall['l2'] / n * 1e3:.2f},"
                f" outside {(wall['step'] - wall['l2']) / n * 1e3:.2f}; L2 by tokens (median ms) "
                f"{ {k: round(statistics.median(v) * 1e3, 2) for k, v in sorted(got['l2'].items())} }")
        if name == "auto":
            line += "; policy ms a step " + str({k: round(v / n * 1e3, 3) for k, v in policy_s.items()})
            policy_s.clear()
        print(line)
        got["wall"].clear(), got["l2"].clear()
        got["count"] = 0


run_reps(reps, methods, prompt, sessions, after)
