"""Benchmarks: every decoding method on the same prompt, in one process, interleaved.

Workloads (DESIGN.md / the paper): `continue` continues a passage of the sample text from N tokens
of context (the PG-19 setting); `qa` asks a question about the same passage through the chat
template. Time per token excludes prefill and the first token, for every method alike.

Each repeat runs every method once. By default (`interleave="step"`, engine/tools/bench_steps.py)
our methods answer side by side, each in its own session on one shared prefill, asked for tokens
in turn: a slow spell of the host lands on all of them alike, even one that lasts a single answer.
With `interleave="answer"` they answer one after another in one session (A B C, B C A, C A B, ...:
rotated by one each repeat, so no method always holds the same place). The peers (transformers,
llama.cpp) run after ours, an answer each, their prompt prefilled once per cell and reused. The
table gives each method's median with its min and max, and the load average before and after.

Ratios are also given paired: per repeat, one method's time against another's from the same repeat
(run side by side or seconds apart, so under the same load), then the median over repeats. A slow
spell that hits one repeat moves both sides of its ratio, where it moves only one side of a ratio
of medians. Each paired ratio comes with a distribution-free interval for that median (the sign
test's: two order statistics of the repeats' ratios, `median_interval`), so that a ratio a few per
cent off a target can be told from one that the repeats' spread cannot place on either side of it.
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from engine.events import ChatMessage, DocumentText, Finished, TokenText
from engine.model.loading import LoadedModel
from engine.decoding.session import ChatSession
from engine.settings import BENCH_MODES, FIXED_MODES, DecodeSettings
from engine.tools.bench_steps import run_side_by_side, sessions_on_one_prefill
from engine.tools.host_load import read_cpu_times, steal_percent

OUR_METHODS = BENCH_MODES  # auto, ar, draft-only, retrieval-only, triforce, auto-legacy
HF_METHODS = ("hf", "hf-lookup")
PEER_METHODS = HF_METHODS + ("llama.cpp",)
INTERVAL_LEVEL = 0.9  # the paired ratios' intervals cover their median with at least this probability
QA_QUESTION = "Who is the father of Hamlet, and what happened to him? Answer in two sentences."


@dataclass
class MethodResult:
    method: str
    ms_per_token: float  # the median over repeats
    tokens_per_s: float
    speedup_vs_ar: float | None
    acceptance: dict
    identical_to_ar: bool | None
    new_tokens: int
    runs_ms_per_token: list = field(default_factory=list)
    median_ms_per_token: float = 0.0
    min_ms_per_token: float = 0.0
    max_ms_per_token: float = 0.0
    match_length: int | None = None  # leading tokens equal to ar's
    structure: str = ""  # auto: the structure(s) it ran, one per repeat
    candidates: list = field(default_factory=list)  # auto: [structure, predicted ms/token] of the last run
    paired_speedup_vs_ar: float | None = None  # median over repeats of ar's ms/token / this method's
    paired_vs_best_fixed: float | None = None  # auto: the same against the fixed mode with the lowest median
    best_fixed: str = ""  # auto: which fixed mode that was
    paired_vs_ar_interval: list | None = None  # [low, high, coverage] for paired_speedup_vs_ar (median_interval)
    paired_vs_best_fixed_interval: list | None = None  # the same for paired_vs_best_fixed


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


def _run_ours(session: ChatSession, prompt: list[int], settings: DecodeSettings):
    """One answer with `settings`; returns (tokens, ms/token, acceptance, metrics)."""
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
    return tokens, ms, _acceptance(m), m


def _acceptance(m) -> dict:
    return {lv.name: lv.rate for lv in m.levels}


def _note_ours(extra: dict, method: str, m) -> str | None:
    """Keep a run's acceptance (and auto's candidates); returns auto's structure note, else None."""
    extra[method]["acceptance"] = _acceptance(m)
    if method != "auto":
        return None
    extra[method]["candidates"] = [[c.structure, round(c.ms_per_token, 1)] for c in m.candidates]
    return m.structure + (f" ({m.structure_switches} switches)" if m.structure_switches else "")


