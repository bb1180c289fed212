"""The one engine worker: a QObject on its own QThread that owns the model and the session.

Commands come in as queued signals from `EngineController` (GUI thread); results go out as
`Signal(object)` carrying the engine's frozen dataclasses. Two things are called directly
from the GUI thread because the worker thread is busy inside a generation loop when they
matter: `cancel()` (sets the job's own cancel token, which the session checks between steps) and
`apply_settings()` (`ChatSession.update_settings()` only validates and queues the settings; the
engine thread applies them between two steps, so no drafter or buffer is ever built on the GUI
thread).
No widget is ever touched here.
"""
from __future__ import annotations

import logging
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.engine_backend import EngineBackend, model_info, with_context
from app.job_messages import (Conversation, DocumentReady, JobFailed, LoadProgress,  # noqa: F401 (re-exported)
                              ModelInfo, TokenBatch)
from app.passages_fit import PASSAGES, fit_for_stream, prefill_documents, with_fit
from engine.api import Cancelled
from engine.errors import ReadCancelled, UserError
from engine.events import DocumentText, Finished, FinishReason, Metrics, PrefillProgress, ReadProgress, TokenText
from engine.settings import DecodeSettings

log = logging.getLogger(__name__)

TOKEN_INTERVAL_S = 0.05  # coalesce answer text: at most ~20 GUI updates a second
METRICS_INTERVAL_S = 0.1  # panels: at most ~10 Hz
PROGRESS_INTERVAL_S = 0.1


# ----------------------------------------------------------------------------- worker

