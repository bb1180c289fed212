"""Decoding settings: one frozen dataclass, validated against the context it runs on."""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from engine.errors import InvalidSettingError


class Mode(str, enum.Enum):
    """A decoding structure: which levels draft for the target. `auto` picks one of the fixed four
    online (engine/decoding/auto/). A str enum, so `Mode.AR == "ar"` and settings keep strings.
    `auto-legacy` is the previous policy (engine/decoding/policy.py), kept for side-by-side benches only."""

    AUTO = "auto"
    AUTO_LEGACY = "auto-legacy"
    AR = "ar"
    DRAFT_ONLY = "draft-only"
    RETRIEVAL_ONLY = "retrieval-only"
    TRIFORCE = "triforce"

    @property
    def uses_l0(self) -> bool:
        """May this mode run the L0 drafter (so its model and cache must exist)?"""
        return self in (Mode.AUTO, Mode.AUTO_LEGACY, Mode.DRAFT_ONLY, Mode.TRIFORCE)

    @property
    def uses_l1(self) -> bool:
        """May this mode run L1 (the target on the retrieval cache)?"""
        return self in (Mode.AUTO, Mode.AUTO_LEGACY, Mode.RETRIEVAL_ONLY, Mode.TRIFORCE)

    @property
    def chosen_online(self) -> bool:
        """Does a policy pick the structure each cycle (auto, or the legacy auto)?"""
        return self in (Mode.AUTO, Mode.AUTO_LEGACY)

    @staticmethod
    def of(value: "str | Mode") -> "Mode":
        """The Mode named `value`, or InvalidSettingError listing the valid names."""
        try:
            return Mode(value)
        except ValueError:
            raise InvalidSettingError(f"mode {value!r} is unknown: use one of {', '.join(MODES)}") from None


MODES = tuple(m.value for m in Mode if m is not Mode.AUTO_LEGACY)  # "auto" first: the default
BENCH_MODES = MODES + (Mode.AUTO_LEGACY.value,)  # what the bench may run side by side
FIXED_MODES = tuple(m for m in Mode if not m.chosen_online)
MAX_DRAFT = 16  # the most tokens L0 drafts per L1 forward (gamma1's upper bound)


def draft_cache_slack() -> int:
    """Slots past sinks + window the draft's StreamingLLM cache keeps for one draft forward."""
    return max(MAX_DRAFT + 1, 64)