def paired_speedup(reference_ms: list[float], method_ms: list[float]) -> float | None:
    """Median over repeats of reference / method (ms/token of the same repeat): above 1, the method
    is faster. None when the two have no repeat in common."""
    pairs = [a / b for a, b in zip(reference_ms, method_ms) if b > 0]
    return statistics.median(pairs) if pairs else None


def median_interval(values: list[float], level: float = INTERVAL_LEVEL) -> tuple[float, float, float] | None:
    """A distribution-free interval for the median of `values`, the sign test's: the order statistics
    x(k) and x(n + 1 - k) (1-based, sorted), k the largest whose coverage, 1 - 2 P(Binomial(n, 1/2) < k),
    is at least `level`. Returns (low, high, coverage), or None where even the extremes cover less
    (at 90 %: fewer than 5 values). Five repeats give [min, max] at 93.8 %, nine the second-lowest to
    the second-highest at 96.1 %."""
    xs, n = sorted(values), len(values)
    found = None
    for k in range(1, (n + 1) // 2 + 1):
        coverage = 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
        if coverage < level:
            break
        found = (xs[k - 1], xs[n - k], coverage)
    return found


def paired_interval(reference_ms: list[float], method_ms: list[float]) -> list[float] | None:
    """`median_interval` of the per-repeat ratios `paired_speedup` takes the median of: [low, high, coverage]."""
    got = median_interval([a / b for a, b in zip(reference_ms, method_ms) if b > 0])
    return None if got is None else [round(x, 4) for x in got]


def match_length(tokens: list[int], reference: list[int]) -> int:
    """How many leading tokens agree."""
    n = 0
    for a, b in zip(tokens, reference):
        if a != b:
            break
        n += 1
    return n


def _same_tokens(tokens: list[int], reference: list[int]) -> bool:
    """Equal over the shorter of the two (transformers' generate may still stop at an EOS)."""
    n = min(len(tokens), len(reference))
    return n > 0 and tokens[:n] == reference[:n]


class Peers:
    """Peers built lazily and kept across cells: transformers' model, llama.cpp per prompt size."""

    def __init__(self, model: LoadedModel, gguf=None, log=print) -> None:
        self.model, self.gguf, self.log = model, gguf, log
        self._hf = None
        self._llama = None
        self._servers: dict = {}  # method -> LlamaServerPeer, all for _servers_key (n_ctx, stretch)
        self._servers_key = None
        self.skipped: dict[str, str] = {}

    def use_model(self, model: LoadedModel) -> None:
        """The model the next cells run (another stretch of the same file): transformers' copy follows it."""
        if model is not self.model:
            self.model, self._hf = model, None

    def hf(self):
        from engine.tools.peers import HFPeer

        if self._hf is None:
            self._hf = HFPeer(self.model)
        return self._hf

    def llama(self, n_ctx: int, method: str = "llama.cpp"):
        """The llama.cpp peer for prompts up to n_ctx tokens, or None (the reason in `skipped`):
        llama.cpp's own llama-server where it is built (method "llama.cpp:TYPE" runs its
        --spec-type TYPE), else llama-cpp-python (plain decoding only)."""
        from engine.tools.llama_server import llama_server_binary

        if method in self.skipped:
            return None
        binary = llama_server_binary()
        if binary is not None and self.gguf is not None:
            return self._server(binary, n_ctx, method)
        if method != "llama.cpp":
            self.skipped[method] = "needs llama.cpp's llama-server (../shared/tools/build-llama-cpp-server.sh)"
            self.log(f"{method} skipped: {self.skipped[method]}")
            return None
        from engine.tools.peers import LLAMA_PYTHON_ENV, LlamaCppPeer, llama_cpp_python

        python = llama_cpp_python()
        if python is None or self.gguf is None:
            why = (f"llama-cpp-python not found (set {LLAMA_PYTHON_ENV} or run "
                   f"../shared/tools/build-llama-cpp-python.sh)") if python is None else "the model is not a GGUF file"
            self.skipped["llama.cpp"] = why
            self.log(f"llama.cpp skipped: {why}")
            return None
        if self._llama is None or self._llama[0] != n_ctx:
            self.close_llama()
            try:
                self._llama = (n_ctx, LlamaCppPeer(python, self.gguf, n_ctx, torch.get_num_threads()))
            except Exception as exc:  # an optional peer: a broken install skips it, it does not end the bench
                self.skipped["llama.cpp"] = f"llama.cpp failed to start: {exc}"
                self.log(self.skipped["llama.cpp"])
                return None
        return self._llama[1]

    def _server(self, binary, n_ctx: int, method: str):
        """A llama-server per method for this context and stretch, kept while they stay the same
        (each prefills a cell's prompt once)."""
        from engine.model.stretch import yarn_of
        from engine.tools.llama_server import LlamaServerPeer

        key = (n_ctx, yarn_of(self.model.config))
        if self._servers and self._servers_key != key:
            self.close_llama()
        if method not in self._servers:
            spec = method.partition(":")[2] or None
            try:
                self.log(f"starting llama-server for {method} ({n_ctx} tokens)")
                self._servers[method] = LlamaServerPeer(binary, self.gguf, n_ctx, torch.get_num_threads(),
                                                        rope=key[1], spec_type=spec)
            except Exception as exc:  # an optional peer: a broken build skips it, it does not end the bench
                self.skipped[method] = f"llama-server failed to start: {exc}"
                self.log(self.skipped[method])
                return None
            self._servers_key = key
        return self._servers[method]

    def server_stats(self) -> dict:
        """Per running llama-server: its prefill rate (the request that computed the prompt), peak
        RSS and acceptance of drafted tokens, for the report."""
        out = {}
        for method, peer in self._servers.items():
            pre = peer.last_prefill
            out[method] = {"prefill_tokens_per_s": None if pre is None else round(pre.prompt_tokens_per_s, 1),
                           "prefill_tokens": None if pre is None else pre.prompt_tokens,
                           "peak_rss_bytes": peer.peak_rss_bytes(), "version": peer.version,
                           "command": " ".join(peer.command[1:])}
        return out

    def close_llama(self) -> None:
        if self._llama is not None:
            self._llama[1].close()
            self._llama = None
        for peer in self._servers.values():
            peer.close()
        self._servers, self._servers_key = {}, None


def run_bench(model: LoadedModel, text: str, context: int, new_tokens: int, methods: list[str],
              base: DecodeSettings, draft, workload: str = "continue", repeats: int = 2,
              log=print, peers: Peers | None = None, max_steal: float | None = None,
              interleave: str = "step") -> dict:
    """Run every method once per repeat, interleaved; returns the JSON-ready report. Our methods run
    in an order rotated by one each repeat (ar, auto, triforce; auto, triforce, ar; ...), so no method
    always goes first; `interleave="step"`: side by side, each asked for a token in that order every
    round (bench_steps.py); "answer": one answer after another in one session. The peers follow. A repeat's host
    steal (engine/tools/host_load.py) is the highest share of the CPU the host took during one of its
    runs. `max_steal`: a repeat over this share (per cent) is set aside, every method's run of it
    alike, and run again, at most `repeats` extra times; the report keeps the set-aside times."""
    prompt = build_prompt(model, text, context, workload)
    peers = peers or Peers(model, log=log)
    settings = base.replace(max_new_tokens=new_tokens)
    settings = settings.replace(stop=(), ignore_eos=True)  # same token count as transformers' generate
    capacity = min(model.max_context, len(prompt) + new_tokens + 64)
    if interleave not in ("step", "answer"):
        raise ValueError(f"interleave {interleave!r}: 'step' or 'answer'")
    load_before, cell_start = os.getloadavg(), read_cpu_times()
    log(f"prefill {len(prompt)} tokens")
    ordered = ["ar"] + [m for m in methods if m != "ar"]
    runs: dict[str, list[float]] = {m: [] for m in ordered}
    tokens: dict[str, list[int]] = {}
    extra: dict[str, dict] = {m: {"acceptance": {}, "structures": [], "candidates": []} for m in ordered}
    steal_kept: list[float | None] = []
    set_aside: list[dict] = []
    ours = [m for m in ordered if m in OUR_METHODS]
    attempts = 0
    session = sessions = None
    prefill: dict = {}
    if interleave == "step" and ours:  # a session per method: each keeps its own caches and learned costs
        sessions = sessions_on_one_prefill(model, ours, prompt, settings, draft, capacity, prefill)
    else:  # one session: each answer reuses the prefill the one before left
        session = ChatSession(model, settings.replace(mode="ar"), draft=draft, capacity=capacity)
    while len(steal_kept) < repeats:
        times, structures, steal = {}, None, None
        turn = attempts % len(ours) if ours else 0
        attempts += 1
        rotated = ours[turn:] + ours[:turn]
        batches = ([rotated] if sessions is not None else [[m] for m in rotated]) + [
            [m] for m in ordered if m not in OUR_METHODS]
        for batch in batches:
            start = read_cpu_times()
            done: dict[str, tuple[list[int], float]] = {}
            if sessions is not None and batch[0] in OUR_METHODS:
                for method, run in run_side_by_side(sessions, batch, prompt).items():
                    done[method] = (run.tokens, run.ms_per_token)
                    structures = _note_ours(extra, method, run.metrics) or structures
            elif batch[0] in OUR_METHODS:
                got, ms, _, m = _run_ours(session, prompt, settings.replace(mode=batch[0]))
                done[batch[0]] = (got, ms)
                structures = _note_ours(extra, batch[0], m) or structures
            elif batch[0] in HF_METHODS:
                done[batch[0]] = peers.hf().run(prompt, new_tokens, batch[0] == "hf-lookup")
            else:
                peer = peers.llama(len(prompt) + new_tokens + 64, batch[0])
                if peer is None:
                    continue
                try:
                    done[batch[0]] = peer.run(prompt, new_tokens)
                except (RuntimeError, OSError, ValueError) as exc:  # an optional peer: skipped, the bench goes on
                    peers.skipped[batch[0]] = f"{batch[0]} failed: {exc}"
                    log(peers.skipped[batch[0]])
                    continue
            run_steal = steal_percent(start, read_cpu_times())  # a repeat is as stolen as its worst run:
            if run_steal is not None:  # a spell that hits one method skews that repeat's paired ratios
                steal = run_steal if steal is None else max(steal, run_steal)
            for method, (got, ms) in done.items():
                times[method] = ms
                tokens[method] = got
                log(f"  [{len(steal_kept) + 1}/{repeats}] {method}: {ms:.1f} ms/token")
        if max_steal is not None and steal is not None and steal > max_steal and len(set_aside) < repeats:
            set_aside.append({"steal_percent": round(steal, 1), "ms_per_token": {k: round(v, 2) for k, v in times.items()}})
            log(f"  host steal {steal:.1f} % > {max_steal} %: this repeat is set aside and run again")
            continue
        if steal is not None:
            log(f"  host steal {steal:.1f} %")
        steal_kept.append(None if steal is None else round(steal, 1))
        for method, ms in times.items():
            runs[method].append(ms)
        if structures is not None:
            extra["auto"]["structures"].append(structures)
    load_after, cell_steal = os.getloadavg(), steal_percent(cell_start, read_cpu_times())
    from engine.tools.memory_floor import memory_floor

    floor = memory_floor(model, len(prompt))
    servers = peers.server_stats()
    any_session = session if session is not None else next(iter(sessions.values()))
    reference = tokens["ar"]
    results: dict[str, MethodResult] = {}
    for method in ordered:
        if not runs[method]:
            continue
        median = statistics.median(runs[method])
        got = tokens[method]
        results[method] = MethodResult(
            method, median, 1000.0 / median, None, extra[method]["acceptance"],
            _same_tokens(got, reference), len(got), runs[method], median, min(runs[method]), max(runs[method]),
            match_length(got, reference), "; ".join(extra[method]["structures"]), extra[method]["candidates"])
    ar_ms = results["ar"].ms_per_token
    for r in results.values():
        r.speedup_vs_ar = ar_ms / r.ms_per_token
        r.paired_speedup_vs_ar = paired_speedup(runs["ar"], runs[r.method])
        r.paired_vs_ar_interval = paired_interval(runs["ar"], runs[r.method])
    fixed = [results[m] for m in OUR_METHODS if m in results and m in FIXED_MODES]
    if "auto" in results and fixed:
        best = min(fixed, key=lambda r: r.ms_per_token)
        results["auto"].best_fixed = best.method
        results["auto"].paired_vs_best_fixed = paired_speedup(runs[best.method], runs["auto"])
        results["auto"].paired_vs_best_fixed_interval = paired_interval(runs[best.method], runs["auto"])
    from engine.model.stretch import describe_rope

    return {
        "model": model.model_id,
        "rope": describe_rope(model.config),  # None unless stretched past its trained context
        "device": str(model.device) if model.device.type == "cuda" else f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "workload": workload,
        "context_tokens": len(prompt),
        "new_tokens": new_tokens,
        "repeats": repeats,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "steal_percent": None if cell_steal is None else round(cell_steal, 1),
        "steal_percent_by_repeat": steal_kept,
        "max_steal_percent": max_steal,
        "set_aside_repeats": set_aside,
        "openmp_wait": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")},  # main.py's choice
        "settings": {"budget": settings.budget, "chunk": settings.chunk, "gamma1": settings.gamma1,
                     "gamma2": settings.gamma2,
                     "draft": getattr(any_session.drafter, "name", str(draft))},
        "interleave": interleave,
        "skipped": dict(peers.skipped),
        "memory_floor": floor,  # a plain step's bytes over this machine's read bandwidth (memory_floor.py)
        "prefill": {"ours": {k: (round(v, 2) if isinstance(v, float) else v) for k, v in prefill.items()},
                    **{m: {"tokens_per_s": st["prefill_tokens_per_s"], "tokens": st["prefill_tokens"]}
                       for m, st in servers.items()}},
        "peak_rss_bytes": {"ours (this process, every session)": _own_peak_rss(),
                           **{m: st["peak_rss_bytes"] for m, st in servers.items()}},
        "llama_server": servers,
        "results": [asdict(results[m]) for m in methods if m in results],
    }


def _own_peak_rss() -> int | None:
    """This process's peak resident set in bytes (Linux), or None."""
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError):
        return None


