"""auto's own Python per verification cycle, without a model: the policy driven through CYCLES
simulated draft-only cycles at continue-like acceptance (a lookup at every position, a seeded
stream of matches), as the decoder drives it: choose, the L2 forward timed, the acceptance
observed, the cycle realized, its lookups logged and settled. Prints ms per cycle for each piece
and a hash of the structures chosen, so that a change meant only to be faster can be checked to
choose the same structures (same hash before and after).
Usage (repo root): OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python docs/notes/policy_cycle_cost.py [CYCLES]"""
import hashlib
import random
import sys
import time
from collections import defaultdict

from engine.decoding.lookup_replay import LOOKUP_TOKENS
from engine.decoding.policy import Policy
from engine.settings import DecodeSettings

AUTO = DecodeSettings(mode="auto", budget=64, chunk=16)
cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
rng = random.Random(7)
p = Policy()
spent: dict[str, float] = defaultdict(float)
chosen: list[str] = []
seq_len = 1024


def l2_seconds(n: int) -> float:  # a staircase in blocks of 4, with noise that only adds time
    return (0.014 + 0.002 * ((n + 3) // 4) + 0.0005 * n) * (1.0 + abs(rng.gauss(0.0, 0.05)))


def lookup() -> tuple[list[int], int]:
    """(what a lookup offers, how many of those the target then emits): copies come in stretches."""
    if rng.random() < 0.35:
        return [], 0
    offered = rng.randint(1, LOOKUP_TOKENS)
    return [1] * offered, offered if rng.random() < 0.45 else rng.randint(0, offered - 1)


for cycle in range(cycles):
    t = time.perf_counter()
    s = p.choose(AUTO, has_l0=True, context_tokens=seq_len, budget=64, remaining=64)
    spent["choose"] += time.perf_counter() - t
    chosen.append(s.label)
    offered, matched = lookup()
    g = s.gamma1 if s.mode.uses_l0 and not s.mode.uses_l1 else 0
    drafted = min(len(offered), g)
    accepted = min(matched, drafted)
    t = time.perf_counter()
    p.costs.record("l2", drafted + 1, l2_seconds(drafted + 1))
    if s.mode.uses_l1:
        p.costs.record("l1", 1, 0.6 * l2_seconds(1))
    p.observe("l0_l2", drafted, accepted)
    spent["timed+observe"] += time.perf_counter() - t
    t = time.perf_counter()
    p.realized(s, l2_seconds(drafted + 1) * 1.03, accepted + 1, checked=drafted + 1, forwards=[("l2", drafted + 1)])
    spent["realized"] += time.perf_counter() - t
    t = time.perf_counter()
    for k in range(accepted + 1):  # a lookup logged at the cycle's start and each emitted token but the last,
        got, hit = lookup()  # settled at once (offered, matched)
        p.lookups.settled.append((len(got), hit))
    seq_len += accepted + 1
    spent["lookups"] += time.perf_counter() - t
    if cycle % 19 == 18:
        p.new_turn()
print(f"{cycles} cycles; ms per cycle:", "  ".join(f"{k} {v / cycles * 1000:.3f}" for k, v in spent.items()))
print("structures chosen:", hashlib.sha1(" ".join(chosen).encode()).hexdigest()[:12],
      "  by count:", sorted(((chosen.count(x), x) for x in set(chosen)), reverse=True)[:6])