@dataclass(frozen=True)
class Sampling:
    """The target distribution. temperature 0 means greedy (argmax). The penalties (OpenAI's
    presence/frequency style) lower the logit of each token already in the answer: by
    `presence_penalty` once, and by `frequency_penalty` per occurrence (applied before temperature;
    under greedy too). Every decoding level applies them alike (engine/decoding/acceptance.py)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        """Does the warp depend on the answer so far?"""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def validate(self) -> None:
        if not 0.0 <= self.temperature <= 5.0:
            raise InvalidSettingError(f"temperature {self.temperature} is out of range: use 0 (greedy) to 5")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidSettingError(f"top-p {self.top_p} is out of range: use a value in (0, 1]")
        if self.top_k < 0:
            raise InvalidSettingError(f"top-k {self.top_k} is out of range: use 0 (off) or a positive count")
        for name, value in (("presence", self.presence_penalty), ("frequency", self.frequency_penalty)):
            if not -2.0 <= value <= 2.0:
                raise InvalidSettingError(f"{name} penalty {value} is out of range: use -2 to 2 (0: off)")


# What a chat uses when the model's generation_config.json recommends nothing: mild sampling and a
# light penalty on repeats, so a small model does not loop ("He is a patron of the arts." x10).
FALLBACK_SAMPLING = Sampling(temperature=0.7, top_p=0.9, top_k=40)
DEFAULT_PRESENCE_PENALTY = 0.0
DEFAULT_FREQUENCY_PENALTY = 0.3


def recommended_sampling(generation_config: dict | None) -> Sampling:
    """The sampling a model recommends in its generation_config.json (do_sample, temperature, top_p,
    top_k), FALLBACK_SAMPLING's values where it says nothing, plus the default repetition penalties.
    do_sample false means greedy."""
    config = generation_config if isinstance(generation_config, dict) else {}
    base = FALLBACK_SAMPLING
    if config.get("do_sample") is False:
        base = Sampling(temperature=0.0)
    elif config.get("do_sample") is True or any(k in config for k in ("temperature", "top_p", "top_k")):
        base = Sampling(temperature=_number(config.get("temperature"), 1.0),  # transformers' own defaults
                        top_p=_number(config.get("top_p"), 1.0), top_k=int(_number(config.get("top_k"), 0)))
    sampling = dataclasses.replace(base, presence_penalty=DEFAULT_PRESENCE_PENALTY,
                                   frequency_penalty=DEFAULT_FREQUENCY_PENALTY)
    try:
        sampling.validate()
    except InvalidSettingError:
        return dataclasses.replace(FALLBACK_SAMPLING, presence_penalty=DEFAULT_PRESENCE_PENALTY,
                                   frequency_penalty=DEFAULT_FREQUENCY_PENALTY)  # a nonsensical file
    return sampling


def _number(value, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class DecodeSettings:
    """Everything that shapes one answer. Budgets are in tokens.

    budget: retrieval-cache size for L1 (tokens per KV head, chunks included).
    chunk: tokens per retrieval chunk; must divide budget.
    draft_sinks / draft_window: the drafter's StreamingLLM cache (attention sinks + recent tokens).
    gamma1: tokens L0 drafts per L1 verification; gamma2: tokens L1 drafts per L2 verification.
    rebuild_threshold: rebuild the retrieval cache when L1's rolling acceptance drops below this.
    rebuild_stride: ... or every this many generated tokens (0: never by count).
    auto: with a fixed mode, pick its gamma1/gamma2 from measured step times and acceptance
      (mode "auto" picks the structure too).
    """

    mode: str = "auto"
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

    # --- sizes derived from the settings: the one source for the decoder, the caches and the planner
    def fit_budget(self, context_tokens: int) -> "DecodeSettings":
        """These settings with the retrieval budget cut to what a `context_tokens` context can hold
        (a whole number of chunks, at least two): a short model cannot retrieve more than it holds."""
        if self.budget <= context_tokens:
            return self
        return self.replace(budget=max(2 * self.chunk, context_tokens // self.chunk * self.chunk))

    def speculation_tokens(self) -> int:
        """Slots one verification cycle may add past the held tokens: gamma1 + gamma2 + the pending
        token + the bonus token."""
        return self.gamma1 + self.gamma2 + 2

    def retrieval_headroom(self) -> int:
        """Slots the retrieval cache keeps after its budget for recent and speculated tokens before
        a rebuild is forced."""
        spec = 2 * self.speculation_tokens()
        return max(2 * self.chunk + spec, self.rebuild_stride + spec, 128)

    def retrieval_capacity(self, context_tokens: int) -> int:
        """Slots a retrieval cache allocates over a `context_tokens` context: budget + headroom."""
        return min(self.budget, context_tokens) + self.retrieval_headroom()

    def draft_cache_capacity(self) -> int:
        """Slots the draft model's StreamingLLM cache allocates: sinks + window + room for one
        draft forward of up to MAX_DRAFT tokens."""
        return self.draft_sinks + self.draft_window + draft_cache_slack()

    def validate(self, context_tokens: int | None = None) -> None:
        """Raise InvalidSettingError naming the valid range of the first bad value."""
        Mode.of(self.mode)
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
        for name, value, high in (("gamma1", self.gamma1, MAX_DRAFT), ("gamma2", self.gamma2, 32)):
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


def default_budget(context_tokens: int, chunk: int) -> int:
    """The retrieval budget when none is given: ~1/8 of the context, a whole number of chunks, at
    least two chunks and at most 4096 tokens (the CLI and the bench)."""
    return max(2 * chunk, min(4096, (context_tokens // 8) // chunk * chunk))
