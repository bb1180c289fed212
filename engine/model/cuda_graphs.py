"""CUDA graphs for the fixed-shape steps, with an eager fallback.

A decode or verification forward launches a few hundred small kernels from Python, so on a fast
GPU it is bound by launches rather than by the bytes it reads. A CUDA graph records those launches
once per shape and replays them with one call. Graphs need fixed shapes and fixed addresses, so
the forward here is *static*: the new tokens, their positions and the cache length live in small
device buffers; new K/V are written with index_copy_ at slots `length + t`; attention runs over
the cache's whole capacity with a length mask (slot j is visible to new token t iff
j <= length + t), so no shape depends on the length. Masked slots contribute exactly zero, so the
result is the dynamic forward's up to float summation order.

Supported: one-card runners over a FullCache (L2 with the KV on-chip) or RetrievalCache (L1; keys
post-RoPE) and a StreamingCache (L0; keys pre-RoPE, rotated by slot). Everything else (offloaded
or sharded caches, a layer split, a forward that captures the query, a full cache) runs the
runner's own forward. One graph per (cache, token count, last_only); the static path runs
eagerly on the CPU, so tests check it against the dynamic forward there.
"""
from __future__ import annotations

import logging
import weakref

import torch
import torch.nn.functional as F

from engine.kv.full import FullCache
from engine.kv.retrieval import RetrievalCache
from engine.kv.rope import rotate
from engine.kv.streaming import StreamingCache
from engine.model.runner import LlamaRunner, linear, rms_norm

log = logging.getLogger(__name__)
MAX_GRAPHED_TOKENS = 33  # decode, L1 and verification shapes; prefill chunks stay eager


def _kind(cache) -> str | None:
    """How the cache keeps keys: "post" (rotated at their positions), "slot" (pre-RoPE), or None."""
    if type(cache) in (FullCache, RetrievalCache):
        return "post"
    if type(cache) is StreamingCache:
        return "slot"
    return None


class _Captured:
    """One captured shape: its static inputs, the graph and its output buffer."""

    def __init__(self, tokens: torch.Tensor, positions: torch.Tensor, length: torch.Tensor) -> None:
        self.tokens, self.positions, self.length = tokens, positions, length
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None


