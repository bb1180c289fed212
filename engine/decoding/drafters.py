"""Drafters: propose a few tokens for the level above. A drafter sees the whole sequence so far
(prompt, history, answer, and the speculated tokens of the level above) and returns a `Draft`: its
guesses, the distributions it drew them from (None: deterministic guesses, i.e. one-hot q) and the
level that produced each. L0: NoDrafter, NgramDrafter, ModelDrafter. L1: RetrievalDrafter, the
target on its retrieval cache, itself speculating with an L0 drafter. A level structure is then a
composition (engine/decoding/speculative.py): ar = no drafter, draft-only = L0, retrieval-only =
L1(NoDrafter), triforce = L1(L0).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.decoding.acceptance import penalty_counts, sample_token, target_probs
from engine.events import Level
from engine.kv.streaming import StreamingCache
from engine.errors import IncompatibleDraftError
from engine.model.draft_vocab import DraftVocabulary
from engine.model.runner import LlamaRunner
from engine.settings import Sampling, draft_cache_slack


@dataclass(frozen=True)
class Draft:
    """What one `propose` returns: tokens, their q rows [k, V] (None: one-hot q), their levels."""

    tokens: list[int]
    probs: torch.Tensor | None
    levels: list[Level]


def l0_draft(tokens: list[int], probs: torch.Tensor | None) -> Draft:
    return Draft(tokens, probs, [Level.L0] * len(tokens))


class Drafter(Protocol):
    """Proposes tokens for the level above; `reset` forgets what it has seen (a new sequence)."""

    name: str
    runs_model: bool  # True when proposing costs model forwards (its time is worth measuring)

    def propose(self, seq: list[int], count: int, sampling: Sampling,
                generator: torch.Generator | None, answer_start: int | None = None) -> Draft:
        """`count` guesses after `seq`; seq[answer_start:] is the answer so far, which the
        repetition penalty counts (None: no answer yet), so that every level warps alike."""

    def reset(self) -> None: ...

    def cache_stats(self): ...


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class NoDrafter:
    """Proposes nothing: a level above it decodes one token per forward."""

    name = "none"
    runs_model = False

    def propose(self, seq: list[int], count: int, sampling: Sampling,
                generator: torch.Generator | None, answer_start: int | None = None) -> Draft:
        return l0_draft([], None)

    def reset(self) -> None:
        pass

    def cache_stats(self):
        return None


class NgramDrafter:
    """Prompt-lookup drafting: find the latest earlier occurrence of the sequence's last n tokens
    (n = max_n down to min_n) anywhere in the conversation, document included, and propose what
    followed it. Costs no model forward."""

    name = "ngram"
    runs_model = False

    def __init__(self, max_n: int = 4, min_n: int = 2) -> None:
        self.max_n, self.min_n = max_n, min_n
        self.reset()

    UNDO = 512  # index positions whose overwritten entries are kept, so a rollback this deep is cheap

    def reset(self) -> None:
        self._seq: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> end position (exclusive) of its latest occurrence
        self._indexed = 0  # n-grams ending before this position are indexed
        self._undo: dict[int, list[tuple[tuple[int, ...], int | None]]] = {}  # end -> [(n-gram, its entry before)]

    def _sync(self, seq: list[int], length: int, check: bool = True) -> None:
        """Index the n-grams of `seq[:length]`. The index grows along the sequence; when it leaves
        what was indexed (L1's drafts that L2 rejected, a shadow lookup behind the end), the entries
        past the divergence are undone from the log (a full re-index of a book would cost a scan of
        the whole sequence, several times per answer under triforce). `check=False`: the caller knows `seq` extends what
        was indexed (propose_each's later positions), so the prefix is not compared again."""
        indexed = self._indexed
        if check and self._diverges(seq, length, indexed):
            keep = min(self._same_prefix(seq, indexed), length - 1)  # ends <= keep are still right
            if all(end in self._undo for end in range(keep + 1, indexed)):
                for end in range(indexed - 1, keep, -1):  # newest first: restores each entry's oldest value
                    for key, before in reversed(self._undo.pop(end)):
                        if before is None:
                            del self._index[key]
                        else:
                            self._index[key] = before
                indexed = keep + 1
            else:
                self._index, self._undo, indexed = {}, {}, 0
            del self._seq[indexed:]
        index, undo = self._index, self._undo
        limit = length - 1  # leave the current suffix out so it never matches itself
        logged = limit + 1 - self.UNDO  # only the last UNDO positions can be rolled back cheaply
        for end in range(max(indexed, 1), limit + 1):
            log = [] if end >= logged else None
            for n in range(self.min_n, self.max_n + 1):
                if end - n >= 0:
                    key = tuple(seq[end - n:end])
                    if log is not None:
                        log.append((key, index.get(key)))
                    index[key] = end
            if log is not None:
                undo[end] = log
            undo.pop(end - self.UNDO, None)
        self._seq.extend(seq[len(self._seq):limit + 1])
        self._indexed = max(indexed, limit + 1)

    def _diverges(self, seq: list[int], length: int, indexed: int) -> bool:
        """Does `seq[:length]` leave the indexed sequence (`self._seq`, a private copy of it)? One
        comparison in C, sliced only where the lengths differ (a slice of a book copies it, which
        costs more than the comparison)."""
        if length < indexed:
            return True
        return (seq if len(seq) == indexed else seq[:indexed]) != self._seq

    def _same_prefix(self, seq: list[int], indexed: int) -> int:
        """How many leading tokens of `seq` equal the indexed sequence's (a divergence is nearly
        always within the last UNDO positions: compare the rest in C)."""
        head = max(0, indexed - self.UNDO)
        if self._seq[:head] != seq[:head]:
            return common_prefix(self._seq[:indexed], seq)
        return head + common_prefix(self._seq[head:indexed], seq[head:])

    def prime(self, seq: list[int]) -> None:
        """Index a freshly prefilled prompt now (tens of ms for a book), not in the first cycle."""
        self._sync(seq, len(seq))

    def propose(self, seq: list[int], count: int, sampling: Sampling,
                generator: torch.Generator | None, answer_start: int | None = None) -> Draft:
        if count <= 0 or len(seq) < self.min_n + 1:
            return l0_draft([], None)
        self._sync(seq, len(seq))
        return l0_draft(self._lookup(seq, len(seq), count), None)

    def propose_each(self, seq: list[int], start: int, count: int) -> list[list[int]]:
        """What `propose(seq[:p], count)` would return, for each p in [start, len(seq)), in one pass:
        the prefix is compared once and the index then grows a position at a time, with no copies of
        the sequence (the auto policy logs a lookup at every position, engine/decoding/lookup_replay.py)."""
        out, checked = [], False
        for p in range(start, len(seq)):
            if count <= 0 or p < self.min_n + 1:
                out.append([])
                continue
            self._sync(seq, p, check=not checked)
            checked = True
            out.append(self._lookup(seq, p, count))
        return out

    def _lookup(self, seq: list[int], length: int, count: int) -> list[int]:
        """The tokens that followed the latest earlier occurrence of `seq[:length]`'s last n tokens
        (the index holds `seq[:length]`'s n-grams)."""
        for n in range(self.max_n, self.min_n - 1, -1):
            end = self._index.get(tuple(seq[length - n:length]))
            if end is not None and end < length:
                return seq[end:min(end + count, length)]
        return []

    def cache_stats(self):
        return None


class ModelDrafter:
    """A small draft model on a StreamingLLM cache. Its cache follows the sequence lazily: each
    proposal rolls back to the longest common prefix with what it has seen, or re-syncs on the
    sinks + the recent window when the rollback reaches tokens it has evicted."""

    name = "model"
    runs_model = True

    def __init__(self, runner: LlamaRunner, sinks: int, window: int) -> None:
        self.runner = runner
        arch = runner.arch
        self.cache = StreamingCache(arch.n_layers, arch.n_kv_heads, arch.head_dim, sinks, window,
                                    slack=draft_cache_slack(), dtype=runner.dtype, device=runner.device)
        self._seen: list[int] = []  # the sequence whose tokens the cache holds (possibly with evictions)

    def reset(self) -> None:
        self.cache.rollback(0)
        self.cache.evicted = 0
        self._seen = []

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
                generator: torch.Generator | None, answer_start: int | None = None) -> Draft:
        if count <= 0 or not seq:
            return l0_draft([], None)
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
        answer = seq[answer_start:] if answer_start is not None else []
        counts = penalty_counts(sampling, answer, [], logits.shape[-1], logits.device)  # [1, V] or None
        for i in range(count):
            token, probs = sample_token(logits, sampling, generator, counts)
            if counts is not None:
                counts[0, token] += 1  # the next draft's penalty counts this one
            drafts.append(token)
            if probs is not None:
                rows.append(probs)
            if i + 1 < count:
                logits = self._feed([token])
                self._seen.append(token)
        return l0_draft(drafts, torch.stack(rows) if rows else None)

    def cache_stats(self):
        return self.cache.stats()


class RetrievalDrafter:
    """L1 as a drafter: the target on its retrieval cache, itself speculating with an inner L0
    drafter (`inner`, `gamma1` tokens per L1 forward) whose guesses it checks with the acceptance
    rule. Every token it returns is an exact sample of L1's own distribution, whose rows it returns
    as q. With NoDrafter inside it is plain L1 decoding (retrieval-only)."""

    name = "retrieval"
    runs_model = True

    def __init__(self, runner: LlamaRunner, retrieval, inner: Drafter, gamma1: int, meter, verify_rule,
                 vocab: DraftVocabulary | None = None) -> None:
        """retrieval: `() -> RetrievalCache` synced to the full cache; meter: has `timed(level,
        tokens, seconds)`, `checked(boundary, proposed, accepted)` and `set_up(seconds)` (a one-off
        left out of the cycle's price); verify_rule: the acceptance rule;
        vocab: the subset of the vocabulary L1 scores (None: all of it), kept by the caller across
        cycles (engine/model/draft_vocab.py: DraftVocabulary.for_runner)."""
        self.runner, self.retrieval, self.inner, self.gamma1 = runner, retrieval, inner, gamma1
        self.meter, self.verify_rule = meter, verify_rule
        # L1 is a drafter: where the weights allow, its projections run with int16 activations (a
        # cheaper forward within ~2e-5 of the float product); L2 checks every token
        self._forward_options = {"draft": True} if getattr(runner, "drafts_int16", False) else {}
        self.vocab = vocab

    def reset(self) -> None:
        self.inner.reset()

    def cache_stats(self):
        return self.inner.cache_stats()

    def propose(self, seq: list[int], count: int, sampling: Sampling,
                generator: torch.Generator | None, answer_start: int | None = None) -> Draft:
        """At least `count` tokens (a last L1 forward may accept past it), as the level above wants."""
        if count <= 0:
            return Draft([], None, [])
        r = self.retrieval()
        local = list(seq)
        drafts: list[int] = []
        rows: list[torch.Tensor] = []
        levels: list[Level] = []
        use_l0 = not isinstance(self.inner, NoDrafter)
        vocab = self.vocab if self.vocab is not None and self.vocab.active else None
        if vocab is not None:
            t0 = time.perf_counter()
            if vocab.cover(local):  # the prompt's tokens and every one since
                self.meter.set_up(time.perf_counter() - t0)  # a new prompt's first scan: a one-off
        options = dict(self._forward_options, vocab=vocab) if vocab is not None else self._forward_options
        while len(drafts) < count:
            k = min(self.gamma1, count - len(drafts)) if use_l0 else 0
            t0 = time.perf_counter()
            inner = self.inner.propose(local, k, sampling, generator, answer_start) if k else l0_draft([], None)
            if k and self.inner.runs_model:  # n-gram lookups: free, bar the one-off indexing
                self.meter.timed("l0", k, time.perf_counter() - t0)
            d0 = inner.tokens
            start = len(local) - 1
            tokens = torch.tensor([local[-1]] + d0, device=self.runner.device)
            positions = torch.arange(start, start + len(d0) + 1, device=self.runner.device)
            held = r.length
            t1 = time.perf_counter()
            logits = self.runner.forward(tokens, positions, r, **options)  # [k+1, V]
            answer = local[answer_start:] if answer_start is not None else []
            counts = penalty_counts(sampling, answer, d0, logits.shape[-1], logits.device)  # [k+1, V] or None
            p1 = None if sampling.greedy else target_probs(logits, sampling, counts)  # [k+1, V]
            penalty = {} if counts is None else {"counts": counts}
            verdict = self.verify_rule(d0, inner.probs, logits, sampling, generator, target=p1, **penalty)
            self.meter.timed("l1", len(d0) + 1, time.perf_counter() - t1)
            r.rollback(held + 1 + verdict.accepted)  # keep the pending token and the accepted drafts
            if use_l0:
                self.meter.checked("l0_l1", len(d0), verdict.accepted)
            new = d0[:verdict.accepted] + [verdict.next_token]
            drafts += new
            levels += [Level.L0] * verdict.accepted + [Level.L1]
            if p1 is not None:
                rows.append(p1[:verdict.accepted + 1])  # L1's own distribution at each new position
            local += new
        return Draft(drafts, torch.cat(rows) if rows else None, levels)
