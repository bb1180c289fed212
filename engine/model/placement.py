"""From a planner `Plan` to where the loaded weights run: one card, a layer split, or tensor
parallel across cards, plus the draft model's card and the offloaded KV layers.

The plan is made from config.json alone (engine/offload/planner.py), before any weight is read, so a
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
    cpu_heads: {layer: KV heads attended on the CPU} for hybrid offload (per card share under
    tensor parallel); empty when offloaded layers stream every head.
    """

    layer_devices: tuple[str, ...] = ()
    tensor_parallel: tuple[str, ...] = ()
    draft_device: str | None = None
    offloaded: tuple[int, ...] = ()
    mode: str = "single-gpu"
    cpu_heads: tuple[tuple[int, int], ...] = ()

    @classmethod
    def from_plan(cls, plan, cards: Mapping[str, str] | None = None) -> "Placement":
        """`cards` renames the plan's devices (tests map "cuda:0"/"cuda:1" to "cpu", the CPU
        standing in for both cards)."""
        rename = (lambda d: cards.get(d, d)) if cards else (lambda d: d)  # noqa: E731
        offloaded = tuple(i for i, d in enumerate(plan.kv_devices) if d == "cpu") if plan.mode != "cpu" else ()
        from engine.kv.offload import hybrid_split

        draft = rename(plan.draft_device) if plan.draft_device else None
        split = tuple(sorted(hybrid_split(plan).items())) if offloaded else ()
        if plan.mode == "tensor-parallel":
            return cls((), tuple(rename(d) for d in plan.layer_devices[0].split("+")), draft, offloaded, plan.mode, split)
        return cls(tuple(rename(d) for d in plan.layer_devices), (), draft, offloaded, plan.mode, split)

    def cache_options(self) -> dict:
        """new_full_cache options for this placement's hybrid split ({} when there is none)."""
        return {"cpu_heads": dict(self.cpu_heads)} if self.cpu_heads else {}

    @property
    def first_device(self) -> str:
        return (self.tensor_parallel or self.layer_devices or ("cpu",))[0]

    def build_runner(self, config, state: dict[str, torch.Tensor], dtype: torch.dtype, max_positions: int | None):
        """A LlamaRunner (one card or layer split) or a TensorParallelRunner, weights placed."""
        if self.tensor_parallel:
            from engine.model.runner_tp import TensorParallelRunner

            return TensorParallelRunner(config, state, self.tensor_parallel, dtype, max_positions)
        from engine.model.runner import LlamaRunner

        devices = self.layer_devices or None
        return LlamaRunner(config, state, torch.device(self.first_device), dtype, max_positions, devices)


@dataclass
class GpuPlacement:
    """A model's plan on this machine, kept with what it was made from, so the KV cache can be
    re-planned for another size with the weights where they are (`plan_placement(same_as=)`).

    plan: made for the model's whole context (the weights' placement must hold it all).
    `cache_factory()` gives ChatSession a `(runner, size) -> full cache` that offloads what the
    plan for `size` tokens offloads: a 16K-token chat on one 4090 keeps every layer on the card,
    a 128K-token book streams most of them."""

    plan: object  # engine.offload.planner.Plan
    target: object  # engine.offload.shapes.ModelShape
    draft: object | None
    settings: DecodeSettings
    spec: object  # engine.offload.planner.DeviceSpec, free memory as it was before the weights loaded
    headroom_bytes: int | None = None  # per GPU; None: the planner's default

    def plan_for(self, context_tokens: int):
        from engine.offload.planner import plan_placement

        return plan_placement(self.target, self.draft, context_tokens, self.settings, self.spec, same_as=self.plan,
                              **self._headroom())

    def _headroom(self) -> dict:
        return {} if self.headroom_bytes is None else {"headroom_bytes": self.headroom_bytes}

    def offloaded_for(self, context_tokens: int) -> list[int]:
        plan = self.plan_for(context_tokens)
        return [i for i, d in enumerate(plan.kv_devices) if d == "cpu"]

    def cache_factory(self):
        """`(runner, size) -> full cache`: the plan for `size` tokens' offloaded layers, split with
        the CPU where that plan chose hybrid offload (it is faster there)."""
        from engine.kv.offload import cache_factory_for_plan

        def factory(runner, size: int):
            return cache_factory_for_plan(self.plan_for(size))(runner, size)
        return factory


def plan_for_folders(target_folder: Path, draft_folder: Path | None, context_tokens: int | None,
                     settings: DecodeSettings, devices: str = "auto"):
    """The planner's plan for models on disk (config.json only), or None where there is no CUDA
    GPU (everything then simply runs on the CPU). context_tokens None: the model's whole
    context. Raises OutOfMemoryPlanError with the numbers when it cannot fit."""
    placement = placement_for_folders(target_folder, draft_folder, context_tokens, settings, devices)
    return placement.plan if placement is not None else None


def placement_for_folders(target_folder: Path, draft_folder: Path | None, context_tokens: int | None,
                          settings: DecodeSettings, devices: str = "auto", stretch=None) -> GpuPlacement | None:
    """Like plan_for_folders, keeping what the plan was made from (see GpuPlacement). stretch: the
    target's window past its trained context (engine/model/stretch.py), so its KV is planned too."""
    if devices == "cpu" or (devices == "auto" and not torch.cuda.is_available()):
        return None
    import gc
    import json

    if devices == "auto":
        torch.cuda.init()  # torch's own device numbering, so the plan's cuda:i is torch's cuda:i
        gc.collect()  # a model just dropped (the app switching models) gives its memory back
        torch.cuda.empty_cache()  # ... and torch's caching allocator returns it, so NVML counts it free

    from engine.offload.shapes import ModelShape

    from engine.model.stretch import Stretch, stretched_dict

    def shape(folder: Path, stretch=None) -> ModelShape:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        if stretch is not None:
            config = stretched_dict(config, stretch.window, stretch.scale, name=Path(folder).name)
        return ModelShape.from_config(config, name=Path(folder).name)

    return placement_for_shapes(shape(target_folder, Stretch.of(stretch)), shape(draft_folder) if draft_folder is not None else None,
                                context_tokens, settings, devices)


def placement_for_shapes(target, draft, context_tokens: int | None, settings: DecodeSettings,
                         devices="auto", headroom_bytes: int | None = None) -> GpuPlacement:
    """Plan `target` (+ `draft`) for `context_tokens` (None: its whole context) on `devices`
    (a profile name or a planner DeviceSpec)."""
    from engine.offload.planner import device_spec, plan_placement

    context = context_tokens or target.max_context
    settings = settings.fit_budget(context)
    spec = device_spec(devices) if isinstance(devices, str) else devices
    placement = GpuPlacement(None, target, draft, settings, spec, headroom_bytes)
    placement.plan = plan_placement(target, draft, context, settings, spec, **placement._headroom())
    return placement
