"""Helpers for GUI tests: a GUI-thread heartbeat and simulated file drops."""
from __future__ import annotations

import time
from pathlib import Path


class Heartbeat:
    """A 10 ms QTimer on the GUI thread; `max_gap_ms` is the longest the event loop went without it."""

    def __init__(self) -> None:
        from PySide6.QtCore import QTimer
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._beat)
        self.gaps: list[float] = []
        self._last = 0.0

    def _beat(self) -> None:
        now = time.perf_counter()
        if self._last:
            self.gaps.append((now - self._last) * 1000)
        self._last = now

    def start(self) -> None:
        self._last = 0.0
        self.gaps.clear()
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def pause(self) -> None:
        """Stop measuring (e.g. while the test itself holds the GUI thread for a screenshot)."""
        self.timer.stop()
        self._last = 0.0

    def resume(self) -> None:
        self._last = 0.0
        self.timer.start()

    @property
    def max_gap_ms(self) -> float:
        return max(self.gaps, default=0.0)


def drop_files(widget, paths: list[Path]) -> None:
    """Simulate dragging `paths` from a file manager and dropping them on `widget`."""
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDragEnterEvent, QDropEvent
    from PySide6.QtWidgets import QApplication

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    enter = QDragEnterEvent(pos.toPoint(), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, enter)
    assert enter.isAccepted(), "the window refused the drag"
    drop = QDropEvent(pos, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, drop)
