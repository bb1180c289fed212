"""How the engine worker builds a session: the engine's facade (engine.api.Engine), in the steps the
worker needs between them. Tests swap in a scripted stand-in (tests/gui/fakes.py)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from app.job_messages import ModelInfo
from engine.api import MAX_DOCUMENT_BYTES, SNAPSHOT_CACHE_BYTES, Engine, context_options, preview_plan, read_document
from engine.errors import UserError
from engine.events import DocumentText
from engine.settings import DecodeSettings


class EngineBackend:
    """How the worker builds a session: the engine's facade (engine.api.Engine), in the steps the
    worker needs between them (drop the old model after the download, before the weights load).
    Swappable in tests."""

    max_document_bytes = MAX_DOCUMENT_BYTES  # the Settings panel changes both
    snapshot_cap_bytes = SNAPSHOT_CACHE_BYTES
    FIRST_CACHE_TOKENS = 16384  # a GPU session's full cache starts this big and grows with the chat

    def _engine(self, context: int = 0) -> Engine:
        return Engine(snapshot_cap_bytes=self.snapshot_cap_bytes, first_cache_tokens=self.FIRST_CACHE_TOKENS,
                      context=context or None)

    def resolve(self, spec: str, progress: Callable[[str, float | None], None],
                cancel: Callable[[], bool]) -> Any:
        """Find the model's folder: download or convert it if needed (slow, cancellable, no RAM)."""
        return Engine.resolve(spec, progress, cancel)

    def plan_for(self, resolved: Any, draft_resolved: Any, settings: DecodeSettings, context: int = 0) -> Any:
        """On a CUDA machine: the planner's placement for the model's whole context (one card, a
        layer split or tensor parallel), made from config.json before any weight is read. Raises
        OutOfMemoryPlanError, with the numbers, when it cannot fit. None without a GPU.
        context: the window asked for (0: as trained; past it, the YaRN stretch to it)."""
        return self._engine(context).place(resolved, draft_resolved, settings)

    def load(self, resolved: Any, plan: Any = None, draft: bool = False, context: int = 0) -> Any:
        """Load a resolved folder's weights where `plan` puts them (target: its cards; draft: its card),
        the target stretched to `context` tokens when that is past its trained context."""
        return self._engine(context).load_weights(resolved, plan, draft=draft)

    def stretches(self, resolved: Any, draft: str, settings: DecodeSettings) -> tuple[int, tuple[int, ...]]:
        """(trained context, the stretched windows offered for this model that the planner fits on
        this machine), from config files alone."""
        return fitting_stretches(str(getattr(resolved, "path", resolved)), draft, settings)

    def session(self, target: Any, settings: DecodeSettings, draft: Any, plan: Any = None) -> Any:
        """A GpuPlacement starts the KV cache at FIRST_CACHE_TOKENS and lets it grow, offloading
        as the plan for each size says (a short chat keeps every layer on the card)."""
        return self._engine().session(target, settings, draft, plan)

    def read_document(self, path: str, progress: Callable[[int, int], None] | None = None,
                      cancel: Callable[[], bool] | None = None) -> DocumentText:
        """Read a file (a PDF reports its pages and stops between two when `cancel` says so)."""
        return read_document(path, max_bytes=self.max_document_bytes, progress=progress, cancel=cancel)


def fitting_stretches(spec: str, draft: str, settings: DecodeSettings, profile: str = "auto",
                      ram_bytes: int | None = None) -> tuple[int, tuple[int, ...]]:
    """(trained context, the stretched windows engine.api.context_options offers for `spec` whose plan
    on `profile` fits), or (0, ()) when nothing local describes the model."""
    try:
        options = context_options(spec)
    except UserError:
        return 0, ()
    fitting = []
    for window in options.stretched:
        try:
            plan = preview_plan(spec, draft, window, settings, profile, ram_bytes=ram_bytes, stretch=True)
        except UserError:
            break
        if not plan.fits:
            break  # a longer window needs more still
        fitting.append(window)
    return options.trained, tuple(fitting)


def with_context(info: ModelInfo, draft_spec: str, context: int, trained: int, stretches: tuple[int, ...]) -> ModelInfo:
    """`info` with what choosing its context again takes."""
    return dataclasses.replace(info, draft_spec=draft_spec or "ngram", context=int(context or 0),
                               trained_context=int(trained or 0), stretches=tuple(stretches))


def model_info(spec: str, target: Any, draft: Any) -> ModelInfo:
    folder = getattr(target, "folder", None)
    name = getattr(folder, "name", None) or str(spec)
    model_id = getattr(folder, "model_id", None) or name
    source = str(getattr(folder, "source", "") or "")
    draft_name = draft if isinstance(draft, str) else getattr(getattr(draft, "folder", None), "name", "model")
    return ModelInfo(spec=spec, name=str(name), model_id=str(model_id), device=str(getattr(target, "where", None) or getattr(target, "device", "cpu")),
                     max_context=int(getattr(target, "max_context", 0) or 0), draft=str(draft_name), source=source)
