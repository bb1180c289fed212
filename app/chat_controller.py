"""What the main window does, without Qt: chats, questions and answers, documents, engine jobs.

The window (app/main_window.py), a thin view, forwards user actions and engine signals here and
implements `WindowView`. Each job is recorded with its `JobKind`; its outcome is handled once
(`_on_outcome`, `on_failed`) and its end once (`on_job_done`).
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from app.answer_recorder import AnswerRecorder, answer_footer
from app.chat_naming import chat_title, named_document
from app.chat_documents import AttachedDocument, ChatDocuments, Ingest
from app.chat_repo import ChatRepo, to_chat_messages
from app.decode_prefs import settings_to_dict
from app.job_messages import Conversation, DocumentReady, JobFailed, LoadProgress, ModelInfo, TokenBatch
from app.jobs import JobKind, JobTable, failed, is_cancellation
from app.overflow import overflow_from, with_stretch
from app.passages_fit import PassagesUsed
from app.window_view import WindowView
from engine.errors import ContextOverflowError, UserError
from engine.events import ChatMessage, Finished, FinishReason, Metrics, PrefillProgress, ReadProgress
from engine.settings import DecodeSettings

log = logging.getLogger(__name__)

SHOW_PREFILL_MIN_TOKENS = 192  # shorter prompt prefills are too quick to deserve a progress strip
STOPPED_EMPTY = "stopped before the answer began"
STOPPED_PARTIAL = "stopped — partial answer"
INTERRUPTED = "interrupted — partial answer"
MODEL_BANNER = "model"  # what a "could not load the model" banner is about (files: their paths)


class ChatController:
    """One window's state and behaviour. `engine` is an app.worker.EngineController (or a stand-in),
    `prefs` anything with value()/setValue() (QSettings in the app)."""

    def __init__(self, view: WindowView, engine: Any, repo: ChatRepo, documents: ChatDocuments, prefs: Any) -> None:
        self.view, self.engine, self.repo, self.documents, self.prefs = view, engine, repo, documents, prefs
        self.model: ModelInfo | None = None
        self.chat_id: int | None = None
        self.messages: list[ChatMessage] = []
        self.jobs = JobTable()
        self.search = ""
        self._ingests: dict[int, Ingest] = {}  # ingest job -> what it read, for which chat
        self._queued_paths: list[str] = []  # dropped while another ingest runs
        self._answer: AnswerRecorder | None = None  # the streaming answer (its chat may not be shown)
        self._read_s: dict[int, float] = {}  # ingest job -> how long its prefill has read so far
        self._fresh_read: tuple[int, float] | None = None  # (chat, seconds) a new document took, for the next answer
        self._attach_after_load: tuple[int, tuple[str, ...]] | None = None  # (load job, files) of a stretch
        self.closing = False

    # ----------------------------------------------------------------------------- user actions

    def load_model(self, spec: str, draft: str = "ngram", context: int = 0) -> int:
        """Load `spec` off the GUI thread; the current model answers until the new weights load.
        `context` past the model's trained context stretches it to that window (0: as trained)."""
        job = self.jobs.start(self.engine.load(spec, draft, context), JobKind.LOAD)
        self._attach_after_load = None
        self.view.show_load_stage(f"loading {spec}" + (f" stretched to {context:,} tokens" if context else ""))
        self.view.show_load(None)
        return job

    def saved_context(self, spec: str) -> int:
        """The window `spec` was last loaded with (0: as trained, or another model was last)."""
        if self.prefs.value("model/spec", "", type=str) != spec:
            return 0
        try:
            return max(0, int(self.prefs.value("model/context", 0, type=int) or 0))
        except (TypeError, ValueError):  # a hand-edited settings file
            return 0

    def stretch_and_attach(self, overflow) -> None:
        """The overflow dialog's stretch: reload this model at `overflow.stretch_to` tokens, then add
        the files that did not fit."""
        if self.model is None or not overflow.stretch_to:
            return
        self.stop()
        job = self.load_model(self.model.spec, self.model.draft_spec, overflow.stretch_to)
        self._attach_after_load = (job, tuple(overflow.paths))

    def new_chat(self) -> None:
        """An empty chat; it is created in the store with its first message or document."""
        self.stop()
        self.chat_id, self.messages = None, []
        self.documents.clear()
        self.view.show_chat(None, "New chat", (), None)
        self.view.reset_live()
        self.update_context()

    def open_chat(self, chat_id: int) -> None:
        if chat_id == self.chat_id:
            return
        self.stop()
        self.chat_id = chat_id
        stored = self.repo.messages(chat_id)
        self.messages = to_chat_messages(stored)
        interrupted = self.repo.interrupted_question(chat_id)
        self.view.show_chat(chat_id, self.repo.title(chat_id), stored,
                            None if interrupted is None else interrupted.idx)
        self.view.reset_live()
        self.documents.load(chat_id, self.model_id)
        self._count_uncounted()
        saved = self.repo.get_settings(chat_id)
        if saved:
            self.view.show_settings_of_chat(saved)
            self.apply_settings(self.view.decode_settings(), persist_chat=False)
        self.update_context()

    def send(self, text: str) -> None:
        """Save the question with an empty answer (one transaction), show it, and stream the answer."""
        text = text.strip()
        if not text or self.jobs.stream:
            return
        chat_id = self._ensure_chat(text)
        self.documents.save_pending(chat_id, self.model_id)  # the question relies on them
        index, answer = AnswerRecorder.for_question(self.repo, chat_id, text)
        self.messages.append(ChatMessage("user", text))
        self.view.add_question(text, index)
        self._start_stream(answer)
        self.refresh_chats()

    def regenerate(self) -> None:
        """Drop the last answer and ask again (the engine reuses the cached prefix)."""
        if self.jobs.stream or self.chat_id is None or not self.messages or self.messages[-1].role != "assistant":
            return
        self._ask_again(len(self.messages) - 1)

    def retry(self) -> None:
        """Ask again the question a crash, an error or a shutdown cut off."""
        if self.jobs.stream or self.chat_id is None or self.repo.interrupted_question(self.chat_id) is None:
            return
        last_user = max(i for i, m in enumerate(self.messages) if m.role == "user")
        self._ask_again(last_user + 1)

    def edit_question(self, position: int, text: str) -> None:
        """Ask the question at `position` (among the chat's messages) as `text`: it and the messages
        after it are replaced, in the store too; the engine keeps the cached prefix before it."""
        if self.jobs.stream or self.chat_id is None or not 0 <= position < len(self.messages):
            return
        if self.messages[position].role != "user" or not text.strip():
            return
        self._delete_from(position)
        self.send(text)

    def stop(self) -> None:
        """Esc / Stop / Cancel / leaving the chat: stop the answer or prefill (honoured within a step)."""
        for job in self.jobs.stoppable():
            self.engine.cancel(job)

    def attach_files(self, paths: list[str]) -> None:
        """Read, count, check and prefill documents (all in the worker). Files dropped while
        another ingest runs wait for it, so each prefill sees the documents before it."""
        if self.jobs.running(JobKind.INGEST):
            self._queued_paths.extend(paths)
            return
        job = self.jobs.start(self.engine.ingest(paths, self._conversation()), JobKind.INGEST)
        self._ingests[job] = Ingest(self.chat_id, tuple(paths))
        self.jobs.progress_shown = job
        self.view.show_progress("Reading " + ", ".join(Path(p).name for p in paths))

    def remove_document(self, key: int) -> None:
        attached = self.documents.find(key)
        if attached is None:
            return
        for job, ingest in self._ingests.items():
            if attached in ingest.documents:
                self.engine.cancel(job)
        try:
            self.documents.delete(attached, self.chat_id)
        except UserError as exc:
            self.view.show_error(f"Could not remove the document: {exc}")
        self.update_context()

    def is_busy(self) -> bool:
        return self.jobs.busy()

    def open_interrupted(self) -> None:
        """At start: a crash or a kill cut off the latest chat's last turn: open it, with Retry."""
        chats = self.repo.list_chats()
        if chats and self.repo.interrupted_question(chats[0].id) is not None:
            self.open_chat(chats[0].id)

    # ----------------------------------------------------------------------------- chats & settings

    def rename(self, chat_id: int, title: str) -> None:
        self.repo.rename_chat(chat_id, title)
        self.refresh_chats()

    def delete(self, chat_id: int) -> None:
        if chat_id == self.chat_id:
            self.new_chat()
        self.repo.delete_chat(chat_id)
        self.refresh_chats()

    def export(self, chat_id: int, fmt: str, path: str) -> None:
        """Write the chat to `path` and say so (or why not)."""
        try:
            Path(path).write_text(self.repo.export(chat_id, fmt), encoding="utf-8")
        except (OSError, UserError) as exc:
            self.view.show_error(f"Could not export: {exc}")
            return
        kind = "Markdown" if fmt == "markdown" else "JSON"
        self.view.confirm(f"Exported “{self.repo.title(chat_id)}” as {kind} to {path}")

    def set_search(self, text: str) -> None:
        self.search = text
        self.refresh_chats()

    def refresh_chats(self) -> None:
        self.view.set_chats(self.repo.list_chats(self.search or None), self.chat_id)

    def apply_settings(self, settings: DecodeSettings, persist_chat: bool = True) -> None:
        try:
            self.engine.apply_settings(settings)
        except UserError as exc:
            self.view.show_settings_error(str(exc))
            return
        self.view.show_settings_error("")
        self.prefs.setValue("decode/settings", json.dumps(settings_to_dict(settings)))
        if persist_chat and self.chat_id is not None:
            self.repo.set_settings(self.chat_id, self.chat_settings())

    def set_system_prompt(self) -> None:
        if self.chat_id is not None:
            self.repo.set_settings(self.chat_id, self.chat_settings())

    def chat_settings(self) -> dict:
        return {"decode": settings_to_dict(self.view.decode_settings()), "system": self.view.system_prompt()}

    @property
    def model_id(self) -> str:
        return self.model.model_id if self.model else ""

    def update_context(self) -> None:
        tokens, model = self.documents.total_tokens(), self.model
        self.view.set_context_text((f"{tokens:,} document tokens" if tokens else "") if model is None else
                                   f"{tokens:,} / {model.max_context:,} tokens in documents" if self.documents
                                   else f"{model.max_context:,}-token context")

    # ----------------------------------------------------------------------------- engine signals

    def on_model_loading(self, p: LoadProgress) -> None:
        if not self.closing and p.job == self.jobs.load:
            self.view.show_load_stage(p.stage)
            self.view.show_load(None if p.fraction is None else max(0.0, min(1.0, p.fraction)))

    def on_model_unloaded(self, job: int) -> None:
        if not self.closing and job == self.jobs.load:
            self.model = None
            self.view.show_model(None, None)

    def on_model_loaded(self, job: int, info: ModelInfo) -> None:
        if self.closing or job != self.jobs.load:
            return
        self.model = info
        self.prefs.setValue("model/spec", info.spec)
        self.prefs.setValue("model/context", int(info.context))  # the next start loads the same window
        self.prefs.sync()
        session = self.engine.session()
        self.view.show_model(info, session.settings if session is not None else None)
        stretched = f" (stretched from {info.trained_context:,}, YaRN)" if info.trained_context and \
            info.max_context > info.trained_context else ""
        self.view.set_status(f"{info.name} · {info.device} · {info.max_context:,}-token context{stretched} · "
                             f"drafter: {info.draft}")
        self.view.clear_banners((MODEL_BANNER,))  # an earlier model failed to load; this one did
        self.documents.recount(self.chat_id, info.model_id)  # token counts depend on the tokenizer
        self._count_uncounted()
        self.update_context()
        self.view.emit("modelReady", info)
        pending, self._attach_after_load = self._attach_after_load, None
        if pending is not None and pending[0] == job and pending[1]:
            self.view.clear_banners(pending[1])  # "was not added": it is being added now
            self.attach_files(list(pending[1]))  # what the stretch was for

    def on_document_ready(self, ev: DocumentReady) -> None:
        if self.closing:
            return
        if ev.job == self.jobs.count:
            for a in self.documents:
                if a.document == ev.document and a.tokens is None:
                    self.documents.set_tokens(a, ev.tokens)
                    if a.saved and self.chat_id is not None and self.model is not None:
                        self.repo.set_token_count(self.chat_id, a.sha256, self.model.model_id, ev.tokens)
            self.update_context()
            return
        ingest = self._ingests.get(ev.job)
        if ingest is None or ingest.chat_id != self.chat_id:
            return  # the user moved to another chat; this job is being cancelled
        attached = self.documents.add(named_document(ev.document, ev.path), ev.tokens)
        ingest.documents.append(attached)
        self.view.show_progress("Reading " + ", ".join(a.document.title for a in ingest.documents))
        self.view.emit("documentAdded", attached)
        self.update_context()

    def on_engine_event(self, job: int, ev: Any) -> None:
        kind = None if self.closing else self.jobs.kind(job)
        if kind is None:
            return
        if isinstance(ev, PrefillProgress):
            shown = self.jobs.progress_shown == job
            if kind is JobKind.STREAM and ev.total < SHOW_PREFILL_MIN_TOKENS and not shown:
                return
            self.jobs.progress_shown = job
            self.view.show_progress(None if shown else "Reading the conversation", ev)
            self.view.show_prefill(ev)  # the cache bars fill as the prompt is read
            if kind is JobKind.INGEST:
                self._read_s[job] = ev.elapsed_s
            elif kind is JobKind.STREAM and self._answer is not None:
                self._answer.timing.prompt_tokens_read, self._answer.timing.prompt_read_s = ev.done, ev.elapsed_s
            if ev.done >= ev.total and kind is JobKind.STREAM:
                self.view.hide_progress()
        elif isinstance(ev, ReadProgress):
            self.view.show_progress(None, ev)
        elif isinstance(ev, TokenBatch):
            if kind is JobKind.STREAM:
                if self.jobs.progress_shown == job:
                    self.view.hide_progress()
                self._on_tokens(ev)
        elif isinstance(ev, Metrics):
            self.view.show_metrics(ev)
        elif isinstance(ev, PassagesUsed):
            if kind is JobKind.STREAM and self._answer is not None:
                self._answer.passages = ev.passages  # kept with the answer, listed under it
                self._answer.timing.passages_at = time.monotonic()
                self._answer.timing.passage_count = len(ev.passages)
        elif isinstance(ev, Finished):
            if ev.metrics is not None:
                self.view.show_metrics(ev.metrics)
            self._on_outcome(job, kind, ev)

    def on_failed(self, f: JobFailed) -> None:
        """A job failed: what went wrong is shown once; its end is handled in on_job_done."""
        if self.closing:
            return
        kind = self.jobs.kind(f.job) or JobKind(f.kind)
        if kind is JobKind.LOAD:
            if f.job != self.jobs.load:
                return
            self._attach_after_load = None  # the files stay out; the banner says they were not added
            cancelled = is_cancellation(f.error)
            still = f" — still using {self.model.name}" if self.model is not None else " — no model loaded"
            self.view.set_status(("Model loading cancelled" if cancelled else "Model loading failed") + still)
            if not cancelled:
                self.view.show_error(f"Could not load the model: {f.message}", f.details, about=(MODEL_BANNER,))
        elif kind is JobKind.STREAM:
            if f.details:
                log.error("stream failed: %s", f.details)
            self._on_outcome(f.job, kind, failed(f.message))
        elif kind is JobKind.INGEST and f.path:  # one file could not be read; the others of the job go on
            name = Path(f.path).name
            self.view.show_error(f.message if f.user_error else f"Could not add {name}: {f.message}", f.details,
                                 about=(f.path,))
        elif kind is JobKind.INGEST:
            ingest = self._ingests.get(f.job)
            if isinstance(f.error, ContextOverflowError):
                paths = ingest.paths if ingest is not None else ()
                overflow = with_stretch(overflow_from(f.message, paths, f.error), self.model)
                self.view.show_error(overflow.text(), about=paths)
                self.view.show_overflow(overflow)
                self._on_outcome(f.job, kind, failed(f.message), quiet=True)
            else:
                message = f.message if f.user_error else f"Could not add the documents: {f.message}"
                self._on_outcome(f.job, kind, failed(message))
        elif not is_cancellation(f.error):
            self.view.show_error(f.message, f.details)

    def on_job_done(self, job: int) -> None:
        """The one end of every job, however it went."""
        if self.closing:
            return
        kind = self.jobs.end(job)
        if kind is JobKind.STREAM and self.jobs.stream == job:  # the engine ended without Finished
            self._on_outcome(job, kind, failed("The answer ended unexpectedly."))
        if kind is JobKind.INGEST:
            self._ingests.pop(job, None)  # e.g. every file failed to read: nothing to prefill
            self._read_s.pop(job, None)
            if self._queued_paths:
                paths, self._queued_paths = self._queued_paths, []
                self.attach_files(paths)
        if kind is JobKind.LOAD and job == self.jobs.load:
            self.view.hide_load()
        if not self.jobs.reading() and not (self.jobs.stream and self.jobs.progress_shown == self.jobs.stream):
            self.view.hide_progress()

    # ----------------------------------------------------------------------------- outcomes

    def _on_outcome(self, job: int, kind: JobKind, ev: Finished, quiet: bool = False) -> None:
        """The engine's (or our) Finished for a job: an answer ends, or a prefill does."""
        if self.jobs.progress_shown == job:
            self.view.hide_progress()
        if kind is JobKind.STREAM:
            self._finish_answer(ev)
        elif kind in (JobKind.INGEST, JobKind.PREFILL):
            self._finish_prefill(job, ev, quiet)

    def _finish_answer(self, ev: Finished) -> None:
        answer = self._answer
        if answer is None:
            return
        self._answer, self.jobs.stream = None, 0
        text = ev.text or answer.text
        if self._fresh_read is not None and self._fresh_read[0] == answer.chat_id:
            answer.timing.document_read_s, self._fresh_read = self._fresh_read[1], None
        state, footer = "done", answer_footer(ev, answer.timing)
        stats: dict[str, Any] = {"reason": ev.reason.value}
        if ev.reason == FinishReason.ERROR:
            state, footer = "interrupted", "stopped by an error"
            stats.update(partial=True, error=ev.message)
        elif ev.reason == FinishReason.CANCELLED:
            state = "stopped"
            footer = answer_footer(ev, answer.timing) if text.strip() else STOPPED_EMPTY
            stats["partial"] = True
        stats["footer"] = footer
        answer.finish(text, state, stats)
        self.view.set_generating(False)
        if not text.strip():  # nothing came (stopped or failed before the first token): no numbers to keep
            self.view.reset_live()
        if answer.chat_id == self.chat_id:
            self.messages.append(ChatMessage("assistant", text))
            self.view.end_answer(text, footer, retry=state == "interrupted")
            if answer.passages is not None:
                self.view.list_passages(answer.passages)
            if ev.reason == FinishReason.ERROR:
                self.view.show_error(ev.message or "The answer failed.")
        self.refresh_chats()
        self.view.emit("answerFinished", ev)

    def _finish_prefill(self, job: int, ev: Finished, quiet: bool = False) -> None:
        ingest = self._ingests.pop(job, None)
        read_s = self._read_s.pop(job, None)
        docs = ingest.documents if ingest is not None and ingest.chat_id == self.chat_id else []
        if ev.reason in (FinishReason.CANCELLED, FinishReason.ERROR):
            titles = self._drop_unsaved(docs)
            self.view.reset_live()  # the read did not finish: its half-filled bars mean nothing now
            paths = ingest.paths if ingest is not None else ()
            if ev.reason == FinishReason.CANCELLED and titles:
                self.view.show_notice(f"Stopped reading {titles}; not added to the chat.", about=paths)
            elif ev.reason == FinishReason.ERROR and not quiet:
                self.view.show_error(ev.message or f"Could not read {titles or 'the document'}.", about=paths)
        elif docs:
            chat_id = self._ensure_chat(docs[0].document.title)
            for a in docs:
                self.documents.save(a, chat_id, self.model_id)
            self.view.clear_banners(ingest.paths)  # "was not added", "stopped reading": no longer so
            if read_s is not None:  # the next answer's footer says how long the reading took
                self._fresh_read = (chat_id, read_s)
            self.refresh_chats()
        self.update_context()
        self.view.emit("prefillFinished", ev)

    def _drop_unsaved(self, docs: list[AttachedDocument]) -> str:
        """Take documents that never reached the store off the screen; returns their titles."""
        unsaved = [a for a in docs if not a.saved]
        for a in unsaved:
            self.documents.drop(a)
        return ", ".join(f"“{a.document.title}”" for a in unsaved)

    def shutdown(self) -> None:
        """Closing: the answer being written is saved as interrupted (Retry offers it again)."""
        if self.closing:
            return
        self.closing = True
        if self._answer is not None:
            text = self._answer.text
            self._answer.finish(text, "interrupted", {"partial": True, "footer": INTERRUPTED, "reason": "closed"})
            self._answer = None

    # ----------------------------------------------------------------------------- helpers

    def _start_stream(self, answer: AnswerRecorder) -> None:
        self._answer = answer
        self.view.start_answer()
        self.jobs.start(self.engine.stream(self._conversation()), JobKind.STREAM)
        self.view.set_generating(True)

    def _ask_again(self, position: int) -> None:
        """Drop the messages from `position` (an answer) and answer the question before it again."""
        self._delete_from(position)
        self._start_stream(AnswerRecorder.for_last_question(self.repo, self.chat_id))

    def _delete_from(self, position: int) -> None:
        stored = [m for m in self.repo.messages(self.chat_id) if m.role in ("user", "assistant")]
        if position < len(stored):
            self.repo.delete_messages_from(self.chat_id, stored[position].idx)
        del self.messages[position:]
        self.view.remove_after(position)

    def _conversation(self) -> Conversation:
        return Conversation(tuple(self.messages), self.documents.texts(), self.view.system_prompt() or None)

    def _on_tokens(self, batch: TokenBatch) -> None:
        if self._answer is None:
            return
        if self._answer.chat_id == self.chat_id:
            self.view.append_answer(batch)
        self._answer.add(batch)

    def _ensure_chat(self, first_text: str) -> int:
        """The chat on screen, created in the store if new: named after its first document (one
        attached or still being read), else after `first_text`."""
        if self.chat_id is None:
            reading = [i for i in self._ingests.values() if i.chat_id is None]
            names = [a.document.title for a in self.documents] + [Path(p).stem for i in reading for p in i.paths]
            title = chat_title(names[0] if names else first_text)
            self.chat_id = self.repo.create_chat(title, self.model.spec if self.model else "", self.chat_settings())
            for ingest in reading:  # what this new chat is still reading belongs to it
                ingest.chat_id = self.chat_id
            self.view.show_chat(self.chat_id, title, None, None)
            self.refresh_chats()
        return self.chat_id

    def _count_uncounted(self) -> None:
        uncounted = self.documents.uncounted()
        if uncounted and self.model is not None:
            self.jobs.start(self.engine.count(uncounted), JobKind.COUNT)
