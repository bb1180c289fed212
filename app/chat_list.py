"""The left sidebar: new chat, search, the list of chats (rename, delete, export).

It only shows what it is given and emits what the user asked for; the main window talks
to the chat store.
"""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (QHBoxLayout, QInputDialog, QLabel, QLineEdit, QListWidget, QListWidgetItem, QMenu,
                               QMessageBox, QPushButton, QVBoxLayout, QWidget)


@dataclass(frozen=True)
class ChatEntry:
    chat_id: int
    title: str
    subtitle: str = ""


class ChatList(QWidget):
    newRequested = Signal()
    chatSelected = Signal(object)  # chat id
    renameRequested = Signal(object, str)
    deleteRequested = Signal(object)
    exportRequested = Signal(object, str)  # chat id, "markdown" | "json"
    searchChanged = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("sidebar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 12, 10, 10)
        lay.setSpacing(8)
        brand = QHBoxLayout()
        from app.icons import app_icon
        logo = QLabel()
        logo.setPixmap(app_icon().pixmap(QSize(26, 26)))
        brand.addWidget(logo)
        name = QLabel("TriForce Chat")
        name.setObjectName("brand")
        brand.addWidget(name)
        brand.addStretch(1)
        lay.addLayout(brand)
        self.new_button = QPushButton("+  New chat")
        self.new_button.setObjectName("primary")
        self.new_button.setToolTip("Start a new chat (Ctrl+N)")
        self.new_button.clicked.connect(self.newRequested.emit)
        lay.addWidget(self.new_button)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setClearButtonEnabled(True)
        self._search_timer = QTimer(self, singleShot=True, interval=200)
        self._search_timer.timeout.connect(lambda: self.searchChanged.emit(self.search.text().strip()))
        self.search.textChanged.connect(lambda _t: self._search_timer.start())
        lay.addWidget(self.search)
        section = QLabel("CHATS")
        section.setObjectName("sectionTitle")
        lay.addWidget(section)
        self.list = QListWidget()
        self.list.setObjectName("chatList")
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setUniformItemSizes(True)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._on_menu)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.itemDoubleClicked.connect(lambda item: self._rename(item))
        lay.addWidget(self.list, 1)
        self.empty_label = QLabel("No chats yet")
        self.empty_label.setObjectName("muted")
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay.addWidget(self.empty_label)
        self._quiet = False

    def set_chats(self, entries: list[ChatEntry], current: object | None) -> None:
        """Replace the list (keeps the selection on `current` without re-emitting it)."""
        self._quiet = True
        try:
            self.list.clear()
            for e in entries:
                item = QListWidgetItem(e.title or "Untitled")
                item.setData(Qt.ItemDataRole.UserRole, e.chat_id)
                item.setToolTip(f"{e.title}\n{e.subtitle}" if e.subtitle else e.title)
                self.list.addItem(item)
                if e.chat_id == current:
                    self.list.setCurrentItem(item)
            searching = bool(self.search.text().strip())
            self.empty_label.setText("No chats match" if searching else "No chats yet")
            self.empty_label.setVisible(not entries)
        finally:
            self._quiet = False

    def select(self, chat_id: object | None) -> None:
        self._quiet = True
        try:
            self.list.setCurrentItem(None)
            for i in range(self.list.count()):
                if self.list.item(i).data(Qt.ItemDataRole.UserRole) == chat_id:
                    self.list.setCurrentRow(i)
        finally:
            self._quiet = False

    def current_id(self) -> object | None:
        item = self.list.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item else None

    def _on_current(self, item: QListWidgetItem | None, _prev: QListWidgetItem | None) -> None:
        if item is not None and not self._quiet:
            self.chatSelected.emit(item.data(Qt.ItemDataRole.UserRole))

    def _on_menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        menu = QMenu(self)
        chat_id = item.data(Qt.ItemDataRole.UserRole)
        rename = QAction("Rename…", menu, triggered=lambda: self._rename(item))
        md = QAction("Export as Markdown…", menu, triggered=lambda: self.exportRequested.emit(chat_id, "markdown"))
        js = QAction("Export as JSON…", menu, triggered=lambda: self.exportRequested.emit(chat_id, "json"))
        delete = QAction("Delete…", menu, triggered=lambda: self._delete(item))
        menu.addActions([rename, md, js])
        menu.addSeparator()
        menu.addAction(delete)
        menu.exec(self.list.viewport().mapToGlobal(pos))

    def _rename(self, item: QListWidgetItem) -> None:
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=item.text())
        if ok and title.strip():
            self.renameRequested.emit(item.data(Qt.ItemDataRole.UserRole), title.strip())

    def _delete(self, item: QListWidgetItem) -> None:
        answer = QMessageBox.question(self, "Delete chat", f"Delete “{item.text()}” and its documents?")
        if answer == QMessageBox.StandardButton.Yes:
            self.deleteRequested.emit(item.data(Qt.ItemDataRole.UserRole))
