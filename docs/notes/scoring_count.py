"""How often auto scores its choice, side by side with fixed methods (as the bench runs our methods):
per answer, auto's choices, how many of them scored (weighed every structure: counted as its
pricing of ar, once a scoring), what choose took in all and a step, what auto ran, and the
surprises (cycles far over their prediction, which score the next choice). Runs on the code before
engine/decoding/rescore.py too (no surprise count there), so that the two can be alternated.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/scoring_count.py CONTEXT WORKLOAD REPEATS OTHERS   (e.g. 1024 continue 6 draft-only)"""
import collections
import sys

from side_cell import run_reps, side_cell, watch_choices

reps, methods, prompt, sessions = side_cell(sys.argv)
policy = sessions["auto"].decoder.policy
got = collections.Counter()
ran = {"auto": collections.Counter()}
spent = collections.defaultdict(float)
watch_choices(policy, "auto", got, ran, spent)  # (got["auto"]: scorings)
if hasattr(policy, "rescore_soon"):
    soon = policy.rescore_soon

    def counted_soon():
        got["surprises"] += 1
        soon()
    policy.rescore_soon = counted_soon


def after() -> None:
    choices = sum(ran["auto"].values())
    print(f"    auto: choices {choices}, scorings {got['auto']}, surprises {got['surprises']}; "
          f"choose {spent['auto'] * 1e3:.2f} ms, {spent['auto'] / max(choices, 1) * 1e3:.3f} ms a step; "
          f"ran {dict(ran['auto'].most_common())}", flush=True)
    got.clear()
    ran["auto"].clear()
    spent.clear()


run_reps(reps, methods, prompt, sessions, after)
