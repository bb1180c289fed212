"""The native attention's time per layer by new tokens T (the bundled model's shape: 9 query heads,
3 KV heads, head size 64, float16 K/V), at 1K, 4K and 8K keys; medians of 40.

Usage (from the repo root): PYTHONPATH=. .venv/bin/python docs/notes/attention_rows.py
"""
import statistics
import time

import torch

from engine import native
torch.manual_seed(0)
for total in (1024, 4096, 8000):
    cap = -(-(total + 64) // 256) * 256
    K = torch.randn(3, cap, 64).half(); V = torch.randn(3, cap, 64).half()
    row = []
    for T in (1, 2, 3, 4, 5, 8):
        q = torch.randn(9, T, 64)
        ts = []
        for _ in range(40):
            t0 = time.perf_counter(); native.attention(q, K, V, total); ts.append(time.perf_counter() - t0)
        row.append("T%d %.3f" % (T, statistics.median(ts) * 1000))
    print(total, "ms per layer:", "  ".join(row))
