"""Answers from passages, on screen: the list of passages under an answer (a click shows one),
and the presenter that feeds it and the header's context meter.

The presenter is a QObject on the GUI thread: the engine thread's `PassagesUsed` (sent before the
answer's first token) arrives here queued and sizes the context meter; the controller keeps the
passages with the answer in the store, and the chat view lists them under it, live and on reopen.
"""
from __future__ import annotations

from typing import Any, Sequence

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFrame, QLabel, QTextBrowser, QVBoxLayout, QWidget

from app.context_meter import context_budget
from app.elided import ElidedToolButton
from app.message_widget import render_markdown
from app.theme import colors
from app.passages_fit import PASSAGES, CitedPassage, PassagesUsed, fit_of


class PassagesList(QFrame):
    """'Answered from 12 passages:' then one link per passage: its place and first words."""

    passageClicked = Signal(object)  # CitedPassage

    def __init__(self, passages: Sequence[CitedPassage], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("passagesList")
        self.passages = tuple(passages)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.setSpacing(0)
        titles = sorted({p.document for p in self.passages})
        head = QLabel(f"Answered from {len(self.passages)} passage{'s' if len(self.passages) != 1 else ''} of "
                      + ", ".join(f"“{t}”" for t in titles) + " (click one to read it):" if self.passages else
                      "No passage shares a word with this question: it was answered without the document.")
        head.setObjectName("muted")
        head.setWordWrap(True)
        lay.addWidget(head)
        self.links: list[ElidedToolButton] = []
        for passage in self.passages:
            link = ElidedToolButton(f"{passage.label} — {passage.first_words}")  # cut with "…" to fit
            link.setAutoRaise(True)
            link.setCursor(Qt.CursorShape.PointingHandCursor)
            link.setToolTip(passage.text[:400])
            link.clicked.connect(lambda _checked=False, p=passage: self.passageClicked.emit(p))
            lay.addWidget(link)
            self.links.append(link)


def passage_markdown(passage: CitedPassage) -> str:
    """The passage as Markdown under a heading with its document and place (its own Markdown kept)."""
    return f"## {passage.document} — {passage.label}\n\n{passage.text}"


def show_passage(parent: QWidget, passage: CitedPassage) -> QDialog:
    """A non-modal dialog with the passage's text, titled with its document and place."""
    dialog = QDialog(parent)
    dialog.setWindowTitle(f"{passage.document} — {passage.label}")
    lay = QVBoxLayout(dialog)
    body = QTextBrowser()
    body.setOpenExternalLinks(False)
    render_markdown(body.document(), passage_markdown(passage), colors())
    lay.addWidget(body)
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
    buttons.rejected.connect(dialog.close)
    lay.addWidget(buttons)
    dialog.resize(640, 480)
    dialog.open()
    return dialog


class PassagesPresenter(QObject):
    """Lists an answer's passages under it and keeps the context meter up to date."""

    def __init__(self, window: Any) -> None:
        super().__init__(window)
        self.window = window
        self.pending: PassagesUsed | None = None  # given to the answer being written
        self.last: PassagesUsed | None = None  # given to the last answer
        self.dialog: QDialog | None = None
        self.passage_tokens: dict[str, int] = {}  # title -> tokens its last selection took
        window.engine.engineEvent.connect(self._on_engine_event)
        window.answerFinished.connect(self._on_answer_finished)
        window.chat_view.passageClicked.connect(self._show)
        for signal in (window.modelReady, window.prefillFinished, window.documentAdded,
                       window.composer.edit.textChanged, window.chips.removeRequested,
                       window.chat_list.chatSelected, window.chat_list.newRequested):
            signal.connect(lambda *_: self.refresh())

    def attach_as_passages(self, paths: Sequence[str]) -> None:
        """The overflow dialog's third way out: add the files anyway, answered from their passages."""
        self.window.engine.fit_as_passages(paths)
        self.window.attach_files(list(paths))

    def forget(self) -> None:
        """Another chat is shown: no passage sizes or pending passages of the last one."""
        self.pending = self.last = None
        self.passage_tokens = {}
        self.refresh()

    def refresh(self) -> None:
        """Recompute the meter from what the next prompt would hold."""
        w = self.window
        model = w.controller.model
        if model is None:
            w.context_meter.show_budget(None)
            return
        docs = [(a.document.title, fit_of(a.document), a.tokens) for a in w.controller.documents]
        history = [m.content for m in w.controller.messages]
        system = w.system_prompt() or ""
        budget = context_budget(model.max_context, system, docs, history, w.composer.edit.toPlainText(),
                                w.decode_settings().max_new_tokens, self.passage_tokens)
        w.context_meter.show_budget(budget)

    def _on_engine_event(self, _job: int, ev: Any) -> None:
        if isinstance(ev, PassagesUsed):
            self.pending = ev
            self.passage_tokens = {title: tokens for title, fit, tokens in ev.document_tokens if fit == PASSAGES}
            self.refresh()

    @property
    def lists(self) -> list[PassagesList]:
        """The passage lists under the answers on screen (the controller puts each under its answer)."""
        return self.window.chat_view.passage_lists

    def _on_answer_finished(self, _ev: Any) -> None:
        used, self.pending = self.pending, None
        if used is not None:
            self.last = used
        self.refresh()

    def _show(self, passage: CitedPassage) -> None:
        self.dialog = show_passage(self.window, passage)
