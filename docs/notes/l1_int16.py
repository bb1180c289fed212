"""L1 with int16 activations (kernels v7) against L1 in float32, bundled model, the bench's qa prompt
and retrieval budget, one process, interleaved:
1. one forward (ms, medians of 15): L2 on the full cache, L1 on the retrieval cache in float32 and
   with int16 activations, at T = 1 and 2 tokens;
2. whole retrieval-only answers (64 tokens, greedy) with each L1, alternating, REPEATS each: ms/token,
   L1->L2 acceptance, and the median L1 forward inside the answers; every answer equals the first.
Usage (repo root): PYTHONPATH=. .venv/bin/python docs/notes/l1_int16.py 1024,4096,8000 REPEATS"""
import collections
import statistics
import sys
import time

import torch
from engine.cli.chat_cmd import default_budget
from engine.decoding.session import ChatSession
from engine.model.loading import load_folder
from engine.model.runner import LlamaRunner
from engine.settings import DecodeSettings
from engine.store.models import resolve_model
from engine.tools.bench import _run_ours, build_prompt
from engine.tools.host_load import read_cpu_times, steal_percent
from engine.tools.sample_text import sample_text

torch.set_num_threads(2)
INT16 = [True]
real_flag, real_forward = LlamaRunner.drafts_int16, LlamaRunner.forward
LlamaRunner.drafts_int16 = property(lambda self: INT16[0] and real_flag.fget(self))  # read as L1 is built
l1_times = collections.defaultdict(list)


def timed_forward(self, tokens, positions, cache, last_only=False, draft=False):
    t0 = time.perf_counter()
    out = real_forward(self, tokens, positions, cache, last_only, draft)
    if type(cache).__name__ == "RetrievalCache" and tokens.shape[0] == 1:
        l1_times[draft].append(time.perf_counter() - t0)
    return out


LlamaRunner.forward = timed_forward
model = load_folder(resolve_model("bundled"))
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
for ctx in [int(c) for c in sys.argv[1].split(",")]:
    budget = default_budget(ctx, DecodeSettings().chunk)
    base = DecodeSettings(budget=budget).replace(max_new_tokens=64, stop=(), ignore_eos=True, mode="retrieval-only")
    prompt = build_prompt(model, sample_text(), ctx, "qa")
    session = ChatSession(model, base, draft="ngram", capacity=len(prompt) + 128)
    reference = _run_ours(session, prompt, base)[0]
    dec = session.decoder
    full, runner = dec.full, dec.runner
    r = full.retrieval(runner.arch.n_heads, budget, base.chunk, base.retrieval_headroom())
    r.rebuild(dec._prompt_query)
    times = collections.defaultdict(list)
    for rep in range(16):
        for T in (1, 2):
            for name, cache, draft in (("L2", full, False), ("L1 float32", r, False), ("L1 int16", r, True)):
                start = cache.length
                ids, pos = torch.randint(0, 1000, (T,)), torch.arange(full.length, full.length + T)
                t0 = time.perf_counter()
                real_forward(runner, ids, pos, cache, draft=draft)
                if rep:  # the first round warms up
                    times[(name, T)].append((time.perf_counter() - t0) * 1e3)
                cache.rollback(start)
    print(f"{ctx} budget {budget} one forward (ms):",
          "  ".join(f"{n} T={T} {statistics.median(v):.1f}" for (n, T), v in times.items()), flush=True)
    answers = collections.defaultdict(list)
    c0 = read_cpu_times()
    for rep in range(repeats):
        for variant in ("int16", "float32"):
            INT16[0] = flag = variant == "int16"
            l1_times[flag].clear()
            tokens, ms, acceptance, _ = _run_ours(session, prompt, base)
            assert tokens == reference
            answers[variant].append((ms, acceptance.get("l1_l2", 0.0), statistics.median(l1_times[flag]) * 1e3))
    for variant, runs in answers.items():
        print(f"{ctx} retrieval-only, L1 {variant}: ms/token "
              f"{statistics.median(x[0] for x in runs):.1f} {[round(x[0], 1) for x in runs]}, "
              f"L1->L2 {runs[-1][1]:.3f}, L1 forward in the answers {statistics.median(x[2] for x in runs):.1f} ms")
    print(f"  host steal {steal_percent(c0, read_cpu_times()):.1f} %", flush=True)
