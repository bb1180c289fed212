"""The hierarchical loop: each verification cycle, a level structure (engine/decoding/policy.py)
composes the drafters (engine/decoding/drafters.py) and the target with its full cache (L2) checks
their tokens. ar = nothing drafts; draft-only = L0; retrieval-only = L1 over no L0; triforce = L1
(the target on the retrieval cache) over L0.

Invariant between steps: the full cache holds seq[:-1]; seq[-1] is the pending token whose K/V
is computed by the next forward. Every level's output is an exact sample of its own (warped)
distribution, so the acceptance rule at L2 with q = the drafter's distribution keeps the final
output exactly distributed as the target alone, whichever structure ran the cycle.
"""
from __future__ import annotations

import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from engine.decoding.acceptance import penalty_counts, verify
from engine.decoding.auto import AutoPolicy
from engine.decoding.drafters import Draft, Drafter, NgramDrafter, NoDrafter, RetrievalDrafter, l0_draft
from engine.decoding.lookup_replay import ShadowLookups, kept_whole, rule_length
from engine.decoding.measurements import StepCosts
from engine.decoding.policy import Policy as LegacyPolicy
from engine.decoding.structure import Structure
from engine.events import Level, LevelStats
from engine.kv.full import FullCache
from engine.kv.retrieval import RetrievalCache
from engine.model.draft_vocab import DraftVocabulary
from engine.model.runner import LlamaRunner
from engine.settings import DecodeSettings, Mode

TRACE = bool(os.environ.get("TRIFORCE_TRACE_AUTO"))  # one line a cycle on stderr under auto: what ran, what it cost


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
class DecodeStats:
    """Counts for one answer (the policy keeps its own, longer-lived, measurements)."""

    l0_l1: Counter = field(default_factory=Counter)
    l1_l2: Counter = field(default_factory=Counter)
    l0_l2: Counter = field(default_factory=Counter)
    verifications: int = 0
    emitted_by_verify: int = 0
    times: StepCosts = field(default_factory=StepCosts)
    switches: int = 0

    def levels(self, mode: str) -> tuple[LevelStats, ...]:
        """The boundaries that `mode` checks (under auto: every boundary that saw a draft)."""
        m = Mode.of(mode)
        pairs = {Mode.TRIFORCE: ("l0_l1", "l1_l2"), Mode.RETRIEVAL_ONLY: ("l1_l2",), Mode.DRAFT_ONLY: ("l0_l2",),
                 Mode.AR: ()}.get(m)
        if pairs is None:
            pairs = tuple(n for n in ("l0_l1", "l1_l2", "l0_l2") if getattr(self, n).proposed)
        return tuple(LevelStats(n, getattr(self, n).proposed, getattr(self, n).accepted, getattr(self, n).tested)
                     for n in pairs)