def _steal_note(report: dict) -> str:
    """', host steal 2.1 % (by repeat 0.4, 3.0, ...)' (the cell's share, then each repeat's worst run's)
    and the repeats set aside, where measured."""
    if report.get("steal_percent") is None:
        return ""
    kept = ", ".join("?" if x is None else f"{x}" for x in report.get("steal_percent_by_repeat", []))
    note = f", host steal {report['steal_percent']} % (by repeat {kept})"
    aside = report.get("set_aside_repeats") or []
    if aside:
        note += (f"; {len(aside)} repeats set aside at over {report['max_steal_percent']} % steal ("
                 + ", ".join(f"{a['steal_percent']}" for a in aside) + ")")
    return note


def _interval_note(interval: list | None) -> str:
    """' (0.93-1.04, 94 % interval)' for a paired ratio's median_interval, '' where it has none."""
    if not interval:
        return ""
    low, high, coverage = interval
    return f" ({low:.2f}-{high:.2f}, {100 * coverage:.0f} % interval)"


def format_report(report: dict) -> str:
    """The report as a table: median ms/token with min-max, speedup, acceptance, exactness."""
    stretched = f" stretched ({report['rope']})" if report.get("rope") else ""
    lines = [f"{report['model']}{stretched} on {report['device']}: {report['workload']}, {report['context_tokens']} tokens of "
             f"context, {report['new_tokens']} new tokens, {report.get('repeats', '?')} repeats interleaved "
             f"{'step by step' if report.get('interleave', 'answer') == 'step' else 'answer by answer'}, "
             f"{report['settings']}, load average {report.get('load_average_before', ['?'])[0]} -> "
             f"{report.get('load_average_after', ['?'])[0]}{_steal_note(report)}",
             f"{'method':<15}{'ms/token':>10}{'(min-max)':>15}{'tokens/s':>10}{'vs ar':>8}{'paired':>8}{'L0->L1':>8}"
             f"{'L1->L2':>8}{'L0->L2':>8}{'same as ar':>12}"]
    for r in report["results"]:
        acc = r["acceptance"]

        def pct(name):
            value = acc.get(name)
            return f"{value:.2f}" if value is not None else "-"
        spread = f"({r.get('min_ms_per_token', r['ms_per_token']):.1f}-{r.get('max_ms_per_token', r['ms_per_token']):.1f})"
        same = str(r["identical_to_ar"])
        if not r["identical_to_ar"] and r.get("match_length") is not None:
            same = f"first {r['match_length']}"
        paired = r.get("paired_speedup_vs_ar")
        paired = f"{paired:.2f}x" if paired is not None else "-"
        lines.append(f"{r['method']:<15}{r['ms_per_token']:>10.1f}{spread:>15}{r['tokens_per_s']:>10.2f}"
                     f"{r['speedup_vs_ar']:>7.2f}x{paired:>8}{pct('l0_l1'):>8}{pct('l1_l2'):>8}{pct('l0_l2'):>8}"
                     f"{same:>12}")
    for r in report["results"]:
        if r.get("paired_vs_best_fixed") is not None:
            lines.append(f"  {r['method']} against the fastest fixed mode ({r['best_fixed']}), paired per repeat: "
                         f"{r['paired_vs_best_fixed']:.2f}x{_interval_note(r.get('paired_vs_best_fixed_interval'))}; "
                         f"against ar: {r['paired_speedup_vs_ar']:.2f}x{_interval_note(r.get('paired_vs_ar_interval'))}")
    for r in report["results"]:
        if r.get("structure"):
            lines.append(f"  {r['method']} ran: {r['structure']}; weighed (ms/token): "
                         + ", ".join(f"{name} {ms}" for name, ms in r.get("candidates", [])))
    lines += _long_context_notes(report)
    for method, why in report.get("skipped", {}).items():
        lines.append(f"  {method} skipped: {why}")
    return "\n".join(lines)


