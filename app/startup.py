"""What the window does once it is on screen, not before: start loading the model and import the
heavy libraries the panels need (pyqtgraph) on a background thread, so the first frame never
waits on them."""
from __future__ import annotations

import importlib
import logging
import threading
import time
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
            self.parent().removeEventFilter(self)  # every later paint goes by without Python
            self._start()


def load_status(stage: str, elapsed_s: float) -> str:
    """The status line while a model loads: what it does, for how long so far, and on a model's
    first use (a download or a conversion) that this happens once."""
    text = stage[:1].upper() + stage[1:]
    if any(word in stage.lower() for word in ("download", "convert", "hashing")):
        text = f"First use of this model — {stage} (once: later starts skip this)"
    return f"{text} · {elapsed_s:.0f} s so far"


class LoadClock(QObject):
    """Keeps the status line's "N s so far" ticking while a model loads (a stage can take minutes)."""

    def __init__(self, show: Callable[[str], None], parent: QObject) -> None:
        super().__init__(parent)
        self._show = show
        self._stage = ""
        self._started: float | None = None
        self._timer = QTimer(self, interval=1000)
        self._timer.timeout.connect(self._tick)

    def stage(self, text: str) -> None:
        """A new stage (the controller's status while the load bar shows)."""
        if self._started is None:
            self._started = time.monotonic()
            self._timer.start()
        self._stage = text
        self._tick()

    def stop(self) -> None:
        self._timer.stop()
        self._started = None

    @property
    def running(self) -> bool:
        return self._started is not None

    def _tick(self) -> None:
        if self._started is not None:
            self._show(load_status(self._stage, time.monotonic() - self._started))


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
