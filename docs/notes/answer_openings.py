"""Each answer's first verification cycles, per method, at one bench cell: what ran, its ms and its
tokens, and the ms/token of the rest of the answer. Methods interleaved, as the bench runs them.
Usage (repo root): OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. .venv/bin/python docs/notes/answer_openings.py CONTEXT WORKLOAD REPEATS METHODS
e.g. docs/notes/answer_openings.py 8000 continue 5 auto,draft-only,triforce"""
import collections
import statistics
import sys
import time

import torch
from engine.decoding.session import ChatSession
from engine.model.loading import load_folder
from engine.settings import DecodeSettings
from engine.store.models import resolve_model
from engine.tools.bench import _run_ours, build_prompt
from engine.tools.sample_text import sample_text
torch.set_num_threads(2)
ctx = int(sys.argv[1]); workload = sys.argv[2]; reps = int(sys.argv[3]); methods = sys.argv[4].split(",")
model = load_folder(resolve_model("bundled"))
base = DecodeSettings().replace(max_new_tokens=64, stop=(), ignore_eos=True)
prompt = build_prompt(model, sample_text(), ctx, workload)
session = ChatSession(model, base.replace(mode="ar"), draft="ngram", capacity=len(prompt) + 128)
dec = session.decoder
orig = dec.step
cyc = []
def step(seq):
    t = time.perf_counter(); out = orig(seq)
    cyc.append((dec.structure.label, round((time.perf_counter() - t) * 1000), len(out)))
    return out
dec.step = step
runs = collections.defaultdict(list)
for r in range(reps):
    for m in methods:
        cyc.clear()
        got, ms, acc, metrics = _run_ours(session, prompt, base.replace(mode=m))
        runs[m].append(ms)
        tot = sum(c[1] for c in cyc); toks = sum(c[2] for c in cyc)
        first = cyc[:3]
        rest_ms, rest_toks = tot - sum(c[1] for c in first), toks - sum(c[2] for c in first)
        print(f"rep {r} {m:14s} {ms:5.1f}  cycles {len(cyc)} first3 {first}  rest {rest_ms / max(1, rest_toks):.1f} ms/tok")
        sys.stdout.flush()
for m in methods:
    print(m, round(statistics.median(runs[m]), 1), [round(x, 1) for x in runs[m]])
