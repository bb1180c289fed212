"""Each method's answer at one bench cell split by forwards, side by side as the bench runs them:
its steps, their wall time, L2's forwards, the other levels' forwards and the rest (outside), the
structures auto ran, how many L2 checks of each size, and L2's forward by tokens checked (median
ms). Tells a method's dearer forwards from its own Python: at continue 8K, was auto's L2 slower
than the fixed mode's on the same 5-token checks (forty-eighth pass)?
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/answer_forwards.py CONTEXT WORKLOAD REPEATS OTHERS   (e.g. 8000 continue 12 draft-only)"""
import collections
import statistics
import sys

from side_cell import cycle_forwards, run_reps, short_label, side_cell, timer

reps, methods, prompt, sessions = side_cell(sys.argv)
answers: dict[str, list] = {}  # method -> this answer's steps as (structure, [(level, tokens, seconds)])
walls: dict[str, dict] = {}  # method -> {"step": seconds this answer}


def logged(name: str, decoder):
    held = cycle_forwards(decoder)
    timer(decoder, "step", "step", walls.setdefault(name, collections.defaultdict(float)))
    plain = decoder.step

    def step(seq):
        try:
            return plain(seq)
        finally:
            current = decoder.policy.current if name == "auto" else None
            answers[name].append((short_label(current.label) if current else name, list(held)))
    return step


for name in methods:
    answers[name] = []
    sessions[name].decoder.step = logged(name, sessions[name].decoder)


def after() -> None:
    for name, steps in answers.items():
        l2 = [(n, s) for _, forwards in steps for level, n, s in forwards if level == "l2"]
        other = sum(s for _, forwards in steps for level, _, s in forwards if level != "l2")
        wall, l2_s = walls[name]["step"], sum(s for _, s in l2)
        by_size = collections.defaultdict(list)
        for n, s in l2:
            by_size[n].append(s)
        ran = collections.Counter(label for label, _ in steps)
        print(f"   {name}: steps {len(steps)} wall {wall * 1e3:.0f} l2 {l2_s * 1e3:.0f} other forwards {other * 1e3:.0f}"
              f" outside {(wall - l2_s - other) * 1e3:.0f} ms; ran {dict(ran)};"
              f" l2 by size: count {dict(sorted(collections.Counter(n for n, _ in l2).items()))},"
              f" median ms {({n: round(statistics.median(v) * 1e3, 2) for n, v in sorted(by_size.items())})}")
        steps.clear()
        walls[name].clear()


run_reps(reps, methods, prompt, sessions, after)
