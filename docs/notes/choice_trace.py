"""Every choice auto made at one bench cell, side by side with fixed methods as the bench runs them:
per answer each method's ms/token, then per cycle what auto ran, whether the retrieval cache was
built for the prompt (live), the cache's build time (setup ms), whether the choice came from a
scoring that settled, what a switch to an L1 structure would add per token (sw ms), the weighed
prices (ms/token) and the structure a probe cycle interrupted (inc). Shows why auto ran ar where
an L1 structure ran faster beside it (qa 1K, forty-second pass).
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/choice_trace.py CONTEXT WORKLOAD REPEATS OTHERS   (e.g. 1024 qa 10 ar,triforce,draft-only,retrieval-only)"""
import sys

from side_cell import run_reps, short_label, side_cell
from engine.decoding.structure import Structure
from engine.settings import Mode

reps, methods, prompt, sessions = side_cell(sys.argv)
policy = sessions["auto"].decoder.policy
plain_choose = policy.choose
lines: list[str] = []


def choose(settings, has_l0, context_tokens, budget=None, remaining=None):
    chosen = plain_choose(settings, has_l0, context_tokens, budget, remaining)
    switch = policy._switch_cost(Structure(Mode.RETRIEVAL_ONLY, 1, 1), remaining)
    setup = None if policy.setup_s is None else round(policy.setup_s * 1e3, 1)
    weighed = [(c.structure, round(c.ms_per_token, 1)) for c in policy.candidates]
    interrupted = policy._incumbent and policy._incumbent.label
    lines.append(f"{short_label(chosen.label)} live={policy._l1_live} setup={setup} settled={policy._settled} "
                 f"sw={switch * 1e3:.2f} weighed={weighed} inc={interrupted}")
    return chosen


def after() -> None:
    for line in lines:
        print("   ", line)
    lines.clear()


policy.choose = choose
run_reps(reps, methods, prompt, sessions, after)
