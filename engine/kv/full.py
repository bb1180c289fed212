"""The target's full KV cache: static per-layer buffers, keys stored after RoPE."""
from __future__ import annotations

import torch

from engine import native
from engine.kv.attention import PREFILL_ROWS, causal_mask, gqa_attention
from engine.kv.base import KVCache
from engine.kv.exact_attention import MAX_ROWS, exact_gqa_attention, hidden_tail, padded_length
from engine.kv.retrieval import RetrievalCache
from engine.kv.rope import Rotary, rotate


class FullCache(KVCache):
    """Per layer K and V buffers [Hkv, capacity, D]. Roll back = move the length pointer.

    `capture_query` makes the next forward keep the last token's post-RoPE query per layer
    ([L, Hq, D]): the retrieval cache scores chunks against it.

    On the CPU, forwards of up to MAX_ROWS new tokens (decoding and verification) attend through
    a batch-invariant kernel, so a verification row gives the bits a one-token step gives: the
    native one (engine/native: one pass over K and V for all rows) where it was built, else the
    one made of torch ops (engine/kv/exact_attention.py); the buffers are padded to the latter's
    chunk size.

    Longer forwards, the prefill chunks, attend through engine.kv.attention.gqa_attention: on the
    CPU the native blocked prefill kernel, which reads float16 K/V in place (the offloaded and
    tensor-parallel caches prefill through the same function, so each stores the same K/V).

    `prefill_dtype` (the CPU target on the file's blocks: bfloat16): longer forwards, the prefill
    chunks, attend in that dtype (SDPA; faster than float32 on a CPU with bf16 units), every
    decoding step staying float32. Prefill chunks are aligned the same way
    whatever the cache held, so a prompt's bits stay one function of it.

    `kv_dtype` (the CPU runner with native kernels: float16): K/V are stored in that dtype, half
    the bytes a decoding step reads at long contexts; the native kernel widens them to float32 as it
    reads, so plain decoding and every verification see the same stored values (part of the
    target's definition; snapshots are keyed by it).
    """

    name = "full"
    exact = False  # attend through exact_attention (set for CPU buffers; subclasses keep their own path)
    _invariant = False
    native_attention = False  # attends through the native kernel (set per instance; subclasses keep their own path)
    _hidden: torch.Tensor | None = None

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device | str, exact: bool | None = None,
                 prefill_dtype: torch.dtype | None = None, kv_dtype: torch.dtype | None = None) -> None:
        """exact: attend through the batch-invariant kernel (default: on the CPU; caches that stand
        in for a card's, as tensor-parallel shards, pass False and attend as the card would).
        kv_dtype: storage of K/V where the native kernel attends (else `dtype` is kept)."""
        super().__init__(capacity, dtype, torch.device(device))
        self.prefill_dtype = prefill_dtype if prefill_dtype != dtype else None
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.exact = self.device.type == "cpu" if exact is None else exact
        shape = (n_kv_heads, padded_length(capacity) if self.exact else capacity, head_dim)
        self.native_attention = self.exact and dtype == torch.float32 and native.attention_supports(head_dim, shape[1])
        self.kv_dtype = kv_dtype if self.native_attention and kv_dtype in native.KV_DTYPES else dtype
        self.keys = [torch.zeros(shape, dtype=self.kv_dtype, device=self.device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=self.kv_dtype, device=self.device) for _ in range(n_layers)]
        self.capture_query = False
        self.last_query: list[torch.Tensor | None] = [None] * n_layers

    def _prepare(self, positions: torch.Tensor, rope: Rotary) -> None:
        self._cos, self._sin = rope.cos_sin(positions, self.dtype)
        self._invariant = self.exact and self._new <= MAX_ROWS
        self._mask = None if self._invariant else causal_mask(self._new, self.length + self._new, self.device)
        self._hidden = None  # the exact kernel's mask, built at the first layer
        self._fast_rope = native.available()  # looked up once a forward, not twice a layer

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q = rotate(q, self._cos, self._sin, self._fast_rope)  # [Hq, T, D]
        k = rotate(k, self._cos, self._sin, self._fast_rope)  # [Hkv, T, D]
        start, stop = self.length, self.length + self._new
        self.keys[layer][:, start:stop] = k
        self.values[layer][:, start:stop] = v
        if self.capture_query:
            self.last_query[layer] = q[:, -1].clone()  # [Hq, D]
        if self._invariant:
            if self.native_attention:
                return native.attention(q, self.keys[layer], self.values[layer], stop)
            if self._hidden is None and self._new > 1:
                self._hidden = hidden_tail(self._new, stop, q.shape[0] // self.n_kv_heads)
            return exact_gqa_attention(q, self.keys[layer], self.values[layer], stop, self._hidden)
        keys, values = self.keys[layer][:, :stop], self.values[layer][:, :stop]
        if self.prefill_dtype is not None:  # [Hq, T, D] back in the model's dtype
            low = self.prefill_dtype
            return gqa_attention(q.to(low), keys.to(low), values.to(low), self._mask).to(q.dtype)
        if self._new <= PREFILL_ROWS:  # batched matmuls in the model's dtype (prefill widens K/V itself)
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        return gqa_attention(q, keys, values, self._mask)

    def fused_ok(self, new_tokens: int) -> bool:
        """The native kernel's row-invariant path of attend() (decoding and verification), no
        query captured, and attend() not replaced by a subclass (offloaded or sharded caches)."""
        return (self.native_attention and new_tokens <= MAX_ROWS and not self.capture_query
                and type(self).attend is FullCache.attend)

    def kv_buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K and V buffers [Hkv, padded capacity, D] as the native kernel reads them."""
        return self.keys[layer], self.values[layer]

    def end(self) -> None:
        super().end()
        self.capture_query = False

    def bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.keys[0].element_size()

    def retrieval(self, n_heads: int, budget: int, chunk: int, headroom: int):
        """A new L1 retrieval cache over this cache (a sharded full cache returns a sharded one)."""
        return RetrievalCache(self, n_heads, budget, chunk, headroom)

    # --- used by the retrieval cache and snapshots ---------------------------------------------
    def layer_kv(self, layer: int, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views [Hkv, stop-start, D] of held tokens (post-RoPE keys, values)."""
        return self.keys[layer][:, start:stop], self.values[layer][:, start:stop]

    def load_prefix(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write a stored prefix [Hkv, n, D] into layer `layer` (snapshot restore)."""
        n = keys.shape[1]
        self.keys[layer][:, :n] = keys.to(self.device, self.kv_dtype)
        self.values[layer][:, :n] = values.to(self.device, self.kv_dtype)
