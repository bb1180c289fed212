"""ms per target forward of the bundled model at a filled context, by exact-attention path: the
plan this machine's probe picks against the one-row path. Interleaved, medians.
Usage (repo root): OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. .venv/bin/python docs/notes/attention_paths_ms.py [contexts] [repeats]"""
import statistics
import sys
import time

import torch

from engine.kv import exact_attention as ea
from engine.model.loading import load_folder
from engine.store.models import resolve_model

contexts = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1024,8000").split(",")]
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 9
torch.set_num_threads(2)
runner = load_folder(resolve_model("bundled")).runner
arch = runner.arch
shape = (arch.head_dim, arch.n_heads // arch.n_kv_heads, arch.n_kv_heads)
plans = {"probed": ea.kernel_plan(*shape), "one-row": ea.Plan(ea.ONE_ROW, 1)}
print("plans:", plans)
for context in contexts:
    cache = runner.new_full_cache(context + 16)
    gen = torch.Generator().manual_seed(0)
    for layer in range(arch.n_layers):  # attention cost does not depend on the values: random K/V
        cache.load_prefix(layer, torch.randn(arch.n_kv_heads, context, arch.head_dim, generator=gen),
                          torch.randn(arch.n_kv_heads, context, arch.head_dim, generator=gen))
    cache.length = context
    times = {}
    for rep in range(repeats + 1):
        for new in (1, 5):
            for name, plan in plans.items():  # A B, A B, ...
                ea._PLANS[shape] = plan
                ids, pos = torch.randint(0, arch.vocab_size, (new,)), torch.arange(context, context + new)
                start = time.perf_counter()
                runner.forward(ids, pos, cache)
                if rep:  # the first round warms up
                    times.setdefault((new, name), []).append((time.perf_counter() - start) * 1e3)
                cache.rollback(context)
    ea._PLANS[shape] = plans["probed"]
    for (new, name), ts in times.items():
        print(f"context {context:5d}  tokens {new}  {name:8s} median {statistics.median(ts):6.1f} ms"
              f"  min {min(ts):6.1f}  max {max(ts):6.1f}")
