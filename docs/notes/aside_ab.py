"""auto against auto as it was before 4549f30 (a length set aside for a re-time of its stale
checks lost its place at every choice: `prev`), side by side with fixed draft-only at the
settings' γ1 and ar, as the bench runs our methods. After each answer: every method's ms/token and
the structures each auto ran (cycles); at the end the medians of the later answers and each one's
paired ratio to ar. Shows whether keeping the set-aside length's place pays where it acts.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/aside_ab.py CONTEXT WORKLOAD REPEATS   (e.g. 1024 continue 9)"""
import collections
import sys

from side_cell import cell, print_later_medians, short_label, timed_reps
from engine.tools.bench_steps import named_sessions_on_one_prefill

reps = int(sys.argv[3])
model, base, prompt = cell(int(sys.argv[1]), sys.argv[2])
named = {"auto": base.replace(mode="auto"), "prev": base.replace(mode="auto"),
         "fixed": base.replace(mode="draft-only"), "ar": base.replace(mode="ar")}
sessions = named_sessions_on_one_prefill(model, named, prompt, "ngram", len(prompt) + 128)
prev = sessions["prev"].decoder.policy
prev.kept_length = prev._kept_length  # (its own untimed_best reset at each choice, as before)
plain_retime = prev._retime


def retime_and_clear(s):
    got = plain_retime(s)
    prev._sizes.untimed_best = None  # (a re-time cleared it, as before)
    return got


prev._retime = retime_and_clear
ran = {name: collections.Counter() for name in ("auto", "prev")}
for name in ran:
    p = sessions[name].decoder.policy
    plain = p.realized

    def realized(s, seconds, tokens, checked=0, forwards=(), name=name, plain=plain):
        ran[name][short_label(s.label)] += 1
        return plain(s, seconds, tokens, checked, forwards)
    p.realized = realized


def after() -> None:
    for name, counter in ran.items():
        print(f"    {name} ran (cycles):", dict(counter.most_common()))
        counter.clear()


print_later_medians(timed_reps(sessions, list(named), prompt, reps, after))
