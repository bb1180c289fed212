"""The chat store's schema (numbered migrations), its row types and the row <-> value helpers.

A message's `state` says how its text ended: "done" (complete), "streaming" (an answer being
written: its text is the last checkpoint), "stopped" (the user stopped it: partial text),
"interrupted" (a signal or a crash cut it off: partial text; on a question, it was never answered).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

ROLES = ("system", "user", "assistant")
STATES = ("done", "streaming", "stopped", "interrupted")
PARTIAL_STATES = ("streaming", "stopped", "interrupted")  # the text is not the whole answer


@dataclass(frozen=True)
class Migration:
    """Brings the schema from `version - 1` to `version`; statements run in one transaction."""

    version: int
    summary: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema", (
        """CREATE TABLE chats (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL,
            created REAL NOT NULL,
            updated REAL NOT NULL,
            model_spec TEXT NOT NULL DEFAULT '',
            settings TEXT NOT NULL DEFAULT '{}')""",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
            idx INTEGER NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            text TEXT NOT NULL,
            created REAL NOT NULL,
            stats TEXT NOT NULL DEFAULT '{}',
            level_spans TEXT NOT NULL DEFAULT '[]',
            UNIQUE (chat_id, idx))""",
        """CREATE TABLE documents (
            sha256 TEXT PRIMARY KEY,
            title TEXT NOT NULL,
            source TEXT NOT NULL,
            text TEXT NOT NULL,
            bytes INTEGER NOT NULL,
            format TEXT NOT NULL)""",
        """CREATE TABLE chat_documents (
            chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
            doc_sha256 TEXT NOT NULL REFERENCES documents(sha256),
            position INTEGER NOT NULL,
            token_counts TEXT NOT NULL DEFAULT '{}',
            PRIMARY KEY (chat_id, doc_sha256))""",
        "CREATE INDEX chat_documents_by_doc ON chat_documents(doc_sha256)",
        "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE INDEX chats_by_updated ON chats(updated)",
    )),
    Migration(2, "message state (done/streaming/stopped/interrupted) and the writing process", (
        "ALTER TABLE messages ADD COLUMN state TEXT NOT NULL DEFAULT 'done' "
        "CHECK (state IN ('done', 'streaming', 'stopped', 'interrupted'))",
        # host:pid of the process writing a streaming answer (or that wrote a question), so a
        # later start can tell a crashed writer's rows from a live one's
        "ALTER TABLE messages ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
        "CREATE INDEX messages_streaming ON messages(state) WHERE state = 'streaming'",
    )),
    Migration(3, "per document in a chat: whole, or answered from its most relevant passages", (
        "ALTER TABLE chat_documents ADD COLUMN fit TEXT NOT NULL DEFAULT 'whole' "
        "CHECK (fit IN ('whole', 'passages'))",
    )),
    Migration(4, "the passages an answer was given (a document answered from its passages), kept with it", (
        # a JSON list of {"document", "label", "first_words", "text"}; NULL: not answered from passages
        "ALTER TABLE messages ADD COLUMN passages TEXT",
    )),
)


@dataclass(frozen=True)
class Message:
    id: int
    chat_id: int
    idx: int  # 0-based position in the chat
    role: str
    text: str
    created: float  # unix seconds
    stats: dict = field(default_factory=dict, compare=False, hash=False)
    level_spans: tuple[tuple[int, int, int], ...] = ()  # (start_char, end_char, level)
    state: str = "done"  # one of STATES
    # the passages the answer was given: ({"document", "label", "first_words", "text"}, ...); None when
    # no document was answered from its passages (an empty tuple: none matched the question)
    passages: tuple[dict, ...] | None = field(default=None, compare=False, hash=False)

    @property
    def partial(self) -> bool:
        """Is the text less than the whole answer (stopped, interrupted, or still streaming)?"""
        return self.state in PARTIAL_STATES


@dataclass(frozen=True)
class Chat:
    id: int
    title: str
    created: float
    updated: float
    model_spec: str
    settings: dict = field(default_factory=dict, compare=False, hash=False)
    messages: tuple[Message, ...] = ()


@dataclass(frozen=True)
class ChatSummary:
    id: int
    title: str
    created: float
    updated: float
    model_spec: str
    message_count: int


@dataclass(frozen=True)
class StoredDocument:
    sha256: str
    title: str
    source: str
    bytes: int
    format: str
    position: int
    token_counts: dict = field(default_factory=dict, compare=False, hash=False)  # model id -> tokens
    text: str = ""  # "" when fetched with with_text=False
    fit: str = "whole"  # "whole" or "passages" (the most relevant passages per question)


def advice(path: Path, detail: str) -> str:
    """What to do about an SQLite failure on the store at `path`."""
    low = detail.lower()
    if "locked" in low or "busy" in low:
        return (f"The chat store {path} is busy ({detail}): another TriForce Chat may be writing to it. "
                "Close other windows of the app and try again.")
    if "full" in low:
        return f"Cannot save to the chat store {path}: the disk is full. Free some disk space and try again."
    if "readonly" in low or "read-only" in low or "unable to open" in low or "permission" in low:
        return (f"Cannot open or write the chat store {path} ({detail}). Check the folder's permissions, "
                "or set TRIFORCE_HOME to a writable folder.")
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return (f"The chat store {path} is damaged ({detail}). Move it aside (the app starts an empty one) "
                "and restore a backup if you have one.")
    return f"The chat store {path} failed ({detail}). Check free disk space and permissions, then try again."


def drop_orphan_documents(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM documents WHERE sha256 NOT IN (SELECT doc_sha256 FROM chat_documents)")


def message_from_row(row: sqlite3.Row) -> Message:
    spans = tuple(tuple(s) for s in json.loads(row["level_spans"]))
    cited = row["passages"] if "passages" in row.keys() else None
    return Message(row["id"], row["chat_id"], row["idx"], row["role"], row["text"], row["created"],
                   json.loads(row["stats"]), spans, row["state"],
                   None if cited is None else tuple(json.loads(cited)))


PASSAGE_FIELDS = ("document", "label", "first_words", "text")


def checked_passages(passages: Sequence[Any] | None) -> str | None:
    """Cited passages (dicts or objects with PASSAGE_FIELDS) as the JSON the store keeps; None stays None."""
    if passages is None:
        return None
    rows = [{k: str(p[k] if isinstance(p, dict) else getattr(p, k)) for k in PASSAGE_FIELDS} for p in passages]
    return dumps(rows)


def checked_spans(level_spans: Sequence[Sequence[int]]) -> tuple[tuple[int, int, int], ...]:
    spans = tuple((int(a), int(b), int(level)) for a, b, level in level_spans)
    if any(not 0 <= a <= b for a, b, _ in spans):
        raise ValueError(f"level spans must be (start, end, level) with 0 <= start <= end: {spans[:3]}...")
    return spans


def plain(value: Any) -> Any:
    # Metrics and other frozen dataclasses are stored as their dicts; no stats is an empty dict.
    if value is None:
        return {}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def contains_ci(haystack: str | None, needle: str | None) -> bool:
    return bool(haystack) and bool(needle) and needle.casefold() in haystack.casefold()


def text_sha256(text: str) -> str:
    # Same key as engine.documents.text_sha256: sha256 of the UTF-8 text.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")
