"""`main.py gpu-check`: measure what the offload manager and the three levels cost on this GPU.

Nothing is downloaded: random bf16 weights with Llama-3.1-8B's shapes (target) and Llama-3.2-1B's
(draft) from resources/presets are created on the GPU directly, KV caches are filled with random
data (a 128K prefill would take minutes and tells nothing here). Measured, with CUDA events after
warm-ups, a few repetitions each:

- pinned host-to-device bandwidth (1 GiB copies);
- per context (32K and 128K): L1 (the target on a retrieval cache of budget 4096, gamma1 + 1
  tokens), L2 decode (1 token) and L2 verification (gamma2 + 1 tokens) with the full cache on
  the card, the retrieval rebuild, and the same verification with every layer's KV in pinned
  CPU memory (OffloadedCache, double-buffered prefetch) vs its serial no-prefetch variant;
  overlap hidden = 1 - (t_prefetch - t_compute) / t_transfer, with t_transfer = KV bytes moved /
  measured pinned bandwidth; the fraction of that bandwidth the offloaded verification achieves;
  the same overlap for one prefill chunk (2048 tokens), where compute per layer is as long as
  the copy, unlike a few-token verification;
- the draft step (Llama-3.2-1B shapes, StreamingLLM cache of 4 sinks + 252 recent);
- the TriForce loop's ms per token composed from those step times with assumed acceptance
  (not measured: random weights accept nothing);
- Llama-2-7B-128K at 127K on one and two RTX 4090s, modelled by the planner with its 4090
  numbers derated by the efficiencies measured here, next to the paper's 312 ms and 108 ms.

`--device cpu --quick` runs the same code on tiny shapes (tests use it); it measures nothing
meaningful about GPUs.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import math
import time
from collections.abc import Mapping
from typing import Callable

import torch

from engine.errors import UserError

TARGET = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "meta-llama/Llama-3.2-1B-Instruct"
PAPER_MODEL, PAPER_DRAFT = "NousResearch/Yarn-Llama-2-7b-128k", "JackFram/llama-68m"
PAPER_MS = {"4090": 312.0, "4090x2": 108.0}  # TriForce paper, Llama-2-7B-128K offloaded, 127K context
PAPER_CONTEXT = 127 * 1024
BUDGET, CHUNK = 4096, 16
GAMMA1, GAMMA2 = 4, 6  # DecodeSettings defaults
ACCEPT_L0_L1, ACCEPT_L1_L2 = 0.8, 0.9  # assumed for the composed loop
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=512, bos_token_id=None, eos_token_id=None,
            pad_token_id=None)


class NoCudaError(UserError):
    """gpu-check needs a CUDA device."""


# --- model and caches ---------------------------------------------------------------------------
def preset_config(repo_id: str, tiny: bool):
    from transformers import AutoConfig

    from engine.store.presets import shipped_config

    cfg = dict(shipped_config(repo_id))
    if tiny:
        cfg.update(TINY)
    model_type = cfg.pop("model_type")
    for key in ("architectures", "transformers_version", "torch_dtype", "_name_or_path"):
        cfg.pop(key, None)
    return AutoConfig.for_model(model_type, **cfg)


class RandomState(Mapping):
    """A state dict whose tensors are made on demand, random, on the device (nothing held twice)."""

    def __init__(self, config, device: torch.device, dtype: torch.dtype, seed: int = 0) -> None:
        self.device, self.dtype = device, dtype
        h, i = config.hidden_size, config.intermediate_size
        n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads
        d = getattr(config, "head_dim", None) or h // n_heads
        self.shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (config.vocab_size, h), "norm.weight": (h,)}
        if not config.tie_word_embeddings:
            self.shapes["lm_head.weight"] = (config.vocab_size, h)
        for layer in range(config.num_hidden_layers):
            p = f"layers.{layer}."
            self.shapes.update({
                p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (n_heads * d, h), p + "self_attn.k_proj.weight": (n_kv * d, h),
                p + "self_attn.v_proj.weight": (n_kv * d, h), p + "self_attn.o_proj.weight": (h, n_heads * d),
                p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i)})
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __getitem__(self, key: str) -> torch.Tensor:
        shape = self.shapes[key]
        if len(shape) == 1:
            return torch.ones(shape, dtype=self.dtype, device=self.device)
        t = torch.empty(shape, dtype=self.dtype, device=self.device)
        return t.normal_(0.0, 0.02, generator=self.generator)

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def build_runner(repo_id: str, device: torch.device, dtype: torch.dtype, tiny: bool, max_positions: int):
    from engine.model.runner import LlamaRunner

    config = preset_config(repo_id, tiny)
    return LlamaRunner(config, RandomState(config, device, dtype), device, dtype, max_positions=max_positions)


def _fill(t: torch.Tensor, generator: torch.Generator) -> None:
    t.normal_(0.0, 1.0, generator=generator)


# --- timing ------------------------------------------------------------------------------------
class Timer:
    def __init__(self, device: torch.device, reps: int, warmup: int) -> None:
        self.device, self.reps, self.warmup = device, reps, warmup
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def ms(self, fn: Callable[[], object], reps: int | None = None) -> float:
        """Mean milliseconds per call of fn over `reps` back-to-back calls, after warm-ups."""
        reps = reps or self.reps
        for _ in range(self.warmup):
            fn()
        self.sync()
        if self.cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) / reps
        began = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - began) * 1e3 / reps


def pinned_bandwidth(timer: Timer, nbytes: int) -> dict:
    """Host-to-device (and back) GB/s with page-locked host memory, large copies."""
    cuda = timer.cuda
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    host.fill_(1)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=timer.device)
    h2d = timer.ms(lambda: dev.copy_(host, non_blocking=True), reps=max(3, timer.reps))
    d2h = timer.ms(lambda: host.copy_(dev, non_blocking=True), reps=max(3, timer.reps))
    del host, dev
    return {"bytes": nbytes, "h2d_gbs": nbytes / h2d / 1e6, "d2h_gbs": nbytes / d2h / 1e6, "pinned": cuda}


# --- the measurements ------------------------------------------------------------------------
def measure_context(target, timer: Timer, context: int, pinned_gbs: float, log: Callable[[str], None]) -> dict:
    from engine.kv.full import FullCache
    from engine.kv.offload import OffloadedCache
    from engine.kv.retrieval import RetrievalCache

    a, device, dtype = target.arch, target.device, target.dtype
    gen = torch.Generator(device=device).manual_seed(context)
    held = context - 16  # room for one verification
    budget = min(BUDGET, held // 2 // CHUNK * CHUNK)
    out: dict = {"context": context, "held_tokens": held, "budget": budget}
    tokens = lambda n: torch.randint(0, a.vocab_size, (n,), device=device, generator=gen)  # noqa: E731
    pos = lambda n: torch.arange(held, held + n, device=device)  # noqa: E731

    log(f"  {context} tokens: filling the full cache with random KV")
    full = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, context, dtype, device)
    for layer in range(a.n_layers):
        _fill(full.keys[layer][:, :held], gen)
        _fill(full.values[layer][:, :held], gen)
    full.length = held
    kv_bytes = held * full.bytes_per_token()
    out["kv_bytes"] = kv_bytes

    def l2(n: int):
        ids, p = tokens(n), pos(n)

        def run():
            target.forward(ids, p, full)
            full.rollback(held)
        return run

    out["l2_decode_ms"] = timer.ms(l2(1))
    out["l2_verify_ms"] = timer.ms(l2(GAMMA2 + 1))
    verify_ids, verify_pos = tokens(GAMMA2 + 1), pos(GAMMA2 + 1)
    reference = target.forward(verify_ids, verify_pos, full).clone()
    full.rollback(held)

    log(f"  {context} tokens: retrieval cache (budget {budget}) rebuild and L1")
    retrieval = RetrievalCache(full, a.n_heads, budget, CHUNK, headroom=128)
    queries = [torch.randn(a.n_heads, a.head_dim, device=device, generator=gen).to(dtype) for _ in range(a.n_layers)]
    out["rebuild_ms"] = timer.ms(lambda: retrieval.rebuild(queries), reps=max(1, timer.reps // 2))
    r_held = retrieval.length

    def l1():
        target.forward(tokens(GAMMA1 + 1), pos(GAMMA1 + 1), retrieval)
        retrieval.rollback(r_held)
    out["l1_ms"] = timer.ms(l1)
    del retrieval, queries

    log(f"  {context} tokens: every layer's KV in {'pinned ' if timer.cuda else ''}CPU memory, double-buffered")
    off_all = list(range(a.n_layers))
    off = OffloadedCache(a.n_layers, a.n_kv_heads, a.head_dim, context, dtype, device, off_all)
    for layer in off_all:  # the same KV as on the card, so the logits must agree
        off.keys[layer][:, :held].copy_(full.keys[layer][:, :held])
        off.values[layer][:, :held].copy_(full.values[layer][:, :held])
    off.length = held
    out["offload_pinned"] = bool(off.keys[0].is_pinned())
    out["offload_staging_bytes"] = off.staging_bytes()

    def run():
        target.forward(verify_ids, verify_pos, off)
        off.rollback(held)
    results = {}
    for name, prefetch in (("prefetch", True), ("serial", False)):
        off.prefetch = prefetch
        before = off.copied_bytes
        results[name] = timer.ms(run)
        out[f"offload_{name}_bytes"] = (off.copied_bytes - before) / (timer.reps + timer.warmup)
        if name == "prefetch":
            got = target.forward(verify_ids, verify_pos, off)
            off.rollback(held)
            out["offload_logits_identical"] = bool(torch.equal(got, reference))
    out.update(measure_long_compute(target, timer, full, off, held, pinned_gbs, tokens, log))
    del off, run
    out["l2_verify_offload_ms"] = results["prefetch"]
    out["l2_verify_offload_serial_ms"] = results["serial"]
    moved = out["offload_serial_bytes"]
    t_transfer = moved / (pinned_gbs * 1e6) if pinned_gbs else float("nan")  # ms
    out["transfer_ms_at_pinned_bw"] = t_transfer
    out["transfer_ms_measured"] = results["serial"] - out["l2_verify_ms"]
    out["overlap_hidden"] = hidden_fraction(results["prefetch"], out["l2_verify_ms"], t_transfer)
    out["offload_gbs"] = out["offload_prefetch_bytes"] / results["prefetch"] / 1e6
    out["offload_fraction_of_pinned"] = out["offload_gbs"] / pinned_gbs if pinned_gbs else float("nan")
    out["l2_read_bytes"] = target.nbytes() - target.embed.numel() * target.embed.element_size() * (
        target.lm_head is not target.embed) + kv_bytes
    out["l2_verify_gbs"] = out["l2_read_bytes"] / out["l2_verify_ms"] / 1e6
    del full, reference
    gc.collect()
    if timer.cuda:
        torch.cuda.empty_cache()
    return out


def hidden_fraction(with_prefetch_ms: float, compute_ms: float, transfer_ms: float) -> float:
    """How much of the copy the double buffer hid: 1 - (t_prefetch - t_compute) / t_transfer."""
    return 1 - (with_prefetch_ms - compute_ms) / transfer_ms if transfer_ms else float("nan")


def measure_long_compute(target, timer: "Timer", full, off, held: int, pinned_gbs: float, tokens, log) -> dict:
    """The double buffer where compute is long enough to hide behind: one prefill chunk (the
    session's CUDA chunk, 2048 tokens; 32 on the CPU) attending over the whole held prefix, with
    every layer's KV offloaded (prefetch vs serial) and on-chip. A decode-sized verification
    computes ~0.5 ms per layer against ~10 ms of copy at 128K, so there is little to hide there;
    a long document's prefill chunk computes about as long as the copy."""
    from engine.decoding.session import prefill_chunk_for

    n = min(prefill_chunk_for(target.device) if target.device.type == "cuda" else 32, held // 2)
    start = held - n
    ids, p = tokens(n), torch.arange(start, held, device=target.device)
    log(f"    prefill chunk of {n} tokens over {start} held, every layer offloaded")

    def chunk(cache):
        def run():
            cache.rollback(start)
            target.forward(ids, p, cache, last_only=True)
        return run
    reps = max(1, timer.reps // 2)
    onchip = timer.ms(chunk(full), reps=reps)
    times = {}
    for name, prefetch in (("prefetch", True), ("serial", False)):
        off.prefetch = prefetch
        before = off.copied_bytes
        times[name] = timer.ms(chunk(off), reps=reps)
        moved = (off.copied_bytes - before) / (reps + timer.warmup)
    off.prefetch = True
    full.length = off.length = held
    t_transfer = moved / (pinned_gbs * 1e6) if pinned_gbs else float("nan")
    return {"chunk_tokens": n, "chunk_onchip_ms": onchip, "chunk_offload_ms": times["prefetch"],
            "chunk_offload_serial_ms": times["serial"], "chunk_transfer_ms_at_pinned_bw": t_transfer,
            "chunk_overlap_hidden": hidden_fraction(times["prefetch"], onchip, t_transfer)}


def measure_tensor_parallel(timer: Timer, devices: list[torch.device], dtype: torch.dtype, tiny: bool,
                            context: int, log: Callable[[str], None]) -> dict:
    """The card-to-card hop (a [1, hidden] activation there and back; the planner assumes 30 us
    per all-reduce) and L2 with the target split across `devices` (tensor parallel, KV on-chip),
    to set beside the same forward on one card. With both shares on one card this measures
    tensor parallel's overhead (twice the launches, the hops), not its gain."""
    from engine.model.runner_tp import TensorParallelRunner

    config = preset_config(TARGET, tiny)
    x = torch.randn(1, config.hidden_size, dtype=dtype, device=devices[0])
    out: dict = {"cards": [str(d) for d in devices], "context": context}
    out["hop_us"] = timer.ms(lambda: x.to(devices[1]).to(devices[0]), reps=max(20, timer.reps)) * 1e3 / 2
    log(f"  tensor parallel over {', '.join(out['cards'])} at {context} tokens")
    tp = TensorParallelRunner(config, RandomState(config, devices[0], dtype), devices, dtype, context)
    cache = tp.new_full_cache(context)
    gen = torch.Generator(device=devices[0]).manual_seed(context)
    held = context - 16
    for part in cache.parts:
        for layer in range(config.num_hidden_layers):
            for t in (part.keys[layer], part.values[layer]):
                t[:, :held].copy_(torch.empty_like(t[:, :held], device=devices[0]).normal_(generator=gen))
    cache.length = held
    ids = torch.randint(0, config.vocab_size, (GAMMA2 + 1,), device=devices[0], generator=gen)

    def l2(n: int, kv):
        def run():
            tp.forward(ids[:n], torch.arange(held, held + n, device=devices[0]), kv)
            kv.rollback(held)
        return run
    out["tp_l2_decode_ms"] = timer.ms(l2(1, cache))
    out["tp_l2_verify_ms"] = timer.ms(l2(GAMMA2 + 1, cache))
    # every layer offloaded: each card streams its own heads' share over its own link at once
    log("  tensor parallel, every layer's KV offloaded")
    off = tp.new_full_cache(context, list(range(config.num_hidden_layers)))
    for part, resident in zip(off.parts, cache.parts):
        for layer in range(config.num_hidden_layers):
            part.load_prefix(layer, resident.keys[layer][:, :held], resident.values[layer][:, :held])
    off.length = held
    del cache
    gc.collect()
    out["tp_l2_verify_offload_ms"] = timer.ms(l2(GAMMA2 + 1, off))
    out["tp_offload_bytes"] = held * off.bytes_per_token()
    del tp, off
    gc.collect()
    return out


def measure_draft(timer: Timer, device: torch.device, dtype: torch.dtype, tiny: bool) -> dict:
    from engine.kv.streaming import StreamingCache

    draft = build_runner(DRAFT, device, dtype, tiny, 4096)
    a = draft.arch
    cache = StreamingCache(a.n_layers, a.n_kv_heads, a.head_dim, 4, 252, 64, dtype, device)
    gen = torch.Generator(device=device).manual_seed(7)
    for layer in range(a.n_layers):
        _fill(cache.keys[layer][:, :256], gen)
        _fill(cache.values[layer][:, :256], gen)
    cache.length = 256
    ids = torch.randint(0, a.vocab_size, (1,), device=device, generator=gen)

    def step():
        draft.forward(ids, torch.tensor([0], device=device), cache, last_only=True)
        cache.rollback(256)
    out = {"draft_step_ms": timer.ms(step), "draft_weight_bytes": draft.nbytes()}
    del draft, cache
    gc.collect()
    return out


def expected_tokens(rate: float, gamma: int) -> float:
    return (1 - rate ** (gamma + 1)) / (1 - rate)


def compose(l0: float, l1: float, l2: float) -> dict:
    """ms per generated token of the TriForce loop from step times, i.i.d. acceptance assumed."""
    c1 = (GAMMA1 * l0 + l1) / expected_tokens(ACCEPT_L0_L1, GAMMA1)
    per_token = (GAMMA2 * c1 + l2) / expected_tokens(ACCEPT_L1_L2, GAMMA2)
    return {"l1_token_ms": c1, "ms_per_token": per_token}


def model_paper_setting(eff_hbm: float, eff_pcie: float) -> dict:
    """Llama-2-7B-128K at 127K on the planner's 4090s, bandwidths derated by measured efficiency."""
    from engine.offload.shapes import shape_for
    from engine.offload.planner import RTX_4090, Acceptance, device_spec, plan_placement
    from engine.settings import DecodeSettings

    settings = DecodeSettings(gamma1=GAMMA1, gamma2=GAMMA2, budget=BUDGET, chunk=CHUNK)
    target, draft = shape_for(PAPER_MODEL), shape_for(PAPER_DRAFT)
    acceptance = Acceptance(l0_by_l1=ACCEPT_L0_L1, l1_by_l2=ACCEPT_L1_L2)
    derated = dataclasses.replace(RTX_4090, bandwidth_gbs=RTX_4090.bandwidth_gbs * eff_hbm,
                                  pcie_gbs=RTX_4090.pcie_gbs * eff_pcie)
    out = {}
    for profile in ("4090", "4090x2"):
        spec = device_spec(profile)
        spec = dataclasses.replace(spec, gpus=(derated,) * len(spec.gpus))
        for tp in ((True, False) if profile == "4090x2" else (True,)):
            key = profile if tp else profile + " layer-split"  # the plan's own pick, then the layer split
            best = None
            for gamma2 in (GAMMA2, 8, 12, 16, 24, 32):  # the paper tunes gamma2 up when L2 is slow
                plan = plan_placement(target, draft, PAPER_CONTEXT, settings.replace(gamma2=gamma2), spec,
                                      acceptance=acceptance, tensor_parallel=tp, raise_on_misfit=False)
                if gamma2 == GAMMA2:
                    ideal = plan_placement(target, draft, PAPER_CONTEXT, settings, profile, acceptance=acceptance,
                                           tensor_parallel=tp, raise_on_misfit=False)
                    out[key] = {"mode": plan.mode, "fits": plan.fits, "offloaded_layers": plan.kv_layers_offloaded,
                                "l2_ms": plan.floors.l2_ms, "ms_per_token": plan.floors.end_to_end_ms,
                                "floor_ms_per_token": ideal.floors.end_to_end_ms,
                                "paper_ms_per_token": PAPER_MS[profile]}
                if best is None or plan.floors.end_to_end_ms < best[1]:
                    best = (gamma2, plan.floors.end_to_end_ms)
            out[key]["best_gamma2"], out[key]["best_gamma2_ms_per_token"] = best
    return out


def run_check(device: str = "cuda", quick: bool = False, contexts: tuple[int, ...] | None = None,
              log: Callable[[str], None] = print) -> dict:
    """All measurements; returns a JSON-able dict. Raises NoCudaError without CUDA (device cuda)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise NoCudaError("gpu-check needs an NVIDIA GPU with CUDA, and torch here sees none "
                              f"(torch {torch.__version__}); run it on the GPU machine")
        dev = torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
    tiny = dev.type != "cuda"
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    if contexts is None:
        contexts = (128, 256) if tiny else ((16384, 32768) if quick else (32768, 131072))
    timer = Timer(dev, reps=2 if quick else 5, warmup=1 if quick else 2)
    started = time.perf_counter()
    result: dict = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (tiny shapes)",
                    "torch": torch.__version__, "dtype": str(dtype).replace("torch.", ""), "quick": quick,
                    "target": TARGET + (" (tiny)" if tiny else ""), "draft": DRAFT + (" (tiny)" if tiny else ""),
                    "weights": "random", "budget": BUDGET, "chunk": CHUNK, "gamma1": GAMMA1, "gamma2": GAMMA2,
                    "assumed_acceptance": {"l0_by_l1": ACCEPT_L0_L1, "l1_by_l2": ACCEPT_L1_L2}}
    log("pinned host-to-device bandwidth")
    result["pinned"] = pinned_bandwidth(timer, (1 << 20) * (8 if tiny else (256 if quick else 1024)))
    pinned_gbs = result["pinned"]["h2d_gbs"]
    log("draft step (Llama-3.2-1B shapes, StreamingLLM 4 + 252)")
    result.update(measure_draft(timer, dev, dtype, tiny))
    log("target (Llama-3.1-8B shapes, random bf16 weights)")
    target = build_runner(TARGET, dev, dtype, tiny, max(contexts))
    result["target_weight_bytes"] = target.nbytes()
    result["contexts"] = []
    for context in contexts:
        row = measure_context(target, timer, context, pinned_gbs, log)
        row["triforce_onchip"] = compose(result["draft_step_ms"], row["l1_ms"], row["l2_verify_ms"])
        row["triforce_offloaded"] = compose(result["draft_step_ms"], row["l1_ms"], row["l2_verify_offload_ms"])
        row["ar_onchip_ms_per_token"] = row["l2_decode_ms"]
        result["contexts"].append(row)
    del target
    gc.collect()
    # two cards when there are two; otherwise both shares on this one card, which measures what
    # tensor parallel costs (twice the kernel launches, the hops) but not what it gains
    two = dev.type == "cuda" and torch.cuda.device_count() > 1
    cards = [torch.device("cuda", i) for i in range(2)] if two else [dev, dev]
    result["tensor_parallel"] = measure_tensor_parallel(timer, cards, dtype, tiny, contexts[0], log)
    result["tensor_parallel"]["same_card"] = not two
    # efficiencies measured here, applied to the planner's 4090 numbers
    top = result["contexts"][-1]
    peak = _peak_bandwidth_gbs(dev)
    eff_hbm = min(1.0, top["l2_verify_gbs"] / peak) if peak else 1.0
    eff_pcie = min(1.0, max(0.05, top["offload_fraction_of_pinned"])) if not math.isnan(top["offload_fraction_of_pinned"]) else 1.0
    result["efficiency"] = {"hbm_peak_gbs": peak, "hbm": eff_hbm, "pcie_of_pinned": eff_pcie}
    result["paper_setting"] = model_paper_setting(eff_hbm, eff_pcie)
    result["seconds"] = time.perf_counter() - started
    return result


def _peak_bandwidth_gbs(dev: torch.device) -> float | None:
    """Device memory bandwidth from NVML (bus width x max memory clock x 2); None on the CPU."""
    if dev.type != "cuda":
        return None
    try:
        from engine.offload import telemetry

        gpus = telemetry.sample_memory().gpus
        name = torch.cuda.get_device_name(dev)
        match = [g for g in gpus if g.name == name and g.bandwidth_gbs]
        return float(match[0].bandwidth_gbs) if match else None
    except Exception:  # noqa: BLE001  NVML missing: report raw numbers only
        return None


def format_table(r: dict) -> str:
    rows = [f"gpu-check on {r['device']} (torch {r['torch']}, {r['dtype']}, random weights; {r['seconds']:.0f} s)",
            f"pinned copies: host->device {r['pinned']['h2d_gbs']:.1f} GB/s, device->host {r['pinned']['d2h_gbs']:.1f} GB/s"
            f" ({r['pinned']['bytes'] / 2**20:.0f} MiB{'' if r['pinned']['pinned'] else ', not pinned: no CUDA'})",
            f"draft step ({r['draft']}, StreamingLLM 4 + 252): {r['draft_step_ms']:.2f} ms", ""]
    head = f"{'ms per forward':<44}" + "".join(f"{c['context']:>12}" for c in r["contexts"])
    rows.append(head)

    def line(label: str, key, fmt: str = "{:12.2f}") -> None:
        values = [key(c) if callable(key) else c[key] for c in r["contexts"]]
        rows.append(f"{label:<44}" + "".join(fmt.format(v) for v in values))

    line("retrieval budget (tokens)", "budget", "{:12d}")
    line(f"L1 retrieval, {r['gamma1'] + 1} tokens", "l1_ms")
    line("retrieval rebuild (all layers)", "rebuild_ms")
    line("L2 decode, 1 token, KV on-chip", "l2_decode_ms")
    line(f"L2 verify, {r['gamma2'] + 1} tokens, KV on-chip", "l2_verify_ms")
    line("  bytes read / time (GB/s)", "l2_verify_gbs", "{:12.0f}")
    line("L2 verify, all KV offloaded, prefetch", "l2_verify_offload_ms")
    line("L2 verify, all KV offloaded, serial", "l2_verify_offload_serial_ms")
    line("  KV moved per forward (GB)", lambda c: c["offload_prefetch_bytes"] / 1e9, "{:12.2f}")
    line("  transfer at pinned bandwidth (ms)", "transfer_ms_at_pinned_bw")
    line("  overlap hidden (1 = copy fully hidden)", "overlap_hidden", "{:12.2f}")
    line("  achieved GB/s, fraction of pinned", lambda c: f"{c['offload_gbs']:.1f} {c['offload_fraction_of_pinned']:.0%}",
         "{:>12}")
    line("  logits identical to on-chip", lambda c: "yes" if c["offload_logits_identical"] else "NO", "{:>12}")
    line("prefill chunk (tokens), KV on-chip", lambda c: f"{c['chunk_onchip_ms']:.2f} ({c['chunk_tokens']})", "{:>12}")
    line("prefill chunk, all KV offloaded, prefetch", "chunk_offload_ms")
    line("prefill chunk, all KV offloaded, serial", "chunk_offload_serial_ms")
    line("  overlap hidden (1 = copy fully hidden)", "chunk_overlap_hidden", "{:12.2f}")
    a = r["assumed_acceptance"]
    line("TriForce ms/token, KV on-chip", lambda c: c["triforce_onchip"]["ms_per_token"])
    line("TriForce ms/token, KV offloaded", lambda c: c["triforce_offloaded"]["ms_per_token"])
    line("plain AR ms/token, KV on-chip", "ar_onchip_ms_per_token")
    rows.append(f"(TriForce composed from the step times: gamma1 {r['gamma1']}, gamma2 {r['gamma2']}, assumed"
                f" acceptance L0->L1 {a['l0_by_l1']}, L1->L2 {a['l1_by_l2']})")
    tp = r.get("tensor_parallel", {})
    if tp.get("same_card"):
        rows.append("tensor parallel with both shares on one card (its overhead only: one GPU here):")
    if tp:
        one = next(c for c in r["contexts"] if c["context"] == tp["context"])
        rows.append(f"tensor parallel over {'+'.join(tp['cards'])} at {tp['context']}: L2 decode {tp['tp_l2_decode_ms']:.2f} ms"
                    f" (one card {one['l2_decode_ms']:.2f}), verify {tp['tp_l2_verify_ms']:.2f} ms"
                    f" (one card {one['l2_verify_ms']:.2f}); card-to-card hop {tp['hop_us']:.0f} us")
        rows.append(f"  verify with every layer's KV offloaded: {tp['tp_l2_verify_offload_ms']:.2f} ms"
                    f" (one card {one['l2_verify_offload_ms']:.2f}) for {tp['tp_offload_bytes'] / 1e9:.2f} GB of KV")
    e = r["efficiency"]
    peak = f"{e['hbm_peak_gbs']:.0f} GB/s peak" if e["hbm_peak_gbs"] else "peak unknown"
    rows.append("")
    rows.append(f"Llama-2-7B-128K at {PAPER_CONTEXT} tokens, modelled: planner's RTX 4090 (1008 GB/s, PCIe 25 GB/s)"
                f" derated by measured efficiency (HBM {e['hbm']:.0%} of {peak}, offload {e['pcie_of_pinned']:.0%}"
                " of pinned)")
    rows.append(f"  (acceptance {a['l0_by_l1']}/{a['l1_by_l2']}, gamma1 {r['gamma1']}; 'floor' = the planner's un-derated"
                " 4090 numbers; the paper's gammas are tuned per setting)")
    for profile, m in r["paper_setting"].items():
        rows.append(f"  {profile:<36} {m['offloaded_layers']:>2} layers offloaded: L2 {m['l2_ms']:8.1f} ms,"
                    f" {m['ms_per_token']:7.1f} ms/token at gamma2 {r['gamma2']} (floor {m['floor_ms_per_token']:.1f}),"
                    f" {m['best_gamma2_ms_per_token']:.1f} at gamma2 {m['best_gamma2']}; paper {m['paper_ms_per_token']:.0f}")
    return "\n".join(rows)


def write_json(result: dict, path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2, default=float)
