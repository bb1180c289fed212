"""The model file's own low-bit weights on the CPU: GGUF Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K
and Q6_K blocks, run as stored.

A 32-weight GGUF block holds weights of one row with its own float16 scale (and minimum):
  Q4_0: [d f16][16 bytes of nibbles]                  w = d * (q - 8),  q in 0..15
  Q4_1: [d f16][m f16][16 bytes of nibbles]           w = d * q + m,    q in 0..15
  Q5_0: [d f16][qh u32][16 bytes of nibbles]          w = d * (q - 16), q in 0..31
  Q5_1: [d f16][m f16][qh u32][16 bytes of nibbles]   w = d * q + m,    q in 0..31
  Q8_0: [d f16][32 int8]                              w = d * q,        q in -128..127
Nibble j of a block holds element j (low 4 bits) and element j + 16 (high 4 bits); bit j of qh is
element j's fifth bit. A K super-block holds 256 weights in sub-blocks with their own scales:
  Q4_K: [d f16][dmin f16][12 bytes: 8 six-bit scales sc, 8 mins mn][128 bytes of nibbles]
        w = (d sc_j) q - (dmin mn_j) in sub-block j of 32, q in 0..15 (nibble j % 2 of bytes
        32 (j / 2) .. 32 (j / 2) + 31)
  Q5_K: Q4_K with [32 bytes qh] before the nibbles (bit j of qh[i]: element i of sub-block j's fifth bit)
  Q6_K: [128 bytes ql][64 bytes qh][16 int8 scales][d f16]  w = (d sc_k) (q - 32) per 16 weights,
        q in 0..63 (4 bits from ql, 2 from qh)
Every product in these formulas is exact in float32, so the widened weights are gguf's bits
whatever the order of the arithmetic. A fused projection whose parts differ in kind (a Q4_K_M
file's q, k in Q4_K and v in Q6_K) is a StackedWeight: each part runs as its own kind. L1 drafts
with int16 activations on every kind but Q8_0 (engine/native matmul_int16: the repacked Q4_0/Q4_1
blocks and the stored K and 5-bit blocks); Q8_0 drafts through the float kernel.

Decoding and verification (up to DENSE_ABOVE tokens) run the blocks as stored through the native
kernel (engine/native/kernels.c). The 32-weight kinds are widened to float32 in registers and
multiplied with float32 activations, so a projection equals the float32 oracle (x @ dequantize().T)
up to the order of a float32 sum (~1e-6 of its output). The K kinds multiply their integer codes
with the activations rounded to int16 per 32 elements (d_a = max |x| / 32767), summed exactly in
int32 and scaled in float32: within max |x| / 65534 sum |w| of the oracle (~1e-5 of the output,
where 8-bit activations are ~1e-2), in a fraction of the widening kernel's instructions;
it is the target's arithmetic for those kinds (weights_tag "-k16a"), and every mode decodes through
it. Prefill chunks widen the blocks once (in one native pass where the kernels run) for one GEMM,
which is the oracle's own arithmetic.

Where no C compiler is found (or TRIFORCE_NATIVE=0), torch's CPU weight-only int4 kernel runs
instead for Q4_0, Q4_1 and Q8_0; the other kinds then run from a float32 copy widened once (the
oracle's arithmetic, four to seven times the blocks' memory). It dequantizes group-wise as (u - 8) * scale + zero, u in 0..15, with groups of 32 along
the input: the same block structure. So
  Q4_0: u = q, scale d, zero 0;     Q4_1: u = q, scale d, zero m + 8 d;
  Q8_0: q = 16 hi + lo (hi in -8..7, lo in 0..15) is two int4 halves over a doubled input
        [x, x]: u = hi + 8 with scale 16 d, zero 0, and u = lo with scale d, zero 8 d.
That kernel is fast only with bfloat16 activations and scales (with float32 ones it ran 15-45x
slower than a float32 matmul on a 2-core Xeon), so that target computes each projection from x
rounded to bfloat16 and returns bfloat16: one projection's largest error is 0.5-2 % of the output's
RMS, and through the bundled model's 30 layers the logits differ by 3-6 % of their RMS. It is a
different target from the native one (runner.weights_tag names which ran, so their snapshots never
mix). Both compute each token's row alone: a row's bits do not depend on how many tokens share the
forward (verification == decoding, tested).
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import psutil
import torch
import torch.nn.functional as F

from engine import native
from engine.offload.layouts import PREFILL_COPY_MAX

log = logging.getLogger(__name__)

BLOCK = 32  # weights per 32-weight GGUF block (and per K sub-block)
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34, "Q5_0": 22, "Q5_1": 24, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
BLOCK_WEIGHTS = {kind: 256 if kind.endswith("_K") else BLOCK for kind in BLOCK_BYTES}  # weights per block
SUPPORTED = tuple(BLOCK_BYTES)
INT4_KINDS = ("Q4_0", "Q4_1", "Q8_0")  # what torch's int4 kernel runs where the native kernels cannot
_ROW_ALIGN = 64  # the int4 packer lays rows out in tiles of 64: pad `out` to it
_PACK_ROWS = 4096  # rows packed per call (bounds the int32 scratch copy)
# The kernel is a GEMV per token: at 256 tokens it ran 1.6x slower than widening the blocks and
# one float32 GEMM (prefill 100 vs 163 tok/s). Verification forwards (at most gamma2 + 2 = 34
# tokens) stay below this, so decoding and verification keep one arithmetic; prefill chunks are
# computed exactly as the float32 oracle computes them.
DENSE_ABOVE = 64
# Widening the bundled model's blocks took 215 ms per prefill chunk, a third of a 256-token chunk's
# time: over a prefill of several chunks the float32 copy is kept (widened_for_prefill) when it fits
# in WIDEN_SHARE of the memory available, and WIDEN_MAX at most: a small model's, never a user's
# 1B+ file's (its copy would be several times the file: those widen one weight at a time, chunk by
# chunk, and the process holds about the file).
WIDEN_SHARE = 0.25
WIDEN_MAX = PREFILL_COPY_MAX  # the planner counts the same copy (engine/offload/layouts.py)


def cpu_prefill_attention_dtype() -> torch.dtype | None:
    """What the CPU target's prefill chunks attend in: bfloat16 where the CPU multiplies bfloat16 in
    hardware (AVX-512 BF16 or AMX: 2.1x faster than float32 over 8K keys on such a 2-core EPYC),
    else float32 (None), which was the faster one on an AVX2-only EPYC (4,096 tokens: 215 against
    202 tok/s, docs/notes/prefill_speed.py) and is the exact float32 arithmetic. Part of the
    target's definition: snapshots are keyed by it (engine/decoding/session.py)."""
    has_units = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)() or \
        getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return torch.bfloat16 if has_units else None


