"""The menu bar (File, Chat, Help) and the About box with versions and paths."""
from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from PySide6 import __version__ as pyside_version
from PySide6.QtCore import Qt, qVersion
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMessageBox


def build_menus(window: Any) -> None:
    """File: New chat, Attach, Export, Quit · Chat: Regenerate, Stop, Settings · Help: About.
    The window's existing shortcut actions are reused, so each key has one action."""
    bar = window.menuBar()
    file_menu = bar.addMenu("&File")
    file_menu.addAction(window.new_action)
    file_menu.addAction(window.attach_action)
    window.export_action = _action(window, "Export chat…", QKeySequence("Ctrl+E"), window.export_current)
    file_menu.addAction(window.export_action)
    file_menu.addSeparator()
    # Ctrl+Q everywhere (QKeySequence.Quit is empty on Windows)
    window.quit_action = _action(window, "Quit", QKeySequence("Ctrl+Q"), window.close)
    window.quit_action.setMenuRole(QAction.MenuRole.QuitRole)
    file_menu.addAction(window.quit_action)
    chat_menu = bar.addMenu("&Chat")
    window.regenerate_action = _action(window, "Regenerate answer", QKeySequence("Ctrl+R"), window.regenerate)
    chat_menu.addAction(window.regenerate_action)
    chat_menu.addAction(window.stop_action)
    chat_menu.addSeparator()
    chat_menu.addAction(window.settings_action)
    help_menu = bar.addMenu("&Help")
    window.about_action = _action(window, "About TriForce Chat", None, window.show_about)
    window.about_action.setMenuRole(QAction.MenuRole.AboutRole)
    help_menu.addAction(window.about_action)
    # greyed out while a menu is open when they would do nothing; enabled again on close, since the
    # same actions carry the keyboard shortcuts (Esc must stop an answer that starts later)
    file_menu.aboutToShow.connect(lambda: window.export_action.setEnabled(window.chat_id is not None))
    chat_menu.aboutToShow.connect(lambda: _update_chat_menu(window))
    for menu, actions in ((file_menu, (window.export_action,)), (chat_menu, (window.regenerate_action,
                                                                             window.stop_action))):
        menu.aboutToHide.connect(lambda actions=actions: [a.setEnabled(True) for a in actions])


def _update_chat_menu(window: Any) -> None:
    messages = window.messages
    window.regenerate_action.setEnabled(not window.is_answering() and bool(messages)
                                        and messages[-1].role == "assistant")
    window.stop_action.setEnabled(window.is_busy())


def _action(window: Any, text: str, keys: QKeySequence | None, slot: Any) -> QAction:
    act = QAction(text, window)
    if keys is not None:
        act.setShortcut(keys)
        act.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    act.triggered.connect(lambda _checked=False: slot())
    window.addAction(act)
    return act


def versions() -> dict[str, str]:
    """The app, Python, torch and Qt versions (read without importing torch: it takes seconds)."""
    return {"Version": app_version(), "Python": platform.python_version(),
            "torch": _dist_version("torch"), "Qt": f"{qVersion()} (PySide6 {pyside_version})",
            "System": platform.platform(terse=True)}


def app_version() -> str:
    from importlib import metadata  # here, not at start-up: a tenth of a second on a busy machine

    try:
        return metadata.version("triforce-chat")
    except metadata.PackageNotFoundError:  # run from a checkout: read pyproject.toml
        import tomllib
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"] + " (checkout)"
        except (OSError, KeyError, ValueError):
            return "unknown"


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def paths() -> dict[str, str]:
    """Where the app keeps chats and settings, and where models are cached."""
    import engine.api as api
    home = api.app_home()
    models = getattr(api, "model_cache_dir", None)
    return {"Data": str(home), "Models": str(models() if models else home / "models")}


def about_text() -> str:
    rows = [f"<tr><td><b>{k}</b></td><td>{v}</td></tr>" for k, v in {**versions(), **paths()}.items()]
    return ("<p>Chat with whole books on your own GPU, or the CPU. TriForce speculative decoding: "
            "every answer is exactly what plain decoding would give, faster.</p>"
            f"<table cellspacing='4'>{''.join(rows)}</table>")


def show_about(parent: Any) -> QMessageBox:
    box = QMessageBox(QMessageBox.Icon.Information, "About TriForce Chat", about_text(), parent=parent)
    box.setTextFormat(Qt.TextFormat.RichText)
    box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    box.open()
    return box
