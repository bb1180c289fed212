"""Ctrl+C in the terminal and SIGTERM (logout, `kill`) close the window the proper way: the answer
being written is saved, marked interrupted, the engine thread stops and the store closes.

Python runs a signal handler only between bytecodes, and Qt's event loop is C++; a short
timer hands control back to Python so a signal is seen within `poll_ms`.
"""
from __future__ import annotations

import signal
from typing import Any, Callable

from PySide6.QtCore import QTimer


def close_on_signals(window: Any, poll_ms: int = 200) -> Callable[[int, Any], None]:
    """Install SIGINT/SIGTERM handlers that close `window` (on the GUI thread); returns the handler."""
    def handle(signum: int, _frame: Any) -> None:
        QTimer.singleShot(0, window.close)  # from the event loop: never inside a half-done Qt call

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handle)
    window._signal_poll = timer = QTimer(window)
    timer.timeout.connect(lambda: None)  # wakes the interpreter so the handler runs
    timer.start(poll_ms)
    return handle
