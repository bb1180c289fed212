"""The native attention alone, from two or more versions of engine/native/kernels.c, interleaved:
each source is compiled as the app compiles it (cc -O3 -march=native -fopenmp) and called through
ctypes over the bundled model's shapes (30 layers of 3 KV heads, 9 query heads, head size 64) with a
float16 K/V of CONTEXT positions per layer (random, 184 MB at 8K: read from memory, as in a real
step), 2 threads, for 1, 5 and 9 new tokens. Time for all 30 layers, medians of ROUNDS. "same bits"
compares every version's output with the first one's.
Usage (repo root):
    git show HEAD~1:engine/native/kernels.c > /tmp/old.c
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python docs/notes/attention_ab.py 1024,8000 9 /tmp/old.c engine/native/kernels.c
"""
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

contexts = [int(c) for c in sys.argv[1].split(",")]
rounds = int(sys.argv[2])
sources = sys.argv[3:]
out_dir = Path(tempfile.mkdtemp())
calls = []
for i, source in enumerate(sources):
    lib = out_dir / f"v{i}.so"
    subprocess.check_call(["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o", str(lib), source, "-lm"])
    f = ctypes.CDLL(str(lib)).triforce_attention
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p,
                  ctypes.c_int]
    f.restype = ctypes.c_int
    calls.append(f)
layers, n_kv, n_heads, dim = 30, 3, 9, 64
rng = np.random.default_rng(0)
print("context tokens  " + "  ".join(f"{Path(s).name:>12s}" for s in sources))
for context in contexts:
    cap = (context // 32 + 2) * 32
    keys = rng.standard_normal((layers, n_kv, cap, dim)).astype(np.float16)
    values = rng.standard_normal((layers, n_kv, cap, dim)).astype(np.float16)
    for tokens in (1, 5, 9):
        q = rng.standard_normal((n_heads, tokens, dim)).astype(np.float32)
        outs = [np.zeros((layers, n_heads, tokens, dim), np.float32) for _ in calls]
        times = [[] for _ in calls]
        for _ in range(rounds):
            for i, f in enumerate(calls):
                t = time.perf_counter()
                for layer in range(layers):
                    rc = f(q.ctypes.data, keys[layer].ctypes.data, values[layer].ctypes.data, 1, cap, n_heads, n_kv,
                           tokens, dim, context, dim ** -0.5, outs[i][layer].ctypes.data, 2)
                    assert rc == 0, rc
                times[i].append((time.perf_counter() - t) * 1e3)
        same = all(np.array_equal(outs[0], o) for o in outs)
        print(f"{context:7d} T={tokens:<5d} " + "  ".join(f"{statistics.median(t):10.2f}ms" for t in times)
              + ("  same bits" if same else "  other bits"))
