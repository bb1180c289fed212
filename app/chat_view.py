"""The conversation: message bubbles rendered from Markdown (HTML disabled), the answer streaming in.

Each message is a read-only QTextBrowser sized to its document. The streaming answer is
re-rendered at most once per event-loop turn (the worker already coalesces tokens to ~20 Hz).
With "colour by level" on, an answer shows as plain text with each piece coloured by the
level (L0 drafter, L1 retrieval, L2 full cache) that produced it.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QHBoxLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from app.chat_repo import segments_from_spans
from app.passages_fit import CitedPassage
from app.passages_view import PassagesList
from app.message_widget import LEVEL_NAMES, MARKDOWN_FEATURES, Message, MessageWidget, render_markdown  # noqa: F401
from app.theme import Colors, colors

FOOTER_BY_STATE = {"stopped": "stopped — partial answer", "interrupted": "interrupted — partial answer",
                   "streaming": "interrupted — partial answer"}

class EmptyState(QWidget):
    """What an empty chat shows: the mark and how to start."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        from app.icons import app_icon
        lay = QVBoxLayout(self)
        lay.addStretch(2)
        logo = QLabel()
        logo.setPixmap(app_icon().pixmap(QSize(96, 96)))
        logo.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay.addWidget(logo)
        title = QLabel("Chat with a whole book")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        f = title.font()
        f.setPointSizeF(f.pointSizeF() * 1.6)
        f.setBold(True)
        title.setFont(f)
        lay.addWidget(title)
        hint = QLabel("Drop a novel, a manual or a contract anywhere in this window, then ask about it.\n"
                      "Attach with Ctrl+O  ·  New chat with Ctrl+N  ·  Stop with Esc")
        hint.setObjectName("muted")
        hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        hint.setWordWrap(True)
        lay.addWidget(hint)
        lay.addStretch(3)


