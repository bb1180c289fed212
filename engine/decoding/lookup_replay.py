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

A draft-length rule is replayed the same way: (γ, γ after a full draft) drafts γ tokens, or the
second length right after a cycle that kept its whole draft (n-gram drafts hold or fail in stretches:
a draft kept whole says the text is copying), so a rule can beat every single length.

This replaces a geometric acceptance model for draft-only. That model treats tokens as independent,
but n-gram drafts hold or fail in stretches, so that model prices draft-only well above what it
really runs at, even above ar.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.decoding.drafters import NgramDrafter, common_prefix

LOOKUP_TOKENS = 8  # tokens of each lookup checked against the target's: draft-only's longest replayable draft
# the replay covers the last 192 settled positions (about three answers): a shorter window rates
# the draft lengths by the stretch of text it holds, and the choice wanders among them
REPLAY_POSITIONS = 192
MIN_REPLAY = 16  # fewer settled positions than this: draft-only is priced by the acceptance model


def lookup_outcome(tokens: list[int], seq: list[int], position: int) -> tuple[int, int, bool]:
    """A lookup at `position` that guessed `tokens`, against `seq` as now known: (guesses known,
    of those matched, settled: a token differs or all it guessed are known)."""
    known = seq[position:position + len(tokens)]
    matched = common_prefix(tokens, known)
    return len(known), matched, matched < len(known) or len(known) == len(tokens)


def draft_cycle(offered: int, matched: int, gamma: int) -> tuple[int, int]:
    """One replayed draft-only cycle at a position whose lookup offered `offered` tokens, `matched`
    of them right: (tokens its L2 forward checks, tokens it yields)."""
    checked = offered if offered < gamma else gamma
    return checked + 1, (matched if matched < checked else checked) + 1


def kept_whole(checked: int, gain: int) -> bool:
    """Did a draft-only cycle that checked `checked` tokens and yielded `gain` keep a whole draft
    (at least one drafted token, all of them accepted)?"""
    return checked > 1 and gain == checked


def rule_length(gamma: int, after_full: int, full: bool) -> int:
    """The draft length of a cycle under the rule (`gamma`, `after_full`): `after_full` right after
    a cycle that kept its whole draft (`full`), else `gamma` (`after_full` 0: always `gamma`)."""
    return after_full if full and after_full else gamma


class Window(deque):
    """The settled positions' (offered, matched), the latest REPLAY_POSITIONS of them, counting
    every position ever appended (`total`), so that a replay can tell which positions are new;
    `tags` holds, position by position, what the caller tagged each with (the mode that emitted it)."""

    def __init__(self) -> None:
        super().__init__(maxlen=REPLAY_POSITIONS)
        self.tags: deque = deque(maxlen=REPLAY_POSITIONS)
        self.total = 0

    def append(self, item: tuple[int, int], tag: object = None) -> None:
        super().append(item)
        self.tags.append(tag)
        self.total += 1

    def extend(self, items: Iterable[tuple[int, int]]) -> None:
        for item in items:
            self.append(item)


