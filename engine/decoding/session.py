"""A chat session: the conversation as one growing token sequence over one set of caches.

Each turn renders the chat template over all messages, keeps the longest common prefix with what
the full cache holds, prefills the rest in chunks (progress + cancel), re-selects the retrieval
cache with the new question, and generates with the chosen mode. Edit and regenerate are the
same call with a different message list.
"""
from __future__ import annotations

import dataclasses
import gc
import threading
import warnings
import time
from contextlib import nullcontext
from typing import Iterator, Sequence

import torch

from engine.decoding.acceptance import sample_token
from engine.decoding.detokenize import StreamingText
from engine.decoding.drafters import ModelDrafter, NgramDrafter, NoDrafter, common_prefix
from engine.errors import ContextOverflowError, InvalidSettingError, UserError
from engine.events import (ChatMessage, DocumentText, Event, Finished, FinishReason, Level, Metrics,
                           PrefillProgress, TokenText)
from engine.model.loading import LoadedModel
from engine.model.quant import widened_for_prefill
from engine.decoding.prompt import render_tokens
from engine.settings import DecodeSettings, Mode
from engine.decoding.speculative import HierarchicalDecoder

METRICS_EVERY_S = 0.25


def prefill_chunk_for(device: torch.device) -> int:
    return 2048 if device.type == "cuda" else 256


