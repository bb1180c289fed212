"""ms per target forward of the bundled model at a filled context: the native kernels as shipped
(float16 K/V), the same with float32 K/V, and the torch paths that ran before them (torch's int4
kernel, the exact attention made of torch ops, torch norms/RoPE/silu; TRIFORCE_NATIVE=0).
Interleaved within each repeat, medians. Usage (repo root):
    OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. .venv/bin/python docs/notes/native_ab.py [contexts] [repeats] [tokens]
"""
import os
import statistics
import sys
import time

import torch

from engine.kv.full import FullCache
from engine.model.loading import load_folder
from engine.store.models import resolve_model

contexts = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1024,8000").split(",")]
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 9
sizes = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "1,5,9").split(",")]
torch.set_num_threads(2)
folder = resolve_model("bundled")
native_runner = load_folder(folder).runner
os.environ["TRIFORCE_NATIVE"] = "0"  # decided per object at construction: this runner never runs native
torch_runner = load_folder(folder).runner
os.environ["TRIFORCE_NATIVE"] = "1"
arch = native_runner.arch


def filled(cache: FullCache, context: int) -> FullCache:
    gen = torch.Generator().manual_seed(0)
    for layer in range(arch.n_layers):  # attention cost does not depend on the values: random K/V
        cache.load_prefix(layer, torch.randn(arch.n_kv_heads, context, arch.head_dim, generator=gen),
                          torch.randn(arch.n_kv_heads, context, arch.head_dim, generator=gen))
    cache.length = context
    return cache


for context in contexts:
    shape = (arch.n_layers, arch.n_kv_heads, arch.head_dim, context + 16, torch.float32, "cpu")
    os.environ["TRIFORCE_NATIVE"] = "0"
    torch_cache = filled(FullCache(*shape, prefill_dtype=torch_runner.prefill_dtype), context)
    os.environ["TRIFORCE_NATIVE"] = "1"
    setups = {  # name -> (runner, cache, TRIFORCE_NATIVE while it runs: RoPE decides per call)
        "native, f16 KV": (native_runner, filled(native_runner.new_full_cache(context + 16), context), "1"),
        "native, f32 KV": (native_runner, filled(FullCache(*shape, prefill_dtype=native_runner.prefill_dtype,
                                                           kv_dtype=torch.float32), context), "1"),
        "torch paths": (torch_runner, torch_cache, "0"),
    }
    times = {(name, t): [] for name in setups for t in sizes}
    for rep in range(repeats + 1):
        for t in sizes:
            ids, pos = torch.randint(0, arch.vocab_size, (t,)), torch.arange(context, context + t)
            for name, (runner, cache, flag) in setups.items():
                os.environ["TRIFORCE_NATIVE"] = flag
                start = time.perf_counter()
                runner.forward(ids, pos, cache)
                if rep:  # the first round warms up
                    times[(name, t)].append((time.perf_counter() - start) * 1e3)
                cache.rollback(context)
    os.environ["TRIFORCE_NATIVE"] = "1"
    for (name, t), ts in times.items():
        print(f"{context:5d} {name:15s} T={t}  median {statistics.median(ts):6.1f} ms  min {min(ts):6.1f}  max {max(ts):6.1f}")
