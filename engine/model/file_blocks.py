"""A GGUF file's projections as the runner's weights: its blocks by the runner's names, rows in HF
order (llama.cpp stores Q and K rows permuted), q|k|v and gate|up fused, kept in a small cache file
beside a converted model folder so a later load reads them without re-reading the GGUF.
The block kinds and their kernels: engine/model/quant.py."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.model.quant import BLOCK_BYTES, QuantWeight, StackedWeight, blocks_tag, cpu_prefill_attention_dtype

log = logging.getLogger(__name__)

_LAYER_TENSORS = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
                  "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}


def unpermute_rows(n_rows: int, n_heads: int) -> np.ndarray:
    """Row order that undoes llama.cpp's Q/K permutation: the converter interleaves each head's
    two rotary halves (HF row h*D + i*D/2 + j is stored at h*D + 2j + i)."""
    head_dim = n_rows // n_heads
    return np.arange(n_rows).reshape(n_heads, head_dim // 2, 2).transpose(0, 2, 1).reshape(-1)


class FileBlocks(NamedTuple):
    """One tensor's raw GGUF blocks, rows in HF order, not yet packed."""

    kind: str
    blocks: np.ndarray  # [out, nb * block bytes] uint8
    in_features: int


def read_gguf_blocks(path: Path, arch) -> tuple[dict[str, FileBlocks], list[str]]:
    """The quantized projections of a GGUF, by the runner's names ("layers.3.q", "embed",
    "lm_head"), rows in HF order; plus the tensors left to the float32 path (unsupported kinds)."""
    from engine.store.gguf_file import read_header

    gguf = read_header(Path(path))  # memory-mapped: blocks are read only when used
    tensors = gguf.tensors
    found: dict[str, FileBlocks] = {}
    skipped: list[str] = []
    wanted = {"embed": "token_embd.weight", "lm_head": "output.weight"}
    for i in range(arch.n_layers):
        wanted.update({f"layers.{i}.{role}": f"blk.{i}.{name}.weight" for role, name in _LAYER_TENSORS.items()})
    for key, name in wanted.items():
        tensor = tensors.get(name)
        if tensor is None:
            continue
        kind = tensor.kind
        if kind not in BLOCK_BYTES:
            if kind not in ("F32", "F16", "BF16"):
                skipped.append(f"{name} ({kind})")
            continue
        blocks = gguf.blocks(name)  # [out, bytes] uint8, memory-mapped
        if key.endswith((".q", ".k")):
            heads = arch.n_heads if key.endswith(".q") else arch.n_kv_heads
            blocks = blocks[unpermute_rows(blocks.shape[0], heads)]
        found[key] = FileBlocks(kind, blocks, int(tensor.shape[-1]))
    if "output.weight" not in tensors and "embed" in found:  # tied: the file stores the table once
        found["lm_head"] = found["embed"]
    return found, skipped


def _fused(parts: list[FileBlocks | None]) -> QuantWeight | None:
    """One QuantWeight over parts stacked along `out` (q|k|v, gate|up), a StackedWeight where the
    parts differ in kind, or None when a part is missing (that projection stays float32)."""
    if any(p is None for p in parts) or len({p.in_features for p in parts}) != 1:
        return None
    if len({p.kind for p in parts}) != 1:
        return StackedWeight([QuantWeight(p.kind, p.blocks, p.in_features) for p in parts])
    blocks = parts[0].blocks if len(parts) == 1 else np.concatenate([p.blocks for p in parts])
    return QuantWeight(parts[0].kind, blocks, parts[0].in_features)


def file_weights(gguf: Path, arch) -> dict[str, QuantWeight]:
    """The runner's projections from a GGUF: {"layers.3.wqkv": ..., "embed": ..., "lm_head": ...}
    (fused q|k|v and gate|up), only those the file holds in a supported kind."""
    found, skipped = read_gguf_blocks(Path(gguf), arch)
    fused = {"wqkv": ("q", "k", "v"), "wo": ("o",), "w_gate_up": ("gate", "up"), "w_down": ("down",)}
    weights: dict[str, QuantWeight] = {}
    for i in range(arch.n_layers):
        for attr, roles in fused.items():
            weight = _fused([found.get(f"layers.{i}.{r}") for r in roles])
            if weight is not None:
                weights[f"layers.{i}.{attr}"] = weight
    embed = _fused([found.get("embed")])
    head = embed if found.get("lm_head") is found.get("embed") else _fused([found.get("lm_head")])
    weights.update({k: w for k, w in (("embed", embed), ("lm_head", head)) if w is not None})
    if skipped:
        log.warning("%s: %d tensors are in kinds we cannot run as stored (%s...): they run in float32",
                    Path(gguf).name, len(skipped), ", ".join(skipped[:3]))
    return weights


