"""The drafter's StreamingLLM cache: a few attention-sink tokens plus a recent window.

Keys are stored before RoPE and rotated by their slot position at every step, so evicting the
middle of the window never leaves a gap in positions the draft model has not seen in training.
"""
from __future__ import annotations

import torch

from engine.kv.attention import causal_mask, gqa_attention
from engine.kv.base import KVCache
from engine.kv.rope import Rotary, rotate


class StreamingCache(KVCache):
    name = "draft"

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, sinks: int, window: int, slack: int,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        """slack: room for one forward (drafted tokens) beyond sinks + window before eviction."""
        super().__init__(sinks + window + slack, dtype, torch.device(device))
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.sinks, self.window = sinks, window
        shape = (n_kv_heads, self.capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(n_layers)]  # pre-RoPE
        self.values = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(n_layers)]
        self._tables: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self.evicted = 0  # tokens dropped from the middle since the last reset

    def make_room(self, new_tokens: int) -> None:
        """Evict the oldest non-sink tokens so that `new_tokens` more fit."""
        overflow = self.length + new_tokens - self.capacity
        if overflow <= 0:
            return
        keep_from = self.sinks + overflow
        if keep_from > self.length:
            raise ValueError(f"{new_tokens} tokens do not fit a draft window of {self.capacity - self.sinks}")
        for buffers in (self.keys, self.values):
            for layer in range(self.n_layers):
                tail = buffers[layer][:, keep_from:self.length].clone()
                buffers[layer][:, self.sinks:self.sinks + tail.shape[1]] = tail
        self.length -= overflow
        self.evicted += overflow

    def _prepare(self, positions: torch.Tensor, rope: Rotary) -> None:
        # positions are ignored: the draft sees slot positions 0..length+T-1
        if self._tables is None or self._tables[0] != id(rope):
            cos, sin = rope.cos_sin(torch.arange(self.capacity, device=self.device), self.dtype)
            self._tables = (id(rope), cos, sin)
        stop = self.length + self._new
        self._cos, self._sin = self._tables[1][:stop], self._tables[2][:stop]  # [S, D]
        self._mask = causal_mask(self._new, stop, self.device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        start, stop = self.length, self.length + self._new
        self.keys[layer][:, start:stop] = k
        self.values[layer][:, start:stop] = v
        keys = rotate(self.keys[layer][:, :stop], self._cos, self._sin)  # [Hkv, S, D]
        q = rotate(q, self._cos[start:stop], self._sin[start:stop])  # [Hq, T, D]
        return gqa_attention(q, keys, self.values[layer][:, :stop], self._mask)

    def bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.keys[0].element_size()

    def stats(self):
        from dataclasses import replace

        return replace(super().stats(), detail=f"{self.sinks} sinks + {self.window} recent")
