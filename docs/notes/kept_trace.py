"""Each draft length auto kept for a choice at one bench cell, side by side with fixed methods as the
bench runs them: the model's best (best), the running structure (inc), what runs (->), the best set
aside for a re-time of its stale check (ub), which L2 check sizes 1-9 are fresh (1) and, for a rule,
the share of its replayed time in stale long checks (share; RULE_STALE_SHARE), the cycle (cyc), the
cycles since the last re-time (since), each check size's cycles to its next re-time (waits; <= 0:
due) and the first two weighed prices. The last 25 choices of each answer.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/kept_trace.py CONTEXT WORKLOAD REPEATS OTHERS   (e.g. 1024 continue 3 draft-only)"""
import sys

from side_cell import run_reps, short_label, side_cell

reps, methods, prompt, sessions = side_cell(sys.argv)
policy = sessions["auto"].decoder.policy
plain_kept_length = policy.kept_length
lines: list[str] = []


def kept_length(best, incumbent, settings):
    got = plain_kept_length(best, incumbent, settings)
    state = policy._sizes
    set_aside = state.untimed_best
    fresh = "".join(str(int(policy.costs.fresh("l2", n))) for n in range(1, 10))
    share = round(policy._stale_share(best), 2) if best.after_full else None
    waits = ",".join(f"{n}:{state.next_at[mode, n][0] - policy._cycles}"
                     for mode, n in sorted(state.next_at, key=lambda k: k[1]) if mode is best.mode)
    weighed = [(short_label(c.structure), round(c.ms_per_token, 2)) for c in policy.candidates][:2]
    lines.append(f"best={short_label(best.label)} inc={incumbent and short_label(incumbent.label)} -> "
                 f"{short_label(got.label)} ub={set_aside and short_label(set_aside.label)} fresh={fresh} "
                 f"share={share} cyc={policy._cycles} since={state.since} waits=[{waits}] cands={weighed}")
    return got


def after() -> None:
    for line in lines[-25:]:
        print("   ", line)
    lines.clear()


policy.kept_length = kept_length
run_reps(reps, methods, prompt, sessions, after)