class ChatSession:
    """Owns the caches for one conversation with one target (and optional draft) model."""

    def __init__(self, target: LoadedModel, settings: DecodeSettings = DecodeSettings(), *,
                 draft: LoadedModel | str = "ngram", capacity: int | None = None, snapshots=None,
                 cache_factory=None, initial_capacity: int | None = None, cuda_graphs: bool = False) -> None:
        """capacity: the most tokens the conversation may hold (default: the model's context).
        initial_capacity: start the full cache this small and grow it (to `capacity` at most) when
        a turn needs more, so a short chat does not reserve, or offload, a 128K-token cache.
        cache_factory: `(runner, capacity) -> FullCache`, where the full cache goes (default: the
        runner's own card). It is called again with the new size when the cache grows, so offloading
        can follow the size: engine.model.placement.GpuPlacement.cache_factory() re-plans per size,
        engine.kv.offload.cache_factory_for_plan(plan) keeps one plan's offloaded layers.
        cuda_graphs: replay the fixed-shape steps (L0 draft, L1, on-chip L2 verification) from CUDA
        graphs (engine.model.cuda_graphs); no effect off CUDA. Off by default until gpu-check has
        measured it on a GPU."""
        self.target = target
        arch = target.runner.arch
        self.max_capacity = min(capacity or arch.max_context, arch.max_context)
        self.capacity = min(initial_capacity or self.max_capacity, self.max_capacity)  # what the cache holds now
        settings.validate(self.max_capacity)
        self._settings = settings
        self._cache_factory = cache_factory or (lambda runner, size: runner.new_full_cache(size))
        self.full = self._cache_factory(target.runner, self.capacity)
        self.grown = 0  # times the full cache was enlarged
        self.held: list[int] = []  # tokens whose K/V the full cache holds (== full.length)
        self.snapshots = snapshots
        self._cancel = threading.Event()  # the running job's token (each job brings or gets its own)
        self._pending: DecodeSettings | None = None  # set by any thread, applied on the engine thread
        self._pending_lock = threading.Lock()
        self._graphs = cuda_graphs  # before the drafter: its model's runner is wrapped too
        self.drafter = self._make_drafter(draft)
        self.generator = torch.Generator(device="cpu")
        self.decoder = HierarchicalDecoder(self._runner(target.runner), self.full, self.drafter, settings,
                                           self.generator)
        self._last_metrics: Metrics | None = None
        self.prefilled_tokens_total = 0  # tokens computed by prefill over the session's life (tests count reuse)

    # --- configuration -----------------------------------------------------------------------
    def _make_drafter(self, draft: LoadedModel | str):
        s = self._settings
        if isinstance(draft, str):
            if draft == "ngram":
                return NgramDrafter()
            if draft == "none":
                return NoDrafter()
            raise InvalidSettingError(f"draft {draft!r} is unknown: use a model, 'ngram' or 'none'")
        ModelDrafter.check_compatible(self.target.tokenizer, draft.tokenizer)
        return ModelDrafter(self._runner(draft.runner), s.draft_sinks, s.draft_window)

    def _runner(self, runner):
        """The runner the decoder and drafter call: wrapped for CUDA graphs when asked (and on CUDA)."""
        if not self._graphs:
            return runner
        from engine.model.cuda_graphs import with_graphs

        return with_graphs(runner)

    @property
    def settings(self) -> DecodeSettings:
        """The latest settings asked for (applied at the next step if a job is running)."""
        with self._pending_lock:
            return self._pending or self._settings

    def update_settings(self, settings: DecodeSettings) -> None:
        """Thread-safe: validated now (InvalidSettingError), applied by the engine thread between two
        steps, like any other command; budget/chunk take effect at the next retrieval rebuild."""
        settings.validate(self.max_capacity)
        with self._pending_lock:
            self._pending = settings

    def _apply_pending(self) -> DecodeSettings:
        """On the engine thread, between two steps: take the settings asked for since the last step
        (a new draft window builds its drafter here, never on the GUI thread)."""
        with self._pending_lock:
            settings, self._pending = self._pending, None
        if settings is None:
            return self._settings
        old = self._settings
        self._settings = settings
        self.decoder.settings = settings
        if isinstance(self.drafter, ModelDrafter) and (old.draft_sinks, old.draft_window) != (
                settings.draft_sinks, settings.draft_window):
            self.drafter = ModelDrafter(self.drafter.runner, settings.draft_sinks, settings.draft_window)
            self.decoder.drafter = self.drafter
        return settings

    def set_draft(self, draft: LoadedModel | str) -> None:
        """Swap the L0 drafter (a model, 'ngram' or 'none') without touching the prefilled caches."""
        self.drafter = self._make_drafter(draft)
        self.decoder.drafter = self.drafter

    def cancel(self) -> None:
        """Thread-safe: the running job stops within one step (or one prefill chunk)."""
        self._cancel.set()

    def _start_job(self, cancel: threading.Event | None) -> DecodeSettings:
        """A job begins: its own cancel token (a stop that arrived before it started still counts),
        and the settings asked for so far."""
        self._cancel = cancel if cancel is not None else threading.Event()
        return self._apply_pending()

    # --- prompt helpers ----------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return len(self.target.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_tokens(self, messages: Sequence[ChatMessage], documents: Sequence[DocumentText] = (),
                      system: str | None = None, add_generation_prompt: bool = True) -> list[int]:
        return render_tokens(self.target.tokenizer, messages, documents, system, add_generation_prompt)

    def check_fits(self, messages: Sequence[ChatMessage], documents: Sequence[DocumentText] = (),
                   system: str | None = None) -> int:
        """Raise ContextOverflowError (with the numbers) if prompt + answer cannot fit; return prompt length."""
        n = len(self.prompt_tokens(messages, documents, system))
        self._check_length(n)
        return n

    def _check_length(self, prompt_len: int) -> None:
        answer = self._settings.max_new_tokens
        if prompt_len + answer > self.max_capacity:
            raise ContextOverflowError(
                f"the conversation needs {prompt_len:,} prompt tokens + {answer:,} for the answer = "
                f"{prompt_len + answer:,}, but this model's context holds {self.max_capacity:,}: remove a document, "
                f"start a new chat, lower the answer length, or pick a model with a longer context",
                prompt_tokens=prompt_len, answer_tokens=answer, context_tokens=self.max_capacity)

    GROW_STEP = 4096  # grown caches are a multiple of this many tokens

    def _make_room(self, prompt_len: int) -> None:
        """Grow the full cache if this turn (prompt + answer + one speculation round) needs more
        than it holds: at least double, at most `max_capacity`. The held K/V moves over exactly
        (through CPU memory, so the old and new cache never both sit on the card), and the cache
        factory sees the new size (a bigger cache may need more layers offloaded)."""
        s = self._settings
        need = min(self.max_capacity, prompt_len + s.max_new_tokens + s.gamma1 + s.gamma2 + 2)
        if need <= self.capacity:
            return
        size = max(need, 2 * self.capacity)
        size = min(self.max_capacity, -(-size // self.GROW_STEP) * self.GROW_STEP)
        held = self.full.length
        saved = self._held_kv_on_cpu(held)
        self.decoder.retrieval = None
        self.full = self.decoder.full = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.full = self._cache_factory(self.target.runner, size)
        self._load_held_kv(saved, held)
        self.decoder.full = self.full
        self.capacity = size
        self.grown += 1

    # --- the turn ----------------------------------------------------------------------------
    def prefill(self, messages: Sequence[ChatMessage], documents: Sequence[DocumentText] = (),
                system: str | None = None, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Prefill the conversation without answering (e.g. right after a document is dropped).
        cancel: this job's token (set it from any thread to stop); default: a fresh one."""
        self._start_job(cancel)
        tokens = self.prompt_tokens(messages, documents, system, add_generation_prompt=False)
        self._check_length(len(tokens))
        self._make_room(len(tokens))
        started = time.perf_counter()
        outcome = yield from self._prefill(tokens, keep_last=False)
        reason = FinishReason.CANCELLED if outcome is None else FinishReason.LENGTH
        yield Finished(reason, "", metrics=self._metrics(len(tokens), 0, started, None, None))

    def stream(self, messages: Sequence[ChatMessage], documents: Sequence[DocumentText] = (),
               system: str | None = None, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Generate the next assistant answer; yields PrefillProgress, TokenText, Metrics, Finished."""
        prompt = self.prompt_tokens(messages, documents, system)
        yield from self.stream_ids(prompt, cancel)

    def stream_ids(self, prompt: list[int], cancel: threading.Event | None = None) -> Iterator[Event]:
        """Continue a raw token sequence (the chat template already applied, or plain text for the
        PG-19-style benchmark); same events as `stream`."""
        s = self._start_job(cancel)
        prompt = list(prompt)
        self._check_length(len(prompt))
        self._make_room(len(prompt))
        started = time.perf_counter()
        logits = yield from self._prefill(prompt, keep_last=True)
        if logits is None:
            yield Finished(FinishReason.CANCELLED, "", metrics=self._metrics(len(prompt), 0, started, None, None))
            return
        prefill_done = time.perf_counter()
        if s.sampling.seed is not None:
            self.generator.manual_seed(s.sampling.seed)
        else:
            self.generator.seed()
        self.decoder.stats = type(self.decoder.stats)()
        self.decoder.after_prefill(list(self.full.last_query))
        first, _ = sample_token(logits, s.sampling, self.generator)
        seq = self.held + [first]
        prime = getattr(self.drafter, "prime", None)  # an n-gram index over the new prompt, before timing decode
        if prime is not None:
            prime(seq)
        first_at = time.perf_counter()
        answer = [first]
        text = StreamingText(self.target.tokenizer, s.stop)
        eos = set() if s.ignore_eos else set(self.target.eos_ids)
        reason = FinishReason.EOS if first in eos else None
        unshown: list[int] = []  # tokens whose text is still held back (partial UTF-8, maybe a stop string)
        if reason is None:
            piece = text.add([first])
            unshown.append(first)
            if piece:
                yield TokenText(piece, tuple(unshown), Level.L2)
                unshown = []
            reason = FinishReason.STOP if text.stopped else None
        last_metrics = time.perf_counter()
        while reason is None:
            s = self._apply_pending()  # settings changed while answering apply here, between two steps
            if len(answer) >= s.max_new_tokens:
                reason = FinishReason.LENGTH
                break
            if self._cancel.is_set():
                reason = FinishReason.CANCELLED
                break
            if len(seq) + s.gamma2 + s.gamma1 + 2 > self.capacity:
                reason = FinishReason.LENGTH
                break
            produced = self.decoder.step(seq)
            seq += [tok for tok, _ in produced]
            self.held = seq[:-1]
            for token, level in produced:
                if len(answer) >= s.max_new_tokens:
                    reason = FinishReason.LENGTH
                    break
                if token in eos:
                    reason = FinishReason.EOS
                    break
                answer.append(token)
                piece = text.add([token])
                unshown.append(token)
                if piece:
                    yield TokenText(piece, tuple(unshown), level)
                    unshown = []
                if text.stopped:
                    reason = FinishReason.STOP
                    break
            if time.perf_counter() - last_metrics >= METRICS_EVERY_S:
                last_metrics = time.perf_counter()
                yield self._metrics(len(prompt), len(answer), started, prefill_done, first_at)
        self.held = seq[:-1]
        if reason != FinishReason.STOP:
            tail = text.flush()
            if tail or unshown:
                yield TokenText(tail, tuple(unshown), Level.L2)
        metrics = self._metrics(len(prompt), len(answer), started, prefill_done, first_at)
        yield metrics
        yield Finished(reason, text.text, metrics=metrics)

    def generate(self, messages: Sequence[ChatMessage], documents: Sequence[DocumentText] = (),
                 system: str | None = None) -> str:
        """The answer as a string (runs `stream` to the end)."""
        final = None
        for event in self.stream(messages, documents, system):
            if isinstance(event, Finished):
                final = event
        return final.text if final else ""

    def _prefill(self, tokens: list[int], keep_last: bool):
        """Bring the full cache to `tokens` (all of them). Returns the last token's logits, or None
        if cancelled. keep_last: always recompute the last token (its logits start the answer)."""
        reuse = common_prefix(self.held, tokens)
        if keep_last:
            reuse = min(reuse, len(tokens) - 1)
        reuse = self._restore_snapshot(tokens, reuse)
        chunk = prefill_chunk_for(self.full.device)
        if getattr(self.full, "exact", False) and reuse < len(tokens):
            # compute in the chunks a fresh prefill would use (aligned to `chunk`), so a prompt's
            # logits and K/V never depend on what the cache held before: a regenerated answer,
            # or the same question in another mode, starts from the same bits
            reuse = reuse // chunk * chunk
        self.full.rollback(reuse)
        self.held = self.held[:reuse]
        total = len(tokens) - reuse
        started = time.perf_counter()
        self._prefill_stats = (total, 0.0)
        yield PrefillProgress(0, total, reuse, 0.0)
        logits = None
        runner = self.target.runner
        with widened_for_prefill(runner) if total > chunk else nullcontext():  # the file's blocks widened once
            for start in range(reuse, len(tokens), chunk):
                if self._cancel.is_set():
                    return None
                piece = tokens[start:start + chunk]
                last_piece = start + chunk >= len(tokens)
                self.full.capture_query = last_piece
                logits = runner.forward(torch.tensor(piece, device=runner.device),
                                        torch.arange(start, start + len(piece), device=runner.device),
                                        self.full, last_only=True)[0]
                self.held = tokens[:start + len(piece)]
                self.prefilled_tokens_total += len(piece)
                elapsed = time.perf_counter() - started
                self._prefill_stats = (total, elapsed)
                yield PrefillProgress(start + len(piece) - reuse, total, reuse, elapsed)
        if logits is None:  # nothing to compute: everything was cached (only possible without keep_last)
            return torch.empty(0)
        self._save_snapshot(tokens)
        return logits

    # --- moving the held K/V out of the cache and back (snapshots, growing) ----------------------
    def _held_kv_on_cpu(self, n: int) -> dict[str, torch.Tensor]:
        """The first `n` tokens' K/V of every layer in CPU memory: {"k.<layer>": [Hkv, n, D], "v.<layer>": ...}."""
        tensors = {}
        for layer in range(self.full.n_layers):
            k, v = self.full.layer_kv(layer, 0, n)
            tensors[f"k.{layer}"], tensors[f"v.{layer}"] = k.cpu(), v.cpu()
        return tensors

    def _load_held_kv(self, tensors: dict[str, torch.Tensor], n: int) -> None:
        """Put the first `n` tokens of `tensors` (as _held_kv_on_cpu gives them) into the cache."""
        for layer in range(self.full.n_layers):
            self.full.load_prefix(layer, tensors[f"k.{layer}"][:, :n], tensors[f"v.{layer}"][:, :n])
        self.full.length = n

    def copy_held_from(self, other: "ChatSession") -> None:
        """Hold what `other` holds, its K/V copied (the bench runs each mode in its own session on one prefill)."""
        n = other.full.length
        self._make_room(n)
        self._load_held_kv(other._held_kv_on_cpu(n), n)
        self.held = list(other.held[:n])

    # --- snapshots (prefilled books) -----------------------------------------------------------
    def _snapshot_key(self) -> str:
        from engine.kv.attention import prefill_tag
        from engine.model.stretch import rope_tag

        folder = self.target.folder
        key = f"{self.target.model_id}:{getattr(folder, 'weights_hash', '')}:{self.full.dtype}"
        kv_dtype = getattr(self.full, "kv_dtype", self.full.dtype)
        if kv_dtype != self.full.dtype:  # stored narrower: other K/V bits
            key += f":kv-{str(kv_dtype).removeprefix('torch.')}"
        if getattr(self.full, "prefill_dtype", None) is not None:  # other prefill arithmetic, other K/V
            key += f":prefill-{str(self.full.prefill_dtype).removeprefix('torch.')}"
        native_prefill = prefill_tag(getattr(self.full, "device", "cpu"))
        if native_prefill:  # the native prefill kernel's K/V are not SDPA's
            key += f":{native_prefill}"
        # tensor parallel sums split matmuls in another order: its K/V differ from one card's by rounding;
        # the GGUF's own blocks (weights_tag) are another target than their float32 conversion
        tags = [getattr(self.target.runner, name, "") for name in ("split_tag", "weights_tag")]
        tags.append(rope_tag(getattr(self.target, "config", None)))  # a YaRN stretch: other positions, other K/V
        return ":".join([key] + [t for t in tags if t])

    def _restore_snapshot(self, tokens: list[int], reuse: int) -> int:
        if self.snapshots is None:
            return reuse
        match = self.snapshots.find(self._snapshot_key(), tokens)
        if match is None or match.matched <= reuse + 256:
            return reuse
        loaded = self.snapshots.load(match)
        if loaded is None:
            return reuse
        stored_tokens, tensors = loaded
        n = min(match.matched, len(tokens) - 1)
        self._load_held_kv(tensors, n)
        self.held = list(tokens[:n])
        return n

    def _save_snapshot(self, tokens: list[int]) -> None:
        if self.snapshots is None or len(tokens) < 1024:
            return
        n = self.full.length
        try:
            self.snapshots.save(self._snapshot_key(), tokens[:n], self._held_kv_on_cpu(n))
        except UserError as exc:  # a full disk must not end the chat; the next prefill just costs more
            warnings.warn(f"prefill snapshot not saved: {exc}")

    # --- metrics -----------------------------------------------------------------------------
    def _metrics(self, prompt_len: int, new_tokens: int, started: float, prefill_done: float | None,
                 first_at: float | None) -> Metrics:
        total, elapsed = getattr(self, "_prefill_stats", (0, 0.0))
        now = time.perf_counter()
        decode_s = now - first_at if first_at else None
        stats = self.decoder.stats
        caches = [self.full.stats()]
        mode = Mode.of(self._settings.mode)
        if self.decoder.retrieval is not None and mode.uses_l1:
            r = self.decoder.retrieval
            caches.append(dataclasses.replace(r.stats(), detail=f"budget {r.budget}, chunk {r.chunk}"))
        draft_stats = self.drafter.cache_stats() if mode.uses_l0 else None
        if draft_stats is not None:
            caches.append(draft_stats)
        s = self.decoder.settings  # what actually ran (auto-tuning may have changed gammas/budget)
        metrics = Metrics(
            mode=s.mode,
            prompt_tokens=prompt_len,
            new_tokens=new_tokens,
            prefill_tokens=total,
            prefill_tokens_per_s=(total / elapsed) if elapsed > 0 else None,
            decode_tokens_per_s=((new_tokens - 1) / decode_s) if decode_s and new_tokens > 1 else None,
            time_to_first_token_s=(first_at - started) if first_at else None,
            levels=stats.levels(s.mode),
            caches=tuple(caches),
            mean_accepted_per_verify=(stats.emitted_by_verify / stats.verifications) if stats.verifications else None,
            retrieval_rebuilds=self.decoder.rebuilds,
            settings_summary=f"{s.mode} budget={s.budget} chunk={s.chunk} g1={s.gamma1} g2={s.gamma2} "
                             f"draft={getattr(self.drafter, 'name', '?')}{' auto' if s.auto else ''}",
            **self.decoder.choice_metrics(),
        )
        self._last_metrics = metrics
        return metrics

    def metrics(self) -> Metrics:
        return self._last_metrics or self._metrics(len(self.held), 0, time.perf_counter(), None, None)
