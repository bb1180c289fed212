"""gpu-check's setup: the shapes it measures, random weights made on the device, and timing."""
from __future__ import annotations

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


def fill_random(t: torch.Tensor, generator: torch.Generator) -> None:
    """Fills `t` in place with standard normal values from `generator` (random weights and KV)."""
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
