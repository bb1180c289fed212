"""auto sessions held to one draft-only length or rule each (policy.forced), side by side as the bench
runs our methods: per answer each one's ms/token, then its cycles, tokens a cycle (and what its own
replay of its logged lookups predicts), its cycles' wall time against the forwards they ran, the L2
check sizes it ran (how often a rule's long check comes) and its replayed price.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. .venv/bin/python \
    docs/notes/forced_cycles.py CONTEXT WORKLOAD REPEATS RULES   (e.g. 2048 continue 5 2,2/8,4)"""
import collections
import sys

from side_cell import cell, cycle_forwards, timed_reps
from engine.decoding.structure import Structure
from engine.settings import Mode
from engine.tools.bench_steps import named_sessions_on_one_prefill

reps, rules = int(sys.argv[3]), sys.argv[4].split(",")
model, base, prompt = cell(int(sys.argv[1]), sys.argv[2])
named = {f"a{rule}": base.replace(mode="auto") for rule in rules}
sessions = named_sessions_on_one_prefill(model, named, prompt, "ngram", len(prompt) + 128)
log: dict[str, list] = {}  # session -> its cycles this answer: (wall s, tokens, L2 check sizes, forwards' s)


def logged(policy, held: list, cycles: list):
    """`policy.realized`, logging each cycle into `cycles` (`held`: the cycle's forwards so far)."""
    plain = policy.realized

    def realized(s, seconds, tokens, checked=0, forwards=()):
        cycles.append((seconds, tokens, tuple(n for level, n, _ in held if level == "l2"), sum(t for _, _, t in held)))
        return plain(s, seconds, tokens, checked, forwards)
    return realized


for rule in rules:
    short, _, long = rule.partition("/")
    decoder = sessions[f"a{rule}"].decoder
    decoder.policy.forced = [Structure(Mode.DRAFT_ONLY, int(short), base.gamma2, int(long or 0))]
    log[f"a{rule}"] = []
    decoder.policy.realized = logged(decoder.policy, cycle_forwards(decoder), log[f"a{rule}"])
names = list(named)


def after() -> None:
    for name in names:
        cycles, policy = log[name], sessions[name].decoder.policy
        s = policy.forced[0]
        policy._memo.clear()
        _, replay_tokens, replay_cycles = policy._replay(s.gamma1, s.after_full)
        sizes = collections.Counter(n for c in cycles for n in c[2])
        wall, forwards, tokens = (sum(c[i] for c in cycles) for i in (0, 3, 1))
        print(f"   {name}: cycles {len(cycles)} tokens {tokens} tok/cyc {tokens / len(cycles):.3f} replay tok/cyc "
              f"{replay_tokens / replay_cycles:.3f} wall {wall * 1e3:.0f} fwd {forwards * 1e3:.0f} outside/cycle "
              f"{(wall - forwards) / len(cycles) * 1e3:.2f} ms  sizes {dict(sorted(sizes.items()))}"
              f" price {policy.seconds_per_token(s) * 1e3:.2f}")
        cycles.clear()


timed_reps(sessions, names, prompt, reps, after)
