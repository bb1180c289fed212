"""The model file's own low-bit weights on the CPU: GGUF Q4_0, Q4_1 and Q8_0 blocks, run as stored.

A GGUF block holds 32 weights of one row with its own float16 scale (and minimum, for Q4_1):
  Q4_0: [d f16][16 bytes of nibbles]        w = d * (q - 8),  q in 0..15
  Q4_1: [d f16][m f16][16 bytes of nibbles] w = d * q + m,    q in 0..15
  Q8_0: [d f16][32 int8]                    w = d * q,        q in -128..127
Nibble j of a block holds element j (low 4 bits) and element j + 16 (high 4 bits).

torch's CPU weight-only int4 kernel dequantizes group-wise as (u - 8) * scale + zero, u in 0..15,
with groups of 32 along the input: the same block structure. So
  Q4_0: u = q, scale d, zero 0;     Q4_1: u = q, scale d, zero m + 8 d;
  Q8_0: q = 16 hi + lo (hi in -8..7, lo in 0..15) is two int4 halves over a doubled input
        [x, x]: u = hi + 8 with scale 16 d, zero 0, and u = lo with scale d, zero 8 d.
The kernel is fast on this CPU only with bfloat16 activations and scales (its float32 path is
scalar: 10-40x slower than a float32 matmul), so the quantized target computes each projection
from x rounded to bfloat16, block scales rounded to bfloat16, float32 accumulation, bfloat16
output. Against the oracle (float32 x @ dequantize().T) a projection agrees to about 1% of the
output's typical magnitude (measured: tests/test_quant.py states the bound). llama.cpp makes the
same kind of trade: it rounds activations to 8 bits before its Q4 dot products.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)

BLOCK = 32  # weights per GGUF block
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
SUPPORTED = tuple(BLOCK_BYTES)
_ROW_ALIGN = 64  # the int4 packer lays rows out in tiles of 64: pad `out` to it
_PACK_ROWS = 4096  # rows packed per call (bounds the int32 scratch copy)


class QuantWeight:
    """One linear weight [out, in] kept as the file's own GGUF blocks, with a packed int4 copy
    for torch's CPU kernel. matmul is the fast path; dequantize is the exact float32 oracle."""

    def __init__(self, kind: str, blocks: np.ndarray, in_features: int) -> None:
        """blocks: uint8 [out, in / 32 * BLOCK_BYTES[kind]], rows in the model's (HF) order."""
        if kind not in BLOCK_BYTES:
            raise ValueError(f"QuantWeight: {kind} blocks are not supported ({', '.join(SUPPORTED)} are)")
        if in_features % BLOCK or blocks.shape[1] != in_features // BLOCK * BLOCK_BYTES[kind]:
            raise ValueError(f"QuantWeight: {blocks.shape} {kind} blocks do not hold rows of {in_features} weights")
        self.kind = kind
        self.out_features, self.in_features = int(blocks.shape[0]), in_features
        self.blocks = blocks  # [out, nb * block bytes] uint8, possibly a read-only memory map
        self.doubled = kind == "Q8_0"  # the kernel sees the input twice: [x, x]
        self.packed, self.scales_zeros = _pack(kind, blocks, in_features)

    @property
    def shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] float32 -> [T, out] float32, through torch's weight-only int4 CPU kernel."""
        xb = x.to(torch.bfloat16)
        if self.doubled:
            xb = torch.cat([xb, xb], dim=-1)  # [T, 2 in]: hi half then lo half
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb.contiguous(), self.packed, BLOCK, self.scales_zeros)
        y = y.float()  # [T, out padded to 64]
        return y if y.shape[1] == self.out_features else y[:, :self.out_features]

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """The float32 rows at `index` [T] -> [T, in], exactly as the file defines them (an
        embedding lookup dequantizes only the tokens it looks up)."""
        picked = np.ascontiguousarray(self.blocks[index.cpu().numpy()])
        return dequantize_blocks(self.kind, picked, self.in_features)

    def dequantize(self) -> torch.Tensor:
        """The whole weight in float32 [out, in]: the oracle (equal to gguf's own dequantize)."""
        return dequantize_blocks(self.kind, np.ascontiguousarray(self.blocks), self.in_features)

    def nbytes(self) -> int:
        """Bytes a forward reads for this weight: the packed nibbles and the bfloat16 scales."""
        return self.packed.numel() * self.packed.element_size() + \
            self.scales_zeros.numel() * self.scales_zeros.element_size()

    @classmethod
    def concat(cls, parts: list["QuantWeight"]) -> "QuantWeight":
        """Stack weights along `out` (q|k|v, gate|up) into one projection: one kernel call."""
        kinds = {p.kind for p in parts}
        if len(kinds) != 1 or len({p.in_features for p in parts}) != 1:
            raise ValueError(f"QuantWeight.concat: parts differ in kind or width ({sorted(kinds)})")
        return cls(parts[0].kind, np.concatenate([p.blocks for p in parts]), parts[0].in_features)


