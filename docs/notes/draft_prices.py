"""auto's replayed prices for draft-only at every draft length, against what fixed draft-only runs
at some of those lengths side by side (with ar, as the bench runs our methods). After each answer:
every method's ms/token, then auto's price (ms/token) for each γ1 and rule it weighs, ar's price,
and the wall time of auto's draft-only cycles against the forwards they ran (their share outside the
forwards, which the replay prices at ar's ratio). FORCED (optional): auto sessions held to one
draft-only length or rule each (`2/8`: γ1 = 2, 8 right after a draft kept whole), to time what auto
prices, with auto's own machinery around it; `strict` there adds auto-strict, auto with a rule
weighed only once both its checks are fresh (as before RULE_STALE_SHARE). Shows whether auto's best
length is the one that runs fastest.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/draft_prices.py CONTEXT WORKLOAD REPEATS LENGTHS [FORCED]   (e.g. 2048 continue 7 2,4 2/8,2)"""
import collections
import statistics
import sys

from side_cell import cell, cycle_forwards, print_later_medians, timed_reps
from engine.decoding.size_retime import check_size
from engine.decoding.structure import Structure
from engine.settings import Mode
from engine.tools.bench_steps import named_sessions_on_one_prefill

reps, lengths = int(sys.argv[3]), [int(x) for x in sys.argv[4].split(",")]
model, base, prompt = cell(int(sys.argv[1]), sys.argv[2])
named = {"auto": base.replace(mode="auto"), "ar": base.replace(mode="ar")}
for g in lengths:
    named[f"g{g}"] = base.replace(mode="draft-only", gamma1=g)
forced = sys.argv[5].split(",") if len(sys.argv) > 5 else []
for rule in forced:
    named["auto-strict" if rule == "strict" else f"a{rule}"] = base.replace(mode="auto")
names = list(named)
sessions = named_sessions_on_one_prefill(model, named, prompt, "ngram", len(prompt) + 128)
decoder = sessions["auto"].decoder
policy = decoder.policy
ran: dict[str, collections.Counter] = {}  # auto's (and auto-strict's) cycles this answer, by structure
held = cycle_forwards(decoder)
outside: list[tuple[float, float]] = []  # auto's draft-only cycles: (wall s, modelled forwards s)


def counted(name: str, p) -> None:
    """Count `p`'s cycles by structure into ran[name] (for auto, also log its draft-only cycles' time)."""
    ran[name] = collections.Counter()
    plain = p.realized

    def realized(s, seconds, tokens, checked=0, forwards=()):
        ran[name][s.label.replace("draft-only g1=", "d")] += 1
        if name == "auto" and s.mode is Mode.DRAFT_ONLY and held:
            outside.append((seconds, sum(p._c("l2", n) or 0.0 for lvl, n, _ in held if lvl == "l2")))
        return plain(s, seconds, tokens, checked, forwards)
    p.realized = realized


counted("auto", policy)
for rule in forced:
    if rule == "strict":
        strict = sessions["auto-strict"].decoder.policy
        strict._checks_fresh = lambda s, p=strict: p.costs.fresh("l2", check_size(s)) and (
            not s.after_full or p.costs.fresh("l2", s.gamma1 + 1))
        counted("auto-strict", strict)
        continue
    short, _, long = rule.partition("/")
    sessions[f"a{rule}"].decoder.policy.forced = [Structure(Mode.DRAFT_ONLY, int(short), base.gamma2, int(long or 0))]


def after() -> None:
    policy._memo.clear()
    prices = {}
    for s in policy._lengths(Structure(Mode.DRAFT_ONLY, base.gamma1, base.gamma2)):
        ms = policy.seconds_per_token(s)
        if ms is not None:
            prices[s.label.replace("draft-only g1=", "")] = round(ms * 1e3, 2)
    ar = policy.seconds_per_token(Structure(Mode.AR))
    print("    priced: ar", round(ar * 1e3, 2), "draft-only", prices)
    print("    l2 row ms:", [None if c is None else round(c * 1e3, 2) for c in policy._l2_row()[1:]])
    if outside:
        over = [w - m for w, m in outside]
        print(f"    auto's draft-only cycles: {len(outside)}, wall-forwards median {statistics.median(over) * 1e3:.2f} ms,"
              f" wall/forwards median {statistics.median(w / m for w, m in outside if m):.3f}, ar ratio {policy._ar_ratio:.3f}")
        outside.clear()
    for name, counter in ran.items():
        print(f"    {name} ran (cycles):", dict(counter))
        counter.clear()


print_later_medians(timed_reps(sessions, names, prompt, reps, after))