K_KINDS = ("Q4_K", "Q5_K", "Q6_K")  # the native kernel runs these with int16 activations (engine/native)


def blocks_tag(weights: list) -> str:
    """What a runner's file-block weights compute, for snapshot keys (runner.weights_tag): the native
    kernels ("gguf-native-f32", with "-k16a" where a K kind runs there with int16 activations) or
    torch's int4 kernel ("gguf-int4-bf16")."""
    if not any(w.native for w in weights):
        return "gguf-int4-bf16"
    k_kinds = any(part in K_KINDS for w in weights if w.native for part in w.kind.split("+"))
    return "gguf-native-f32-k16a" if k_kinds else "gguf-native-f32"


class QuantWeight:
    """One linear weight [out, in] kept as the file's own GGUF blocks. matmul is the fast path:
    the native kernel over the blocks as stored (engine/native, float32 activations), or, where
    it cannot be built, torch's int4 kernel over a packed copy (bfloat16 activations, packed on
    first use); dequantize is the exact float32 oracle."""

    def __init__(self, kind: str, blocks: np.ndarray, in_features: int,
                 packed: torch.Tensor | None = None, scales_zeros: torch.Tensor | None = None,
                 row_order: np.ndarray | None = None, as_stored: bool = False) -> None:
        """blocks: uint8 [out, in / 32 * BLOCK_BYTES[kind]], rows in the model's (HF) order, or in
        the file's where row_order says which file row is the model's row i (llama.cpp's Q and K:
        the blocks stay a view of the file and the kernel writes each row's output to its column);
        packed/scales_zeros: the kernel's copy when read back from the cache (else built here);
        as_stored: Q4_0 / Q4_1 blocks read by the kernel as the file stores them, not repacked
        (engine/native BlockMatrix), where a large file's copy would cost more memory than it saves time."""
        if kind not in BLOCK_BYTES:
            raise ValueError(f"QuantWeight: {kind} blocks are not supported ({', '.join(SUPPORTED)} are)")
        per = BLOCK_WEIGHTS[kind]
        if in_features % per or blocks.shape[1] != in_features // per * BLOCK_BYTES[kind]:
            raise ValueError(f"QuantWeight: {blocks.shape} {kind} blocks do not hold rows of {in_features} weights")
        self.kind = kind
        self.out_features, self.in_features = int(blocks.shape[0]), in_features
        self.blocks = np.ascontiguousarray(blocks)  # [out, nb * block bytes] uint8, maybe a read-only memory map
        self.row_order = None if row_order is None else np.asarray(row_order, dtype=np.int64)  # [out]
        # fixed for the weight's life: one target per process (the kernel reads its own copy, 4-bit
        # kinds repacked with float32 scales: engine/native repack_q4)
        self._native = None
        if native.available():
            matrix = native.BlockMatrix(kind, self.blocks, as_stored)
            self._native = matrix if self.row_order is None else \
                native.StackedBlocks([matrix], [np.argsort(self.row_order).astype(np.int32)])
        self.doubled = kind == "Q8_0"  # the int4 kernel sees the input twice: [x, x]
        self._packed = (packed, scales_zeros) if packed is not None and scales_zeros is not None else None
        self.keep_dense = False  # set by widened_for_prefill: widen once, keep the copy until it ends
        self.dense: torch.Tensor | None = None  # [out, in] float32, while keep_dense
        self._widened: torch.Tensor | None = None  # [out, in] float32: _torch_matmul's copy of a non-int4 kind

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    @property
    def native(self) -> bool:
        """Whether matmul runs the native block kernel (else torch's int4 kernel)."""
        return self._native is not None

    @property
    def packed_int4(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """torch's int4 copy (packed [out_pad, in' / 2] u8, scales_zeros [in' / 32, out_pad, 2] bf16)
        when it was built or read from the cache; None while only the native kernel ran."""
        return self._packed

    def _int4(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._packed is None:
            self._packed = _pack(self.kind, self.model_blocks(), self.in_features)
        return self._packed

    def _torch_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """matmul without the native kernels: torch's int4 kernel (INT4_KINDS), else the float32
        copy widened once and kept (exact: the oracle's own product)."""
        if self.kind not in INT4_KINDS:
            if self._widened is None:
                self._widened = self.dequantize()
            return F.linear(x.float(), self._widened)
        packed, scales_zeros = self._int4()
        xb = x.to(torch.bfloat16)
        if self.doubled:
            xb = torch.cat([xb, xb], dim=-1)  # [T, 2 in]: hi half then lo half
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb.contiguous(), packed, BLOCK, scales_zeros)
        y = y.float()  # [T, out padded to 64]
        return y if y.shape[1] == self.out_features else y[:, :self.out_features]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] float32 -> [T, out] float32, through the native block kernel (else torch's
        weight-only int4 CPU kernel); a prefill chunk (more than DENSE_ABOVE tokens) widens the
        blocks once for one float32 GEMM."""
        if x.shape[0] > DENSE_ABOVE:
            if not self.keep_dense:
                return F.linear(x, self.dequantize())
            if self.dense is None:
                self.dense = self.dequantize()
            return F.linear(x, self.dense)
        if self.native:
            return self._native.matmul(x.float())
        return self._torch_matmul(x)

    @property
    def native_blocks(self) -> native.BlockMatrix | None:
        """The repacked blocks the native kernels read (None: torch's int4 kernel runs)."""
        return self._native

    @property
    def drafts_int16(self) -> bool:
        """Whether matmul_draft runs the int16-activation kernel (a native 4-bit weight)."""
        return self.native and self._native.drafts_int16

    def matmul_draft(self, x: torch.Tensor) -> torch.Tensor:
        """matmul for a drafting level: x quantized to int16 per block of 32 where the kernel has
        that path (within ~2e-5 of matmul, cheaper), else matmul itself. Approximate: only a level
        whose tokens the target checks may use it."""
        if x.shape[0] <= DENSE_ABOVE and self.drafts_int16:
            return self._native.matmul_int16(x.float())
        return self.matmul(x)

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """The float32 rows at `index` [T] -> [T, in], exactly as the file defines them (an
        embedding lookup dequantizes only the tokens it looks up)."""
        index = index.cpu().numpy()
        picked = np.ascontiguousarray(self.blocks[index if self.row_order is None else self.row_order[index]])
        return dequantize_blocks(self.kind, picked, self.in_features)

    def model_blocks(self) -> np.ndarray:
        """The blocks with rows in the model's order (a copy where the file stores another order)."""
        return self.blocks if self.row_order is None else self.blocks[self.row_order]

    def dequantize(self) -> torch.Tensor:
        """The whole weight in float32 [out, in]: the oracle (equal to gguf's own dequantize), widened
        by the native kernels where they read the kind as stored (the same bits, in one pass)."""
        if self.native:
            dense = native.dequantize_stored(self.kind, self.blocks, self.in_features)  # [out, in], file row order
            if dense is not None:
                return dense if self.row_order is None else dense[torch.from_numpy(self.row_order)]
        return dequantize_blocks(self.kind, self.model_blocks(), self.in_features)

    def native_part(self) -> tuple[native.BlockMatrix, np.ndarray | None] | None:
        """The single-kind blocks the native kernel reads and the column each row goes to (None: the
        model's order), for stacking; None where torch's kernel runs."""
        if self._native is None:
            return None
        if isinstance(self._native, native.StackedBlocks):
            return self._native.parts[0], self._native.cols[0]
        return self._native, None

    def nbytes(self) -> int:
        """Bytes a forward reads for this weight: the native kernel's blocks (4-bit kinds with float32
        scales), or the packed nibbles and the bfloat16 scales (torch's int4 kernel)."""
        if self.native:
            return int(self._native.nbytes)
        if self.kind not in INT4_KINDS:
            return int(self.blocks.nbytes)
        packed, scales_zeros = self._int4()
        return packed.numel() * packed.element_size() + scales_zeros.numel() * scales_zeros.element_size()


class StackedWeight(QuantWeight):
    """A projection stacked along `out` from parts (q | k | v, gate | up), each the file's own tensor
    where it lies, so nothing is concatenated: each part's rows run as its own kind (a Q4_K_M file's
    v in Q6_K beside q and k in Q4_K) and in its own row order, in one native call where the kernels
    run. Its kind is the parts' kind, or their kinds joined by "+" where they differ."""

    def __init__(self, parts: list[QuantWeight]) -> None:
        if len({p.in_features for p in parts}) != 1:
            raise ValueError("StackedWeight: the parts must share in_features")
        self.parts = parts
        kinds = [p.kind for p in parts]
        self.kind = kinds[0] if len(set(kinds)) == 1 else "+".join(kinds)
        self.out_features, self.in_features = sum(p.out_features for p in parts), parts[0].in_features
        self.blocks, self.row_order = None, None  # each part holds its own
        natives = [p.native_part() for p in parts]
        self._native = native.StackedBlocks([n[0] for n in natives], [n[1] for n in natives]) \
            if all(n is not None for n in natives) else None
        self.doubled, self._packed = False, None
        self.keep_dense, self.dense, self._widened = False, None, None

    def _torch_matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p._torch_matmul(x) for p in self.parts], dim=1)  # [T, out]

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        return self.dequantize()[index]

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])  # [out, in]

    def nbytes(self) -> int:
        return sum(p.nbytes() for p in self.parts)


