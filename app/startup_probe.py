"""How long the window takes to appear and to quit, measured as a user sees it (`python3 main.py startup-time`).

The command starts the app as a child process with TRIFORCE_STARTUP_PROBE set to the launch time.
The child prints "painted at X s" on its first paint and "model ready at Y s" when the model has
loaded, then closes its window (at once with `--quit-while-loading`, else once the model is ready)
and prints "closing at <epoch>"; the parent times the child's exit from that line ("quit in Z s").
Run it under a display or with QT_QPA_PLATFORM=offscreen.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

PROBE_ENV = "TRIFORCE_STARTUP_PROBE"  # the launch time (time.time()) when set; "<time>:loading" quits while loading
ROOT = Path(__file__).resolve().parent.parent


def mark(what: str) -> None:
    """In the app: print how long after launch `what` happened (only under `startup-time`)."""
    value = os.environ.get(PROBE_ENV)
    if value:
        print(f"{what} at {time.time() - float(value.partition(':')[0]):.2f} s", flush=True)


def install(window: Any) -> None:
    """In the app: report the first paint and the model's arrival, then close the window."""
    value = os.environ.get(PROBE_ENV)
    if not value:
        return
    from PySide6.QtCore import QEvent, QObject, QTimer

    launched, _, when = value.partition(":")
    start = float(launched)

    def say(line: str) -> None:
        print(line, flush=True)

    def close() -> None:
        say(f"closing at {time.time():.4f}")
        window.close()

    class FirstPaint(QObject):
        def eventFilter(self, obj: Any, event: Any) -> bool:  # noqa: N802 - Qt override
            if event.type() == QEvent.Type.Paint and not getattr(self, "seen", False):
                self.seen = True
                say(f"painted at {time.time() - start:.2f} s")
                if when == "loading":
                    QTimer.singleShot(200, close)  # the model is still loading: quit cancels it
            return False

    window._startup_probe = probe = FirstPaint(window)
    window.installEventFilter(probe)

    def ready(_info: Any) -> None:
        say(f"model ready at {time.time() - start:.2f} s")
        if when != "loading":
            QTimer.singleShot(0, close)

    window.modelReady.connect(ready)


def measure(argv: list[str]) -> int:
    """`main.py startup-time`: launch the app, print when it painted, when the model was ready and how
    long quitting took."""
    parser = argparse.ArgumentParser(prog="main.py startup-time", description=measure.__doc__)
    parser.add_argument("--quit-while-loading", action="store_true",
                        help="close the window 0.2 s after it paints, while the model still loads")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    args = parser.parse_args(argv)
    import subprocess

    env = dict(os.environ)
    start = time.time()
    env[PROBE_ENV] = f"{start:.4f}" + (":loading" if args.quit_while_loading else "")
    child = subprocess.Popen([sys.executable, str(ROOT / "main.py")], env=env, stdout=subprocess.PIPE, text=True)
    closing = None
    assert child.stdout is not None
    deadline = start + args.timeout
    for line in child.stdout:
        line = line.strip()
        if line.startswith("closing at "):
            closing = float(line.split()[-1])
            print(f"closing at {closing - start:.2f} s", flush=True)
        elif line:
            print(line, flush=True)
        if time.time() > deadline:
            child.kill()
            print(f"startup-time: gave up after {args.timeout:.0f} s", file=sys.stderr)
            return 1
    code = child.wait()
    ended = time.time()
    if closing is None:
        print(f"startup-time: the app exited ({code}) before it closed its window", file=sys.stderr)
        return 1
    print(f"quit in {ended - closing:.2f} s (exit code {code})")
    return 0 if code in (0, 1) else 1  # 1: the quit deadline ended an engine stuck in a C call
