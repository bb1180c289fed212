"""Rotary position embedding for the Llama family, every scaling transformers knows.

The inverse frequencies are transformers' (default, linear, dynamic, llama3 and yarn computed the
same way in engine/kv/rope_scaling.py, other variants by transformers itself), so our numbers match
its models exactly; this module turns them into cos/sin for given absolute positions.
"""
from __future__ import annotations

import torch

from engine import native
from engine.kv.rope_scaling import NATIVE_TYPES, inverse_frequencies


def _rope_parameters(config) -> dict:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(params)


def _init_functions() -> dict:
    """transformers' RoPE initialisers, imported only for a variant rope_scaling.py does not compute
    (transformers takes as long to import as torch)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS


def _transformers_config(config):
    """`config` as transformers' RoPE initialisers read it: they call methods of its config classes
    (standardize_rope_params), which a plain attribute config (engine/model/folder_tokenizer.py's
    FolderConfig, a GGUF's header) lacks."""
    if hasattr(config, "standardize_rope_params"):
        return config
    from transformers import LlamaConfig

    values = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))
    values["rope_parameters"] = _rope_parameters(config)
    values.pop("rope_scaling", None)
    return LlamaConfig(**values)


class Rotary:
    """cos/sin tables for absolute positions. `max_positions` fixes dynamic-NTK scaling for the
    whole cache (keys are cached post-RoPE, so the frequencies must not change mid-sequence)."""

    def __init__(self, config, head_dim: int, device: torch.device, max_positions: int) -> None:
        params = _rope_parameters(config)
        rope_type = params.get("rope_type", params.get("type", "default")) or "default"
        if rope_type == "default":
            theta = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
            dim = int(head_dim * float(getattr(config, "partial_rotary_factor", 1.0)))
            inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim))
            scaling = 1.0
        elif rope_type in NATIVE_TYPES:
            theta = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
            factor = float(params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)))
            trained = int(getattr(config, "max_position_embeddings", max_positions))
            if getattr(config, "original_max_position_embeddings", None):  # outside rope_parameters (Phi-3 style)
                params["original_max_position_embeddings"] = config.original_max_position_embeddings
            inv_freq, scaling = inverse_frequencies(params, int(head_dim * factor), theta, trained, max_positions,
                                                    device)
        elif rope_type in _init_functions():
            fn = _init_functions()[rope_type]
            inv_freq, scaling = fn(_transformers_config(config), device)  # dynamic is native: no seq_len here
        else:
            from engine.errors import UnsupportedModelError

            raise UnsupportedModelError(f"RoPE scaling {rope_type!r} is not supported: use a Llama-family model "
                                        f"with default, linear, dynamic, llama3 or yarn scaling")
        self.rope_type = rope_type
        self.inv_freq = inv_freq.float().to(device)  # [D/2]
        self.scaling = float(scaling)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] (int64) -> cos, sin [T, D] in `dtype` (computed in float32 like transformers),
        sin with its first half negated: the sign `rotate` needs, folded in once per forward."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        sin = emb.sin() * self.scaling
        sin[:, :freqs.shape[-1]].neg_()
        return (emb.cos() * self.scaling).to(dtype), sin.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fast: bool | None = None) -> torch.Tensor:
    """x [H, T, D] rotated by cos/sin [T, D] from `Rotary.cos_sin` (half-split convention of Llama
    checkpoints): x * cos + [x2, x1] * [-s1, s2], the same bits as x * cos + [-x2, x1] * [s1, s2]
    (a sign moves exactly), with one shift instead of two slices, a negation and a concatenation.
    `fast`: native.available(), when the caller looked it up once per forward (it reads the
    environment, and a forward calls this twice per layer)."""
    if fast is None:
        fast = native.available()
    if fast and x.dtype == torch.float32 and x.device.type == "cpu" and cos.dtype == torch.float32:
        return native.rope(x, cos, sin)  # one call instead of four ops (the same formula per element)
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin
