"""The main window: chats on the left, the conversation in the middle, live panels on the right.

`run_app()` is the GUI entry point (pyproject's gui-script and `main.py` with no arguments).
The window owns one `EngineController` (the engine thread) and the chat store; everything
here runs on the GUI thread.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QMainWindow, QMessageBox

from app import theme
from app.answer_recorder import AnswerRecorder
from app.chat_documents import ChatDocuments, Ingest
from app.chat_list import ChatEntry
from app.chat_repo import ChatRepo, segments_from_spans, to_chat_messages
from app.icons import app_icon
from app.panels.common import fmt_seconds
from app.settings_panel import DEFAULT_DOCUMENT_MIB, DEFAULT_SNAPSHOT_GIB, settings_from_dict, settings_to_dict
from app.window_layout import build_window_layout
from app.worker import (Conversation, DocumentReady, EngineBackend, EngineController, JobFailed, LoadProgress,
                        ModelInfo, TokenBatch)
from engine.errors import ContextOverflowError, UserError
from engine.events import ChatMessage, Finished, FinishReason, Metrics, PrefillProgress, ReadProgress
from engine.settings import DecodeSettings

log = logging.getLogger(__name__)

SHOW_PREFILL_MIN_TOKENS = 192  # shorter prompt prefills are too quick to deserve a progress strip
ORG, APP = "TriForceChat", "TriForce Chat"


def app_settings() -> QSettings:
    """Global preferences, next to the app's data (so TRIFORCE_HOME isolates tests too)."""
    from engine.store.paths import app_home
    return QSettings(str(app_home() / "app-settings.ini"), QSettings.Format.IniFormat)


class MainWindow(QMainWindow):
    """One chat window. `model_spec` loads at start (None: load nothing until the user picks)."""

    modelReady = Signal(object)  # ModelInfo (tests wait on it)
    answerFinished = Signal(object)  # Finished
    prefillFinished = Signal(object)  # Finished of a document's prefill
    documentAdded = Signal(object)  # AttachedDocument
    errorShown = Signal(str)

    def __init__(self, model_spec: str | None = "bundled", *, draft_spec: str = "ngram",
                 repo: ChatRepo | None = None, backend: EngineBackend | None = None,
                 settings: QSettings | None = None, sample_memory: bool = True) -> None:
        super().__init__()
        self.setWindowTitle("TriForce Chat")
        self.setWindowIcon(app_icon())
        self.setAcceptDrops(True)
        self.resize(1440, 900)
        self.colors = theme.colors()
        self.prefs = settings or app_settings()
        self.repo = repo or ChatRepo()
        initial = settings_from_dict(self.prefs.value("decode/settings", "", type=str), DecodeSettings())
        self.engine = EngineController(backend, initial, parent=self)
        self.model: ModelInfo | None = None
        self.chat_id: int | None = None
        self.messages: list[ChatMessage] = []
        self._search = ""
        self._jobs: dict[int, str] = {}  # running/queued job -> kind
        self._ingests: dict[int, Ingest] = {}  # ingest job -> what it read, for which chat
        self._queued_paths: list[str] = []  # dropped while another ingest runs
        self._stream_job = 0
        self._load_job = 0
        self._count_job = 0
        self._answer: AnswerRecorder | None = None  # the streaming answer (its chat may not be shown)
        self._prefill_job_shown = 0
        self._closing = False
        build_window_layout(self, initial)
        self.documents = ChatDocuments(self.repo, self.chips)
        self._restore_geometry()
        self._wire()
        self._refresh_chats()
        self.memory.start(enabled=sample_memory)
        if model_spec:
            self.load_model(model_spec, draft_spec)
        else:
            self._set_model_status("No model loaded — choose one with Model…")

    # ----------------------------------------------------------------------------- layout

    def _wire(self) -> None:
        e = self.engine
        e.modelLoading.connect(self._on_model_loading)
        e.modelLoaded.connect(self._on_model_loaded)
        e.modelUnloaded.connect(self._on_model_unloaded)
        e.documentReady.connect(self._on_document_ready)
        e.engineEvent.connect(self._on_engine_event)
        e.failed.connect(self._on_failed)
        e.jobDone.connect(self._on_job_done)
        cl = self.chat_list
        cl.newRequested.connect(self.new_chat)
        cl.chatSelected.connect(self.open_chat)
        cl.renameRequested.connect(self._on_rename)
        cl.deleteRequested.connect(self._on_delete)
        cl.exportRequested.connect(self._on_export)
        cl.searchChanged.connect(self._on_search)
        self.composer.sendRequested.connect(self.send)
        self.composer.stopRequested.connect(self.stop)
        self.composer.attachRequested.connect(self.attach_dialog)
        self.prefill_strip.cancelRequested.connect(self.stop)
        self.chips.removeRequested.connect(self._on_remove_document)
        self.chat_view.regenerateRequested.connect(self.regenerate)
        self.chat_view.editRequested.connect(self.edit_question)
        self.settings_panel.settingsChanged.connect(self._on_settings_changed)
        self.settings_panel.colorLevelsChanged.connect(self.chat_view.set_color_levels)
        self.settings_panel.systemPromptChanged.connect(self._on_system_prompt)
        self.settings_panel.limitsChanged.connect(self._on_limits)
        self.settings_panel.set_limits(self.prefs.value("limits/max_document_mib", DEFAULT_DOCUMENT_MIB, type=int),
                                       self.prefs.value("limits/snapshot_cache_gib", DEFAULT_SNAPSHOT_GIB, type=int))
        self._on_limits(*self.settings_panel.limits(), save=False)
        self.model_button.clicked.connect(self.choose_model)
        self.load_cancel.clicked.connect(self.engine.cancel_load)
        app = QApplication.instance()
        if app is not None:
            app.styleHints().colorSchemeChanged.connect(self._on_color_scheme)  # bound: dropped with the window

    # ----------------------------------------------------------------------------- public actions

    def load_model(self, spec: str, draft: str = "ngram") -> None:
        """Load `spec` off the GUI thread (progress in the status bar). The current model keeps
        answering while the new one downloads; it goes when the new weights load."""
        self._load_job = self.engine.load(spec, draft)
        self._jobs[self._load_job] = "load"
        self._set_model_status(f"Loading {spec}…")
        self.load_bar.setRange(0, 0)
        self.load_bar.show()
        self.load_cancel.show()
        self.model_button.setEnabled(False)

    def new_chat(self) -> None:
        """An empty chat; it is created in the store with its first message or document."""
        self._leave_chat()
        self.chat_id = None
        self.messages = []
        self.documents.clear()
        self.chat_view.clear()
        self.title_label.setText("New chat")
        self.chat_list.select(None)
        self._update_context_label()
        self.composer.edit.setFocus()

    def open_chat(self, chat_id: int) -> None:
        if chat_id == self.chat_id:
            return
        self._leave_chat()
        self.chat_id = chat_id
        stored = self.repo.messages(chat_id)
        self.messages = to_chat_messages(stored)
        self.chat_view.clear()
        for m in stored:
            if m.role in ("user", "assistant"):
                self.chat_view.add_message(m.role, m.text, str(m.stats.get("footer", "")), store_index=m.idx,
                                           segments=segments_from_spans(m.text, m.level_spans))
        self.documents.load(chat_id, self._model_id())
        self._count_uncounted()
        self.title_label.setText(self.repo.title(chat_id))
        saved = self.repo.get_settings(chat_id)
        if saved:
            settings = settings_from_dict(saved.get("decode", {}), self.settings_panel.settings())
            self.settings_panel.set_settings(settings)
            self.settings_panel.set_system_prompt(saved.get("system", ""))
            self._apply_settings(self.settings_panel.settings(), persist_chat=False)
        self.chat_list.select(chat_id)
        self._update_context_label()

    def send(self, text: str) -> None:
        """Save the question, show it, and stream the answer."""
        text = text.strip()
        if not text or self._stream_job:
            return
        self.settings_panel.flush()
        chat_id = self._ensure_chat(text)
        index = self.repo.add_message(chat_id, "user", text)  # saved before it is sent (crash-safe)
        self.documents.save_pending(chat_id, self._model_id())  # the question relies on them
        self.messages.append(ChatMessage("user", text))
        self.chat_view.add_message("user", text, store_index=index)
        self._start_stream(chat_id)
        self._refresh_chats()

    def regenerate(self) -> None:
        """Drop the last answer and ask again (the engine reuses the cached prefix)."""
        if self._stream_job or not self.messages or self.messages[-1].role != "assistant" or self.chat_id is None:
            return
        stored = self.repo.messages(self.chat_id)
        last = next((m for m in reversed(stored) if m.role == "assistant"), None)
        if last is not None:
            self.repo.delete_messages_from(self.chat_id, last.idx)
        self.messages.pop()
        self.chat_view.remove_last("assistant")
        self._start_stream(self.chat_id)

    def edit_question(self, position: int, text: str | None = None) -> None:
        """Ask the question at `position` (among the chat's messages) differently: the messages
        from it on are replaced, in the store too, and the new question is answered. The engine
        keeps the cached prefix up to that point (documents included). `text` None asks for it
        in a dialog; Cancel changes nothing."""
        if self._stream_job or self.chat_id is None or not 0 <= position < len(self.messages):
            return
        if self.messages[position].role != "user":
            return
        if text is None:
            text, ok = QInputDialog.getMultiLineText(self, "Edit question", "Ask instead:",
                                                     self.messages[position].content)
            if not ok:
                return
        if not text.strip():
            return
        stored = [m for m in self.repo.messages(self.chat_id) if m.role in ("user", "assistant")]
        if position < len(stored):
            self.repo.delete_messages_from(self.chat_id, stored[position].idx)
        del self.messages[position:]
        self.chat_view.truncate(position)
        self.send(text)

    def stop(self) -> None:
        """Esc / Stop / Cancel: stop the running answer or prefill (the engine honours it within a step)."""
        for job, kind in list(self._jobs.items()):
            if kind in ("stream", "ingest", "prefill"):
                self.engine.cancel(job)
        self.prefill_strip.cancel.setEnabled(False)

    def attach_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Attach documents", str(Path.home()),
            "Documents (*.txt *.md *.markdown *.pdf *.docx *.epub *.html *.htm *.rst *.csv *.tsv *.log);;All files (*)")
        if paths:
            self.attach_files(paths)

    def attach_file(self, path: str) -> None:
        self.attach_files([path])

    def attach_files(self, paths: list[str]) -> None:
        """Read, count, check and prefill documents (all in the worker). Files dropped while
        another ingest runs wait for it, so each prefill sees the documents before it."""
        if any(kind == "ingest" for kind in self._jobs.values()):
            self._queued_paths.extend(paths)
            return
        conversation = Conversation(tuple(self.messages), self.documents.texts(), self._system_prompt())
        job = self.engine.ingest(paths, conversation)
        self._jobs[job] = "ingest"
        self._ingests[job] = Ingest(self.chat_id, tuple(paths))
        names = ", ".join(Path(p).name for p in paths)
        self.prefill_strip.start(f"Reading {names}")
        self._prefill_job_shown = job

    def show_settings(self) -> None:
        self.right.setCurrentWidget(self.settings_panel)
        self.right.show()
        self.settings_panel.setFocus()

    def choose_model(self) -> None:
        from app.model_picker import ModelPicker
        dialog = ModelPicker(self, current=self.model.spec if self.model else None)
        dialog.modelChosen.connect(self._on_model_chosen)
        dialog.open()
        self._picker = dialog

    def is_busy(self) -> bool:
        return any(kind in ("stream", "ingest", "prefill", "load") for kind in self._jobs.values())

    # ----------------------------------------------------------------------------- engine events

    def _on_model_loading(self, p: LoadProgress) -> None:
        if self._closing:  # the window is going: the store is closed
            return
        if p.job != self._load_job:
            return
        self._set_model_status(p.stage)
        if p.fraction is None:
            self.load_bar.setRange(0, 0)
        else:
            self.load_bar.setRange(0, 1000)
            self.load_bar.setValue(round(1000 * max(0.0, min(1.0, p.fraction))))

    def _on_model_unloaded(self, job: int) -> None:
        if self._closing:  # the window is going: the store is closed
            return
        if job == self._load_job:
            self.model = None
            self.model_button.setText("Model…")

    def _on_model_loaded(self, job: int, info: ModelInfo) -> None:
        if self._closing:  # the window is going: the store is closed
            return
        if job != self._load_job:
            return
        self.model = info
        self.prefs.setValue("model/spec", info.spec)
        self.chat_view.set_model_name(info.name)
        self.settings_panel.set_context(info.max_context)
        self.cache_panel.set_context(info.max_context)
        session = self.engine.decoding.session()
        if session is not None:
            self.settings_panel.set_settings(session.settings)
            self.cache_panel.set_settings(session.settings)
        self._set_model_status(f"{info.name} · {info.device} · {info.max_context:,}-token context · drafter: {info.draft}")
        self.model_button.setText(f"{info.name}  ▾")
        self.documents.recount(self.chat_id, info.model_id)  # token counts depend on the tokenizer
        self._count_uncounted()
        self._update_context_label()
        self.modelReady.emit(info)

    def _on_document_ready(self, ev: DocumentReady) -> None:
        if self._closing:  # the window is going: the store is closed
            return
        if ev.job == self._count_job:
            for a in self.documents:
                if a.document == ev.document and a.tokens is None:
                    self.documents.set_tokens(a, ev.tokens)
                    if a.saved and self.chat_id is not None and self.model is not None:
                        self.repo.set_token_count(self.chat_id, a.sha256, self.model.model_id, ev.tokens)
            self._update_context_label()
            return
        ingest = self._ingests.get(ev.job)
        if ingest is None or ingest.chat_id != self.chat_id:
            return  # the user moved to another chat; this job is being cancelled
        attached = self.documents.add(ev.document, ev.tokens)
        ingest.documents.append(attached)
        self.prefill_strip.start("Reading " + ", ".join(a.document.title for a in ingest.documents))
        self.documentAdded.emit(attached)
        self._update_context_label()

    def _on_engine_event(self, job: int, ev: Any) -> None:
        if self._closing:  # the window is going: the store is closed
            return
        kind = self._jobs.get(job)
        if kind is None:
            return
        if isinstance(ev, PrefillProgress):
            if kind == "stream" and ev.total < SHOW_PREFILL_MIN_TOKENS and self._prefill_job_shown != job:
                return
            if self._prefill_job_shown != job:
                self.prefill_strip.start("Reading the conversation")
                self._prefill_job_shown = job
            self.prefill_strip.update_progress(ev.done, ev.total, ev.reused, ev.eta_s)
            if ev.done >= ev.total and kind == "stream":
                self.prefill_strip.finish()
        elif isinstance(ev, ReadProgress):
            self.prefill_strip.update_reading(ev.name, ev.done, ev.total)
        elif isinstance(ev, TokenBatch):
            if kind == "stream":
                if self.prefill_strip.isVisible() and self._prefill_job_shown == job:
                    self.prefill_strip.finish()
                self._on_tokens(ev)
        elif isinstance(ev, Metrics):
            self.acceptance_panel.update_metrics(ev)
            self.cache_panel.update_metrics(ev)
        elif isinstance(ev, Finished):
            if ev.metrics is not None:
                self.acceptance_panel.update_metrics(ev.metrics)
                self.cache_panel.update_metrics(ev.metrics)
            if kind == "stream":
                self._finish_answer(job, ev)
            else:
                self._finish_prefill(job, ev)

    def _on_tokens(self, batch: TokenBatch) -> None:
        answer = self._answer
        if answer is None:
            return
        if answer.chat_id == self.chat_id:
            for piece in batch.pieces:
                self.chat_view.append_tokens(piece.text, int(piece.level))
        answer.add(batch)

    def _finish_answer(self, job: int, ev: Finished) -> None:
        answer = self._answer
        if answer is None:
            return
        self._answer = None
        text = ev.text if ev.text else answer.text
        chat = answer.chat_id
        visible = chat == self.chat_id
        self._stream_job = 0
        self.composer.set_generating(False)
        if self._prefill_job_shown == job:
            self.prefill_strip.finish()
        if ev.reason == FinishReason.ERROR:
            if text.strip():
                answer.save(text, {"partial": True, "error": ev.message, "footer": "stopped by an error"})
            else:
                answer.discard()
            if visible:
                if text.strip():
                    self.chat_view.finish_answer(text, "stopped by an error")
                    self._append_message(chat, "assistant", text)
                else:
                    self.chat_view.drop_streaming()
                self._show_error(ev.message or "The answer failed.")
        elif not text.strip():
            answer.discard()  # nothing came out (stopped before the first token): keep the store as it was
            if visible:
                self.chat_view.drop_streaming()
        else:
            partial = ev.reason == FinishReason.CANCELLED
            footer = self._footer(ev)
            meta = {"partial": True} if partial else {}
            meta["footer"] = footer
            meta["reason"] = ev.reason.value
            answer.save(text, meta)
            self._append_message(chat, "assistant", text)
            if visible:
                self.chat_view.finish_answer(text, footer)
        self._refresh_chats()
        self.answerFinished.emit(ev)

    def _finish_prefill(self, job: int, ev: Finished) -> None:
        if self._prefill_job_shown == job:
            self.prefill_strip.finish()
        ingest = self._ingests.pop(job, None)
        docs = ingest.documents if ingest is not None and ingest.chat_id == self.chat_id else []
        titles = ", ".join(f"“{a.document.title}”" for a in docs)
        if ev.reason == FinishReason.CANCELLED:
            unsaved = [a for a in docs if not a.saved]
            for a in unsaved:
                self.documents.drop(a)
            if unsaved:
                self._notice(f"Stopped reading {titles}; not added to the chat.")
        elif ev.reason == FinishReason.ERROR:
            for a in docs:
                if not a.saved:
                    self.documents.drop(a)
            self._show_error(ev.message or f"Could not read {titles or 'the document'}.")
        elif docs:
            chat_id = self._ensure_chat(docs[0].document.title)
            for a in docs:
                self.documents.save(a, chat_id, self._model_id())
            self._refresh_chats()
        self._update_context_label()
        self.prefillFinished.emit(ev)

    def _on_failed(self, f: JobFailed) -> None:
        if self._closing:  # the window is going: the store is closed
            return
        kind = self._jobs.get(f.job, f.kind)
        if kind == "load":
            if f.job != self._load_job:
                return
            self.load_bar.hide()
            self.load_cancel.hide()
            self.model_button.setEnabled(True)
            cancelled = type(f.error).__name__.endswith("Cancelled")
            still = f" — still using {self.model.name}" if self.model is not None else " — no model loaded"
            self._set_model_status(("Model loading cancelled" if cancelled else "Model loading failed") + still)
            if not cancelled:
                self._show_error(f"Could not load the model: {f.message}", f.details)
            return
        if kind == "stream":
            self._finish_answer(f.job, Finished(FinishReason.ERROR, "", f.message))
            if f.details:
                log.error("stream failed: %s", f.details)
            return
        if kind == "ingest":
            name = Path(f.path).name if f.path else "the documents"
            if f.path:  # one file could not be read; the others of the job go on
                self._show_error(f.message if f.user_error else f"Could not add {name}: {f.message}", f.details)
                return
            if self._prefill_job_shown == f.job:
                self.prefill_strip.finish()
            ingest = self._ingests.pop(f.job, None)
            for a in ingest.documents if ingest is not None else ():
                if not a.saved:
                    self.documents.drop(a)
            if isinstance(f.error, ContextOverflowError):
                self._show_overflow(f)
            else:
                self._show_error(f.message if f.user_error else f"Could not add {name}: {f.message}", f.details)
            self._update_context_label()
            self.prefillFinished.emit(Finished(FinishReason.ERROR, "", f.message))
            return
        if kind == "prefill":
            self.prefill_strip.finish()
        self._show_error(f.message, f.details)

    def _on_job_done(self, job: int) -> None:
        if self._closing:  # the window is going: the store is closed
            return
        kind = self._jobs.pop(job, None)
        if kind == "ingest":
            self._ingests.pop(job, None)  # e.g. every file failed to read: nothing to prefill
            if self._queued_paths:
                paths, self._queued_paths = self._queued_paths, []
                self.attach_files(paths)
        if kind == "load":
            self.load_bar.hide()
            self.load_cancel.hide()
            self.model_button.setEnabled(True)
        if kind == "stream" and self._stream_job == job:  # the engine ended without Finished
            self._finish_answer(job, Finished(FinishReason.ERROR, "", "The answer ended unexpectedly."))
        if not any(k in ("ingest", "prefill") for k in self._jobs.values()):
            self.prefill_strip.finish()

    # ----------------------------------------------------------------------------- helpers

    def _start_stream(self, chat_id: int) -> None:
        self._answer = AnswerRecorder(self.repo, chat_id)
        self.acceptance_panel.start_answer()
        self.chat_view.start_answer()
        conversation = Conversation(tuple(self.messages), self.documents.texts(), self._system_prompt())
        self._stream_job = self.engine.stream(conversation)
        self._jobs[self._stream_job] = "stream"
        self.composer.set_generating(True)

    def _append_message(self, chat: int | None, role: str, text: str) -> None:
        if chat == self.chat_id:
            self.messages.append(ChatMessage(role, text))

    def _ensure_chat(self, first_text: str) -> int:
        if self.chat_id is None:
            title = chat_title(first_text)
            self.chat_id = self.repo.create_chat(title, self.model.spec if self.model else "",
                                                 self._chat_settings_dict())
            self.title_label.setText(title)
            self._refresh_chats()
        return self.chat_id

    def _on_remove_document(self, key: int) -> None:
        attached = self.documents.find(key)
        if attached is None:
            return
        for job, ingest in self._ingests.items():
            if attached in ingest.documents:
                self.engine.cancel(job)
        try:
            self.documents.delete(attached, self.chat_id)
        except UserError as exc:
            self._show_error(f"Could not remove the document: {exc}")
        self._update_context_label()

    def _model_id(self) -> str:
        return self.model.model_id if self.model else ""

    def _count_uncounted(self) -> None:
        uncounted = self.documents.uncounted()
        if uncounted and self.model is not None:
            self._count_job = self.engine.count(uncounted)

    def _leave_chat(self) -> None:
        """Switching away: stop this chat's answer/prefill (the partial answer is saved)."""
        self.stop()

    def _footer(self, ev: Finished) -> str:
        m = ev.metrics
        parts = []
        if ev.reason == FinishReason.CANCELLED:
            parts.append("stopped — partial answer")
        elif ev.reason == FinishReason.LENGTH:
            parts.append("reached the answer length limit")
        if m is not None:
            if m.new_tokens:
                parts.append(f"{m.new_tokens:,} tokens")
            if m.decode_tokens_per_s:
                parts.append(f"{m.decode_tokens_per_s:.1f} tok/s")
            if m.time_to_first_token_s is not None:
                parts.append(f"first token {fmt_seconds(m.time_to_first_token_s)}")
            if m.mean_accepted_per_verify:
                parts.append(f"{m.mean_accepted_per_verify:.2f} accepted/verify")
            parts.append(m.mode)
        return " · ".join(parts)

    def _system_prompt(self) -> str | None:
        return self.settings_panel.system_prompt() or None

    def _chat_settings_dict(self) -> dict:
        return {"decode": settings_to_dict(self.settings_panel.settings()), "system": self.settings_panel.system_prompt()}

    def _on_settings_changed(self, settings: DecodeSettings) -> None:
        self._apply_settings(settings, persist_chat=True)

    def _apply_settings(self, settings: DecodeSettings, persist_chat: bool) -> None:
        try:
            self.engine.apply_settings(settings)
        except UserError as exc:
            self.settings_panel.show_error(str(exc))
            return
        self.settings_panel.show_error("")
        self.cache_panel.set_settings(settings)
        self.prefs.setValue("decode/settings", _json(settings_to_dict(settings)))
        if persist_chat and self.chat_id is not None:
            self.repo.set_settings(self.chat_id, self._chat_settings_dict())

    def _on_limits(self, document_mib: int, snapshot_gib: int, save: bool = True) -> None:
        """Storage limits from the Settings panel: the engine uses them at once; kept in QSettings."""
        self.engine.set_limits(document_mib * 2**20, snapshot_gib * 2**30)
        if save:
            self.prefs.setValue("limits/max_document_mib", int(document_mib))
            self.prefs.setValue("limits/snapshot_cache_gib", int(snapshot_gib))
            self.prefs.sync()

    def _on_system_prompt(self, _text: str) -> None:
        if self.chat_id is not None:
            self.repo.set_settings(self.chat_id, self._chat_settings_dict())

    def _on_model_chosen(self, spec: str, draft: str) -> None:
        self.stop()
        self.load_model(spec, draft)

    def _on_rename(self, chat_id: int, title: str) -> None:
        self.repo.rename_chat(chat_id, title)
        if chat_id == self.chat_id:
            self.title_label.setText(title)
        self._refresh_chats()

    def _on_delete(self, chat_id: int) -> None:
        if chat_id == self.chat_id:
            self.new_chat()
        self.repo.delete_chat(chat_id)
        self._refresh_chats()

    def _on_export(self, chat_id: int, fmt: str) -> None:
        suffix = ".md" if fmt == "markdown" else ".json"
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", str(Path.home() / f"chat{suffix}"))
        if path:
            try:
                Path(path).write_text(self.repo.export(chat_id, fmt), encoding="utf-8")
            except (OSError, UserError) as exc:
                self._show_error(f"Could not export: {exc}")

    def _on_search(self, text: str) -> None:
        self._search = text
        self._refresh_chats()

    def _refresh_chats(self) -> None:
        chats = self.repo.list_chats(self._search or None)
        self.chat_list.set_chats([ChatEntry(c.id, c.title, _chat_subtitle(c)) for c in chats], self.chat_id)

    def _update_context_label(self) -> None:
        doc_tokens = self.documents.total_tokens()
        if self.model is None:
            self.context_label.setText(f"{doc_tokens:,} document tokens" if doc_tokens else "")
            return
        self.context_label.setText(f"{doc_tokens:,} / {self.model.max_context:,} tokens in documents"
                                   if self.documents else f"{self.model.max_context:,}-token context")

    def _set_model_status(self, text: str) -> None:
        self.status_label.setText(text)

    def _show_error(self, message: str, details: str = "") -> None:
        """User errors and bugs alike appear in the chat; the app keeps working."""
        if details:
            log.error("%s\n%s", message, details)
            message = f"{message}\n\n(The full traceback is in the log.)"
        self.chat_view.add_error(message)
        self.errorShown.emit(message)

    def _notice(self, message: str) -> None:
        w = self.chat_view.add_message("notice", message)
        w.header.setText("Note")

    def _show_overflow(self, f: JobFailed) -> None:
        """A document that does not fit: the numbers and the ways out; nothing was cut or added."""
        text = f"{f.message}\n\nNothing was added to the chat."
        self._show_error(text)
        box = QMessageBox(QMessageBox.Icon.Warning, "Document does not fit", f.message, parent=self)
        box.setInformativeText("Pick a model with a longer context (Model… shows its plan: what goes where and "
                               "whether it fits your memory), or make room: a shorter answer length in Settings, "
                               "or a new chat. Nothing was cut and nothing was added.")
        other = box.addButton("Choose another model…", QMessageBox.ButtonRole.AcceptRole)
        settings = box.addButton("Settings…", QMessageBox.ButtonRole.ActionRole)
        box.addButton(QMessageBox.StandardButton.Close)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.buttonClicked.connect(lambda b: self.choose_model() if b is other
                                  else self.show_settings() if b is settings else None)
        box.open()
        self._overflow_box = box

    def _restore_geometry(self) -> None:
        geometry, state = self.prefs.value("window/geometry"), self.prefs.value("window/splitter")
        if geometry is not None:
            self.restoreGeometry(geometry)
        if state is not None:
            self.splitter.restoreState(state)

    def _on_color_scheme(self, _scheme: object) -> None:
        self._apply_theme()

    def _apply_theme(self) -> None:
        app = QApplication.instance()
        if app is not None:
            self.colors = theme.apply_theme(app)
            self.chat_view.set_colors(self.colors)
            self.acceptance_panel.set_colors(self.colors)
            self.settings_panel.set_colors(self.colors)

    # ----------------------------------------------------------------------------- Qt events

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802
        if event.mimeData().hasUrls() and any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()
            self.drop_overlay.setGeometry(self.rect().adjusted(16, 16, -16, -16))
            self.drop_overlay.raise_()
            self.drop_overlay.show()

    def dragLeaveEvent(self, event) -> None:  # noqa: N802
        self.drop_overlay.hide()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802
        self.drop_overlay.hide()
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if not paths:
            return
        event.acceptProposedAction()
        self.attach_files(paths)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self) -> None:
        """Stop the engine thread (quit + wait), the sampler, and close the store. Idempotent."""
        if self._closing:
            return
        self._closing = True
        if self._answer is not None and self._answer.text.strip():  # closing mid-answer: keep what came
            self._answer.save(self._answer.text, {"partial": True, "footer": "stopped — partial answer"})
        self.settings_panel.flush()
        self.prefs.setValue("window/geometry", self.saveGeometry())
        self.prefs.setValue("window/splitter", self.splitter.saveState())
        self.engine.shutdown()
        self.memory.stop()
        self.prefs.sync()
        self.repo.close()


