"""L1's retrieval cache: a small, per-KV-head selection of the full cache (TriForce).

Layout per layer, per KV head: [ selected chunks (budget) | recent (accepted since rebuild) | scratch ].
Selected keys keep their absolute RoPE, so nothing is renumbered; everything held is in the past
of every new query, so the only mask needed is causal over the new tokens, exactly as in the full
cache. Newly accepted tokens' K/V are copied from the full cache (L1's own hidden states differ
from L2's, so its K/V would drift).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from engine import native
from engine.kv.attention import causal_mask, gqa_attention
from engine.kv.base import KVCache
from engine.kv.rope import Rotary, rotate

if TYPE_CHECKING:  # the full cache builds this one (FullCache.retrieval): no import cycle at run time
    from engine.kv.full import FullCache


class RetrievalCache(KVCache):
    name = "retrieval"

    def __init__(self, full: "FullCache", n_heads: int, budget: int, chunk: int, headroom: int) -> None:
        """headroom: slots after the budget for recent tokens and speculation before a rebuild is forced."""
        super().__init__(budget + headroom, full.dtype, full.device)
        self.full, self.n_heads = full, n_heads
        self.budget, self.chunk, self.headroom = budget, chunk, headroom
        # each layer on the card that computes it (layer split); the full cache's own layers may
        # be elsewhere (offloaded to CPU memory): rebuild and sync copy from them
        self.layer_devices = list(getattr(full, "layer_devices", None) or [full.device] * full.n_layers)
        # Where L2 attends through the native kernel (the CPU), so does L1 (one pass over its K/V for
        # all the rows, faster than batched matmuls over a small cache), over buffers padded
        # to its block of keys and stored as the full cache stores them (float16: copied exactly).
        rows = -(-self.capacity // native.BLOCK_KEYS) * native.BLOCK_KEYS
        self._native = (full.native_attention and all(torch.device(d).type == "cpu" for d in self.layer_devices)
                        and native.attention_supports(full.head_dim, rows))
        shape = (full.n_kv_heads, rows if self._native else self.capacity, full.head_dim)
        stored = full.kv_dtype if self._native else full.dtype
        self.keys = [torch.zeros(shape, dtype=stored, device=d) for d in self.layer_devices]
        self.values = [torch.zeros(shape, dtype=stored, device=d) for d in self.layer_devices]
        self.selected = 0  # slots filled by the last rebuild
        self.committed = 0  # slots holding synced tokens (selection + recent); beyond it: speculation
        self.synced_to = 0  # full-cache length this cache mirrors (selection + recent copies)
        self.rebuilds = 0

    def fused_ok(self, new_tokens: int) -> bool:
        """Native CPU buffers, attended as attend() does (a subclass with its own attend: no)."""
        return self._native and type(self).attend is RetrievalCache.attend

    def kv_buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K and V buffers [Hkv, rows, D] as the native kernels read them."""
        return self.keys[layer], self.values[layer]

    # --- the forward protocol (same as the full cache, over the small buffers) ---------------
    def _prepare(self, positions: torch.Tensor, rope: Rotary) -> None:
        self._cos, self._sin = rope.cos_sin(positions, self.dtype)
        self._mask = None if self._native else causal_mask(self._new, self.length + self._new, self.device)
        self._fast_rope = native.available()  # looked up once a forward, not twice a layer

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cos, sin, mask = self._tables_on(q.device)
        q = rotate(q, cos, sin, self._fast_rope)  # [Hq, T, D]
        k = rotate(k, cos, sin, self._fast_rope)  # [Hkv, T, D]
        start, stop = self.length, self.length + self._new
        self.keys[layer][:, start:stop] = k
        self.values[layer][:, start:stop] = v
        if self._native:  # causal over the last T of `stop` positions, as the mask says
            return native.attention(q, self.keys[layer], self.values[layer], stop)
        return gqa_attention(q, self.keys[layer][:, :stop], self.values[layer][:, :stop], mask)

    def bytes_per_token(self) -> int:
        return 2 * self.full.n_layers * self.full.n_kv_heads * self.full.head_dim * self.keys[0].element_size()

    RECENT_SHARE = 0.25  # of the budget, always spent on the most recent chunks (local context)

    def recent_chunks(self, keep_chunks: int) -> int:
        """Most recent chunks always kept: generation leans on its local context, which a single
        question-time query under-scores."""
        return max(1, min(keep_chunks - 1, int(keep_chunks * self.RECENT_SHARE)))

    # --- selection ---------------------------------------------------------------------------
    def rebuild(self, queries: list[torch.Tensor]) -> None:
        """Select chunks of the full cache for each layer and KV head.

        queries: per layer [Hq, D], the post-RoPE query of the latest token (e.g. the last prompt
        token). A chunk's key is the mean of its keys; its score for a KV head is the sum over that
        group's query heads of q . k_mean. Always kept: the first chunk (attention sinks) and the
        most recent chunk; the partial tail chunk goes to the recent region.
        """
        held = self.full.length
        n_chunks = held // self.chunk
        keep_chunks = self.budget // self.chunk
        self.length = 0
        if held <= self.budget or n_chunks <= keep_chunks:
            # everything fits: mirror the full cache in order (L1 == L2 exactly)
            for layer in range(self.full.n_layers):
                k_full, v_full = self.full.layer_kv(layer, 0, held)
                self.keys[layer][:, :held] = k_full
                self.values[layer][:, :held] = v_full
            self.length = self.selected = self.committed = self.synced_to = held
            self.rebuilds += 1
            return
        body = n_chunks * self.chunk
        n_kv, dim = self.full.n_kv_heads, self.full.head_dim
        group = self.n_heads // n_kv
        for layer in range(self.full.n_layers):
            dev = self.layer_devices[layer]
            k_full, v_full = self.full.layer_kv(layer, 0, held)  # [Hkv, held, D], maybe in CPU memory
            chunk_keys = self._chunk_means(k_full, n_chunks, dev)  # [Hkv, C, D] fp32
            q = queries[layer].to(dev).float().reshape(n_kv, group, dim).sum(1)  # [Hkv, D]: sum over the group
            scores = torch.einsum("hcd,hd->hc", chunk_keys, q)  # [Hkv, C]
            scores[:, 0] = float("inf")  # sinks
            scores[:, n_chunks - self.recent_chunks(keep_chunks):] = float("inf")  # the most recent chunks
            top = scores.topk(keep_chunks, dim=-1).indices.sort(dim=-1).values  # [Hkv, K] in position order
            self._copy_chunks(layer, k_full, v_full, top.to(k_full.device), n_chunks)
            tail = held - body
            if tail:
                self.keys[layer][:, self.budget:self.budget + tail] = k_full[:, body:]
                self.values[layer][:, self.budget:self.budget + tail] = v_full[:, body:]
        self.length = self.committed = self.budget + (held - body)
        self.selected = self.budget
        self.synced_to = held
        self.rebuilds += 1

    ROWS_PER_HEAD = True  # on the CPU: a row select per head is cheaper than one indexing per tensor

    def _copy_chunks(self, layer: int, k_full: torch.Tensor, v_full: torch.Tensor, top: torch.Tensor,
                     n_chunks: int) -> None:
        """Copy the chunks `top` [Hkv, K] (ascending, on the full cache's device) of each KV head into
        the first K * chunk slots of this layer. Each chunk is one row of chunk * D contiguous values,
        so whole rows move (an element-wise gather with a [Hkv, budget, D] index would dominate a
        rebuild's time on the CPU): on the CPU a row
        select per head straight into the buffer, elsewhere one indexing per tensor (one launch)."""
        n_kv, row = k_full.shape[0], self.chunk * k_full.shape[2]
        body, keep = n_chunks * self.chunk, top.shape[1]
        for full, mine in ((k_full, self.keys[layer]), (v_full, self.values[layer])):
            rows = full[:, :body].reshape(n_kv, n_chunks, row)  # [Hkv, C, chunk * D], a view
            dest = mine[:, :keep * self.chunk].view(n_kv, keep, row)  # [Hkv, K, chunk * D], a view
            if self.ROWS_PER_HEAD and dest.device.type == rows.device.type == "cpu" and dest.dtype == rows.dtype:
                for h in range(n_kv):
                    torch.index_select(rows[h], 0, top[h], out=dest[h])
            else:
                heads = torch.arange(n_kv, device=rows.device)[:, None]
                dest.copy_(rows[heads, top])

    # A full cache held elsewhere (CPU memory) is scored in pieces of this many tokens, so the
    # rebuild never holds a copy of a whole layer's keys on the card.
    SCORE_PIECE = 16384

    def _chunk_means(self, keys: torch.Tensor, n_chunks: int, device: torch.device) -> torch.Tensor:
        """Mean key per chunk [Hkv, C, D] in fp32, summed straight from the (reshaped view of the)
        cache: no fp32 copy of the layer. Keys in another device's memory come over in pieces."""
        if keys.device == device:
            n_kv, dim = keys.shape[0], keys.shape[2]
            return keys[:, :n_chunks * self.chunk].reshape(n_kv, n_chunks, self.chunk, dim).mean(2, dtype=torch.float32)
        return self._chunk_means_in_pieces(keys, n_chunks, device)

    def _chunk_means_in_pieces(self, keys: torch.Tensor, n_chunks: int, device: torch.device) -> torch.Tensor:
        n_kv, dim = keys.shape[0], keys.shape[2]
        per = max(1, self.SCORE_PIECE // self.chunk)
        parts = []
        for first in range(0, n_chunks, per):
            last = min(n_chunks, first + per)
            a, b = first * self.chunk, last * self.chunk
            piece = torch.empty((n_kv, b - a, dim), dtype=keys.dtype, device=device)
            for h in range(n_kv):  # one contiguous block per head: a pinned source copies asynchronously
                piece[h].copy_(keys[h, a:b], non_blocking=True)
            parts.append(piece.reshape(n_kv, last - first, self.chunk, dim).mean(2, dtype=torch.float32))
        return torch.cat(parts, dim=1)

    def sync(self) -> None:
        """Drop speculated tokens and append the tokens L2 accepted since the last sync, with
        their K/V copied from the full cache (the recent region)."""
        new = self.full.length - self.synced_to
        start = self.committed
        if start + new > self.capacity:
            raise RuntimeError("retrieval cache out of room: call rebuild() first (needs_rebuild)")
        for layer in range(self.full.n_layers):
            k_full, v_full = self.full.layer_kv(layer, self.synced_to, self.full.length)
            self.keys[layer][:, start:start + new] = k_full
            self.values[layer][:, start:start + new] = v_full
        self.length = self.committed = start + new
        self.synced_to = self.full.length

    def room(self) -> int:
        """Slots left for speculation after syncing what the full cache holds now."""
        return self.capacity - self.committed - (self.full.length - self.synced_to)
