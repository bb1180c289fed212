"""Chats, messages and their documents in one SQLite file (WAL, one connection per thread).

Every public write is one transaction; `transaction()` groups several into one. Rows come back
as frozen dataclasses. Safe to use from the GUI thread and a worker thread at once.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.errors import StoreError
from engine.events import DocumentText
from engine.store import paths
from engine.store.chat_schema import (
    MIGRATIONS, ROLES, STATES, Chat, ChatSummary, Message, Migration, StoredDocument, advice, checked_passages,
    checked_spans, contains_ci, drop_orphan_documents, dumps, iso, message_from_row, plain, text_sha256,
)
from engine.store.turns import CHECKPOINT_INTERVAL_S, Turn, insert_turn, recover_interrupted, writer_id


class ChatStore:
    """The chat database. `path` defaults to paths.chat_db_path()."""

    def __init__(self, path: str | os.PathLike | None = None, *, busy_timeout_s: float = 10.0,
                 migrations: Sequence[Migration] = MIGRATIONS) -> None:
        self.path = Path(path) if path is not None else paths.chat_db_path()
        self.busy_timeout_s = busy_timeout_s
        self.schema_version = len(migrations)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"Cannot create the folder for the chat store {self.path.parent} ({exc.strerror}). "
                             "Check its permissions or set TRIFORCE_HOME to a writable folder.") from None
        self._migrate(migrations)
        if self.schema_version >= 2:
            recover_interrupted(self)  # answers a crashed or killed writer left half-written

    # -- connections and transactions ---------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            with self._errors():
                # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a write is exactly one transaction.
                conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None,
                                       check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("PRAGMA foreign_keys=ON")
                conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
                conn.create_function("contains_ci", 2, contains_ci, deterministic=True)
                conn.row_factory = sqlite3.Row
            self._local.conn, self._local.depth = conn, 0
            with self._lock:
                self._connections.append(conn)
        return conn

    @contextmanager
    def transaction(self, _begin: str = "BEGIN IMMEDIATE") -> Iterator[sqlite3.Connection]:
        """Group writes into one atomic transaction (nestable: inner blocks are savepoints)."""
        conn = self._conn()
        depth = self._local.depth
        with self._errors():
            if depth == 0 and conn.in_transaction:  # a signal cut the last one short between BEGIN and try
                conn.execute("ROLLBACK")
            # IMMEDIATE takes the write lock up front, so two writers queue instead of deadlocking.
            conn.execute(_begin if depth == 0 else f"SAVEPOINT sp{depth}")
        self._local.depth = depth + 1
        try:
            yield conn
        except BaseException:
            self._local.depth = depth
            with self._errors():
                conn.execute("ROLLBACK" if depth == 0 else f"ROLLBACK TO sp{depth}")
                if depth:
                    conn.execute(f"RELEASE sp{depth}")
            raise
        self._local.depth = depth
        with self._errors():
            conn.execute("COMMIT" if depth == 0 else f"RELEASE sp{depth}")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._errors():
            return self._conn().execute(sql, params).fetchall()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn SQLite's environmental failures into StoreErrors that say what to do."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            raise StoreError(advice(self.path, str(exc))) from exc
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError)):
                raise  # our bug, stays loud
            raise StoreError(advice(self.path, str(exc))) from exc

    def close(self) -> None:
        """Close every thread's connection (call once, at shutdown, when no thread uses the store)."""
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()

    # -- schema ---------------------------------------------------------------------------------
    def _migrate(self, migrations: Sequence[Migration]) -> None:
        latest = len(migrations)
        assert all(m.version == i + 1 for i, m in enumerate(migrations)), "migrations must be numbered 1..n"
        found = self._version()
        if found is not None and 0 < found < latest:
            # Copy the file first (SQLite cannot back up a connection mid-write), so a failed or
            # regretted upgrade loses nothing.
            self._backup(found)
        with self.transaction() as conn:
            version = self._version()  # again: another process may have migrated meanwhile
            if version is None:
                conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
                conn.execute("INSERT INTO schema_version VALUES (0)")
                version = 0
            if version > latest:
                raise StoreError(
                    f"{self.path} was written by a newer TriForce Chat (schema v{version}; this version "
                    f"reads up to v{latest}). Update the app, or move the file aside to start with an empty store.")
            for migration in migrations[version:]:
                for statement in migration.statements:
                    conn.execute(statement)
                conn.execute("UPDATE schema_version SET version = ?", (migration.version,))

    def _version(self) -> int | None:
        """The stored schema version; None for an empty file. Refuses SQLite files that are not ours."""
        conn = self._conn()
        with self._errors():
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "schema_version" in tables:
                return conn.execute("SELECT version FROM schema_version").fetchone()[0]
        if tables - {"sqlite_sequence"}:
            raise StoreError(f"{self.path} is an SQLite file but not a TriForce Chat store. "
                             "Move it aside or point TRIFORCE_HOME to another folder.")
        return None

    def _backup(self, version: int) -> None:
        target = self.path.with_name(f"{self.path.name}.v{version}.bak")
        dest = sqlite3.connect(target)
        try:
            with self._errors():
                self._conn().backup(dest)
        finally:
            dest.close()

    # -- chats ----------------------------------------------------------------------------------
    def create_chat(self, title: str = "New chat", model_spec: str = "", settings: dict | None = None) -> Chat:
        """Create an empty chat and return it."""
        now = time.time()
        with self.transaction() as conn:
            cur = conn.execute("INSERT INTO chats (title, created, updated, model_spec, settings) VALUES (?,?,?,?,?)",
                               (title, now, now, model_spec, dumps(settings or {})))
        return Chat(cur.lastrowid, title, now, now, model_spec, dict(settings or {}))

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._update_chat(chat_id, "title = ?", (title,))

    def set_chat_model(self, chat_id: int, model_spec: str) -> None:
        self._update_chat(chat_id, "model_spec = ?", (model_spec,))

    def set_chat_settings(self, chat_id: int, settings: dict) -> None:
        """Replace the chat's settings (any JSON-able dict, e.g. DecodeSettings as a dict)."""
        self._update_chat(chat_id, "settings = ?", (dumps(settings),))

    def get_chat_settings(self, chat_id: int) -> dict:
        return json.loads(self._chat_row(chat_id)["settings"])

    def delete_chat(self, chat_id: int) -> None:
        """Delete a chat, its messages and document links; documents no chat uses are dropped too."""
        with self.transaction() as conn:
            self._require_chat(conn, chat_id)
            conn.execute("DELETE FROM chats WHERE id = ?", (chat_id,))
            drop_orphan_documents(conn)

    def list_chats(self, search: str | None = None) -> list[ChatSummary]:
        """Chats, most recently updated first; `search` matches titles and message text (case-insensitive)."""
        where, params = "", []
        if search:
            if search.isascii():  # LIKE is case-insensitive for ASCII and runs in C
                like = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
                test, params = "{col} LIKE ? ESCAPE '\\'", [like, like]
            else:
                test, params = "contains_ci({col}, ?)", [search, search]
            where = (f"WHERE {test.format(col='c.title')} OR EXISTS (SELECT 1 FROM messages m "
                     f"WHERE m.chat_id = c.id AND {test.format(col='m.text')})")
        rows = self._read(
            "SELECT c.id, c.title, c.created, c.updated, c.model_spec, "
            f"(SELECT COUNT(*) FROM messages m WHERE m.chat_id = c.id) FROM chats c {where} "
            "ORDER BY c.updated DESC, c.id DESC", params)
        return [ChatSummary(*row) for row in rows]

    def get_chat(self, chat_id: int) -> Chat:
        """The chat with all its messages (documents: see chat_documents)."""
        with self.transaction("BEGIN DEFERRED") as conn:  # one read snapshot: chat row and messages agree
            row = self._require_chat(conn, chat_id)
            messages = conn.execute("SELECT * FROM messages WHERE chat_id = ? ORDER BY idx", (chat_id,)).fetchall()
        return Chat(row["id"], row["title"], row["created"], row["updated"], row["model_spec"],
                    json.loads(row["settings"]), tuple(message_from_row(m) for m in messages))

    # -- messages -------------------------------------------------------------------------------
    def messages(self, chat_id: int) -> tuple[Message, ...]:
        return self.get_chat(chat_id).messages

    def add_message(self, chat_id: int, role: str, text: str, *, stats: Any = None,
                    level_spans: Sequence[Sequence[int]] = (), state: str = "done") -> Message:
        """Append a message; stats is a JSON-able dict (or dataclass), level_spans [(start, end, level)].
        A question and its answer are better written together: see begin_turn."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, not {role!r}")
        _check_state(state)
        spans = checked_spans(level_spans)
        now = time.time()
        with self.transaction() as conn:
            self._require_chat(conn, chat_id)
            idx = conn.execute("SELECT COALESCE(MAX(idx) + 1, 0) FROM messages WHERE chat_id = ?",
                               (chat_id,)).fetchone()[0]
            cur = conn.execute(
                "INSERT INTO messages (chat_id, idx, role, text, created, stats, level_spans, state, owner) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                (chat_id, idx, role, text, now, dumps(plain(stats)), json.dumps(spans), state, writer_id()))
            conn.execute("UPDATE chats SET updated = ? WHERE id = ?", (now, chat_id))
        return Message(cur.lastrowid, chat_id, idx, role, text, now, plain(stats), spans, state)

    def update_message(self, chat_id: int, idx: int, *, text: str | None = None, stats: Any = None,
                       level_spans: Sequence[Sequence[int]] | None = None, state: str | None = None,
                       passages: Sequence[Any] | None = None) -> Message:
        """Change a message's text, stats, level spans, state and/or cited passages (dicts or objects with
        document, label, first_words, text) (arguments left None stay)."""
        changes, params = [], []
        if state is not None:
            changes.append("state = ?"), params.append(_check_state(state))
        if text is not None:
            changes.append("text = ?"), params.append(text)
        if stats is not None:
            changes.append("stats = ?"), params.append(dumps(plain(stats)))
        if level_spans is not None:
            changes.append("level_spans = ?"), params.append(json.dumps(checked_spans(level_spans)))
        if passages is not None and self.schema_version >= 4:
            changes.append("passages = ?"), params.append(checked_passages(passages))
        with self.transaction() as conn:
            self._require_chat(conn, chat_id)
            if changes:
                conn.execute(f"UPDATE messages SET {', '.join(changes)} WHERE chat_id = ? AND idx = ?",
                             (*params, chat_id, idx))
                conn.execute("UPDATE chats SET updated = ? WHERE id = ?", (time.time(), chat_id))
            row = conn.execute("SELECT * FROM messages WHERE chat_id = ? AND idx = ?", (chat_id, idx)).fetchone()
            if row is None:
                raise StoreError(f"Message {idx} of chat {chat_id} no longer exists (edited or deleted meanwhile).")
        return message_from_row(row)

    def begin_turn(self, chat_id: int, question: str, *, checkpoint_s: float = CHECKPOINT_INTERVAL_S) -> Turn:
        """Write a question and an empty answer marked "streaming" in one transaction; the Turn
        checkpoints the answer as it streams and finishes it (done, stopped or interrupted)."""
        with self.transaction() as conn:
            self._require_chat(conn, chat_id)
            asked, answer = insert_turn(conn, chat_id, question, time.time())
        return Turn(self, asked, answer, checkpoint_s)

    def retry_question(self, chat_id: int) -> Message | None:
        """The question to ask again when the chat's last turn was cut off (its answer, or the question
        itself, marked "interrupted"); None when the last turn is complete, stopped or still streaming."""
        rows = self._read("SELECT * FROM messages WHERE chat_id = ? AND role IN ('user', 'assistant') "
                          "ORDER BY idx DESC LIMIT 2", (chat_id,))
        last = [message_from_row(r) for r in rows]
        if last and last[0].role == "user" and last[0].state == "interrupted":
            return last[0]
        if len(last) == 2 and last[0].state == "interrupted" and last[1].role == "user":
            return last[1]
        return None

    def delete_messages_from(self, chat_id: int, idx: int) -> int:
        """Delete messages idx, idx+1, ... (edit/regenerate); returns how many went."""
        with self.transaction() as conn:
            self._require_chat(conn, chat_id)
            count = conn.execute("DELETE FROM messages WHERE chat_id = ? AND idx >= ?", (chat_id, idx)).rowcount
            conn.execute("UPDATE chats SET updated = ? WHERE id = ?", (time.time(), chat_id))
        return count

    # -- documents ------------------------------------------------------------------------------
    def add_document(self, chat_id: int, doc: DocumentText) -> StoredDocument:
        """Attach a document to a chat; its text is stored once per content hash, however many chats use it."""
        sha = text_sha256(doc.text)
        meta = doc.meta or {}
        with self.transaction() as conn:
            self._require_chat(conn, chat_id)
            conn.execute("INSERT OR IGNORE INTO documents (sha256, title, source, text, bytes, format) "
                         "VALUES (?,?,?,?,?,?)", (sha, doc.title, doc.source, doc.text,
                                                  int(meta.get("bytes", len(doc.text.encode()))),
                                                  str(meta.get("format", "text"))))
            exists = conn.execute("SELECT 1 FROM chat_documents WHERE chat_id = ? AND doc_sha256 = ?",
                                  (chat_id, sha)).fetchone()
            if not exists:
                conn.execute(
                    "INSERT INTO chat_documents (chat_id, doc_sha256, position) VALUES "
                    "(?, ?, (SELECT COALESCE(MAX(position) + 1, 0) FROM chat_documents WHERE chat_id = ?))",
                    (chat_id, sha, chat_id))
                conn.execute("UPDATE chats SET updated = ? WHERE id = ?", (time.time(), chat_id))
        return next(d for d in self.chat_documents(chat_id) if d.sha256 == sha)

    def remove_document(self, chat_id: int, sha256: str) -> None:
        with self.transaction() as conn:
            self._require_chat(conn, chat_id)
            conn.execute("DELETE FROM chat_documents WHERE chat_id = ? AND doc_sha256 = ?", (chat_id, sha256))
            drop_orphan_documents(conn)

    def chat_documents(self, chat_id: int, with_text: bool = True) -> tuple[StoredDocument, ...]:
        """The chat's documents in the order they were added."""
        text = "d.text" if with_text else "''"
        fit = "cd.fit" if self.schema_version >= 3 else "'whole'"
        rows = self._read(
            f"SELECT d.sha256, d.title, d.source, d.bytes, d.format, cd.position, cd.token_counts, {text}, {fit} "
            "FROM chat_documents cd JOIN documents d ON d.sha256 = cd.doc_sha256 "
            "WHERE cd.chat_id = ? ORDER BY cd.position", (chat_id,))
        return tuple(StoredDocument(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7], r[8]) for r in rows)

    def set_document_fit(self, chat_id: int, sha256: str, fit: str) -> None:
        """Keep how a chat's document goes into the prompt: "whole" or "passages"."""
        if fit not in ("whole", "passages"):
            raise ValueError(f"fit must be 'whole' or 'passages', not {fit!r}")
        with self.transaction() as conn:
            if not conn.execute("UPDATE chat_documents SET fit = ? WHERE chat_id = ? AND doc_sha256 = ?",
                                (fit, chat_id, sha256)).rowcount:
                raise StoreError(f"Chat {chat_id} has no document {sha256[:12]} (removed meanwhile?).")

    def set_token_count(self, chat_id: int, sha256: str, model_id: str, tokens: int) -> None:
        """Remember a document's token count under one model's tokenizer."""
        with self.transaction() as conn:
            row = conn.execute("SELECT token_counts FROM chat_documents WHERE chat_id = ? AND doc_sha256 = ?",
                               (chat_id, sha256)).fetchone()
            if row is None:
                raise StoreError(f"Chat {chat_id} has no document {sha256[:12]} (removed meanwhile?).")
            counts = json.loads(row[0]) | {model_id: int(tokens)}
            conn.execute("UPDATE chat_documents SET token_counts = ? WHERE chat_id = ? AND doc_sha256 = ?",
                         (dumps(counts), chat_id, sha256))

    # -- global settings ------------------------------------------------------------------------
    def set_setting(self, key: str, value: Any) -> None:
        """Store one JSON-able app setting."""
        with self.transaction() as conn:
            conn.execute("INSERT INTO settings (key, value) VALUES (?, ?) "
                         "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, dumps(value)))

    def get_setting(self, key: str, default: Any = None) -> Any:
        rows = self._read("SELECT value FROM settings WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else default

    # -- export ---------------------------------------------------------------------------------
    def export_json(self, chat_id: int, include_document_text: bool = False) -> dict:
        """A self-describing dict of the chat (times as ISO 8601 UTC), ready for json.dump."""
        chat = self.get_chat(chat_id)
        docs = self.chat_documents(chat_id, with_text=include_document_text)
        return {
            "format": "triforce-chat",
            "schema": self.schema_version,
            "exported": iso(time.time()),
            "chat": {"id": chat.id, "title": chat.title, "created": iso(chat.created),
                     "updated": iso(chat.updated), "model_spec": chat.model_spec, "settings": chat.settings},
            "messages": [{"idx": m.idx, "role": m.role, "text": m.text, "created": iso(m.created),
                          "stats": m.stats, "level_spans": [list(s) for s in m.level_spans], "state": m.state,
                          **({} if m.passages is None else {"passages": [dict(p) for p in m.passages]})}
                         for m in chat.messages],
            "documents": [{"sha256": d.sha256, "title": d.title, "source": d.source, "bytes": d.bytes,
                           "format": d.format, "position": d.position, "token_counts": d.token_counts, "fit": d.fit,
                           **({"text": d.text} if include_document_text else {})} for d in docs],
        }

    def export_markdown(self, chat_id: int) -> str:
        """The conversation as Markdown: a header, the documents by title, then each message."""
        chat = self.get_chat(chat_id)
        lines = [f"# {chat.title}", ""]
        if chat.model_spec:
            lines.append(f"- Model: {chat.model_spec}")
        lines.append(f"- Created: {iso(chat.created)}")
        for doc in self.chat_documents(chat_id, with_text=False):
            fit = ", answered from its most relevant passages" if doc.fit == "passages" else ""
            lines.append(f"- Document: {doc.title} ({doc.format}, {doc.bytes:,} bytes{fit})")
        for message in chat.messages:
            lines += ["", f"## {message.role.capitalize()}", "", message.text.rstrip()]
            if message.state != "done":
                lines += ["", _PARTIAL_NOTES[message.role == "user"][message.state]]
            if message.passages is not None:
                lines += ["", *passages_markdown(message.passages)]
        return "\n".join(lines) + "\n"

    # -- helpers --------------------------------------------------------------------------------
    def _update_chat(self, chat_id: int, assignment: str, params: tuple) -> None:
        with self.transaction() as conn:
            self._require_chat(conn, chat_id)
            conn.execute(f"UPDATE chats SET {assignment}, updated = ? WHERE id = ?", (*params, time.time(), chat_id))

    def _chat_row(self, chat_id: int) -> sqlite3.Row:
        rows = self._read("SELECT * FROM chats WHERE id = ?", (chat_id,))
        if not rows:
            raise _no_chat(chat_id)
        return rows[0]

    @staticmethod
    def _require_chat(conn: sqlite3.Connection, chat_id: int) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            raise _no_chat(chat_id)
        return row


_PARTIAL_NOTES = (  # what an export says under a message that is not whole: [is a question][state]
    {"streaming": "*(partial answer: still being written)*", "stopped": "*(stopped: partial answer)*",
     "interrupted": "*(interrupted: partial answer)*"},
    {"streaming": "", "stopped": "*(not answered: stopped)*", "interrupted": "*(not answered: interrupted)*"},
)


def passages_markdown(passages: Sequence[dict]) -> list[str]:
    """The lines listing an answer's cited passages: a lead-in, then one quoted item per passage."""
    if not passages:
        return ["*Answered without the document: no passage shares a word with the question.*"]
    titles = ", ".join(f"“{t}”" for t in dict.fromkeys(p["document"] for p in passages))
    lines = [f"*Answered from {len(passages)} passage{'s' if len(passages) != 1 else ''} of {titles}:*", ""]
    for p in passages:
        lines.append(f"- **{p['document']}, {p['label']}:** {' '.join(p['text'].split())}")
    return lines


def _check_state(state: str) -> str:
    if state not in STATES:
        raise ValueError(f"state must be one of {STATES}, not {state!r}")
    return state


def _no_chat(chat_id: int) -> StoreError:
    return StoreError(f"Chat {chat_id} does not exist (deleted meanwhile?). Pick another chat from the list.")


__all__ = ["ChatStore", "Chat", "ChatSummary", "Message", "StoredDocument", "Migration", "MIGRATIONS", "ROLES",
           "STATES", "Turn"]
