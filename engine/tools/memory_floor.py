"""The plain decoding step's memory floor: the bytes one step reads over what this machine reads per
second. A one-token forward of the target reads every weight once and every held K/V byte once, so
no plain step can take less than (weights + KV held) / read bandwidth; the bench prints that floor
beside ar's time."""
from __future__ import annotations

import time

import torch


def measure_read_gbps(megabytes: int = 256, repeats: int = 5) -> float:
    """GB/s at which torch's threads read a float32 buffer `megabytes` big (summing it), the best
    of `repeats`: the machine's read bandwidth as a forward's threads see it."""
    buffer = torch.ones(megabytes * 2**20 // 4)
    buffer.sum()  # pages touched, threads woken
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - began)
    return buffer.numel() * 4 / best / 1e9


def step_bytes(model, context: int) -> int:
    """Bytes a plain step reads with `context` tokens held: the target's weights (as stored: a
    GGUF's own blocks) and its K/V at the full cache's storage dtype."""
    runner = model.runner
    a = runner.arch
    kv_element = torch.tensor([], dtype=getattr(runner, "kv_dtype", runner.dtype)).element_size()
    return int(runner.nbytes()) + 2 * a.n_layers * a.n_kv_heads * a.head_dim * kv_element * context


def memory_floor(model, context: int, gbps: float | None = None) -> dict:
    """{"bytes_per_step", "read_gbps", "floor_ms"} for a plain step over `context` held tokens."""
    gbps = gbps or measure_read_gbps()
    nbytes = step_bytes(model, context)
    return {"bytes_per_step": nbytes, "read_gbps": round(gbps, 1), "floor_ms": round(nbytes / gbps / 1e6, 2)}
