"""`main.py gpu-check`: measure what the offload manager and the three levels cost on this GPU.

Nothing is downloaded: random bf16 weights with Llama-3.1-8B's shapes (target) and Llama-3.2-1B's
(draft) from resources/presets are created on the GPU directly, KV caches are filled with random
data (a 128K prefill would take minutes and tells nothing here). Measured, with CUDA events after
warm-ups, a few repetitions each:

- pinned host-to-device bandwidth (1 GiB copies);
- CPU attention on the host (engine/kv/cpu_attention.py) at Llama-3.1-8B's per-layer shape, 32K
  positions, bf16 and fp32, decode and verification: the CPU half of hybrid offload;
- per context (32K and 128K): L1 (the target on a retrieval cache of budget 4096, gamma1 + 1
  tokens), L2 decode (1 token) and L2 verification (gamma2 + 1 tokens) with the full cache on
  the card, the retrieval rebuild, and the same verification with every layer's KV in pinned
  CPU memory (OffloadedCache, double-buffered prefetch) vs its serial no-prefetch variant;
  overlap hidden = 1 - (t_prefetch - t_compute) / t_transfer, with t_transfer = KV bytes moved /
  measured pinned bandwidth; the fraction of that bandwidth the offloaded verification achieves;
  the same overlap for one prefill chunk (2048 tokens), where compute per layer is as long as
  the copy, unlike a few-token verification;
- hybrid offload against stream-only and resident: every layer offloaded, KV heads split between
  the CPU and the link in the ratio of the two measured rates, verification and decode;
- CUDA graphs against eager (engine/model/cuda_graphs.py): L1, L2 decode and L2 verification on
  the card, and the L0 draft step;
- the draft step (Llama-3.2-1B shapes, StreamingLLM cache of 4 sinks + 252 recent);
- the TriForce loop's ms per token composed from those step times with assumed acceptance
  (not measured: random weights accept nothing), eager and graphed on-chip, hybrid offloaded,
  each beside plain AR on the same placement;
- Llama-2-7B-128K at 127K on one and two RTX 4090s, modelled by the planner (hybrid offload,
  tuned gammas) with its 4090 numbers derated by the efficiencies measured here and the CPU
  attention at the rate measured on this host, and at a stated 60 GB/s, next to the paper's
  312 ms and 108 ms. The host here is not a 4090 workstation: its CPU-attention rate says what
  the kernel does on this CPU, not on a desktop's.

`--device cpu --quick` runs every row on tiny shapes on the CPU (tests use it; graphs run their
static path eagerly there); it measures nothing meaningful about GPUs. The default run took 48 s on
an H200 before the fast-path rows; with them it is meant to stay well under 8 minutes.
"""
from __future__ import annotations

import gc
import math
import time
from typing import Callable

import torch

from engine.offload.devices import DEFAULT_CPU_ATTN_GBPS
from engine.tools.gpu_check_fastpaths import measure_cpu_attention
from engine.tools.gpu_check_report import compose, format_table, model_paper_setting, write_json
from engine.tools.gpu_check_rows import measure_context, measure_draft, measure_tensor_parallel
from engine.tools.gpu_check_setup import (ACCEPT_L0_L1, ACCEPT_L1_L2, BUDGET, CHUNK, DRAFT, GAMMA1, GAMMA2, TARGET,
                                          NoCudaError, Timer, build_runner, pinned_bandwidth)

__all__ = ["NoCudaError", "format_table", "run_check", "write_json"]


