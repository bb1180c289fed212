"""The contract every KV cache honours (after mlx-lm): the model never owns a cache, it is
passed into each forward. One forward = begin(positions) -> attend(layer, ...) per layer -> end().
"""
from __future__ import annotations

import torch

from engine.errors import ContextOverflowError
from engine.events import CacheStats
from engine.kv.rope import Rotary


class KVCache:
    """Base class. Subclasses store K/V however they like; `length` counts tokens held."""

    name = "cache"

    def __init__(self, capacity: int, dtype: torch.dtype, device: torch.device) -> None:
        self.capacity = capacity
        self.dtype = dtype
        self.device = torch.device(device)
        self.length = 0
        self._new = 0  # tokens of the forward in progress
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        self._elsewhere: dict[torch.device, tuple] = {}  # the forward's tables on other devices (layer split)

    # --- the forward protocol -------------------------------------------------------------
    def begin(self, positions: torch.Tensor, rope: Rotary) -> None:
        """Start a forward of len(positions) new tokens at these absolute positions."""
        new = int(positions.shape[0])
        if self.length + new > self.capacity:
            raise ContextOverflowError(
                f"{self.name} cache is full: {self.length} + {new} tokens exceed its capacity of {self.capacity}; "
                f"start a new chat or load the model with a larger context")
        self._new = new
        self._elsewhere = {}
        self._prepare(positions, rope)

    def _tables_on(self, device: torch.device) -> tuple:
        """(cos, sin, mask) of the forward in progress on `device`: layers split across devices
        attend on their own card, so the tables are copied there once per forward."""
        if self._cos is None or self._cos.device == device:
            return self._cos, self._sin, self._mask
        if device not in self._elsewhere:
            self._elsewhere[device] = tuple(t.to(device) if t is not None else None
                                            for t in (self._cos, self._sin, self._mask))
        return self._elsewhere[device]

    def _prepare(self, positions: torch.Tensor, rope: Rotary) -> None:
        raise NotImplementedError

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [Hq, T, D], k/v [Hkv, T, D] before RoPE -> attention output [Hq, T, D]; stores k/v."""
        raise NotImplementedError

    def fused_ok(self, new_tokens: int) -> bool:
        """Whether a forward of `new_tokens` may write and attend through kernels.c's whole-layer
        call (engine/model/fused_layers.py) instead of attend(): only where that call does exactly
        what attend() does, over kv_buffers()."""
        return False

    def rope_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [T, D] of the forward in progress (its first layer's device)."""
        return self._cos, self._sin

    def end(self) -> None:
        """Finish the forward: the new tokens now count as held."""
        self.length += self._new
        self._new = 0

    # --- bookkeeping ---------------------------------------------------------------------
    def rollback(self, length: int) -> None:
        """Forget every token after the first `length` (speculation rejected, chat edited)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back {self.name} cache of {self.length} tokens to {length}")
        self.length = length

    def bytes_per_token(self) -> int:
        raise NotImplementedError

    def nbytes_used(self) -> int:
        return self.length * self.bytes_per_token()

    def nbytes_reserved(self) -> int:
        return self.capacity * self.bytes_per_token()

    def stats(self) -> CacheStats:
        return CacheStats(self.name, self.length, self.capacity, self.nbytes_used(), self.nbytes_reserved(),
                          str(self.device))
