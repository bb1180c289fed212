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
import json
import math
from dataclasses import dataclass, field

from engine.errors import (ContextOverflowError, IncompatibleDraftError, InvalidSettingError,
                           OutOfMemoryPlanError)
from engine.offload.shapes import ModelShape
from engine.settings import DecodeSettings

MiB = 1 << 20
GiB = 1 << 30
GB = 1e9  # user-facing sizes are decimal GB, like the errors ("needs 16.1 GB")

DEFAULT_HEADROOM = int(1.5 * GiB)  # per GPU: CUDA context, cuBLAS workspace, fragmentation
DEFAULT_CPU_HEADROOM = 2 * GiB  # kept free in RAM for the app and the OS
PROFILES = ("cpu", "4090", "4090x2", "auto")
STAGING_SLOTS = 2  # GPU buffers of one layer's KV each: copy layer i+1 while layer i computes
SCORE_PIECE_TOKENS = 16384  # RetrievalCache.SCORE_PIECE: offloaded keys come to the card in pieces to be scored
# Built placements: one card, layers split across cards (engine/kv/offload.py, the runner's
# layer_devices) and tensor parallel (engine/model/runner_tp.py, engine/kv/sharded.py). The plan
# picks the lowest floor among them; plan_placement(tensor_parallel=False) rules TP out.
TENSOR_PARALLEL_BUILT = True


@dataclass(frozen=True)
class GpuSpec:
    name: str
    total_bytes: int
    free_bytes: int
    bandwidth_gbs: float  # device memory bandwidth
    pcie_gbs: float  # effective pinned host-to-device copy rate


# RTX 4090: 24564 MiB, 384-bit GDDR6X at 21 Gbps = 1008 GB/s; PCIe 4.0 x16 is 31.5 GB/s raw,
# about 25 GB/s for pinned host-to-device copies in practice.
RTX_4090 = GpuSpec("NVIDIA GeForce RTX 4090", 24564 * MiB, 24564 * MiB, 1008.0, 25.0)


@dataclass(frozen=True)
class DeviceSpec:
    """What the planner may use. RAM is what pinned offloaded KV must fit in."""

    profile: str
    ram_total_bytes: int
    ram_available_bytes: int
    cpu_bandwidth_gbs: float = 10.0  # nominal; this 2-core box reads ~9 GB/s (SmolLM2 fp32 decode)
    gpus: tuple[GpuSpec, ...] = ()
    hop_us: float = 20.0  # hand activations card->host->card (no P2P): layer-split, per boundary
    allreduce_us: float = 30.0  # one small all-reduce staged through host memory (no P2P)
    note: str = ""


def device_spec(name: str, ram_bytes: int | None = None) -> DeviceSpec:
    """A named profile: `cpu` (this machine), `4090`, `4090x2`, or `auto` (detected).

    The GPU profiles describe a workstation with 128 GiB of RAM (8 GiB kept for the OS and
    desktop) unless `ram_bytes` says otherwise; `cpu` and `auto` measure this machine.
    """
    from engine.offload import telemetry

    if name in ("4090", "4090x2"):
        ram = ram_bytes or 128 * GiB
        count = 2 if name == "4090x2" else 1
        return DeviceSpec(name, ram, max(0, ram - 8 * GiB), gpus=(RTX_4090,) * count,
                          note=f"{count} x RTX 4090 (24 GiB, 1008 GB/s, PCIe 4.0 x16 ~25 GB/s, no P2P)")
    if name not in ("cpu", "auto"):
        raise InvalidSettingError(f"device profile {name!r} is unknown: use one of {', '.join(PROFILES)}")
    sample = telemetry.sample_memory()
    total = ram_bytes or sample.ram_total_bytes
    available = min(sample.ram_available_bytes, total)
    gpus: tuple[GpuSpec, ...] = ()
    note = "this machine's CPU and RAM"
    if name == "auto":
        cards = list(sample.gpus)
        if any(g.torch_index is not None for g in cards):
            # this process uses CUDA: plan only the cards torch sees (CUDA_VISIBLE_DEVICES), in its
            # order, so the plan's "cuda:i" is torch's cuda:i (NVML lists every card, in bus order)
            cards = sorted((g for g in cards if g.torch_index is not None), key=lambda g: g.torch_index)
        gpus = tuple(GpuSpec(g.name, g.total_bytes, g.free_bytes, g.bandwidth_gbs or 500.0, g.pcie_gbs or 12.0)
                     for g in cards)
        note = f"detected: {len(gpus)} GPU(s)" if gpus else f"detected: {sample.gpu_note}; planning for the CPU"
    return DeviceSpec("auto" if gpus else "cpu", total, available, gpus=gpus, note=note)


@dataclass(frozen=True)
class Acceptance:
    """Assumed per-token acceptance rates for the modelled end-to-end time (not measured)."""

    l0_by_l1: float = 0.7  # a draft model with a StreamingLLM cache, checked by L1
    ngram_by_l1: float = 0.35  # n-gram lookup in the context instead of a draft model
    l1_by_l2: float = 0.9  # the retrieval cache (budget >= 1K tokens), checked by the full cache


