"""Typed errors a user can cause. Each message says what happened and what to do.

The CLI prints `str(error)` on one line and exits 2; the app shows it and keeps working.
Anything that is not a `UserError` is a bug and stays loud (traceback).
"""
from __future__ import annotations


class UserError(Exception):
    """Base class: something the user can fix (bad file, unknown model, setting out of range)."""


class ModelNotFoundError(UserError):
    """A model spec names nothing we can find locally or on the hub."""


class ModelFormatError(UserError):
    """A model file or folder exists but is not something we can load."""


class UnsupportedModelError(UserError):
    """The model loads but its architecture is not one the engine runs."""


class IncompatibleDraftError(UserError):
    """The draft model cannot draft for the target (different vocabulary or tokenizer)."""


class InvalidSettingError(UserError, ValueError):
    """A setting is out of its valid range; the message lists the range."""


class ContextOverflowError(UserError):
    """Document + history + answer do not fit the model's context or the reserved cache.

    Where known, the numbers ride along (a front end words its choices from them, not from the
    message): prompt_tokens, answer_tokens (reserved for the answer), context_tokens (the most the
    model or cache holds)."""

    def __init__(self, message: str, *, prompt_tokens: int | None = None, answer_tokens: int | None = None,
                 context_tokens: int | None = None) -> None:
        super().__init__(message)
        self.prompt_tokens, self.answer_tokens, self.context_tokens = prompt_tokens, answer_tokens, context_tokens


class OutOfMemoryPlanError(UserError):
    """The placement plan does not fit the devices; raised before anything is allocated."""


class DocumentError(UserError):
    """A document cannot be read (unknown format, empty, encrypted, corrupt, too large...)."""


class Cancelled(Exception):
    """The user stopped a job (reading, downloading, converting): not an error, nothing is reported.
    Every cancellation the engine raises is one of these, so callers match the class, not a name."""


class ReadCancelled(Cancelled):
    """Reading a document was cancelled by the user."""


class StoreError(UserError):
    """The chat store cannot be opened or written (disk full, permissions, newer schema)."""
