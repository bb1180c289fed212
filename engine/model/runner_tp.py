"""Tensor parallel across cards: every layer's heads and MLP columns split, so all cards read
their share of every layer's bytes at once (one RTX 4090's bandwidth per card, all busy).

Card s holds, for every layer, KV heads [a_s, b_s) with their query heads, the matching columns
of o_proj, a slice of the MLP's intermediate columns (gate/up rows, down columns), and a slice
of the vocabulary rows of lm_head. The embedding table and the residual stream live on the first
card. Per layer: the residual goes to every card, each computes its partial attention output
(and MLP output), and the partials are summed on the first card: two small all-reduces per
layer, staged through host memory when the cards have no P2P (RTX 4090s), which torch's
cross-device copy does by itself. Kernels are launched from one thread and run asynchronously,
so the cards work at the same time.

The caches are `ShardedFullCache` / `ShardedRetrievalCache` (engine/kv/sharded.py): card s
attends on its own part. Splitting a matmul changes float summation order, so logits differ
from the one-card runner by rounding (tests bound it); every decoding mode on this runner is
still token-identical to autoregressive decoding on this runner.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from engine.kv.full import FullCache
from engine.kv.sharded import ShardedFullCache
from engine.errors import InvalidSettingError
from engine.kv.rope import Rotary
from engine.model.runner import Architecture, LayerWeights, layer_tensors, read_safetensors, rms_norm, state_tensor


def split_evenly(n: int, parts: int) -> list[tuple[int, int]]:
    """[first, last) ranges covering 0..n in `parts` pieces whose sizes differ by at most one."""
    base, extra = divmod(n, parts)
    out, first = [], 0
    for i in range(parts):
        last = first + base + (1 if i < extra else 0)
        out.append((first, last))
        first = last
    return out


@dataclass(frozen=True)
class Shard:
    """What one card computes, as [first, last) index ranges into the unsplit model."""

    device: torch.device
    kv_heads: tuple[int, int]
    q_heads: tuple[int, int]
    ffn: tuple[int, int]  # intermediate (MLP) columns
    vocab: tuple[int, int]  # lm_head rows


def plan_shards(arch: Architecture, devices: Sequence[torch.device | str]) -> list[Shard]:
    """Split by whole KV heads (each card keeps its query groups whole), MLP and vocabulary evenly."""
    n = len(devices)
    if n < 1:
        raise InvalidSettingError("tensor parallel needs at least one device")
    if arch.n_kv_heads % n:
        raise InvalidSettingError(f"tensor parallel over {n} cards needs the KV heads ({arch.n_kv_heads}) to split "
                                  f"evenly: use {', '.join(str(k) for k in range(1, n) if arch.n_kv_heads % k == 0)} "
                                  f"card(s) or the layer split")
    group = arch.n_heads // arch.n_kv_heads
    kv = split_evenly(arch.n_kv_heads, n)
    return [Shard(torch.device(d), kv[i], (kv[i][0] * group, kv[i][1] * group),
                  split_evenly(arch.intermediate, n)[i], split_evenly(arch.vocab_size, n)[i])
            for i, d in enumerate(devices)]


class TensorParallelRunner:
    """Same interface as LlamaRunner (arch, device, dtype, forward, new_full_cache); weights split
    across `devices` as `plan_shards` says. `device` is the first card (embedding, residual,
    logits)."""

    def __init__(self, config, state: dict[str, torch.Tensor], devices: Sequence[torch.device | str],
                 dtype: torch.dtype, max_positions: int | None = None) -> None:
        self.config = config
        self.arch = arch = Architecture.from_config(config)
        self.shards = plan_shards(arch, devices)
        self.devices = [s.device for s in self.shards]
        self.device, self.dtype = self.devices[0], dtype
        self.split_tag = f"tp{len(self.shards)}"  # snapshots of K/V computed this way are kept apart
        positions = max_positions or arch.max_context
        self.ropes = [Rotary(config, arch.head_dim, d, positions) for d in self.devices]
        self.rope = self.ropes[0]
        d = arch.head_dim
        self.embed = state_tensor(state, "embed_tokens.weight").to(self.device, dtype)  # [V, hidden]
        self.norms = [state_tensor(state, "norm.weight").to(dev, dtype) for dev in self.devices]
        head = state.get("lm_head.weight")
        if head is None or arch.tie_embeddings:
            head = state_tensor(state, "embed_tokens.weight")
        self.lm_heads = [head[s.vocab[0]:s.vocab[1]].to(s.device, dtype) for s in self.shards]  # [V_s, hidden]
        self.layers: list[list[LayerWeights]] = [[] for _ in self.shards]  # [card][layer]
        for i in range(arch.n_layers):
            w = layer_tensors(state, i, arch.qkv_bias)
            for s, shard in enumerate(self.shards):
                (qa, qb), (ka, kb), (fa, fb) = shard.q_heads, shard.kv_heads, shard.ffn
                rows = lambda t, a, b: t[a * d:b * d]  # noqa: E731  heads a..b of a [heads * D, ...] tensor
                bias = None
                if arch.qkv_bias:
                    bias = torch.cat([rows(w["q_bias"], qa, qb), rows(w["k_bias"], ka, kb), rows(w["v_bias"], ka, kb)])
                    bias = bias.to(shard.device, dtype)
                self.layers[s].append(LayerWeights(
                    attn_norm=w["attn_norm"].to(shard.device, dtype),
                    wqkv=torch.cat([rows(w["q"], qa, qb), rows(w["k"], ka, kb), rows(w["v"], ka, kb)]).to(shard.device, dtype),
                    bqkv=bias,
                    wo=w["o"][:, qa * d:qb * d].to(shard.device, dtype).contiguous(),  # [hidden, Hq_s * D]
                    mlp_norm=w["mlp_norm"].to(shard.device, dtype),
                    w_gate_up=torch.cat([w["gate"][fa:fb], w["up"][fa:fb]]).to(shard.device, dtype),  # [2 I_s, hidden]
                    w_down=w["down"][:, fa:fb].to(shard.device, dtype).contiguous(),  # [hidden, I_s]
                ))

    @classmethod
    def from_folder(cls, folder: Path, config, devices: Sequence[torch.device | str], dtype: torch.dtype,
                    max_positions: int | None = None) -> "TensorParallelRunner":
        return cls(config, read_safetensors(folder), devices, dtype, max_positions)

    def describe(self) -> str:
        return "+".join(str(d) for d in self.devices) + " (tensor parallel)"

    def nbytes(self) -> int:
        tensors = [self.embed] + self.norms + self.lm_heads
        return (sum(t.numel() * t.element_size() for t in tensors)
                + sum(layer.nbytes() for card in self.layers for layer in card))

    def new_full_cache(self, capacity: int, offloaded: Sequence[int] = (), **options) -> ShardedFullCache:
        """One full cache per card over its KV heads; `offloaded` layers keep every card's share in
        pinned CPU memory and each card streams its own share over its own link."""
        a = self.arch
        parts = []
        for shard in self.shards:
            heads = shard.kv_heads[1] - shard.kv_heads[0]
            if offloaded or options:
                from engine.kv.offload import OffloadedCache

                parts.append(OffloadedCache(a.n_layers, heads, a.head_dim, capacity, self.dtype, shard.device,
                                            offloaded, **options))
            else:
                parts.append(FullCache(a.n_layers, heads, a.head_dim, capacity, self.dtype, shard.device,
                                       exact=False))  # a card's shard, attended as on the card
        return ShardedFullCache(parts)

    # --- the forward ---------------------------------------------------------------------------
    def _everywhere(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x on every card (the first card's copy is x itself)."""
        return [x if x.device == dev else x.to(dev, non_blocking=True) for dev in self.devices]

    def _sum_on_first(self, partials: list[torch.Tensor]) -> torch.Tensor:
        """The all-reduce: every card's partial [T, hidden] summed on the first card, in card order."""
        total = partials[0]
        for p in partials[1:]:
            total = total + p.to(self.device, non_blocking=True)
        return total

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: ShardedFullCache,
                last_only: bool = False) -> torch.Tensor:
        """tokens, positions [T] (int64) -> logits [T, V] float32 on the first card (or [1, V])."""
        arch = self.arch
        parts = getattr(cache, "parts", None)
        if parts is None or len(parts) != len(self.shards):
            raise TypeError(f"a tensor-parallel runner over {len(self.shards)} cards needs a sharded cache "
                            f"with as many parts (runner.new_full_cache)")
        n_new, d = tokens.shape[0], arch.head_dim
        x = self.embed[tokens.to(self.device)]  # [T, hidden] on the first card
        cache.begin(positions, self.ropes)
        for index in range(arch.n_layers):
            partials = []
            for s, (shard, x_s) in enumerate(zip(self.shards, self._everywhere(x))):
                layer = self.layers[s][index]
                hq, hkv = shard.q_heads[1] - shard.q_heads[0], shard.kv_heads[1] - shard.kv_heads[0]
                h = rms_norm(x_s, layer.attn_norm, arch.rms_eps)
                qkv = F.linear(h, layer.wqkv, layer.bqkv)  # [T, (Hq_s + 2 Hkv_s) * D]
                q = qkv[:, :hq * d].view(n_new, hq, d).transpose(0, 1)  # [Hq_s, T, D]
                k = qkv[:, hq * d:(hq + hkv) * d].view(n_new, hkv, d).transpose(0, 1)  # [Hkv_s, T, D]
                v = qkv[:, (hq + hkv) * d:].view(n_new, hkv, d).transpose(0, 1)
                attn = parts[s].attend(index, q, k, v)  # [Hq_s, T, D]
                partials.append(F.linear(attn.transpose(0, 1).reshape(n_new, hq * d), layer.wo))  # [T, hidden]
            x = x + self._sum_on_first(partials)
            partials = []
            for s, x_s in enumerate(self._everywhere(x)):
                layer = self.layers[s][index]
                h = rms_norm(x_s, layer.mlp_norm, arch.rms_eps)
                gate, up = F.linear(h, layer.w_gate_up).chunk(2, dim=-1)  # [T, I_s] each
                partials.append(F.linear(F.silu(gate) * up, layer.w_down))  # [T, hidden]
            x = x + self._sum_on_first(partials)
        cache.end()
        if last_only:
            x = x[-1:]
        pieces = [F.linear(rms_norm(x_s, norm, arch.rms_eps), head).to(self.device, non_blocking=True)
                  for x_s, norm, head in zip(self._everywhere(x), self.norms, self.lm_heads)]  # [T, V_s] each
        return torch.cat(pieces, dim=-1).float()  # [T, V]