class GraphedForward:
    """`forward(tokens, positions, last_only)` of `runner` over `cache`, replayed from CUDA graphs
    where the step has a fixed shape (same signature and result as runner.forward(..., cache)).

    use_graphs: capture and replay (default: on CUDA); False runs the static path eagerly (tests).
    """

    def __init__(self, runner, cache, use_graphs: bool | None = None) -> None:
        self.runner, self.cache = runner, cache
        self.device = runner.device
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.kind = _kind(cache)
        one_card = isinstance(runner, LlamaRunner) and all(d == runner.device for d in runner.layer_devices)
        if not one_card or cache.device != runner.device:  # a layer split or tensor parallel: eager
            self.kind = None
        self._graphs: dict[tuple[int, bool], _Captured] = {}
        self._slots_all = torch.arange(cache.capacity, device=self.device)  # [C]
        self._slot_tables = None  # StreamingCache: cos/sin of slots 0..C-1
        self.replays = 0
        self.eager_calls = 0

    def supports(self, n_tokens: int) -> bool:
        """Whether a forward of n_tokens runs the static path now (else the runner's own)."""
        c = self.cache
        return (self.kind is not None and 0 < n_tokens <= MAX_GRAPHED_TOKENS and c.length + n_tokens <= c.capacity
                and not getattr(c, "capture_query", False))

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """tokens, positions [T] (int64) -> logits [T, V] float32 (or [1, V]); the cache then holds them."""
        n = int(tokens.shape[0])
        if not self.supports(n):
            self.eager_calls += 1
            return self.runner.forward(tokens, positions, self.cache, last_only)
        length = torch.tensor([self.cache.length], device=self.device)
        if self.use_graphs:
            try:
                logits = self._replay(tokens, positions, length, last_only)
            except RuntimeError as exc:  # capture not supported here (driver, allocator): eager from now on
                log.warning("CUDA graph capture failed (%s): this cache runs eagerly", exc)
                self.kind, self._graphs = None, {}
                self.eager_calls += 1
                return self.runner.forward(tokens, positions, self.cache, last_only)
        else:
            logits = self._static(tokens.to(self.device), positions.to(self.device), length, last_only)
        self.cache._new = n
        self.cache.end()
        return logits

    # --- capture and replay --------------------------------------------------------------------
    def _replay(self, tokens, positions, length, last_only: bool) -> torch.Tensor:
        key = (int(tokens.shape[0]), last_only)
        cap = self._graphs.get(key)
        if cap is None:
            cap = _Captured(tokens.to(self.device).clone(), positions.to(self.device).clone(), length.clone())
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up outside the capture (cuBLAS workspaces, lazy init)
                for _ in range(2):
                    self._static(cap.tokens, cap.positions, cap.length, last_only)
            torch.cuda.current_stream(self.device).wait_stream(side)
            cap.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cap.graph):
                cap.logits = self._static(cap.tokens, cap.positions, cap.length, last_only)
            self._graphs[key] = cap
        cap.tokens.copy_(tokens)
        cap.positions.copy_(positions)
        cap.length.copy_(length)
        cap.graph.replay()
        self.replays += 1
        return cap.logits.clone()

    # --- the static-shape forward --------------------------------------------------------------
    def _static(self, tokens: torch.Tensor, positions: torch.Tensor, length: torch.Tensor,
                last_only: bool) -> torch.Tensor:
        """The runner's forward (LlamaRunner.forward, step for step) with every shape fixed by
        (T, capacity); length is a device tensor."""
        runner, cache, arch = self.runner, self.cache, self.runner.arch
        n = tokens.shape[0]
        q_size, kv_size, d = arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim, arch.head_dim
        group = arch.n_heads // arch.n_kv_heads
        slots = length + torch.arange(n, device=self.device)  # [T] where the new tokens go
        visible = self._slots_all[None, :] <= slots[:, None]  # [T, C]
        # [G*T, C] additive mask (row g*T + t is new token t), made once per forward in the compute
        # dtype: a bool mask would be converted again by every layer's attention call
        bias = torch.zeros(visible.shape, dtype=cache.dtype, device=self.device)
        bias = bias.masked_fill(~visible, float("-inf")).repeat(group, 1)
        if self.kind == "post":
            cos, sin = runner.rope.cos_sin(positions, cache.dtype)  # [T, D]
        else:
            if self._slot_tables is None:
                self._slot_tables = runner.rope.cos_sin(self._slots_all, cache.dtype)  # [C, D]
            all_cos, all_sin = self._slot_tables
            cos, sin = all_cos[slots], all_sin[slots]  # [T, D]: the draft sees slot positions
        x = runner.embed[tokens] if isinstance(runner.embed, torch.Tensor) else runner.embed.rows(tokens)  # [T, hidden]
        for index, layer in enumerate(runner.layers):
            h = rms_norm(x, layer.attn_norm, arch.rms_eps)
            qkv = linear(h, layer.wqkv, bias=layer.bqkv)  # [T, (Hq + 2 Hkv) * D]
            q = qkv[:, :q_size].view(n, arch.n_heads, d).transpose(0, 1)  # [Hq, T, D]
            k = qkv[:, q_size:q_size + kv_size].view(n, arch.n_kv_heads, d).transpose(0, 1)  # [Hkv, T, D]
            v = qkv[:, q_size + kv_size:].view(n, arch.n_kv_heads, d).transpose(0, 1)
            q = rotate(q, cos, sin)
            keys, values = cache.keys[index], cache.values[index]  # [Hkv, C, D]
            if self.kind == "post":
                keys.index_copy_(1, slots, rotate(k, cos, sin))
                held = keys
            else:
                keys.index_copy_(1, slots, k)
                held = rotate(keys, all_cos, all_sin)  # [Hkv, C, D]: every slot at its slot position
            values.index_copy_(1, slots, v)
            # the group's query heads folded into rows: plain (non-GQA) attention with a [G*T, C] mask
            q_rows = q.reshape(arch.n_kv_heads, group * n, d)  # [Hkv, G*T, D]
            attn = F.scaled_dot_product_attention(q_rows[None], held[None], values[None],
                                                  attn_mask=bias)[0]  # [Hkv, G*T, D]
            attn = attn.reshape(arch.n_heads, n, d)  # [Hq, T, D]
            x = x + linear(attn.transpose(0, 1).reshape(n, q_size), layer.wo)
            h = rms_norm(x, layer.mlp_norm, arch.rms_eps)
            gate, up = linear(h, layer.w_gate_up, layer.gate_up_packed).chunk(2, dim=-1)  # [T, I] each
            x = x + linear(F.silu(gate) * up, layer.w_down)
        if last_only:
            x = x[-1:]
        return runner._vocab_projection(rms_norm(x, runner.norm, arch.rms_eps)).float()  # [T, V]


class GraphedRunner:
    """A runner whose forward goes through a GraphedForward per cache (made on first use, dropped
    with the cache): a drop-in for `runner` in the decoder. Other attributes are the runner's."""

    def __init__(self, runner, use_graphs: bool | None = None) -> None:
        self.runner = runner
        self.use_graphs = use_graphs
        self._per_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __getattr__(self, name: str):
        return getattr(self.runner, name)

    def graphed(self, cache) -> GraphedForward:
        """The GraphedForward of `cache` (created once)."""
        found = self._per_cache.get(cache)
        if found is None:
            found = self._per_cache[cache] = GraphedForward(self.runner, cache, self.use_graphs)
        return found

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache, last_only: bool = False) -> torch.Tensor:
        """runner.forward(tokens, positions, cache, last_only), replayed from a graph when it can be."""
        if _kind(cache) is None:
            return self.runner.forward(tokens, positions, cache, last_only)
        return self.graphed(cache).forward(tokens, positions, last_only)


def with_graphs(runner):
    """The runner wrapped for CUDA graphs when it computes on CUDA, else the runner itself (and a
    wrapped runner as it is)."""
    if isinstance(runner, GraphedRunner) or runner.device.type != "cuda":
        return runner
    return GraphedRunner(runner)