@contextmanager
def widened_for_prefill(runner) -> Iterator[bool]:
    """While it is open, the runner's file-block projections widen to float32 once (at their first
    prefill chunk) and keep that copy, instead of widening again for every chunk; the copies are
    dropped when it closes. Yields whether it widens: not when the copies would take more than
    WIDEN_SHARE of the available memory or WIDEN_MAX. The same float32 values feed the same matmul,
    so every bit of the prefill is what it was."""
    weights = [w for layer in getattr(runner, "layers", ()) for w in
               (getattr(layer, name, None) for name in ("wqkv", "wo", "w_gate_up", "w_down")) if isinstance(w, QuantWeight)]
    need = sum(4 * w.out_features * w.in_features for w in weights)
    if not weights or need > min(WIDEN_MAX, WIDEN_SHARE * psutil.virtual_memory().available):
        yield False
        return
    for w in weights:
        w.keep_dense = True
    try:
        yield True
    finally:
        for w in weights:
            w.keep_dense, w.dense = False, None


def block_fields(kind: str, blocks: np.ndarray, in_features: int):
    """Split raw blocks into (d [out, nb] f32, m [out, nb] f32 or None, q [out, nb, 32]);
    q is uint8 0..15 for the 4-bit kinds (before Q4_0's -8) and int8 -128..127 for Q8_0."""
    out, nb = blocks.shape[0], in_features // BLOCK
    raw = torch.from_numpy(np.require(blocks, requirements=("C", "W"))).view(out, nb, BLOCK_BYTES[kind])
    d = raw[..., 0:2].contiguous().view(torch.float16).float().view(out, nb)  # [out, nb]
    if kind == "Q8_0":
        return d, None, raw[..., 2:].contiguous().view(torch.int8)  # [out, nb, 32]
    start = 4 if kind == "Q4_1" else 2
    m = raw[..., 2:4].contiguous().view(torch.float16).float().view(out, nb) if kind == "Q4_1" else None
    nibbles = raw[..., start:start + BLOCK // 2]  # [out, nb, 16]
    return d, m, torch.cat([nibbles & 0xF, nibbles >> 4], dim=-1)  # [out, nb, 32]


def dequantize_blocks(kind: str, blocks: np.ndarray, in_features: int) -> torch.Tensor:
    """Raw GGUF blocks [out, bytes] -> float32 [out, in], with ggml's own arithmetic (d * q + m:
    a product, then a sum), so the result equals gguf's dequantize bit for bit."""
    if kind.endswith("_K"):
        return _dequantize_k(kind, blocks, in_features)
    out, nb = blocks.shape[0], in_features // BLOCK
    raw = torch.from_numpy(np.require(blocks, requirements=("C", "W"))).view(out, nb, BLOCK_BYTES[kind])
    d = raw[..., 0:2].contiguous().view(torch.float16).float()  # [out, nb, 1]
    if kind == "Q8_0":
        return raw[..., 2:].contiguous().view(torch.int8).float().mul_(d).view(out, in_features)
    if kind in ("Q5_0", "Q5_1"):
        start = 2 if kind == "Q5_0" else 4
        q = _five_bit_codes(raw[..., start:start + 4], raw[..., start + 4:start + 20]).float()  # [out, nb, 32]
        if kind == "Q5_0":
            return q.sub_(16).mul_(d).view(out, in_features)
        return q.mul_(d).add_(raw[..., 2:4].contiguous().view(torch.float16).float()).view(out, in_features)
    start = 4 if kind == "Q4_1" else 2
    nibbles = raw[..., start:start + BLOCK // 2]  # [out, nb, 16]
    w = torch.empty(out, nb, 2, BLOCK // 2)  # element j: low nibble of byte j; j + 16: its high nibble
    w[:, :, 0], w[:, :, 1] = nibbles & 0xF, nibbles >> 4
    if kind == "Q4_0":
        w.sub_(8).mul_(d[..., None])
    else:
        w.mul_(d[..., None]).add_(raw[..., 2:4].contiguous().view(torch.float16).float()[..., None])
    return w.view(out, in_features)


def _five_bit_codes(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1 codes: qh [..., 4] uint8 (bit j of the little-endian u32: element j's fifth bit),
    qs [..., 16] nibbles -> [..., 32] uint8 in 0..31."""
    bits = (qh[..., :, None] >> torch.arange(8, dtype=torch.uint8)) & 1  # [..., 4, 8]: bit 8 i + k
    low = torch.cat([qs & 0xF, qs >> 4], dim=-1)  # [..., 32]
    return low | (bits.flatten(-2) << 4)


def _k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes [..., 12] -> six-bit scales and mins [..., 8] each: sub-blocks 0-3 in
    the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7 in the nibbles of bytes 8-11, with
    their top two bits in the high bits of bytes 0-3 (scales) and 4-7 (mins)."""
    a, b, c = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = torch.cat([a & 63, (c & 0xF) | ((a >> 6) << 4)], dim=-1)
    mins = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 4)], dim=-1)
    return scales, mins


def _dequantize_k(kind: str, blocks: np.ndarray, in_features: int) -> torch.Tensor:
    """Q4_K, Q5_K or Q6_K super-blocks [out, bytes] -> float32 [out, in], gguf's arithmetic."""
    out, ns = blocks.shape[0], in_features // 256
    raw = torch.from_numpy(np.require(blocks, requirements=("C", "W"))).view(out, ns, BLOCK_BYTES[kind])
    if kind == "Q6_K":
        ql = raw[..., 0:128].reshape(out, ns, 2, 1, 64)  # two halves of 128 weights
        low = torch.cat([ql & 0xF, ql >> 4], dim=3).view(out, ns, 2, 128)  # element r: nibble r // 64 of byte r % 64
        qh = raw[..., 128:192].reshape(out, ns, 2, 1, 32)
        high = ((qh >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(4, 1)) & 3).view(out, ns, 2, 128)
        q = (low | (high << 4)).view(torch.int8).sub(32).float().view(out, ns, 16, 16)
        d = raw[..., 208:210].contiguous().view(torch.float16).float()  # [out, ns, 1]
        scales = raw[..., 192:208].contiguous().view(torch.int8).float()  # [out, ns, 16]
        return ((d * scales)[..., None] * q).view(out, in_features)
    d = raw[..., 0:2].contiguous().view(torch.float16).float()  # [out, ns, 1]
    dmin = raw[..., 2:4].contiguous().view(torch.float16).float()
    scales, mins = _k_scale_min(raw[..., 4:16])  # [out, ns, 8] each
    start = 16 if kind == "Q4_K" else 48
    qs = raw[..., start:start + 128].reshape(out, ns, 4, 1, 32)
    q = torch.cat([qs & 0xF, qs >> 4], dim=3).view(out, ns, 8, 32)  # sub-block j: nibble j % 2 of 32 (j // 2)..
    if kind == "Q5_K":
        qh = raw[..., 16:48].reshape(out, ns, 1, 32)
        q = q | (((qh >> torch.arange(8, dtype=torch.uint8).view(8, 1)) & 1) << 4)
    scale = (d * scales.float())[..., None]  # [out, ns, 8, 1]
    offset = (dmin * mins.float())[..., None]
    return (scale * q.float() - offset).view(out, in_features)


def _pack(kind: str, blocks: np.ndarray, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [out_pad, in' / 2], scales_zeros bf16 [in' / 32, out_pad, 2]) for the int4
    kernel, in' = in (2 in for Q8_0), out padded with zero rows to a multiple of 64."""
    out, nb = blocks.shape[0], in_features // BLOCK
    out_pad = -(-out // _ROW_ALIGN) * _ROW_ALIGN
    groups = 2 * nb if kind == "Q8_0" else nb
    scales_zeros = torch.zeros(groups, out_pad, 2)  # [in' / 32, out_pad, 2]; padded rows: scale 0
    packed = []
    for start in range(0, out_pad, _PACK_ROWS):
        stop = min(start + _PACK_ROWS, out_pad)
        d, m, q = block_fields(kind, blocks[start:min(stop, out)], in_features)  # [n, nb] [n, nb] [n, nb, 32]
        n = q.shape[0]
        codes = torch.zeros(stop - start, groups, BLOCK, dtype=torch.int32)  # the packer takes int32 only
        sz = scales_zeros[:, start:start + n]  # [groups, n, 2]
        if kind == "Q8_0":
            codes[:n, :nb] = (q >> 4) + 8  # hi in -8..7, stored as u = hi + 8: scale 16 d, zero 0
            codes[:n, nb:] = q & 0xF  # lo in 0..15: scale d, zero 8 d
            sz[:nb, :, 0], sz[nb:, :, 0], sz[nb:, :, 1] = 16 * d.t(), d.t(), 8 * d.t()
        else:
            codes[:n] = q
            sz[:, :, 0] = d.t()
            if kind == "Q4_1":
                sz[:, :, 1] = (m + 8 * d).t()
        packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.view(stop - start, -1), 1))
    return torch.cat(packed), scales_zeros.to(torch.bfloat16)
