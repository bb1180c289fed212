"""Documents attached to the chat (chips with title and token count) and the prefill progress strip."""
from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt, Signal
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QLayout, QProgressBar, QPushButton, QSizePolicy,
                               QToolButton, QWidget, QWidgetItem)

from app.panels.common import fmt_seconds


class FlowLayout(QLayout):
    """Lays children left to right and wraps (Qt's classic flow-layout idea, written small)."""

    def __init__(self, parent: QWidget | None = None, spacing: int = 6) -> None:
        super().__init__(parent)
        self._items: list[QWidgetItem] = []
        self.setSpacing(spacing)
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item) -> None:  # noqa: N802 - Qt override
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, i: int):  # noqa: N802
        return self._items[i] if 0 <= i < len(self._items) else None

    def takeAt(self, i: int):  # noqa: N802
        return self._items.pop(i) if 0 <= i < len(self._items) else None

    def expandingDirections(self):  # noqa: N802
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802
        return self._layout(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802
        super().setGeometry(rect)
        self._layout(rect, move=True)

    def sizeHint(self) -> QSize:  # noqa: N802
        return self.minimumSize()

    def minimumSize(self) -> QSize:  # noqa: N802
        size = QSize()
        for item in self._items:
            size = size.expandedTo(item.minimumSize())
        m = self.contentsMargins()
        return size + QSize(m.left() + m.right(), m.top() + m.bottom())

    def _layout(self, rect: QRect, move: bool) -> int:
        x, y, line = rect.x(), rect.y(), 0
        space = self.spacing()
        for item in self._items:
            hint = item.sizeHint()
            if x + hint.width() > rect.right() and line > 0:
                x, y, line = rect.x(), y + line + space, 0
            if move:
                item.setGeometry(QRect(QPoint(x, y), hint))
            x += hint.width() + space
            line = max(line, hint.height())
        return y + line - rect.y()


class DocumentChip(QFrame):
    """One document: title, token count, a remove button."""

    removeRequested = Signal(object)

    def __init__(self, key: object, title: str, tokens: int | None, parent: QWidget | None = None,
                 fit: str = "whole") -> None:
        super().__init__(parent)
        self.key = key
        self.title = title
        self.fit = fit
        self.setObjectName("chip")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 3, 4, 3)
        lay.setSpacing(6)
        mark = QLabel("▤")
        mark.setObjectName("muted")
        lay.addWidget(mark)
        shown = title if len(title) <= 40 else title[:38] + "…"
        self.label = QLabel(shown)
        self.label.setToolTip(title)
        lay.addWidget(self.label)
        self.count = QLabel()
        self.count.setObjectName("muted")
        lay.addWidget(self.count)
        self.fit_label = QLabel(fit)  # "whole", or "passages": each answer is given the most relevant passages
        self.fit_label.setObjectName("muted")
        self.fit_label.setToolTip("The whole document goes into every prompt" if fit == "whole" else
                                  "Too long for the context: each question is answered from its most relevant passages")
        lay.addWidget(self.fit_label)
        self.close = QToolButton(text="✕")
        self.close.setToolTip("Remove this document from the chat")
        self.close.setCursor(Qt.CursorShape.PointingHandCursor)
        self.close.clicked.connect(lambda: self.removeRequested.emit(self.key))
        lay.addWidget(self.close)
        self.set_tokens(tokens)

    def set_tokens(self, tokens: int | None) -> None:
        self.tokens = tokens
        self.count.setText("counting…" if tokens is None else f"{tokens:,} tokens")

    def text(self) -> str:
        return f"{self.title} {self.count.text()} {self.fit}"


class DocumentChips(QWidget):
    """The row of chips above the input box (hidden when the chat has no documents)."""

    removeRequested = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._flow = FlowLayout(self)
        self.chips: list[DocumentChip] = []
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)
        self.hide()

    def add(self, key: object, title: str, tokens: int | None, fit: str = "whole") -> DocumentChip:
        chip = DocumentChip(key, title, tokens, self, fit)
        chip.removeRequested.connect(self.removeRequested.emit)
        self._flow.addWidget(chip)
        self.chips.append(chip)
        self.show()
        self.updateGeometry()
        return chip

    def find(self, key: object) -> DocumentChip | None:
        return next((c for c in self.chips if c.key == key), None)

    def remove(self, key: object) -> None:
        chip = self.find(key)
        if chip is not None:
            self._flow.removeWidget(chip)
            chip.deleteLater()
            self.chips.remove(chip)
        self.setVisible(bool(self.chips))
        self.updateGeometry()

    def clear(self) -> None:
        for chip in list(self.chips):
            self.remove(chip.key)

    def total_tokens(self) -> int:
        return sum(c.tokens or 0 for c in self.chips)


class PrefillStrip(QFrame):
    """'Reading <title>: done / total tokens · ETA' with a bar and a Cancel button."""

    cancelRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("progressStrip")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 6, 6, 6)
        lay.setSpacing(10)
        self.label = QLabel()
        self.label.setMinimumWidth(180)
        lay.addWidget(self.label)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setMaximumHeight(8)
        lay.addWidget(self.bar, 1)
        self.numbers = QLabel()
        self.numbers.setObjectName("muted")
        lay.addWidget(self.numbers)
        self.cancel = QPushButton("Cancel")
        self.cancel.setToolTip("Stop reading (Esc)")
        self.cancel.clicked.connect(self.cancelRequested.emit)
        lay.addWidget(self.cancel)
        self.done = 0
        self.total = 0
        self.hide()

    def start(self, what: str) -> None:
        self.label.setText(what)
        self.done = self.total = 0
        self.bar.setRange(0, 0)  # busy until the first numbers arrive
        self.numbers.setText("")
        self.cancel.setEnabled(True)
        self.show()

    def _set_fraction(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        self.bar.setRange(0, 1000)
        self.bar.setValue(round(1000 * done / total) if total else 1000)

    def update_progress(self, done: int, total: int, reused: int, eta_s: float | None) -> None:
        self._set_fraction(done, total)
        eta = f" · about {fmt_seconds(eta_s)} left" if eta_s is not None else ""
        cached = f" · {reused:,} reused" if reused else ""
        self.numbers.setText(f"{done:,} / {total:,} tokens{cached}{eta}")

    def update_reading(self, name: str, done: int, total: int) -> None:
        """Pages of a long PDF read so far (before its tokens can be counted and prefilled)."""
        self.label.setText(f"Reading {name}")
        self._set_fraction(done, total)
        self.numbers.setText(f"page {done:,} / {total:,}")

    def finish(self) -> None:
        self.hide()
