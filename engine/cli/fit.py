"""`--fit whole|passages` for `main.py chat`: how each document goes into the prompt.

whole (the default): the document goes in as it is; one that does not fit is refused (exit 2, one
line that names --fit passages). passages: the passages most relevant to the question go in instead,
in document order within the context; with --stats they are listed on stderr. The choice is kept
per document with the chat, so `--chat ID` goes on the same way.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from engine.api import FITS, FitResult, fit_prompt, load_tokenizer, text_sha256
from engine.events import ChatMessage, DocumentText


def add_fit_argument(parser: argparse.ArgumentParser) -> None:
    """The --fit option of `chat`."""
    parser.add_argument("--fit", choices=FITS, default=None,
                        help="how documents go into the prompt: whole (default; refused if too long) or "
                             "passages (the passages most relevant to the question, for books longer than the "
                             "context). Kept with the chat; given with --chat it applies to every document")


def document_fits(args: argparse.Namespace, store, chat_id: int | None, stored: int, new: int) -> list[str]:
    """One fit per document: stored documents keep the chat's choice unless --fit is given; new ones take --fit."""
    kept = list(_stored_fits(store, chat_id))[:stored] if (store is not None and chat_id is not None) else []
    kept += ["whole"] * (stored - len(kept))
    if args.fit is not None:
        kept = [args.fit] * stored
    return kept + [args.fit or "whole"] * new


def fit_conversation(args: argparse.Namespace, folder, messages: Sequence[ChatMessage],
                     documents: Sequence[DocumentText], fits: Sequence[str], max_context: int) -> FitResult:
    """The documents as they go into the prompt; raises ContextOverflowError (one line) when they cannot fit."""
    tokenizer = load_tokenizer(folder)  # only the tokenizer: refuse before any weight is read
    return fit_prompt(tokenizer, messages, documents, fits, args.system, max_context, args.max_new_tokens)


def remember_fits(store, chat_id: int, documents: Sequence[DocumentText], fits: Sequence[str]) -> None:
    """Keep each document's fit with the chat (documents already added to it)."""
    if not hasattr(store, "set_document_fit"):
        return
    for doc, fit in zip(documents, fits):
        store.set_document_fit(chat_id, text_sha256(doc.text), fit)


def fit_stats(result: FitResult, fits: Sequence[str], documents: Sequence[DocumentText]) -> dict:
    """For --stats and the stored message: each document's fit and, for passages, the ones used."""
    out = []
    for doc, fit, selection in zip(documents, fits, result.selections):
        entry = {"title": doc.title, "fit": fit}
        if selection is not None:
            entry |= {"passages_used": len(selection.passages), "passages_total": selection.total_passages,
                      "passage_tokens": selection.tokens, "document_tokens": selection.total_tokens,
                      "passages": selection.citations()}
        out.append(entry)
    return {"documents": out, "prompt_limit": result.limit}


def print_passages(result: FitResult, file=sys.stderr) -> None:
    """One line per passage used: `passages: TITLE [label] first words`."""
    for selection in result.selections:
        if selection is None:
            continue
        print(f"passages: {selection.title}: {len(selection.passages)} of {selection.total_passages} "
              f"({selection.tokens:,} of {selection.total_tokens:,} tokens)", file=file)
        for p in selection.passages:
            print(f"  [{p.label}] {p.first_words}", file=file)


def _stored_fits(store, chat_id: int) -> list[str]:
    return [getattr(d, "fit", "whole") or "whole" for d in store.chat_documents(chat_id, with_text=False)]
