"""Caches for tensor parallel: every layer's KV heads split across cards.

Each card holds a whole cache of its own (full, offloaded or retrieval) over its share of the KV
heads, on its own device; these wrappers keep the parts in step (one length, one roll-back) and
present the same contract as a single cache to the session, the decoder and the snapshots. The
tensor-parallel runner attends on each part on its own card (`parts[s].attend`).

Shards follow KV-head groups (card s holds KV heads [a, b) and their query heads), so the
retrieval cache's per-KV-head selection, scored with the group's queries, picks exactly the
chunks the unsplit cache would.
"""
from __future__ import annotations

from typing import Sequence

import torch

from engine.kv.base import KVCache
from engine.kv.full import FullCache
from engine.events import CacheStats
from engine.kv.rope import Rotary


class _ShardedCache(KVCache):
    """Common bookkeeping: the parts share one length; a forward begins and ends on all of them."""

    def __init__(self, parts: Sequence[KVCache]) -> None:
        if not parts:
            raise ValueError("a sharded cache needs at least one part")
        self.parts = list(parts)
        first = self.parts[0]
        held = [part.length for part in self.parts]
        KVCache.__init__(self, first.capacity, first.dtype, first.device)  # sets length = 0 through the setter
        for part, n in zip(self.parts, held):
            part.length = n

    @property
    def length(self) -> int:  # type: ignore[override]
        return self.parts[0].length

    @length.setter
    def length(self, value: int) -> None:
        for part in self.parts:
            part.length = value

    def begin(self, positions: torch.Tensor, rope: Rotary | Sequence[Rotary]) -> None:
        """rope: one Rotary per part, each on its part's card (the runner owns them)."""
        ropes = list(rope) if isinstance(rope, (list, tuple)) else [rope] * len(self.parts)
        for part, part_rope in zip(self.parts, ropes):
            part.begin(positions.to(part.device), part_rope)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a sharded cache attends per card: the tensor-parallel runner calls parts[s].attend")

    def end(self) -> None:
        for part in self.parts:
            part.end()

    def rollback(self, length: int) -> None:
        for part in self.parts:
            part.rollback(length)

    def bytes_per_token(self) -> int:
        return sum(part.bytes_per_token() for part in self.parts)

    def nbytes_reserved(self) -> int:
        return sum(part.nbytes_reserved() for part in self.parts)

    def stats(self) -> CacheStats:
        stats = [part.stats() for part in self.parts]
        where: list[str] = []
        for s in stats:
            for d in s.device.split("+"):
                if d not in where:
                    where.append(d)
        details = {s.detail for s in stats if s.detail}
        detail = f"KV heads split across {len(self.parts)} card{'s' if len(self.parts) > 1 else ''}" + (f"; {details.pop()} on each" if len(details) == 1 else "")
        return CacheStats(self.name, self.length, self.capacity, self.nbytes_used(), self.nbytes_reserved(),
                          "+".join(where), detail)


class ShardedFullCache(_ShardedCache):
    """The target's full cache split by KV heads; parts are FullCache or OffloadedCache."""

    name = "full"

    def __init__(self, parts: Sequence[FullCache]) -> None:
        super().__init__(parts)
        first = self.parts[0]
        self.n_layers, self.head_dim = first.n_layers, first.head_dim
        self.n_kv_heads = sum(part.n_kv_heads for part in self.parts)

    @property
    def capture_query(self) -> bool:
        return self.parts[0].capture_query

    @capture_query.setter
    def capture_query(self, value: bool) -> None:
        for part in self.parts:
            part.capture_query = value

    @property
    def last_query(self) -> list[torch.Tensor | None]:
        """Per layer [Hq, D] on the first card: every card's query heads, in head order."""
        out: list[torch.Tensor | None] = []
        for layer in range(self.n_layers):
            pieces = [part.last_query[layer] for part in self.parts]
            out.append(None if any(p is None for p in pieces) else torch.cat([p.to(self.device) for p in pieces]))
        return out

    def layer_kv(self, layer: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[Hkv, stop-start, D] of all heads, gathered where the first part keeps this layer."""
        views = [part.layer_kv(layer, start, stop) for part in self.parts]
        where = views[0][0].device
        return (torch.cat([k.to(where) for k, _ in views]), torch.cat([v.to(where) for _, v in views]))

    def load_prefix(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        first = 0
        for part in self.parts:
            last = first + part.n_kv_heads
            part.load_prefix(layer, keys[first:last], values[first:last])
            first = last

    def retrieval(self, n_heads: int, budget: int, chunk: int, headroom: int) -> "ShardedRetrievalCache":
        parts = [part.retrieval(n_heads * part.n_kv_heads // self.n_kv_heads, budget, chunk, headroom)
                 for part in self.parts]
        return ShardedRetrievalCache(parts)


class ShardedRetrievalCache(_ShardedCache):
    """L1's retrieval cache per card, each built from its card's part of the full cache."""

    name = "retrieval"

    @property
    def budget(self) -> int:
        return self.parts[0].budget

    @property
    def chunk(self) -> int:
        return self.parts[0].chunk

    @property
    def headroom(self) -> int:
        return self.parts[0].headroom

    @property
    def rebuilds(self) -> int:
        return self.parts[0].rebuilds

    def rebuild(self, queries: list[torch.Tensor]) -> None:
        """queries: per layer [Hq, D] (all cards' heads, in order); each card scores with its own."""
        first = 0
        for part in self.parts:
            last = first + part.n_heads
            part.rebuild([q[first:last].to(part.device) for q in queries])
            first = last

    def sync(self) -> None:
        for part in self.parts:
            part.sync()

    def room(self) -> int:
        return min(part.room() for part in self.parts)
