"""Fit a conversation to the context, putting each document in whole or as its most relevant passages.

The glue between `engine.documents.passages` (splitting, BM25, selection) and the chat template:
the budget is measured on the real prompt (system prompt, documents, history, question), so the
result never overflows, and the reserve for the answer stays free.
"""
from __future__ import annotations

from typing import Sequence

from engine.decoding.prompt import render_tokens
from engine.documents.passages import FITS, FitResult, fit_documents, token_counter
from engine.errors import ContextOverflowError
from engine.events import ChatMessage, DocumentText

__all__ = ["FITS", "FitResult", "fit_prompt", "overflow_message", "SPECULATION_SLACK"]

SPECULATION_SLACK = 64  # tokens kept free past the answer: one speculation round may overshoot it


def fit_prompt(tokenizer, messages: Sequence[ChatMessage], documents: Sequence[DocumentText],
               fits: Sequence[str], system: str | None, context_tokens: int, answer_tokens: int) -> FitResult:
    """Documents ready for the prompt: "whole" ones as they are, "passages" ones replaced by the passages
    most relevant to the last user message. Raises ContextOverflowError when it cannot fit: for
    whole documents the message names `--fit passages` / the passages option as the way out."""
    messages, documents = list(messages), list(documents)

    def measure(docs: Sequence[DocumentText]) -> int:
        return len(render_tokens(tokenizer, messages, list(docs), system))

    if "passages" not in fits:
        used = measure(documents)  # today's rule, unchanged: prompt + answer within the context
        if used + answer_tokens > context_tokens:
            raise ContextOverflowError(overflow_message(used, answer_tokens, context_tokens, bool(documents)))
        return FitResult(tuple(documents), (None,) * len(documents), used, context_tokens - answer_tokens)
    question = next((m.content for m in reversed(messages) if m.role == "user"), "")
    limit = context_tokens - answer_tokens - SPECULATION_SLACK
    # the history gets a reserve (an eighth of the context): until it is used up, a longer chat
    # leaves the selection's budget alone, so asking again reuses the passages' KV
    last = [m for m in messages if m.role == "user"][-1:]
    history = measure([]) - len(render_tokens(tokenizer, last, [], system))
    reserve = max(0, context_tokens // 8 - history)
    return fit_documents(documents, fits, question, measure, limit, token_counter(tokenizer),
                         history_reserve=reserve)


def overflow_message(prompt_tokens: int, answer_tokens: int, context_tokens: int, has_documents: bool) -> str:
    """The refusal, with the numbers and every way forward (passages first when there is a document)."""
    needed = prompt_tokens + answer_tokens
    ways = ("answer from the most relevant passages (--fit passages), shorten the document, "
            if has_documents else "start a new chat, ")
    return (f"the prompt is {prompt_tokens:,} tokens and the answer may take {answer_tokens:,} more "
            f"({needed:,}), but this model's context holds {context_tokens:,}: "
            f"{ways}lower --max-new-tokens, or pick a model with a longer context")
