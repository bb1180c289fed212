"""Candidate layouts: where every byte goes on the CPU alone, one card, a layer split or tensor parallel.

Greedy per GPU: target weights first, then the retrieval cache and the draft model with its
StreamingLLM cache, then working memory, then as many layers' full KV as fit; the rest of the KV
lives in pinned CPU memory. Every size comes from the shapes and from DecodeSettings' own methods.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.offload.devices import GB, DeviceSpec
from engine.offload.plan_types import Floors
from engine.offload.shapes import ModelShape
from engine.settings import DecodeSettings

STAGING_SLOTS = 2  # GPU buffers of one layer's KV each: copy layer i+1 while layer i computes
SCORE_PIECE_TOKENS = 16384  # RetrievalCache.SCORE_PIECE: offloaded keys come to the card in pieces to be scored
RUNTIME_BYTES = 224 << 20  # what importing torch and the engine leaves resident in the process
PREFILL_COPY_MAX = 1 << 30  # the largest float32 copy of a file's projections a prefill keeps (engine/model/quant.py)
TOKENIZER_BYTES_PER_TOKEN = 900  # a fast tokenizer's tables at their peak while loading, per vocabulary entry


@dataclass(frozen=True)
class Sizes:
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
    weights_as_stored: bool = False  # a GGUF's blocks, memory-mapped (the CPU); else widened to `dtype`
    prefill_weights: int = 0  # float32 copy of a file's blocks a long prefill keeps (engine/model/quant.py)


@dataclass
class Layout:
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
    cpu_heads: list[int] = field(default_factory=list)  # per layer: KV heads (per card share) attended on the CPU
    cpu_split: dict[str, int] = field(default_factory=dict)  # per card: CPU heads over all its offloaded layers
    weights_as_stored: bool = False  # the CPU runs the file's own blocks (Sizes.weights_as_stored)


def budget_tokens(settings: DecodeSettings, context_tokens: int) -> int:
    if settings.mode in ("ar", "draft-only"):
        return 0
    return min(settings.budget, context_tokens)  # a retrieval cache never holds more than the context


def retrieval_capacity(settings: DecodeSettings, budget: int) -> int:
    """Slots RetrievalCache allocates: the budget plus the settings' headroom (the decoder asks the
    same method)."""
    return budget + settings.retrieval_headroom()


def draft_capacity(settings: DecodeSettings) -> int:
    """Slots the draft's StreamingCache allocates (ModelDrafter asks the same method)."""
    return settings.draft_cache_capacity()


def cpu_kv_storage(dtype: int) -> tuple[int, int]:
    """(bytes per K/V element, positions a buffer is padded to) where the CPU holds the KV: float16
    rounded to the exact kernel's CHUNK where the native kernels run (engine/kv/full.py stores
    kv_dtype float16 then), else the model's dtype, unpadded."""
    from engine import native
    from engine.kv.exact_attention import CHUNK

    return (2, CHUNK) if dtype == 4 and native.available() else (dtype, 1)


