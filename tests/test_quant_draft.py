"""L1's int16-activation matmul on the kinds read as stored (Q4_K, Q5_K, Q6_K, Q5_0, Q5_1), and
projections stacked from the file's own tensors without a copy (q | k | v, gate | up, Q and K rows in
llama.cpp's stored order)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from cpu_features import cpu_flags
from int16_reference import check_int16_is_the_quantized_product, int16_reference
from kquant_pack import pack_k

from engine import native
from engine.model import file_blocks, quant
from engine.model.quant import QuantWeight, dequantize_blocks

STORED_KINDS = ("Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1")

pytestmark = pytest.mark.skipif(not native.available(), reason="no native kernels here")


def _stored_blocks(kind: str, out: int, width: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((out, width)).astype(np.float32)
    return pack_k(kind, rows) if kind.endswith("_K") else quants.quantize(rows, GGMLQuantizationType[kind])


@pytest.mark.parametrize("kind", STORED_KINDS)
@pytest.mark.parametrize("out,width", [(1, 256), (7, 512), (130, 1536)])
def test_the_stored_kinds_int16_matmul_is_the_quantized_product(kind, out, width):
    """A drafter's matmul from the file's bytes: ~1e-5 from the float product; with an outlier in
    every 32 (a coarse activation step) it is the quantized product, not the float one, so the
    integer codes and every scale are read right; a row's value whatever the tokens beside it."""
    blocks = _stored_blocks(kind, out, width, seed=out)
    check_int16_is_the_quantized_product(native.BlockMatrix(kind, blocks), kind, blocks, width)


@pytest.mark.parametrize("kind", STORED_KINDS)
def test_a_misread_field_misses_the_quantized_product(kind):
    """The check above has teeth: the int16 kernel over blocks with one scale or code bit flipped
    misses the right blocks' quantized product by far more than its own error."""
    blocks = _stored_blocks(kind, 4, 512, seed=9)
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(1))
    reference = int16_reference(kind, blocks, x)
    own = float((native.BlockMatrix(kind, blocks).matmul_int16(x) - reference).abs().max())
    at = {"Q4_K": 5, "Q5_K": 20, "Q6_K": 195, "Q5_0": 10, "Q5_1": 12}[kind]  # a scale, qh, scale, nibble, nibble
    wrong = blocks.copy().reshape(4, -1, quant.BLOCK_BYTES[kind])
    wrong[2, 0, at] ^= 0x11
    off = float((native.BlockMatrix(kind, wrong.reshape(4, -1)).matmul_int16(x) - reference).abs().max())
    assert off > 100 * max(own, 1e-6)


@pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="no AVX2 here: only the plain-C body is built")
def test_the_stored_int16_bodies_agree(tmp_path):
    """The AVX2 body (vpmaddwd) and the plain-C one sum the same integer pairs: the same values up
    to the float rounding of their scaling."""
    built = tmp_path / "plain.so"
    assert native._build(native._compiler(), built, ["-O3", "-march=native", "-mno-avx2", "-fopenmp"])
    lib = native._declare(ctypes.CDLL(str(built)))
    for kind in STORED_KINDS:
        blocks = _stored_blocks(kind, 11, 768, seed=5)
        matrix = native.BlockMatrix(kind, blocks)
        x = torch.randn(5, 768, generator=torch.Generator().manual_seed(2))
        y = torch.full((5, 11), float("nan"))
        assert lib.triforce_block_matmul_draft(matrix.code, matrix.pointer, 11, 768, x.data_ptr(), 5,
                                               y.data_ptr(), 2) == 0
        torch.testing.assert_close(y, matrix.matmul_int16(x), rtol=1e-5, atol=1e-5, msg=kind)


