"""One message bubble: Markdown rendered without HTML, or an answer coloured by the level that
produced each piece; a header with Copy / Edit / Regenerate / Retry, and a footer saying how it ended.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QFontDatabase, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QTextBrowser, QToolButton, QVBoxLayout, QWidget

from app.theme import Colors

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
    retry: bool = False  # cut off by a crash, an error or a shutdown: offer to ask again
    about: tuple[str, ...] = ()  # a banner's cause (file paths, "model"): it goes when that is resolved


class MessageWidget(QFrame):
    """A bubble: a small header (who), the body, and a footer (speed, how it ended)."""

    regenerate = Signal()
    retry = Signal()
    edit = Signal()
    copyRequested = Signal(str)
    dismissed = Signal()

    def __init__(self, message: Message, c: Colors, header: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message = message
        self.passages_list: QWidget | None = None  # the passages it was given, listed under it
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
        self.retry_button = QToolButton(text="Retry")
        self.retry_button.setToolTip("This answer was cut off: ask the question again")
        self.retry_button.clicked.connect(self.retry.emit)
        self.retry_button.hide()
        self.edit_button = QToolButton(text="Edit")
        self.edit_button.setToolTip("Change this question and ask again (the messages after it are replaced)")
        self.edit_button.clicked.connect(self.edit.emit)
        self.edit_button.hide()
        for b in (self.copy_button, self.edit_button, self.regen_button, self.retry_button):
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
        elif msg.role == "assistant" and not msg.text:  # still waiting, or ended before the first token
            doc.setMarkdown("*(no answer)*" if msg.footer else "*…*", MARKDOWN_FEATURES)
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
