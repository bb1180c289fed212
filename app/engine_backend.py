"""How the engine worker builds a session: the engine's facade (engine.api.Engine), in the steps the
worker needs between them. Tests swap in a scripted stand-in (tests/gui/fakes.py)."""
from __future__ import annotations

from typing import Any, Callable

from app.job_messages import ModelInfo
from engine.api import MAX_DOCUMENT_BYTES, SNAPSHOT_CACHE_BYTES, Engine, read_document
from engine.events import DocumentText
from engine.settings import DecodeSettings


class EngineBackend:
    """How the worker builds a session: the engine's facade (engine.api.Engine), in the steps the
    worker needs between them (drop the old model after the download, before the weights load).
    Swappable in tests."""

    max_document_bytes = MAX_DOCUMENT_BYTES  # the Settings panel changes both
    snapshot_cap_bytes = SNAPSHOT_CACHE_BYTES
    FIRST_CACHE_TOKENS = 16384  # a GPU session's full cache starts this big and grows with the chat

    def _engine(self) -> Engine:
        return Engine(snapshot_cap_bytes=self.snapshot_cap_bytes, first_cache_tokens=self.FIRST_CACHE_TOKENS)

    def resolve(self, spec: str, progress: Callable[[str, float | None], None],
                cancel: Callable[[], bool]) -> Any:
        """Find the model's folder: download or convert it if needed (slow, cancellable, no RAM)."""
        return Engine.resolve(spec, progress, cancel)

    def plan_for(self, resolved: Any, draft_resolved: Any, settings: DecodeSettings) -> Any:
        """On a CUDA machine: the planner's placement for the model's whole context (one card, a
        layer split or tensor parallel), made from config.json before any weight is read. Raises
        OutOfMemoryPlanError, with the numbers, when it cannot fit. None without a GPU."""
        return self._engine().place(resolved, draft_resolved, settings)

    def load(self, resolved: Any, plan: Any = None, draft: bool = False) -> Any:
        """Load a resolved folder's weights where `plan` puts them (target: its cards; draft: its card)."""
        return self._engine().load_weights(resolved, plan, draft=draft)

    def session(self, target: Any, settings: DecodeSettings, draft: Any, plan: Any = None) -> Any:
        """A GpuPlacement starts the KV cache at FIRST_CACHE_TOKENS and lets it grow, offloading
        as the plan for each size says (a short chat keeps every layer on the card)."""
        return self._engine().session(target, settings, draft, plan)

    def read_document(self, path: str, progress: Callable[[int, int], None] | None = None,
                      cancel: Callable[[], bool] | None = None) -> DocumentText:
        """Read a file (a PDF reports its pages and stops between two when `cancel` says so)."""
        return read_document(path, max_bytes=self.max_document_bytes, progress=progress, cancel=cancel)


def model_info(spec: str, target: Any, draft: Any) -> ModelInfo:
    folder = getattr(target, "folder", None)
    name = getattr(folder, "name", None) or str(spec)
    model_id = getattr(folder, "model_id", None) or name
    source = str(getattr(folder, "source", "") or "")
    draft_name = draft if isinstance(draft, str) else getattr(getattr(draft, "folder", None), "name", "model")
    return ModelInfo(spec=spec, name=str(name), model_id=str(model_id), device=str(getattr(target, "where", None) or getattr(target, "device", "cpu")),
                     max_context=int(getattr(target, "max_context", 0) or 0), draft=str(draft_name), source=source)
