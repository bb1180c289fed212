"""A turn (a question and its answer) as one transaction, with the answer checkpointed as it streams.

`ChatStore.begin_turn` writes the question and an empty answer marked "streaming" together, so
another writer's message can never land between them. `Turn.checkpoint` rewrites the answer's
text at most once per `interval_s` (a kill loses at most that much), and `Turn.finish` writes the
final text and its mark ("done", "stopped" or "interrupted") in one transaction.

A process that dies mid-answer leaves a "streaming" row owned by its host:pid; the next
ChatStore to open the file finds that owner gone and marks the answer "interrupted"
(`recover_interrupted`), and likewise a last question that no answer follows.
"""
from __future__ import annotations

import os
import socket
import sqlite3
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from engine.errors import StoreError
from engine.store.chat_schema import Message, checked_spans, dumps, message_from_row, plain

if TYPE_CHECKING:
    from engine.store.chats import ChatStore

CHECKPOINT_INTERVAL_S = 1.0  # a kill mid-answer loses at most this much of the streamed text
FINAL_STATES = ("done", "stopped", "interrupted")


def writer_id() -> str:
    """This process as the owner of the rows it writes: host:pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(owner: str) -> bool:
    """Is the process that wrote a row still running? Another host's process is assumed alive."""
    host, _, pid = owner.rpartition(":")
    if not host or not pid.isdigit():
        return False  # rows from before owners were recorded
    if host != socket.gethostname():
        return True  # cannot tell (a store on a shared drive): never take a live writer's turn
    return pid_alive(int(pid))


def pid_alive(pid: int) -> bool:
    """Is process `pid` on this machine still running?"""
    if pid == os.getpid():
        return True
    if os.name == "nt":  # os.kill(pid, 0) would terminate the process on Windows
        import ctypes

        handle = ctypes.windll.kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return False
        code = ctypes.c_ulong()
        ctypes.windll.kernel32.GetExitCodeProcess(handle, ctypes.byref(code))
        ctypes.windll.kernel32.CloseHandle(handle)
        return code.value == 259  # STILL_ACTIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def insert_turn(conn: sqlite3.Connection, chat_id: int, question: str, now: float) -> tuple[Message, Message]:
    """Inside a transaction: append the question and an empty streaming answer right after it."""
    owner = writer_id()
    idx = conn.execute("SELECT COALESCE(MAX(idx) + 1, 0) FROM messages WHERE chat_id = ?", (chat_id,)).fetchone()[0]
    rows = []
    for offset, role, text, state in ((0, "user", question, "done"), (1, "assistant", "", "streaming")):
        cur = conn.execute("INSERT INTO messages (chat_id, idx, role, text, created, state, owner) "
                           "VALUES (?,?,?,?,?,?,?)", (chat_id, idx + offset, role, text, now, state, owner))
        rows.append(Message(cur.lastrowid, chat_id, idx + offset, role, text, now, {}, (), state))
    conn.execute("UPDATE chats SET updated = ? WHERE id = ?", (now, chat_id))
    return rows[0], rows[1]


class Turn:
    """One question and its answer being written; made by `ChatStore.begin_turn`."""

    def __init__(self, store: "ChatStore", question: Message, answer: Message,
                 interval_s: float = CHECKPOINT_INTERVAL_S) -> None:
        self.store = store
        self.question = question
        self.answer = answer  # as last written
        self.interval_s = interval_s
        self.finished = False
        self._saved_at = time.monotonic()

    @property
    def chat_id(self) -> int:
        return self.question.chat_id

    def checkpoint(self, text: str, level_spans: Sequence[Sequence[int]] = (), stats: Any = None,
                   *, force: bool = False) -> bool:
        """Save the answer so far if `interval_s` passed since the last save (or `force`); True if saved.
        Returns False without writing when the turn was deleted meanwhile (chat deleted, edited)."""
        if self.finished or (not force and time.monotonic() - self._saved_at < self.interval_s):
            return False
        with self.store.transaction() as conn:
            cur = conn.execute("UPDATE messages SET text = ?, level_spans = ?, stats = ? "
                               "WHERE id = ? AND state = 'streaming'",
                               (text, dumps(checked_spans(level_spans)), dumps(plain(stats)), self.answer.id))
        self._saved_at = time.monotonic()
        return cur.rowcount == 1

    def finish(self, text: str, *, state: str = "done", stats: Any = None,
               level_spans: Sequence[Sequence[int]] = ()) -> Message:
        """Write the final answer and its mark in one transaction: "done", "stopped" (the user
        stopped it) or "interrupted" (a signal or shutdown cut it off). Returns the stored answer."""
        if state not in FINAL_STATES:
            raise ValueError(f"state must be one of {FINAL_STATES}, not {state!r}")
        spans = dumps(checked_spans(level_spans))
        with self.store.transaction() as conn:
            cur = conn.execute("UPDATE messages SET text = ?, level_spans = ?, stats = ?, state = ?, owner = '' "
                               "WHERE id = ?", (text, spans, dumps(plain(stats)), state, self.answer.id))
            if cur.rowcount != 1:
                raise StoreError(f"The answer to \"{self.question.text[:40]}\" can no longer be saved: its chat "
                                 f"{self.chat_id} was deleted or edited meanwhile.")
            conn.execute("UPDATE chats SET updated = ? WHERE id = ?", (time.time(), self.chat_id))
            row = conn.execute("SELECT * FROM messages WHERE id = ?", (self.answer.id,)).fetchone()
        self.finished = True
        self.answer = message_from_row(row)
        return self.answer

    def discard(self) -> None:
        """Remove the question and its answer (the turn failed before anything worth keeping)."""
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM messages WHERE id IN (?, ?)", (self.question.id, self.answer.id))
        self.finished = True


def recover_interrupted(store: "ChatStore") -> int:
    """Mark what crashed writers left behind as "interrupted": streaming answers and last questions
    with no answer whose writing process is gone. Returns how many rows were marked."""
    streaming = store._read("SELECT id, owner FROM messages WHERE state = 'streaming'")
    # the last message of each chat, when it is a question nobody answered
    unanswered = store._read(
        "SELECT m.id, m.owner FROM messages m JOIN (SELECT chat_id, MAX(idx) AS last FROM messages "
        "GROUP BY chat_id) t ON t.chat_id = m.chat_id AND t.last = m.idx WHERE m.role = 'user' AND m.state = 'done'")
    stale = [(row["id"], row["owner"]) for row in (*streaming, *unanswered) if not owner_alive(row["owner"])]
    if not stale:
        return 0
    marked = 0
    with store.transaction() as conn:
        for message_id, owner in stale:
            # re-check inside the write lock: the owner may have finished meanwhile
            marked += conn.execute("UPDATE messages SET state = 'interrupted', owner = '' WHERE id = ? AND owner = ? "
                                   "AND state IN ('streaming', 'done')", (message_id, owner)).rowcount
    return marked
