"""Keeps the answer being streamed in the chat store while it grows, so a crash loses little.

The answer's row exists from the start (written with its question in one transaction, marked
"streaming"); `add` checkpoints its text every `save_interval_s`; `finish` writes the final text
and how it ended ("done", "stopped" by the user, "interrupted" by an error or shutdown) at once.
A crash leaves the row "streaming"; the store marks it "interrupted" when it is next opened.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

from app.formatting import fmt_seconds
from engine.events import FinishReason

if TYPE_CHECKING:
    from engine.events import Finished
    from app.chat_repo import ChatRepo
    from app.job_messages import TokenBatch

PARTIAL_SAVE_INTERVAL_S = 1.0  # a crash mid-answer loses at most this much of it


def fit_segments(segments: Sequence[tuple[str, int]], text: str) -> list[tuple[str, int]]:
    """The (text, level) pieces cut to `text` (the engine trims stop strings from the final text)."""
    out, pos = [], 0
    for piece, level in segments:
        if pos >= len(text):
            break
        piece = piece[: len(text) - pos]
        if text[pos:pos + len(piece)] != piece:
            return [(text, 2)] if text else []  # they disagree: no level information
        out.append((piece, level))
        pos += len(piece)
    if pos < len(text):
        out.append((text[pos:], 2))
    return out


class AnswerRecorder:
    """One assistant answer of chat `chat_id`, as it streams; `index` is its row in the store."""

    def __init__(self, repo: "ChatRepo", chat_id: int, index: int,
                 save_interval_s: float = PARTIAL_SAVE_INTERVAL_S) -> None:
        self.repo = repo
        self.chat_id = chat_id
        self.index = index
        self.text = ""
        self.segments: list[tuple[str, int]] = []
        self.finished = False
        self.passages: tuple | None = None  # the CitedPassages it was given (a document answered from passages)
        self._interval = save_interval_s
        self._saved_at = time.monotonic()

    @classmethod
    def for_question(cls, repo: "ChatRepo", chat_id: int, question: str) -> tuple[int, "AnswerRecorder"]:
        """Save `question` and the empty answer together; returns (the question's index, the recorder)."""
        asked, answer = repo.begin_turn(chat_id, question)
        return asked, cls(repo, chat_id, answer)

    @classmethod
    def for_last_question(cls, repo: "ChatRepo", chat_id: int) -> "AnswerRecorder":
        """A new answer to the chat's last question (regenerate, retry)."""
        return cls(repo, chat_id, repo.begin_answer(chat_id))

    def add(self, batch: "TokenBatch") -> None:
        for piece in batch.pieces:
            self.text += piece.text
            self.segments.append((piece.text, int(piece.level)))
        if time.monotonic() - self._saved_at >= self._interval:
            self._write(self.text, {"partial": True, "footer": "interrupted — partial answer"}, None)

    def finish(self, text: str, state: str, stats: dict) -> None:
        """The answer's final text and how it ended, in one write. Later calls do nothing."""
        if self.finished:
            return
        self.finished = True
        self._write(text, stats, state)

    def _write(self, text: str, stats: dict, state: str | None) -> None:
        self.repo.update_message(self.chat_id, self.index, text, stats, fit_segments(self.segments, text), state=state,
                                 passages=self.passages)
        self._saved_at = time.monotonic()


def answer_footer(ev: "Finished") -> str:
    """How an answer ended and how fast it came, under its bubble."""
    m = ev.metrics
    parts = []
    if ev.reason == FinishReason.CANCELLED:
        parts.append("stopped — partial answer")
    elif ev.reason == FinishReason.LENGTH:
        parts.append("reached the answer length limit")
    if m is not None:
        if m.new_tokens:
            parts.append(f"{m.new_tokens:,} tokens")
        if m.decode_tokens_per_s:
            parts.append(f"{m.decode_tokens_per_s:.1f} tok/s")
        if m.time_to_first_token_s is not None:
            parts.append(f"first token {fmt_seconds(m.time_to_first_token_s)}")
        if m.mean_accepted_per_verify:
            parts.append(f"{m.mean_accepted_per_verify:.2f} accepted/verify")
        parts.append(m.mode)
    return " · ".join(parts)
