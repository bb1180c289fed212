"""What crosses between the engine thread and the GUI thread, besides the engine's own events
(engine.events): frozen dataclasses, Qt-free, so the controller and its tests use them without a display.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.events import ChatMessage, DocumentText, TokenText


@dataclass(frozen=True)
class ModelInfo:
    """What the GUI needs to know about the loaded model."""

    spec: str
    name: str
    model_id: str
    device: str
    max_context: int
    draft: str
    source: str = ""
    draft_spec: str = "ngram"  # what reloading it takes (draft is the name shown)
    context: int = 0  # the window asked for: 0 = as trained, else a YaRN stretch to it
    trained_context: int = 0  # what the model was trained on (0: unknown)
    stretches: tuple[int, ...] = ()  # stretched windows offered that the planner fits here, smallest first


@dataclass(frozen=True)
class LoadProgress:
    """Model resolution/download/conversion progress; `fraction` None means indeterminate."""

    job: int
    stage: str
    fraction: float | None


@dataclass(frozen=True)
class Conversation:
    """What one prompt is made of: the chat's messages, its documents, the system prompt."""

    messages: tuple[ChatMessage, ...]
    documents: tuple[DocumentText, ...] = ()
    system: str | None = None


@dataclass(frozen=True)
class DocumentReady:
    """A document was read, counted and fits; the prefill that follows belongs to the same job."""

    job: int
    path: str
    document: DocumentText
    tokens: int


@dataclass(frozen=True)
class TokenBatch:
    """The answer text of one ~50 ms window: the engine's TokenText pieces, adjacent same-level ones merged."""

    pieces: tuple[TokenText, ...]

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.pieces)


@dataclass(frozen=True)
class JobFailed:
    """A command failed. `user_error`: show `message` and carry on; otherwise it is a bug (`details`)."""

    job: int
    kind: str  # "load", "ingest", "stream", "prefill", "count"
    message: str
    user_error: bool
    details: str = ""
    error: BaseException | None = field(default=None, compare=False)
    path: str = ""