class ChatView(QScrollArea):
    """A scrolling column of message bubbles; follows the bottom while an answer streams."""

    regenerateRequested = Signal()
    retryRequested = Signal()  # the last question was cut off: ask it again
    editRequested = Signal(int)  # the question's position among the chat's user/assistant messages
    passageClicked = Signal(object)  # a CitedPassage in the list under an answer

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("conversation")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._colors = colors()
        self._color_levels = False
        self._model_name = "Assistant"
        self._widgets: list[MessageWidget] = []
        self._streaming: MessageWidget | None = None
        self._follow = True
        inner = QWidget()
        inner.setObjectName("conversation")
        self._column = QVBoxLayout(inner)
        self._column.setContentsMargins(24, 18, 24, 18)
        self._column.setSpacing(12)
        self._empty = EmptyState()
        self._column.addWidget(self._empty, 1)
        self._column.addStretch(0)
        self.setWidget(inner)
        self._render_timer = QTimer(self, singleShot=True, interval=0)
        self._render_timer.timeout.connect(self._render_streaming)
        bar = self.verticalScrollBar()
        bar.rangeChanged.connect(self._on_range_changed)
        bar.valueChanged.connect(self._on_scrolled)

    # --- public API ----------------------------------------------------------------------

    @property
    def messages(self) -> list[Message]:
        return [w.message for w in self._widgets]

    def set_colors(self, c: Colors) -> None:
        self._colors = c
        for w in self._widgets:
            w._colors = c
            w.render()

    def set_model_name(self, name: str) -> None:
        """Answers are headed with the model's name; those shown before it was known (a chat reopened
        at start, before the model loaded) get it now."""
        placeholder, self._model_name = self._model_name, name or "Assistant"
        for w in self._widgets:
            if w.message.role == "assistant" and w.header.text() in (placeholder, "Assistant"):
                w.header.setText(self._model_name)

    def set_color_levels(self, on: bool) -> None:
        self._color_levels = on
        for w in self._widgets:
            w.set_color_levels(on)

    def clear(self) -> None:
        self._render_timer.stop()
        self._streaming = None
        for w in list(self._widgets):
            self._remove(w)
        self._empty.show()
        self._follow = True

    def add_message(self, role: str, text: str, footer: str = "", store_index: int | None = None,
                    segments: list[tuple[str, int]] | None = None) -> MessageWidget:
        return self._add(Message(role, text, footer, list(segments or []), store_index=store_index))

    def show_stored(self, stored: Any, retry_index: int | None = None) -> None:
        """Show a chat's stored messages (engine.api.Message); each answer's footer says how it
        ended; `retry_index` marks the question a crash or an error cut off."""
        self.clear()
        for m in stored:
            if m.role not in ("user", "assistant"):
                continue
            state = getattr(m, "state", "done")
            footer = str(m.stats.get("footer", ""))
            if state != "done" and not footer or state in ("interrupted", "streaming") and "interrupted" not in footer \
                    and "error" not in footer:
                footer = FOOTER_BY_STATE.get(state, footer)
            w = self.add_message(m.role, m.text, footer, store_index=m.idx,
                                 segments=segments_from_spans(m.text, m.level_spans))
            if m.role == "assistant" and getattr(m, "passages", None) is not None:
                self.add_passages(w, [CitedPassage(**p) for p in m.passages])
        if retry_index is not None:
            self.offer_retry(retry_index)

    def add_error(self, text: str, about: Any = ()) -> MessageWidget:
        """An error banner; `about` (file paths, "model") lets clear_banners take it away later."""
        return self._add(Message("error", text, about=tuple(about)))

    def clear_banners(self, about: Any) -> None:
        """Remove the error and notice banners about any of `about` (their cause is gone)."""
        keys = set(about)
        for w in [w for w in self._widgets if w.message.role in ("error", "notice") and keys & set(w.message.about)]:
            self._remove(w)

    def start_answer(self) -> MessageWidget:
        """An empty assistant bubble that `append_tokens` fills."""
        self._streaming = w = self._add(Message("assistant", ""))
        self._follow = True
        self._update_actions()
        return w

    def append_tokens(self, text: str, level: int) -> None:
        w = self._streaming
        if w is None or not text:
            return
        w.message.text += text
        segs = w.message.segments
        if segs and segs[-1][1] == int(level):
            segs[-1] = (segs[-1][0] + text, int(level))
        else:
            segs.append((text, int(level)))
        self._render_timer.start()

    def finish_answer(self, text: str | None, footer: str, retry: bool = False) -> MessageWidget | None:
        """Close the streaming bubble with the final text (None keeps what streamed); `retry` offers
        to ask again (an error cut it off)."""
        w = self._streaming
        self._streaming = None
        self._render_timer.stop()
        if w is None:
            return None
        if text is not None and text != w.message.text:
            from app.answer_recorder import fit_segments
            w.message.text = text
            w.message.segments = fit_segments(w.message.segments, text)
        w.message.footer = footer
        w.message.retry = retry
        w.render()
        self._update_actions()
        return w

    def list_passages(self, passages: Any) -> PassagesList | None:
        """List `passages` under the last answer (the one just finished)."""
        answers = [w for w in self._chat_widgets() if w.message.role == "assistant"]
        return self.add_passages(answers[-1], passages) if answers else None

    def add_passages(self, w: MessageWidget, passages: Any) -> PassagesList:
        """List the passages an answer was given under its bubble (a click emits passageClicked)."""
        listing = PassagesList(passages, w)
        listing.passageClicked.connect(self.passageClicked.emit)
        w.layout().addWidget(listing)
        listing.show()  # added after the bubble was shown
        w.passages_list = listing
        return listing

    @property
    def passage_lists(self) -> list[PassagesList]:
        """The passage lists under the answers on screen, in order."""
        return [w.passages_list for w in self._widgets if w.passages_list is not None]

    def offer_retry(self, store_index: int) -> None:
        """The question stored at `store_index` was cut off (crash, kill, shutdown): mark its answer
        "interrupted" with Retry, adding an empty one when no answer was saved at all."""
        chat = self._chat_widgets()
        question = next((w for w in chat if w.message.role == "user" and w.message.store_index == store_index), None)
        if question is None:
            return
        after = chat[chat.index(question) + 1:]
        answer = after[0] if after and after[0].message.role == "assistant" else None
        if answer is None:
            answer = self._add(Message("assistant", "", "interrupted — no answer was saved"))
        elif "interrupted" not in answer.message.footer and "error" not in answer.message.footer:
            answer.message.footer = "interrupted — partial answer"
        answer.message.retry = True
        answer.render()
        self._update_actions()

    def drop_streaming(self) -> None:
        """Remove the streaming bubble (nothing came out)."""
        w = self._streaming
        self._streaming = None
        if w is not None:
            self._remove(w)

    def remove_last(self, role: str) -> None:
        if self._widgets and self._widgets[-1].message.role == role:
            self._remove(self._widgets[-1])

    def streaming_text(self) -> str:
        return self._streaming.message.text if self._streaming else ""

    def all_text(self) -> str:
        return "\n\n".join(w.body.toPlainText() for w in self._widgets)

    # --- internals -----------------------------------------------------------------------

    def _add(self, message: Message) -> MessageWidget:
        header = {"user": "You", "assistant": self._model_name, "error": "Could not do that",
                  "notice": "Note"}.get(message.role, message.role)
        w = MessageWidget(message, self._colors, header)
        w.set_color_levels(self._color_levels)
        w.regenerate.connect(self.regenerateRequested.emit)
        w.retry.connect(self.retryRequested.emit)
        w.edit.connect(lambda: self._edit_clicked(w))
        w.dismissed.connect(lambda: self._remove(w) if w in self._widgets else None)
        w.copyRequested.connect(lambda text: QGuiApplication.clipboard().setText(text))
        self._empty.hide()
        row: QWidget = w
        if message.role == "user":  # user bubbles sit on the right, shrunk to their text
            row = QWidget()
            hl = QHBoxLayout(row)
            hl.setContentsMargins(0, 0, 0, 0)
            hl.addStretch(1)
            hl.addWidget(w)
        self._column.insertWidget(self._column.count() - 1, row)
        self._widgets.append(w)
        w.fit(self._content_width(message.role))
        self._update_actions()
        return w

    def _remove(self, w: MessageWidget) -> None:
        row = w.parentWidget() if w.message.role == "user" else w
        self._column.removeWidget(row)
        row.deleteLater()
        self._widgets.remove(w)
        if not self._widgets:
            self._empty.show()
        self._update_actions()

    def _chat_widgets(self) -> list[MessageWidget]:
        return [w for w in self._widgets if w.message.role in ("user", "assistant")]

    def _edit_clicked(self, w: MessageWidget) -> None:
        chat = self._chat_widgets()
        if w in chat:
            self.editRequested.emit(chat.index(w))

    def truncate(self, position: int) -> None:
        """Remove the user/assistant message at `position` and every bubble after it."""
        chat = self._chat_widgets()
        if not 0 <= position < len(chat):
            return
        first = self._widgets.index(chat[position])
        for w in list(self._widgets[first:]):
            if w is self._streaming:
                self._streaming = None
            self._remove(w)

    def _update_actions(self) -> None:
        chat = self._chat_widgets()
        last = chat[-1] if chat else None
        idle = self._streaming is None
        for w in self._widgets:
            retry = w is last and w.message.retry and idle
            w.retry_button.setVisible(retry)
            w.regen_button.setVisible(w is last and w.message.role == "assistant" and idle and not retry)
            w.edit_button.setVisible(w.message.role == "user" and idle)

    def _content_width(self, role: str) -> int:
        width = self.viewport().width() - 48
        return int(width * 0.8) if role == "user" else width

    def _render_streaming(self) -> None:
        if self._streaming is not None:
            self._streaming.render()
            self._streaming.fit(self._content_width("assistant"))

    def _on_range_changed(self, _low: int, high: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(high)

    def _on_scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._follow = value >= bar.maximum() - 24

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        for w in self._widgets:
            w.fit(self._content_width(w.message.role))
