"""Offload planner: where every byte goes, and the per-token time that placement implies.

Runs before anything is allocated. Greedy per GPU: target weights first, then the retrieval
cache and the draft model with its StreamingLLM cache, then working memory, then as many
layers' full KV as fit; the rest of the KV lives in pinned CPU memory and streams over PCIe
into two staging buffers (one layer each) when L2 verifies. Every time here is a *floor*:
decoding a few tokens is bandwidth bound, so a step costs at least bytes read / bandwidth.

Two GPUs (no P2P): "layer-split" gives each card a contiguous run of layers and lets each
stream its own offloaded layers over its own PCIe link; "tensor-parallel" splits every layer's
heads and MLP across the cards so each reads half the bytes, paying two host-staged
all-reduces per layer. Both are computed; the lower end-to-end floor wins.
"""
from __future__ import annotations

import dataclasses
import math

from engine.errors import (ContextOverflowError, IncompatibleDraftError, InvalidSettingError,
                           OutOfMemoryPlanError)
from engine.offload.cost import floors_for
from engine.offload.describe import describe, format_bytes, mode_reason
from engine.offload.devices import (DEFAULT_CPU_ATTN_GBPS, DEFAULT_CPU_HEADROOM, DEFAULT_HEADROOM, GB, GiB, MiB,
                                    PROFILES, RTX_4090, DeviceSpec, GpuSpec, device_spec)
from engine.offload.layouts import (STAGING_SLOTS, Layout, budget_tokens, cpu_kv_storage, cpu_layout,
                                    draft_capacity, gpu_candidates, min_spare, sizes_for)
from engine.offload.plan_types import Acceptance, DevicePlan, Floors, ModeOption, Plan
from engine.offload.shapes import ModelShape
from engine.settings import DecodeSettings

__all__ = ["Acceptance", "DEFAULT_CPU_ATTN_GBPS", "DEFAULT_CPU_HEADROOM", "DEFAULT_HEADROOM", "DevicePlan", "DeviceSpec",
           "Floors", "GB", "GiB", "GpuSpec", "MiB", "ModeOption", "PROFILES", "Plan", "RTX_4090", "STAGING_SLOTS",
           "describe", "device_spec", "format_bytes", "plan_placement"]

# Built placements: one card, layers split across cards (engine/kv/offload.py, the runner's
# layer_devices) and tensor parallel (engine/model/runner_tp.py, engine/kv/sharded.py). The plan
# picks the lowest floor among them; plan_placement(tensor_parallel=False) rules TP out.
TENSOR_PARALLEL_BUILT = True


