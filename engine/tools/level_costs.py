"""What each level's forward costs at long contexts, on the bundled model stretched to fit:

    python -m engine.tools.level_costs 16384,32768

an L2 step (1 token over the full cache), an L2 verification (7 tokens), an L1 step and an L1
verification (5 tokens, over the retrieval cache at the bench's default budget) and a rebuild of
the retrieval cache, each the best of five (CPU and wall milliseconds); the attention part of an
L2 step and of an L2 verification alone (every layer's native decode attention over the held K/V,
with the GB/s of K/V it reads), so a step splits into attention and the rest; and a prefill chunk (the
session's chunk of new tokens after the held ones, weights widened as a prefill widens them), the
best of two. The caches hold random K/V:
the costs depend on the shapes, not the values.
"""
from __future__ import annotations

import sys
import time
from typing import Callable

import torch


def best_ms(fn: Callable[[], object], repeats: int = 5) -> tuple[float, float]:
    """(CPU ms, wall ms) of `fn`, each the lowest of `repeats` calls."""
    rows = []
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        fn()
        rows.append((time.process_time() - cpu, time.perf_counter() - wall))
    return min(r[0] for r in rows) * 1000, min(r[1] for r in rows) * 1000


def level_costs(sizes: list[int]) -> list[str]:
    """One line per held size: each level's forward and a rebuild, CPU ms / wall ms."""
    from engine.api import Engine
    from engine.settings import default_budget
    from engine.api import Stretch
    from engine.settings import DecodeSettings
    from engine.decoding.session import prefill_chunk_for
    from engine.model.quant import widened_for_prefill
    from engine import native

    engine = Engine(devices="cpu", snapshots=False)
    window = max(sizes) + 256
    model = engine.load_weights(engine.resolve("bundled"), context=Stretch(window))
    runner, a = model.runner, model.runner.arch
    full = runner.new_full_cache(window)
    gen = torch.Generator().manual_seed(0)
    for layer in range(a.n_layers):  # [Hkv, capacity, D] each
        full.keys[layer].copy_(torch.randn(full.keys[layer].shape, generator=gen))
        full.values[layer].copy_(torch.randn(full.values[layer].shape, generator=gen))
    lines = []
    gbps: dict[str, float] = {}  # K/V read per wall second, for the attention-only rows
    for held in sizes:
        budget = default_budget(held, 16)
        full.rollback(0)
        full.length = held
        retrieval = full.retrieval(a.n_heads, budget, 16, DecodeSettings(budget=budget).retrieval_headroom())
        queries = [torch.randn(a.n_heads, a.head_dim, generator=gen) for _ in range(a.n_layers)]  # [Hq, D] each

        def l2(tokens: torch.Tensor) -> None:
            runner.forward(tokens, torch.arange(held, held + len(tokens)), full)
            full.rollback(held)

        def l1(tokens: torch.Tensor) -> None:
            kept = retrieval.length
            runner.forward(tokens, torch.arange(held, held + len(tokens)), retrieval, last_only=True, draft=True)
            retrieval.rollback(kept)

        def attention(tokens: int) -> None:  # what a forward of `tokens` rows spends in attention
            q = torch.randn(a.n_heads, tokens, a.head_dim, generator=gen)  # [Hq, T, D]
            for layer in range(a.n_layers):
                native.attention(q, full.keys[layer], full.values[layer], held + tokens)

        costs = {"rebuild": best_ms(lambda: retrieval.rebuild(queries), 3),
                 "L2 step": best_ms(lambda: l2(torch.tensor([500]))),
                 "L2 verify 7": best_ms(lambda: l2(torch.arange(500, 507))),
                 "L1 step": best_ms(lambda: l1(torch.tensor([500]))),
                 "L1 verify 5": best_ms(lambda: l1(torch.arange(500, 505)))}
        if full.native_attention:
            kv_bytes = 2 * a.n_layers * a.n_kv_heads * a.head_dim * held * full.keys[0].element_size()
            for rows in (1, 7):
                costs[f"L2 attention {rows}"] = best_ms(lambda rows=rows: attention(rows))
                gbps[f"L2 attention {rows}"] = kv_bytes / costs[f"L2 attention {rows}"][1] / 1e6
        chunk = prefill_chunk_for(runner.device)
        with widened_for_prefill(runner):
            costs[f"prefill {chunk}"] = best_ms(lambda: l2(torch.arange(500, 500 + chunk)), 2)
        lines.append(f"{held} held, L1 budget {budget}: " + ", ".join(
            f"{name} {cpu:.1f} cpu-ms / {wall:.1f} ms" + (f" ({gbps[name]:.1f} GB/s)" if name in gbps else "")
            for name, (cpu, wall) in costs.items()))
    return lines


if __name__ == "__main__":
    for line in level_costs([int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "16384,32768").split(",")]):
        print(line, flush=True)
