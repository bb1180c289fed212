"""auto as it ships against auto that scores every RESCORE_EVERY (4) cycles as before the forty-ninth
pass (`every4`: its wait held at RESCORE_EVERY after each settled scoring; the rest of rescore.py
kept, a replayed draft-only cycle judged in time only too), side by side with a fixed mode and ar,
as the bench runs our methods. After each answer: each auto's scorings (counted as its pricing of
ar, once a scoring), cycles by structure; at the end the medians of the later answers and each
one's paired ratio to ar. Asks whether the scorings skipped cost a choice.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/cadence_ab.py CONTEXT WORKLOAD REPEATS FIXED   (e.g. 8000 qa 9 retrieval-only)"""
import collections
import sys

from side_cell import cell, print_later_medians, timed_reps, watch_choices
from engine.decoding.rescore import RESCORE_EVERY
from engine.tools.bench_steps import named_sessions_on_one_prefill

reps, fixed = int(sys.argv[3]), sys.argv[4]
model, base, prompt = cell(int(sys.argv[1]), sys.argv[2])
named = {"auto": base.replace(mode="auto"), "every4": base.replace(mode="auto"),
         fixed: base.replace(mode=fixed), "ar": base.replace(mode="ar")}
sessions = named_sessions_on_one_prefill(model, named, prompt, "ngram", len(prompt) + 128)
ran = {name: collections.Counter() for name in ("auto", "every4")}
scorings = collections.Counter()
for name in ran:
    watch_choices(sessions[name].decoder.policy, name, scorings, ran)
every4 = sessions["every4"].decoder.policy
scored = every4.scored


def held_at_four(chosen, running):
    scored(chosen, running)
    every4._score_wait = RESCORE_EVERY


every4.scored = held_at_four


def after() -> None:
    for name, counter in ran.items():
        print(f"    {name}: scorings {scorings[name]}, ran (cycles) {dict(counter.most_common())}")
        counter.clear()
    scorings.clear()


print_later_medians(timed_reps(sessions, list(named), prompt, reps, after))