def plan_placement(target: ModelShape, draft: ModelShape | None, context_tokens: int,
                   settings: DecodeSettings, devices: DeviceSpec | str, *,
                   headroom_bytes: int = DEFAULT_HEADROOM, cpu_headroom_bytes: int = DEFAULT_CPU_HEADROOM,
                   dtype_bytes: int | None = None, prefill_chunk: int = 1024,
                   acceptance: Acceptance = Acceptance(), tp_offload: bool = True,
                   tensor_parallel: bool | None = None, raise_on_misfit: bool = True,
                   same_as: "Plan | None" = None, cpu_attn_gbps: float | None = None) -> Plan:
    """Place `target` (+ `draft`) for a cache of `context_tokens` on `devices`.

    dtype_bytes: weights and KV; default 2 (bf16) on GPUs, 4 (fp32) on the CPU.
    tp_offload: let tensor parallel offload KV too (each card streams its heads' share);
    False plans tensor parallel only when all KV fits on-chip.
    tensor_parallel: may the plan *choose* tensor parallel (default: TENSOR_PARALLEL_BUILT, yes).
    It is always computed and reported among the alternatives.
    same_as: keep the weights where this earlier plan put them (its mode, each layer's card, the
    draft's card) and decide only the KV: how a loaded model's cache grows.
    cpu_attn_gbps: the CPU-attention bandwidth for hybrid offload (default: the spec's); 0 streams
    every offloaded head (stream-only). Hybrid is chosen per card where it lowers the L2 floor.
    Raises ContextOverflowError, IncompatibleDraftError, InvalidSettingError on bad input and
    OutOfMemoryPlanError naming what does not fit (unless raise_on_misfit=False, which returns
    the closest plan with fits=False and its shortfalls).
    """
    spec = devices if isinstance(devices, DeviceSpec) else device_spec(devices)
    if cpu_attn_gbps is not None:
        if not math.isfinite(cpu_attn_gbps):
            raise InvalidSettingError(f"CPU attention bandwidth {cpu_attn_gbps} GB/s is not finite: "
                                      "use 0 (stream only) or more")
        if cpu_attn_gbps < 0:
            raise InvalidSettingError(f"CPU attention bandwidth {cpu_attn_gbps} GB/s is negative: use 0 (stream only) or more")
        spec = dataclasses.replace(spec, cpu_attn_gbps=cpu_attn_gbps)
    settings.validate()
    _check_inputs(target, draft, context_tokens, settings, spec, headroom_bytes)
    if settings.mode in ("ar", "retrieval-only"):
        draft = None
    dtype = dtype_bytes or (2 if spec.gpus else 4)
    # the CPU alone holds the KV as the CPU runner stores it (float16 where the native kernels run)
    cpu_kv = cpu_kv_storage(dtype) if not spec.gpus and dtype_bytes is None else None
    sizes = sizes_for(target, draft, context_tokens, settings, dtype, prefill_chunk, cpu_kv)
    rates = (acceptance.l0_by_l1 if draft else acceptance.ngram_by_l1, acceptance.l1_by_l2)

    if not spec.gpus:
        candidates = [cpu_layout(sizes, spec, cpu_headroom_bytes, target.vocab)]
    else:
        candidates = gpu_candidates(sizes, target, draft, spec, headroom_bytes, cpu_headroom_bytes, tp_offload)
    for lay in candidates:
        lay.floors = floors_for(lay, sizes, spec, target, settings, rates)
    allow_tp = TENSOR_PARALLEL_BUILT if tensor_parallel is None else tensor_parallel
    choosable = [c for c in candidates if allow_tp or c.mode != "tensor-parallel"]
    if same_as is not None:
        choosable = [c for c in candidates if c.mode == same_as.mode and tuple(c.layer_devices) == same_as.layer_devices
                     and c.draft_device == same_as.draft_device]
        if not choosable:
            raise InvalidSettingError(f"no {same_as.mode} placement like the loaded one exists for these devices")
    fitting = [c for c in choosable if not c.shortfalls]
    order = {"cpu": 0, "single-gpu": 0, "layer-split": 1, "tensor-parallel": 2}  # ties: simpler wins
    if fitting:
        best = min(fitting, key=lambda c: (round(c.floors.end_to_end_ms, 6), order[c.mode], -min_spare(c, spec, headroom_bytes)))
    else:
        best = min(choosable, key=lambda c: sum(b for _, b in c.shortfalls))
    if best.shortfalls and raise_on_misfit:
        hint = "use a shorter context, a smaller model or budget, or more memory"
        raise OutOfMemoryPlanError("; ".join(m for m, _ in best.shortfalls) + f": {hint}")
    alternatives = _alternatives(candidates, spec, allow_tp)
    tuned = _tuned(best, sizes, spec, target, settings, rates)
    offloaded = sum(d == "cpu" for d in best.kv_devices) if spec.gpus else 0
    return Plan(
        fits=not best.shortfalls, mode=best.mode, mode_reason=mode_reason(best, alternatives, spec, allow_tp),
        target=target.name, draft=draft.name if draft else None, decode_mode=settings.mode,
        context_tokens=context_tokens, budget_tokens=budget_tokens(settings, context_tokens), dtype_bytes=dtype,
        kv_layers_total=target.layers, kv_layers_offloaded=sum(d == "cpu" for d in best.kv_devices) if spec.gpus else 0,
        layer_devices=tuple(best.layer_devices), kv_devices=tuple(best.kv_devices),
        draft_device=best.draft_device, devices=_device_plans(best, spec, headroom_bytes, cpu_headroom_bytes),
        floors=best.floors, acceptance=acceptance, gamma1=settings.gamma1, gamma2=settings.gamma2,
        alternatives=alternatives, shortfalls=tuple(m for m, _ in best.shortfalls),
        profile=spec.profile, profile_note=spec.note,
        offload_mode="resident" if not offloaded else "hybrid" if any(best.cpu_heads) else "stream",
        cpu_heads=tuple(best.cpu_heads) if offloaded else (), cpu_attn_gbps=spec.cpu_attn_gbps if spec.gpus else 0.0,
        modelled_ms_per_token=tuned[0], tuned_gamma1=tuned[1], tuned_gamma2=tuned[2])


GAMMA1_TUNED = range(1, 9)
GAMMA2_TUNED = range(1, 33)


def _tuned(lay: Layout, sizes, spec: DeviceSpec, target: ModelShape, settings: DecodeSettings,
           rates: tuple[float, float]) -> tuple[float, int, int]:
    """(ms per token, gamma1, gamma2): the end-to-end floor at the best gammas, as the paper tunes
    them per setting (a slow L2 wants a long gamma2). The layout's CPU-head split is kept."""
    if settings.mode == "ar":
        return lay.floors.end_to_end_ms, settings.gamma1, settings.gamma2
    split = dict(lay.cpu_split)
    best = (lay.floors.end_to_end_ms, settings.gamma1, settings.gamma2)
    g1s = GAMMA1_TUNED if settings.mode in ("triforce", "auto", "draft-only") else [settings.gamma1]
    g2s = GAMMA2_TUNED if settings.mode != "draft-only" else [settings.gamma2]
    for g1 in g1s:
        for g2 in g2s:
            f = floors_for(lay, sizes, spec, target, settings.replace(gamma1=g1, gamma2=g2), rates, cpu_heads=split)
            if f.end_to_end_ms < best[0] - 1e-9:
                best = (f.end_to_end_ms, g1, g2)
    floors_for(lay, sizes, spec, target, settings, rates, cpu_heads=split)  # restore the layout's per-layer split
    return best


