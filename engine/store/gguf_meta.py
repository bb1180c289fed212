"""What a GGUF's metadata says about its model: the transformers config of a Llama-family model and
its tokenizer (vocabulary, merges, special tokens, chat template), written as the small files a
model folder has (config.json, generation_config.json, tokenizer.json, tokenizer_config.json,
chat_template.jinja). The weights stay in the GGUF.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from engine.errors import ModelFormatError, UnsupportedModelError
from engine.store.gguf_file import GgufFile

# general.architecture -> transformers model_type; llama.cpp writes Mistral 7B-style models as "llama"
ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}
CLASS_NAMES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
TOKEN_LIST = "tokenizer.ggml.tokens"
# llama3 scaling is stored as a per-frequency divisor tensor, not as metadata: the usual parameters are
# checked against it (Llama 3.1 and 3.2 use low 1, high 4 over an 8192-token original context)
LLAMA3_CANDIDATES = ((1.0, 4.0, 8192),)


def check_architecture(gguf: GgufFile) -> str:
    """The transformers model_type of a GGUF we run; UnsupportedModelError for any other."""
    arch = gguf.architecture
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{gguf.path.name} is a {arch or 'unknown'!r} model: only Llama-family GGUFs "
            f"({', '.join(ARCHITECTURES)}) run here; pick a Llama, Mistral, Qwen2 or SmolLM2 GGUF")
    return ARCHITECTURES[arch]


def config_dict(gguf: GgufFile) -> dict:
    """The transformers config (config.json) of a Llama-family GGUF, from its metadata."""
    model_type = check_architecture(gguf)
    key = gguf.arch_key
    try:
        hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
        layers, ffn = int(key("block_count")), int(key("feed_forward_length"))
    except (TypeError, ValueError):
        raise ModelFormatError(f"{gguf.path.name} lacks its model shape in the metadata (embedding_length, "
                               "head_count, block_count, feed_forward_length): convert the model again") from None
    kv_heads = int(key("attention.head_count_kv", heads))
    head_dim = int(key("attention.key_length", hidden // heads))
    vocab = key("vocab_size") or gguf.metadata.get(TOKEN_LIST) or gguf.tensors["token_embd.weight"].shape[0]
    vocab = vocab if isinstance(vocab, int) else len(vocab)
    tokens = {name: gguf.metadata.get(f"tokenizer.ggml.{name}_token_id")
              for name in ("bos", "eos", "padding", "unknown")}
    config = {
        "architectures": [CLASS_NAMES[model_type]],
        "model_type": model_type,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(key("context_length", 4096)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_parameters": rope_parameters(gguf, head_dim),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "attention_bias": "blk.0.attn_q.bias" in gguf.tensors,
        "bos_token_id": tokens["bos"],
        "eos_token_id": tokens["eos"],
        "pad_token_id": tokens["padding"],
        "unk_token_id": tokens["unknown"],
    }
    if model_type == "mistral":
        config["sliding_window"] = None
    return config


def rope_parameters(gguf: GgufFile, head_dim: int) -> dict:
    """rope_theta and the scaling as transformers names them (linear, yarn from the metadata;
    llama3 recognised from the file's rope_freqs tensor)."""
    theta = float(gguf.arch_key("rope.freq_base", 10000.0))
    params: dict = {"rope_type": "default", "rope_theta": theta}
    scaling = str(gguf.arch_key("rope.scaling.type", "none") or "none")
    factor = float(gguf.arch_key("rope.scaling.factor", 1.0) or 1.0)
    original = gguf.arch_key("rope.scaling.original_context_length")
    if scaling == "linear" and factor != 1.0:
        params.update(rope_type="linear", factor=factor)
    elif scaling == "yarn":
        params.update(rope_type="yarn", factor=factor)
        if original:
            params["original_max_position_embeddings"] = int(original)
    elif scaling not in ("none", "linear"):
        raise UnsupportedModelError(f"{gguf.path.name} uses RoPE scaling {scaling!r}: only linear, yarn and "
                                    "llama3 scaling run here")
    if "rope_freqs.weight" in gguf.tensors:
        params.update(_llama3_parameters(gguf, theta, head_dim))
    return params


def _llama3_parameters(gguf: GgufFile, theta: float, head_dim: int) -> dict:
    """The llama3 scaling whose per-frequency divisors equal the file's rope_freqs."""
    stored = np.asarray(gguf.values("rope_freqs.weight"), dtype=np.float64)  # [D/2]
    factor = float(stored.max())
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv_freq
    for low, high, original in LLAMA3_CANDIDATES:
        smooth = np.clip((original / wavelen - low) / (high - low), 0.0, 1.0)
        divisor = 1.0 / ((1 - smooth) / factor + smooth)
        if stored.shape == divisor.shape and np.allclose(stored, divisor, rtol=1e-4):
            return {"rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": original}
    raise UnsupportedModelError(f"{gguf.path.name} has per-frequency RoPE factors that are not Llama 3's "
                                "usual scaling: this engine cannot run them")


def write_metadata(gguf: GgufFile, dest: Path) -> None:
    """config.json, generation_config.json and the tokenizer files of `gguf` into folder `dest`."""
    config = config_dict(gguf)
    if not isinstance(gguf.metadata.get(TOKEN_LIST), (int, list)):
        raise ModelFormatError(f"{gguf.path.name} has no tokenizer in its metadata (no {TOKEN_LIST}): use a GGUF "
                               "converted with its tokenizer (llama.cpp's convert_hf_to_gguf.py writes it)")
    tokenizer = _tokenizer(gguf)
    (dest / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config[k] is not None}
    (dest / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    tokenizer.save_pretrained(dest)


def _tokenizer(gguf: GgufFile):
    """transformers' fast tokenizer built from the GGUF's metadata (no weights read)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(gguf.path.parent), gguf_file=gguf.path.name)
    except (ValueError, KeyError, TypeError, NotImplementedError, OSError) as exc:
        raise ModelFormatError(f"{gguf.path.name}: its tokenizer metadata cannot be read ({exc}): use a GGUF "
                               "converted by llama.cpp with a BPE or sentencepiece tokenizer") from None