def _chat_subtitle(c: Any) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
    return f"{c.message_count} messages · {when}"


def chat_title(text: str, limit: int = 60) -> str:
    """A chat's title from its first message: one line, no Markdown marks, cut at a word."""
    plain = " ".join(text.replace("**", "").replace("`", "").replace("#", "").split())
    if len(plain) > limit:
        plain = plain[:limit].rsplit(" ", 1)[0] + "…"
    return plain or "New chat"


def _json(d: dict) -> str:
    import json
    return json.dumps(d)


def run_app(argv: list[str] | None = None) -> int:
    """Start the desktop app. The model comes from $TRIFORCE_MODEL (default: the last one used,
    else the bundled one); files named on the command line are attached to a new chat."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv if argv is None else argv)
    QApplication.setApplicationName(APP)
    QApplication.setOrganizationName(ORG)
    QApplication.setDesktopFileName("triforce-chat")
    app = QApplication.instance() or QApplication(argv)
    app.setWindowIcon(app_icon())
    theme.apply_theme(app)
    prefs = app_settings()
    spec = os.environ.get("TRIFORCE_MODEL") or prefs.value("model/spec", "bundled", type=str) or "bundled"
    try:
        window = MainWindow(spec, settings=prefs)
    except UserError as exc:  # e.g. the chat store cannot be opened
        QMessageBox.critical(None, "TriForce Chat", str(exc))
        return 2
    window.show()
    for path in argv[1:]:
        if Path(path).is_file():
            window.attach_file(path)
    return app.exec()


if __name__ == "__main__":
    sys.exit(run_app())
