"""A small K-quant packer for the test kit: float32 rows -> GGUF Q4_K, Q5_K or Q6_K blocks.

gguf-py dequantizes the K kinds but cannot quantize them; llama.cpp's quantizer is not something
the suite may need. Any valid encoding serves the tests (they check our decoding and kernels
against gguf's own dequantize), so this one is the plainest: per sub-block a min-max (Q4_K, Q5_K)
or symmetric (Q6_K) scale, the scales themselves quantized to 6 (or 8) bits against the
super-block's float16 d (and dmin), and each weight rounded to its nearest code under the stored
scales.
"""
from __future__ import annotations

import numpy as np

SUPER = 256  # weights per K super-block
K_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def pack_k(kind: str, weights: np.ndarray) -> np.ndarray:
    """weights [out, in] float (in a multiple of 256) -> blocks [out, in / 256 * K_BYTES[kind]] uint8."""
    if kind not in K_BYTES:
        raise ValueError(f"pack_k: {kind} is not a K kind ({', '.join(K_BYTES)})")
    out, width = weights.shape
    if width % SUPER:
        raise ValueError(f"pack_k: rows of {width} weights are not whole super-blocks of {SUPER}")
    blocks = weights.astype(np.float32).reshape(-1, SUPER)  # [n, 256]
    packed = _pack_q6_k(blocks) if kind == "Q6_K" else _pack_q45_k(blocks, bits=4 if kind == "Q4_K" else 5)
    return packed.reshape(out, -1)


def _f16(values: np.ndarray) -> np.ndarray:
    """float16 bytes [n, 2] of values [n]."""
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _six_bit(values: np.ndarray, top: float = 63) -> tuple[np.ndarray, np.ndarray]:
    """values [n, k] >= 0 -> (scale f16 as float32 [n, 1], codes [n, k] in 0..top) with values ~ scale * codes."""
    step = (values.max(axis=1, keepdims=True) / top).astype(np.float16).astype(np.float32)
    safe = np.where(step > 0, step, 1)
    return step, np.clip(np.rint(values / safe), 0, top).astype(np.uint8)


def _pack_q45_k(blocks: np.ndarray, bits: int) -> np.ndarray:
    n, top = blocks.shape[0], (1 << bits) - 1
    sub = blocks.reshape(n, 8, 32)
    low = np.minimum(sub.min(axis=2), 0)  # [n, 8]: w = scale * q - min, min >= 0
    span = (sub.max(axis=2) - low) / top
    d, sc = _six_bit(span)
    dmin, mn = _six_bit(-low)
    scale = d * sc  # [n, 8], the stored arithmetic: exact in float32
    offset = dmin * mn
    safe = np.where(scale > 0, scale, 1)[..., None]
    q = np.clip(np.rint((sub + offset[..., None]) / safe), 0, top).astype(np.uint8)  # [n, 8, 32]
    q[scale == 0] = 0
    head = np.zeros((n, 12), np.uint8)  # inverse of gguf's Q4_K.get_scale_min
    head[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    head[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    head[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    nibbles = q & 15  # sub-block j: nibble j % 2 of bytes 32 (j // 2) ..
    qs = (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).reshape(n, 128)
    parts = [_f16(d[:, 0]), _f16(dmin[:, 0]), head]
    if bits == 5:  # bit j of qh[i]: element i of sub-block j's fifth bit
        fifth = (q >> 4) & 1  # [n, 8, 32]
        parts.append((fifth << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1).astype(np.uint8))
    return np.concatenate(parts + [qs], axis=1)


def _pack_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    sub = blocks.reshape(n, 16, 16)
    step = np.abs(sub).max(axis=2) / 31  # [n, 16]: q in -32..31
    d = (step.max(axis=1, keepdims=True) / 127).astype(np.float16).astype(np.float32)  # [n, 1]
    sc = np.clip(np.rint(step / np.where(d > 0, d, 1)), 0, 127).astype(np.int8)
    scale = d * sc.astype(np.float32)
    safe = np.where(scale > 0, scale, 1)[..., None]
    q = (np.clip(np.rint(sub / safe), -32, 31) + 32).astype(np.uint8).reshape(n, 2, 128)  # per half
    low, high = q & 15, q >> 4  # element r of a half: nibble r // 64 of ql[r % 64], bits 2 (r // 32) of qh[r % 32]
    ql = (low[:, :, 0:64] | (low[:, :, 64:128] << 4)).reshape(n, 128)
    qh = (high[:, :, 0:32] | (high[:, :, 32:64] << 2) | (high[:, :, 64:96] << 4) | (high[:, :, 96:128] << 6))
    return np.concatenate([ql, qh.reshape(n, 64), sc.view(np.uint8), _f16(d[:, 0])], axis=1)
