"""GUI test fixtures: offscreen Qt, a main window on a tiny random model (or a scripted fake),
screenshots under the test's tmp folder, and a GUI-thread heartbeat."""
from __future__ import annotations

import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"  # before any Qt import

from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import pytest  # noqa: E402

pytestmark = pytest.mark.gui
SHOTS_ENV = "TRIFORCE_SCREENSHOTS"  # also copy screenshots there (to refresh docs/screenshots/)


@pytest.fixture(scope="session")
def qapp_args():
    return ["triforce-chat-tests"]


@pytest.fixture(autouse=True)
def _themed(qapp):
    from app import theme
    theme.apply_theme(qapp, dark=False)
    yield


@pytest.fixture
def tiny_model(tiny_model_dir) -> str:
    """Spec of a tiny random Llama (2 layers, hidden 64) with the bundled tokenizer."""
    return str(tiny_model_dir("llama"))


@pytest.fixture
def make_window(qtbot, triforce_home):
    """Factory: `make_window(spec, backend=None, wait=True, **kw) -> MainWindow`, model loaded and the
    acceptance plot built (wait=False: right after show()).

    Each window is shut down (engine thread quit + wait, store closed) at teardown."""
    from app.main_window import MainWindow

    windows = []

    def make(spec: str | None, backend=None, wait: bool = True, **kw):
        window = MainWindow(spec, backend=backend, **kw)
        qtbot.addWidget(window)
        window.resize(1440, 900)
        window.show()
        windows.append(window)
        if wait and spec:
            qtbot.waitUntil(lambda: window.model is not None, timeout=60_000)
            # start-up is over once the plot's library, imported in the background after the first
            # paint, is in: tests that time the GUI thread measure the app after it, not during it
            qtbot.waitUntil(lambda: window.acceptance_panel._plot is not None, timeout=60_000)
        return window

    yield make
    for w in windows:
        w.shutdown()


@pytest.fixture
def shots(tmp_path: Path) -> Callable[[object, str], Path]:
    """`shots(widget, name)` saves widget.grab() as <tmp>/screenshots/<name>.png (and to $TRIFORCE_SCREENSHOTS)."""
    folder = tmp_path / "screenshots"
    folder.mkdir()

    def save(widget, name: str) -> Path:
        from PySide6.QtWidgets import QApplication
        QApplication.processEvents()
        path = folder / f"{name}.png"
        assert widget.grab().save(str(path)), f"could not save {path}"
        extra = os.environ.get(SHOTS_ENV)
        if extra:
            Path(extra).mkdir(parents=True, exist_ok=True)
            widget.grab().save(str(Path(extra) / f"{name}.png"))
        return path

    return save


@pytest.fixture
def heartbeat():
    from tests.gui.helpers import Heartbeat
    hb = Heartbeat()
    yield hb
    hb.stop()
