"""RoPE (engine/kv/rope.py, rope_scaling.py): the one-shift rotation gives the textbook half-split rotation's bits;
the scaled variants give transformers' tables without importing it."""
from __future__ import annotations

import pytest
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


SCALED = [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "linear", "factor": 3.5, "rope_theta": 500000.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192, "rope_theta": 500000.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "rope_theta": 500000.0},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192, "rope_theta": 100000.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 16, "beta_slow": 2},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192, "truncate": False},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048, "mscale": 1.0,
     "mscale_all_dim": 0.5},
    {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192, "attention_factor": 1.25},
]


@pytest.mark.parametrize("params", SCALED, ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items())[:60])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_scaled_rope_tables_are_transformers_bits(params, head_dim):
    """Every scaled variant computed without transformers (engine/kv/rope_scaling.py) gives the inverse
    frequencies and attention scaling transformers' own initialiser gives, bit for bit."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from engine.model.folder_tokenizer import FolderConfig

    values = {"hidden_size": 4 * head_dim, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 16384, "rope_theta": 10000.0, "rope_parameters": dict(params)}
    ours = Rotary(FolderConfig(values), head_dim, torch.device("cpu"), 32768)
    oracle_config = LlamaConfig(**{**values, "rope_parameters": dict(params)})
    kwargs = {"seq_len": 32768} if params["rope_type"] == "dynamic" else {}
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](oracle_config, torch.device("cpu"), **kwargs)
    assert torch.equal(ours.inv_freq, inv_freq.float()) and ours.scaling == float(scaling)
    default = Rotary(LlamaConfig(**{**values, "rope_parameters": None}), head_dim, torch.device("cpu"), 32768)
    assert not torch.equal(ours.inv_freq, default.inv_freq)  # the variant really scales something


def test_scaled_rope_imports_no_transformers():
    """A GGUF's llama3 or YaRN RoPE is computed without importing transformers (its import alone holds
    tens of MB and seconds on a small machine)."""
    import subprocess
    import sys

    code = ("import sys, torch\nfrom engine.kv.rope import Rotary\nfrom engine.model.folder_tokenizer import FolderConfig\n"
            "for p in ({'rope_type': 'llama3', 'factor': 32.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,"
            " 'original_max_position_embeddings': 8192}, {'rope_type': 'yarn', 'factor': 2.0,"
            " 'original_max_position_embeddings': 8192}):\n"
            "    Rotary(FolderConfig({'hidden_size': 256, 'num_attention_heads': 4, 'max_position_embeddings': 16384,"
            " 'rope_parameters': p}), 64, torch.device('cpu'), 16384)\n"
            "print('transformers' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
