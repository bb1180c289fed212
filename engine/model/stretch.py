"""A longer context than a model was trained for, as a user option: YaRN with the smallest factor that fits.

A stretch of `window` tokens over a model trained on `trained` tokens sets the config's RoPE to
YaRN with factor `scale / trained` (scale defaults to the window; the bench stretches by its
prompt's length and keeps a few tokens of room past it) and raises max_position_embeddings to
the window, so the runner's cos/sin, the session's capacity and the planner's KV all follow from
the config. Works on a transformers config (loading) and on a config.json dict (planning,
without torch). A model whose config already scales its RoPE is not stretched again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidSettingError, UnsupportedModelError

MAX_FACTOR = 8.0  # past this YaRN's quality falls off (retrieval acceptance too): refuse rather than offer it
OFFERED_FACTOR = 4.0  # the overflow dialog offers a stretch up to this


@dataclass(frozen=True)
class Stretch:
    """A context window asked for: `window` tokens, the YaRN factor sized to cover `scale` tokens
    (None: the window)."""

    window: int
    scale: int | None = None

    @classmethod
    def of(cls, context: "int | Stretch | None") -> "Stretch | None":
        """A Stretch from a plain token count (or None, or a Stretch)."""
        return context if context is None or isinstance(context, Stretch) else cls(int(context))


def stretch_factor(trained: int, scale: int) -> float:
    """The smallest YaRN factor that makes `trained` positions cover `scale` (1.0: no stretch)."""
    return max(1.0, scale / trained)


def _rope_params(cfg: dict) -> dict:
    return dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})


def _check(trained: int, window: int, factor: float, rope_type: str, name: str) -> None:
    if rope_type not in ("default", "", None):
        raise UnsupportedModelError(f"{name} already scales its RoPE ({rope_type}) to {trained} tokens: it cannot "
                                    f"be stretched to {window}; use {trained} tokens or fewer")
    if factor > MAX_FACTOR:
        raise InvalidSettingError(f"--context {window} would stretch {name}'s trained {trained} tokens "
                                  f"{factor:.1f}x: use at most {int(trained * MAX_FACTOR)} tokens")


def stretched_dict(cfg: dict, window: int | None, scale: int | None = None, name: str = "the model") -> dict:
    """A config.json dict stretched to `window` tokens (a copy; the dict itself when no stretch is needed)."""
    trained = int(cfg.get("max_position_embeddings") or 2048)
    if window is None or window <= trained:
        return cfg
    params = _rope_params(cfg)
    factor = stretch_factor(trained, scale or window)
    _check(trained, window, factor, params.get("rope_type", params.get("type", "default")), name)
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    yarn = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": trained,
            "rope_theta": theta}
    out = {k: v for k, v in cfg.items() if k != "rope_scaling"}
    out.update(rope_parameters=yarn, max_position_embeddings=int(window))
    return out


def stretch_config(config: Any, stretch: "Stretch | int | None") -> Any:
    """A transformers config stretched in place to `stretch`'s window (see module doc); returns it."""
    stretch = Stretch.of(stretch)
    trained = int(getattr(config, "max_position_embeddings", 2048))
    if stretch is None or stretch.window <= trained:
        return config
    cfg = {"max_position_embeddings": trained, "rope_theta": getattr(config, "rope_theta", None) or 10000.0,
           "rope_parameters": getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)}
    params = stretched_dict(cfg, stretch.window, stretch.scale, name=str(getattr(config, "_name_or_path", "") or "the model"))
    config.rope_parameters = params["rope_parameters"]
    config.max_position_embeddings = params["max_position_embeddings"]
    return config


def stretched_shape(shape: Any, window: int) -> Any:
    """A planner ModelShape (engine/offload/shapes.py) whose context is `window` when that is past
    its trained one: the planner then counts the stretched KV."""
    if window <= shape.max_context:
        return shape
    from dataclasses import replace

    _check(shape.max_context, window, stretch_factor(shape.max_context, window), "default", shape.name)
    return replace(shape, max_context=int(window))


def describe_rope(config: Any) -> str | None:
    """"YaRN x2 over a trained 8192" for a stretched config (transformers object or dict), else None."""
    cfg = config if isinstance(config, dict) else {"rope_parameters": getattr(config, "rope_parameters", None)}
    params = _rope_params(cfg)
    if params.get("rope_type") != "yarn":
        return None
    factor = float(params.get("factor") or 1.0)
    shown = f"{factor:g}" if math.isclose(factor, round(factor, 2)) else f"{factor:.2f}"
    return f"YaRN x{shown} over a trained {params.get('original_max_position_embeddings')}"


def yarn_of(config: Any) -> tuple[float, int] | None:
    """(factor, trained context) of a YaRN config, as llama.cpp's --rope-scale and --yarn-orig-ctx take them."""
    params = _rope_params({"rope_parameters": getattr(config, "rope_parameters", None)})
    if params.get("rope_type") != "yarn":
        return None
    return float(params.get("factor") or 1.0), int(params.get("original_max_position_embeddings"))


def rope_tag(config: Any) -> str:
    """A short tag naming a YaRN stretch ("" for none): stretched K/V are other bits
    than the unstretched model's, so prefill snapshots key on it."""
    params = _rope_params({"rope_parameters": getattr(config, "rope_parameters", None)})
    if params.get("rope_type") != "yarn":
        return ""
    return f"yarn-{float(params.get('factor') or 1.0):g}-{params.get('original_max_position_embeddings')}"
