"""The conversation: message bubbles rendered from Markdown (HTML disabled), the answer streaming in.

Each message is a read-only QTextBrowser sized to its document. The streaming answer is
re-rendered at most once per event-loop turn (the worker already coalesces tokens to ~20 Hz).
With "colour by level" on, an answer shows as plain text with each piece coloured by the
level (L0 drafter, L1 retrieval, L2 full cache) that produced it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import (QColor, QFontDatabase, QGuiApplication, QTextBlockFormat, QTextCharFormat, QTextCursor,
                           QTextDocument, QTextFormat)
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QScrollArea, QSizePolicy, QTextBrowser, QToolButton,
                               QVBoxLayout, QWidget)

from app.theme import Colors, colors

MARKDOWN_FEATURES = QTextDocument.MarkdownFeature(
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub.value | QTextDocument.MarkdownFeature.MarkdownNoHTML.value)
LEVEL_NAMES = ("L0 drafter", "L1 retrieval cache", "L2 full cache")


def render_markdown(doc: QTextDocument, text: str, c: Colors) -> None:
    """Fill `doc` from Markdown with raw HTML disabled; code gets a fixed-pitch font and a tint."""
    doc.setMarkdown(text, MARKDOWN_FEATURES)
    mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    block = doc.begin()
    while block.isValid():
        fmt = block.blockFormat()
        if fmt.hasProperty(QTextFormat.Property.BlockCodeFence) or fmt.nonBreakableLines():
            cursor = QTextCursor(block)
            bfmt = QTextBlockFormat(fmt)
            bfmt.setBackground(QColor(c.code_background))
            bfmt.setLeftMargin(8)
            bfmt.setRightMargin(8)
            cursor.setBlockFormat(bfmt)
            cursor.select(QTextCursor.SelectionType.BlockUnderCursor)
            cursor = QTextCursor(block)
            cursor.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
            cfmt = QTextCharFormat()
            cfmt.setFont(mono)
            cursor.mergeCharFormat(cfmt)
        else:
            # inline `code` spans: Qt marks them fixed-pitch; give them the real monospace family
            it = block.begin()
            while not it.atEnd():
                frag = it.fragment()
                if frag.isValid() and frag.charFormat().fontFixedPitch():
                    cursor = QTextCursor(doc)
                    cursor.setPosition(frag.position())
                    cursor.setPosition(frag.position() + frag.length(), QTextCursor.MoveMode.KeepAnchor)
                    cfmt = QTextCharFormat()
                    cfmt.setFontFamilies([mono.family()])
                    cfmt.setBackground(QColor(c.code_background))
                    cursor.mergeCharFormat(cfmt)
                it += 1
        block = block.next()


class MessageBody(QTextBrowser):
    """A read-only document that sizes itself to its content (no inner scrollbars)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setOpenExternalLinks(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.viewport().setAutoFillBackground(False)
        self.setStyleSheet("QTextBrowser { background: transparent; border: none; }")
        self.document().setDocumentMargin(2)
        self._max_width = 600
        self._shrink = False

    def fit(self, max_width: int, shrink: bool) -> None:
        """Lay out for `max_width`; `shrink` narrows the box to the text (short user messages)."""
        self._max_width, self._shrink = max(80, max_width), shrink
        doc = self.document()
        doc.setTextWidth(self._max_width)
        width = self._max_width
        if shrink:
            width = min(self._max_width, math.ceil(doc.idealWidth()) + 2)
            doc.setTextWidth(width)
        height = math.ceil(doc.size().height())
        self.setFixedSize(width, height)

    def refit(self) -> None:
        self.fit(self._max_width, self._shrink)


@dataclass
class Message:
    """One displayed message. `segments` keep (text, level) for the colour-by-level view."""

    role: str  # "user", "assistant", "error", "notice"
    text: str
    footer: str = ""
    segments: list[tuple[str, int]] = field(default_factory=list)
    store_index: int | None = None


class MessageWidget(QFrame):
    """A bubble: a small header (who), the body, and a footer (speed, how it ended)."""

    regenerate = Signal()
    edit = Signal()
    copyRequested = Signal(str)
    dismissed = Signal()

    def __init__(self, message: Message, c: Colors, header: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message = message
        self._colors = c
        self._color_levels = False
        names = {"user": "userBubble", "assistant": "answerBubble", "error": "errorBubble", "notice": "noticeBubble"}
        self.setObjectName(names.get(message.role, "answerBubble"))
        lay = QVBoxLayout(self)
        lay.setContentsMargins(14, 8, 14, 8)
        lay.setSpacing(4)
        top = QHBoxLayout()
        top.setSpacing(6)
        self.header = QLabel(header)
        self.header.setObjectName("muted")
        font = self.header.font()
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 0.85)
        self.header.setFont(font)
        top.addWidget(self.header)
        top.addStretch(1)
        self.copy_button = QToolButton(text="Copy")
        self.copy_button.setObjectName("muted")
        self.copy_button.setToolTip("Copy this message as Markdown")
        self.copy_button.clicked.connect(lambda: self.copyRequested.emit(self.message.text))
        self.regen_button = QToolButton(text="Regenerate")
        self.regen_button.setToolTip("Answer this question again")
        self.regen_button.clicked.connect(self.regenerate.emit)
        self.regen_button.hide()
        self.edit_button = QToolButton(text="Edit")
        self.edit_button.setToolTip("Change this question and ask again (the messages after it are replaced)")
        self.edit_button.clicked.connect(self.edit.emit)
        self.edit_button.hide()
        for b in (self.copy_button, self.edit_button, self.regen_button):
            b.setCursor(Qt.CursorShape.PointingHandCursor)
            top.addWidget(b)
        self.dismiss_button = QToolButton(text="✕")
        self.dismiss_button.setToolTip("Dismiss")
        self.dismiss_button.clicked.connect(self.dismissed.emit)
        top.addWidget(self.dismiss_button)
        if message.role in ("error", "notice"):
            self.copy_button.hide()
        else:
            self.dismiss_button.hide()
        lay.addLayout(top)
        self.body = MessageBody(self)
        if message.role == "error":
            self.body.setStyleSheet(f"QTextBrowser {{ background: transparent; border: none; color: {c.error_text}; }}")
        lay.addWidget(self.body)
        self.footer = QLabel()
        self.footer.setObjectName("muted")
        ffont = self.footer.font()
        ffont.setPointSizeF(ffont.pointSizeF() * 0.85)
        self.footer.setFont(ffont)
        self.footer.setVisible(False)
        lay.addWidget(self.footer)
        self.render()

    def set_color_levels(self, on: bool) -> None:
        if on != self._color_levels:
            self._color_levels = on
            self.render()

    def render(self) -> None:
        msg, doc = self.message, self.body.document()
        if msg.role == "assistant" and self._color_levels and msg.segments:
            doc.clear()
            cursor = QTextCursor(doc)
            for text, level in msg.segments:
                fmt = QTextCharFormat()
                fmt.setForeground(QColor(self._colors.level(level)))
                fmt.setToolTip(LEVEL_NAMES[level])
                cursor.insertText(text, fmt)
        elif msg.role in ("error", "notice"):
            doc.setPlainText(msg.text)
        elif msg.role == "assistant" and not msg.text:
            doc.setMarkdown("*…*", MARKDOWN_FEATURES)
        else:
            render_markdown(doc, msg.text, self._colors)
        self.footer.setText(msg.footer)
        self.footer.setVisible(bool(msg.footer))
        self.body.refit()

    def fit(self, width: int) -> None:
        shrink = self.message.role == "user"
        inner = width - 28
        self.body.fit(inner, shrink)
        if shrink:
            self.setMaximumWidth(max(self.body.width() + 28, 160))


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
    editRequested = Signal(int)  # the question's position among the chat's user/assistant messages

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
        self._model_name = name or "Assistant"

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

    def add_error(self, text: str) -> MessageWidget:
        return self._add(Message("error", text))

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

    def finish_answer(self, text: str | None, footer: str) -> MessageWidget | None:
        """Close the streaming bubble with the final text (None keeps what streamed)."""
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
        w.render()
        self._update_actions()
        return w

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
            w.regen_button.setVisible(w is last and w.message.role == "assistant" and idle)
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
