"""Our decoding methods timed side by side, step by step: one session per method, all on one prefill.

On a shared machine the host's speed changes from one answer to the next (the same forwards can
run far slower a minute later), so methods timed one answer after another compare
host states as much as methods. Here every method answers at once: each has its own session (its
own caches and, for auto, its own learned costs, as a user's chat would), and the driver asks each
in turn for its next token. A call that needs a verification cycle computes it; the following calls
hand out that cycle's other tokens for free. So the methods move through the answer token by token
together and each one's compute is spread over the same seconds: a slow spell hits them all alike.

A method's time is what its own calls took after its first token (the same prefill-excluded span as
`Metrics.decode_tokens_per_s`, which cannot be used here: its wall clock also runs while the other
methods compute).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.decoding.session import ChatSession
from engine.events import Finished, Metrics, TokenText
from engine.settings import DecodeSettings


@dataclass
class StepwiseRun:
    """One method's answer, timed by its own calls."""

    tokens: list[int] = field(default_factory=list)
    decode_s: float = 0.0  # seconds inside the method's calls after its first token
    timed_tokens: int = 0  # tokens produced within those seconds
    metrics: Metrics | None = None

    @property
    def ms_per_token(self) -> float:
        return 1000.0 * self.decode_s / self.timed_tokens if self.timed_tokens else float("nan")


def sessions_on_one_prefill(model, methods: list[str], prompt: list[int], settings: DecodeSettings, draft,
                            capacity: int, prefill: dict | None = None) -> dict[str, ChatSession]:
    """A session per method, each holding the prompt's K/V: prefilled once (by a one-token answer in
    the first session) and copied to the others. prefill: filled with that answer's prefill
    tokens, seconds and tokens/s."""
    return named_sessions_on_one_prefill(model, {m: settings.replace(mode=m) for m in methods}, prompt, draft,
                                         capacity, prefill)


def named_sessions_on_one_prefill(model, named: dict[str, DecodeSettings], prompt: list[int], draft,
                                  capacity: int, prefill: dict | None = None) -> dict[str, ChatSession]:
    """`sessions_on_one_prefill` with each session's own settings (one mode at several draft lengths, say)."""
    sessions = {name: ChatSession(model, s, draft=draft, capacity=capacity) for name, s in named.items()}
    first_name = next(iter(named))
    first = sessions[first_name]
    first.update_settings(named[first_name].replace(mode="ar", max_new_tokens=1))
    for event in first.stream_ids(prompt):
        if isinstance(event, Finished) and prefill is not None:
            m = event.metrics
            prefill.update(tokens=m.prefill_tokens, tokens_per_s=m.prefill_tokens_per_s,
                           seconds=m.prefill_tokens / m.prefill_tokens_per_s if m.prefill_tokens_per_s else None)
    first.update_settings(named[first_name])
    for name in list(named)[1:]:
        sessions[name].copy_held_from(first)
    return sessions


def run_side_by_side(sessions: dict[str, ChatSession], order: list[str], prompt: list[int]) -> dict[str, StepwiseRun]:
    """One answer to `prompt` from every session in `order`, asked for tokens in turn (round robin,
    `order[0]` first in every round) until all have finished."""
    streams = {m: sessions[m].stream_ids(prompt) for m in order}
    runs = {m: StepwiseRun() for m in order}
    active = list(order)
    while active:
        for method in list(active):
            run = runs[method]
            timed = bool(run.tokens)  # from the first token on: the prefill and that token are not decode time
            began = time.perf_counter()
            event = next(streams[method], None)
            spent = time.perf_counter() - began
            if timed:
                run.decode_s += spent
            if event is None:
                active.remove(method)
            elif isinstance(event, TokenText):
                run.tokens += event.token_ids
                if timed:
                    run.timed_tokens += len(event.token_ids)
            elif isinstance(event, Finished):
                run.metrics = event.metrics
    return runs