@dataclass
class Walk:
    """One draft-length rule's replayed cycles over the window, kept between replays: the cycles run
    over positions that stay in the window do not change, so each replay walks only the positions
    new at the window's end and, where the window's start moved, until that walk meets the old one
    (at the same position, entered in the same state: whether the cycle before kept its whole draft)."""

    gamma: int = 1
    after_full: int = 0  # the draft length right after a cycle that kept its whole draft (0: gamma)
    cycles: deque[tuple[int, int, int, bool]] = field(default_factory=deque)  # (first position
    # (absolute), tokens checked, tokens yielded, entered after a whole draft) per cycle, in order
    checks: dict[int, int] = field(default_factory=dict)  # tokens checked -> cycles that check that many
    tokens: int = 0
    after: int = 0  # the position after the last cycle (absolute)
    full: bool = False  # the last cycle kept its whole draft
    seen: int = -1  # the window's `total` when last followed

    def follow(self, history: Window) -> None:
        """Bring the walk up to the window `history`. (Written out flat, one call a cycle: auto
        follows ~20 walks at each scoring, after a forward has evicted its data from the caches.)"""
        total = history.total
        if self.seen == total:
            return
        front = total - len(history)  # the window's first position (absolute)
        cycles, checks, gamma, after_full = self.cycles, self.checks, self.gamma, self.after_full
        reads_full = after_full not in (0, gamma)  # the rule reads the state a cycle is entered in
        tokens = self.tokens
        while cycles and cycles[0][0] < front:  # cycles from before the window's start
            _, size, gain, _ = cycles.popleft()
            checks[size] -= 1
            tokens -= gain
        if not cycles:
            at, full = front, False
        else:  # walk from the new start until it meets the old walk (then they coincide)
            at, full, head = front, False, []
            while cycles and (at != cycles[0][0] or (full and reads_full) != cycles[0][3]):
                if at >= cycles[0][0]:
                    _, size, gain, _ = cycles.popleft()
                    checks[size] -= 1
                    tokens -= gain
                    continue
                entered = full and reads_full
                size, gain = draft_cycle(*history[at - front], after_full if entered else gamma)
                head.append((at, size, gain, entered))
                at, full = at + gain, size > 1 and gain == size  # (kept_whole)
            if cycles:
                at, full = self.after, self.full
            for c in reversed(head):
                cycles.appendleft(c)
                checks[c[1]] = checks.get(c[1], 0) + 1
                tokens += c[2]
        while at < total:
            entered = full and reads_full
            size, gain = draft_cycle(*history[at - front], after_full if entered else gamma)
            cycles.append((at, size, gain, entered))
            checks[size] = checks.get(size, 0) + 1
            tokens += gain
            at, full = at + gain, size > 1 and gain == size
        self.after, self.full, self.seen, self.tokens = at, full, total, tokens


class LookupLog:
    """Per sequence position, in order: (tokens an n-gram lookup offered there, how many of them the
    target then emitted). A lookup is settled once a token differs or all it offered are known."""

    def __init__(self) -> None:
        self.settled = Window()
        self._walks: dict[tuple[int, int], Walk] = {}  # (draft length, after a whole draft) -> its cycles
        self._open: list[tuple[int, list[int], object]] = []  # (position of the first guessed token, guesses, tag)

    def add(self, position: int, tokens: list[int], tag: object = None) -> None:
        """A lookup at `position` (the sequence held `position` tokens) offered `tokens`; `tag`:
        what emitted the token there (the mode of the cycle), for `replay_tagged`."""
        self._open.append((position, tokens[:LOOKUP_TOKENS], tag))

    def settle(self, seq: list[int]) -> None:
        """`seq` is the sequence as now known: settle the open lookups whose fate it decides, oldest
        first (a later one waits behind an earlier one, so `settled` stays in position order)."""
        done = 0
        for position, tokens, tag in self._open:
            _, matched, settled = lookup_outcome(tokens, seq, position)
            if not settled:
                break
            self.settled.append((len(tokens), matched), tag)
            done += 1
        del self._open[:done]

    def close(self) -> None:
        """The sequence changes under the open lookups (a new prompt): drop them."""
        self._open = []

    def ready(self) -> bool:
        return len(self.settled) >= MIN_REPLAY

    def replay(self, gamma: int, forward: Callable[[int], float],
               after_full: int = 0) -> tuple[float, int, int] | None:
        """draft-only with draft length `gamma` (`after_full` right after a cycle that kept its
        whole draft; 0: always `gamma`) over the settled positions: (seconds of its L2 forwards,
        `forward(n)` being one checking n tokens; tokens it yields; cycles), or None when too few
        positions are settled."""
        if not self.ready():
            return None
        walk = self._walk(gamma, after_full)
        seconds = sum(count * forward(size) for size, count in walk.checks.items() if count)
        return seconds, walk.tokens, len(walk.cycles)

    def replay_checks(self, gamma: int, after_full: int = 0) -> dict[int, int]:
        """How many of `replay(gamma, after_full)`'s cycles check each number of tokens (empty when
        too few positions are settled)."""
        if not self.ready():
            return {}
        return {size: count for size, count in self._walk(gamma, after_full).checks.items() if count}

    def _walk(self, gamma: int, after_full: int) -> Walk:
        """The rule's walk, brought up to the window (the positions new since the last replay: a few a cycle)."""
        walk = self._walks.get((gamma, after_full))
        if walk is None:
            walk = self._walks[gamma, after_full] = Walk(gamma, after_full)
        walk.follow(self.settled)
        return walk

    def replay_tagged(self, tag: object, gamma: int, forward: Callable[[int], float]) -> tuple[float, int]:
        """draft-only with draft length `gamma` over only the settled positions tagged `tag`: each
        run of consecutive ones walked from its first (a cycle may end past the run): (seconds of
        its forwards, tokens it yields). How hard the stretches that one mode emitted were for
        n-gram drafts, next to `replay` over the whole window."""
        seconds, tokens, after = 0.0, 0, 0  # `after`: the first position the last cycle left
        for at, (item, tagged) in enumerate(zip(self.settled, self.settled.tags)):
            if at < after or tagged != tag:
                continue
            size, gain = draft_cycle(*item, gamma)
            seconds, tokens, after = seconds + forward(size), tokens + gain, at + gain
        return seconds, tokens


