"""ms per target forward by the number of tokens it checks (1-9 and 13), at each filled context
named (default 1024 8000), the bundled GGUF's own blocks: what `auto`'s step-cost table should read on a quiet host.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=. .venv/bin/python docs/notes/check_sizes_ms.py [CONTEXT ...]
Prints, per context, size:median/min over 7 rounds (the sizes interleaved, a first round dropped);
on a noisy host read the minimum (noise only adds time)."""
import statistics, sys, time
import torch
from engine.model.loading import load_folder
from engine.store.models import resolve_model
torch.set_num_threads(2)
folder = resolve_model("bundled")
r = load_folder(folder).runner
sizes = [1,2,3,4,5,6,7,8,9,13]
for context in [int(a) for a in (sys.argv[1:] or ["1024", "8000"])]:
    c = r.new_full_cache(context + 16)
    g = torch.Generator().manual_seed(0)
    for layer in range(r.arch.n_layers):
        c.load_prefix(layer, torch.randn(r.arch.n_kv_heads, context, r.arch.head_dim, generator=g),
                      torch.randn(r.arch.n_kv_heads, context, r.arch.head_dim, generator=g))
    c.length = context
    times = {t: [] for t in sizes}
    for rep in range(8):
        for t in sizes:
            ids, pos = torch.randint(0, 49152, (t,)), torch.arange(context, context + t)
            s = time.perf_counter(); r.forward(ids, pos, c)
            if rep: times[t].append((time.perf_counter() - s) * 1e3)
            c.rollback(context)
    print(context, " ".join(f"{t}:{statistics.median(v):.1f}/{min(v):.1f}" for t, v in times.items()), flush=True)