def _padded(tokens: int, multiple: int) -> int:
    return -(-tokens // multiple) * multiple


def sizes_for(target: ModelShape, draft: ModelShape | None, context: int, settings: DecodeSettings,
           dtype: int, prefill_chunk: int, cpu_kv: tuple[int, int] | None = None) -> Sizes:
    """cpu_kv: (bytes per element, padding) of the target's KV where it stays on the CPU
    (cpu_kv_storage); None: `dtype`, unpadded (a card's)."""
    from engine.native import BLOCK_KEYS  # the retrieval cache pads its native buffers to a block of keys

    kv_bytes, pad = cpu_kv or (dtype, 1)
    layer_tok = target.layer_kv_bytes_per_token(kv_bytes)
    budget = budget_tokens(settings, context)
    retrieval = budget > 0
    gamma = max(settings.gamma1, settings.gamma2) + 1
    tokens = min(prefill_chunk, context)
    # One prefill chunk in flight: residual + norm + attn out + q/k/v + SwiGLU gate/up/act.
    act = tokens * (3 * target.hidden + (target.heads + 2 * target.kv_heads) * target.head_dim
                    + 3 * target.intermediate) * dtype
    draft_weights = draft.weight_bytes(dtype) if draft else 0
    draft_window = draft_capacity(settings)
    kv_row = target.kv_heads * target.head_dim  # one token's keys in one layer, elements
    # RetrievalCache.rebuild, per layer: fp32 chunk means summed straight from the cache (no fp32
    # copy of the layer), one piece of offloaded keys brought over to be scored, int64 gather
    # indices and the gathered K/V of the budget before they land in the retrieval buffers.
    scratch = (math.ceil(context / settings.chunk) * kv_row * 4 + min(SCORE_PIECE_TOKENS, context) * kv_row * dtype
               + budget * target.kv_heads * 8 + 2 * budget * kv_row * dtype if retrieval else 0)
    file_blocks = cpu_kv is not None and target.file_bytes is not None  # the CPU runs the GGUF's own blocks
    if file_blocks:
        layers_bytes, embeddings, head = target.file_bytes
        layer_weights = layers_bytes // target.layers
        head_read = head if not target.tie_embeddings else embeddings + head
        widened = 4 * target.layers * (target.layer_params() - 2 * target.hidden)  # projections, not the norms
        prefill_weights = widened if widened <= PREFILL_COPY_MAX else 0
    else:
        layer_weights, embeddings = target.layer_params() * dtype, target.embedding_params() * dtype
        head, head_read, prefill_weights = target.lm_head_params() * dtype, (target.vocab * target.hidden + target.hidden) * dtype, 0
    return Sizes(
        layers=target.layers,
        tied=target.tie_embeddings,
        layer_weights=layer_weights,
        embeddings=embeddings,
        lm_head=head,
        head_read=head_read,
        layer_kv=_padded(context, pad) * layer_tok,
        layer_retrieval=(_padded(retrieval_capacity(settings, budget), BLOCK_KEYS if pad > 1 else 1) * layer_tok
                         if retrieval else 0),
        layer_retrieval_read=(budget + settings.gamma2 + 1) * layer_tok if retrieval else 0,
        rebuild_scratch=scratch,
        draft_weights=draft_weights,
        draft_cache=draft_window * draft.kv_bytes_per_token(dtype) if draft else 0,
        draft_read=((draft.layers * draft.layer_params() + draft.vocab * draft.hidden + draft.hidden) * dtype
                    + draft_window * draft.kv_bytes_per_token(dtype)) if draft else 0,
        activations=act,
        logits=gamma * target.vocab * 4 * 3,  # fp32 p, q and residual for gamma+1 positions
        weights_as_stored=file_blocks,
        prefill_weights=prefill_weights,
    )


def cpu_layout(s: Sizes, spec: DeviceSpec, cpu_headroom: int, vocab: int = 0) -> Layout:
    """Everything on the CPU, counted as the process holds it: with the runtime (torch, the
    tokenizer of `vocab` entries), so the total is what the process's peak resident set should be."""
    n = s.layers
    runtime = RUNTIME_BYTES + TOKENIZER_BYTES_PER_TOKEN * vocab
    parts = {"cpu": nonzero({
        "target_layers": n * s.layer_weights, "target_embeddings": s.embeddings, "target_lm_head": s.lm_head,
        "full_kv": n * s.layer_kv, "retrieval_cache": n * s.layer_retrieval, "rebuild_scratch": s.rebuild_scratch,
        "draft_weights": s.draft_weights, "draft_cache": s.draft_cache, "working": s.activations + s.logits,
        "prefill_weights_f32": s.prefill_weights, "runtime": runtime})}
    lay = Layout("cpu", parts, ["cpu"] * n, ["cpu"] * n, "cpu" if s.draft_weights else None,
                 weights_as_stored=s.weights_as_stored)
    need, have = sum(parts["cpu"].values()), spec.ram_available_bytes - cpu_headroom
    if need > have:
        lay.shortfalls.append((f"weights, KV and caches need {gb_text(need)} but the CPU has {gb_text(have)} of RAM available"
                               f" ({gb_text(spec.ram_available_bytes)} minus {gb_text(cpu_headroom)} headroom)", need - have))
    lay.l2_read = {"cpu": n * s.layer_weights + s.head_read + n * s.layer_kv}
    lay.l1_read = {"cpu": n * s.layer_weights + s.head_read + n * s.layer_retrieval_read}
    lay.l2_pcie = {"cpu": 0}
    return lay


def gpu_candidates(s: Sizes, target: ModelShape, draft: ModelShape | None, spec: DeviceSpec,
                    headroom: int, cpu_headroom: int, tp_offload: bool) -> list[Layout]:
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


def _split_layout(s: Sizes, spec: DeviceSpec, counts: list[int], draft_card: int, headroom: int,
                  cpu_headroom: int) -> Layout:
    """Contiguous runs of layers per card; each card keeps as much of its layers' KV as fits."""
    L, first = s.layers, 0
    cards_used = [i for i, c in enumerate(counts) if c]
    lay = Layout("single-gpu" if len(cards_used) == 1 else "layer-split", {}, [], [],
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
        where = f"{dev} has {gb_text(room)} free ({gb_text(gpu.free_bytes)} minus {gb_text(headroom)} headroom)"
        if weights > room:
            lay.shortfalls.append((f"target weights need {gb_text(weights)} but {where}", weights - room))
        retrieval = n * s.layer_retrieval + (s.rebuild_scratch if n else 0)
        drafting = s.draft_weights + s.draft_cache if i == draft_card else 0
        working = (s.activations if n else 0) + (s.logits if has_head or drafting else 0)
        parts.update(retrieval_cache=n * s.layer_retrieval, rebuild_scratch=s.rebuild_scratch if n else 0,
                     draft_weights=drafting and s.draft_weights,
                     draft_cache=drafting and s.draft_cache, working=working)
        left = room - weights
        if weights <= room and retrieval + drafting + working > left:
            lay.shortfalls.append((f"retrieval cache, draft model and working memory need {gb_text(retrieval + drafting + working)}"
                                   f" but {dev} has {gb_text(left)} left after the target weights", retrieval + drafting + working - left))
        left -= retrieval + drafting + working
        per_layer = s.layer_kv
        if n * per_layer <= left:
            resident = n
        else:  # offloading: two staging buffers of one layer's KV each, then resident layers
            staging = STAGING_SLOTS * s.layer_kv
            resident = max(0, min(n, (left - staging) // per_layer)) if left >= staging else 0
            parts["staging"] = staging
            if 0 <= left < staging:  # (left < 0: already reported above)
                lay.shortfalls.append((f"KV staging buffers need {gb_text(staging)} but {dev} has {gb_text(left)} left", staging - left))
        offloaded = spread(n, n - resident)
        parts["full_kv"] = resident * s.layer_kv
        cpu["offloaded_kv"] += (n - resident) * s.layer_kv
        lay.parts[dev] = nonzero(parts)
        lay.layer_devices += [dev] * n
        lay.kv_devices += ["cpu" if j in offloaded else dev for j in range(n)]
        lay.l2_read[dev] = n * s.layer_weights + (s.head_read if has_head else 0) + n * s.layer_kv
        lay.l2_pcie[dev] = (n - resident) * s.layer_kv
        lay.off_layers[dev] = n - resident
        lay.l1_read[dev] = n * s.layer_weights + (s.head_read if has_head else 0) + n * s.layer_retrieval_read
        first += n
    lay.parts["cpu"] = nonzero(cpu)
    pinned, have = sum(cpu.values()), spec.ram_available_bytes - cpu_headroom
    if pinned > have:
        lay.shortfalls.append((f"offloaded KV needs {gb_text(pinned)} of pinned CPU memory but the CPU has {gb_text(have)} available",
                               pinned - have))
    return lay


def _tensor_parallel_layout(s: Sizes, spec: DeviceSpec, draft_card: int | None, headroom: int,
                            cpu_headroom: int, offload: bool) -> Layout:
    """Every layer split by KV heads (and MLP columns) across all cards. With `offload`, the same
    layers are offloaded on every card and each card streams its own half of their KV heads,
    so all PCIe links carry one layer at once."""
    n_gpu, L = len(spec.gpus), s.layers
    devs = [f"cuda:{i}" for i in range(n_gpu)]
    joined = "+".join(devs)
    lay = Layout("tensor-parallel", {}, [joined] * L, [], f"cuda:{draft_card}" if draft_card is not None else None)
    share = lambda x: -(-x // n_gpu)  # noqa: E731  ceil: each card's slice
    fixed, rooms = [], []
    for i, (gpu, dev) in enumerate(zip(spec.gpus, devs)):
        drafting = i == draft_card
        lay.parts[dev] = nonzero({
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
        lay.shortfalls.append((f"tensor parallel with all KV on-chip needs {gb_text(need)} on {devs[i]}"
                               f" but it has {gb_text(rooms[i])} free after headroom", need - rooms[i]))
    offloaded = spread(L, L - resident)
    lay.kv_devices = ["cpu" if j in offloaded else joined for j in range(L)]
    for i, dev in enumerate(devs):
        extra = {"full_kv": resident * share(s.layer_kv)}
        if resident < L and offload:
            extra["staging"] = staging
        lay.parts[dev].update(nonzero(extra))
        need = sum(lay.parts[dev].values())
        if offload and need > rooms[i]:
            lay.shortfalls.append((f"tensor parallel needs {gb_text(need)} on {dev} (weights, caches and staging)"
                                   f" but it has {gb_text(rooms[i])} free after headroom", need - rooms[i]))
        lay.l2_read[dev] = share(L * s.layer_weights + s.head_read + L * s.layer_kv)
        lay.l1_read[dev] = share(L * s.layer_weights + s.head_read + L * s.layer_retrieval_read)
        lay.l2_pcie[dev] = (L - resident) * share(s.layer_kv)
        lay.off_layers[dev] = L - resident
    cpu = nonzero({"offloaded_kv": (L - resident) * s.layer_kv})
    lay.parts["cpu"] = cpu
    pinned, have = sum(cpu.values()), spec.ram_available_bytes - cpu_headroom
    if pinned > have:
        lay.shortfalls.append((f"offloaded KV needs {gb_text(pinned)} of pinned CPU memory but the CPU has {gb_text(have)} available",
                               pinned - have))
    return lay


def min_spare(lay: Layout, spec: DeviceSpec, headroom: int) -> int:
    """The tightest card's spare bytes: among equally fast layouts, prefer the balanced one."""
    return min((g.free_bytes - headroom - sum(lay.parts.get(f"cuda:{i}", {}).values()) for i, g in enumerate(spec.gpus)),
               default=0)


def spread(n: int, m: int) -> set[int]:
    """m of n layer indices, evenly spaced, so each PCIe copy overlaps a resident layer's compute."""
    return {int((k + 0.5) * n / m) for k in range(m)} if m > 0 else set()


def nonzero(parts: dict[str, int]) -> dict[str, int]:
    return {k: int(v) for k, v in parts.items() if v}


def gb_text(nbytes: float) -> str:
    return f"{nbytes / GB:.1f} GB"
