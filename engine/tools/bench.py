"""Benchmarks: every decoding method on the same prompt, in one process, one after another.

Workloads (DESIGN.md / the paper): `continue` continues a passage of the sample text from N tokens
of context (the PG-19 setting); `qa` asks a question about the same passage through the chat
template. Time per token excludes prefill and the first token, for every method alike.
"""
from __future__ import annotations

import platform
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from engine.events import ChatMessage, DocumentText, Finished, TokenText
from engine.model.loading import LoadedModel
from engine.decoding.session import ChatSession
from engine.settings import DecodeSettings

OUR_METHODS = ("triforce", "ar", "retrieval-only", "draft-only")
HF_METHODS = ("hf", "hf-lookup")
QA_QUESTION = "Who is the father of Hamlet, and what happened to him? Answer in two sentences."


@dataclass
class MethodResult:
    method: str
    ms_per_token: float
    tokens_per_s: float
    speedup_vs_ar: float | None
    acceptance: dict
    identical_to_ar: bool | None
    new_tokens: int
    runs_ms_per_token: list = field(default_factory=list)


def build_prompt(model: LoadedModel, text: str, context: int, workload: str) -> list[int]:
    """Token ids of the workload's prompt, `context` tokens long (within a few for `qa`)."""
    tok = model.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if workload == "continue":
        return ids[:context]
    from engine.decoding.prompt import render_tokens

    overhead = len(render_tokens(tok, [ChatMessage("user", QA_QUESTION)], [DocumentText("Hamlet", "")]))
    passage = tok.decode(ids[:max(16, context - overhead)])
    return render_tokens(tok, [ChatMessage("user", QA_QUESTION)], [DocumentText("Hamlet", passage)])


def _run_ours(session: ChatSession, prompt: list[int], settings: DecodeSettings) -> tuple[list[int], float, dict]:
    session.update_settings(settings)
    tokens: list[int] = []
    final = None
    for event in session.stream_ids(prompt):
        if isinstance(event, TokenText):
            tokens += event.token_ids
        elif isinstance(event, Finished):
            final = event
    m = final.metrics
    ms = 1000.0 / m.decode_tokens_per_s if m.decode_tokens_per_s else float("nan")
    acceptance = {lv.name: lv.rate for lv in m.levels}
    return tokens, ms, acceptance


def _same_tokens(tokens: list[int], reference: list[int]) -> bool:
    """Equal over the shorter of the two (transformers' generate may still stop at an EOS)."""
    n = min(len(tokens), len(reference))
    return n > 0 and tokens[:n] == reference[:n]


def _hf_model(model: LoadedModel):
    from transformers import AutoModelForCausalLM

    path = getattr(model.folder, "path", model.folder)
    return AutoModelForCausalLM.from_pretrained(path, dtype=model.runner.dtype).to(model.device).eval()


def _hf_generate(hf, prompt: list[int], new_tokens: int, lookup: bool) -> tuple[list[int], float]:
    ids = torch.tensor([prompt], device=hf.device)
    extra = {"prompt_lookup_num_tokens": 10} if lookup else {}
    started = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                          eos_token_id=None, pad_token_id=0, **extra)
    return out[0, len(prompt):].tolist(), time.perf_counter() - started


def _run_hf(hf, prompt: list[int], new_tokens: int, lookup: bool) -> tuple[list[int], float]:
    """transformers' generate, timed as (t(N tokens) - t(1 token)) / (N - 1): prefill and the first
    token cancel out, exactly what our methods' ms/token leaves out too."""
    _, one = _hf_generate(hf, prompt, 1, lookup)
    generated, full = _hf_generate(hf, prompt, new_tokens, lookup)
    return generated, (full - one) * 1000.0 / max(1, len(generated) - 1)


