"""The test kit's check of L1's int16-activation matmul (a drafter's, whose tokens L2 checks), for
any block kind: what the kernel should compute, in float64, and the checks every kind must pass."""
from __future__ import annotations

import numpy as np
import torch

from engine.model.quant import dequantize_blocks


def int16_reference(kind: str, blocks: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """What the int16-activation kernel computes, in float64: x per block of 32 quantized to
    round(x / d_a), d_a = max |x| / 32767, times the file's weights (exactly d * q + m each: for
    Q4_0 m = -8 d), scaled by d_a."""
    width = x.shape[1]
    w = dequantize_blocks(kind, blocks, width).double()  # exactly d * q + m per weight
    xb = x.reshape(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    da = (amax / 32767.0).double()  # the kernel's float32 scale
    inv = torch.where(amax > 0, 32767.0 / amax, torch.zeros_like(amax))
    q = torch.round(xb * inv).double().clamp(-32767, 32767)  # rint of the float32 product
    return ((q * da).reshape(x.shape[0], width) @ w.T).float()


def _float_product(kind: str, blocks: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """x @ W.T in float64, the file's exact weights: the product no activation rounding touched."""
    return (x.double() @ dequantize_blocks(kind, blocks, x.shape[1]).double().T).float()


def check_int16_is_the_quantized_product(matrix, kind: str, blocks: np.ndarray, width: int) -> None:
    """`matrix` (a native.BlockMatrix over `blocks`) drafts with int16 activations: ~1e-5 from the
    float product; with an outlier in every 32 activations (a step of ~0.03) the quantized product,
    not the float one; and a row's values whatever the tokens beside it."""
    assert matrix.drafts_int16
    x = torch.randn(6, width, generator=torch.Generator().manual_seed(width))
    got, exact = matrix.matmul_int16(x), _float_product(kind, blocks, x)
    assert float((got - exact).norm() / exact.norm()) < 1e-4
    spiky = x.clone()
    spiky[:, ::32] = 1000.0
    got_spiky = matrix.matmul_int16(spiky)
    off_reference = float((got_spiky - int16_reference(kind, blocks, spiky)).abs().max())
    off_float = float((got_spiky - _float_product(kind, blocks, spiky)).abs().max())
    assert off_reference < 0.1 * off_float
    for t in range(6):  # chunks of up to four tokens: a row alone gives the same values
        assert torch.equal(matrix.matmul_int16(x[t:t + 1]), got[t:t + 1])
