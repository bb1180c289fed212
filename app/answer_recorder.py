"""Keeps the answer being streamed in the chat store while it grows, so a crash loses little.

The answer's row exists from the start (written with its question in one transaction, marked
"streaming"); `add` checkpoints its text every `save_interval_s`; `finish` writes the final text
and how it ended ("done", "stopped" by the user, "interrupted" by an error or shutdown) at once.
A crash leaves the row "streaming"; the store marks it "interrupted" when it is next opened.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
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
        self.timing = AnswerTiming(time.monotonic())
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
        if self.timing.first_token_at is None:
            self.timing.first_token_at = time.monotonic()
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


@dataclass
class AnswerTiming:
    """Where an answer's wait went, on the GUI thread's clock (time.monotonic())."""

    asked_at: float  # the question was sent (or Regenerate / Retry pressed)
    first_token_at: float | None = None
    document_read_s: float | None = None  # a freshly attached document's reading, before or while asked
    passages_at: float | None = None  # the passages were chosen (answers from passages)
    passage_count: int = 0
    prompt_tokens_read: int = 0  # what this answer's own prefill read (history, passages)
    prompt_read_s: float = 0.0

    def parts(self) -> list[str]:
        """'document read 20.3 s', 'chose 12 passages in 3.1 s', 'passages: 9,800 tokens read in 61.2 s'."""
        out = []
        if self.document_read_s is not None:
            out.append(f"document read {fmt_seconds(self.document_read_s)}")
        if self.passages_at is not None:
            out.append(f"chose {self.passage_count} passage{'s' if self.passage_count != 1 else ''} in "
                       f"{fmt_seconds(self.passages_at - self.asked_at)}")
        if self.prompt_tokens_read >= SHOW_READ_MIN_TOKENS:
            what = "passages" if self.passages_at is not None else "prompt"
            out.append(f"{what}: {self.prompt_tokens_read:,} tokens read in {fmt_seconds(self.prompt_read_s)}")
        return out

    @property
    def first_token_s(self) -> float | None:
        """From the question to the first token: reading and choosing passages included."""
        return None if self.first_token_at is None else self.first_token_at - self.asked_at


SHOW_READ_MIN_TOKENS = 192  # a shorter prompt is read too quickly to mention


def answer_footer(ev: "Finished", timing: AnswerTiming | None = None) -> str:
    """How an answer ended and how fast it came, under its bubble; with `timing`, where the wait
    went (reading, choosing passages) and the first token counted from the question."""
    m = ev.metrics
    parts = []
    if ev.reason == FinishReason.CANCELLED:
        parts.append("stopped — partial answer")
    elif ev.reason == FinishReason.LENGTH:
        parts.append("reached the answer length limit")
    if timing is not None:
        parts += timing.parts()
    first = timing.first_token_s if timing is not None else None
    if first is None and m is not None:
        first = m.time_to_first_token_s
    if m is not None:
        if m.new_tokens:
            parts.append(f"{m.new_tokens:,} tokens")
        if m.decode_tokens_per_s:
            parts.append(f"{m.decode_tokens_per_s:.1f} tok/s")
        if first is not None:
            parts.append(f"first token {fmt_seconds(first)}")
        if m.mean_accepted_per_verify:
            parts.append(f"{m.mean_accepted_per_verify:.2f} accepted/verify")
        parts.append(m.mode)
    return " · ".join(parts)
