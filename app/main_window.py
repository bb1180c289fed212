"""The main window: chats on the left, the conversation in the middle, live panels on the right.

A thin view: it builds the widgets (app/window_layout.py, app/window_menus.py), forwards what the
user does and what the engine says to the Qt-free `ChatController` (app/chat_controller.py), and
implements the calls the controller makes back (`WindowView`). `run_app()` is the GUI entry point.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QSettings, Signal
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QMainWindow, QMessageBox

from app import theme
from app.app_main import app_settings, run_app  # noqa: F401 - run_app: the gui-script's entry (pyproject)
from app.chat_controller import ChatController, chat_title  # noqa: F401 - chat_title re-exported
from app.chat_documents import ChatDocuments
from app.chat_naming import export_file_name
from app.chat_list import ChatEntry
from app.chat_repo import ChatRepo
from app.decode_prefs import apply_limits
from app.engine_relay import EngineRelay
from app.icons import app_icon
from app.job_messages import ModelInfo, TokenBatch
from app.overflow import Overflow
from app.overflow_dialog import show_overflow_dialog
from app.passages_view import PassagesPresenter
from app.startup import AfterFirstPaint, LoadClock, import_in_background
from app.settings_panel import DEFAULT_DOCUMENT_MIB, DEFAULT_SNAPSHOT_GIB, settings_from_dict
from app.window_layout import build_window_layout
from app.window_menus import build_menus, show_about
from app.worker import EngineBackend, EngineController
from engine.events import ChatMessage, Metrics, PrefillProgress, ReadProgress
from engine.settings import DecodeSettings, recommended_sampling

log = logging.getLogger(__name__)
CONFIRM_MS = 10_000  # how long a confirmation (exported to …) stays in the status bar

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
        # first run: sample as local chat apps do (0.7 / 0.9 / 40, a light repetition penalty), not greedy
        initial = settings_from_dict(self.prefs.value("decode/settings", "", type=str),
                                     DecodeSettings(sampling=recommended_sampling(None)))
        self.engine = EngineController(backend, initial, parent=self)
        build_window_layout(self, initial)
        build_menus(self)
        self.documents = ChatDocuments(self.repo, self.chips)
        self.controller = ChatController(self, self.engine, self.repo, self.documents, self.prefs)
        self._overflow_box: QMessageBox | None = None
        self.load_clock = LoadClock(self.status_label.setText, self)
        self.on_saved: Callable[[], None] | None = None  # called by shutdown once all is saved (run_app)
        self.quit_wait_ms = 30_000  # how long closing waits for the engine's step in flight (run_app: less)
        self._restore_geometry()
        self._wire()
        self.passages = PassagesPresenter(self)  # lists an answer's passages; the header's context meter
        self.controller.refresh_chats()
        self.controller.open_interrupted()
        self.memory.start(enabled=sample_memory)
        if model_spec:  # said at once; the load itself starts once the window is on screen
            self.set_status(f"Starting… the model ({model_spec}) loads once the window is up")
            self.show_load(None)
        else:
            self.set_status("No model loaded — choose one with Model…")
        self._after_paint = AfterFirstPaint(self, lambda: self._on_first_paint(model_spec, draft_spec))

    def _on_first_paint(self, model_spec: str | None, draft_spec: str) -> None:
        """The window is up: load the model (engine thread) and the plot's library (a daemon thread)."""
        if model_spec and not self.controller.closing:  # at the window it was last loaded with
            self.load_model(model_spec, draft_spec, self.controller.saved_context(model_spec))
        import_in_background("pyqtgraph", self.acceptance_panel.build_plot, self)

    # ----------------------------------------------------------------------------- state (the controller's)

    @property
    def model(self) -> ModelInfo | None:
        return self.controller.model

    @property
    def chat_id(self) -> int | None:
        return self.controller.chat_id

    @property
    def messages(self) -> list[ChatMessage]:
        return self.controller.messages

    def is_busy(self) -> bool:
        return self.controller.is_busy()

    def is_answering(self) -> bool:
        return bool(self.controller.jobs.stream)

    # ----------------------------------------------------------------------------- wiring

    def _wire(self) -> None:
        c, e = self.controller, self.engine
        self._relay = EngineRelay(e, c, parent=self)  # engine thread -> controller, on the GUI thread
        cl = self.chat_list
        cl.newRequested.connect(self.new_chat)
        cl.chatSelected.connect(self.open_chat)
        cl.renameRequested.connect(self._on_rename)
        cl.deleteRequested.connect(c.delete)
        cl.exportRequested.connect(self.export_chat)
        cl.searchChanged.connect(c.set_search)
        self.composer.sendRequested.connect(self.send)
        self.composer.stopRequested.connect(self.stop)
        self.composer.attachRequested.connect(self.attach_dialog)
        self.prefill_strip.cancelRequested.connect(self.stop)
        self.chips.removeRequested.connect(c.remove_document)
        self.chat_view.regenerateRequested.connect(self.regenerate)
        self.chat_view.retryRequested.connect(c.retry)
        self.chat_view.editRequested.connect(self.edit_question)
        sp = self.settings_panel
        sp.settingsChanged.connect(self._on_settings_changed)
        sp.colorLevelsChanged.connect(self.chat_view.set_color_levels)
        sp.systemPromptChanged.connect(lambda _text: c.set_system_prompt())
        sp.limitsChanged.connect(lambda mib, gib: apply_limits(e, self.prefs, mib, gib))
        sp.set_limits(self.prefs.value("limits/max_document_mib", DEFAULT_DOCUMENT_MIB, type=int),
                      self.prefs.value("limits/snapshot_cache_gib", DEFAULT_SNAPSHOT_GIB, type=int))
        apply_limits(e, self.prefs, *sp.limits(), save=False)
        self.model_button.clicked.connect(lambda: self.choose_model())
        self.load_cancel.clicked.connect(self.engine.cancel_load)
        app = QApplication.instance()
        if app is not None:
            app.styleHints().colorSchemeChanged.connect(self._on_color_scheme)  # bound: dropped with the window

    # ----------------------------------------------------------------------------- user actions

    def load_model(self, spec: str, draft: str = "ngram", context: int = 0) -> None:
        """Load `spec`; `context` past its trained context stretches it to that window (YaRN)."""
        self.controller.load_model(spec, draft, context)

    def new_chat(self) -> None:
        self.controller.new_chat()
        self.composer.edit.setFocus()

    def open_chat(self, chat_id: int) -> None:
        self.controller.open_chat(chat_id)

    def send(self, text: str) -> None:
        """Save the question, show it, and stream the answer."""
        self.settings_panel.flush()
        self.controller.send(text)

    def regenerate(self) -> None:
        self.controller.regenerate()

    def edit_question(self, position: int, text: str | None = None) -> None:
        """Ask the question at `position` differently (`text` None asks in a dialog; Cancel changes nothing)."""
        messages = self.controller.messages
        if text is None:
            if self.is_answering() or not 0 <= position < len(messages) or messages[position].role != "user":
                return
            text, ok = QInputDialog.getMultiLineText(self, "Edit question", "Ask instead:", messages[position].content)
            if not ok:
                return
        self.settings_panel.flush()
        self.controller.edit_question(position, text)

    def stop(self) -> None:
        """Esc / Stop / Cancel: stop the running answer or prefill."""
        self.controller.stop()
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
        self.controller.attach_files(list(paths))

    def show_settings(self, focus: Any = None) -> None:
        self.right.setCurrentWidget(self.settings_panel)
        self.right.show()
        (focus or self.settings_panel).setFocus()

    def choose_model(self, context: int | None = None) -> None:
        """The model picker; `context` plans for at least that many tokens (the overflow dialog's need)."""
        from app.model_picker import ModelPicker
        dialog = ModelPicker(self, current=self.model.spec if self.model else None, context=context,
                             current_window=self.model.context if self.model else 0)
        dialog.loadChosen.connect(self._on_model_chosen)
        dialog.open()
        self._picker = dialog

    def export_current(self) -> None:
        if self.chat_id is not None:
            self.export_chat(self.chat_id, "markdown")

    def export_chat(self, chat_id: int, fmt: str) -> None:
        """Save the chat as a file named after its title; the dialog confirms before overwriting."""
        default = str(Path.home() / export_file_name(self.repo.title(chat_id), fmt))
        kind = "Markdown (*.md)" if fmt == "markdown" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", default, kind)  # asks before overwriting
        if path:
            self.controller.export(chat_id, fmt, path)

    def show_about(self) -> None:
        self._about = show_about(self)

    def _on_model_chosen(self, spec: str, draft: str, context: int = 0) -> None:
        self.stop()
        self.load_model(spec, draft, context)

    def _on_rename(self, chat_id: int, title: str) -> None:
        self.controller.rename(chat_id, title)
        if chat_id == self.chat_id:
            self.title_label.setText(title)

    def _on_settings_changed(self, settings: DecodeSettings) -> None:
        self.controller.apply_settings(settings)
        self.cache_panel.set_settings(settings)

    def _on_overflow_action(self, key: str, overflow: Overflow) -> None:
        if key == "model":
            self.choose_model(overflow.context_to_ask_for)
        elif key == "answer-length":
            self.show_settings(self.settings_panel.max_new)
        elif key == "new-chat":
            self.new_chat()
        elif key == "passages":
            self.passages.attach_as_passages(overflow.paths)
        elif key == "stretch":
            self.controller.stretch_and_attach(overflow)

    # ----------------------------------------------------------------------------- WindowView

    def set_status(self, text: str) -> None:
        self.load_clock.stop()
        self.status_label.setText(text)

    def show_load_stage(self, stage: str) -> None:
        self.load_clock.stage(stage)  # the stage, and how long the load has taken so far

    def show_load(self, fraction: float | None) -> None:
        if fraction is None:
            self.load_bar.setRange(0, 0)
        else:
            self.load_bar.setRange(0, 1000)
            self.load_bar.setValue(round(1000 * fraction))
        self.load_bar.show()
        self.load_cancel.show()
        self.model_button.setEnabled(False)

    def hide_load(self) -> None:
        self.load_bar.hide()
        self.load_cancel.hide()
        self.model_button.setEnabled(True)

    def show_model(self, info: ModelInfo | None, settings: DecodeSettings | None) -> None:
        if info is None:
            self.model_button.setText("Model…")
            return
        self.chat_view.set_model_name(info.name)
        self.settings_panel.set_context(info.max_context)
        self.cache_panel.set_context(info.max_context)
        if settings is not None:
            self.settings_panel.set_settings(settings)
            self.cache_panel.set_settings(settings)
        self.model_button.setText(f"{info.name}  ▾")

    def show_chat(self, chat_id: int | None, title: str, stored: Any, retry_index: int | None) -> None:
        self.title_label.setText(title)
        self.chat_list.select(chat_id)
        if stored is None:
            return
        self.chat_view.show_stored(stored, retry_index)
        if hasattr(self, "passages"):  # another chat: its own meter, not the last one's passage sizes
            self.passages.forget()

    def set_chats(self, chats: Any, current: int | None) -> None:
        self.chat_list.set_chats([ChatEntry(c.id, c.title, _chat_subtitle(c)) for c in chats], current)

    def add_question(self, text: str, index: int) -> None:
        self.chat_view.add_message("user", text, store_index=index)

    def start_answer(self) -> None:
        self.acceptance_panel.start_answer()
        self.chat_view.start_answer()

    def append_answer(self, batch: TokenBatch) -> None:
        for piece in batch.pieces:
            self.chat_view.append_tokens(piece.text, int(piece.level))

    def end_answer(self, text: str | None, footer: str, retry: bool) -> None:
        self.chat_view.finish_answer(text, footer, retry=retry)

    def list_passages(self, passages: Any) -> None:
        self.chat_view.list_passages(passages)

    def remove_after(self, position: int) -> None:
        self.chat_view.truncate(position)

    def set_generating(self, on: bool) -> None:
        self.composer.set_generating(on)

    def show_progress(self, label: str | None, ev: PrefillProgress | ReadProgress | None = None) -> None:
        strip = self.prefill_strip
        if label is not None:
            strip.start(label)
        if isinstance(ev, PrefillProgress):
            strip.update_progress(ev.done, ev.total, ev.reused, ev.eta_s)
        elif isinstance(ev, ReadProgress):
            strip.update_reading(ev.name, ev.done, ev.total)

    def hide_progress(self) -> None:
        self.prefill_strip.finish()

    def show_metrics(self, m: Metrics) -> None:
        self.acceptance_panel.update_metrics(m)
        self.cache_panel.update_metrics(m)

    def show_prefill(self, ev: PrefillProgress) -> None:
        self.cache_panel.update_prefill(ev)

    def reset_live(self) -> None:
        self.acceptance_panel.reset()
        self.cache_panel.show_idle()

    def set_context_text(self, text: str) -> None:
        self.context_label.setText(text)
        if hasattr(self, "passages"):  # documents, messages or the model changed: so did the meter
            self.passages.refresh()

    def show_error(self, message: str, details: str = "", about: Any = ()) -> None:
        """User errors and bugs alike appear in the chat; the app keeps working. `about`: what the
        banner is about (file paths, "model"), so it goes when that is resolved."""
        if details:
            log.error("%s\n%s", message, details)
            message = f"{message}\n\n(The full traceback is in the log.)"
        self.chat_view.add_error(message, about)
        self.errorShown.emit(message)

    def show_notice(self, message: str, about: Any = ()) -> None:
        w = self.chat_view.add_message("notice", message)
        w.message.about = tuple(about)
        w.header.setText("Note")

    def confirm(self, message: str) -> None:
        self.statusBar().showMessage(message, CONFIRM_MS)

    def clear_banners(self, about: Any) -> None:
        self.chat_view.clear_banners(about)

    def show_overflow(self, overflow: Overflow) -> None:
        self._overflow_box = show_overflow_dialog(self, overflow, lambda key: self._on_overflow_action(key, overflow))

    def decode_settings(self) -> DecodeSettings:
        return self.settings_panel.settings()

    def system_prompt(self) -> str:
        return self.settings_panel.system_prompt()

    def show_settings_of_chat(self, saved: dict) -> None:
        self.settings_panel.set_settings(settings_from_dict(saved.get("decode", {}), self.settings_panel.settings()))
        self.settings_panel.set_system_prompt(saved.get("system", ""))
        self.cache_panel.set_settings(self.settings_panel.settings())

    def show_settings_error(self, message: str) -> None:
        self.settings_panel.show_error(message)

    def emit(self, name: str, value: Any) -> None:
        getattr(self, name).emit(value)

    # ----------------------------------------------------------------------------- look & Qt events

    def _restore_geometry(self) -> None:
        geometry, state = self.prefs.value("window/geometry"), self.prefs.value("window/splitter")
        if geometry is not None:
            self.restoreGeometry(geometry)
        if state is not None:
            self.splitter.restoreState(state)

    def _on_color_scheme(self, _scheme: object) -> None:
        app = QApplication.instance()
        if app is not None:
            self.colors = theme.apply_theme(app)
            self.chat_view.set_colors(self.colors)
            self.acceptance_panel.set_colors(self.colors)
            self.settings_panel.set_colors(self.colors)

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
        if paths:
            event.acceptProposedAction()
            self.attach_files(paths)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        self.shutdown()
        super().closeEvent(event)

    def shutdown(self) -> None:
        """Save the answer being written (marked interrupted), the settings and the window's layout,
        close the store, then stop the engine thread (quit + wait up to quit_wait_ms) and the sampler.
        Idempotent."""
        if self.controller.closing:
            return
        self.controller.shutdown()
        self.settings_panel.flush()
        self.prefs.setValue("window/geometry", self.saveGeometry())
        self.prefs.setValue("window/splitter", self.splitter.saveState())
        self.prefs.sync()
        self.repo.close()
        if self.on_saved is not None:
            self.on_saved()  # nothing is lost by exiting from here on
        self.engine.shutdown(self.quit_wait_ms)
        self.memory.stop(min(self.quit_wait_ms // 3, 5000))


def _chat_subtitle(c: Any) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
    return f"{c.message_count} messages · {when}"
