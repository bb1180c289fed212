"""The app's view of the chat store (engine/store/chats.py): documents as `DocumentText`,
messages with their stats and level spans, exports as text.

All calls run on the GUI thread (a write is one small SQLite transaction, a millisecond or
two). A question and the start of its answer are one transaction (`begin_turn`), the answer is
checkpointed as it streams, and its end (text + state) is one more, so a crash loses at most the
last checkpoint interval and never leaves a question without a row for its answer.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from engine.api import ChatStore, ChatSummary, Message, StoredDocument
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


PARTIAL_NOTE = {"stopped": "*(stopped by the user: partial answer)*",
                "interrupted": "*(interrupted: partial answer)*", "streaming": "*(interrupted: partial answer)*"}


def _partial(m: Message) -> bool:
    return m.role == "assistant" and (getattr(m, "state", "done") != "done" or bool(m.stats.get("partial")))


def export_markdown(markdown: str, messages: Sequence[Message]) -> str:
    """The store's Markdown with a note under each answer that did not end (the store does not write one)."""
    notes = [PARTIAL_NOTE.get(getattr(m, "state", "stopped"), PARTIAL_NOTE["stopped"])
             for m in messages if _partial(m)]
    if not notes or any(note in markdown for note in PARTIAL_NOTE.values()):
        return markdown
    out, answers = [], iter(m for m in messages if m.role in ("user", "assistant", "system"))
    current: Message | None = None
    for line in markdown.split("\n"):
        if line.startswith("## ") and line[3:].strip().lower() in ("user", "assistant", "system"):
            if current is not None and _partial(current):
                _add_note(out, current)
            current = next(answers, None)
        out.append(line)
    if current is not None and _partial(current):
        _add_note(out, current)
        out.append("")
    return "\n".join(out)


def _add_note(out: list[str], m: Message) -> None:
    while out and not out[-1].strip():
        out.pop()
    out += ["", PARTIAL_NOTE.get(getattr(m, "state", "stopped"), PARTIAL_NOTE["stopped"]), ""]


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
                    segments: Sequence[tuple[str, int]] = (), state: str = "done") -> int:
        return self.store.add_message(chat_id, role, text, stats=stats or {},
                                      level_spans=spans_from_segments(segments), state=state).idx

    def update_message(self, chat_id: int, idx: int, text: str, stats: dict | None = None,
                       segments: Sequence[tuple[str, int]] = (), state: str | None = None,
                       passages: Sequence[Any] | None = None) -> None:
        """Rewrite a message; `passages` (CitedPassages) are the answer's cited passages (None: leave them)."""
        self.store.update_message(chat_id, idx, text=text, stats=stats or {},
                                  level_spans=spans_from_segments(segments), state=state, passages=passages)

    def begin_turn(self, chat_id: int, question: str) -> tuple[int, int]:
        """Save a question and an empty answer marked "streaming" in one transaction: (question, answer) idx."""
        turn = self.store.begin_turn(chat_id, question)
        return turn.question.idx, turn.answer.idx

    def begin_answer(self, chat_id: int) -> int:
        """An empty answer marked "streaming" after the chat's last question (regenerate, retry)."""
        return self.store.add_message(chat_id, "assistant", "", state="streaming").idx

    def interrupted_question(self, chat_id: int) -> Message | None:
        """The question a crash, a kill or a shutdown cut off (to offer Retry); None if the last turn ended."""
        stored = [m for m in self.store.messages(chat_id) if m.role in ("user", "assistant")]
        if not stored:
            return None
        last = stored[-1]
        if last.role == "user":
            return last  # no answer row at all (a store written before turns were atomic)
        if getattr(last, "state", "done") in ("interrupted", "streaming") and len(stored) >= 2:
            return stored[-2] if stored[-2].role == "user" else None
        return None

    def delete_messages_from(self, chat_id: int, idx: int) -> None:
        self.store.delete_messages_from(chat_id, idx)

    # documents
    def add_document(self, chat_id: int, doc: DocumentText, model_id: str = "", tokens: int | None = None) -> str:
        stored = self.store.add_document(chat_id, doc)
        if (doc.meta or {}).get("fit", "whole") != stored.fit:  # answered from its passages: kept with the chat
            self.store.set_document_fit(chat_id, stored.sha256, doc.meta["fit"])
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
        meta = {"sha256": d.sha256, "format": d.format, "bytes": d.bytes, "fit": d.fit}
        if model_id in d.token_counts:
            meta["tokens"] = int(d.token_counts[model_id])
        return DocumentText(d.title, d.text, d.source, meta)

    # settings & export
    def set_settings(self, chat_id: int, settings: dict) -> None:
        self.store.set_chat_settings(chat_id, settings)

    def get_settings(self, chat_id: int) -> dict:
        return self.store.get_chat_settings(chat_id) or {}

    def export(self, chat_id: int, fmt: str) -> str:
        """The chat as Markdown or JSON; an answer that did not end (stopped, interrupted) says so."""
        if fmt == "markdown":
            return export_markdown(self.store.export_markdown(chat_id), self.store.messages(chat_id))
        data = self.store.export_json(chat_id)
        for message, stored in zip(data.get("messages", []), self.store.messages(chat_id)):
            if isinstance(message, dict) and _partial(stored):
                message.setdefault("partial", True)
                message.setdefault("state", getattr(stored, "state", "stopped"))
        return json.dumps(data, indent=2, ensure_ascii=False)

    def close(self) -> None:
        self.store.close()
