"""RoPE (engine/kv/rope.py): the one-shift rotation gives the textbook half-split rotation's bits."""
from __future__ import annotations

import torch
from transformers import LlamaConfig

from engine.kv.rope import Rotary, rotate


def test_rotate_gives_the_bits_of_the_half_split_rotation():
    """rotate(x) = x * cos + roll(x) * sin with sin's first half negated once in cos_sin: each product
    only moves a sign against x * cos + [-x2, x1] * [s1, s2], so every bit is the same."""
    rope = Rotary(LlamaConfig(head_dim=64, hidden_size=576, num_attention_heads=9), 64, torch.device("cpu"), 8192)
    positions = torch.tensor([0, 1, 17, 255, 4095, 8191])
    cos, sin = rope.cos_sin(positions, torch.float32)
    freqs = positions.float()[:, None] * rope.inv_freq[None, :]  # [T, D/2]
    plain_sin = torch.cat((freqs, freqs), dim=-1).sin()  # [T, D]
    assert torch.equal(sin[:, 32:], plain_sin[:, 32:]) and torch.equal(sin[:, :32], -plain_sin[:, :32])
    x = torch.randn(9, len(positions), 64, generator=torch.Generator().manual_seed(0))  # [H, T, D]
    textbook = x * cos + torch.cat((-x[..., 32:], x[..., :32]), dim=-1) * plain_sin
    assert torch.equal(rotate(x, cos, sin), textbook)
