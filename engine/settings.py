"""Decoding settings: one frozen dataclass, validated against the context it runs on."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.errors import InvalidSettingError

MODES = ("triforce", "ar", "retrieval-only", "draft-only")


@dataclass(frozen=True)
class Sampling:
    """The target distribution. temperature 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        if not 0.0 <= self.temperature <= 5.0:
            raise InvalidSettingError(f"temperature {self.temperature} is out of range: use 0 (greedy) to 5")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidSettingError(f"top-p {self.top_p} is out of range: use a value in (0, 1]")
        if self.top_k < 0:
            raise InvalidSettingError(f"top-k {self.top_k} is out of range: use 0 (off) or a positive count")


@dataclass(frozen=True)
class DecodeSettings:
    """Everything that shapes one answer. Budgets are in tokens.

    budget: retrieval-cache size for L1 (tokens per KV head, chunks included).
    chunk: tokens per retrieval chunk; must divide budget.
    draft_sinks / draft_window: the drafter's StreamingLLM cache (attention sinks + recent tokens).
    gamma1: tokens L0 drafts per L1 verification; gamma2: tokens L1 drafts per L2 verification.
    rebuild_threshold: rebuild the retrieval cache when L1's rolling acceptance drops below this.
    rebuild_stride: ... or every this many generated tokens (0: never by count).
    auto: pick gamma1/gamma2/budget from measured step times and acceptance.
    """

    mode: str = "triforce"
    budget: int = 1024
    chunk: int = 16
    draft_sinks: int = 4
    draft_window: int = 252
    gamma1: int = 4
    gamma2: int = 6
    rebuild_threshold: float = 0.3
    rebuild_stride: int = 0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    sampling: Sampling = Sampling()
    auto: bool = False
    ignore_eos: bool = False  # benchmarks: always generate max_new_tokens, as transformers' generate does

    def replace(self, **changes) -> "DecodeSettings":
        return dataclasses.replace(self, **changes)

    def validate(self, context_tokens: int | None = None) -> None:
        """Raise InvalidSettingError naming the valid range of the first bad value."""
        if self.mode not in MODES:
            raise InvalidSettingError(f"mode {self.mode!r} is unknown: use one of {', '.join(MODES)}")
        if not 1 <= self.chunk <= 1024:
            raise InvalidSettingError(f"chunk {self.chunk} is out of range: use 1 to 1024 tokens")
        if self.budget < 2 * self.chunk:
            raise InvalidSettingError(
                f"budget {self.budget} is too small for chunk {self.chunk}: use at least 2 chunks ({2 * self.chunk} tokens)")
        if self.budget % self.chunk:
            raise InvalidSettingError(
                f"chunk {self.chunk} does not divide budget {self.budget}: use a budget that is a multiple of {self.chunk}"
                f" (e.g. {self.budget // self.chunk * self.chunk or self.chunk})")
        if context_tokens is not None and self.budget > context_tokens:
            raise InvalidSettingError(
                f"budget {self.budget} exceeds the context of {context_tokens} tokens: use {2 * self.chunk} to {context_tokens}")
        for name, value, high in (("gamma1", self.gamma1, 16), ("gamma2", self.gamma2, 32)):
            if not 1 <= value <= high:
                raise InvalidSettingError(f"{name} {value} is out of range: use 1 to {high}")
        if self.draft_sinks < 0 or self.draft_window < 1:
            raise InvalidSettingError(
                f"draft window sinks={self.draft_sinks} recent={self.draft_window} is invalid: sinks >= 0, recent >= 1")
        if not 0.0 <= self.rebuild_threshold <= 1.0:
            raise InvalidSettingError(f"rebuild threshold {self.rebuild_threshold} is out of range: use 0 to 1")
        if self.rebuild_stride < 0:
            raise InvalidSettingError(f"rebuild stride {self.rebuild_stride} is out of range: use 0 (off) or more")
        if self.max_new_tokens < 1:
            raise InvalidSettingError(f"max new tokens {self.max_new_tokens} is out of range: use 1 or more")
        self.sampling.validate()
