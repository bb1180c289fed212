"""What the Qt-free controller asks of its window: `WindowView`, implemented by app/main_window.py
(and by a recording stand-in in the controller's tests)."""
from __future__ import annotations

from typing import Any, Protocol

from app.job_messages import ModelInfo, TokenBatch
from app.overflow import Overflow
from engine.events import Metrics, PrefillProgress, ReadProgress
from engine.settings import DecodeSettings


class WindowView(Protocol):
    """What the controller asks of the window (all on the GUI thread)."""

    def set_status(self, text: str) -> None: ...
    def show_load_stage(self, stage: str) -> None: ...  # noqa: E704 - what a model load does now, timed
    def show_load(self, fraction: float | None) -> None: ...  # noqa: E704
    def hide_load(self) -> None: ...  # noqa: E704
    def show_model(self, info: ModelInfo | None, settings: DecodeSettings | None) -> None: ...  # noqa: E704
    def show_chat(self, chat_id: int | None, title: str, stored: Any, retry_index: int | None) -> None: ...  # noqa: E704
    # stored None: the chat on screen just got its id and title (keep its messages)
    def set_chats(self, chats: Any, current: int | None) -> None: ...  # noqa: E704
    def add_question(self, text: str, index: int) -> None: ...  # noqa: E704
    def start_answer(self) -> None: ...  # noqa: E704
    def append_answer(self, batch: TokenBatch) -> None: ...  # noqa: E704
    def end_answer(self, text: str | None, footer: str, retry: bool) -> None: ...  # noqa: E704
    def list_passages(self, passages: Any) -> None: ...  # noqa: E704 - under the answer just ended
    def remove_after(self, position: int) -> None: ...  # noqa: E704
    def set_generating(self, on: bool) -> None: ...  # noqa: E704
    def show_progress(self, label: str | None, ev: PrefillProgress | ReadProgress | None = None) -> None: ...  # noqa: E704
    def hide_progress(self) -> None: ...  # noqa: E704
    def show_metrics(self, m: Metrics) -> None: ...  # noqa: E704
    def show_prefill(self, ev: PrefillProgress) -> None: ...  # noqa: E704 - the cache bars while a prompt is read
    def reset_live(self) -> None: ...  # noqa: E704 - a new or another chat: no numbers of the last one
    def set_context_text(self, text: str) -> None: ...  # noqa: E704
    # about: what the banner is about (file paths, "model"); clear_banners removes it when that is resolved
    def show_error(self, message: str, details: str = "", about: Any = ()) -> None: ...  # noqa: E704
    def show_notice(self, message: str, about: Any = ()) -> None: ...  # noqa: E704
    def confirm(self, message: str) -> None: ...  # noqa: E704 - a passing "done" (e.g. exported), not kept
    def clear_banners(self, about: Any) -> None: ...  # noqa: E704
    def show_overflow(self, overflow: Overflow) -> None: ...  # noqa: E704
    def decode_settings(self) -> DecodeSettings: ...  # noqa: E704
    def system_prompt(self) -> str: ...  # noqa: E704
    def show_settings_of_chat(self, settings: dict) -> None: ...  # noqa: E704
    def show_settings_error(self, message: str) -> None: ...  # noqa: E704
    def emit(self, name: str, value: Any) -> None: ...  # noqa: E704