def _long_context_notes(report: dict) -> list[str]:
    """The plain step's memory floor against ar's time, prefill rates and peak RSS, where measured."""
    out = []
    floor = report.get("memory_floor")
    ar = next((r for r in report["results"] if r["method"] == "ar"), None)
    if floor:
        versus = f"; ar {ar['ms_per_token']:.1f} ms = {ar['ms_per_token'] / floor['floor_ms']:.2f}x it" if ar else ""
        out.append(f"  plain step floor: {floor['bytes_per_step'] / 1e6:.0f} MB a step / {floor['read_gbps']} GB/s "
                   f"measured = {floor['floor_ms']:.1f} ms{versus}")
    rates = [f"{name} {p['tokens_per_s']:.1f} tok/s ({p['tokens']} tokens)" for name, p in
             (report.get("prefill") or {}).items() if p and p.get("tokens_per_s")]
    if rates:
        out.append("  prefill: " + ", ".join(rates))
    rss = [f"{name} {b / 2**20:.0f} MiB" for name, b in (report.get("peak_rss_bytes") or {}).items() if b]
    if rss:
        out.append("  peak RSS: " + ", ".join(rss))
    return out


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
    from engine.model.stretch import describe_rope

    return {
        "model": model.model_id,
        "rope": describe_rope(model.config),  # None unless stretched past its trained context
        "context_tokens": len(prompt), "snapshot_bytes": snapshot_bytes,
        "fresh_prefill_s": statistics.median(t for t, _ in cold),
        "from_snapshot_s": statistics.median(t for t, _ in warm),
        "tokens_computed_fresh": cold[0][1], "tokens_computed_from_snapshot": warm[0][1],
    }
