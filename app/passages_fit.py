"""Books that do not fit, the app's side (Qt-free): which documents go in as passages, fitting a
conversation before the engine thread streams it, and what the answer cites.

A document's fit travels in its `DocumentText.meta["fit"]` ("whole" when absent), so the chips,
the store and the worker all see the same choice without another list to keep in step.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

from engine.events import DocumentText

PASSAGES = "passages"


def fit_of(doc: DocumentText) -> str:
    """"whole" or "passages"."""
    return (doc.meta or {}).get("fit", "whole")


def with_fit(doc: DocumentText, fit: str) -> DocumentText:
    """The same document marked to go in whole or as its most relevant passages."""
    return dataclasses.replace(doc, meta={**(doc.meta or {}), "fit": fit})


@dataclass(frozen=True)
class CitedPassage:
    """One passage an answer was given from: where it is, its first words, and its text (to show on a click)."""

    document: str
    label: str
    first_words: str
    text: str


@dataclass(frozen=True)
class PassagesUsed:
    """Sent by the engine thread before an answer's first token: the passages it is given, and the
    prompt's size (what the context meter shows)."""

    passages: tuple[CitedPassage, ...]
    prompt_tokens: int
    limit: int
    document_tokens: tuple[tuple[str, str, int], ...] = ()  # (title, fit, tokens in the prompt)


def fit_for_stream(session: Any, messages: Sequence, documents: Sequence[DocumentText],
                   system: str | None) -> tuple[list[DocumentText], PassagesUsed | None]:
    """The documents as the prompt gets them: unchanged when all go in whole, else the "passages"
    ones replaced by their passages most relevant to the last question (runs on the engine thread)."""
    fits = [fit_of(d) for d in documents]
    if PASSAGES not in fits:
        return list(documents), None
    from engine.api import fit_prompt

    fitted = fit_prompt(session.target.tokenizer, list(messages), list(documents), fits, system,
                        getattr(session, "max_capacity", None) or session.target.max_context,
                        session.settings.max_new_tokens)
    cited = tuple(CitedPassage(sel.title, p.label, p.first_words, p.text)
                  for sel in fitted.selections if sel is not None for p in sel.passages)
    sizes = tuple((d.title, fit, sel.tokens if sel is not None else int((d.meta or {}).get("tokens", 0)))
                  for d, fit, sel in zip(documents, fits, fitted.selections))
    return list(fitted.documents), PassagesUsed(cited, fitted.prompt_tokens, fitted.limit, sizes)


def prefill_documents(documents: Sequence[DocumentText]) -> list[DocumentText]:
    """What a document's prefill reads before any question: the whole documents only (a passages
    document's selection depends on the question; its system prompt prefix is still prefilled)."""
    return [d for d in documents if fit_of(d) != PASSAGES]
