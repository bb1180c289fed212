"""The CPU attention kernel (engine/kv/cpu_attention.py) is exact softmax attention: it equals
gqa_attention with the causal lower-right mask, for GQA and plain multi-head shapes, decode and
verification, S a multiple of the block or not, fp32 and bf16 storage."""
from __future__ import annotations

import pytest
import torch

from engine.kv.attention import causal_mask, gqa_attention
from engine.kv.cpu_attention import cpu_gqa_attention, measure_gbps


def _qkv(n_heads: int, n_kv: int, new: int, total: int, dim: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n_heads, new, dim, generator=gen)  # [Hq, T, D]
    k = torch.randn(n_kv, total, dim, generator=gen) * 2  # [Hkv, S, D]: peaky scores test the running max
    v = torch.randn(n_kv, total, dim, generator=gen)
    return q, k, v


@pytest.mark.parametrize("n_heads,n_kv,new,total,block", [
    (8, 2, 7, 1000, 128),    # GQA, verification, S not a multiple of the block
    (8, 2, 1, 513, 64),      # decode
    (4, 4, 33, 300, 100),    # no GQA, the most new tokens a verification has
    (6, 2, 5, 5, 64),        # the cache holds only the new tokens
    (8, 1, 3, 256, 256),     # one block exactly
    (8, 2, 7, 1000, 7),      # blocks smaller than the new tokens: the mask spans several
])
def test_equals_gqa_attention_fp32(n_heads, n_kv, new, total, block):
    q, k, v = _qkv(n_heads, n_kv, new, total, 16)
    want = gqa_attention(q, k, v, causal_mask(new, total, k.device))
    got = cpu_gqa_attention(q, k, v, block=block)
    assert got.shape == want.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_bf16_storage_matches_fp32_reference_within_bf16_rounding():
    q, k, v = _qkv(8, 2, 7, 777, 32, seed=3)
    q, k, v = (t.bfloat16() for t in (q, k, v))
    want = gqa_attention(q.float(), k.float(), v.float(), causal_mask(7, 777, k.device))
    got = cpu_gqa_attention(q, k, v, block=128)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


def test_a_wrong_mask_would_be_caught():
    """The reference differs from attention without the causal mask, so the tests above have power."""
    q, k, v = _qkv(8, 2, 7, 200, 16)
    unmasked = gqa_attention(q, k, v, None)
    got = cpu_gqa_attention(q, k, v, block=64)
    assert (got - unmasked).abs().max() > 1e-3


def test_strided_head_views_of_a_bigger_buffer():
    """The hybrid cache hands in [h0:h1, :S] views of a [Hkv, capacity, D] buffer."""
    q, k, v = _qkv(8, 4, 3, 300, 16)
    big_k, big_v = torch.zeros(4, 512, 16), torch.zeros(4, 512, 16)
    big_k[:, :300], big_v[:, :300] = k, v
    want = gqa_attention(q[4:], k[2:], v[2:], causal_mask(3, 300, k.device))
    torch.testing.assert_close(cpu_gqa_attention(q[4:], big_k[2:, :300], big_v[2:, :300], block=64), want,
                               rtol=1e-5, atol=1e-5)


def test_measure_gbps_reports_a_rate():
    r = measure_gbps(2, 8, 16, 2048, 7, torch.float32, reps=1)
    assert r["bytes"] == 2 * 2 * 2048 * 16 * 4 and r["gbps"] > 0 and r["ms"] > 0


def test_default_blocks_are_few_and_large_for_long_contexts():
    from engine.kv.cpu_attention import MAX_BLOCKS, MIN_BLOCK, block_for

    assert block_for(100) == MIN_BLOCK and block_for(32768) == 2048 and block_for(131072) == 8192
    for total in (1, 1023, 5000, 16385, 200_000):
        b = block_for(total)
        assert b % MIN_BLOCK == 0 and -(-total // b) <= MAX_BLOCKS
    q, k, v = _qkv(8, 2, 7, 3000, 16)  # the default block, several blocks of it? one: still exact
    torch.testing.assert_close(cpu_gqa_attention(q, k, v), gqa_attention(q, k, v, causal_mask(7, 3000, k.device)),
                               rtol=1e-5, atol=1e-5)
