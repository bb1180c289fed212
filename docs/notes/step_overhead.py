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

from side_cell import cycle_forwards, run_reps, side_cell, timer

reps, methods, prompt, sessions = side_cell(sys.argv)
steps: dict[str, dict] = {}  # method -> this answer's steps, their wall s, L2's s, L2's s by tokens checked
policy_s: dict[str, float] = collections.defaultdict(float)  # auto's policy calls -> their s this answer


def l2_logged(got: dict):
    """An on_forward for cycle_forwards that adds each L2 forward's seconds into `got`."""
    def on_forward(level, tokens, seconds):
        if level == "l2":
            got["l2"] += seconds
            got["l2_by_tokens"][tokens].append(seconds)
    return on_forward


for name in methods:
    d = sessions[name].decoder
    got = steps[name] = {"steps": 0, "wall": collections.defaultdict(float), "l2": 0.0,
                         "l2_by_tokens": collections.defaultdict(list)}
    cycle_forwards(d, l2_logged(got))
    timer(d, "step", "step", got["wall"])
    plain_step = d.step

    def counted(seq, got=got, plain=plain_step):
        got["steps"] += 1
        return plain(seq)
    d.step = counted
auto = sessions["auto"].decoder
for obj, name in ((auto.policy, "choose"), (auto.policy, "realized"), (auto, "_learn_lookups"), (auto.policy, "observe")):
    timer(obj, name, name, policy_s)


def after() -> None:
    for name, got in steps.items():
        n, wall, l2 = got["steps"], got["wall"]["step"], got["l2"]
        if not n:
            continue
        by_tokens = {k: round(statistics.median(v) * 1e3, 2) for k, v in sorted(got["l2_by_tokens"].items())}
        line = (f"    {name}: steps {n}, ms a step: wall {wall / n * 1e3:.2f}, L2 forwards {l2 / n * 1e3:.2f},"
                f" outside {(wall - l2) / n * 1e3:.2f}; L2 by tokens (median ms) {by_tokens}")
        if name == "auto":
            line += "; policy ms a step " + str({k: round(v / n * 1e3, 3) for k, v in policy_s.items()})
            policy_s.clear()
        print(line)
        got.update(steps=0, l2=0.0)
        got["wall"].clear()
        got["l2_by_tokens"].clear()


run_reps(reps, methods, prompt, sessions, after)
