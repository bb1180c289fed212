"""What the window does once it is on screen, not before: start loading the model and import the
heavy libraries the panels need (pyqtgraph) on a background thread, so the first frame never
waits on them."""
from __future__ import annotations

import importlib
import logging
import threading
from typing import Any, Callable

from PySide6.QtCore import QEvent, QObject, QTimer, Signal

log = logging.getLogger(__name__)
UNSHOWN_START_MS = 500  # a window that is never painted (hidden, minimised) starts this much later


class AfterFirstPaint(QObject):
    """Calls `start()` once, on the event loop turn after `window`'s first paint."""

    def __init__(self, window: Any, start: Callable[[], None]) -> None:
        super().__init__(window)
        self._start = start
        self.started = False
        window.installEventFilter(self)
        QTimer.singleShot(UNSHOWN_START_MS, self, self._run)

    def eventFilter(self, obj: Any, event: Any) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.Paint and not self.started:
            QTimer.singleShot(0, self, self._run)
        return False

    def _run(self) -> None:
        if not self.started:
            self.started = True
            self._start()


class _Imported(QObject):
    done = Signal()


def import_in_background(name: str, on_ready: Callable[[], None], parent: QObject) -> threading.Thread:
    """Import module `name` on a daemon thread, then call `on_ready()` on `parent`'s (the GUI) thread."""
    relay = _Imported(parent)
    relay.done.connect(on_ready)

    def run() -> None:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - on_ready imports it again and fails loudly there
            log.exception("importing %s in the background failed", name)
        try:
            relay.done.emit()  # queued into the GUI thread
        except RuntimeError:  # the window closed meanwhile
            pass

    thread = threading.Thread(target=run, name=f"import-{name}", daemon=True)
    thread.start()
    return thread