@dataclass(frozen=True)
class DevicePlan:
    """One device's share: bytes per component, and the bytes it moves per L2 forward."""

    name: str  # "cpu", "cuda:0"
    label: str
    total_bytes: int
    free_bytes: int
    headroom_bytes: int
    components: tuple[tuple[str, int], ...]  # (component, bytes), headroom not included
    bandwidth_gbs: float
    pcie_gbs: float | None = None
    l2_read_bytes: int = 0  # read from device memory per L2 forward
    l2_pcie_bytes: int = 0  # copied host-to-device per L2 forward (offloaded layers' KV)

    @property
    def used_bytes(self) -> int:
        return sum(b for _, b in self.components)

    @property
    def spare_bytes(self) -> int:
        """Free memory left after everything planned here and the headroom (negative: short)."""
        return self.free_bytes - self.headroom_bytes - self.used_bytes

    def component(self, name: str) -> int:
        return dict(self.components).get(name, 0)

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["components"] = dict(self.components)
        out.update(used_bytes=self.used_bytes, spare_bytes=self.spare_bytes)
        return out


@dataclass(frozen=True)
class Floors:
    """Bandwidth floors in milliseconds. l0/l1/l2: one forward of that level (a few tokens
    cost the same bytes as one). l2 overlaps the PCIe stream with compute (max); l2_serial
    is the no-overlap bound (sum) without prefetch. end_to_end: per generated token under
    `acceptance`."""

    l0_ms: float
    l1_ms: float
    l2_ms: float
    l2_hbm_ms: float
    l2_pcie_ms: float
    l2_serial_ms: float
    l2_prefetched_ms: float  # PCIe time moved off the L2 path: staging filled while L0/L1 draft
    ar_ms: float  # plain autoregressive decoding, one token per full-cache forward (no prefetch window)
    end_to_end_ms: float

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 / self.end_to_end_ms if self.end_to_end_ms > 0 else math.inf

    @property
    def speedup_vs_ar(self) -> float:
        return self.ar_ms / self.end_to_end_ms if self.end_to_end_ms > 0 else 1.0

    def to_dict(self) -> dict:
        out = {k: round(v, 3) for k, v in dataclasses.asdict(self).items()}
        out.update(tokens_per_s=round(self.tokens_per_s, 2), speedup_vs_ar=round(self.speedup_vs_ar, 2))
        return out


@dataclass(frozen=True)
class ModeOption:
    """A way to use the GPUs that was considered, with its floors or why it does not fit."""

    mode: str
    fits: bool
    floors: Floors | None
    detail: str

    def to_dict(self) -> dict:
        return {"mode": self.mode, "fits": self.fits, "detail": self.detail,
                "floor_ms_per_token": self.floors.to_dict() if self.floors else None}