def block_fields(kind: str, blocks: np.ndarray, in_features: int):
    """Split raw blocks into (d [out, nb] f32, m [out, nb] f32 or None, q [out, nb, 32] int32);
    q is 0..15 for the 4-bit kinds (before the -8 of Q4_0) and -128..127 for Q8_0."""
    out, nb = blocks.shape[0], in_features // BLOCK
    raw = torch.from_numpy(np.ascontiguousarray(blocks)).view(out, nb, BLOCK_BYTES[kind])  # [out, nb, bytes]
    d = raw[..., 0:2].contiguous().view(torch.float16).float().view(out, nb)
    if kind == "Q8_0":
        return d, None, raw[..., 2:].contiguous().view(torch.int8).int()
    start = 4 if kind == "Q4_1" else 2
    m = raw[..., 2:4].contiguous().view(torch.float16).float().view(out, nb) if kind == "Q4_1" else None
    nibbles = raw[..., start:start + BLOCK // 2].int()  # [out, nb, 16]
    return d, m, torch.cat([nibbles & 0xF, nibbles >> 4], dim=-1)  # [out, nb, 32]


def dequantize_blocks(kind: str, blocks: np.ndarray, in_features: int) -> torch.Tensor:
    """Raw GGUF blocks [out, bytes] -> float32 [out, in], computed as ggml does (one rounding)."""
    d, m, q = block_fields(kind, blocks, in_features)
    if kind == "Q4_0":
        w = d[..., None] * (q - 8).float()
    elif kind == "Q4_1":
        w = d[..., None] * q.float() + m[..., None]
    else:
        w = d[..., None] * q.float()
    return w.reshape(blocks.shape[0], in_features)


def _pack(kind: str, blocks: np.ndarray, in_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [out_pad, in' / 2], scales_zeros bf16 [in' / 32, out_pad, 2]) for the int4
    kernel, in' = in (2 in for Q8_0), out padded with zero rows to a multiple of 64."""
    out = blocks.shape[0]
    out_pad = -(-out // _ROW_ALIGN) * _ROW_ALIGN
    packed, scales = [], []
    for start in range(0, out_pad, _PACK_ROWS):
        chunk = blocks[start:min(start + _PACK_ROWS, out)]
        d, m, q = block_fields(kind, chunk, in_features)  # [n, nb], [n, nb], [n, nb, 32]
        if kind == "Q8_0":
            codes = torch.cat([(q >> 4) + 8, q & 0xF], dim=1)  # [n, 2 nb, 32]: hi blocks, then lo blocks
            scale = torch.cat([16 * d, d], dim=1)
            zero = torch.cat([torch.zeros_like(d), 8 * d], dim=1)
        else:
            codes, scale = q, d
            zero = m + 8 * d if kind == "Q4_1" else torch.zeros_like(d)
        rows = min(_PACK_ROWS, out_pad - start)
        pad = rows - codes.shape[0]  # zero rows (scale 0) up to the 64-row tile
        codes = torch.nn.functional.pad(codes.reshape(codes.shape[0], -1), (0, 0, 0, pad)).contiguous()
        scale = torch.nn.functional.pad(scale, (0, 0, 0, pad))
        zero = torch.nn.functional.pad(zero, (0, 0, 0, pad))
        packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1))  # [rows, in' / 2]
        scales.append(torch.stack([scale.t(), zero.t()], dim=-1))  # [in' / 32, rows, 2]
    return torch.cat(packed), torch.cat(scales, dim=1).to(torch.bfloat16).contiguous()


