"""L0 drafters: propose a few tokens cheaply. A drafter sees the whole sequence so far (prompt,
history, answer, and the speculated tokens of the level above) and returns its guesses with the
distributions it drew them from (None: deterministic guesses, i.e. one-hot q).
"""
from __future__ import annotations

import torch

from engine.acceptance import sample_token
from engine.cache_streaming import StreamingCache
from engine.errors import IncompatibleDraftError
from engine.runner import LlamaRunner
from engine.settings import Sampling


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class NoDrafter:
    name = "none"

    def propose(self, seq: list[int], count: int, sampling: Sampling,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        return [], None

    def cache_stats(self):
        return None


class NgramDrafter:
    """Prompt-lookup drafting: find the latest earlier occurrence of the sequence's last n tokens
    (n = max_n down to min_n) anywhere in the conversation, document included, and propose what
    followed it. Costs no model forward."""

    name = "ngram"

    def __init__(self, max_n: int = 4, min_n: int = 2) -> None:
        self.max_n, self.min_n = max_n, min_n
        self._seq: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> end position (exclusive) of its latest occurrence
        self._indexed = 0  # n-grams ending before this position are indexed

    def _sync(self, seq: list[int]) -> None:
        # the index only grows along the sequence; an edit (divergence) rebuilds it
        if common_prefix(self._seq[:self._indexed], seq[:self._indexed]) < self._indexed:
            self._index, self._indexed = {}, 0
        self._seq = seq
        limit = len(seq) - 1  # leave the current suffix out so it never matches itself
        for end in range(max(self._indexed, 1), limit + 1):
            for n in range(self.min_n, self.max_n + 1):
                if end - n >= 0:
                    self._index[tuple(seq[end - n:end])] = end
        self._indexed = max(self._indexed, limit + 1)

    def propose(self, seq: list[int], count: int, sampling: Sampling,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        if count <= 0 or len(seq) < self.min_n + 1:
            return [], None
        self._sync(seq)
        for n in range(self.max_n, self.min_n - 1, -1):
            end = self._index.get(tuple(seq[-n:]))
            if end is not None and end < len(seq):
                return list(seq[end:end + count]), None
        return [], None

    def cache_stats(self):
        return None


class ModelDrafter:
    """A small draft model on a StreamingLLM cache. Its cache follows the sequence lazily: each
    proposal rolls back to the longest common prefix with what it has seen, or re-syncs on the
    sinks + the recent window when the rollback reaches tokens it has evicted."""

    name = "model"

    def __init__(self, runner: LlamaRunner, sinks: int, window: int, max_draft: int) -> None:
        self.runner = runner
        arch = runner.arch
        self.cache = StreamingCache(arch.n_layers, arch.n_kv_heads, arch.head_dim, sinks, window,
                                    slack=max(max_draft + 1, 64), dtype=runner.dtype, device=runner.device)
        self._seen: list[int] = []  # the sequence whose tokens the cache holds (possibly with evictions)

    @staticmethod
    def check_compatible(target_tokenizer, draft_tokenizer) -> None:
        """Same vocabulary, token for token, or refuse with a clear error."""
        tv, dv = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        if tv != dv:
            diff = len(set(tv.items()) ^ set(dv.items()))
            raise IncompatibleDraftError(
                f"the draft model's vocabulary differs from the target's ({len(dv)} vs {len(tv)} tokens, "
                f"{diff} entries differ): pick a draft from the same model family, or use --draft ngram")

    def _feed(self, tokens: list[int]) -> torch.Tensor:
        """Run `tokens` through the draft model (evicting as needed); returns the last logits [V]."""
        logits = None
        step = max(1, self.cache.capacity - self.cache.sinks - 1) // 2
        for start in range(0, len(tokens), step):
            piece = tokens[start:start + step]
            self.cache.make_room(len(piece))
            positions = torch.arange(len(piece), device=self.runner.device)  # ignored by the cache
            logits = self.runner.forward(torch.tensor(piece, device=self.runner.device), positions,
                                         self.cache, last_only=True)[0]
        return logits

    def _resync(self, seq: list[int]) -> None:
        """Fresh cache from the sinks and the last window of `seq` (what StreamingLLM would keep);
        the newest token stays out: every proposal starts by feeding it."""
        self.cache.rollback(0)
        self.cache.evicted = 0
        sinks, window = self.cache.sinks, self.cache.window
        body = seq[:-1]
        keep = body if len(body) <= sinks + window else body[:sinks] + body[len(body) - window:]
        self._feed(keep)
        self._seen = list(body)

    def _held_prefix(self, seq: list[int]) -> int:
        seen = self._seen
        if len(seq) >= len(seen) and seq[:len(seen)] == seen:  # the common case: seq extends what we saw
            return len(seen)
        return common_prefix(seen, seq)

    def propose(self, seq: list[int], count: int, sampling: Sampling,
                generator: torch.Generator | None) -> tuple[list[int], torch.Tensor | None]:
        if count <= 0 or not seq:
            return [], None
        held = min(self._held_prefix(seq), len(seq) - 1)
        drop = len(self._seen) - held
        # dropped tokens must still be in the window, and the catch-up must fit in one window
        if held == 0 or drop > self.cache.length - self.cache.sinks or len(seq) - held > self.cache.window:
            self._resync(seq)
        else:
            self.cache.rollback(self.cache.length - drop)
            del self._seen[held:]
        logits = self._feed(seq[len(self._seen):])
        self._seen.extend(seq[len(self._seen):])
        drafts: list[int] = []
        rows: list[torch.Tensor] = []
        for i in range(count):
            token, probs = sample_token(logits, sampling, generator)
            drafts.append(token)
            if probs is not None:
                rows.append(probs)
            if i + 1 < count:
                logits = self._feed([token])
                self._seen.append(token)
        return drafts, (torch.stack(rows) if rows else None)

    def cache_stats(self):
        return self.cache.stats()
