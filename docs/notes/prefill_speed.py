"""Prefill tokens/s of the bundled model on the CPU, interleaved, three ways: its file blocks
widened to float32 for every 256-token chunk with float32 attention (before 2026-12-01), widened
once per prefill (engine/model/quant.py widened_for_prefill), and widened once with the chunks'
attention in bfloat16 (FullCache prefill_dtype, the shipped default). Also says whether the first
two give the same bits (they must).
Usage: PYTHONPATH=. .venv/bin/python docs/notes/prefill_speed.py TOKENS REPEATS"""
import contextlib
import statistics
import sys
import time

import torch

from engine.model.loading import load_folder
from engine.model.quant import widened_for_prefill
from engine.store.models import resolve_model

torch.set_num_threads(2)
runner = load_folder(resolve_model("bundled")).runner
tokens, repeats = int(sys.argv[1]), int(sys.argv[2])
ids = torch.randint(0, 49152, (tokens,), generator=torch.Generator().manual_seed(0))
variants = {"per chunk, f32 attention": (False, None), "once, f32 attention": (True, None),
            "once, bf16 attention": (True, torch.bfloat16)}
speed, outs = {name: [] for name in variants}, {}
for _ in range(repeats):
    for name, (once, attention) in variants.items():
        runner.prefill_dtype = attention
        cache = runner.new_full_cache(tokens + 16)
        started = time.perf_counter()
        with widened_for_prefill(runner) if once else contextlib.nullcontext():
            for start in range(0, tokens, 256):
                logits = runner.forward(ids[start:start + 256], torch.arange(start, min(tokens, start + 256)), cache,
                                        last_only=True)
        speed[name].append(tokens / (time.perf_counter() - started))
        outs[name] = (logits, [k[:, :tokens].clone() for k in cache.keys[:4]])
for name in variants:
    print(f"{name:26s} median {statistics.median(speed[name]):5.0f} tok/s  runs {[round(x) for x in speed[name]]}")
a, b = outs["per chunk, f32 attention"], outs["once, f32 attention"]
print("widened once has the same bits:", torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1])))
c = outs["once, bf16 attention"][0]
print(f"bf16 attention: last logits differ by {(c - a[0]).abs().max():.3g} (RMS {a[0].pow(2).mean().sqrt():.3g}),"
      f" same top token: {int(c.argmax()) == int(a[0].argmax())}")
