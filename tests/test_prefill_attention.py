"""Prefill chunks on the CPU attend through the native blocked kernel (engine/kv/full.py): the same
logits and K/V as the SDPA path within float tolerance, and a chunk's rows attend with the bits a
decoding step's row gets."""
from __future__ import annotations

import pytest
import torch

from engine import native
from tests.random_models import random_runner

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels are not built here")


def _prefill(runner, tokens: torch.Tensor, kernel: str | None, chunk: int = 256):
    cache = runner.new_full_cache(1024)
    if kernel is not None:
        cache.prefill_kernel = kernel
    logits = []
    for start in range(0, len(tokens), chunk):
        piece = tokens[start:start + chunk]
        logits.append(runner.forward(piece, torch.arange(start, start + len(piece)), cache))
    return torch.cat(logits), cache


def test_native_prefill_matches_sdpa_within_float_tolerance():
    runner = random_runner(3, vocab=64, hidden=96, layers=3, heads=6, kv_heads=2, max_positions=1024)
    tokens = torch.randint(0, 64, (700,), generator=torch.Generator().manual_seed(1))
    native_logits, native_cache = _prefill(runner, tokens, None)
    assert native_cache.prefill_kernel == "native"  # the default on a float32 CPU runner with the kernels
    sdpa_logits, sdpa_cache = _prefill(runner, tokens, "")
    # K/V are stored in float16: an ulp flipped in one layer's K/V moves the next layers' by ~1e-3 relative
    scale = sdpa_logits.abs().max().item()
    assert (native_logits - sdpa_logits).abs().max().item() < 1e-3 * scale
    assert (native_logits.argmax(-1) == sdpa_logits.argmax(-1)).float().mean().item() > 0.99
    for layer in range(3):
        keys_a, values_a = native_cache.layer_kv(layer, 0, 700)
        keys_b, values_b = sdpa_cache.layer_kv(layer, 0, 700)
        assert torch.allclose(keys_a.float(), keys_b.float(), atol=2e-3, rtol=2e-3)
        assert torch.allclose(values_a.float(), values_b.float(), atol=2e-3, rtol=2e-3)


def test_a_prefill_row_attends_as_a_decoding_step():
    """The native kernel is row-invariant: the last row of a 256-query chunk gets the bits a
    one-query call (a decoding step) gets over the same keys."""
    runner = random_runner(4, vocab=64, hidden=96, layers=1, heads=6, kv_heads=2, max_positions=1024)
    tokens = torch.randint(0, 64, (512,), generator=torch.Generator().manual_seed(2))
    _, cache = _prefill(runner, tokens, None)
    gen = torch.Generator().manual_seed(5)
    chunk = torch.randn(6, 256, 16, generator=gen)  # [Hq, T, D]
    whole = native.attention(chunk, cache.keys[0], cache.values[0], 512)  # [Hq, 256, D]
    last = native.attention(chunk[:, -1:].contiguous(), cache.keys[0], cache.values[0], 512)  # [Hq, 1, D]
    assert torch.equal(whole[:, -1:], last)
