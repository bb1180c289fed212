"""A scripted stand-in for the engine, for GUI tests that need exact timing or failure states.

It yields the same event dataclasses as `ChatSession` and honours `cancel()` between steps,
so the app cannot tell it apart except by speed. Integration tests use the real engine.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from engine.errors import Cancelled, ContextOverflowError, DocumentError
from engine.events import (CacheStats, ChatMessage, DocumentText, Finished, FinishReason, Level, LevelStats, Metrics,
                           PrefillProgress, TokenText)
from engine.settings import DecodeSettings

WORDS = ("The ", "prince ", "speaks ", "to ", "the ", "ghost ", "on ", "the ", "battlements, ", "and ",
         "**swears** ", "revenge. ")


@dataclass
class FakeFolder:
    name: str = "FakeLM-1M"
    model_id: str = "fake/FakeLM"
    source: str = "test"


@dataclass
class FakeModel:
    folder: FakeFolder
    max_context: int = 8192
    device: str = "cpu"


class FakeSession:
    def __init__(self, target: FakeModel, settings: DecodeSettings, step_s: float = 0.01,
                 prefill_step_s: float = 0.01, tokens: int = 40) -> None:
        self.target = target
        self.settings = settings
        self.step_s = step_s
        self.prefill_step_s = prefill_step_s
        self.tokens = tokens
        self._cancel = threading.Event()
        self.settings_history: list[DecodeSettings] = [settings]
        self.streams: list[tuple[list[ChatMessage], list[DocumentText], str | None]] = []

    def cancel(self) -> None:
        self._cancel.set()

    def update_settings(self, settings: DecodeSettings) -> None:
        settings.validate(self.target.max_context)
        self.settings = settings
        self.settings_history.append(settings)

    def count_tokens(self, text: str) -> int:
        return max(1, len(text) // 4)

    def check_fits(self, messages, documents, system=None) -> None:
        """Like ChatSession.check_fits, with the engine's message (the app parses its numbers)."""
        prompt = sum(self.count_tokens(d.text) for d in documents) + sum(len(m.content) // 4 for m in messages)
        answer = self.settings.max_new_tokens
        if prompt + answer > self.target.max_context:
            raise ContextOverflowError(
                f"the conversation needs {prompt:,} prompt tokens + {answer:,} for the answer = "
                f"{prompt + answer:,}, but this model's context holds {self.target.max_context:,}: remove a "
                f"document, start a new chat, lower the answer length, or pick a model with a longer context")

    def _prefill(self, messages, documents) -> Iterator[PrefillProgress]:
        total = sum(self.count_tokens(d.text) for d in documents) + 20 * len(messages)
        t0 = time.monotonic()
        done = 0
        while done < total:
            if self._cancel.is_set():
                return
            time.sleep(self.prefill_step_s)
            done = min(total, done + 256)
            yield PrefillProgress(done, total, 0, time.monotonic() - t0)

    def prefill(self, messages: Sequence[ChatMessage], documents: Sequence[DocumentText] = (), system=None,
                cancel: threading.Event | None = None):
        self._cancel = cancel if cancel is not None else threading.Event()  # each job its own token
        yield from self._prefill(messages, documents)
        if self._cancel.is_set():
            yield Finished(FinishReason.CANCELLED, "")
            return
        yield Finished(FinishReason.STOP, "", metrics=self._metrics(0))

    def stream(self, messages: Sequence[ChatMessage], documents: Sequence[DocumentText] = (), system=None,
               cancel: threading.Event | None = None):
        self._cancel = cancel if cancel is not None else threading.Event()
        self.streams.append((list(messages), list(documents), system))
        yield from self._prefill(messages, documents)
        text = ""
        for i in range(self.tokens):
            if self._cancel.is_set():
                yield Finished(FinishReason.CANCELLED, text, metrics=self._metrics(i))
                return
            time.sleep(self.step_s)
            piece = WORDS[i % len(WORDS)]
            text += piece
            yield TokenText(piece, (i,), Level(i % 3))
            if i % 5 == 4:
                yield self._metrics(i + 1)
        yield Finished(FinishReason.EOS, text, metrics=self._metrics(self.tokens))

    def _metrics(self, n: int) -> Metrics:
        s = self.settings
        return Metrics(
            mode=s.mode, prompt_tokens=1200, new_tokens=n, prefill_tokens=1200, prefill_tokens_per_s=2400.0,
            decode_tokens_per_s=38.5 if n else None, time_to_first_token_s=0.42 if n else None,
            levels=(LevelStats("l0_l1", 4 * n, 3 * n), LevelStats("l1_l2", 2 * n, int(1.8 * n))),
            caches=(CacheStats("full", 1200 + n, self.target.max_context, (1200 + n) * 4096,
                               self.target.max_context * 4096, "cpu"),
                    CacheStats("retrieval", min(s.budget, 1200), s.budget, min(s.budget, 1200) * 4096,
                               s.budget * 4096, "cpu", f"{s.budget // s.chunk} chunks of {s.chunk}"),
                    CacheStats("draft", min(s.draft_sinks + s.draft_window, 1200 + n),
                               s.draft_sinks + s.draft_window, 0, 0, "cpu", "n-gram")),
            mean_accepted_per_verify=3.1 if n else None, retrieval_rebuilds=1,
            settings_summary=f"budget {s.budget}")


class LoadCancelled(Cancelled):
    """Like engine.store.models.ResolveCancelled."""


class FakeBackend:
    """`EngineBackend` stand-in: loads a FakeModel, builds a FakeSession, reads text files."""

    def __init__(self, step_s: float = 0.01, prefill_step_s: float = 0.01, tokens: int = 40,
                 max_context: int = 8192, load_s: float = 0.0) -> None:
        self.step_s, self.prefill_step_s, self.tokens = step_s, prefill_step_s, tokens
        self.max_context = max_context
        self.load_s = load_s
        self.sessions: list[FakeSession] = []
        self.loads: list[int] = []  # the context each target load asked for (0: as trained)

    def resolve(self, spec, progress, cancel):
        for i in range(50):
            if cancel():
                raise LoadCancelled("cancelled")
            progress(f"Downloading {spec}", i / 49)
            time.sleep(self.load_s / 50)
        return spec

    def plan_for(self, resolved, draft_resolved, settings, context=0):
        return None  # no GPU: nothing to place

    def load(self, resolved, plan=None, draft=False, context=0):
        if not draft:
            self.loads.append(context)
        return FakeModel(FakeFolder(), max(self.max_context, context or 0))

    def stretches(self, resolved, draft, settings):
        """Like EngineBackend.stretches: x2 and x4 of the trained context, as if both fit."""
        return self.max_context, (2 * self.max_context, 4 * self.max_context)

    def session(self, target, settings, draft, plan=None):
        s = FakeSession(target, settings, self.step_s, self.prefill_step_s, self.tokens)
        self.sessions.append(s)
        return s

    def read_document(self, path: str, progress=None, cancel=None) -> DocumentText:
        p = Path(path)
        if p.suffix.lower() not in (".txt", ".md"):
            raise DocumentError(f'"{p.name}" is not a text file: use .txt or .md')
        return DocumentText(p.stem, p.read_text(encoding="utf-8"), str(p))

