"""The window's engine jobs as data: what kind each is, which are running, how each one ends.

Qt-free (the controller and its tests use it without a display).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.errors import Cancelled
from engine.events import Finished, FinishReason, Metrics


class JobKind(str, enum.Enum):
    """What a job does. The values are the worker's `JobFailed.kind` strings."""

    LOAD = "load"
    INGEST = "ingest"  # read documents, count, check they fit, prefill them
    PREFILL = "prefill"
    STREAM = "stream"  # prefill the conversation, then stream the answer
    COUNT = "count"  # token counts for a reopened chat's documents

    @property
    def stoppable(self) -> bool:
        """Stop / Esc / leaving the chat cancels these (a model load has its own Cancel)."""
        return self in (JobKind.INGEST, JobKind.PREFILL, JobKind.STREAM)

    @property
    def busy(self) -> bool:
        return self is not JobKind.COUNT

    @property
    def reads(self) -> bool:
        """Shows the progress strip (document prefill or a long conversation prefill)."""
        return self in (JobKind.INGEST, JobKind.PREFILL)


def is_cancellation(error: BaseException | None) -> bool:
    """The user stopped it: every cancellation the engine raises derives from engine.errors.Cancelled."""
    return isinstance(error, Cancelled)


def finished(reason: FinishReason, text: str = "", message: str = "", metrics: Metrics | None = None) -> Finished:
    """The one place the app makes a `Finished` of its own (when the engine could not send one)."""
    return Finished(reason, text, message, metrics)


def failed(message: str) -> Finished:
    return finished(FinishReason.ERROR, "", message)


@dataclass
class JobTable:
    """Running and queued jobs by id, and which of them the window follows."""

    kinds: dict[int, JobKind] = field(default_factory=dict)
    stream: int = 0  # the answer being streamed (0: none)
    load: int = 0  # the newest model load
    count: int = 0  # the newest token count
    progress_shown: int = 0  # the job whose progress the strip shows

    def start(self, job: int, kind: JobKind) -> int:
        self.kinds[job] = kind
        if kind is JobKind.STREAM:
            self.stream = job
        elif kind is JobKind.LOAD:
            self.load = job
        elif kind is JobKind.COUNT:
            self.count = job
        return job

    def kind(self, job: int) -> JobKind | None:
        return self.kinds.get(job)

    def end(self, job: int) -> JobKind | None:
        """Forget `job`; returns its kind (None when it was never started here or already ended)."""
        return self.kinds.pop(job, None)

    def running(self, *kinds: JobKind) -> list[int]:
        return [job for job, kind in self.kinds.items() if kind in kinds]

    def stoppable(self) -> list[int]:
        return [job for job, kind in self.kinds.items() if kind.stoppable]

    def busy(self) -> bool:
        return any(kind.busy for kind in self.kinds.values())

    def reading(self) -> bool:
        return any(kind.reads for kind in self.kinds.values())
