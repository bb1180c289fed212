"""The hierarchical loop: L0 drafts gamma1 tokens for L1 (target on the retrieval cache), L1 drafts
gamma2 tokens for L2 (target on the full cache), L2 verifies. Plus the paper's ablations and AR.

Invariant between steps: the full cache holds seq[:-1]; seq[-1] is the pending token whose K/V
is computed by the next forward. Every level's output is an exact sample of its own (warped)
distribution, so the acceptance rule at L2 with q = L1's distribution keeps the final output
exactly distributed as the target alone.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch

from engine.acceptance import target_probs, verify
from engine.autotune import retune
from engine.cache_full import FullCache
from engine.cache_retrieval import RetrievalCache
from engine.events import Level, LevelStats
from engine.runner import LlamaRunner
from engine.settings import DecodeSettings


@dataclass
class Counter:
    proposed: int = 0
    accepted: int = 0
    tested: int = 0  # accepted + one per verification that rejected something

    def add(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted
        self.tested += accepted + (1 if accepted < proposed else 0)


@dataclass
class StepTimes:
    """Measured seconds per forward at each level (exponential moving averages), for auto-tuning."""

    l0: float | None = None
    l1: float | None = None
    l2: float | None = None

    def record(self, level: str, seconds: float) -> None:
        old = getattr(self, level)
        setattr(self, level, seconds if old is None else 0.8 * old + 0.2 * seconds)


@dataclass
class DecodeStats:
    l0_l1: Counter = field(default_factory=Counter)
    l1_l2: Counter = field(default_factory=Counter)
    l0_l2: Counter = field(default_factory=Counter)
    verifications: int = 0
    emitted_by_verify: int = 0
    times: StepTimes = field(default_factory=StepTimes)

    def levels(self, mode: str) -> tuple[LevelStats, ...]:
        if mode == "triforce":
            pairs = (("l0_l1", self.l0_l1), ("l1_l2", self.l1_l2))
        elif mode == "retrieval-only":
            pairs = (("l1_l2", self.l1_l2),)
        elif mode == "draft-only":
            pairs = (("l0_l2", self.l0_l2),)
        else:
            pairs = ()
        return tuple(LevelStats(name, c.proposed, c.accepted, c.tested) for name, c in pairs)


class HierarchicalDecoder:
    """One `step(seq)` = one verification cycle at the top level; returns (token, level) pairs."""

    def __init__(self, runner: LlamaRunner, full: FullCache, drafter, settings: DecodeSettings,
                 generator: torch.Generator | None) -> None:
        self.runner, self.full, self.drafter = runner, full, drafter
        self.settings = settings
        self.generator = generator
        self.retrieval: RetrievalCache | None = None
        self.stats = DecodeStats()
        self._prompt_query: list[torch.Tensor] | None = None
        self._recent_l2 = deque(maxlen=8)  # per-verification acceptance rates at L2
        self._since_rebuild = 0
        self.rebuilds = 0
        self.l1_verify = verify  # the acceptance rule at L1 (tests swap in a known-buggy variant)

    # --- retrieval cache management ------------------------------------------------------------
    def _headroom(self) -> int:
        s = self.settings
        spec = (s.gamma2 + s.gamma1 + 2) * 2
        return max(2 * s.chunk + spec, s.rebuild_stride + spec, 128)

    def after_prefill(self, prompt_query: list[torch.Tensor]) -> None:
        """A new prompt was prefilled: select the retrieval cache with the question's own query."""
        self._prompt_query = prompt_query
        self._recent_l2.clear()
        if self.settings.mode in ("triforce", "retrieval-only"):
            self.rebuild()

    def rebuild(self) -> None:
        s = self.settings
        r = self.retrieval
        if r is None or r.budget != s.budget or r.chunk != s.chunk or r.headroom < self._headroom():
            self.retrieval = None  # free the old buffers first
            self.retrieval = r = self.full.retrieval(self.runner.arch.n_heads, s.budget, s.chunk, self._headroom())
        r.rebuild(self._prompt_query)
        self.rebuilds += 1
        self._since_rebuild = 0
        self._recent_l2.clear()

    def _ensure_retrieval(self) -> RetrievalCache:
        s = self.settings
        r = self.retrieval
        need = s.gamma2 + s.gamma1 + 2
        rolling = sum(self._recent_l2) / len(self._recent_l2) if len(self._recent_l2) >= 4 else 1.0
        if (r is None or r.budget != s.budget or r.chunk != s.chunk or r.room() < need
                or rolling < s.rebuild_threshold
                or (s.rebuild_stride and self._since_rebuild >= s.rebuild_stride)):
            self.rebuild()
        else:
            r.sync()
        return self.retrieval

    # --- one cycle ---------------------------------------------------------------------------
    def step(self, seq: list[int]) -> list[tuple[int, Level]]:
        mode = self.settings.mode
        if mode == "ar":
            return self._verify_l2(seq, [], None, [])
        if mode == "draft-only":
            drafts, q = self.drafter.propose(seq, self.settings.gamma1, self.settings.sampling, self.generator)
            out = self._verify_l2(seq, drafts, q, [Level.L0] * len(drafts))
            self.stats.l0_l2.add(len(drafts), len(out) - 1)
            return out
        use_l0 = mode == "triforce"
        drafts, q_rows, levels = self._draft_with_l1(seq, self.settings.gamma2, use_l0)
        out = self._verify_l2(seq, drafts, q_rows, levels)
        accepted = len(out) - 1
        self.stats.l1_l2.add(len(drafts), accepted)
        if drafts:
            self._recent_l2.append(accepted / len(drafts))
        self._since_rebuild += len(out)
        if self.settings.auto and self.stats.verifications % 4 == 0:
            self._retune()
        return out

    def _retune(self) -> None:
        """settings.auto: re-pick gammas (and the budget, applied at the next rebuild) from measurements."""
        st = self.stats
        rate = lambda c: c.accepted / c.tested if c.tested >= 8 else None  # noqa: E731
        use_l0 = self.settings.mode == "triforce" and getattr(self.drafter, "name", "none") != "none"
        self.settings = retune(self.settings, self.full.length, rate(st.l1_l2), rate(st.l0_l1) if use_l0 else None,
                               st.times.l0, st.times.l1, st.times.l2)

    def _draft_with_l1(self, seq: list[int], count: int, use_l0: bool):
        """L1 produces >= count tokens (each an exact sample of L1's distribution), using L0's
        proposals verified by the acceptance rule when use_l0."""
        s = self.settings
        r = self._ensure_retrieval()
        local = list(seq)
        drafts: list[int] = []
        rows: list[torch.Tensor] = []
        levels: list[Level] = []
        while len(drafts) < count:
            k = min(s.gamma1, count - len(drafts)) if use_l0 else 0
            t0 = time.perf_counter()
            d0, q0 = self.drafter.propose(local, k, s.sampling, self.generator) if k else ([], None)
            if k and getattr(self.drafter, "name", "") == "model":
                self.stats.times.record("l0", (time.perf_counter() - t0) / k)
            start = len(local) - 1
            tokens = torch.tensor([local[-1]] + d0, device=self.runner.device)
            positions = torch.arange(start, start + len(d0) + 1, device=self.runner.device)
            held = r.length
            t1 = time.perf_counter()
            logits = self.runner.forward(tokens, positions, r)  # [k+1, V]
            p1 = None if s.sampling.greedy else target_probs(logits, s.sampling)
            verdict = self.l1_verify(d0, q0, logits, s.sampling, self.generator, target=p1)
            self.stats.times.record("l1", time.perf_counter() - t1)
            r.rollback(held + 1 + verdict.accepted)  # keep the pending token and the accepted drafts
            if use_l0:
                self.stats.l0_l1.add(len(d0), verdict.accepted)
            new = d0[:verdict.accepted] + [verdict.next_token]
            drafts += new
            levels += [Level.L0] * verdict.accepted + [Level.L1]
            if p1 is not None:
                rows.append(p1[:verdict.accepted + 1])  # L1's own distribution at each new position
            local += new
        return drafts, (torch.cat(rows) if rows else None), levels

    def _verify_l2(self, seq: list[int], drafts: list[int], q_rows: torch.Tensor | None,
                   levels: list[Level]) -> list[tuple[int, Level]]:
        """The target with its full cache checks `drafts`; returns accepted drafts + one L2 token."""
        start = len(seq) - 1
        assert self.full.length == start, (self.full.length, start)
        tokens = torch.tensor([seq[-1]] + drafts, device=self.runner.device)
        positions = torch.arange(start, start + len(drafts) + 1, device=self.runner.device)
        t2 = time.perf_counter()
        logits = self.runner.forward(tokens, positions, self.full)  # [k+1, V]
        verdict = verify(drafts, q_rows, logits, self.settings.sampling, self.generator)
        self.stats.times.record("l2", time.perf_counter() - t2)
        self.full.rollback(start + 1 + verdict.accepted)
        self.stats.verifications += 1
        self.stats.emitted_by_verify += verdict.accepted + 1
        return [(drafts[i], levels[i]) for i in range(verdict.accepted)] + [(verdict.next_token, Level.L2)]
