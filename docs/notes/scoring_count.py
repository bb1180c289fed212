"""How often auto scores its choice, side by side with fixed methods (as the bench runs our methods):
per answer, auto's choices, how many of them scored (weighed every structure: counted as its
pricing of ar, once a scoring), what choose took in all and a step, what auto ran, and the
surprises (cycles far over their prediction, which score the next choice). Runs on the code before
engine/decoding/rescore.py too (no surprise count there), so that the two can be alternated.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/scoring_count.py CONTEXT WORKLOAD REPEATS OTHERS   (e.g. 1024 continue 6 draft-only)"""
import collections
import sys
import time

from side_cell import run_reps, short_label, side_cell
from engine.settings import Mode

reps, methods, prompt, sessions = side_cell(sys.argv)
policy = sessions["auto"].decoder.policy
got = collections.Counter()
ran = collections.Counter()
spent = [0.0]
inside = [False]
best_of, choose = policy._best_of, policy.choose


def counted_best_of(mode, settings):
    if inside[0] and mode is Mode.AR:
        got["scorings"] += 1
    return best_of(mode, settings)


def timed_choose(*args, **kwargs):
    inside[0] = True
    t = time.perf_counter()
    try:
        chosen = choose(*args, **kwargs)
    finally:
        spent[0] += time.perf_counter() - t
        inside[0] = False
    got["choices"] += 1
    ran[short_label(chosen.label)] += 1
    return chosen


policy._best_of, policy.choose = counted_best_of, timed_choose
if hasattr(policy, "rescore_soon"):
    soon = policy.rescore_soon

    def counted_soon():
        got["surprises"] += 1
        soon()
    policy.rescore_soon = counted_soon


def after() -> None:
    choices = max(got["choices"], 1)
    print(f"    auto: choices {got['choices']}, scorings {got['scorings']}, surprises {got['surprises']}; "
          f"choose {spent[0] * 1e3:.2f} ms, {spent[0] / choices * 1e3:.3f} ms a step; ran {dict(ran.most_common())}",
          flush=True)
    got.clear()
    ran.clear()
    spent[0] = 0.0


run_reps(reps, methods, prompt, sessions, after)
