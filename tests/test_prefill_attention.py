"""The native prefill attention (kernels.c triforce_prefill_attention): a prefill chunk's rows over
the held keys, equal to SDPA within float rounding, and one function of a row's own query and keys:
the same bits whatever rows, heads, buffer capacity or head stride share the call. That is what lets
every cache kind (resident, offloaded, hybrid, tensor-parallel shard) prefill through it and store
the same K/V: those caches' bit-equality tests (tests/test_hybrid_offload.py) run prefill chunks
through it; here the kernel alone and the dispatch of engine.kv.attention.gqa_attention."""
from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from engine import native
from engine.kv.attention import PREFILL_ROWS, causal_mask, gqa_attention
from engine.kv.full import FullCache
from engine.kv.rope import Rotary, rotate

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")

SHAPES = [  # (query heads, KV heads, new rows T, held keys S, head size, K/V dtype)
    (9, 3, 256, 1000, 64, torch.float32),
    (9, 3, 77, 300, 64, torch.float16),  # T and S not multiples of a tile or a key block
    (8, 4, 90, 90, 32, torch.float32),  # the first chunk: no prefix
    (6, 2, 17, 40, 128, torch.float16),
    (4, 4, 33, 161, 48, torch.float32),  # a head size neither 64 nor 128 (the generic loop)
]


def _operands(hq, hkv, t, s, d, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(hq, t, d, generator=gen)  # [Hq, T, D]
    # views of wider buffers [Hkv, S + 13, D]: a head stride other than S * D
    k = torch.randn(hkv, s + 13, d, generator=gen).to(dtype)[:, :s]
    v = torch.randn(hkv, s + 13, d, generator=gen).to(dtype)[:, :s]
    return q, k, v


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[2]}over{s[3]}d{s[4]}{str(s[5])[-2:]}")
def test_prefill_attention_is_sdpa_within_float_rounding(shape):
    q, k, v = _operands(*shape)
    assert native.prefill_attention_supports(q, k, v)
    got = native.prefill_attention(q, k, v)
    mask = causal_mask(q.shape[1], k.shape[1], "cpu")
    want = F.scaled_dot_product_attention(q[None], k.float()[None], v.float()[None], attn_mask=mask,
                                          enable_gqa=True)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[2]}over{s[3]}d{s[4]}{str(s[5])[-2:]}")
def test_a_rows_bits_depend_only_on_its_query_and_keys(shape):
    """The same row computed alongside other heads (a tensor-parallel shard holds a subset), in a
    shorter chunk (the last rows of the chunk at the same positions), and over a buffer of another
    capacity (the offloaded cache's staging slot): bit for bit the same."""
    hq, hkv, t, s, d, dtype = shape
    q, k, v = _operands(*shape)
    whole = native.prefill_attention(q, k, v)
    group = hq // hkv
    shard = native.prefill_attention(q[group:], k[1:], v[1:])  # every KV head but the first
    assert torch.equal(shard, whole[group:])
    tail = max(1, t // 3)
    late = native.prefill_attention(q[:, -tail:], k, v)  # the chunk's last rows alone
    assert torch.equal(late, whole[:, -tail:])
    early = native.prefill_attention(q[:, :t - tail], k[:, :s - tail], v[:, :s - tail])  # the rows before them
    assert torch.equal(early, whole[:, :t - tail])
    dense_k, dense_v = k.contiguous(), v.contiguous()  # head stride S * D
    assert torch.equal(native.prefill_attention(q, dense_k, dense_v), whole)


def test_prefill_chunks_dispatch_to_the_native_kernel_and_decoding_does_not():
    q, k, v = _operands(9, 3, PREFILL_ROWS + 1, 200, 64, torch.float32)
    mask = causal_mask(q.shape[1], k.shape[1], "cpu")
    assert torch.equal(gqa_attention(q, k, v, mask), native.prefill_attention(q, k, v))
    small = q[:, -PREFILL_ROWS:]
    got = gqa_attention(small, k, v, causal_mask(PREFILL_ROWS, 200, "cpu"))
    torch.testing.assert_close(got, native.prefill_attention(small, k, v), rtol=1e-5, atol=2e-6)


def test_a_float16_full_cache_prefills_from_its_stored_keys_without_widening_the_prefix():
    """A FullCache storing float16 K/V (the CPU runner's) prefills a chunk through the native kernel
    over the stored values: the output equals the kernel's on those buffers, bit for bit."""
    hkv, hq, d = 2, 6, 64
    cache = FullCache(1, hkv, d, 512, torch.float32, "cpu", kv_dtype=torch.float16)
    assert cache.kv_dtype == torch.float16
    rope = Rotary(SimpleNamespace(rope_theta=10000.0), d, torch.device("cpu"), 1024)
    gen = torch.Generator().manual_seed(3)
    for start, stop in ((0, 100), (100, 300)):
        q = torch.randn(hq, stop - start, d, generator=gen)  # [Hq, T, D] before RoPE
        k = torch.randn(hkv, stop - start, d, generator=gen)
        v = torch.randn(hkv, stop - start, d, generator=gen)
        cache.begin(torch.arange(start, stop), rope)
        got = cache.attend(0, q, k, v)
        cache.end()
        keys, values = cache.layer_kv(0, 0, stop)  # float16 views
        cos, sin = rope.cos_sin(torch.arange(start, stop), torch.float32)
        want = native.prefill_attention(rotate(q, cos, sin), keys, values)
        assert torch.equal(got, want)
