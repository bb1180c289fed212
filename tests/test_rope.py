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


def test_a_plain_attribute_config_takes_yarn_as_transformers_config_does():
    """A GGUF's or folder's config (FolderConfig: attributes only) asking for YaRN gives the tables
    a transformers LlamaConfig with the same values gives (its RoPE initialisers call config methods)."""
    from engine.model.folder_tokenizer import FolderConfig

    values = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
              "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128,
                                  "rope_theta": 10000.0}}
    plain = Rotary(FolderConfig(values), 16, torch.device("cpu"), 256)
    oracle = Rotary(LlamaConfig(**values), 16, torch.device("cpu"), 256)
    assert torch.equal(plain.inv_freq, oracle.inv_freq) and plain.scaling == oracle.scaling != 1.0
