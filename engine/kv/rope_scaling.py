"""Inverse frequencies of the scaled RoPE variants Llama-family files ask for, without transformers.

Linear, dynamic NTK, llama3 (Llama 3.1+) and YaRN are computed here with the same tensor operations,
in the same order, as transformers' RoPE initialisers, so the tables are the same bits (a test holds
them to transformers as the oracle). Importing transformers costs about as much memory and time as
a small model; a GGUF carries everything these formulas need in its header. Variants not listed here
(longrope and the like) return None and the caller asks transformers.
"""
from __future__ import annotations

import math

import torch

NATIVE_TYPES = ("linear", "dynamic", "llama3", "yarn")


def inverse_frequencies(params: dict, dim: int, theta: float, trained_positions: int, max_positions: int,
                        device: torch.device) -> tuple[torch.Tensor, float] | None:
    """inv_freq [dim / 2] and the cos/sin scaling for `params` (a config's rope_parameters), or None
    for a variant this module does not know. dim: the rotated part of a head; trained_positions:
    the config's max_position_embeddings; max_positions: the cache's window (dynamic NTK only)."""
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    steps = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float)  # [dim / 2]
    if rope_type == "linear":
        return 1.0 / (theta ** (steps / dim)) / params["factor"], 1.0
    if rope_type == "dynamic":
        seq_len = max(max_positions, trained_positions)
        factor = params["factor"]
        base = theta * ((factor * seq_len / trained_positions) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (base ** (steps / dim)), 1.0
    original = params.get("original_max_position_embeddings") or trained_positions
    if rope_type == "llama3":
        return _llama3(params, steps, dim, theta, original), 1.0
    if rope_type == "yarn":
        return _yarn(params, steps, dim, theta, original, trained_positions, device)
    return None


def _llama3(params: dict, steps: torch.Tensor, dim: int, theta: float, original: int) -> torch.Tensor:
    """Llama 3.1's bands: long wavelengths divided by `factor`, short ones kept, a smooth blend between."""
    inv_freq = 1.0 / (theta ** (steps / dim))  # [dim / 2]
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature, 0.1 * mscale * ln(scale) + 1 (1 when not stretched)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(params: dict, steps: torch.Tensor, dim: int, theta: float, original: int, trained_positions: int,
          device: torch.device) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate the low frequencies by `factor`, keep the high ones, ramp between the
    dimensions that turn beta_fast and beta_slow times over the trained window."""
    factor = params.get("factor") or trained_positions / original
    scaling = params.get("attention_factor")
    if scaling is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        scaling = (float(_mscale(factor, mscale) / _mscale(factor, mscale_all)) if mscale and mscale_all
                   else _mscale(factor))
    beta_fast, beta_slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)  # [dim / 2]
    pos_freqs = theta ** (steps / dim)
    extrapolation = 1 - ramp.to(device=device, dtype=torch.float)
    inv_freq = 1.0 / (factor * pos_freqs) * (1 - extrapolation) + 1.0 / pos_freqs * extrapolation
    return inv_freq, scaling
