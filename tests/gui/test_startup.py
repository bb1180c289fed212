"""Start-up and quit (issue 70): the window is built without the model or heavy libraries, the model
starts loading once the window is painted (its status shown from the first frame), and closing
returns while the engine is still inside a step that cannot stop (the answer in flight is saved)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
from tests.gui.fakes import FakeBackend

BUILD_WINDOW = """
import os, sys
os.environ["QT_QPA_PLATFORM"] = "offscreen"
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.main_window import MainWindow
window = MainWindow("bundled")
window.show()
heavy = sorted(m for m in ("torch", "transformers", "pyqtgraph", "safetensors", "gguf", "bm25s") if m in sys.modules)
print("heavy:", ",".join(heavy))
print("status:", window.status_label.text())
print("jobs:", window.controller.jobs.load)
window.controller.closing = True
os._exit(0)
"""


def test_building_the_window_waits_on_no_model_and_no_heavy_import(triforce_home):
    done = subprocess.run([sys.executable, "-c", BUILD_WINDOW], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TRIFORCE_HOME": str(triforce_home)})
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.strip().splitlines())
    assert lines["heavy"] == ""  # torch, transformers and pyqtgraph come after the first frame
    assert lines["status"].startswith("Starting… the model (bundled) loads")
    assert lines["jobs"] == "0"  # no load job before the window is on screen


def test_the_model_loads_after_the_first_paint_and_the_plot_follows(qtbot, make_window):
    window = make_window("fake-model", backend=FakeBackend(tokens=12))  # waits for the model
    assert window._after_paint.started and window.model is not None
    qtbot.waitUntil(lambda: window.acceptance_panel._plot is not None, timeout=30_000)
    with qtbot.waitSignal(window.answerFinished, timeout=10_000):
        window.send("Hi")
    xs, _ys = window.acceptance_panel._points["l0_l1"]
    curve_xs, _ = window.acceptance_panel.curves["l0_l1"].getData()
    assert xs and list(curve_xs) == xs


def test_points_that_came_before_the_plot_are_drawn_when_it_is_built(qtbot):
    from app.panels.acceptance_panel import AcceptancePanel
    from tests.gui.fakes import FakeModel, FakeFolder, FakeSession
    from engine.settings import DecodeSettings
    panel = AcceptancePanel()
    qtbot.addWidget(panel)
    session = FakeSession(FakeModel(FakeFolder()), DecodeSettings())
    panel.update_metrics(session._metrics(5))
    panel.update_metrics(session._metrics(10))
    assert panel._plot is None and panel._points["l0_l1"][0] == [5.0, 10.0]
    panel.build_plot()
    assert list(panel.curves["l0_l1"].getData()[0]) == [5.0, 10.0]


class BlockingLoad(FakeBackend):
    """A load that cannot be cancelled (like reading weights) until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def load(self, resolved, plan=None, draft=False):
        self.entered.set()
        self.release.wait(20)  # closing before this ends is what the test checks
        return super().load(resolved, plan, draft)


def test_closing_returns_while_the_engine_is_stuck_loading(qtbot, make_window):
    backend = BlockingLoad()
    window = make_window("fake-model", backend=backend, wait=False)
    qtbot.waitUntil(backend.entered.is_set, timeout=10_000)
    window.quit_wait_ms = 50  # as run_app closes: a short wait, then on without the engine
    try:
        window.close()  # returns although the load is still inside its step
        assert window.controller.closing and window.engine.thread.isRunning()
        assert not backend.release.is_set()
    finally:
        backend.release.set()
        qtbot.waitUntil(lambda: not window.engine.thread.isRunning(), timeout=10_000)


def test_the_startup_time_command_reports_paint_and_quit(triforce_home):
    """The maintainer's measurement (`python3 main.py startup-time`), here quitting while the model loads."""
    env = {**os.environ, "TRIFORCE_HOME": str(triforce_home), "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, str(ROOT / "main.py"), "startup-time", "--quit-while-loading"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert re.search(r"^painted at \d+\.\d\d s$", out, re.M), out
    assert re.search(r"^quit in \d+\.\d\d s \(exit code [01]\)$", out, re.M), out  # 1: the quit deadline
    assert "model ready" not in out  # it quit while the model was still loading


def test_a_first_load_says_what_it_does_and_for_how_long(qtbot, make_window):
    window = make_window("fake-model", backend=FakeBackend(load_s=2.0), wait=False)
    qtbot.waitUntil(lambda: "Downloading fake-model" in window.status_label.text(), timeout=10_000)
    status = window.status_label.text()
    assert status.startswith("First use of this model — Downloading fake-model") and "once" in status
    assert re.search(r" · \d+ s so far$", status)
    qtbot.waitUntil(lambda: window.model is not None, timeout=20_000)
    assert "so far" not in window.status_label.text() and window.status_label.text().startswith("FakeLM-1M")
