"""The context meter in the chat's header: used / total tokens; a click breaks the total down
(system prompt, each document whole or as passages, history, the reserve for the answer); it
turns to a warning while the question being typed would not fit, before it is sent.

Counts of documents are exact (the worker counted them with the model's tokenizer); the system
prompt, the history and the draft question are estimated from their length (about 4 characters
a token) until an answer reports the exact prompt size; estimates are marked "≈".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from PySide6.QtWidgets import QMenu, QToolButton, QWidget

CHARS_PER_TOKEN = 4  # English text under Llama-style tokenizers: a rough, honest estimate
TEMPLATE_TOKENS = 8  # what the chat template adds around each message


@dataclass(frozen=True)
class ContextPart:
    """One use of the context: `kind` is system, document, history, question or reserve."""

    name: str
    tokens: int
    kind: str
    estimated: bool = False


@dataclass(frozen=True)
class ContextBudget:
    """The context's parts; `overflows` when they need more than the model holds."""

    total: int
    parts: tuple[ContextPart, ...]

    @property
    def used(self) -> int:
        """Tokens the prompt takes (the answer's reserve not included)."""
        return sum(p.tokens for p in self.parts if p.kind != "reserve")

    @property
    def needed(self) -> int:
        return sum(p.tokens for p in self.parts)

    @property
    def overflows(self) -> bool:
        return self.total > 0 and self.needed > self.total

    @property
    def estimated(self) -> bool:
        return any(p.estimated for p in self.parts)

    def lines(self) -> list[str]:
        """The breakdown, one line per part, then the total."""
        out = [f"{p.name}: {'≈' if p.estimated else ''}{p.tokens:,} tokens" for p in self.parts]
        out.append(f"Total: {'≈' if self.estimated else ''}{self.needed:,} of {self.total:,} tokens"
                   + (" — too many: the next question would not fit" if self.overflows else ""))
        return out


def estimate_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN) if text else 0


def context_budget(total: int, system: str, documents: Sequence[tuple[str, str, int | None]],
                   history: Sequence[str], question: str, answer_tokens: int,
                   passage_tokens: dict[str, int] | None = None) -> ContextBudget:
    """The parts of the next prompt. documents: (title, fit, tokens); a "passages" document takes
    what its last selection took (`passage_tokens` by title), else what is left of the context."""
    parts = [ContextPart("System prompt", estimate_tokens(system) + TEMPLATE_TOKENS, "system", True)]
    history_tokens = sum(estimate_tokens(m) + TEMPLATE_TOKENS for m in history)
    question_tokens = estimate_tokens(question) + TEMPLATE_TOKENS if question.strip() else 0
    fixed = parts[0].tokens + history_tokens + question_tokens + answer_tokens
    fixed += sum(t or 0 for _, fit, t in documents if fit != "passages")
    passage_docs = [title for title, fit, _ in documents if fit == "passages"]
    free = max(0, total - fixed)
    for title, fit, tokens in documents:
        if fit == "passages":
            known = (passage_tokens or {}).get(title)
            share = known if known is not None else min(tokens or 0, free // max(1, len(passage_docs)))
            parts.append(ContextPart(f"“{title}” (passages)", share, "document", known is None))
        else:
            parts.append(ContextPart(f"“{title}” (whole)", tokens or 0, "document"))
    parts.append(ContextPart("History", history_tokens, "history", True))
    if question_tokens:
        parts.append(ContextPart("Question being typed", question_tokens, "question", True))
    parts.append(ContextPart("Reserve for the answer", answer_tokens, "reserve"))
    return ContextBudget(total, tuple(parts))


class ContextMeter(QToolButton):
    """'≈ 5,210 / 8,192 tokens' in the header; a click opens the breakdown."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("contextMeter")
        self.setAutoRaise(True)
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.breakdown = QMenu(self)
        self.setMenu(self.breakdown)
        self.budget: ContextBudget | None = None
        self.hide()

    def show_budget(self, budget: ContextBudget | None) -> None:
        """Show `budget` (None: no model, nothing to show)."""
        self.budget = budget
        if budget is None or budget.total <= 0:
            self.hide()
            return
        mark = "≈ " if budget.estimated else ""
        warn = "⚠ " if budget.overflows else ""
        self.setText(f"{warn}{mark}{budget.used:,} / {budget.total:,} tokens")
        self.setToolTip("The next question would not fit the context: remove a document, shorten the question, "
                        "answer from passages, or start a new chat. Click for the breakdown."
                        if budget.overflows else "What uses the model's context — click for the breakdown")
        self.setStyleSheet("QToolButton#contextMeter { color: #c0392b; font-weight: 600; }" if budget.overflows
                           else "")
        self.breakdown.clear()
        for line in budget.lines():
            self.breakdown.addAction(line).setEnabled(False)
        self.show()