# ---------------------------------------------------------------- the packed copy, cached

CACHE_FILE = "gguf-blocks.triforce"  # safetensors inside, but not named *.safetensors: not model weights


def _cache_stamp(gguf: Path) -> str:
    """What the cached copy was built from: the file (by size and mtime) and torch (the packer's
    tile layout is torch's own and may change between versions)."""
    stat = Path(gguf).stat()
    return json.dumps({"format": 1, "gguf": Path(gguf).name, "size": stat.st_size, "mtime": stat.st_mtime_ns,
                       "torch": torch.__version__})


def cached_file_weights(gguf: Path, arch, cache: Path | None) -> dict[str, QuantWeight]:
    """file_weights, read from `cache` when it was built from this file by this torch (a load then
    takes a fraction of a second instead of seconds), else built and written there (best effort)."""
    stamp = _cache_stamp(gguf)
    if cache is not None and cache.is_file():
        try:
            with safe_open(str(cache), framework="pt") as handle:
                meta = handle.metadata() or {}
                if meta.get("stamp") == stamp:
                    shapes = json.loads(meta["weights"])
                    keys = set(handle.keys())

                    def cached(key: str) -> torch.Tensor | None:
                        return handle.get_tensor(key) if key in keys else None

                    built = {name: QuantWeight(kind, handle.get_tensor(f"{name}.blocks").numpy(), in_features,
                                               cached(f"{name}.packed"), cached(f"{name}.scales_zeros"))
                             for name, (kind, in_features) in shapes.items() if name != "lm_head" or kind}
                    if "lm_head" in shapes and not shapes["lm_head"][0]:  # tied: one table
                        built["lm_head"] = built["embed"]
                    return built
        except (OSError, ValueError, KeyError, RuntimeError) as exc:  # damaged: build it again
            log.warning("%s is unreadable (%s): rebuilding it", cache, exc)
    weights = file_weights(gguf, arch)
    if cache is not None and not any(isinstance(w, StackedWeight) for w in weights.values()):
        _write_cache(cache, weights, stamp)
    return weights


def _write_cache(cache: Path, weights: dict[str, QuantWeight], stamp: str) -> None:
    """Write-then-rename; a read-only folder only means the next load packs again."""
    tensors, shapes = {}, {}
    for name, w in weights.items():
        if name == "lm_head" and w is weights.get("embed"):
            shapes[name] = ["", 0]
            continue
        shapes[name] = [w.kind, w.in_features]
        tensors[f"{name}.blocks"] = torch.from_numpy(np.require(w.blocks, requirements=("C", "W")))
        if w.packed_int4 is not None:  # torch's copy, where it was built (no native kernel here)
            tensors[f"{name}.packed"], tensors[f"{name}.scales_zeros"] = w.packed_int4
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata={"stamp": stamp, "weights": json.dumps(shapes)})
        os.replace(tmp, cache)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        log.info("GGUF blocks not cached in %s (%s)", cache.parent, exc)


def use_file_blocks(runner, gguf: Path, cache: Path | None = None) -> int:
    """Swap the runner's float32 projections for the GGUF's own blocks where the file has them
    in a supported kind; returns how many projections now run quantized (0: nothing changed)."""
    weights = cached_file_weights(Path(gguf), runner.arch, cache)
    for name, weight in weights.items():
        if name.startswith("layers."):
            _, index, attr = name.split(".")
            layer = runner.layers[int(index)]
            setattr(layer, attr, weight)
            if attr == "w_gate_up":
                layer.gate_up_packed = None  # the float32 prepacked copy is no longer used
        elif name == "embed":
            runner.embed = weight
        else:
            runner.lm_head, runner._lm_head_packed = weight, None
    if weights:  # a different target from float32's (its K/V differ), and one per kernel
        runner.weights_tag = blocks_tag(list(weights.values()))
        if runner.device.type == "cpu":
            runner.prefill_dtype = cpu_prefill_attention_dtype()
    return len(weights)
