"""The main window's widgets and their places (the window's behaviour is in main_window.py).

Like a `setupUi()`: builds the layout and sets each widget as an attribute of the window.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (QFrame, QHBoxLayout, QLabel, QProgressBar, QPushButton, QScrollArea, QSplitter,
                               QTabWidget, QVBoxLayout, QWidget)

from app import theme
from app.chat_list import ChatList
from app.elided import ElidedLabel
from app.chat_view import ChatView
from app.composer import Composer
from app.context_meter import ContextMeter
from app.document_chips import DocumentChips, PrefillStrip
from app.panels import AcceptancePanel, CachePanel, MemoryPanel
from app.settings_panel import SettingsPanel
from engine.settings import DecodeSettings


class DropOverlay(QLabel):
    """Shown over the window while files are dragged onto it."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__("Drop to add to this chat", parent)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        c = theme.colors()
        self.setStyleSheet(f"QLabel {{ background: rgba(20, 22, 30, 150); color: white; font-size: 18pt;"
                           f" font-weight: 600; border: 3px dashed {c.accent}; border-radius: 16px; }}")
        self.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.hide()


def build_window_layout(window: Any, initial: DecodeSettings) -> None:
    """Chat list | conversation (header, messages, progress, chips, input) | Live & Settings tabs;
    a status bar with the model and its load progress; the window's shortcuts."""
    splitter = QSplitter(Qt.Orientation.Horizontal)
    splitter.setChildrenCollapsible(False)
    splitter.setHandleWidth(1)
    window.chat_list = ChatList()
    window.chat_list.setMinimumWidth(200)
    splitter.addWidget(window.chat_list)

    center = QWidget()
    center.setObjectName("conversation")
    center.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
    col = QVBoxLayout(center)
    col.setContentsMargins(0, 0, 0, 0)
    col.setSpacing(0)
    header = QFrame()
    header.setObjectName("chatHeader")
    hl = QHBoxLayout(header)
    hl.setContentsMargins(20, 10, 14, 10)
    window.title_label = ElidedLabel("New chat")  # a long title is cut, never widens the column
    window.title_label.setObjectName("chatTitle")
    hl.addWidget(window.title_label, 1)
    window.context_label = QLabel()
    window.context_label.setObjectName("muted")
    hl.addWidget(window.context_label)
    window.context_meter = ContextMeter()  # used / total tokens; a click breaks it down
    hl.addWidget(window.context_meter)
    window.model_button = QPushButton("Model…")
    window.model_button.setToolTip("Choose the model (bundled, presets, local folders, .gguf, Hugging Face)")
    hl.addWidget(window.model_button)
    col.addWidget(header)
    window.chat_view = ChatView()
    col.addWidget(window.chat_view, 1)
    bottom = QWidget()
    bl = QVBoxLayout(bottom)
    bl.setContentsMargins(20, 8, 20, 12)
    bl.setSpacing(6)
    window.prefill_strip = PrefillStrip()
    bl.addWidget(window.prefill_strip)
    window.chips = DocumentChips()
    bl.addWidget(window.chips)
    window.composer = Composer()
    bl.addWidget(window.composer)
    col.addWidget(bottom)
    splitter.addWidget(center)

    window.right = QTabWidget()
    window.right.setObjectName("rightPane")
    window.right.setMinimumWidth(300)
    live = QWidget()
    live.setObjectName("rightPane")
    ll = QVBoxLayout(live)
    ll.setContentsMargins(10, 10, 10, 10)
    ll.setSpacing(10)
    window.cache_panel = CachePanel()
    window.acceptance_panel = AcceptancePanel()
    window.memory = MemoryPanel()
    for w in (window.acceptance_panel, window.cache_panel, window.memory):
        ll.addWidget(w)
    ll.addStretch(1)
    live_scroll = QScrollArea()  # the panels keep their natural height; a short window scrolls
    live_scroll.setWidgetResizable(True)
    live_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    live_scroll.setWidget(live)
    window.right.addTab(live_scroll, "Live")
    window.settings_panel = SettingsPanel()
    window.settings_panel.set_settings(initial)
    window.cache_panel.set_settings(initial)
    window.right.addTab(window.settings_panel, "Settings")
    splitter.addWidget(window.right)
    splitter.setStretchFactor(0, 0)
    splitter.setStretchFactor(1, 1)
    splitter.setStretchFactor(2, 0)
    splitter.setSizes([240, 820, 360])
    window.splitter = splitter
    window.setCentralWidget(splitter)

    sb = window.statusBar()
    window.status_label = QLabel()
    sb.addWidget(window.status_label, 1)
    window.load_bar = QProgressBar()
    window.load_bar.setMaximumWidth(220)
    window.load_bar.setRange(0, 1000)
    window.load_bar.hide()
    sb.addPermanentWidget(window.load_bar)
    window.load_cancel = QPushButton("Cancel")
    window.load_cancel.hide()
    sb.addPermanentWidget(window.load_cancel)
    window.drop_overlay = DropOverlay(window)

    def action(text: str, keys: Any, slot: Any) -> QAction:
        act = QAction(text, window)
        act.setShortcut(QKeySequence(keys))
        act.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        act.triggered.connect(slot)
        window.addAction(act)
        return act

    window.new_action = action("New chat", QKeySequence.StandardKey.New, window.new_chat)
    window.attach_action = action("Attach…", QKeySequence.StandardKey.Open, window.attach_dialog)
    window.stop_action = action("Stop", Qt.Key.Key_Escape, window.stop)
    window.settings_action = action("Settings", QKeySequence("Ctrl+,"), window.show_settings)
