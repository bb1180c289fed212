"""The app's view of the chat store (engine/store/chats.py): documents as `DocumentText`,
messages with their stats and level spans, exports as text.

All calls run on the GUI thread (a write is one small SQLite transaction, a millisecond or
two); each write commits on its own, so a crash loses at most the answer being written.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from engine.store.chats import ChatStore, ChatSummary, Message, StoredDocument
from engine.events import ChatMessage, DocumentText


def to_chat_messages(messages: Sequence[Message]) -> list[ChatMessage]:
    """What the engine gets: roles and text (partial answers included, as the user saw them)."""
    return [ChatMessage(m.role, m.text) for m in messages if m.role in ("user", "assistant", "system")]


def spans_from_segments(segments: Sequence[tuple[str, int]]) -> list[tuple[int, int, int]]:
    """(text, level) pieces -> (start_char, end_char, level) spans, for the store."""
    spans, pos = [], 0
    for text, level in segments:
        if text:
            spans.append((pos, pos + len(text), int(level)))
            pos += len(text)
    return spans


def segments_from_spans(text: str, spans: Sequence[Sequence[int]]) -> list[tuple[str, int]]:
    return [(text[s:e], int(level)) for s, e, level in spans if 0 <= s < e <= len(text)]


class ChatRepo:
    """A `ChatStore` (default path: the app's database) plus the conversions the window needs."""

    def __init__(self, path: Any = None, store: ChatStore | None = None) -> None:
        self.store = store if store is not None else ChatStore(path)

    # chats
    def create_chat(self, title: str, model_spec: str = "", settings: dict | None = None) -> int:
        return self.store.create_chat(title, model_spec, settings).id

    def rename_chat(self, chat_id: int, title: str) -> None:
        self.store.rename_chat(chat_id, title)

    def delete_chat(self, chat_id: int) -> None:
        self.store.delete_chat(chat_id)

    def list_chats(self, search: str | None = None) -> list[ChatSummary]:
        return self.store.list_chats(search or None)

    def title(self, chat_id: int) -> str:
        return self.store.get_chat(chat_id).title

    # messages
    def messages(self, chat_id: int) -> tuple[Message, ...]:
        return self.store.messages(chat_id)

    def add_message(self, chat_id: int, role: str, text: str, stats: dict | None = None,
                    segments: Sequence[tuple[str, int]] = ()) -> int:
        return self.store.add_message(chat_id, role, text, stats=stats or {},
                                      level_spans=spans_from_segments(segments)).idx

    def update_message(self, chat_id: int, idx: int, text: str, stats: dict | None = None,
                       segments: Sequence[tuple[str, int]] = ()) -> None:
        self.store.update_message(chat_id, idx, text=text, stats=stats or {},
                                  level_spans=spans_from_segments(segments))

    def delete_messages_from(self, chat_id: int, idx: int) -> None:
        self.store.delete_messages_from(chat_id, idx)

    # documents
    def add_document(self, chat_id: int, doc: DocumentText, model_id: str = "", tokens: int | None = None) -> str:
        stored = self.store.add_document(chat_id, doc)
        if model_id and tokens is not None:
            self.store.set_token_count(chat_id, stored.sha256, model_id, tokens)
        return stored.sha256

    def documents(self, chat_id: int, model_id: str = "") -> list[DocumentText]:
        """The chat's documents; meta carries sha256, format, bytes and (if counted) tokens for `model_id`."""
        return [self._document(d, model_id) for d in self.store.chat_documents(chat_id)]

    def remove_document(self, chat_id: int, sha256: str) -> None:
        self.store.remove_document(chat_id, sha256)

    def set_token_count(self, chat_id: int, sha256: str, model_id: str, tokens: int) -> None:
        self.store.set_token_count(chat_id, sha256, model_id, tokens)

    @staticmethod
    def _document(d: StoredDocument, model_id: str) -> DocumentText:
        meta = {"sha256": d.sha256, "format": d.format, "bytes": d.bytes}
        if model_id in d.token_counts:
            meta["tokens"] = int(d.token_counts[model_id])
        return DocumentText(d.title, d.text, d.source, meta)

    # settings & export
    def set_settings(self, chat_id: int, settings: dict) -> None:
        self.store.set_chat_settings(chat_id, settings)

    def get_settings(self, chat_id: int) -> dict:
        return self.store.get_chat_settings(chat_id) or {}

    def export(self, chat_id: int, fmt: str) -> str:
        if fmt == "markdown":
            return self.store.export_markdown(chat_id)
        return json.dumps(self.store.export_json(chat_id), indent=2, ensure_ascii=False)

    def close(self) -> None:
        self.store.close()
