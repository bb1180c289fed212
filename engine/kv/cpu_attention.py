"""Exact attention of a few new queries over K/V held in (pinned) CPU memory, on the CPU.

An offloaded layer's K/V already sit in RAM. For a decode or verification forward (T <= 33 new
tokens) reading them where they are, at the host's memory bandwidth (60-90 GB/s on a DDR5
workstation), beats copying them over PCIe (~25 GB/s): only the new tokens' q/k/v go down and
the [Hq, T, D] output comes back. This is the CPU half of the hybrid offload (engine/kv/offload.py).

The kernel walks the positions in blocks with an online softmax (running max and sum, as flash
attention does), so it reads every K/V byte once and never holds [G*T, S] scores for long S:
per block, the query heads of a KV group are folded into rows and two batched matmuls run.
Storage may be bf16 or fp32; scores, the softmax and the accumulator are fp32.
"""
from __future__ import annotations

import time

import torch

MIN_BLOCK = 1024  # positions per block at least: big enough that per-block dispatch stays small
MAX_BLOCKS = 16  # ... and at most this many blocks: each costs ~12 torch calls, so a fixed block size
# would spend most of a long context's time in dispatch; 16 blocks keep the fp32 scores of one
# block at [Hkv, G*T, S/16] (7 MB for Llama-3.1-8B at 128K, 7 new tokens)


def block_for(total: int) -> int:
    """Positions per block for `total` held positions (a multiple of MIN_BLOCK)."""
    return max(MIN_BLOCK, -(-total // (MAX_BLOCKS * MIN_BLOCK)) * MIN_BLOCK)


def cpu_gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """q [Hq, T, D], k/v [Hkv, S, D] (S >= T, all on the CPU) -> [Hq, T, D] in q's dtype.

    The T new queries are the last T of the S positions: query i sees keys 0..S-T+i (the
    causal lower-right mask, as engine.kv.attention.gqa_attention). Exact softmax attention,
    blocked over S with a running max and sum (block: positions per block; default block_for(S)).
    """
    n_heads, new, dim = q.shape
    n_kv, total = k.shape[0], k.shape[1]
    block = block or block_for(total)
    rows = (n_heads // n_kv) * new
    compute = torch.bfloat16 if k.dtype == torch.bfloat16 else torch.float32  # bf16 x bf16, fp32 accumulate
    # [Hkv, D, G*T]: column r = (query head g of the group, new token t), r = g * T + t. Scores are
    # computed transposed, K block [B, D] @ [D, G*T]: K is read in its stored row-major layout
    # (oneDNN's bf16 matmul is much slower with K^T as the right operand).
    q_cols = (q.float() * dim ** -0.5).reshape(n_kv, rows, dim).transpose(1, 2).to(compute)
    prefix = total - new  # keys past the prefix are in the future of some new query: masked
    token_of_col = torch.arange(rows) % new  # [G*T]
    run_max = torch.full((n_kv, rows, 1), float("-inf"))
    run_sum = torch.zeros((n_kv, rows, 1))
    acc = torch.zeros((n_kv, rows, dim))
    for start in range(0, total, block):
        stop = min(start + block, total)
        k_blk, v_blk = k[:, start:stop], v[:, start:stop]  # [Hkv, B, D]
        # [Hkv, G*T, B] fp32, made contiguous: torch's CPU amax over a non-last (or strided) dim
        # is far slower than over the last one
        scores = torch.bmm(k_blk, q_cols).transpose(1, 2).contiguous().float()
        if stop > prefix + 1:
            positions = torch.arange(start, stop)[None, :]  # [1, B]
            scores.masked_fill_(positions > (prefix + token_of_col)[:, None], float("-inf"))
        new_max = torch.maximum(run_max, scores.amax(dim=-1, keepdim=True))  # [Hkv, G*T, 1]
        scale = torch.exp(run_max - new_max)  # 0 on the first block (exp(-inf)); key 0 is never masked
        probs = torch.exp(scores - new_max)  # [Hkv, G*T, B]
        run_sum = run_sum * scale + probs.sum(dim=-1, keepdim=True)
        acc = acc * scale + torch.bmm(probs.to(compute), v_blk).float()  # [Hkv, G*T, D]
        run_max = new_max
    out = acc / run_sum
    return out.reshape(n_heads, new, dim).to(q.dtype)


def measure_gbps(n_kv: int, n_heads: int, dim: int, positions: int, new: int, dtype: torch.dtype,
                 reps: int = 3) -> dict:
    """Median GB/s (K and V bytes read / time) of cpu_gqa_attention on random data of this shape."""
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(n_kv, positions, dim, generator=gen).to(dtype)  # [Hkv, S, D]
    v = torch.randn(n_kv, positions, dim, generator=gen).to(dtype)
    q = torch.randn(n_heads, new, dim, generator=gen).to(dtype)  # [Hq, T, D]
    cpu_gqa_attention(q, k, v)  # warm-up
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        cpu_gqa_attention(q, k, v)
        times.append(time.perf_counter() - began)
    seconds = sorted(times)[len(times) // 2]
    nbytes = 2 * k.numel() * k.element_size()
    return {"positions": positions, "new_tokens": new, "dtype": str(dtype).replace("torch.", ""),
            "bytes": nbytes, "ms": seconds * 1e3, "gbps": nbytes / seconds / 1e9, "threads": torch.get_num_threads()}