def test_a_stack_of_stored_parts_in_their_own_row_order_is_the_model_order_projection():
    """q | k | v as the file stores them: q and k in llama.cpp's row order (the kernel writes each
    row to its column), v in another kind. The target's matmul is the parts' own kernels with columns
    reordered, bit for bit; dequantize is in the model's order; the drafter's matmul is the parts'
    int16 products likewise; and no part's blocks are copied."""
    width, heads, kv_heads, dim = 512, 4, 2, 32
    q = _stored_blocks("Q4_K", heads * dim, width, seed=1)
    k = _stored_blocks("Q4_K", kv_heads * dim, width, seed=2)
    v = _stored_blocks("Q6_K", kv_heads * dim, width, seed=3)
    q_order, k_order = file_blocks.unpermute_rows(heads * dim, heads), file_blocks.unpermute_rows(kv_heads * dim, kv_heads)
    parts = [QuantWeight("Q4_K", q, width, row_order=q_order), QuantWeight("Q4_K", k, width, row_order=k_order),
             QuantWeight("Q6_K", v, width)]
    stacked = quant.StackedWeight(parts)
    assert stacked.kind == "Q4_K+Q4_K+Q6_K" and stacked.shape == (heads * dim + 2 * kv_heads * dim, width)
    for part, source in zip(parts, (q, k, v)):
        assert part.blocks is source or np.shares_memory(part.blocks, source)
        assert np.shares_memory(part.native_part()[0].array, source)
    x = torch.randn(5, width, generator=torch.Generator().manual_seed(4))
    model_order = [QuantWeight("Q4_K", q[q_order], width), QuantWeight("Q4_K", k[k_order], width),
                   QuantWeight("Q6_K", v, width)]
    assert torch.equal(stacked.matmul(x), torch.cat([p.matmul(x) for p in model_order], dim=1))
    assert torch.equal(stacked.dequantize(), torch.cat([p.dequantize() for p in model_order]))
    assert torch.equal(parts[0].rows(torch.tensor([5, 0])), model_order[0].dequantize()[[5, 0]])
    assert stacked.drafts_int16
    assert torch.equal(stacked.matmul_draft(x), torch.cat([p.matmul_draft(x) for p in model_order], dim=1))
    alone = parts[1].matmul(x)  # a reordered weight by itself runs as a stack of one
    assert torch.equal(alone, model_order[1].matmul(x))


def test_a_stack_of_one_kind_is_that_kind():
    parts = [QuantWeight("Q4_K", _stored_blocks("Q4_K", rows, 256, seed=rows), 256) for rows in (16, 8)]
    stacked = quant.StackedWeight(parts)
    assert stacked.kind == "Q4_K"
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(0))
    assert torch.equal(stacked.matmul(x), torch.cat([p.matmul(x) for p in parts], dim=1))


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_4_bit_blocks_read_as_stored_are_the_repacked_weights(kind):
    """A large file's Q4_0 / Q4_1 blocks run from the file's bytes (no repacked copy): the oracle
    within float32 rounding, the repacked kernel's bits where both sum in 8 lanes (every CPU without
    AVX-512), row-invariant, and the int16 drafter's product likewise."""
    width = 576
    blocks = quants.quantize(np.random.default_rng(3).standard_normal((70, width)).astype(np.float32),
                             GGMLQuantizationType[kind])
    stored, repacked = native.BlockMatrix(kind, blocks, as_stored=True), native.BlockMatrix(kind, blocks)
    assert np.shares_memory(stored.array, blocks) and stored.code != repacked.code and stored.drafts_int16
    x = torch.randn(9, width, generator=torch.Generator().manual_seed(5))
    got = stored.matmul(x)
    oracle = x @ dequantize_blocks(kind, blocks, width).T
    torch.testing.assert_close(got, oracle, rtol=1e-5, atol=1e-5 * float(oracle.abs().max()))
    if "avx512f" not in cpu_flags():
        assert torch.equal(got, repacked.matmul(x))
    for start, size in ((0, 1), (3, 2), (1, 8)):
        assert torch.equal(stored.matmul(x[start:start + size]), got[start:start + size])
    torch.testing.assert_close(stored.matmul_int16(x), repacked.matmul_int16(x), rtol=1e-5, atol=1e-4)
    spiky = x.clone()
    spiky[:, ::32] = 1000.0
    off_reference = float((stored.matmul_int16(spiky) - int16_reference(kind, blocks, spiky)).abs().max())
    assert off_reference < 0.1 * float((stored.matmul_int16(spiky) - stored.matmul(spiky)).abs().max())
    weight = QuantWeight(kind, blocks, width, as_stored=True)
    assert torch.equal(weight.matmul(x), got) and torch.equal(weight.dequantize(), dequantize_blocks(kind, blocks, width))
