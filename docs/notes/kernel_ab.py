"""The native block matmul alone, from two or more versions of engine/native/kernels.c, interleaved:
each source is compiled as the app compiles it (cc -O3 -march=native -fopenmp) and called through
ctypes on one Q4_1 weight of 3072 x 576 (two of the bundled model's MLP rows' worth), 2 threads, for
1-9 tokens. Medians of 21 rounds of 40 calls. "same bits" compares every version's output with the
first one's (versions with another sum order differ in the last bits; each is row-invariant).
Usage (repo root):
    git show HEAD~1:engine/native/kernels.c > /tmp/old.c
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python docs/notes/kernel_ab.py /tmp/old.c engine/native/kernels.c
"""
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

out_dir = Path(tempfile.mkdtemp())
calls = []
for i, source in enumerate(sys.argv[1:]):
    lib = out_dir / f"v{i}.so"
    subprocess.check_call(["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o", str(lib), source, "-lm"])
    f = ctypes.CDLL(str(lib)).triforce_block_matmul
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                  ctypes.c_void_p, ctypes.c_int]
    calls.append(f)
rng = np.random.default_rng(0)
rows, cols = 3072, 576
blocks = rng.integers(0, 255, size=(rows, cols // 32, 20), dtype=np.uint8)
blocks[:, :, 0:4] = [0, 0x20, 0, 0x20]  # d = m = 2^-7 (float16): finite, ordinary scales
blocks = np.ascontiguousarray(blocks.reshape(rows, -1))
print("tokens  " + "  ".join(f"{Path(s).name:>10s}" for s in sys.argv[1:]))
for tokens in (1, 2, 3, 4, 5, 6, 8, 9):
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    ys = [np.zeros((tokens, rows), np.float32) for _ in calls]
    times = [[] for _ in calls]
    for _ in range(21):
        for i, f in enumerate(calls):
            t = time.perf_counter()
            for _ in range(40):
                f(5, blocks.ctypes.data, rows, cols, x.ctypes.data, tokens, ys[i].ctypes.data, 2)
            times[i].append((time.perf_counter() - t) / 40 * 1e6)
    same = all(np.array_equal(ys[0], y) for y in ys)
    print(f"T={tokens:<5d} " + "  ".join(f"{statistics.median(t):8.1f}us" for t in times)
          + ("  same bits" if same else "  other bits"))
