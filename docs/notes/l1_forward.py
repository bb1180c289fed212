"""L1 forward ms at T=1,2,3 with the retrieval cache attending through the native kernel against the
batched matmuls it ran before (the bundled model, qa prompt, the bench's budget), interleaved, medians of 15.
Usage (repo root): PYTHONPATH=. .venv/bin/python docs/notes/l1_forward.py CONTEXT"""
import statistics, sys, time, torch
from engine import native
from engine.cli.chat_cmd import default_budget
from engine.decoding.session import ChatSession
from engine.model.loading import load_folder
from engine.settings import DecodeSettings
from engine.store.models import resolve_model
from engine.tools.bench import _run_ours, build_prompt
from engine.tools.sample_text import sample_text
torch.set_num_threads(2)
ctx = int(sys.argv[1])
model = load_folder(resolve_model("bundled"))
budget = default_budget(ctx, DecodeSettings().chunk)
base = DecodeSettings(budget=budget).replace(max_new_tokens=8, stop=(), ignore_eos=True)
prompt = build_prompt(model, sample_text(), ctx, "qa")
session = ChatSession(model, base.replace(mode="retrieval-only"), draft="ngram", capacity=len(prompt) + 128)
_run_ours(session, prompt, base.replace(mode="retrieval-only"))
dec = session.decoder
full, runner = dec.full, dec.runner
print("held", full.length, "budget", budget)
real = native.attention_supports
caches = {}
for name, ok in (("native", True), ("matmuls", False)):
    native.attention_supports = real if ok else (lambda *a: False)
    r = full.retrieval(runner.arch.n_heads, budget, base.chunk, base.retrieval_headroom())
    native.attention_supports = real
    r.rebuild(dec._prompt_query)
    assert r._native == ok  # the cache took the path asked for
    caches[name] = r
times = {(n, T): [] for n in caches for T in (1, 2, 3)}
for rep in range(15):
    for T in (1, 2, 3):
        for name, r in caches.items():
            start = r.length
            toks = torch.randint(0, 1000, (T,))
            pos = torch.arange(full.length, full.length + T)
            t0 = time.perf_counter(); runner.forward(toks, pos, r); times[(name, T)].append(time.perf_counter() - t0)
            r.rollback(start)
for T in (1, 2, 3):
    print(f"T={T}", "  ".join(f"{n} {statistics.median(times[(n, T)]) * 1000:.1f} ms (min {min(times[(n, T)]) * 1000:.1f})" for n in caches))