class EngineWorker(QObject):
    """Lives on the engine thread. Slots run there; signals are delivered queued to the GUI."""

    modelLoading = Signal(object)  # LoadProgress
    modelLoaded = Signal(int, object)  # job, ModelInfo
    modelUnloaded = Signal(int)  # job: the previous model was dropped to make room for the new one
    documentReady = Signal(object)  # DocumentReady
    engineEvent = Signal(int, object)  # job, PrefillProgress | TokenBatch | Metrics | Finished
    failed = Signal(object)  # JobFailed
    jobStarted = Signal(int, str)  # job, kind
    jobDone = Signal(int)

    def __init__(self, backend: EngineBackend | None = None, settings: DecodeSettings | None = None) -> None:
        super().__init__()
        self._backend = backend or EngineBackend()
        self._lock = threading.Lock()
        self._session: Any = None
        self._target: Any = None
        self._settings = settings or DecodeSettings()
        self._active_job = 0
        self._tokens: dict[int, threading.Event] = {}  # job -> its cancel token (made by whoever comes first)
        self._load_cancel = threading.Event()
        self._passage_paths: set[str] = set()  # files the user chose to have answered from their passages

    # --- called directly from the GUI thread (thread-safe) -------------------------------

    def fit_as_passages(self, paths: Sequence[str]) -> None:
        """The next ingest of these files marks them "passages" (the overflow dialog's third way out)."""
        self._passage_paths.update(paths)

    def cancel(self, job: int | None = None) -> None:
        """Stop `job` (default: whatever runs now). Honoured within one engine step; a job stopped
        before it started never starts (its token is already set when the session gets it)."""
        with self._lock:
            job = self._active_job if job is None else job
            if job:
                self._token_locked(job).set()

    def cancel_load(self) -> None:
        self._load_cancel.set()

    def set_limits(self, max_document_bytes: int, snapshot_cap_bytes: int) -> None:
        self._backend.max_document_bytes = int(max_document_bytes)
        self._backend.snapshot_cap_bytes = int(snapshot_cap_bytes)
        with self._lock:
            session = self._session
        store = getattr(session, "snapshots", None)
        if store is not None and hasattr(store, "max_bytes"):
            store.max_bytes = int(snapshot_cap_bytes)

    def apply_settings(self, settings: DecodeSettings) -> None:
        """Hand new settings to the session; it validates them and uses them at the next step.

        Raises InvalidSettingError (a UserError) when the combination is invalid.
        """
        with self._lock:
            session = self._session
            if session is None:
                settings.validate()
                self._settings = settings
                return
        session.update_settings(settings)
        with self._lock:
            self._settings = settings

    def session(self) -> Any:
        """The live session (tests read its settings/metrics); None before a model is loaded."""
        with self._lock:
            return self._session

    # --- slots (engine thread) -----------------------------------------------------------

    @Slot(int, str, str, int)
    def load_model(self, job: int, spec: str, draft_spec: str, context: int = 0) -> None:
        """Load `spec` with `draft_spec` as L0; `context` past the model's trained context stretches
        it to that window (YaRN; 0: as trained)."""
        self.jobStarted.emit(job, "load")
        self._begin(job)
        self._load_cancel.clear()
        last = [0.0]

        def progress(stage: str, fraction: float | None) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL_S or (fraction is not None and fraction >= 1.0):
                last[0] = now
                self.modelLoading.emit(LoadProgress(job, stage, fraction))

        cancel = lambda: self._load_cancel.is_set() or self._is_cancelled(job)  # noqa: E731
        try:
            # download/convert first: the current model keeps working until the weights load
            folder = self._backend.resolve(spec, progress, cancel)
            draft_folder = None
            if draft_spec and draft_spec not in ("ngram", "none"):
                draft_folder = self._backend.resolve(draft_spec, progress, cancel)
            with self._lock:  # then drop the old model: two models may not fit in memory
                had_model, self._session, self._target = self._session is not None, None, None
            if had_model:
                self.modelUnloaded.emit(job)
            stretch = {"context": context} if context else {}  # a backend without stretches loads as trained
            plan = self._backend.plan_for(folder, draft_folder, self._settings, **stretch)  # before any weight loads
            progress(f"Loading {spec}" + (f" stretched to {context:,} tokens" if context else ""), None)
            target = self._backend.load(folder, plan, **stretch)
            draft: Any = draft_spec or "ngram"
            if draft_folder is not None:
                progress(f"Loading draft model {draft_spec}", None)
                draft = self._backend.load(draft_folder, plan, draft=True)
            session = self._backend.session(target, self._settings_for(target), draft, plan)
            with self._lock:
                self._target, self._session = target, session
                self._settings = session.settings
            draft_for_plan = str(getattr(draft_folder, "path", draft_folder)) if draft_folder is not None else "ngram"
            trained, stretches = self._backend.stretches(folder, draft_for_plan, session.settings)
            info = with_context(model_info(spec, target, draft), draft_spec, context, trained, stretches)
            self.modelLoaded.emit(job, info)
        except BaseException as exc:  # noqa: BLE001 - reported, never swallowed
            self._report(job, "load", exc)
        finally:
            self._end(job)

    @Slot(int, object, object)
    def ingest(self, job: int, paths: Sequence[str], conversation: Conversation) -> None:
        """Read documents, count them, check they fit, then prefill the conversation with them.

        A file that cannot be read is reported (JobFailed with its path) and skipped; if the
        rest do not fit, none is added (JobFailed with ContextOverflowError, no path).
        """
        self.jobStarted.emit(job, "ingest")
        self._begin(job)
        try:
            session = self._require_session()
            ready: list[DocumentReady] = []
            for path in paths:
                if self._is_cancelled(job):
                    break
                try:
                    document = self._backend.read_document(path, self._page_progress(job, path),
                                                           lambda: self._is_cancelled(job))
                    document = with_fit(document, PASSAGES) if path in self._passage_paths else document
                    ready.append(DocumentReady(job, path, document, int(session.count_tokens(document.text))))
                except ReadCancelled:
                    break
                except BaseException as exc:  # noqa: BLE001 - one bad file does not stop the others
                    self._report(job, "ingest", exc, path=path)
            if self._is_cancelled(job):
                self.engineEvent.emit(job, Finished(FinishReason.CANCELLED, ""))
                return
            if not ready:
                return
            documents = prefill_documents(list(conversation.documents) + [r.document for r in ready])
            if not (empty := not documents and not conversation.messages):  # only passages: nothing to read yet
                session.check_fits(list(conversation.messages), documents, conversation.system)
            for r in ready:
                self.documentReady.emit(r)
            self._run_events(job, session, iter([Finished(FinishReason.STOP, "")]) if empty else session.prefill(
                list(conversation.messages), documents, conversation.system, cancel=self._token(job)))
        except BaseException as exc:  # noqa: BLE001
            self._report(job, "ingest", exc)
        finally:
            self._end(job)

    @Slot(int, object)
    def prefill(self, job: int, conversation: Conversation) -> None:
        self.jobStarted.emit(job, "prefill")
        self._begin(job)
        try:
            session = self._require_session()
            self._run_events(job, session, session.prefill(list(conversation.messages), list(conversation.documents),
                                                  conversation.system, cancel=self._token(job)))
        except BaseException as exc:  # noqa: BLE001
            self._report(job, "prefill", exc)
        finally:
            self._end(job)

    @Slot(int, object)
    def stream(self, job: int, conversation: Conversation) -> None:
        self.jobStarted.emit(job, "stream")
        self._begin(job)
        try:
            session = self._require_session()
            documents, used = fit_for_stream(session, conversation.messages, conversation.documents, conversation.system)
            if used is not None:  # the passages this answer is given, before its first token
                self.engineEvent.emit(job, used)
            self._run_events(job, session, session.stream(list(conversation.messages), documents,
                                                 conversation.system, cancel=self._token(job)))
        except BaseException as exc:  # noqa: BLE001
            self._report(job, "stream", exc)
        finally:
            self._end(job)

    @Slot(int, object)
    def count_documents(self, job: int, documents: Sequence[DocumentText]) -> None:
        """Token counts for chips of a reopened chat: emits DocumentReady (path "") per document."""
        try:
            session = self._require_session()
            for doc in documents:
                self.documentReady.emit(DocumentReady(job, "", doc, int(session.count_tokens(doc.text))))
        except BaseException as exc:  # noqa: BLE001
            self._report(job, "count", exc)

    # --- internals -----------------------------------------------------------------------

    def _settings_for(self, target: Any) -> DecodeSettings:
        """Clamp the wanted settings to this model's context so the session accepts them."""
        settings = self._settings
        context = int(getattr(target, "max_context", 0) or 0)
        if context:
            settings = settings.fit_budget(context)
        return settings

    def _require_session(self) -> Any:
        with self._lock:
            session = self._session
        if session is None:
            raise UserError("No model is loaded yet: pick one with Model… (or wait for the bundled model to load).")
        return session

    def _begin(self, job: int) -> None:
        with self._lock:
            self._active_job = job

    def _end(self, job: int) -> None:
        with self._lock:
            if self._active_job == job:
                self._active_job = 0
            self._tokens.pop(job, None)
        self.jobDone.emit(job)

    def _page_progress(self, job: int, path: str) -> Callable[[int, int], None]:
        """Pages read of a long PDF, at most every PROGRESS_INTERVAL_S (and the last page)."""
        name, last = Path(path).name, [0.0]

        def report(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL_S or done >= total:
                last[0] = now
                self.engineEvent.emit(job, ReadProgress(name, done, total))
        return report

    def _token_locked(self, job: int) -> threading.Event:
        token = self._tokens.get(job)
        if token is None:
            token = self._tokens[job] = threading.Event()
        return token

    def _token(self, job: int) -> threading.Event:
        """`job`'s cancel token, handed to the session so a stop reaches exactly that job."""
        with self._lock:
            return self._token_locked(job)

    def _is_cancelled(self, job: int) -> bool:
        return self._token(job).is_set()

    def _run_events(self, job: int, session: Any, events: Iterator[Any]) -> None:
        """Forward engine events, coalescing token text and throttling metrics/progress."""
        pending: list[TokenText] = []
        last_tokens = last_metrics = last_progress = 0.0
        held: dict[type, Any] = {}  # newest throttled Metrics / PrefillProgress not yet sent

        def flush_tokens() -> None:
            if pending:
                self.engineEvent.emit(job, TokenBatch(tuple(_merge_tokens(pending))))
                pending.clear()

        if self._is_cancelled(job):  # stopped while queued: never start it
            self.engineEvent.emit(job, Finished(FinishReason.CANCELLED, ""))
            return
        for event in events:
            now = time.monotonic()
            if isinstance(event, TokenText):
                pending.append(event)
                if now - last_tokens >= TOKEN_INTERVAL_S:
                    flush_tokens()
                    last_tokens = now
            elif isinstance(event, Metrics):
                held[Metrics] = event
                if now - last_metrics >= METRICS_INTERVAL_S:
                    flush_tokens()  # keep text and numbers in step
                    self.engineEvent.emit(job, held.pop(Metrics))
                    last_metrics = now
            elif isinstance(event, PrefillProgress):
                held[PrefillProgress] = event
                if now - last_progress >= PROGRESS_INTERVAL_S or event.done >= event.total:
                    self.engineEvent.emit(job, held.pop(PrefillProgress))
                    last_progress = now
            elif isinstance(event, Finished):
                flush_tokens()
                for kind in (PrefillProgress, Metrics):
                    if kind in held:
                        self.engineEvent.emit(job, held.pop(kind))
                self.engineEvent.emit(job, event)
                return
            else:
                self.engineEvent.emit(job, event)
        # the generator ended without Finished: still close the job for the GUI
        flush_tokens()
        self.engineEvent.emit(job, Finished(FinishReason.ERROR, "", "The engine stopped without finishing."))

    def _report(self, job: int, kind: str, exc: BaseException, path: str = "") -> None:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise exc
        cancelled = isinstance(exc, Cancelled)
        user = isinstance(exc, UserError) or cancelled
        details = "" if user else traceback.format_exc()
        if not user:
            log.error("engine %s job %d failed\n%s", kind, job, details)
        message = str(exc) or exc.__class__.__name__
        if not user:
            message = f"Unexpected error ({exc.__class__.__name__}): {message}"
        self.failed.emit(JobFailed(job, kind, message, user, details, exc, path))


def _merge_tokens(tokens: Sequence[TokenText]) -> list[TokenText]:
    """Merge adjacent pieces produced by the same level into one TokenText."""
    merged: list[TokenText] = []
    for tok in tokens:
        if merged and merged[-1].level == tok.level:
            last = merged[-1]
            merged[-1] = TokenText(last.text + tok.text, last.token_ids + tuple(tok.token_ids), tok.level)
        else:
            merged.append(TokenText(tok.text, tuple(tok.token_ids), tok.level))
    return merged


# ----------------------------------------------------------------------------- controller

class EngineController(QObject):
    """GUI-side handle: owns the engine thread, numbers jobs, forwards the worker's signals."""

    _loadRequested = Signal(int, str, str, int)
    _ingestRequested = Signal(int, object, object)
    _prefillRequested = Signal(int, object)
    _streamRequested = Signal(int, object)
    _countRequested = Signal(int, object)

    def __init__(self, backend: EngineBackend | None = None, settings: DecodeSettings | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._next_job = 0
        self.thread = QThread()
        self.thread.setObjectName("triforce-engine")
        self.worker = EngineWorker(backend, settings)
        self.worker.moveToThread(self.thread)
        self.thread.finished.connect(self.worker.deleteLater)
        self._loadRequested.connect(self.worker.load_model)
        self._ingestRequested.connect(self.worker.ingest)
        self._prefillRequested.connect(self.worker.prefill)
        self._streamRequested.connect(self.worker.stream)
        self._countRequested.connect(self.worker.count_documents)
        # the worker's signals are the public ones (queued into the GUI thread)
        self.modelLoading = self.worker.modelLoading
        self.modelLoaded = self.worker.modelLoaded
        self.modelUnloaded = self.worker.modelUnloaded
        self.documentReady = self.worker.documentReady
        self.engineEvent = self.worker.engineEvent
        self.failed = self.worker.failed
        self.jobStarted = self.worker.jobStarted
        self.jobDone = self.worker.jobDone
        self.thread.start()

    def _job(self) -> int:
        self._next_job += 1
        return self._next_job

    def load(self, spec: str, draft: str = "ngram", context: int = 0) -> int:
        """Load a model; `context` > its trained context stretches it to that window (0: as trained)."""
        job = self._job()
        self._loadRequested.emit(job, spec, draft or "ngram", int(context or 0))
        return job

    def ingest(self, paths: Sequence[str], conversation: Conversation) -> int:
        job = self._job()
        self._ingestRequested.emit(job, tuple(paths), conversation)
        return job

    def prefill(self, conversation: Conversation) -> int:
        job = self._job()
        self._prefillRequested.emit(job, conversation)
        return job

    def stream(self, conversation: Conversation) -> int:
        job = self._job()
        self._streamRequested.emit(job, conversation)
        return job

    def count(self, documents: Sequence[DocumentText]) -> int:
        job = self._job()
        self._countRequested.emit(job, tuple(documents))
        return job

    def cancel(self, job: int | None = None) -> None:
        self.worker.cancel(job)

    def fit_as_passages(self, paths: Sequence[str]) -> None:
        self.worker.fit_as_passages(paths)

    def set_limits(self, max_document_bytes: int, snapshot_cap_bytes: int) -> None:
        """Largest document the app reads, and the disk kept for prefilled books (evicts at once)."""
        self.worker.set_limits(max_document_bytes, snapshot_cap_bytes)

    def cancel_load(self) -> None:
        self.worker.cancel_load()

    def apply_settings(self, settings: DecodeSettings) -> None:
        self.worker.apply_settings(settings)

    def session(self) -> Any:
        return self.worker.session()

    def shutdown(self, timeout_ms: int = 30000) -> bool:
        """Stop whatever runs, then quit() and wait() for the engine thread; False if it is still
        inside a step that cannot stop (e.g. loading weights) after `timeout_ms`."""
        if not self.thread.isRunning():
            return True
        self.worker.cancel()
        self.worker.cancel_load()
        self.thread.quit()
        if not self.thread.wait(timeout_ms):
            log.warning("engine thread did not stop within %d ms", timeout_ms)
            return False
        return True
