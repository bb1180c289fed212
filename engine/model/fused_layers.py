"""Decoding and verification forwards with each decoder layer in one native call (kernels.c
`triforce_layer`).

A one-token forward of the bundled model is 30 layers of about 25 torch ops and kernel calls each,
and on a small CPU their Python and dispatch cost is a large share of the forward. Here a layer is
one ctypes call running the same
kernels in the same order, so the bits are LlamaRunner.forward's (a test compares them); the
embedding lookup, the final norm and the vocabulary projection stay in Python. A drafting forward
(draft=True, L1) takes the int16-activation matmul on the repacked Q4_0/Q4_1 blocks, as its Python
layers do; every other kind (Q8_0, Q5_0, Q5_1, the K kinds, a stacked q|k|v) drafts through the
float kernel, the target's own arithmetic.

Taken when every layer's projections are native GGUF blocks (any kind, or parts of several) without biases, the
forward checks at most MAX_TOKENS tokens, and the cache says it attends as the fused layer does
(KVCache.fused_ok: the full cache and the retrieval cache on native CPU buffers); prefill chunks,
float32 weights and the other caches run the Python layers.
"""
from __future__ import annotations

import ctypes

import torch

from engine import native
from engine.kv.base import KVCache
from engine.model.quant import DENSE_ABOVE

MAX_TOKENS = DENSE_ABOVE  # larger forwards widen the blocks for one float32 GEMM (the caches check their own limit)


class FusedLayers:
    """The constant arguments of each layer's call, looked up once, and per-size scratch."""

    def __init__(self, runner, lib: ctypes.CDLL, layers: list[tuple]) -> None:
        self.runner, self._lib, self._layers = runner, lib, layers
        arch = runner.arch
        self._dims = (arch.n_heads, arch.n_kv_heads, arch.head_dim, arch.intermediate)
        self._scratch: dict[int, torch.Tensor] = {}  # tokens -> float32 scratch

    @classmethod
    def build(cls, runner) -> "FusedLayers | None":
        """The fused layers for `runner`, or None where some layer cannot take them."""
        lib = native.library()
        if lib is None or not runner.native_ops or any(d.type != "cpu" for d in runner.layer_devices):
            return None
        layers = []
        for layer in runner.layers:
            blocks = [getattr(w, "native_blocks", None) for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)]
            if layer.bqkv is not None or any(b is None for b in blocks):
                return None
            norms = (layer.attn_norm.contiguous(), layer.mlp_norm.contiguous())
            layers.append((norms, tuple(value for b in blocks for value in (b.code, b.pointer))))
        return cls(runner, lib, layers)

    @staticmethod
    def takes(cache: KVCache, tokens: int) -> bool:
        """Whether a forward of `tokens` tokens over `cache` may run fused."""
        return tokens <= MAX_TOKENS and cache.fused_ok(tokens)

    def _scratch_for(self, tokens: int) -> torch.Tensor:
        got = self._scratch.get(tokens)
        if got is None:
            n = self._lib.triforce_layer_scratch(tokens, self.runner.arch.hidden, *self._dims)
            got = self._scratch[tokens] = torch.empty(n, dtype=torch.float32)
        return got

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, last_only: bool,
                draft: bool, vocab=None) -> torch.Tensor:
        """runner.forward(tokens, positions, cache, last_only, draft, vocab), a native call per layer:
        tokens, positions [T] -> logits [T, V] (or [1, V]) float32."""
        runner, arch = self.runner, self.runner.arch
        n_new = tokens.shape[0]
        x = runner.embedding(tokens).float().contiguous()  # [T, hidden]
        cache.begin(positions, runner.rope)
        cos, sin = (t.contiguous() for t in cache.rope_tables())  # [T, D] each
        scratch, threads = self._scratch_for(n_new), torch.get_num_threads()
        start, scale, call = cache.length, arch.head_dim ** -0.5, self._lib.triforce_layer
        for index, ((attn_norm, mlp_norm), weights) in enumerate(self._layers):
            keys, values = cache.kv_buffers(index)  # [Hkv, cap, D]
            rc = call(int(draft), x.data_ptr(), n_new, arch.hidden, arch.rms_eps, attn_norm.data_ptr(),
                      mlp_norm.data_ptr(), *weights, *self._dims, cos.data_ptr(), sin.data_ptr(), keys.data_ptr(),
                      values.data_ptr(), int(keys.dtype == torch.float16), keys.shape[1], start, scale,
                      scratch.data_ptr(), threads)
            if rc:
                raise ValueError(f"native layer {index} rejected {n_new} tokens at {start} ({rc})")
        cache.end()
        return runner.head(x, last_only, vocab)  # [T, V]