def run_bench(model: LoadedModel, text: str, context: int, new_tokens: int, methods: list[str],
              base: DecodeSettings, draft, workload: str = "continue", repeats: int = 2,
              log=print) -> dict:
    """Run each method `repeats` times on one prompt; returns the JSON-ready report."""
    prompt = build_prompt(model, text, context, workload)
    settings = base.replace(max_new_tokens=new_tokens)
    settings = settings.replace(stop=(), ignore_eos=True)  # same token count as transformers' generate
    session = ChatSession(model, settings.replace(mode="ar"), draft=draft,
                          capacity=min(model.max_context, len(prompt) + new_tokens + 64))
    log(f"prefill {len(prompt)} tokens")
    ordered = ["ar"] + [m for m in methods if m != "ar"]
    reference: list[int] | None = None
    results: dict[str, MethodResult] = {}
    hf = None
    for method in ordered:
        runs, acceptance, tokens = [], {}, []
        for _ in range(repeats):
            if method in OUR_METHODS:
                tokens, ms, acceptance = _run_ours(session, prompt, settings.replace(mode=method))
            else:
                if hf is None:
                    hf = _hf_model(model)
                tokens, ms = _run_hf(hf, prompt, new_tokens, method == "hf-lookup")
            runs.append(ms)
            log(f"  {method}: {ms:.1f} ms/token")
        if method == "ar":
            reference = tokens
        ms = statistics.median(runs)
        results[method] = MethodResult(method, ms, 1000.0 / ms, None, acceptance,
                                       _same_tokens(tokens, reference) if reference else None,
                                       len(tokens), runs)
    ar_ms = results["ar"].ms_per_token
    for r in results.values():
        r.speedup_vs_ar = ar_ms / r.ms_per_token
    return {
        "model": model.model_id,
        "device": str(model.device) if model.device.type == "cuda" else f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "workload": workload,
        "context_tokens": len(prompt),
        "new_tokens": new_tokens,
        "settings": {"budget": settings.budget, "chunk": settings.chunk, "gamma1": settings.gamma1,
                     "gamma2": settings.gamma2, "draft": getattr(session.drafter, "name", str(draft))},
        "results": [asdict(results[m]) for m in methods if m in results],
    }


def format_report(report: dict) -> str:
    lines = [f"{report['model']} on {report['device']}: {report['workload']}, {report['context_tokens']} tokens of "
             f"context, {report['new_tokens']} new tokens, {report['settings']}",
             f"{'method':<15}{'ms/token':>10}{'tokens/s':>10}{'vs ar':>8}{'L0->L1':>8}{'L1->L2':>8}{'L0->L2':>8}"
             f"{'same as ar':>12}"]
    for r in report["results"]:
        acc = r["acceptance"]

        def pct(name):
            value = acc.get(name)
            return f"{value:.2f}" if value is not None else "-"
        lines.append(f"{r['method']:<15}{r['ms_per_token']:>10.1f}{r['tokens_per_s']:>10.2f}{r['speedup_vs_ar']:>7.2f}x"
                     f"{pct('l0_l1'):>8}{pct('l1_l2'):>8}{pct('l0_l2'):>8}{str(r['identical_to_ar']):>12}")
    return "\n".join(lines)


def run_reopen_bench(model: LoadedModel, text: str, context: int, repeats: int = 2, log=print) -> dict:
    """Time to reopen a chat on a `context`-token document: prefill from scratch vs restoring the
    prefilled-book snapshot (a fresh session each time, as when the app reopens the chat)."""
    import tempfile

    from engine.store.snapshots import SnapshotStore

    prompt = build_prompt(model, text, context, "qa")
    settings = DecodeSettings(mode="ar", max_new_tokens=1)
    capacity = min(model.max_context, len(prompt) + 64)

    def first_token_seconds(snapshots) -> tuple[float, int]:
        session = ChatSession(model, settings, draft="none", capacity=capacity, snapshots=snapshots)
        started = time.perf_counter()
        computed = 0
        for event in session.stream_ids(prompt):
            if isinstance(event, Finished):
                computed = event.metrics.prefill_tokens
        return time.perf_counter() - started, computed

    with tempfile.TemporaryDirectory() as root:
        store = SnapshotStore(root)
        cold = [first_token_seconds(None) for _ in range(repeats)]
        first_token_seconds(store)  # the first open saves the snapshot
        warm = [first_token_seconds(store) for _ in range(repeats)]
        snapshot_bytes = store.total_bytes()
    log(f"fresh prefill {cold}, from snapshot {warm}")
    return {
        "model": model.model_id, "context_tokens": len(prompt), "snapshot_bytes": snapshot_bytes,
        "fresh_prefill_s": statistics.median(t for t, _ in cold),
        "from_snapshot_s": statistics.median(t for t, _ in warm),
        "tokens_computed_fresh": cold[0][1], "tokens_computed_from_snapshot": warm[0][1],
    }