class ShadowLookups:
    """auto-legacy's n-gram lookups over cycles draft-only did not run: what the n-gram drafter would
    have proposed at each position a cycle covered (for `LookupLog`'s replay), and shadow drafts
    scored against the tokens the target then emitted (draft-only's acceptance while another
    structure runs). Nothing is drawn: the output is untouched."""

    SHADOW_TOKENS = 8  # tokens of a shadow lookup checked against what the target emits

    def __init__(self, policy) -> None:
        self.policy = policy  # has `lookups` (a LookupLog) and `observe(boundary, proposed, accepted)`
        self.shadows: list[tuple[int, list[int], int]] = []  # open shadow drafts: (start, tokens, matched so far)

    def learn(self, seq: list[int], emitted: list[int], boundary: str, drafter, mode) -> None:
        """A cycle of `mode` checked at `boundary` and emitted `emitted` after `seq`: log the lookups
        over its positions, open a shadow draft at its start (unless draft-only ran it), settle the
        open ones. Read off `seq` extended in place and cut back after (a copy of the whole
        sequence per cycle grows with the context)."""
        if not isinstance(drafter, NgramDrafter):
            return
        start = len(seq)
        seq.extend(emitted)
        try:
            log = self.policy.lookups
            lookups = drafter.propose_each(seq, start, LOOKUP_TOKENS)  # [tokens emitted] lists, in order
            for offset, tokens in enumerate(lookups):
                log.add(start + offset, tokens, mode)
            log.settle(seq)
            if lookups and boundary != "l0_l2":
                self.shadow(start, lookups[0])
            self.settle(seq)
        finally:
            del seq[start:]

    def shadow(self, start: int, lookup: list[int]) -> None:
        """Open a shadow draft: what the drafter proposes from the sequence's first `start` tokens. A
        deterministic draft is accepted exactly when the target's own token equals it (under sampling
        with probability p(x)), so its matched prefix is an unbiased draft-only acceptance sample."""
        tokens = lookup[:self.SHADOW_TOKENS]
        if not tokens:
            self.policy.observe("l0_l2", 0, 0)  # an empty lookup: counts against the hit rate
            return
        self.shadows.append((start, tokens, 0))  # tokens[i] guesses the token at start + i

    def settle(self, now: list[int]) -> None:
        """The sequence is now `now`: settle each open shadow draft whose fate is known (a token
        differs, or every token it offered is there); the others wait for the next cycle."""
        open_ = []
        for start, tokens, _ in self.shadows:
            known, matched, settled = lookup_outcome(tokens, now, start)
            if settled:
                self.policy.observe("l0_l2", known, matched)
            else:
                open_.append((start, tokens, matched))
        self.shadows = open_

    def close(self) -> None:
        """The answer ended: what is still open matched every token it saw (at least one); count
        those as accepted. The lookup log closes its answer too."""
        for _, _, matched in self.shadows:
            self.policy.observe("l0_l2", matched, matched)
        self.shadows = []
        self.policy.lookups.close()
