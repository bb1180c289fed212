"""draft-only priced by replaying its n-gram lookups over the tokens the target really emitted.

An n-gram drafter is deterministic and looks only at the sequence, and under greedy the sequence
does not depend on the structure that produced it. So `auto` can ask the drafter at every position
what it would have proposed there (microseconds) and, once the target has emitted the next tokens,
how many of them that proposal got right. A draft-only run with draft length g over those positions
is then known exactly, cycle by cycle: at a position whose lookup found nothing it checks one token
(a plain step); else it checks d = min(offered, g) drafts and keeps the matched ones plus one token
of the target's, and the next cycle starts after them. The forwards' seconds come from the measured
step costs. Under sampling a deterministic draft token is kept exactly when the target's sample
equals it, so the replay is a sample of the same distribution.

This replaces a geometric acceptance model for draft-only. That model treats tokens as independent,
but n-gram drafts hold or fail in stretches: at continue 2K on the Sapphire Rapids machine (trace of
2026-12-02), auto priced draft-only at 28 ms/token against ar's 22 while fixed draft-only ran at 21.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

from engine.decoding.drafters import common_prefix

LOOKUP_TOKENS = 8  # tokens of each lookup checked against the target's: draft-only's longest replayable draft
# the replay covers the last 192 settled positions (three bench answers). Over one answer's 64 it
# rated the draft lengths by the stretch of text the window held: at continue 1K on a Zen 4 auto
# moved among γ1 = 2-8 within answers where fixed γ1 = 4 held; over 192, γ1 = 4 ran 14-19 of an
# answer's ~19 cycles in 6 answers of 8, 8-9 in the others (docs/notes/l2_replay_table.py)
REPLAY_POSITIONS = 192
MIN_REPLAY = 16  # fewer settled positions than this: draft-only is priced by the acceptance model


def lookup_outcome(tokens: list[int], seq: list[int], position: int) -> tuple[int, int, bool]:
    """A lookup at `position` that guessed `tokens`, against `seq` as now known: (guesses known,
    of those matched, settled: a token differs or all it guessed are known)."""
    known = seq[position:position + len(tokens)]
    matched = common_prefix(tokens, known)
    return len(known), matched, matched < len(known) or len(known) == len(tokens)


class LookupLog:
    """Per sequence position, in order: (tokens an n-gram lookup offered there, how many of them the
    target then emitted). A lookup is settled once a token differs or all it offered are known."""

    def __init__(self) -> None:
        self.settled: deque[tuple[int, int]] = deque(maxlen=REPLAY_POSITIONS)
        self._open: list[tuple[int, list[int]]] = []  # (position of the first guessed token, guesses)

    def add(self, position: int, tokens: list[int]) -> None:
        """A lookup at `position` (the sequence held `position` tokens) offered `tokens`."""
        self._open.append((position, tokens[:LOOKUP_TOKENS]))

    def settle(self, seq: list[int]) -> None:
        """`seq` is the sequence as now known: settle the open lookups whose fate it decides, oldest
        first (a later one waits behind an earlier one, so `settled` stays in position order)."""
        done = 0
        for position, tokens in self._open:
            _, matched, settled = lookup_outcome(tokens, seq, position)
            if not settled:
                break
            self.settled.append((len(tokens), matched))
            done += 1
        del self._open[:done]

    def close(self) -> None:
        """The sequence changes under the open lookups (a new prompt): drop them."""
        self._open = []

    def ready(self) -> bool:
        return len(self.settled) >= MIN_REPLAY

    def replay(self, gamma: int, forward: Callable[[int], float]) -> tuple[float, int, int] | None:
        """draft-only with draft length `gamma` over the settled positions: (seconds of its L2
        forwards, `forward(n)` being one checking n tokens; tokens it yields; cycles), or None when
        too few positions are settled."""
        if not self.ready():
            return None
        # the policy replays ~8 gammas per choice: price each check size once, no calls in the loop
        history, price = list(self.settled), [0.0] + [forward(n) for n in range(1, gamma + 2)]  # price[n]: a check of n
        i = seconds = tokens = cycles = 0
        while i < len(history):
            offered, matched = history[i]
            checked = offered if offered < gamma else gamma
            got = (matched if matched < checked else checked) + 1
            seconds += price[checked + 1]
            tokens += got
            cycles += 1
            i += got
        return seconds, tokens, cycles
