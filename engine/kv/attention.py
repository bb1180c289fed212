"""Grouped-query attention of T new queries against a key/value prefix (batch 1).

Every cache here holds only the past of its new tokens, so the one mask ever needed is causal,
aligned to the bottom right: new query i (the (S-T+i)-th token) sees keys 0..S-T+i.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine import native

PREFILL_ROWS = 16  # a CPU forward of more new tokens than this attends as a prefill chunk


def causal_mask(new_tokens: int, total: int, device: torch.device) -> torch.Tensor | None:
    """[T, S] bool mask: query i (the (S-T+i)-th token) sees keys 0..S-T+i. None when T == 1."""
    if new_tokens == 1:
        return None
    prefix = total - new_tokens
    cols = torch.arange(total, device=device)[None, :]  # [1, S]
    rows = torch.arange(new_tokens, device=device)[:, None] + prefix  # [T, 1]
    return cols <= rows


def prefill_tag(device: torch.device | str) -> str:
    """What a snapshot key adds for the arithmetic of a prefill on `device`: the native prefill
    kernel and SDPA give K/V of other bits, so a book prefilled by one is not restored into the other."""
    return "attn-native" if torch.device(device).type == "cpu" and native.available() else ""


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q [Hq, T, D], k/v [Hkv, S, D] (S >= T), mask: causal_mask(T, S) or None -> [Hq, T, D].

    CUDA: fused SDPA (flash / memory-efficient kernels) with GQA and a lower-right causal bias, so
    K/V are streamed once and never repeated or upcast. CPU: for decode/verification shapes the
    query heads of a KV group are folded into rows and two batched matmuls run (faster than SDPA's
    CPU kernels there). Prefill chunks (more than PREFILL_ROWS rows) of float32 queries over float32
    or float16 K/V take the native blocked prefill kernel where it runs (no upcast copy of the
    prefix; a row's bits depend only on its own query and keys, so every cache kind that prefills
    here, resident, offloaded or a tensor-parallel shard, stores the same K/V downstream), else SDPA.
    """
    n_heads, new_tokens, dim = q.shape
    n_kv, total = k.shape[0], k.shape[1]
    if q.device.type == "cuda":
        from torch.nn.attention.bias import causal_lower_right  # imports torch._dynamo: not on the CPU's path

        bias = causal_lower_right(new_tokens, total) if new_tokens > 1 else None
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=bias, enable_gqa=True)[0]
    if new_tokens > PREFILL_ROWS:  # prefill: blocked kernels that never materialise [G*T, S] scores
        if native.prefill_attention_supports(q, k, v):
            return native.prefill_attention(q, k, v)
        if k.dtype != q.dtype:  # stored narrower: attend in the queries' dtype
            k, v = k.to(q.dtype), v.to(q.dtype)
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, enable_gqa=True)[0]
    group = n_heads // n_kv
    q_rows = q.reshape(n_kv, group * new_tokens, dim) * dim ** -0.5  # [Hkv, G*T, D]
    scores = torch.bmm(q_rows, k.transpose(1, 2))  # [Hkv, G*T, S]
    if mask is not None:
        scores = scores.masked_fill(~mask.repeat(group, 1), float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    return torch.bmm(probs, v).reshape(n_heads, new_tokens, dim)
