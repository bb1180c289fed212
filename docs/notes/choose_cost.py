"""What one `auto` scoring costs: a policy that has measured every level (as tests/test_policy.py's
_measured_policy builds it) with a ready lookup log, `choose` timed with a re-score forced each call,
then with the policy settled (re-scoring as engine/decoding/rescore.py schedules it: every 4 calls
before be2d5f2, backing off to 16 since).
Usage (repo root): OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python docs/notes/choose_cost.py"""
import time

from engine.decoding.policy import EXPLORE_CYCLES, Policy
from engine.settings import DecodeSettings, Mode

AUTO = DecodeSettings(mode="auto", budget=64, chunk=16)


def measured_policy() -> Policy:
    p = Policy()
    for n in range(1, 14):
        p.costs.record("l2", n, 0.100 + 0.015 * (n - 1))
        p.costs.record("l1", n, 0.9 * (0.100 + 0.015 * (n - 1)))
        p.costs.record("l0", n, 0.0)
    for boundary, rate in (("l0_l2", 0.3), ("l1_l2", 0.9), ("l0_l1", 0.3)):
        for _ in range(200):
            p.observe(boundary, 10, round(10 * rate))
    for m in Mode:
        p.tried[m] = EXPLORE_CYCLES
    for position in range(64):  # a lookup at every position offering 2 tokens, the first right
        p.lookups.add(position, [position, -1])
    p.lookups.settle(list(range(80)))
    return p


p, n = measured_policy(), 500
assert p.lookups.ready()
t = time.perf_counter()
for _ in range(n):
    p._settled = False
    p.choose(AUTO, has_l0=True, context_tokens=8000)
print(f"choose, re-scoring every call: {(time.perf_counter() - t) / n * 1000:.2f} ms")
t = time.perf_counter()
for _ in range(n):
    p.choose(AUTO, has_l0=True, context_tokens=8000)
print(f"choose, settled: {(time.perf_counter() - t) / n * 1000:.3f} ms")
