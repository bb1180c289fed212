"""Carries the engine thread's signals to the Qt-free controller, on the GUI thread.

A signal connected to a bound method of a QObject is queued into that object's thread; one
connected to a plain object's method would run on the engine thread. This QObject lives on
the GUI thread and forwards each signal to the controller there.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject


class EngineRelay(QObject):
    """Connects `engine` (an app.worker.EngineController) to `controller` (app.chat_controller)."""

    def __init__(self, engine: Any, controller: Any, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        engine.modelLoading.connect(self._model_loading)
        engine.modelLoaded.connect(self._model_loaded)
        engine.modelUnloaded.connect(self._model_unloaded)
        engine.documentReady.connect(self._document_ready)
        engine.engineEvent.connect(self._engine_event)
        engine.failed.connect(self._failed)
        engine.jobDone.connect(self._job_done)

    def _model_loading(self, progress: Any) -> None:
        self.controller.on_model_loading(progress)

    def _model_loaded(self, job: int, info: Any) -> None:
        self.controller.on_model_loaded(job, info)

    def _model_unloaded(self, job: int) -> None:
        self.controller.on_model_unloaded(job)

    def _document_ready(self, ev: Any) -> None:
        self.controller.on_document_ready(ev)

    def _engine_event(self, job: int, ev: Any) -> None:
        self.controller.on_engine_event(job, ev)

    def _failed(self, failure: Any) -> None:
        self.controller.on_failed(failure)

    def _job_done(self, job: int) -> None:
        self.controller.on_job_done(job)