def run_check(device: str = "cuda", quick: bool = False, contexts: tuple[int, ...] | None = None,
              log: Callable[[str], None] = print) -> dict:
    """All measurements; returns a JSON-able dict. Raises NoCudaError without CUDA (device cuda)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise NoCudaError("gpu-check needs an NVIDIA GPU with CUDA, and torch here sees none "
                              f"(torch {torch.__version__}); run it on the GPU machine")
        dev = torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
    tiny = dev.type != "cuda"
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if contexts is None:
        contexts = (128, 256) if tiny else ((16384, 32768) if quick else (32768, 131072))
    timer = Timer(dev, reps=2 if quick else 5, warmup=1 if quick else 2)
    started = time.perf_counter()
    result: dict = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (tiny shapes)",
                    "torch": torch.__version__, "dtype": str(dtype).replace("torch.", ""), "quick": quick,
                    "target": TARGET + (" (tiny)" if tiny else ""), "draft": DRAFT + (" (tiny)" if tiny else ""),
                    "weights": "random", "budget": BUDGET, "chunk": CHUNK, "gamma1": GAMMA1, "gamma2": GAMMA2,
                    "assumed_acceptance": {"l0_by_l1": ACCEPT_L0_L1, "l1_by_l2": ACCEPT_L1_L2}}
    log("pinned host-to-device bandwidth")
    result["pinned"] = pinned_bandwidth(timer, (1 << 20) * (8 if tiny else (256 if quick else 1024)))
    pinned_gbs = result["pinned"]["h2d_gbs"]
    log("CPU attention on this host (the CPU half of hybrid offload)")
    result["cpu_attention"] = measure_cpu_attention(tiny)
    cpu_gbps = result["cpu_attention"]["gbps"]
    log("draft step (Llama-3.2-1B shapes, StreamingLLM 4 + 252)")
    result.update(measure_draft(timer, dev, dtype, tiny))
    log("target (Llama-3.1-8B shapes, random bf16 weights)")
    target = build_runner(TARGET, dev, dtype, tiny, max(contexts))
    result["target_weight_bytes"] = target.nbytes()
    result["kv_heads"] = target.arch.n_kv_heads
    result["contexts"] = []
    for context in contexts:
        row = measure_context(target, timer, context, pinned_gbs, log, cpu_gbps)
        l0 = result["draft_step_ms"]
        row["triforce_onchip"] = compose(l0, row["l1_ms"], row["l2_verify_ms"])
        row["triforce_offloaded"] = compose(l0, row["l1_ms"], row["l2_verify_offload_ms"])
        row["ar_onchip_ms_per_token"] = row["l2_decode_ms"]
        nan = float("nan")
        g0, g1 = result.get("draft_step_graph_ms", l0), row.get("l1_graph_ms", row["l1_ms"])
        row["triforce_graphs"] = compose(g0, g1, row.get("l2_verify_graph_ms", nan))
        row["ar_graphs_ms_per_token"] = row.get("l2_decode_graph_ms", nan)
        row["l2_verify_graph_gbs"] = row["l2_read_bytes"] / row.get("l2_verify_graph_ms", nan) / 1e6
        # offloaded: L0 and L1 stay on the card (graphed where that is faster), L2 hybrid
        row["triforce_hybrid"] = compose(min(l0, g0), min(row["l1_ms"], g1), row.get("l2_verify_hybrid_ms", nan))
        row["ar_offloaded_ms_per_token"] = min(row.get("l2_decode_offload_ms", nan), row.get("l2_decode_hybrid_ms", nan))
        result["contexts"].append(row)
    del target
    gc.collect()
    # two cards when there are two; otherwise both shares on this one card, which measures what
    # tensor parallel costs (twice the kernel launches, the hops) but not what it gains
    two = dev.type == "cuda" and torch.cuda.device_count() > 1
    cards = [torch.device("cuda", i) for i in range(2)] if two else [dev, dev]
    result["tensor_parallel"] = measure_tensor_parallel(timer, cards, dtype, tiny, contexts[0], log)
    result["tensor_parallel"]["same_card"] = not two
    # efficiencies measured here, applied to the planner's 4090 numbers
    top = result["contexts"][-1]
    peak = _peak_bandwidth_gbs(dev)
    best_gbs = max(top["l2_verify_gbs"], top["l2_verify_graph_gbs"] if top["l2_verify_graph_gbs"] == top["l2_verify_graph_gbs"]
                   else 0.0)  # graphed where it ran
    eff_hbm = min(1.0, best_gbs / peak) if peak else 1.0
    eff_pcie = min(1.0, max(0.05, top["offload_fraction_of_pinned"])) if not math.isnan(top["offload_fraction_of_pinned"]) else 1.0
    result["efficiency"] = {"hbm_peak_gbs": peak, "hbm": eff_hbm, "pcie_of_pinned": eff_pcie}
    result["paper_setting"] = model_paper_setting(eff_hbm, eff_pcie, cpu_gbps)
    result["paper_setting_60"] = model_paper_setting(eff_hbm, eff_pcie, DEFAULT_CPU_ATTN_GBPS)
    result["seconds"] = time.perf_counter() - started
    return result


def _peak_bandwidth_gbs(dev: torch.device) -> float | None:
    """Device memory bandwidth from NVML (bus width x max memory clock x 2); None on the CPU."""
    if dev.type != "cuda":
        return None
    try:
        from engine.offload import telemetry

        gpus = telemetry.sample_memory().gpus
        name = torch.cuda.get_device_name(dev)
        match = [g for g in gpus if g.name == name and g.bandwidth_gbs]
        return float(match[0].bandwidth_gbs) if match else None
    except Exception:  # noqa: BLE001  NVML missing: report raw numbers only
        return None
