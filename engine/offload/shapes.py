"""The shape of a model: what the planner needs to count bytes, read from a config.json.

`shape_for(spec)` finds a config without downloading anything: the preset we ship, a local
folder or .gguf file, or the Hugging Face cache. Parameter counts are exact for the Llama
family (Llama 2/3, Mistral, Qwen2, SmolLM2): attention, SwiGLU MLP, two RMSNorms per layer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import ModelFormatError, ModelNotFoundError
from engine.store.presets import shipped_config

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8}


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a decoder-only Llama-family model. Byte counts take the dtype as an argument
    because the planner runs a model in its device's dtype (bf16 on GPU, fp32 on CPU)."""

    name: str
    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    max_context: int
    tie_embeddings: bool
    qkv_bias: bool
    dtype_bytes: int  # of the checkpoint (config's torch_dtype); 2 when unknown
    # bytes of a GGUF's own blocks (all layers, token embedding, untied output + norm), which the CPU
    # runs memory-mapped as stored; None for a checkpoint the CPU widens to float32
    file_bytes: tuple[int, int, int] | None = None

    @classmethod
    def from_config(cls, config: Any, name: str = "") -> "ModelShape":
        """Build from a config.json dict or a transformers `PretrainedConfig`."""
        cfg = config if isinstance(config, dict) else config.to_dict()
        if "text_config" in cfg and "hidden_size" not in cfg:
            cfg = {**cfg["text_config"], "model_type": cfg.get("model_type", "")}
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            shape = cls(
                name=name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "model"),
                model_type=str(cfg.get("model_type", "")),
                vocab=int(cfg["vocab_size"]),
                hidden=hidden,
                layers=int(cfg["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                intermediate=int(cfg["intermediate_size"]),
                max_context=int(cfg.get("max_position_embeddings") or 2048),
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v biases; Llama only when attention_bias is set.
                qkv_bias=cfg.get("model_type") == "qwen2" or bool(cfg.get("attention_bias", False)),
                dtype_bytes=_dtype_bytes(cfg.get("torch_dtype") or cfg.get("dtype")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFormatError(f"config of {name or 'model'} lacks a usable {exc} entry: is it a Llama-family decoder?") from exc
        if shape.heads % shape.kv_heads:
            raise ModelFormatError(f"{shape.name}: {shape.heads} attention heads are not a multiple of {shape.kv_heads} KV heads")
        return shape

    # -- parameter counts -------------------------------------------------------------
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def lm_head_params(self) -> int:
        """0 when tied to the embeddings. The final norm is counted here too."""
        return (0 if self.tie_embeddings else self.vocab * self.hidden) + self.hidden

    def layer_params(self) -> int:
        q_out, kv_out = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * q_out + 2 * self.hidden * kv_out + q_out * self.hidden
        bias = q_out + 2 * kv_out if self.qkv_bias else 0
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down (SwiGLU)
        return attn + bias + mlp + 2 * self.hidden  # + input and post-attention RMSNorm

    def param_count(self) -> int:
        return self.embedding_params() + self.layers * self.layer_params() + self.lm_head_params()

    # -- bytes ------------------------------------------------------------------------
    def weight_bytes(self, dtype_bytes: int | None = None) -> int:
        return self.param_count() * (dtype_bytes or self.dtype_bytes)

    def layer_kv_bytes_per_token(self, dtype_bytes: int | None = None) -> int:
        """K and V of one layer for one token."""
        return 2 * self.kv_heads * self.head_dim * (dtype_bytes or self.dtype_bytes)

    def kv_bytes_per_token(self, dtype_bytes: int | None = None) -> int:
        """K and V of all layers for one token (Llama-3.1-8B bf16: 128 KiB)."""
        return self.layers * self.layer_kv_bytes_per_token(dtype_bytes)


def _dtype_bytes(value: Any) -> int:
    text = str(value or "").removeprefix("torch.")
    return _DTYPE_BYTES.get(text, 2)


def shape_for(spec: str) -> ModelShape:
    """The shape of a model named by a preset repo id, a local folder or .gguf, or a cached repo id.

    Never touches the network. Raises ModelNotFoundError when nothing local describes it.
    """
    config = shipped_config(spec)
    if config is not None:
        return ModelShape.from_config(config, name=spec)
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return ModelShape.from_config(_read_json(path / "config.json"), name=path.name)
    if path.is_file() and path.suffix == ".gguf":
        return _shape_from_gguf(path)
    if path.is_file() and path.name.endswith(".json"):
        return ModelShape.from_config(_read_json(path), name=path.parent.name)
    cached = _cached_config(spec)
    if cached is not None:
        return ModelShape.from_config(_read_json(cached), name=spec)
    raise ModelNotFoundError(f"{spec!r} is not a preset and not in the local cache: download it first or pass a folder")


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"cannot read {path}: {exc}") from exc


def _cached_config(repo_id: str) -> Path | None:
    """config.json of `repo_id` in the Hugging Face cache, or None; offline by construction."""
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id
        return None
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def _shape_from_gguf(path: Path) -> ModelShape:
    """Read the shape from GGUF metadata (memory-mapped; the tensors are not loaded)."""
    from engine.store.gguf_file import read_header

    header = read_header(path)  # ModelFormatError for a damaged file

    def field(key: str, default: Any = None) -> Any:
        return header.metadata.get(key, default)

    arch = field("general.architecture")
    if arch is None:
        raise ModelFormatError(f"{path} has no general.architecture: not a model GGUF")
    tensor_names = set(header.tensors)
    tokens = field("tokenizer.ggml.tokens")  # the number of tokens (the list is not read)
    hidden, heads = field(f"{arch}.embedding_length"), field(f"{arch}.attention.head_count")
    config = {
        "model_type": "qwen2" if arch == "qwen2" else "llama",
        "vocab_size": field(f"{arch}.vocab_size") or (tokens if isinstance(tokens, int) else 0),
        "hidden_size": hidden,
        "num_hidden_layers": field(f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": field(f"{arch}.attention.head_count_kv", heads),
        "head_dim": field(f"{arch}.attention.key_length", hidden // heads if hidden and heads else None),
        "intermediate_size": field(f"{arch}.feed_forward_length"),
        "max_position_embeddings": field(f"{arch}.context_length"),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "torch_dtype": "bfloat16",  # a GPU widens the file's blocks to bf16; the CPU runs them (file_bytes)
    }
    layers = sum(t.nbytes for name, t in header.tensors.items() if name.startswith("blk."))
    embedding = header.tensors["token_embd.weight"].nbytes if "token_embd.weight" in header.tensors else 0
    head = sum(t.nbytes for name, t in header.tensors.items() if not name.startswith("blk.") and name != "token_embd.weight")
    return replace(ModelShape.from_config(config, name=path.stem), file_bytes=(layers, embedding, head))
