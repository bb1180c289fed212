"""A drafting level's vocabulary: L1 scores only the tokens it is likely to propose.

The vocabulary projection reads the whole embedding table every forward: 30 MB of the bundled
model's 96 MB of weights (its Q8_0 table against the layers' Q4_1), about a third of an L1 forward's
bytes. L1 is a drafter, and the acceptance rule keeps the output exact for ANY draft distribution
q, so L1 may put all of q's mass on a subset of the vocabulary: the tokenizer's first
`COMMON_TOKENS` ids (a BPE vocabulary lists its pieces in merge order, most frequent first), every
token of the prompt (a question about a book is answered in the book's words) and every token seen
since. Outside the subset L1's logits are -inf, so q is 0 there: a drafted token always has q > 0,
and where the target wants a token L1 cannot propose, L1's draft is rejected and the target's token
is taken from the residual max(p - q, 0), as for any other rejection; the token then joins the
subset. (The same idea as FR-Spec, Zhao et al. 2025, which ranks a draft model's vocabulary by
frequency.) Only the target's own forwards ever see the whole table.

On the CPU only: there the head's bytes are the cost, while on a GPU the gather would add launches.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from engine.model.quant import QuantWeight

COMMON_TOKENS = 8192  # the tokenizer's first ids, always in L1's vocabulary
MAX_SHARE = 0.5  # a subset over half the vocabulary saves too little to be worth a second table
SHORT_SCAN = 64  # tokens to add up to which a Python loop is faster than numpy's calls (a cycle's few)


class DraftVocabulary:
    """The subset of the vocabulary a drafting forward scores, and its own slice of the head."""

    def __init__(self, runner, common: int | None = None) -> None:
        self.runner = runner
        self.size = runner.arch.vocab_size
        common = COMMON_TOKENS if common is None else common
        self._member = np.zeros(self.size, dtype=bool)  # [V]
        self._member[:common] = True
        self._count = int(self._member.sum())  # members of the subset
        self._scanned = 0  # seq[:_scanned] is in the subset ...
        self._last: int | None = None  # ... as long as seq[_scanned - 1] is still this token
        self._ids: torch.Tensor | None = None  # [n] int64, sorted: the subset
        self._head = None  # the head's rows at _ids: QuantWeight or float tensor [n, hidden]
        self._fresh = False  # note() scanned a new prompt that cover() has not reported yet
        self.rebuilds = 0

    @classmethod
    def for_runner(cls, runner) -> DraftVocabulary | None:
        """A subset for `runner`'s drafting forwards, or None where it would not pay: off the CPU,
        or a vocabulary too small for the subset to be a small share of it."""
        head = getattr(runner, "lm_head", None)
        if head is None or getattr(runner, "head_device", None) is None or runner.head_device.type != "cpu":
            return None
        if not isinstance(head, (QuantWeight, torch.Tensor)) or runner.arch.vocab_size * MAX_SHARE <= COMMON_TOKENS:
            return None
        return cls(runner)

    @property
    def count(self) -> int:
        """Tokens in the subset."""
        return self._count

    @property
    def active(self) -> bool:
        """Whether the subset is still a small enough share of the vocabulary to be used."""
        return self.count <= MAX_SHARE * self.size

    def cover(self, seq: list[int]) -> bool:
        """Add every token of `seq` (the prompt and what followed) to the subset and have the head's
        slice ready. Scans only what it has not seen, unless `seq` no longer extends what it scanned
        (a new prompt). Returns whether this was a new prompt's first scan (a one-off, like
        selecting the retrieval cache) rather than the answer's own growth."""
        first = self._scan(seq) == 0 or self._fresh
        self._fresh = False
        if self._ids is None and self.active:
            self._rebuild()
        return first

    def contains(self, token: int) -> bool:
        """Whether L1 can propose `token` now."""
        return 0 <= token < self.size and bool(self._member[token])

    def note(self, seq: list[int], emitted: list[int]) -> int:
        """The decoder emitted `emitted` after `seq`, whatever level ran: add them (and `seq`, at a new
        prompt) to the subset, the head's slice left for L1's next use to rebuild. Returns how many of
        `emitted` were new to it: tokens L1 could not have proposed there (auto prices L1 with that
        share, engine/decoding/policy.py)."""
        if self._scan(seq) == 0:
            self._fresh = True
        fresh = [t for t in dict.fromkeys(emitted) if 0 <= t < self.size and not self._member[t]]
        self._scan(seq, emitted)  # seq is scanned by now: only `emitted`, without copying seq
        return len(fresh)

    def _scan(self, seq: list[int], tail: list[int] = ()) -> int:
        """Add what seq + tail holds past the last scan (all of it, at a new prompt); returns where
        the scan started (0: a new prompt)."""
        start = self._scanned
        if start > len(seq) or (start and seq[start - 1] != self._last):
            start = 0
        end = len(seq) + len(tail)
        if start < end:
            if end - start <= SHORT_SCAN:  # a cycle's tokens: numpy's per-call cost exceeds a loop's
                member, added = self._member, 0
                for token in [*seq[start:], *tail]:
                    if 0 <= token < self.size and not member[token]:
                        member[token] = True
                        added += 1
            else:
                fresh = np.asarray(list(seq[start:]) + list(tail), dtype=np.int64)
                self._member[fresh[(fresh >= 0) & (fresh < self.size)]] = True
                # (not np.unique: it imports numpy.ma at its first call, a cost in the first answer)
                added = int(np.count_nonzero(self._member)) - self._count
            if added:
                self._count += added
                self._ids = None
            self._scanned, self._last = end, (tail or seq)[-1]
        return start

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [T, hidden], the final norm's output -> logits [T, V] float32: the head's product for
        the subset's tokens, -inf for the others."""
        if self._ids is None:
            self._rebuild()
        sub = self._head.matmul(h) if isinstance(self._head, QuantWeight) else F.linear(h, self._head)  # [T, n]
        out = torch.full((h.shape[0], self.size), float("-inf"), dtype=torch.float32, device=h.device)
        out.index_copy_(1, self._ids, sub.float())
        return out

    def _rebuild(self) -> None:
        ids = np.flatnonzero(self._member)  # [n] sorted
        head = self.runner.lm_head
        if isinstance(head, QuantWeight):
            self._head = QuantWeight(head.kind, head.blocks[ids], head.in_features)
        else:
            self._head = head[torch.from_numpy(ids).to(head.device)].contiguous()  # [n, hidden]
        self._ids = torch.from_numpy(ids).to(self.runner.head_device)
        self.rebuilds += 1
