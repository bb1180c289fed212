"""The desktop app's entry point (`run_app`, the gui-script `triforce-chat`) and its preferences file."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication, QMessageBox

from app import theme
from app.icons import app_icon
from app.quit_signals import close_on_signals
from app.startup_probe import install as install_startup_probe
from app.startup_probe import mark as mark_startup
from engine.errors import UserError

ORG, APP = "TriForceChat", "TriForce Chat"
QUIT_WAIT_MS = 100  # closing waits this long for the engine's step in flight, then exits without it
QUIT_DEADLINE_S = 0.6  # after saving, the process ends within this even when the engine holds the interpreter


def app_settings() -> QSettings:
    """Global preferences, next to the app's data (so TRIFORCE_HOME isolates tests too)."""
    from engine.api import app_home
    return QSettings(str(app_home() / "app-settings.ini"), QSettings.Format.IniFormat)


def configure_logging(stream: Any = None) -> logging.Handler:
    """INFO and above to stderr. The level is on the handler, so a library that turns its own logger
    to DEBUG when imported (bm25s does) still prints nothing below INFO."""
    handler = logging.StreamHandler(stream)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def exit_soon(deadline_s: float = QUIT_DEADLINE_S) -> None:
    """Once everything is saved: make sure the process ends within `deadline_s` even if another thread
    holds the interpreter in a long C call (the engine loading torch: seconds in which the GUI thread
    cannot run a line of Python). faulthandler's watchdog needs no interpreter; it exits with status 1."""
    import faulthandler

    sink = open(os.devnull, "w")  # noqa: SIM115 - open until the process ends
    faulthandler.dump_traceback_later(deadline_s, exit=True, file=sink)


def run_app(argv: list[str] | None = None) -> int:
    """Start the desktop app. The model comes from $TRIFORCE_MODEL (default: the last one used,
    else the bundled one); files named on the command line are attached to a new chat."""
    from app.main_window import MainWindow  # (main_window imports this module)

    mark_startup("imported")

    configure_logging()
    argv = list(sys.argv if argv is None else argv)
    QApplication.setApplicationName(APP)
    QApplication.setOrganizationName(ORG)
    QApplication.setDesktopFileName("triforce-chat")
    app = QApplication.instance() or QApplication(argv)
    app.setWindowIcon(app_icon())
    theme.apply_theme(app)
    prefs = app_settings()
    spec = os.environ.get("TRIFORCE_MODEL") or prefs.value("model/spec", "bundled", type=str) or "bundled"
    try:
        window = MainWindow(spec, settings=prefs)
    except UserError as exc:  # e.g. the chat store cannot be opened
        QMessageBox.critical(None, "TriForce Chat", str(exc))
        return 2
    mark_startup("built the window")
    install_startup_probe(window)
    window.show()
    close_on_signals(window)  # Ctrl+C / SIGTERM: the answer being written is kept, marked interrupted
    window.quit_wait_ms = QUIT_WAIT_MS
    window.on_saved = exit_soon
    for path in argv[1:]:
        if Path(path).is_file():
            window.attach_file(path)
    code = app.exec()
    window.shutdown()  # (done already when the window closed) the answer in flight is saved, the store closed
    mark_startup("saved everything, exiting")
    # Nothing is left to save: skip tearing down torch, Qt and an engine thread still inside a step
    # that cannot stop (loading weights), which took seconds.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(run_app())
