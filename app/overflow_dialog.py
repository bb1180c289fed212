"""The dialog shown when documents do not fit: what, by how much, and one button per way out.

The ways out come from `Overflow.actions()` (app/overflow.py); the window maps each action's key
to what it does, so a new one (e.g. answering from passages) needs no change here.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget

from app.overflow import Overflow


def show_overflow_dialog(parent: QWidget, overflow: Overflow, act: Callable[[str], None]) -> QMessageBox:
    """Open (window-modal, non-blocking) and return the dialog; `act(key)` runs the chosen action."""
    box = QMessageBox(QMessageBox.Icon.Warning, overflow.title(), overflow.text(), parent=parent)
    actions = overflow.actions()
    info = "Nothing was cut and nothing was added."  # the ways out are the buttons, listed once
    if overflow.stretch_to:  # what a stretch costs is said before it is picked, not only on hover
        info += "\n" + overflow.stretch_caveat()
    box.setInformativeText(info)
    buttons = {}
    for action in actions:
        role = QMessageBox.ButtonRole.AcceptRole if action.key == "model" else QMessageBox.ButtonRole.ActionRole
        button = box.addButton(action.label, role)
        button.setToolTip(action.hint[:1].upper() + action.hint[1:])
        buttons[button] = action.key
    box.addButton(QMessageBox.StandardButton.Close)
    box.setWindowModality(Qt.WindowModality.WindowModal)
    box.buttonClicked.connect(lambda b: act(buttons[b]) if b in buttons else None)
    box.open()
    return box
