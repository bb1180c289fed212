"""Typed, frozen events streamed by `ChatSession.stream()`, and the value types they carry.

A front end sees the engine through engine.api (opening models and sessions, the chat store,
documents) and these events (what a running job reports); the import contracts in pyproject.toml
keep app/ to exactly that.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Level(enum.IntEnum):
    """Which level produced an emitted token.

    L0: drafted by the drafter (model or n-gram) and accepted by L1 and L2.
    L1: drafted by the target on its retrieval cache (or its correction/bonus) and accepted by L2.
    L2: produced by the target with its full cache (a correction, a bonus token, or plain AR).
    """

    L0 = 0
    L1 = 1
    L2 = 2


class FinishReason(str, enum.Enum):
    EOS = "eos"
    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class PrefillProgress:
    """Prefill of the prompt: `done` of `total` new tokens computed (`reused` came from cache/snapshot)."""

    done: int
    total: int
    reused: int
    elapsed_s: float

    @property
    def eta_s(self) -> float | None:
        if self.done <= 0 or self.done >= self.total:
            return None
        return self.elapsed_s / self.done * (self.total - self.done)


@dataclass(frozen=True)
class TokenText:
    """New answer text. `level` says which level's draft produced these tokens."""

    text: str
    token_ids: tuple[int, ...]
    level: Level


@dataclass(frozen=True)
class LevelStats:
    """Speculation counts at one verification boundary (e.g. "l0_l1": L0 drafts checked by L1)."""

    name: str
    proposed: int
    accepted: int
    tested: int = 0  # drafts actually checked: a verification stops at its first rejection

    @property
    def rate(self) -> float | None:
        """Per-token acceptance (the paper's alpha): accepted / checked."""
        checked = self.tested or self.proposed
        return self.accepted / checked if checked else None

    @property
    def share_accepted(self) -> float | None:
        """accepted / proposed: lower than `rate`, since drafts after a rejection count too."""
        return self.accepted / self.proposed if self.proposed else None


@dataclass(frozen=True)
class CacheStats:
    """One cache's occupancy. `tokens`/`capacity` in tokens; bytes are exact tensor bytes."""

    name: str  # "full", "retrieval", "draft"
    tokens: int
    capacity: int
    bytes_used: int
    bytes_reserved: int
    device: str  # "cpu", "cuda:0", "cuda:0+cpu" (offloaded layers)
    detail: str = ""


@dataclass(frozen=True)
class CandidateCost:
    """One structure the `auto` policy weighed, e.g. "triforce g1=2 g2=6", and its predicted
    ms per generated token; `measured` is False while the score still rests on priors."""

    structure: str
    ms_per_token: float
    measured: bool = True


@dataclass(frozen=True)
class Metrics:
    """A snapshot of decoding statistics for the current answer."""

    mode: str
    prompt_tokens: int
    new_tokens: int
    prefill_tokens: int
    prefill_tokens_per_s: float | None
    decode_tokens_per_s: float | None
    time_to_first_token_s: float | None
    levels: tuple[LevelStats, ...] = ()
    caches: tuple[CacheStats, ...] = ()
    mean_accepted_per_verify: float | None = None
    retrieval_rebuilds: int = 0
    settings_summary: str = ""
    structure: str = ""  # what ran last, e.g. "triforce g1=2 g2=6" (under auto: the policy's pick)
    candidates: tuple[CandidateCost, ...] = ()  # auto: every structure weighed, best gammas each
    structure_switches: int = 0  # auto: how often the structure changed during this answer

    def level(self, name: str) -> LevelStats | None:
        return next((lv for lv in self.levels if lv.name == name), None)


@dataclass(frozen=True)
class Finished:
    """The end of one `stream()` call."""

    reason: FinishReason
    text: str
    message: str = ""  # for ERROR: the user-facing message
    metrics: Metrics | None = None


Event = PrefillProgress | TokenText | Metrics | Finished


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system", "user", "assistant"
    content: str


@dataclass(frozen=True)
class ReadProgress:
    """Pages of a document read so far (PDFs; other formats read in one go)."""

    name: str
    done: int
    total: int


@dataclass(frozen=True)
class DocumentText:
    """A document ready to go into the prompt."""

    title: str
    text: str
    source: str = ""
    meta: dict = field(default_factory=dict, compare=False, hash=False)
