"""Sliders, spin boxes and combo boxes take the mouse wheel only when focused.

Otherwise scrolling a panel changes whichever control passes under the pointer (a γ1 silently
set to 1, say). An unfocused control hands the wheel to the scroll area around it, which scrolls.
"""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import (QAbstractScrollArea, QAbstractSlider, QAbstractSpinBox, QApplication, QComboBox,
                               QWidget)

GUARDED = (QAbstractSlider, QAbstractSpinBox, QComboBox)


class WheelGuard(QObject):
    """Event filter: an unfocused control ignores the wheel, so it propagates to its parents."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.Wheel and isinstance(watched, QWidget) and not watched.hasFocus():
            area = _scroll_area(watched)
            if area is not None:  # scroll the panel instead (told directly: Qt does not pass on synthetic wheels)
                QApplication.sendEvent(area.verticalScrollBar(), event)
                return True
            event.ignore()  # not accepted: Qt offers it to the parent next
            return True  # and the control itself never sees it
        return False


def _scroll_area(widget: QWidget) -> QAbstractScrollArea | None:
    parent = widget.parentWidget()
    while parent is not None and not isinstance(parent, QAbstractScrollArea):
        parent = parent.parentWidget()
    return parent


def guard_wheel(root: QWidget) -> WheelGuard:
    """Guard every slider, spin box and combo box under `root` (they take focus by click or Tab)."""
    guard = WheelGuard(root)
    for kind in GUARDED:
        for control in root.findChildren(kind):
            control.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # the wheel alone never focuses it
            control.installEventFilter(guard)
    return guard
