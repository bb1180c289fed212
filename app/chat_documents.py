"""The documents of the chat on screen: what the engine gets, what the chips show, what the store holds.

A dropped document is shown (chip) as soon as it is read and counted, but stored only when
its prefill finishes, or when a question is sent that uses it; cancelling the prefill of an
unstored document removes it again, so the store never holds a half-attached document.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.events import DocumentText

if TYPE_CHECKING:  # the controller that uses this list stays Qt-free
    from app.chat_repo import ChatRepo
    from app.document_chips import DocumentChips


@dataclass
class AttachedDocument:
    key: int  # the chip's key (a counter local to the window)
    document: DocumentText
    tokens: int | None  # under the loaded model's tokenizer; None until counted
    sha256: str | None = None  # set once it is in the store

    @property
    def saved(self) -> bool:
        return self.sha256 is not None


@dataclass
class Ingest:
    """One ingest job: the chat it was started in (None: a new chat) and what it has read so far."""

    chat_id: int | None
    paths: tuple[str, ...]
    documents: list[AttachedDocument] = field(default_factory=list)


class ChatDocuments:
    """The list behind the chips, kept in step with them and with the store."""

    def __init__(self, repo: "ChatRepo", chips: "DocumentChips") -> None:
        self.repo = repo
        self.chips = chips
        self.items: list[AttachedDocument] = []
        self._counter = 0

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def texts(self) -> tuple[DocumentText, ...]:
        return tuple(a.document for a in self.items)

    def total_tokens(self) -> int:
        return sum(a.tokens or 0 for a in self.items)

    def uncounted(self) -> list[DocumentText]:
        return [a.document for a in self.items if a.tokens is None]

    def find(self, key: int) -> AttachedDocument | None:
        return next((a for a in self.items if a.key == key), None)

    def clear(self) -> None:
        self.items = []
        self.chips.clear()

    def load(self, chat_id: int, model_id: str) -> None:
        """Show `chat_id`'s stored documents (token counts as stored for `model_id`, if any)."""
        self.clear()
        for doc in self.repo.documents(chat_id, model_id):
            self.add(doc, doc.meta.get("tokens"), doc.meta.get("sha256"))

    def add(self, doc: DocumentText, tokens: int | None, sha256: str | None = None) -> AttachedDocument:
        self._counter += 1
        attached = AttachedDocument(self._counter, doc, tokens, sha256)
        self.items.append(attached)
        self.chips.add(attached.key, doc.title, tokens, (doc.meta or {}).get("fit", "whole"))
        return attached

    def drop(self, attached: AttachedDocument) -> None:
        """Take it off the screen (the store is not touched)."""
        if attached in self.items:
            self.items.remove(attached)
        self.chips.remove(attached.key)

    def set_tokens(self, attached: AttachedDocument, tokens: int | None) -> None:
        attached.tokens = tokens
        chip = self.chips.find(attached.key)
        if chip is not None:
            chip.set_tokens(tokens)

    def save(self, attached: AttachedDocument, chat_id: int, model_id: str) -> None:
        if not attached.saved:
            attached.sha256 = self.repo.add_document(chat_id, attached.document, model_id, attached.tokens)

    def save_pending(self, chat_id: int, model_id: str) -> None:
        for attached in self.items:
            self.save(attached, chat_id, model_id)

    def delete(self, attached: AttachedDocument, chat_id: int | None) -> None:
        """Remove from the chat: from the store when it is there, and from the screen."""
        if attached.saved and chat_id is not None:
            self.repo.remove_document(chat_id, attached.sha256)
        self.drop(attached)

    def recount(self, chat_id: int | None, model_id: str) -> None:
        """After a model change: stored counts for the new tokenizer, None (to count) otherwise."""
        known = {}
        if chat_id is not None:
            known = {d.meta.get("sha256"): d.meta.get("tokens") for d in self.repo.documents(chat_id, model_id)}
        for a in self.items:
            self.set_tokens(a, known.get(a.sha256) if a.saved else None)
