"""The app icon (resources/icons/triforce-chat.svg, with the PNG as a fallback)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from PySide6.QtGui import QIcon

ICON_DIR = Path(__file__).resolve().parent.parent / "resources" / "icons"
SVG_PATH = ICON_DIR / "triforce-chat.svg"
PNG_PATH = ICON_DIR / "triforce-chat.png"


@lru_cache(maxsize=1)
def app_icon() -> QIcon:
    """The triforce mark; SVG when Qt can render it, else the 256 px PNG."""
    icon = QIcon(str(SVG_PATH)) if SVG_PATH.is_file() else QIcon()
    if icon.isNull() or icon.pixmap(16, 16).isNull():  # no SVG image plugin: use the PNG
        icon = QIcon(str(PNG_PATH))
    return icon