# ---------------------------------------------------------------- a GGUF file's projections

_LAYER_TENSORS = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
                  "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}


def unpermute_rows(n_rows: int, n_heads: int) -> np.ndarray:
    """Row order that undoes llama.cpp's Q/K permutation: the converter interleaves each head's
    two rotary halves (HF row h*D + i*D/2 + j is stored at h*D + 2j + i)."""
    head_dim = n_rows // n_heads
    return np.arange(n_rows).reshape(n_heads, head_dim // 2, 2).transpose(0, 2, 1).reshape(-1)


def read_gguf_weights(path: Path, arch) -> tuple[dict[str, QuantWeight], list[str]]:
    """The quantized projections of a GGUF, by the runner's names ("layers.3.q", "embed",
    "lm_head"), rows in HF order; plus the names left to the float32 path (unsupported kinds)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))  # memory-mapped: blocks are read only when used
    tensors = {t.name: t for t in reader.tensors}
    found: dict[str, QuantWeight] = {}
    skipped: list[str] = []
    wanted = {"embed": "token_embd.weight", "lm_head": "output.weight"}
    for i in range(arch.n_layers):
        wanted.update({f"layers.{i}.{role}": f"blk.{i}.{name}.weight" for role, name in _LAYER_TENSORS.items()})
    for key, name in wanted.items():
        tensor = tensors.get(name)
        if tensor is None:
            continue
        kind = tensor.tensor_type.name
        if kind not in BLOCK_BYTES:
            if kind not in ("F32", "F16", "BF16"):
                skipped.append(f"{name} ({kind})")
            continue
        blocks = tensor.data  # [out, bytes] uint8, memory-mapped
        if key.endswith((".q", ".k")):
            heads = arch.n_heads if key.endswith(".q") else arch.n_kv_heads
            blocks = blocks[unpermute_rows(blocks.shape[0], heads)]
        found[key] = QuantWeight(kind, blocks, int(tensor.shape[0]))
    if "output.weight" not in tensors and "embed" in found:  # tied: the file stores the table once
        found["lm_head"] = found["embed"]
    return found, skipped


def use_file_blocks(runner, path: Path) -> int:
    """Swap the runner's float32 projections for the GGUF's own blocks, where the file has them
    in a supported kind; returns how many projections now run quantized (0: nothing changed).
    A fused projection (q|k|v, gate|up) is swapped only when all its parts share one kind."""
    arch = runner.arch
    found, skipped = read_gguf_weights(Path(path), arch)
    fused = {"wqkv": ("q", "k", "v"), "wo": ("o",), "w_gate_up": ("gate", "up"), "w_down": ("down",)}
    swapped = 0
    for i, layer in enumerate(runner.layers):
        for attr, roles in fused.items():
            parts = [found.get(f"layers.{i}.{r}") for r in roles]
            if any(p is None for p in parts) or len({p.kind for p in parts}) != 1:
                continue
            setattr(layer, attr, parts[0] if len(parts) == 1 else QuantWeight.concat(parts))
            if attr == "w_gate_up":
                layer.gate_up_packed = None
            swapped += 1
    embed = found.get("embed")
    head = found.get("lm_head")
    if embed is not None:
        runner.embed = embed
        swapped += 1
    if head is not None:
        runner.lm_head, runner._lm_head_packed = head, None
        swapped += 1
    if skipped:
        log.warning("%s: %d tensors in kinds we cannot run as stored (%s...): those run in float32",
                    Path(path).name, len(skipped), ", ".join(skipped[:3]))
    if swapped:
        runner.weights_tag = "gguf-int4-bf16"
    return swapped
