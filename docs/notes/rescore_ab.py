"""auto against auto that re-scores at least every 8 cycles instead of every RESCORE_EVERY (4)
(`every8`), side by side with fixed draft-only at the settings' γ1 and ar, as the bench runs our
methods. After each answer: each auto's cycles by structure and its choose's ms a step; at the end
the medians of the later answers and each one's paired ratio to ar. Asks whether scoring less often,
the larger part of auto's own Python a step (forty-eighth pass), pays without worse choices.
`every8` is emulated around choose: a choice 4-7 cycles after the last scoring reads as 3 cycles
after it, and the count goes on from where it was.
Written for the code before be2d5f2 (a scoring every RESCORE_EVERY cycles); since, the waits back
off by themselves (engine/decoding/rescore.py), and docs/notes/cadence_ab.py compares the two.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/rescore_ab.py CONTEXT WORKLOAD REPEATS   (e.g. 1024 continue 9)"""
import collections
import sys
import time

from side_cell import cell, print_later_medians, short_label, timed_reps
from engine.decoding.policy import RESCORE_EVERY
from engine.tools.bench_steps import named_sessions_on_one_prefill

EVERY = 8
reps = int(sys.argv[3])
model, base, prompt = cell(int(sys.argv[1]), sys.argv[2])
named = {"auto": base.replace(mode="auto"), "every8": base.replace(mode="auto"),
         "fixed": base.replace(mode="draft-only"), "ar": base.replace(mode="ar")}
sessions = named_sessions_on_one_prefill(model, named, prompt, "ngram", len(prompt) + 128)
ran = {name: collections.Counter() for name in ("auto", "every8")}
spent = {name: [0.0, 0] for name in ran}  # choose's seconds, choices


def wrapped(name: str):
    policy = sessions[name].decoder.policy
    plain = policy.choose

    def choose(*args, **kwargs):
        before = policy._since_score
        stretched = name == "every8" and RESCORE_EVERY <= before < EVERY
        if stretched:
            policy._since_score = RESCORE_EVERY - 1
        t = time.perf_counter()
        got = plain(*args, **kwargs)
        spent[name][0] += time.perf_counter() - t
        spent[name][1] += 1
        if stretched and policy._since_score == RESCORE_EVERY:  # (not scored: the count goes on)
            policy._since_score = before + 1
        ran[name][short_label(got.label)] += 1
        return got
    policy.choose = choose


for name in ran:
    wrapped(name)


def after() -> None:
    for name, counter in ran.items():
        seconds, choices = spent[name]
        print(f"    {name} ran (cycles): {dict(counter.most_common())}; choose {seconds / max(choices, 1) * 1e3:.3f} ms a step")
        counter.clear()
        spent[name] = [0.0, 0]


print_later_medians(timed_reps(sessions, list(named), prompt, reps, after))
