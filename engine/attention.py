"""Grouped-query attention of T new queries against a key/value prefix (batch 1)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_mask(new_tokens: int, total: int, device: torch.device) -> torch.Tensor | None:
    """[T, S] bool mask: query i (the (S-T+i)-th token) sees keys 0..S-T+i. None when T == 1."""
    if new_tokens == 1:
        return None
    prefix = total - new_tokens
    cols = torch.arange(total, device=device)[None, :]  # [1, S]
    rows = torch.arange(new_tokens, device=device)[:, None] + prefix  # [T, 1]
    return cols <= rows


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q [Hq, T, D], k/v [Hkv, S, D], mask [T, S] bool or None -> [Hq, T, D].

    Query heads of one KV group are folded into the row dimension, so K/V are read once per
    KV head instead of being repeated G times (what bounds decode speed is bytes read).
    """
    n_heads, new_tokens, dim = q.shape
    n_kv = k.shape[0]
    group = n_heads // n_kv
    q_grouped = q.reshape(n_kv, group * new_tokens, dim)  # [Hkv, G*T, D]
    if mask is not None:
        mask = mask.repeat(group, 1)  # [G*T, S]
    out = F.scaled_dot_product_attention(q_grouped, k, v, attn_mask=mask)  # [Hkv, G*T, D]
    return out.reshape(n_heads, new_tokens, dim)
