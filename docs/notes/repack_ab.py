"""Whole-forward A/B of the native matmul, interleaved in one process: kernels v5 (4-bit blocks read
as the file stores them, two half-to-float conversions per block) against v6 (repacked with float32
scale and offset). Builds v5 from git (commit 1184834), checks the logits are identical, prints medians.
Usage (repo root): PYTHONPATH=. .venv/bin/python docs/notes/repack_ab.py CONTEXT REPEATS"""
import ctypes, statistics, subprocess, sys, tempfile, time
from pathlib import Path

import numpy as np
import torch
from engine import native
from engine.cli.chat_cmd import default_budget
from engine.decoding.session import ChatSession
from engine.model.loading import load_folder
from engine.model.quant import QuantWeight
from engine.settings import DecodeSettings
from engine.store.models import resolve_model
from engine.tools.bench import _run_ours, build_prompt
from engine.tools.sample_text import sample_text

torch.set_num_threads(2)
ctx, reps = int(sys.argv[1]), int(sys.argv[2])
work = Path(tempfile.mkdtemp())
(work / "v5.c").write_bytes(subprocess.run(["git", "show", "1184834:engine/native/kernels.c"], capture_output=True, check=True).stdout)
subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o", str(work / "v5.so"), str(work / "v5.c"), "-lm"], check=True)
model = load_folder(resolve_model("bundled"))
base = DecodeSettings(budget=default_budget(ctx, DecodeSettings().chunk)).replace(max_new_tokens=4, stop=(), ignore_eos=True)
prompt = build_prompt(model, sample_text(), ctx, "qa")
session = ChatSession(model, base.replace(mode="ar"), draft="ngram", capacity=len(prompt) + 128)
_run_ours(session, prompt, base.replace(mode="ar"))
full, runner = session.decoder.full, session.decoder.runner
libs = {"v6": native._kernels(), "v5": native._declare(ctypes.CDLL(str(work / "v5.so")))}
weights = list({id(w): w for L in runner.layers for w in vars(L).values() if isinstance(w, QuantWeight)}.values())
weights = list({id(w): w for w in weights + [runner.lm_head]}.values())
matrices = {"v6": {id(w): w._native for w in weights}, "v5": {}}
for w in weights:  # v5 read the file's blocks as stored, kinds 4 (Q4_0), 5 (Q4_1), 8 (Q8_0)
    old = object.__new__(native.BlockMatrix)
    old.array = np.ascontiguousarray(w.blocks)
    old.code, old.pointer, old.out = {"Q4_0": 4, "Q4_1": 5, "Q8_0": 8}[w.kind], old.array.ctypes.data, w.out_features
    matrices["v5"][id(w)] = old


def use(version: str) -> None:
    native._loaded[0] = libs[version]
    for w in weights:
        w._native = matrices[version][id(w)]


sizes = (1, 2, 4, 7)
times = {(v, T): [] for v in libs for T in sizes}
for rep in range(reps):
    for T in sizes:
        tokens, positions = torch.randint(0, 1000, (T,)), torch.arange(full.length, full.length + T)
        logits = {}
        for version in ("v5", "v6") if rep % 2 else ("v6", "v5"):
            use(version)
            start = full.length
            t0 = time.perf_counter()
            logits[version] = runner.forward(tokens, positions, full)
            times[(version, T)].append(time.perf_counter() - t0)
            full.rollback(start)
        assert torch.equal(logits["v5"], logits["v6"])
use("v6")
for T in sizes:
    a, b = (statistics.median(times[(v, T)]) * 1000 for v in ("v5", "v6"))
    print(f"ctx {full.length} T={T}  v5 {a:.1f} ms  v6 {b:.1f} ms  ({b / a:.2f}x)  logits identical")
