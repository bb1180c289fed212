"""Random Llama-shaped runners built in memory (no files, no tokenizer): for tests that need
exact control of vocabulary size, devices and dtypes."""
from __future__ import annotations

import torch
from transformers import LlamaConfig

from engine.model.runner import LlamaRunner


def random_runner(seed: int, vocab: int = 12, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                  logit_scale: float = 1.5, device: str = "cpu", dtype: torch.dtype = torch.float32,
                  max_positions: int = 4096) -> LlamaRunner:
    config, state = random_weights(seed, vocab, hidden, layers, heads, kv_heads, logit_scale, max_positions)
    return LlamaRunner(config, state, torch.device(device), dtype)


def random_weights(seed: int, vocab: int = 12, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                   logit_scale: float = 1.5, max_positions: int = 4096) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """(config, checkpoint-style state dict) of a random Llama on the CPU."""
    head_dim = hidden // heads
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=2 * hidden,
                         max_position_embeddings=max_positions, head_dim=head_dim)
    g = torch.Generator().manual_seed(seed)
    kv = kv_heads * head_dim
    state = {}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj.weight": (hidden, hidden), "self_attn.k_proj.weight": (kv, hidden),
                  "self_attn.v_proj.weight": (kv, hidden), "self_attn.o_proj.weight": (hidden, hidden),
                  "mlp.gate_proj.weight": (2 * hidden, hidden), "mlp.up_proj.weight": (2 * hidden, hidden),
                  "mlp.down_proj.weight": (hidden, 2 * hidden)}
        for name, shape in shapes.items():
            state[p + name] = torch.randn(shape, generator=g) * (1.7 / hidden ** 0.5)
        state[p + "input_layernorm.weight"] = torch.ones(hidden)
        state[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    state["model.embed_tokens.weight"] = torch.randn(vocab, hidden, generator=g)
    state["model.norm.weight"] = torch.ones(hidden)
    state["lm_head.weight"] = torch.randn(vocab, hidden, generator=g) * logit_scale  # peaky distributions
    return config, state
