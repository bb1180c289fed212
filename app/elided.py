"""A label and a link button that show their text cut with "…" when it is wider than they are,
instead of widening their column or being clipped mid-letter. `text()` stays the whole text."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QSizePolicy, QStyle, QStyleOptionToolButton, QStylePainter, QToolButton

MIN_WIDTH = 40  # what either may shrink to (a few letters and the ellipsis)


class ElidedLabel(QLabel):
    """One line of text, cut at the right with "…" to the label's width; never asks for more room
    than MIN_WIDTH, so a long chat title cannot push the chat list narrower."""

    def __init__(self, text: str = "", parent=None) -> None:
        super().__init__(text, parent)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(MIN_WIDTH, super().minimumSizeHint().height())

    def shown_text(self) -> str:
        """The text as painted: whole, or cut with "…" to fit."""
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, self.contentsRect().width())

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        self.style().drawItemText(painter, self.contentsRect(), int(self.alignment() | Qt.AlignmentFlag.AlignVCenter),
                                  self.palette(), self.isEnabled(), self.shown_text(), self.foregroundRole())


class ElidedToolButton(QToolButton):
    """A flat link-like button whose one-line text is cut with "…" to the button's width."""

    def __init__(self, text: str = "", parent=None) -> None:
        super().__init__(parent)
        self.setText(text)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(MIN_WIDTH, super().minimumSizeHint().height())

    def shown_text(self) -> str:
        """The text as painted: whole, or cut with "…" to fit."""
        room = self.width() - 2 * self.style().pixelMetric(QStyle.PixelMetric.PM_ButtonMargin, None, self) - 8
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, max(0, room))

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt override
        painter = QStylePainter(self)
        option = QStyleOptionToolButton()
        self.initStyleOption(option)
        option.text = self.shown_text()
        painter.drawComplexControl(QStyle.ComplexControl.CC_ToolButton, option)
