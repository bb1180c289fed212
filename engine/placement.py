"""From a planner `Plan` to where the loaded weights run: one card, a layer split, or tensor
parallel across cards, plus the draft model's card and the offloaded KV layers.

The plan is made from config.json alone (engine/planner.py), before any weight is read, so a
model that cannot fit fails with the numbers before anything is allocated.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch

from engine.settings import DecodeSettings


@dataclass(frozen=True)
class Placement:
    """Where the target's weights and KV go.

    layer_devices: one device per layer (one card: all the same; layer split: runs of layers).
    tensor_parallel: the cards that split every layer (then layer_devices is empty).
    offloaded: layers whose full KV lives in pinned CPU memory.
    """

    layer_devices: tuple[str, ...] = ()
    tensor_parallel: tuple[str, ...] = ()
    draft_device: str | None = None
    offloaded: tuple[int, ...] = ()
    mode: str = "single-gpu"

    @classmethod
    def from_plan(cls, plan, cards: Mapping[str, str] | None = None) -> "Placement":
        """`cards` renames the plan's devices (tests map "cuda:0"/"cuda:1" to "cpu", the CPU
        standing in for both cards)."""
        rename = (lambda d: cards.get(d, d)) if cards else (lambda d: d)  # noqa: E731
        offloaded = tuple(i for i, d in enumerate(plan.kv_devices) if d == "cpu") if plan.mode != "cpu" else ()
        draft = rename(plan.draft_device) if plan.draft_device else None
        if plan.mode == "tensor-parallel":
            return cls((), tuple(rename(d) for d in plan.layer_devices[0].split("+")), draft, offloaded, plan.mode)
        return cls(tuple(rename(d) for d in plan.layer_devices), (), draft, offloaded, plan.mode)

    @property
    def first_device(self) -> str:
        return (self.tensor_parallel or self.layer_devices or ("cpu",))[0]

    def build_runner(self, config, state: dict[str, torch.Tensor], dtype: torch.dtype, max_positions: int | None):
        """A LlamaRunner (one card or layer split) or a TensorParallelRunner, weights placed."""
        if self.tensor_parallel:
            from engine.runner_tp import TensorParallelRunner

            return TensorParallelRunner(config, state, self.tensor_parallel, dtype, max_positions)
        from engine.runner import LlamaRunner

        devices = self.layer_devices or None
        return LlamaRunner(config, state, torch.device(self.first_device), dtype, max_positions, devices)


def plan_for_folders(target_folder: Path, draft_folder: Path | None, context_tokens: int | None,
                     settings: DecodeSettings, devices: str = "auto"):
    """The planner's placement for models on disk (config.json only), or None where there is no
    CUDA GPU (everything then simply runs on the CPU). context_tokens None: the model's whole
    context. Raises OutOfMemoryPlanError with the numbers when it cannot fit."""
    if devices == "auto" and not torch.cuda.is_available():
        return None
    if devices == "cpu":
        return None
    import gc
    import json

    if devices == "auto":
        torch.cuda.init()  # torch's own device numbering, so the plan's cuda:i is torch's cuda:i
        gc.collect()  # a model just dropped (the app switching models) gives its memory back
        torch.cuda.empty_cache()  # ... and torch's caching allocator returns it, so NVML counts it free

    from engine.model_shape import ModelShape
    from engine.planner import plan_placement

    def shape(folder: Path) -> ModelShape:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        return ModelShape.from_config(config, name=Path(folder).name)

    target = shape(target_folder)
    draft = shape(draft_folder) if draft_folder is not None else None
    context = context_tokens or target.max_context
    if settings.budget > context:  # a short model: the retrieval budget cannot exceed its context
        settings = settings.replace(budget=max(2 * settings.chunk, context // settings.chunk * settings.chunk))
    return plan_placement(target, draft, context, settings, devices)
