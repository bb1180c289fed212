"""gpu-check's rows for the fast paths: CPU attention on the host, hybrid offload against stream-only
and resident L2, and CUDA graphs against eager for L0, L1 and L2.

Each group records an error string instead of raising, so one failing fast path never costs the
rest of a one-shot GPU run.
"""
from __future__ import annotations

from typing import Callable

import torch

from engine.tools.gpu_check_setup import GAMMA1, GAMMA2, Timer

LLAMA31_LAYER = dict(n_kv=8, n_heads=32, dim=128)  # Llama-3.1-8B's per-layer attention shape


def measure_cpu_attention(tiny: bool) -> dict:
    """GB/s of the CPU attention kernel on this host, Llama-3.1-8B's per-layer shape at 32K
    positions (1K with tiny shapes), bf16 and fp32 storage, decode (1) and verification (gamma2 + 1)."""
    from engine.kv.cpu_attention import measure_gbps

    positions = 1024 if tiny else 32768
    rows = [measure_gbps(LLAMA31_LAYER["n_kv"], LLAMA31_LAYER["n_heads"], LLAMA31_LAYER["dim"], positions, new, dtype,
                         reps=1 if tiny else 3)
            for dtype in (torch.bfloat16, torch.float32) for new in (1, GAMMA2 + 1)]
    verify_bf16 = next(r for r in rows if r["dtype"] == "bfloat16" and r["new_tokens"] == GAMMA2 + 1)
    return {"threads": torch.get_num_threads(), "positions": positions, "rows": rows, "gbps": verify_bf16["gbps"]}


def balanced_cpu_heads(n_kv: int, cpu_gbps: float, pcie_gbps: float) -> int:
    """KV heads per offloaded layer for the CPU so it and the link finish together; at least one
    head each way, so both halves of the hybrid path are exercised."""
    share = cpu_gbps / (cpu_gbps + pcie_gbps) if cpu_gbps + pcie_gbps > 0 else 0.5
    return max(1, min(n_kv - 1, round(n_kv * share)))


def measure_hybrid(target, timer: Timer, off, held: int, ids: torch.Tensor, pos: torch.Tensor,
                   reference: torch.Tensor, cpu_gbps: float, pcie_gbps: float, log: Callable[[str], None]) -> dict:
    """L2 with every layer offloaded and its heads split between the CPU and the link (hybrid),
    verification (ids: gamma2 + 1 tokens) and decode, beside the stream-only decode; the hybrid
    logits against the on-chip `reference`."""
    heads = balanced_cpu_heads(target.arch.n_kv_heads, cpu_gbps, pcie_gbps)
    log(f"    hybrid: {heads} of {target.arch.n_kv_heads} KV heads per layer attended on the CPU")
    out: dict = {"hybrid_cpu_heads": heads}

    def run(n: int):
        def step():
            target.forward(ids[:n], pos[:n], off)
            off.rollback(held)
        return step
    try:
        off.prefetch = True
        out["l2_decode_offload_ms"] = timer.ms(run(1))  # stream-only decode: plain AR offloaded
        off.cpu_heads = {layer: heads for layer in off.offloaded}
        got = target.forward(ids, pos, off)
        off.rollback(held)
        diff = float((got.float() - reference.float()).abs().max())
        out["hybrid_logits_max_diff"] = diff
        out["hybrid_logits_close"] = diff <= 0.05 * float(reference.float().abs().max())  # bf16 rounding
        copied, attended = off.copied_bytes, off.cpu_attended_bytes
        out["l2_verify_hybrid_ms"] = timer.ms(run(ids.shape[0]))
        calls = timer.reps + timer.warmup
        out["hybrid_streamed_bytes"] = (off.copied_bytes - copied) / calls
        out["hybrid_cpu_bytes"] = (off.cpu_attended_bytes - attended) / calls
        out["l2_decode_hybrid_ms"] = timer.ms(run(1))
    except Exception as exc:  # noqa: BLE001  record and go on: the rest of the run still counts
        out["hybrid_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        off.cpu_heads = {}
    return out


def measure_graphs(target, timer: Timer, full, held: int, retrieval, r_held: int, tokens, pos) -> dict:
    """CUDA graphs against eager: L2 decode and verification over the on-chip full cache, L1 over
    the retrieval cache; ms per step and the largest logit difference. Without CUDA the static
    path runs eagerly (proves the code, measures nothing)."""
    from engine.model.cuda_graphs import GraphedForward

    graphs = target.device.type == "cuda"
    out: dict = {"graphs": "CUDA graphs" if graphs else "static path, eager (no CUDA)"}
    try:
        for name, cache, start, n in (("l2_decode", full, held, 1), ("l2_verify", full, held, GAMMA2 + 1),
                                      ("l1", retrieval, r_held, GAMMA1 + 1)):
            graphed = GraphedForward(target, cache, use_graphs=graphs)
            ids, p = tokens(n), pos(n)
            want = target.forward(ids, p, cache)
            cache.rollback(start)
            got = graphed.forward(ids, p)
            cache.rollback(start)
            out[f"{name}_graph_max_diff"] = float((got - want).abs().max())

            def step(graphed=graphed, ids=ids, p=p, cache=cache, start=start):
                graphed.forward(ids, p)
                cache.rollback(start)
            out[f"{name}_graph_ms"] = timer.ms(step)
            out[f"{name}_graph_replays"] = graphed.replays
    except Exception as exc:  # noqa: BLE001
        out["graph_error"] = f"{type(exc).__name__}: {exc}"
    return out


def measure_draft_graph(draft, timer: Timer, cache, held: int, ids: torch.Tensor) -> dict:
    """The L0 draft step over its StreamingLLM cache, replayed from a CUDA graph."""
    from engine.model.cuda_graphs import GraphedForward

    graphed = GraphedForward(draft, cache, use_graphs=draft.device.type == "cuda")
    try:
        def step():
            graphed.forward(ids, torch.tensor([0], device=draft.device), last_only=True)
            cache.rollback(held)
        return {"draft_step_graph_ms": timer.ms(step)}
    except Exception as exc:  # noqa: BLE001
        return {"draft_graph_error": f"{type(exc).__name__}: {exc}"}
