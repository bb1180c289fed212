"""Light and dark looks that follow the system palette.

Qt's Fusion style already honours the platform palette (and its dark mode); this module
adds the few colours the app needs on top of it (accent, level colours, bubbles) and a
small stylesheet, chosen from the palette so both schemes read well.
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication


@dataclass(frozen=True)
class Colors:
    """Named colours for one scheme (hex strings, usable in stylesheets and QColor)."""

    dark: bool
    window: str
    base: str
    text: str
    muted: str
    border: str
    accent: str
    accent_text: str
    user_bubble: str
    answer_bubble: str
    error_bubble: str
    error_text: str
    code_background: str
    chip: str
    level_l0: str  # drafter tokens
    level_l1: str  # retrieval-cache tokens
    level_l2: str  # full-cache tokens
    ok: str
    warn: str
    bad: str

    def level(self, level: int) -> str:
        return (self.level_l0, self.level_l1, self.level_l2)[int(level)]


LIGHT = Colors(
    dark=False, window="#f4f5f7", base="#ffffff", text="#1d2330", muted="#6b7385", border="#d9dde5",
    accent="#c8901a", accent_text="#ffffff", user_bubble="#fdf3dd", answer_bubble="#ffffff",
    error_bubble="#fdecec", error_text="#a1262b", code_background="#f1f3f6", chip="#eef0f4",
    level_l0="#2e8b57", level_l1="#2f6fd1", level_l2="#8a4fbf", ok="#2e8b57", warn="#c8901a", bad="#c53b3b",
)

DARK = Colors(
    dark=True, window="#1b1e24", base="#23272f", text="#e6e8ee", muted="#9aa3b5", border="#363b46",
    accent="#e2ad3b", accent_text="#1b1e24", user_bubble="#3a3222", answer_bubble="#262a33",
    error_bubble="#452629", error_text="#ff9b9b", code_background="#1b1e24", chip="#2f3440",
    level_l0="#5fd39a", level_l1="#79a8ff", level_l2="#c792ea", ok="#5fd39a", warn="#e2ad3b", bad="#ff7b7b",
)


def system_is_dark(app: QGuiApplication | None = None) -> bool:
    """True when the platform asks for a dark scheme (or its palette is dark)."""
    app = app or QGuiApplication.instance()
    if app is None:
        return False
    scheme = app.styleHints().colorScheme()
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    return app.palette().color(QPalette.ColorRole.Window).lightness() < 128


def colors(dark: bool | None = None) -> Colors:
    """The colour set for `dark` (None: follow the system)."""
    return DARK if (system_is_dark() if dark is None else dark) else LIGHT


def _palette(c: Colors) -> QPalette:
    pal = QPalette()
    role = QPalette.ColorRole
    pal.setColor(role.Window, QColor(c.window))
    pal.setColor(role.WindowText, QColor(c.text))
    pal.setColor(role.Base, QColor(c.base))
    pal.setColor(role.AlternateBase, QColor(c.chip))
    pal.setColor(role.Text, QColor(c.text))
    pal.setColor(role.Button, QColor(c.base))
    pal.setColor(role.ButtonText, QColor(c.text))
    pal.setColor(role.ToolTipBase, QColor(c.base))
    pal.setColor(role.ToolTipText, QColor(c.text))
    pal.setColor(role.PlaceholderText, QColor(c.muted))
    pal.setColor(role.Highlight, QColor(c.accent))
    pal.setColor(role.HighlightedText, QColor(c.accent_text))
    pal.setColor(role.Link, QColor(c.level_l1))
    pal.setColor(role.Mid, QColor(c.border))
    for group in (QPalette.ColorGroup.Disabled,):
        pal.setColor(group, role.Text, QColor(c.muted))
        pal.setColor(group, role.WindowText, QColor(c.muted))
        pal.setColor(group, role.ButtonText, QColor(c.muted))
    return pal


def stylesheet(c: Colors) -> str:
    """A light-touch stylesheet: rounded inputs, flat side panels, accent on primary buttons."""
    return f"""
    QSplitter::handle {{ background: {c.border}; }}
    QSplitter::handle:horizontal {{ width: 1px; }}
    #sidebar, #rightPane {{ background: {c.window}; }}
    #conversation {{ background: {c.base}; }}
    #chatHeader {{ background: {c.base}; border-bottom: 1px solid {c.border}; }}
    #chatTitle {{ font-size: 13pt; font-weight: 600; }}
    #muted, QLabel[muted="true"] {{ color: {c.muted}; }}
    #sectionTitle {{ color: {c.muted}; font-size: 8.5pt; font-weight: 700; letter-spacing: 1px; }}
    #brand {{ font-size: 12pt; font-weight: 700; }}
    QLineEdit, QPlainTextEdit {{
        background: {c.base}; border: 1px solid {c.border}; border-radius: 6px; padding: 4px 6px; }}
    QLineEdit:focus, QPlainTextEdit:focus {{ border: 1px solid {c.accent}; }}
    #composer {{ background: {c.base}; border: 1px solid {c.border}; border-radius: 10px; }}
    #composerEdit {{ border: none; background: transparent; padding: 6px; }}
    QPushButton {{ background: {c.base}; border: 1px solid {c.border}; border-radius: 6px; padding: 5px 12px; }}
    QPushButton:hover {{ border-color: {c.accent}; }}
    QPushButton:disabled {{ color: {c.muted}; }}
    QPushButton#primary {{ background: {c.accent}; color: {c.accent_text}; border: none; font-weight: 600; }}
    QPushButton#primary:disabled {{ background: {c.border}; color: {c.muted}; }}
    QPushButton#danger {{ background: {c.bad}; color: white; border: none; font-weight: 600; }}
    QToolButton {{ border: none; border-radius: 5px; padding: 3px; }}
    QToolButton:hover {{ background: {c.chip}; }}
    QListWidget#chatList {{ background: transparent; border: none; outline: none; }}
    QListWidget#chatList::item {{ border-radius: 6px; padding: 7px 8px; margin: 1px 4px; }}
    QListWidget#chatList::item:selected {{ background: {c.user_bubble}; color: {c.text}; }}
    QListWidget#chatList::item:hover:!selected {{ background: {c.chip}; }}
    QTabWidget::pane {{ border: none; }}
    QTabBar::tab {{ background: transparent; padding: 6px 14px; border: none; color: {c.muted}; }}
    QTabBar::tab:selected {{ color: {c.text}; border-bottom: 2px solid {c.accent}; }}
    QProgressBar {{ background: {c.chip}; border: none; border-radius: 4px; text-align: center;
        color: {c.text}; min-height: 14px; max-height: 14px; font-size: 8pt; }}
    QProgressBar::chunk {{ background: {c.accent}; border-radius: 4px; }}
    QProgressBar[level="l0"]::chunk {{ background: {c.level_l0}; }}
    QProgressBar[level="l1"]::chunk {{ background: {c.level_l1}; }}
    QProgressBar[level="l2"]::chunk {{ background: {c.level_l2}; }}
    QProgressBar[level="warn"]::chunk {{ background: {c.warn}; }}
    QProgressBar[level="bad"]::chunk {{ background: {c.bad}; }}
    QFrame#card {{ background: {c.base}; border: 1px solid {c.border}; border-radius: 8px; }}
    QFrame#chip {{ background: {c.chip}; border: 1px solid {c.border}; border-radius: 12px; }}
    QFrame#progressStrip {{ background: {c.chip}; border-radius: 8px; }}
    QFrame#userBubble {{ background: {c.user_bubble}; border-radius: 12px; }}
    QFrame#answerBubble {{ background: {c.answer_bubble}; border: 1px solid {c.border}; border-radius: 12px; }}
    QFrame#errorBubble {{ background: {c.error_bubble}; border-radius: 12px; }}
    QFrame#noticeBubble {{ background: {c.chip}; border-radius: 12px; }}
    QLabel#errorText {{ color: {c.error_text}; }}
    QScrollArea {{ border: none; background: transparent; }}
    QSlider::groove:horizontal {{ height: 4px; background: {c.border}; border-radius: 2px; }}
    QSlider::sub-page:horizontal {{ background: {c.accent}; border-radius: 2px; }}
    QSlider::handle:horizontal {{ background: {c.base}; border: 2px solid {c.accent}; width: 12px;
        margin: -6px 0; border-radius: 7px; }}
    QSlider::handle:horizontal:disabled {{ border-color: {c.border}; }}
    QSlider::sub-page:horizontal:disabled {{ background: {c.border}; }}
    QScrollBar:vertical {{ background: transparent; width: 10px; margin: 2px 1px; }}
    QScrollBar:horizontal {{ background: transparent; height: 10px; margin: 1px 2px; }}
    QScrollBar::handle {{ background: {c.border}; border-radius: 4px; min-height: 24px; min-width: 24px; }}
    QScrollBar::handle:hover {{ background: {c.muted}; }}
    QScrollBar::add-line, QScrollBar::sub-line {{ width: 0; height: 0; }}
    QScrollBar::add-page, QScrollBar::sub-page {{ background: none; }}
    QStatusBar {{ color: {c.muted}; }}
    QStatusBar QLabel {{ padding-left: 8px; color: {c.muted}; }}
    """


def apply_theme(app: QApplication, dark: bool | None = None) -> Colors:
    """Style `app` for the system scheme (or the forced one); returns the colours in use."""
    app.setStyle("Fusion")
    c = colors(dark)
    font = app.font()
    if font.pointSizeF() < 9.5:  # offscreen/minimal platforms default small; keep text readable
        font.setPointSizeF(10)
        app.setFont(font)
    app.setPalette(_palette(c))
    app.setStyleSheet(stylesheet(c))
    return c
