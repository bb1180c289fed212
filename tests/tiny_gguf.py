"""Tiny GGUF files for tests, written with gguf's own writer and quantizer: a 2-layer Llama with
each tensor in the block kind a test asks for, Q/K rows interleaved as llama.cpp's converter
stores them, and the first tokens of the bundled BPE tokenizer in the metadata.

`write_gguf` returns the weights in transformers' names and row order, each already through its
kind's quantization (the float32 values the file defines): the oracle a reader must reproduce.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
HEAD_DIM = HIDDEN // HEADS
ROLES = {"q": ("attn_q", "self_attn.q_proj"), "k": ("attn_k", "self_attn.k_proj"),
         "v": ("attn_v", "self_attn.v_proj"), "o": ("attn_output", "self_attn.o_proj"),
         "gate": ("ffn_gate", "mlp.gate_proj"), "up": ("ffn_up", "mlp.up_proj"), "down": ("ffn_down", "mlp.down_proj")}


def _interleave(w: np.ndarray, heads: int) -> np.ndarray:
    """transformers' Q/K row order -> llama.cpp's (each head's two rotary halves interleaved)."""
    return w.reshape(heads, 2, -1, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, tokenizer_dir: Path, kinds: dict[str, str] | None = None, *, arch: str = "llama",
               vocab_size: int = 512, tokenizer: bool = True, tied: bool = False, seed: int = 0,
               theta: float = 10000.0, rope_freqs: np.ndarray | None = None) -> dict:
    """Write the file; returns {transformers name: float32 array} of what it stores. `kinds` maps a
    role ("q", "k", "v", "o", "gate", "up", "down", "embed", "output") to a ggml kind (default F32)."""
    import gguf
    from gguf import GGMLQuantizationType, quants

    kinds = kinds or {}
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = {text: idx for text, idx in tok["model"]["vocab"].items() if idx < vocab_size}
    tokens = sorted(vocab, key=vocab.get)
    special = {t["id"] for t in tok["added_tokens"] if t.get("special")}
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in tok["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
        w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
                           for i in range(len(tokens))])
        w.add_token_merges([f"{a} {b}" for a, b in pairs if a in vocab and b in vocab and a + b in vocab])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    rng = np.random.default_rng(seed)
    stored: dict[str, np.ndarray] = {}

    def add(gguf_name: str, hf_name: str, role: str, rows: int, cols: int, heads: int | None = None) -> None:
        value = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        kind = kinds.get(role, "F32")
        on_disk = _interleave(value, heads) if heads and arch == "llama" else value
        if kind == "F32":
            w.add_tensor(gguf_name, on_disk)
            defined = on_disk
        else:
            qtype = GGMLQuantizationType[kind]
            blocks = quants.quantize(on_disk, qtype)
            w.add_tensor(gguf_name, blocks, raw_dtype=qtype)
            defined = quants.dequantize(blocks, qtype)
        if heads and arch == "llama":  # back in transformers' order
            defined = defined.reshape(heads, -1, 2, cols).swapaxes(1, 2).reshape(rows, cols)
        stored[hf_name] = np.ascontiguousarray(defined, dtype=np.float32)

    if rope_freqs is not None:  # llama3 RoPE scaling, stored the way llama.cpp stores it
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    add("token_embd.weight", "model.embed_tokens.weight", "embed", len(tokens), HIDDEN)
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.full(HIDDEN, 1.0 + 0.01 * i, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.full(HIDDEN, 1.0 - 0.01 * i, np.float32))
        stored[f"model.layers.{i}.input_layernorm.weight"] = np.full(HIDDEN, 1.0 + 0.01 * i, np.float32)
        stored[f"model.layers.{i}.post_attention_layernorm.weight"] = np.full(HIDDEN, 1.0 - 0.01 * i, np.float32)
        shapes = {"q": (HIDDEN, HIDDEN, HEADS), "k": (KV_HEADS * HEAD_DIM, HIDDEN, KV_HEADS),
                  "v": (KV_HEADS * HEAD_DIM, HIDDEN, None), "o": (HIDDEN, HIDDEN, None),
                  "gate": (FFN, HIDDEN, None), "up": (FFN, HIDDEN, None), "down": (HIDDEN, FFN, None)}
        for role, (gguf_name, hf_name) in ROLES.items():
            rows, cols, heads = shapes[role]
            add(f"blk.{i}.{gguf_name}.weight", f"model.layers.{i}.{hf_name}.weight", role, rows, cols, heads)
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    stored["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    if not tied:
        add("output.weight", "lm_head.weight", "output", len(tokens), HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored
