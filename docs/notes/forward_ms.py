"""ms per target forward at a filled context: the GGUF's own blocks vs the float32 conversion.
Usage: python forward_ms.py [context] [repeats] [threads]. Interleaves the runners, prints medians."""
import statistics, sys, time
import torch
from engine.model.loading import load_folder
from engine.store.models import resolve_model

context, repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 8000, int(sys.argv[2]) if len(sys.argv) > 2 else 9
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
folder = resolve_model("bundled")
runners = {"gguf blocks": load_folder(folder).runner, "float32": load_folder(folder, file_blocks=False).runner}
caches = {}
for name, r in runners.items():
    c = r.new_full_cache(context + 16)
    g = torch.Generator().manual_seed(0)
    for layer in range(r.arch.n_layers):  # attention cost does not depend on the values: random K/V
        c.load_prefix(layer, torch.randn(r.arch.n_kv_heads, context, r.arch.head_dim, generator=g),
                      torch.randn(r.arch.n_kv_heads, context, r.arch.head_dim, generator=g))
    c.length = context
    caches[name] = c
times = {(n, t): [] for n in runners for t in (1, 8)}
for rep in range(repeats + 1):
    for t in (1, 8):
        for name, r in runners.items():  # interleaved: A B, A B, ...
            ids, pos = torch.randint(0, 49152, (t,)), torch.arange(context, context + t)
            start = time.perf_counter()
            r.forward(ids, pos, caches[name])
            if rep:  # the first round warms up
                times[(name, t)].append((time.perf_counter() - start) * 1e3)
            caches[name].rollback(context)
kv = caches["float32"].nbytes_used()
for (name, t), ts in times.items():
    print(f"{name:12s} T={t}  median {statistics.median(ts):6.1f} ms  min {min(ts):6.1f}  max {max(ts):6.1f}"
          f"  weights {runners[name].nbytes() / 1e6:.0f} MB + KV {kv / 1e6:.0f} MB")
