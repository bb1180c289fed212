"""Small building blocks shared by the live panels: a titled card, a labelled bar, formatting."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QProgressBar, QVBoxLayout, QWidget

from app.formatting import fmt_bytes, fmt_rate, fmt_seconds, fmt_tokens  # noqa: F401 - re-exported

BAR_SCALE = 1000  # QProgressBar is integer-valued: show fractions in 0.1% steps


class Card(QFrame):
    """A titled, rounded box; `body` is a vertical layout for content."""

    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("card")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(12, 10, 12, 12)
        outer.setSpacing(8)
        self.title = QLabel(title.upper())
        self.title.setObjectName("sectionTitle")
        outer.addWidget(self.title)
        self.body = outer


class LabelledBar(QWidget):
    """Name on the left, value on the right, a thin bar below, an optional detail line."""

    def __init__(self, name: str, level: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(6)
        grid.setVerticalSpacing(3)
        self.name = QLabel(name)
        self.value = QLabel("–")
        self.value.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.bar = QProgressBar()
        self.bar.setRange(0, BAR_SCALE)
        self.bar.setValue(0)
        self.bar.setTextVisible(False)
        self.bar.setMaximumHeight(8)
        if level:
            self.bar.setProperty("level", level)
        self.detail = QLabel("")  # callers break lines themselves: wrapped labels misreport height in grids
        self.detail.setObjectName("muted")
        f = self.detail.font()
        f.setPointSizeF(f.pointSizeF() * 0.88)
        self.detail.setFont(f)
        grid.addWidget(self.name, 0, 0)
        grid.addWidget(self.value, 0, 1)
        grid.addWidget(self.bar, 1, 0, 1, 2)
        grid.addWidget(self.detail, 2, 0, 1, 2)
        self.detail.hide()

    def set(self, fraction: float | None, value: str, detail: str = "") -> None:
        frac = 0.0 if fraction is None else max(0.0, min(1.0, fraction))
        self.bar.setValue(round(frac * BAR_SCALE))
        self.value.setText(value)
        self.detail.setText(detail)
        self.detail.setVisible(bool(detail))

    def fraction(self) -> float:
        return self.bar.value() / BAR_SCALE
