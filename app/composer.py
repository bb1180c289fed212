"""The input box: Enter sends, Shift+Enter adds a line; Attach on the left, Send/Stop on the right."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPlainTextEdit, QPushButton, QSizePolicy, QWidget


class ComposerEdit(QPlainTextEdit):
    submitted = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("composerEdit")
        self.setPlaceholderText("Ask about your documents…  (Enter to send, Shift+Enter for a new line)")
        self.setTabChangesFocus(True)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().documentLayout().documentSizeChanged.connect(lambda _s: self._fit())
        self._fit()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt override
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
                event.modifiers() & (Qt.KeyboardModifier.ShiftModifier | Qt.KeyboardModifier.ControlModifier
                                     | Qt.KeyboardModifier.AltModifier)):
            self.submitted.emit()
            return
        super().keyPressEvent(event)

    def _fit(self) -> None:
        # grow with the text up to ~8 lines, then scroll
        line = self.fontMetrics().lineSpacing()
        wanted = max(1, int(self.document().size().height()))
        lines = min(8, wanted)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded if wanted > 8
                                        else Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFixedHeight(lines * line + 22)


class Composer(QFrame):
    """Emits `sendRequested(text)`, `stopRequested()`, `attachRequested()`."""

    sendRequested = Signal(str)
    stopRequested = Signal()
    attachRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("composer")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.setSpacing(6)
        self.attach = QPushButton("Attach")
        self.attach.setToolTip("Add a document to this chat (Ctrl+O) — or drop files anywhere in the window")
        self.attach.clicked.connect(self.attachRequested.emit)
        lay.addWidget(self.attach, 0, Qt.AlignmentFlag.AlignBottom)
        self.edit = ComposerEdit()
        self.edit.submitted.connect(self._on_submit)
        self.edit.textChanged.connect(self._update_send)
        lay.addWidget(self.edit, 1)
        self.send = QPushButton("Send")
        self.send.setObjectName("primary")
        self.send.setToolTip("Send (Enter)")
        self.send.clicked.connect(self._on_submit)
        lay.addWidget(self.send, 0, Qt.AlignmentFlag.AlignBottom)
        self.stop = QPushButton("Stop")
        self.stop.setObjectName("danger")
        self.stop.setToolTip("Stop the answer (Esc)")
        self.stop.clicked.connect(self.stopRequested.emit)
        self.stop.hide()
        lay.addWidget(self.stop, 0, Qt.AlignmentFlag.AlignBottom)
        self._generating = False
        self._update_send()

    def set_generating(self, on: bool) -> None:
        self._generating = on
        self.send.setVisible(not on)
        self.stop.setVisible(on)
        self._update_send()

    def text(self) -> str:
        return self.edit.toPlainText()

    def set_text(self, text: str) -> None:
        self.edit.setPlainText(text)

    def _update_send(self) -> None:
        self.send.setEnabled(not self._generating and bool(self.edit.toPlainText().strip()))

    def _on_submit(self) -> None:
        text = self.edit.toPlainText().strip()
        if not text or self._generating:
            return
        self.edit.clear()
        self.sendRequested.emit(text)
