"""gpu-check's measurements: one function per row group of the table (see engine/tools/gpu_check.py)."""
from __future__ import annotations

import gc
from typing import Callable

import torch

from engine.tools.gpu_check_fastpaths import measure_draft_graph, measure_graphs, measure_hybrid
from engine.tools.gpu_check_setup import (BUDGET, CHUNK, DRAFT, GAMMA1, GAMMA2, TARGET, RandomState, Timer,
                                          fill_random, build_runner, preset_config)


# --- the measurements ------------------------------------------------------------------------
def measure_context(target, timer: Timer, context: int, pinned_gbs: float, log: Callable[[str], None],
                    cpu_gbps: float = 0.0) -> dict:
    """One context length's rows: L1, L2 on-chip (eager and graphed), the rebuild, and every layer
    offloaded: stream-only (prefetch, serial), hybrid (heads split with the CPU at `cpu_gbps`,
    measured on this host) and one prefill chunk."""
    from engine.kv.full import FullCache
    from engine.kv.offload import OffloadedCache
    from engine.kv.retrieval import RetrievalCache

    a, device, dtype = target.arch, target.device, target.dtype
    gen = torch.Generator(device=device).manual_seed(context)
    held = context - 16  # room for one verification
    budget = min(BUDGET, held // 2 // CHUNK * CHUNK)
    out: dict = {"context": context, "held_tokens": held, "budget": budget}
    tokens = lambda n: torch.randint(0, a.vocab_size, (n,), device=device, generator=gen)  # noqa: E731
    pos = lambda n: torch.arange(held, held + n, device=device)  # noqa: E731

    log(f"  {context} tokens: filling the full cache with random KV")
    full = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, context, dtype, device, exact=False)  # as on a card
    for layer in range(a.n_layers):
        fill_random(full.keys[layer][:, :held], gen)
        fill_random(full.values[layer][:, :held], gen)
    full.length = held
    kv_bytes = held * full.bytes_per_token()
    out["kv_bytes"] = kv_bytes

    def l2(n: int):
        ids, p = tokens(n), pos(n)

        def run():
            target.forward(ids, p, full)
            full.rollback(held)
        return run

    out["l2_decode_ms"] = timer.ms(l2(1))
    out["l2_verify_ms"] = timer.ms(l2(GAMMA2 + 1))
    verify_ids, verify_pos = tokens(GAMMA2 + 1), pos(GAMMA2 + 1)
    reference = target.forward(verify_ids, verify_pos, full).clone()
    full.rollback(held)

    log(f"  {context} tokens: retrieval cache (budget {budget}) rebuild and L1")
    retrieval = RetrievalCache(full, a.n_heads, budget, CHUNK, headroom=128)
    queries = [torch.randn(a.n_heads, a.head_dim, device=device, generator=gen).to(dtype) for _ in range(a.n_layers)]
    out["rebuild_ms"] = timer.ms(lambda: retrieval.rebuild(queries), reps=max(1, timer.reps // 2))
    r_held = retrieval.length

    def l1():
        target.forward(tokens(GAMMA1 + 1), pos(GAMMA1 + 1), retrieval)
        retrieval.rollback(r_held)
    out["l1_ms"] = timer.ms(l1)
    log(f"  {context} tokens: CUDA graphs against eager (L1, L2 decode and verify)")
    out.update(measure_graphs(target, timer, full, held, retrieval, r_held, tokens, pos))
    del retrieval, queries

    log(f"  {context} tokens: every layer's KV in {'pinned ' if timer.cuda else ''}CPU memory, double-buffered")
    off_all = list(range(a.n_layers))
    off = OffloadedCache(a.n_layers, a.n_kv_heads, a.head_dim, context, dtype, device, off_all)
    for layer in off_all:  # the same KV as on the card, so the logits must agree
        off.keys[layer][:, :held].copy_(full.keys[layer][:, :held])
        off.values[layer][:, :held].copy_(full.values[layer][:, :held])
    off.length = held
    out["offload_pinned"] = bool(off.keys[0].is_pinned())
    out["offload_staging_bytes"] = off.staging_bytes()

    def run():
        target.forward(verify_ids, verify_pos, off)
        off.rollback(held)
    results = {}
    for name, prefetch in (("prefetch", True), ("serial", False)):
        off.prefetch = prefetch
        before = off.copied_bytes
        results[name] = timer.ms(run)
        out[f"offload_{name}_bytes"] = (off.copied_bytes - before) / (timer.reps + timer.warmup)
        if name == "prefetch":
            got = target.forward(verify_ids, verify_pos, off)
            off.rollback(held)
            out["offload_logits_identical"] = bool(torch.equal(got, reference))
    out.update(measure_hybrid(target, timer, off, held, verify_ids, verify_pos, reference, cpu_gbps, pinned_gbs, log))
    out.update(measure_long_compute(target, timer, full, off, held, pinned_gbs, tokens, log))
    del off, run
    out["l2_verify_offload_ms"] = results["prefetch"]
    out["l2_verify_offload_serial_ms"] = results["serial"]
    moved = out["offload_serial_bytes"]
    t_transfer = moved / (pinned_gbs * 1e6) if pinned_gbs else float("nan")  # ms
    out["transfer_ms_at_pinned_bw"] = t_transfer
    out["transfer_ms_measured"] = results["serial"] - out["l2_verify_ms"]
    out["overlap_hidden"] = hidden_fraction(results["prefetch"], out["l2_verify_ms"], t_transfer)
    out["offload_gbs"] = out["offload_prefetch_bytes"] / results["prefetch"] / 1e6
    out["offload_fraction_of_pinned"] = out["offload_gbs"] / pinned_gbs if pinned_gbs else float("nan")
    out["l2_read_bytes"] = target.nbytes() - target.embed.numel() * target.embed.element_size() * (
        target.lm_head is not target.embed) + kv_bytes
    out["l2_verify_gbs"] = out["l2_read_bytes"] / out["l2_verify_ms"] / 1e6
    del full, reference
    gc.collect()
    if timer.cuda:
        torch.cuda.empty_cache()
    return out


def hidden_fraction(with_prefetch_ms: float, compute_ms: float, transfer_ms: float) -> float:
    """How much of the copy the double buffer hid: 1 - (t_prefetch - t_compute) / t_transfer."""
    return 1 - (with_prefetch_ms - compute_ms) / transfer_ms if transfer_ms else float("nan")


def measure_long_compute(target, timer: "Timer", full, off, held: int, pinned_gbs: float, tokens, log) -> dict:
    """The double buffer where compute is long enough to hide behind: one prefill chunk (the
    session's CUDA chunk, 2048 tokens; 32 on the CPU) attending over the whole held prefix, with
    every layer's KV offloaded (prefetch vs serial) and on-chip. A decode-sized verification
    computes far less per layer than its copy takes at long contexts, so there is little to hide there;
    a long document's prefill chunk computes about as long as the copy."""
    from engine.decoding.session import prefill_chunk_for

    n = min(prefill_chunk_for(target.device) if target.device.type == "cuda" else 32, held // 2)
    start = held - n
    ids, p = tokens(n), torch.arange(start, held, device=target.device)
    log(f"    prefill chunk of {n} tokens over {start} held, every layer offloaded")

    def chunk(cache):
        def run():
            cache.rollback(start)
            target.forward(ids, p, cache, last_only=True)
        return run
    reps = max(1, timer.reps // 2)
    onchip = timer.ms(chunk(full), reps=reps)
    times = {}
    for name, prefetch in (("prefetch", True), ("serial", False)):
        off.prefetch = prefetch
        before = off.copied_bytes
        times[name] = timer.ms(chunk(off), reps=reps)
        moved = (off.copied_bytes - before) / (reps + timer.warmup)
    off.prefetch = True
    full.length = off.length = held
    t_transfer = moved / (pinned_gbs * 1e6) if pinned_gbs else float("nan")
    return {"chunk_tokens": n, "chunk_onchip_ms": onchip, "chunk_offload_ms": times["prefetch"],
            "chunk_offload_serial_ms": times["serial"], "chunk_transfer_ms_at_pinned_bw": t_transfer,
            "chunk_overlap_hidden": hidden_fraction(times["prefetch"], onchip, t_transfer)}


def measure_tensor_parallel(timer: Timer, devices: list[torch.device], dtype: torch.dtype, tiny: bool,
                            context: int, log: Callable[[str], None]) -> dict:
    """The card-to-card hop (a [1, hidden] activation there and back; the planner assumes 30 us
    per all-reduce) and L2 with the target split across `devices` (tensor parallel, KV on-chip),
    to set beside the same forward on one card. With both shares on one card this measures
    tensor parallel's overhead (twice the launches, the hops), not its gain."""
    from engine.model.runner_tp import TensorParallelRunner

    config = preset_config(TARGET, tiny)
    x = torch.randn(1, config.hidden_size, dtype=dtype, device=devices[0])
    out: dict = {"cards": [str(d) for d in devices], "context": context}
    out["hop_us"] = timer.ms(lambda: x.to(devices[1]).to(devices[0]), reps=max(20, timer.reps)) * 1e3 / 2
    log(f"  tensor parallel over {', '.join(out['cards'])} at {context} tokens")
    tp = TensorParallelRunner(config, RandomState(config, devices[0], dtype), devices, dtype, context)
    cache = tp.new_full_cache(context)
    gen = torch.Generator(device=devices[0]).manual_seed(context)
    held = context - 16
    for part in cache.parts:
        for layer in range(config.num_hidden_layers):
            for t in (part.keys[layer], part.values[layer]):
                t[:, :held].copy_(torch.empty_like(t[:, :held], device=devices[0]).normal_(generator=gen))
    cache.length = held
    ids = torch.randint(0, config.vocab_size, (GAMMA2 + 1,), device=devices[0], generator=gen)

    def l2(n: int, kv):
        def run():
            tp.forward(ids[:n], torch.arange(held, held + n, device=devices[0]), kv)
            kv.rollback(held)
        return run
    out["tp_l2_decode_ms"] = timer.ms(l2(1, cache))
    out["tp_l2_verify_ms"] = timer.ms(l2(GAMMA2 + 1, cache))
    # every layer offloaded: each card streams its own heads' share over its own link at once
    log("  tensor parallel, every layer's KV offloaded")
    off = tp.new_full_cache(context, list(range(config.num_hidden_layers)))
    for part, resident in zip(off.parts, cache.parts):
        for layer in range(config.num_hidden_layers):
            part.load_prefix(layer, resident.keys[layer][:, :held], resident.values[layer][:, :held])
    off.length = held
    del cache
    gc.collect()
    out["tp_l2_verify_offload_ms"] = timer.ms(l2(GAMMA2 + 1, off))
    out["tp_offload_bytes"] = held * off.bytes_per_token()
    del tp, off
    gc.collect()
    return out


def measure_draft(timer: Timer, device: torch.device, dtype: torch.dtype, tiny: bool) -> dict:
    from engine.kv.streaming import StreamingCache

    draft = build_runner(DRAFT, device, dtype, tiny, 4096)
    a = draft.arch
    cache = StreamingCache(a.n_layers, a.n_kv_heads, a.head_dim, 4, 252, 64, dtype, device)
    gen = torch.Generator(device=device).manual_seed(7)
    for layer in range(a.n_layers):
        fill_random(cache.keys[layer][:, :256], gen)
        fill_random(cache.values[layer][:, :256], gen)
    cache.length = 256
    ids = torch.randint(0, a.vocab_size, (1,), device=device, generator=gen)

    def step():
        draft.forward(ids, torch.tensor([0], device=device), cache, last_only=True)
        cache.rollback(256)
    out = {"draft_step_ms": timer.ms(step), "draft_weight_bytes": draft.nbytes()}
    out.update(measure_draft_graph(draft, timer, cache, 256, ids))
    del draft, cache
    gc.collect()
    return out