class HierarchicalDecoder:
    """One `step(seq)` = one verification cycle at the top level; returns (token, level) pairs."""

    def __init__(self, runner: LlamaRunner, full: FullCache, drafter: Drafter, settings: DecodeSettings,
                 generator: torch.Generator | None) -> None:
        self.runner, self.full, self.drafter = runner, full, drafter
        self.settings = settings
        self.generator = generator
        self.retrieval: RetrievalCache | None = None
        # on the CPU, L1 scores only a subset of the vocabulary (the common tokens, the prompt's and
        # every token since: engine/model/draft_vocab.py), skipping most of the head's bytes; kept
        # across cycles, as its slice of the head is rebuilt only when the subset grows
        self.l1_vocab = DraftVocabulary.for_runner(runner)
        self.stats = DecodeStats()
        self._weight_bytes: tuple[int, int] | None = None  # (weights, K/V per token held), read once
        self.auto_policy = AutoPolicy(self._step_bytes)
        self.legacy_policy = LegacyPolicy()  # mode auto-legacy: the previous policy, for side-by-side runs
        self.legacy_lookups = ShadowLookups(self.legacy_policy)  # ... and the n-gram lookups it learns from
        self.structure: Structure | None = None  # what the last cycle ran
        self._prompt_query: list[torch.Tensor] | None = None
        self._recent_l2 = deque(maxlen=8)  # per-verification acceptance rates at L2 of L1's drafts
        self._since_rebuild = 0
        self._stale = False  # a new prompt came since the selection: rebuild before L1's next use
        self.rebuilds = 0
        self._setup_s = 0.0  # seconds of this cycle's setup rebuild (left out of its wall time)
        self._forwards: list[tuple[str, int]] = []  # this cycle's forwards: (level, tokens checked)
        self._budget: int | None = None  # the policy's retrieval budget (None: the settings')
        self.l1_verify = verify  # the acceptance rule at L1 (tests swap in a known-buggy variant)
        self.answer_start: int | None = None  # seq[answer_start:] is the answer (the repetition penalty counts it)
        self._kept_whole = False  # the last cycle was draft-only and kept its whole draft

    def _step_bytes(self, tokens: int) -> int:
        """Bytes a target forward reads with `tokens` tokens held: its weights and their K/V."""
        if self._weight_bytes is None:
            a, r = self.runner.arch, self.runner
            kv_element = torch.tensor([], dtype=getattr(r, "kv_dtype", r.dtype)).element_size()
            self._weight_bytes = int(r.nbytes()), 2 * a.n_layers * a.n_kv_heads * a.head_dim * kv_element
        weights, per_token = self._weight_bytes
        return weights + per_token * tokens

    @property
    def _legacy(self) -> bool:
        return Mode.of(self.settings.mode) is Mode.AUTO_LEGACY

    @property
    def policy(self) -> AutoPolicy | LegacyPolicy:
        """The policy in force: auto-legacy's under that mode, else auto's (mode auto, or settings.auto)."""
        return self.legacy_policy if self._legacy else self.auto_policy

    def _policy_settings(self) -> DecodeSettings:
        """The settings the policy reads (the legacy policy knows its mode as auto)."""
        return self.settings.replace(mode="auto") if self._legacy else self.settings

    # --- retrieval cache management ------------------------------------------------------------
    def budget(self) -> int:
        """The retrieval budget in force: the policy's under auto, else the settings'."""
        return self._budget if self._budget is not None else self.settings.budget

    def _headroom(self) -> int:
        return self.settings.retrieval_headroom()

    def after_prefill(self, prompt_query: list[torch.Tensor]) -> None:
        """A new prompt was prefilled: select the retrieval cache with the question's own query
        (under auto: lazily, before the first cycle that uses L1)."""
        self._prompt_query = prompt_query
        self._recent_l2.clear()
        self.answer_start = self.full.length  # the cache holds the prompt: the answer starts after it
        self._kept_whole = False
        self.policy.new_turn()
        if not self._legacy:
            self._budget = None
            mode = Mode.of(self.settings.mode)
            if mode in (Mode.TRIFORCE, Mode.RETRIEVAL_ONLY) or (mode is Mode.AUTO and self.auto_policy.wants_l1(
                    self.settings, self.full.length, self.budget())):
                self.rebuild()  # with the prompt, as a fixed L1 mode does
            else:
                self._stale = True
            return
        self.legacy_lookups.close()  # (the last answer's: its tokens are all known by now)
        if self._policy_learns():  # each turn: the budget from what the last turns measured
            current = self.budget()
            fits = self.full.length // self.settings.chunk * self.settings.chunk
            self._budget = min(self.policy.choose_budget(self._policy_settings(), current, self.full.length), fits)
            if self._budget < 2 * self.settings.chunk:
                self._budget = None
        else:
            self._budget = None
        mode, last = Mode.of(self.settings.mode), self.policy.running
        auto_l1 = mode is Mode.AUTO_LEGACY and ((last is not None and last.mode.uses_l1) or self.policy.l1_ahead(
            self._policy_settings(), not isinstance(self.drafter, NoDrafter), self.full.length, self.budget()))
        if mode in (Mode.TRIFORCE, Mode.RETRIEVAL_ONLY) or auto_l1:
            started = time.perf_counter()
            self.rebuild()  # with the prompt, as a fixed mode does (auto: it ran L1 last or expects to)
            if auto_l1:
                self.policy.l1_setup(time.perf_counter() - started)
            self.policy.l1_built()
        else:
            self._stale = True

    def rebuild(self) -> None:
        s = self.settings
        r = self.retrieval
        budget = self.budget()
        if r is None or r.budget != budget or r.chunk != s.chunk or r.headroom < self._headroom():
            self.retrieval = None  # free the old buffers first
            self.retrieval = r = self.full.retrieval(self.runner.arch.n_heads, budget, s.chunk, self._headroom())
        r.rebuild(self._prompt_query)
        self.rebuilds += 1
        self._stale = False
        self._since_rebuild = 0
        self._recent_l2.clear()

    def _ensure_retrieval(self) -> RetrievalCache:
        s = self.settings
        r = self.retrieval
        st = self.structure
        need = (st.gamma1 + st.gamma2 + 2) if st is not None else s.speculation_tokens()
        rolling = sum(self._recent_l2) / len(self._recent_l2) if len(self._recent_l2) >= 4 else 1.0
        setup = r is None or self._stale or r.budget != self.budget() or r.chunk != s.chunk
        if (setup or r.room() < need or rolling < s.rebuild_threshold
                or (s.rebuild_stride and self._since_rebuild >= s.rebuild_stride)):
            t0 = time.perf_counter()
            self.rebuild()
            if setup:  # L1's first use, a new prompt, budget or chunk: not what L1 costs per token
                self._setup_s += time.perf_counter() - t0
        else:
            r.sync()
        return self.retrieval

    # --- one cycle ---------------------------------------------------------------------------
    def _compose(self, st: Structure) -> tuple[Drafter | None, int, str]:
        """The drafter for L2, how many tokens it drafts, and the boundary its acceptance counts at."""
        if st.mode is Mode.AR:
            return None, 0, ""
        if st.mode is Mode.DRAFT_ONLY:  # (auto's rules draft longer right after a draft kept whole)
            return self.drafter, rule_length(st.gamma1, st.after_full, self._kept_whole), "l0_l2"
        inner = self.drafter if st.mode is Mode.TRIFORCE else NoDrafter()
        l1 = RetrievalDrafter(self.runner, self._ensure_retrieval, inner, st.gamma1, self, self.l1_verify, self.l1_vocab)
        return l1, st.gamma2, "l1_l2"

    def _choose(self, seq: list[int]) -> Structure:
        has_l0 = not isinstance(self.drafter, NoDrafter)
        left = None if self.answer_start is None else self.settings.max_new_tokens - (len(seq) - self.answer_start)
        st = self.policy.choose(self._policy_settings(), has_l0, len(seq), self.budget(), remaining=left)
        if len(seq) + st.speculation_tokens() > self.full.capacity:  # the last tokens of a full cache
            st = Structure(Mode.AR)
        if self.structure is not None and st.mode is not self.structure.mode:
            self.stats.switches += 1
        return st

    def step(self, seq: list[int]) -> list[tuple[int, Level]]:
        started, self._setup_s, self._forwards = time.perf_counter(), 0.0, []
        self.structure = st = self._choose(seq)
        drafter, count, boundary = self._compose(st)
        shadow = self.auto_policy.wants_shadow(self.settings, st) if isinstance(self.drafter, NgramDrafter) else 0
        if shadow:  # draft-only's check of this cycle, for free (AutoPolicy.shadow)
            self.auto_policy.shadow(len(seq), self.drafter.propose(seq, shadow, self.settings.sampling, None).tokens,
                                    shadow)
        draft = l0_draft([], None)
        lookup = 0.0  # seconds of n-gram lookups: modelled as free, and left out of the cycle's wall time
        if drafter is not None:
            t0 = time.perf_counter()
            draft = drafter.propose(seq, count, self.settings.sampling, self.generator, self.answer_start)
            # L1 times its own forwards; an n-gram lookup costs microseconds, except its first call,
            # which indexes the whole book (far longer than any step) and would poison L0's cost
            if drafter.runs_model and not isinstance(drafter, RetrievalDrafter):
                self.timed("l0", count, time.perf_counter() - t0)
            elif not drafter.runs_model:
                lookup = time.perf_counter() - t0
        out = self._verify_l2(seq, draft)
        accepted = len(out) - 1
        self._kept_whole = boundary == "l0_l2" and kept_whole(len(draft.tokens) + 1, len(out))
        if boundary:
            self.checked(boundary, len(draft.tokens), accepted, self._vocab_miss(boundary, draft, out))
        if boundary == "l1_l2":
            if draft.tokens:
                self._recent_l2.append(accepted / len(draft.tokens))
            self._since_rebuild += len(out)
        if self._policy_learns():
            if self._setup_s and self._legacy:
                self.policy.l1_setup(self._setup_s)
            self.policy.realized(st, time.perf_counter() - started - lookup - self._setup_s, len(out),
                                 checked=len(draft.tokens) + 1, forwards=self._forwards)
            emitted = [token for token, _ in out]
            vocab = self.l1_vocab
            if vocab is not None and vocab.active:  # the tokens L1 could not have proposed, whatever ran
                self.policy.observe_novel(vocab.note(seq, emitted), len(emitted))
            if self._legacy:
                self.legacy_lookups.learn(seq, emitted, boundary, self.drafter, st.mode)
            elif self.auto_policy.shadows_open:
                seq.extend(emitted)  # (in place and cut back: a copy of the sequence grows with the context)
                try:
                    self.auto_policy.settle(seq)
                finally:
                    del seq[-len(emitted):]
            if TRACE:
                self._trace(st, len(draft.tokens), accepted, time.perf_counter() - started)
        return out

    def _trace(self, st: Structure, drafted: int, accepted: int, seconds: float) -> None:
        """A cycle's line for TRIFORCE_TRACE_AUTO: the policy, structure, draft, yield, wall time and prices."""
        prices = " ".join(f"{c.structure}={c.ms_per_token:.1f}" for c in self.policy.candidates)
        print(f"[auto] {Mode.of(self.settings.mode).value} {st.label} drafted={drafted} accepted={accepted} "
              f"ms={seconds * 1000:.1f} | {prices}", file=sys.stderr)

    def choice_metrics(self) -> dict:
        """Metrics fields saying what ran and, under auto, what the policy weighed."""
        st = self.structure
        label = st.label if st is not None else ""
        if st is not None and st.mode.uses_l1:
            label += f" budget={self.budget()}"
        return {"structure": label, "candidates": self.policy.candidates,
                "structure_switches": self.stats.switches}

    # --- what the levels report: this answer's counters and the policy's measurements ---------
    # the policy learns only from cycles it chose (mode auto, or settings.auto), so a fixed mode run
    # before it (the bench's other methods) teaches it nothing
    def _policy_learns(self) -> bool:
        return self.settings.auto or Mode.of(self.settings.mode).chosen_online

    def set_up(self, seconds: float) -> None:
        """L1 spent `seconds` this cycle on a one-off for a new prompt (its vocabulary subset's first
        scan and head slice): left out of the cycle's wall time, as the retrieval cache's selection is."""
        self._setup_s += seconds

    def timed(self, level: str, tokens: int, seconds: float) -> None:
        """A forward at `level` ("l0": a whole proposal) that checked `tokens` tokens took `seconds`."""
        self.stats.times.record(level, tokens, seconds)
        self._forwards.append((level, tokens))
        if self._policy_learns():
            if self._legacy:
                self.policy.costs.record(level, tokens, seconds)
            else:
                self.policy.timed(level, tokens, seconds)

    def checked(self, boundary: str, proposed: int, accepted: int, vocab_miss: bool = False) -> None:
        """A verification at `boundary` ("l0_l1", "l1_l2", "l0_l2") accepted `accepted` of `proposed`.
        `vocab_miss`: the rejection was at a token outside L1's vocabulary subset. It joins the subset
        now and is never missed so again, so the policy counts the accepted prefix alone and prices
        such misses by the rate of new tokens (Policy.observe_novel) instead."""
        getattr(self.stats, boundary).add(proposed, accepted)
        if self._policy_learns():  # (auto-legacy prices such misses apart; auto counts them as they cost)
            self.policy.observe(boundary, accepted if vocab_miss and self._legacy else proposed, accepted)

    def _vocab_miss(self, boundary: str, draft: Draft, out: list[tuple[int, Level]]) -> bool:
        """Did L2 reject L1's draft at a token L1 could not propose (outside its vocabulary subset)?
        (Such misses dominate an answer's first rejections and vanish once the tokens join the
        subset, so they are counted apart from L1's acceptance.)"""
        vocab = self.l1_vocab
        rejected = len(out) - 1 < len(draft.tokens)
        return (boundary == "l1_l2" and rejected and vocab is not None and vocab.active
                and not vocab.contains(out[-1][0]))

    def _verify_l2(self, seq: list[int], draft: Draft) -> list[tuple[int, Level]]:
        """The target with its full cache checks the draft; returns accepted drafts + one L2 token."""
        drafts = draft.tokens
        start = len(seq) - 1
        assert self.full.length == start, (self.full.length, start)
        tokens = torch.tensor([seq[-1]] + drafts, device=self.runner.device)
        positions = torch.arange(start, start + len(drafts) + 1, device=self.runner.device)
        t2 = time.perf_counter()
        logits = self.runner.forward(tokens, positions, self.full)  # [k+1, V]
        answer = seq[self.answer_start:] if self.answer_start is not None else []
        counts = penalty_counts(self.settings.sampling, answer, drafts, logits.shape[-1], logits.device)  # [k+1, V]
        verdict = verify(drafts, draft.probs, logits, self.settings.sampling, self.generator, counts=counts)
        self.timed("l2", len(drafts) + 1, time.perf_counter() - t2)
        self.full.rollback(start + 1 + verdict.accepted)
        self.stats.verifications += 1
        self.stats.emitted_by_verify += verdict.accepted + 1
        return [(drafts[i], draft.levels[i]) for i in range(verdict.accepted)] + [(verdict.next_token, Level.L2)]
