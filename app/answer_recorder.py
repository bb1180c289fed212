"""Keeps the answer being streamed in the chat store while it grows, so a crash loses little.

The first save happens after `save_interval_s`, then every interval; the end replaces it with
the final text (marked partial when stopped), or removes it when nothing came out.
"""
from __future__ import annotations

import time
from typing import Sequence

from app.chat_repo import ChatRepo
from app.worker import TokenBatch

PARTIAL_SAVE_INTERVAL_S = 2.0  # a crash mid-answer loses at most this much of it


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
    """One assistant answer of chat `chat_id`, as it streams."""

    def __init__(self, repo: ChatRepo, chat_id: int, save_interval_s: float = PARTIAL_SAVE_INTERVAL_S) -> None:
        self.repo = repo
        self.chat_id = chat_id
        self.text = ""
        self.segments: list[tuple[str, int]] = []
        self.index: int | None = None  # the message's position in the store once saved
        self._interval = save_interval_s
        self._saved_at = time.monotonic()

    def add(self, batch: TokenBatch) -> None:
        for piece in batch.pieces:
            self.text += piece.text
            self.segments.append((piece.text, int(piece.level)))
        if time.monotonic() - self._saved_at >= self._interval:
            self.save(self.text, {"partial": True, "footer": "interrupted — partial answer"})

    def save(self, text: str, stats: dict) -> None:
        """Write `text` as the answer (first call adds the message, later calls update it)."""
        segments = fit_segments(self.segments, text)
        if self.index is None:
            self.index = self.repo.add_message(self.chat_id, "assistant", text, stats, segments)
        else:
            self.repo.update_message(self.chat_id, self.index, text, stats, segments)
        self._saved_at = time.monotonic()

    def discard(self) -> None:
        """Nothing worth keeping came out: remove what was saved so far."""
        if self.index is not None:
            self.repo.delete_messages_from(self.chat_id, self.index)
            self.index = None