def _check_inputs(target: ModelShape, draft: ModelShape | None, context_tokens: int,
                  settings: DecodeSettings, spec: DeviceSpec, headroom_bytes: int = 0) -> None:
    if context_tokens < 1:
        raise InvalidSettingError(f"context of {context_tokens} tokens is out of range: use 1 or more")
    if context_tokens > target.max_context:
        raise ContextOverflowError(
            f"context of {context_tokens} tokens exceeds {target.name}'s maximum of {target.max_context}:"
            f" use {target.max_context} tokens or fewer")
    if draft is not None and settings.mode in ("triforce", "draft-only", "auto"):  # auto may pick the draft
        # Same tokenizer, possibly padded embedding rows (Qwen2.5: 152064 vs 151936).
        padded = draft.model_type == target.model_type and abs(draft.vocab - target.vocab) <= 1024
        if draft.vocab != target.vocab and not padded:
            raise IncompatibleDraftError(
                f"draft {draft.name} has a {draft.vocab}-token vocabulary but {target.name} has {target.vocab}:"
                " pick a draft with the same tokenizer (the preset's draft, or none for n-gram drafting)")
        window = draft_capacity(settings)
        if window > draft.max_context:
            raise ContextOverflowError(
                f"draft window of {window} tokens exceeds {draft.name}'s maximum of {draft.max_context}:"
                f" use a draft window under {draft.max_context - (window - settings.draft_window)}")
    for i, gpu in enumerate(spec.gpus):
        if not 0 <= headroom_bytes < gpu.total_bytes:  # a headroom past the card leaves "negative" memory
            raise InvalidSettingError(f"a headroom of {headroom_bytes / GiB:g} GiB does not fit cuda:{i} ({gpu.name}, "
                                      f"{gpu.total_bytes / GiB:g} GiB): use less than the card holds")
        if gpu.free_bytes <= 0:
            raise OutOfMemoryPlanError(f"cuda:{i} ({gpu.name}) reports 0 bytes free: close what holds it or pick other devices")
    if spec.ram_available_bytes <= 0:
        raise OutOfMemoryPlanError("the CPU reports 0 bytes of RAM available: close other programs")


def _alternatives(candidates: list[Layout], spec: DeviceSpec, allow_tp: bool = True) -> tuple[ModeOption, ...]:
    """For two or more GPUs: the best of each multi-card mode, fitting or not."""
    if len(spec.gpus) < 2:
        return ()
    out = []
    for mode in ("layer-split", "tensor-parallel"):
        group = [c for c in candidates if c.mode == mode]
        if not group:
            out.append(ModeOption(mode, False, None, "heads do not divide evenly across the cards"))
            continue
        fitting = [c for c in group if not c.shortfalls]
        if fitting:
            c = min(fitting, key=lambda x: (round(x.floors.end_to_end_ms, 6), -min_spare(x, spec, 0)))
            if mode == "layer-split":
                detail = ", ".join(f"{d}: {sum(v == d for v in c.layer_devices)} layers ({c.off_layers.get(d, 0)} offloaded)"
                                   for d in c.l2_read)
            else:
                off = sum(k == "cpu" for k in c.kv_devices)
                detail = f"{off} layers offloaded, each card streams its heads' share" if off else "all KV on-chip"
                if not allow_tp:
                    detail += "; ruled out"
            out.append(ModeOption(mode, True, c.floors, detail))
        else:
            c = min(group, key=lambda x: sum(b for _, b in x.shortfalls))
            out.append(ModeOption(mode, False, c.floors, c.shortfalls[0][0]))
    return tuple(out)


def _device_plans(lay: Layout, spec: DeviceSpec, headroom: int, cpu_headroom: int) -> tuple[DevicePlan, ...]:
    plans = []
    for i, gpu in enumerate(spec.gpus):
        dev = f"cuda:{i}"
        plans.append(DevicePlan(dev, gpu.name, gpu.total_bytes, gpu.free_bytes, headroom,
                                tuple(lay.parts.get(dev, {}).items()), gpu.bandwidth_gbs, gpu.pcie_gbs,
                                lay.l2_read.get(dev, 0), lay.l2_pcie.get(dev, 0)))
    plans.append(DevicePlan("cpu", "CPU RAM", spec.ram_total_bytes, spec.ram_available_bytes, cpu_headroom,
                            tuple(lay.parts.get("cpu", {}).items()), spec.cpu_bandwidth_gbs, None,
                            lay.l2_read.get("cpu", 0), 0))
    return tuple(plans)