@dataclass(frozen=True)
class Plan:
    fits: bool
    mode: str  # "cpu", "single-gpu", "layer-split", "tensor-parallel"
    mode_reason: str
    target: str
    draft: str | None
    decode_mode: str
    context_tokens: int
    budget_tokens: int
    dtype_bytes: int
    kv_layers_total: int
    kv_layers_offloaded: int
    layer_devices: tuple[str, ...]  # where each layer's weights run
    kv_devices: tuple[str, ...]  # where each layer's full KV lives ("cpu" = pinned, offloaded)
    draft_device: str | None
    devices: tuple[DevicePlan, ...]
    floors: Floors
    acceptance: Acceptance
    gamma1: int
    gamma2: int
    alternatives: tuple[ModeOption, ...] = ()
    shortfalls: tuple[str, ...] = ()
    profile: str = ""
    profile_note: str = ""

    def device(self, name: str) -> DevicePlan:
        return next(d for d in self.devices if d.name == name)

    def bytes_by_component(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for dev in self.devices:
            for comp, n in dev.components:
                out.setdefault(comp, {})[dev.name] = n
        return out

    def to_dict(self) -> dict:
        return {
            "fits": self.fits, "mode": self.mode, "mode_reason": self.mode_reason,
            "profile": self.profile, "profile_note": self.profile_note,
            "target": self.target, "draft": self.draft, "decode_mode": self.decode_mode,
            "context_tokens": self.context_tokens, "budget_tokens": self.budget_tokens,
            "dtype_bytes": self.dtype_bytes,
            "kv_layers_total": self.kv_layers_total, "kv_layers_offloaded": self.kv_layers_offloaded,
            "layer_devices": list(self.layer_devices), "kv_devices": list(self.kv_devices),
            "draft_device": self.draft_device,
            "devices": [d.to_dict() for d in self.devices],
            "bytes_by_component": self.bytes_by_component(),
            "floor_ms_per_token": self.floors.to_dict(),
            "assumptions": {
                **dataclasses.asdict(self.acceptance), "gamma1": self.gamma1, "gamma2": self.gamma2,
                "floor": "bytes read / bandwidth per forward; L2's PCIe stream overlaps compute (max)",
                "kv_filled_tokens": self.context_tokens,
            },
            "alternatives": [a.to_dict() for a in self.alternatives],
            "shortfalls": list(self.shortfalls),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Sizes:
    """Every byte count the candidate layouts share, computed once."""

    layers: int
    tied: bool  # lm_head shares the embedding matrix
    layer_weights: int
    embeddings: int
    lm_head: int  # untied head + final norm (norm only when tied)
    head_read: int  # bytes the lm_head reads per forward (the embedding matrix when tied)
    layer_kv: int  # one layer's full KV at context_tokens
    layer_retrieval: int  # one layer's retrieval cache buffers (budget + recent/speculation slots)
    layer_retrieval_read: int  # what an L1 forward reads of them (budget + gamma2 + 1 tokens)
    rebuild_scratch: int  # transient while the retrieval cache is rebuilt, one layer at a time
    draft_weights: int
    draft_cache: int
    draft_read: int  # bytes one draft step reads
    activations: int
    logits: int


@dataclass
class _Layout:
    mode: str
    parts: dict[str, dict[str, int]]  # device -> component -> bytes
    layer_devices: list[str]
    kv_devices: list[str]
    draft_device: str | None
    shortfalls: list[tuple[str, int]] = field(default_factory=list)  # (message, bytes short)
    l2_read: dict[str, int] = field(default_factory=dict)
    l2_pcie: dict[str, int] = field(default_factory=dict)
    l1_read: dict[str, int] = field(default_factory=dict)
    off_layers: dict[str, int] = field(default_factory=dict)  # offloaded layers each card streams
    floors: Floors | None = None


def plan_placement(target: ModelShape, draft: ModelShape | None, context_tokens: int,
                   settings: DecodeSettings, devices: DeviceSpec | str, *,
                   headroom_bytes: int = DEFAULT_HEADROOM, cpu_headroom_bytes: int = DEFAULT_CPU_HEADROOM,
                   dtype_bytes: int | None = None, prefill_chunk: int = 1024,
                   acceptance: Acceptance = Acceptance(), tp_offload: bool = True,
                   tensor_parallel: bool | None = None, raise_on_misfit: bool = True,
                   same_as: "Plan | None" = None) -> Plan:
    """Place `target` (+ `draft`) for a cache of `context_tokens` on `devices`.

    dtype_bytes: weights and KV; default 2 (bf16) on GPUs, 4 (fp32) on the CPU.
    tp_offload: let tensor parallel offload KV too (each card streams its heads' share);
    False plans tensor parallel only when all KV fits on-chip.
    tensor_parallel: may the plan *choose* tensor parallel (default: TENSOR_PARALLEL_BUILT, yes).
    It is always computed and reported among the alternatives.
    same_as: keep the weights where this earlier plan put them (its mode, each layer's card, the
    draft's card) and decide only the KV: how a loaded model's cache grows.
    Raises ContextOverflowError, IncompatibleDraftError, InvalidSettingError on bad input and
    OutOfMemoryPlanError naming what does not fit (unless raise_on_misfit=False, which returns
    the closest plan with fits=False and its shortfalls).
    """
    spec = devices if isinstance(devices, DeviceSpec) else device_spec(devices)
    settings.validate()
    _check_inputs(target, draft, context_tokens, settings, spec)
    if settings.mode in ("ar", "retrieval-only"):
        draft = None
    dtype = dtype_bytes or (2 if spec.gpus else 4)
    sizes = _sizes(target, draft, context_tokens, settings, dtype, prefill_chunk)
    rates = (acceptance.l0_by_l1 if draft else acceptance.ngram_by_l1, acceptance.l1_by_l2)

    if not spec.gpus:
        candidates = [_cpu_layout(sizes, spec, cpu_headroom_bytes)]
    else:
        candidates = _gpu_candidates(sizes, target, draft, spec, headroom_bytes, cpu_headroom_bytes, tp_offload)
    for lay in candidates:
        lay.floors = _floors(lay, sizes, spec, target, settings, rates)
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
        best = min(fitting, key=lambda c: (round(c.floors.end_to_end_ms, 6), order[c.mode], -_min_spare(c, spec, headroom_bytes)))
    else:
        best = min(choosable, key=lambda c: sum(b for _, b in c.shortfalls))
    if best.shortfalls and raise_on_misfit:
        hint = "use a shorter context, a smaller model or budget, or more memory"
        raise OutOfMemoryPlanError("; ".join(m for m, _ in best.shortfalls) + f": {hint}")
    alternatives = _alternatives(candidates, spec, allow_tp)
    return Plan(
        fits=not best.shortfalls, mode=best.mode, mode_reason=_mode_reason(best, alternatives, spec, allow_tp),
        target=target.name, draft=draft.name if draft else None, decode_mode=settings.mode,
        context_tokens=context_tokens, budget_tokens=_budget(settings, context_tokens), dtype_bytes=dtype,
        kv_layers_total=target.layers, kv_layers_offloaded=sum(d == "cpu" for d in best.kv_devices) if spec.gpus else 0,
        layer_devices=tuple(best.layer_devices), kv_devices=tuple(best.kv_devices),
        draft_device=best.draft_device, devices=_device_plans(best, spec, headroom_bytes, cpu_headroom_bytes),
        floors=best.floors, acceptance=acceptance, gamma1=settings.gamma1, gamma2=settings.gamma2,
        alternatives=alternatives, shortfalls=tuple(m for m, _ in best.shortfalls),
        profile=spec.profile, profile_note=spec.note)


def _check_inputs(target: ModelShape, draft: ModelShape | None, context_tokens: int,
                  settings: DecodeSettings, spec: DeviceSpec) -> None:
    if context_tokens < 1:
        raise InvalidSettingError(f"context of {context_tokens} tokens is out of range: use 1 or more")
    if context_tokens > target.max_context:
        raise ContextOverflowError(
            f"context of {context_tokens} tokens exceeds {target.name}'s maximum of {target.max_context}:"
            f" use {target.max_context} tokens or fewer")
    if draft is not None and settings.mode in ("triforce", "draft-only"):
        # Same tokenizer, possibly padded embedding rows (Qwen2.5: 152064 vs 151936).
        padded = draft.model_type == target.model_type and abs(draft.vocab - target.vocab) <= 1024
        if draft.vocab != target.vocab and not padded:
            raise IncompatibleDraftError(
                f"draft {draft.name} has a {draft.vocab}-token vocabulary but {target.name} has {target.vocab}:"
                " pick a draft with the same tokenizer (the preset's draft, or none for n-gram drafting)")
        window = _draft_capacity(settings)
        if window > draft.max_context:
            raise ContextOverflowError(
                f"draft window of {window} tokens exceeds {draft.name}'s maximum of {draft.max_context}:"
                f" use a draft window under {draft.max_context - (window - settings.draft_window)}")
    for i, gpu in enumerate(spec.gpus):
        if gpu.free_bytes <= 0:
            raise OutOfMemoryPlanError(f"cuda:{i} ({gpu.name}) reports 0 bytes free: close what holds it or pick other devices")
    if spec.ram_available_bytes <= 0:
        raise OutOfMemoryPlanError("the CPU reports 0 bytes of RAM available: close other programs")


def _budget(settings: DecodeSettings, context_tokens: int) -> int:
    if settings.mode in ("ar", "draft-only"):
        return 0
    return min(settings.budget, context_tokens)  # a retrieval cache never holds more than the context


def _retrieval_capacity(settings: DecodeSettings, budget: int) -> int:
    """Slots RetrievalCache allocates: the budget plus the settings' headroom (the decoder asks the
    same method)."""
    return budget + settings.retrieval_headroom()


def _draft_capacity(settings: DecodeSettings) -> int:
    """Slots the draft's StreamingCache allocates (ModelDrafter asks the same method)."""
    return settings.draft_cache_capacity()


def _sizes(target: ModelShape, draft: ModelShape | None, context: int, settings: DecodeSettings,
           dtype: int, prefill_chunk: int) -> _Sizes:
    layer_tok = target.layer_kv_bytes_per_token(dtype)
    budget = _budget(settings, context)
    retrieval = budget > 0
    gamma = max(settings.gamma1, settings.gamma2) + 1
    tokens = min(prefill_chunk, context)
    # One prefill chunk in flight: residual + norm + attn out + q/k/v + SwiGLU gate/up/act.
    act = tokens * (3 * target.hidden + (target.heads + 2 * target.kv_heads) * target.head_dim
                    + 3 * target.intermediate) * dtype
    draft_weights = draft.weight_bytes(dtype) if draft else 0
    draft_window = _draft_capacity(settings)
    kv_row = target.kv_heads * target.head_dim  # one token's keys in one layer, elements
    # RetrievalCache.rebuild, per layer: fp32 chunk means summed straight from the cache (no fp32
    # copy of the layer), one piece of offloaded keys brought over to be scored, int64 gather
    # indices and the gathered K/V of the budget before they land in the retrieval buffers.
    scratch = (math.ceil(context / settings.chunk) * kv_row * 4 + min(SCORE_PIECE_TOKENS, context) * kv_row * dtype
               + budget * target.kv_heads * 8 + 2 * budget * kv_row * dtype if retrieval else 0)
    return _Sizes(
        layers=target.layers,
        tied=target.tie_embeddings,
        layer_weights=target.layer_params() * dtype,
        embeddings=target.embedding_params() * dtype,
        lm_head=target.lm_head_params() * dtype,
        head_read=(target.vocab * target.hidden + target.hidden) * dtype,
        layer_kv=context * layer_tok,
        layer_retrieval=_retrieval_capacity(settings, budget) * layer_tok if retrieval else 0,
        layer_retrieval_read=(budget + settings.gamma2 + 1) * layer_tok if retrieval else 0,
        rebuild_scratch=scratch,
        draft_weights=draft_weights,
        draft_cache=draft_window * draft.kv_bytes_per_token(dtype) if draft else 0,
        draft_read=((draft.layers * draft.layer_params() + draft.vocab * draft.hidden + draft.hidden) * dtype
                    + draft_window * draft.kv_bytes_per_token(dtype)) if draft else 0,
        activations=act,
        logits=gamma * target.vocab * 4 * 3,  # fp32 p, q and residual for gamma+1 positions
    )


def _cpu_layout(s: _Sizes, spec: DeviceSpec, cpu_headroom: int) -> _Layout:
    n = s.layers
    parts = {"cpu": _nonzero({
        "target_layers": n * s.layer_weights, "target_embeddings": s.embeddings, "target_lm_head": s.lm_head,
        "full_kv": n * s.layer_kv, "retrieval_cache": n * s.layer_retrieval, "rebuild_scratch": s.rebuild_scratch,
        "draft_weights": s.draft_weights, "draft_cache": s.draft_cache, "working": s.activations + s.logits})}
    lay = _Layout("cpu", parts, ["cpu"] * n, ["cpu"] * n, "cpu" if s.draft_weights else None)
    need, have = sum(parts["cpu"].values()), spec.ram_available_bytes - cpu_headroom
    if need > have:
        lay.shortfalls.append((f"weights, KV and caches need {_gb(need)} but the CPU has {_gb(have)} of RAM available"
                               f" ({_gb(spec.ram_available_bytes)} minus {_gb(cpu_headroom)} headroom)", need - have))
    lay.l2_read = {"cpu": n * s.layer_weights + s.head_read + n * s.layer_kv}
    lay.l1_read = {"cpu": n * s.layer_weights + s.head_read + n * s.layer_retrieval_read}
    lay.l2_pcie = {"cpu": 0}
    return lay


def _gpu_candidates(s: _Sizes, target: ModelShape, draft: ModelShape | None, spec: DeviceSpec,
                    headroom: int, cpu_headroom: int, tp_offload: bool) -> list[_Layout]:
    n_gpu, L = len(spec.gpus), s.layers
    draft_cards = range(n_gpu) if (draft and n_gpu > 1) else [0]
    splits: list[list[int]] = [[L] + [0] * (n_gpu - 1)]  # everything on cuda:0
    if n_gpu == 2:
        splits += [[k, L - k] for k in range(L)]  # k = 0: everything on cuda:1
    elif n_gpu > 2:  # proportional to free memory
        free = [g.free_bytes for g in spec.gpus]
        counts = [int(L * f / sum(free)) for f in free]
        counts[-1] += L - sum(counts)
        splits.append(counts)
    out = [_split_layout(s, spec, counts, d, headroom, cpu_headroom) for counts in splits for d in draft_cards]
    if n_gpu > 1 and target.heads % n_gpu == 0 and target.kv_heads % n_gpu == 0:
        best_card = max(range(n_gpu), key=lambda i: spec.gpus[i].free_bytes)
        out.append(_tensor_parallel_layout(s, spec, best_card if draft else None, headroom, cpu_headroom, tp_offload))
    return out


def _split_layout(s: _Sizes, spec: DeviceSpec, counts: list[int], draft_card: int, headroom: int,
                  cpu_headroom: int) -> _Layout:
    """Contiguous runs of layers per card; each card keeps as much of its layers' KV as fits."""
    L, first = s.layers, 0
    cards_used = [i for i, c in enumerate(counts) if c]
    lay = _Layout("single-gpu" if len(cards_used) == 1 else "layer-split", {}, [], [],
                  f"cuda:{draft_card}" if s.draft_weights else None)
    cpu: dict[str, int] = {"offloaded_kv": 0}
    for i, (gpu, n) in enumerate(zip(spec.gpus, counts)):
        dev = f"cuda:{i}"
        has_head = n and first + n == L
        # Tied embeddings split across cards need a second copy of the matrix for the head.
        head = (s.lm_head + (s.embeddings if s.tied and first > 0 else 0)) if has_head else 0
        weights = n * s.layer_weights + (s.embeddings if n and first == 0 else 0) + head
        parts: dict[str, int] = {"target_layers": n * s.layer_weights,
                                 "target_embeddings": s.embeddings if n and first == 0 else 0,
                                 "target_lm_head": head}
        room = gpu.free_bytes - headroom
        where = f"{dev} has {_gb(room)} free ({_gb(gpu.free_bytes)} minus {_gb(headroom)} headroom)"
        if weights > room:
            lay.shortfalls.append((f"target weights need {_gb(weights)} but {where}", weights - room))
        retrieval = n * s.layer_retrieval + (s.rebuild_scratch if n else 0)
        drafting = s.draft_weights + s.draft_cache if i == draft_card else 0
        working = (s.activations if n else 0) + (s.logits if has_head or drafting else 0)
        parts.update(retrieval_cache=n * s.layer_retrieval, rebuild_scratch=s.rebuild_scratch if n else 0,
                     draft_weights=drafting and s.draft_weights,
                     draft_cache=drafting and s.draft_cache, working=working)
        left = room - weights
        if weights <= room and retrieval + drafting + working > left:
            lay.shortfalls.append((f"retrieval cache, draft model and working memory need {_gb(retrieval + drafting + working)}"
                                   f" but {dev} has {_gb(left)} left after the target weights", retrieval + drafting + working - left))
        left -= retrieval + drafting + working
        per_layer = s.layer_kv
        if n * per_layer <= left:
            resident = n
        else:  # offloading: two staging buffers of one layer's KV each, then resident layers
            staging = STAGING_SLOTS * s.layer_kv
            resident = max(0, min(n, (left - staging) // per_layer)) if left >= staging else 0
            parts["staging"] = staging
            if 0 <= left < staging:  # (left < 0: already reported above)
                lay.shortfalls.append((f"KV staging buffers need {_gb(staging)} but {dev} has {_gb(left)} left", staging - left))
        offloaded = _spread(n, n - resident)
        parts["full_kv"] = resident * s.layer_kv
        cpu["offloaded_kv"] += (n - resident) * s.layer_kv
        lay.parts[dev] = _nonzero(parts)
        lay.layer_devices += [dev] * n
        lay.kv_devices += ["cpu" if j in offloaded else dev for j in range(n)]
        lay.l2_read[dev] = n * s.layer_weights + (s.head_read if has_head else 0) + n * s.layer_kv
        lay.l2_pcie[dev] = (n - resident) * s.layer_kv
        lay.off_layers[dev] = n - resident
        lay.l1_read[dev] = n * s.layer_weights + (s.head_read if has_head else 0) + n * s.layer_retrieval_read
        first += n
    lay.parts["cpu"] = _nonzero(cpu)
    pinned, have = sum(cpu.values()), spec.ram_available_bytes - cpu_headroom
    if pinned > have:
        lay.shortfalls.append((f"offloaded KV needs {_gb(pinned)} of pinned CPU memory but the CPU has {_gb(have)} available",
                               pinned - have))
    return lay


def _tensor_parallel_layout(s: _Sizes, spec: DeviceSpec, draft_card: int | None, headroom: int,
                            cpu_headroom: int, offload: bool) -> _Layout:
    """Every layer split by KV heads (and MLP columns) across all cards. With `offload`, the same
    layers are offloaded on every card and each card streams its own half of their KV heads,
    so all PCIe links carry one layer at once."""
    n_gpu, L = len(spec.gpus), s.layers
    devs = [f"cuda:{i}" for i in range(n_gpu)]
    joined = "+".join(devs)
    lay = _Layout("tensor-parallel", {}, [joined] * L, [], f"cuda:{draft_card}" if draft_card is not None else None)
    share = lambda x: -(-x // n_gpu)  # noqa: E731  ceil: each card's slice
    fixed, rooms = [], []
    for i, (gpu, dev) in enumerate(zip(spec.gpus, devs)):
        drafting = i == draft_card
        lay.parts[dev] = _nonzero({
            "target_layers": share(L * s.layer_weights),
            # the runner keeps the embedding table whole on the first card and gives every card
            # its vocabulary rows of lm_head (a copy of the table's rows when they are tied)
            "target_embeddings": s.embeddings if i == 0 else 0,
            "target_lm_head": share(s.lm_head + (s.embeddings if s.tied else 0)), "retrieval_cache": share(L * s.layer_retrieval),
            "rebuild_scratch": share(s.rebuild_scratch),
            "draft_weights": s.draft_weights if drafting else 0, "draft_cache": s.draft_cache if drafting else 0,
            "working": s.activations + s.logits})
        fixed.append(sum(lay.parts[dev].values()))
        rooms.append(gpu.free_bytes - headroom)
    per_layer = share(s.layer_kv)
    staging = STAGING_SLOTS * share(s.layer_kv)
    if all(f + L * per_layer <= r for f, r in zip(fixed, rooms)):
        resident = L
    elif offload:
        resident = max(0, min((r - f - staging) // per_layer for f, r in zip(fixed, rooms)))
    else:
        resident = 0
    if resident < L and not offload:
        i = max(range(n_gpu), key=lambda k: fixed[k] + L * per_layer - rooms[k])
        need = fixed[i] + L * per_layer
        lay.shortfalls.append((f"tensor parallel with all KV on-chip needs {_gb(need)} on {devs[i]}"
                               f" but it has {_gb(rooms[i])} free after headroom", need - rooms[i]))
    offloaded = _spread(L, L - resident)
    lay.kv_devices = ["cpu" if j in offloaded else joined for j in range(L)]
    for i, dev in enumerate(devs):
        extra = {"full_kv": resident * share(s.layer_kv)}
        if resident < L and offload:
            extra["staging"] = staging
        lay.parts[dev].update(_nonzero(extra))
        need = sum(lay.parts[dev].values())
        if offload and need > rooms[i]:
            lay.shortfalls.append((f"tensor parallel needs {_gb(need)} on {dev} (weights, caches and staging)"
                                   f" but it has {_gb(rooms[i])} free after headroom", need - rooms[i]))
        lay.l2_read[dev] = share(L * s.layer_weights + s.head_read + L * s.layer_kv)
        lay.l1_read[dev] = share(L * s.layer_weights + s.head_read + L * s.layer_retrieval_read)
        lay.l2_pcie[dev] = (L - resident) * share(s.layer_kv)
        lay.off_layers[dev] = L - resident
    cpu = _nonzero({"offloaded_kv": (L - resident) * s.layer_kv})
    lay.parts["cpu"] = cpu
    pinned, have = sum(cpu.values()), spec.ram_available_bytes - cpu_headroom
    if pinned > have:
        lay.shortfalls.append((f"offloaded KV needs {_gb(pinned)} of pinned CPU memory but the CPU has {_gb(have)} available",
                               pinned - have))
    return lay


def _floors(lay: _Layout, s: _Sizes, spec: DeviceSpec, target: ModelShape, settings: DecodeSettings,
            rates: tuple[float, float]) -> Floors:
    def bw(dev: str) -> float:
        return spec.cpu_bandwidth_gbs if dev == "cpu" else spec.gpus[int(dev.split(":")[1])].bandwidth_gbs

    def ms(nbytes: int, gbs: float) -> float:
        return nbytes / (gbs * GB) * 1e3

    devs = list(lay.l2_read)
    hbm = {d: ms(lay.l2_read[d], bw(d)) for d in devs}
    pcie = {d: ms(lay.l2_pcie[d], spec.gpus[int(d.split(":")[1])].pcie_gbs) if lay.l2_pcie[d] else 0.0 for d in devs}
    l0 = ms(s.draft_read, bw(lay.draft_device)) if lay.draft_device else 0.0  # n-gram lookup: ~0
    if lay.mode == "tensor-parallel":
        # Cards work at once on every layer (the slowest card sets the pace), with two
        # host-staged all-reduces per layer and one logits gather.
        sync = (2 * target.layers + 1) * spec.allreduce_us / 1e3
        combine = max
        l1 = max(ms(lay.l1_read[d], bw(d)) for d in devs) + sync
    else:
        # Cards take turns in layer order, handing activations across through host memory.
        sync = max(0, sum(1 for d in devs if lay.l2_read[d]) - 1) * spec.hop_us / 1e3
        combine = sum
        l1 = sum(ms(lay.l1_read[d], bw(d)) for d in devs) + sync
    # Within a card the double-buffered prefetch overlaps its PCIe stream with its compute,
    # so the card's time is the larger of the two, not their sum (l2_serial is the sum).
    l2_hbm, l2_pcie = combine(hbm.values()) + sync, combine(pcie.values())
    serial = l2_hbm + l2_pcie
    ar = combine(max(hbm[d], pcie[d]) for d in devs) + sync
    # While the lower levels draft, each card's link is idle and fills its staging buffers with
    # its first offloaded layers, which then cross PCIe off the L2 critical path.
    window = _drafting_ms(settings, l0, l1, rates)
    credit = {d: min(window, pcie[d] * min(off, STAGING_SLOTS) / off) if (off := lay.off_layers.get(d, 0)) else 0.0
              for d in devs}
    l2 = combine(max(hbm[d], pcie[d] - credit[d]) for d in devs) + sync
    prefetched = combine(credit.values())
    e2e = _end_to_end(settings, l0, l1, l2, rates)
    return Floors(l0, l1, l2, l2_hbm, l2_pcie, serial, prefetched, ar_ms=ar, end_to_end_ms=e2e)


def _expected_tokens(rate: float, gamma: int) -> float:
    """Tokens one verification of `gamma` drafts yields (accepted + correction/bonus), i.i.d. acceptance."""
    return gamma + 1.0 if rate >= 1.0 else (1.0 - rate ** (gamma + 1)) / (1.0 - rate)


def _drafting_ms(settings: DecodeSettings, l0: float, l1: float, rates: tuple[float, float]) -> float:
    """Time the lower levels spend drafting the tokens one L2 forward verifies. In TriForce, L1
    makes tokens for L2 at c1 ms each (its own speculative loop with L0) and L2 checks gamma2."""
    g1, g2 = settings.gamma1, settings.gamma2
    if settings.mode == "ar":
        return 0.0
    if settings.mode == "retrieval-only":
        return g2 * l1
    if settings.mode == "draft-only":
        return g1 * l0
    c1 = (g1 * l0 + l1) / _expected_tokens(rates[0], g1)
    return g2 * c1


def _end_to_end(settings: DecodeSettings, l0: float, l1: float, l2: float, rates: tuple[float, float]) -> float:
    """Modelled ms per generated token: drafting plus one L2 forward, over the tokens it yields."""
    if settings.mode == "ar":
        return l2
    a01, a12 = rates
    drafted = settings.gamma1 if settings.mode == "draft-only" else settings.gamma2
    rate = a01 * a12 if settings.mode == "draft-only" else a12
    return (_drafting_ms(settings, l0, l1, rates) + l2) / _expected_tokens(rate, drafted)


def _alternatives(candidates: list[_Layout], spec: DeviceSpec, allow_tp: bool = True) -> tuple[ModeOption, ...]:
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
            c = min(fitting, key=lambda x: (round(x.floors.end_to_end_ms, 6), -_min_spare(x, spec, 0)))
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


def _mode_reason(best: _Layout, alternatives: tuple[ModeOption, ...], spec: DeviceSpec, allow_tp: bool = True) -> str:
    off = sum(d == "cpu" for d in best.kv_devices)
    streamed = f"{off} layers' KV offloaded to pinned CPU memory and streamed over PCIe per L2 forward"
    if best.mode == "cpu":
        return "no GPU: everything in RAM, fp32"
    if len(spec.gpus) == 1:
        return streamed if off else "everything on the one GPU"
    if best.mode == "tensor-parallel":
        why = ("each card holds its share of every layer's KV heads, so an offloaded layer crosses every PCIe link"
               " at once and each card reads 1/n of the bytes" if off else
               "all KV fits on-chip and each card reads 1/n of the bytes per forward")
        why += "; layer-split cards take turns, so one card (and one link) works at a time"
    elif best.mode == "layer-split":
        why = ("lowest modelled floor" + ("" if allow_tp else " once tensor parallel is ruled out")
               + "; " + (streamed if off else "all KV on-chip"))
    else:
        why = "it all fits on one card; splitting adds hand-offs or all-reduces without reading fewer bytes per card"
    others = []
    for a in alternatives:
        if a.fits:
            built = "" if allow_tp or a.mode != "tensor-parallel" else ", ruled out"
            others.append(f"{a.mode} {a.floors.end_to_end_ms:.1f} ms/token (L2 {a.floors.l2_ms:.1f} ms{built})")
        else:
            others.append(f"{a.mode} does not fit ({a.detail})")
    return f"{why}. Considered: " + "; ".join(others)


def _device_plans(lay: _Layout, spec: DeviceSpec, headroom: int, cpu_headroom: int) -> tuple[DevicePlan, ...]:
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


def _min_spare(lay: _Layout, spec: DeviceSpec, headroom: int) -> int:
    """The tightest card's spare bytes: among equally fast layouts, prefer the balanced one."""
    return min((g.free_bytes - headroom - sum(lay.parts.get(f"cuda:{i}", {}).values()) for i, g in enumerate(spec.gpus)),
               default=0)


def _spread(n: int, m: int) -> set[int]:
    """m of n layer indices, evenly spaced, so each PCIe copy overlaps a resident layer's compute."""
    return {int((k + 0.5) * n / m) for k in range(m)} if m > 0 else set()


def _nonzero(parts: dict[str, int]) -> dict[str, int]:
    return {k: int(v) for k, v in parts.items() if v}


def _gb(nbytes: float) -> str:
    return f"{nbytes / GB:.1f} GB"


def format_bytes(nbytes: float) -> str:
    """Bytes as decimal GB (MB, kB below that) for tables."""
    if abs(nbytes) >= 1e9:
        return f"{nbytes / GB:.2f} GB"
    return f"{nbytes / 1e6:.1f} MB" if abs(nbytes) >= 1e6 else f"{nbytes / 1e3:.1f} kB"


def describe(plan: Plan) -> str:
    """The plan as a readable table: what goes where, GB per device, headroom, per-level floors."""
    devs = plan.devices
    names = [d.name for d in devs]
    rows = []
    draft = f" + draft {plan.draft}" if plan.draft else " (n-gram drafting)" if plan.decode_mode == "triforce" else ""
    rows.append(f"Plan: {plan.target}{draft}, {plan.context_tokens} tokens, {plan.dtype_bytes * 8}-bit,"
                f" retrieval budget {plan.budget_tokens}, mode {plan.decode_mode}")
    rows.append(f"Devices: {plan.profile} ({plan.profile_note})")
    rows.append(f"Placement: {plan.mode}. {plan.mode_reason}")
    rows.append(f"KV layers: {plan.kv_layers_total - plan.kv_layers_offloaded} of {plan.kv_layers_total} on-chip,"
                f" {plan.kv_layers_offloaded} offloaded to pinned CPU memory"
                if plan.mode != "cpu" else f"KV layers: all {plan.kv_layers_total} in RAM")
    if plan.kv_layers_offloaded:
        rows.append("  offloaded layers: " + ",".join(str(i) for i, d in enumerate(plan.kv_devices) if d == "cpu"))
    components = []
    for d in devs:
        components += [c for c, _ in d.components if c not in components]
    width = max([len(c) for c in components] + [16])
    rows.append("")
    rows.append(f"{'component':<{width}}" + "".join(f"{n:>14}" for n in names))
    for comp in components:
        rows.append(f"{comp:<{width}}" + "".join(f"{format_bytes(d.component(comp)) if d.component(comp) else '-':>14}"
                                                  for d in devs))
    for label, get in (("total planned", lambda d: d.used_bytes), ("headroom", lambda d: d.headroom_bytes),
                       ("free now", lambda d: d.free_bytes), ("spare", lambda d: d.spare_bytes)):
        rows.append(f"{label:<{width}}" + "".join(f"{format_bytes(get(d)):>14}" for d in devs))
    f = plan.floors
    rows.append("")
    rows.append("Per-token floor (bytes read / bandwidth; GB = 1e9 bytes):")
    if plan.draft_device:
        rows.append(f"  L0 draft step            {f.l0_ms:9.2f} ms")
    elif plan.decode_mode == "triforce":
        rows.append("  L0 n-gram lookup              ~0 ms")
    if plan.budget_tokens:
        rows.append(f"  L1 retrieval forward     {f.l1_ms:9.2f} ms")
    link = "" if not f.l2_pcie_ms else (
        f" (HBM {f.l2_hbm_ms:.1f} ms, PCIe {f.l2_pcie_ms:.1f} ms overlapped per card,"
        f" {f.l2_prefetched_ms:.1f} ms of it prefetched while drafting; serial {f.l2_serial_ms:.1f} ms)")
    rows.append(f"  L2 full-cache forward    {f.l2_ms:9.2f} ms{link}")
    rows.append(f"  plain autoregressive     {f.ar_ms:9.2f} ms/token")
    a = plan.acceptance
    rates = f"L0->L1 {a.l0_by_l1 if plan.draft else a.ngram_by_l1:.2f}, L1->L2 {a.l1_by_l2:.2f}"
    rows.append(f"  modelled end-to-end      {f.end_to_end_ms:9.2f} ms/token ({f.tokens_per_s:.1f} tok/s,"
                f" {f.speedup_vs_ar:.1f}x AR) assuming acceptance {rates}, gamma1 {plan.gamma1}, gamma2 {plan.gamma2}")
    if plan.alternatives:
        rows.append("")
        rows.append("Two-GPU modes considered:")
        for alt in plan.alternatives:
            if alt.fits:
                rows.append(f"  {alt.mode:<16} fits: L1 {alt.floors.l1_ms:.1f} ms, L2 {alt.floors.l2_ms:.1f} ms,"
                            f" end-to-end {alt.floors.end_to_end_ms:.1f} ms/token ({alt.detail})")
            else:
                rows.append(f"  {alt.mode:<16} does not fit: {alt.detail}")
    if plan.shortfalls:
        rows.append("")
        rows.append("DOES NOT FIT: " + "; ".join(plan.shortfalls))
    return "\n".join(rows)
