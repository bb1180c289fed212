"""One forward of the bundled model's target, a layer in one native call (engine/model/fused_layers.py)
against the Python layers, for L2 (the target on its full cache) and L1 (the target on its retrieval
cache, int16 activations), at T new tokens; alternating in one process, medians. Also checks that
both give the same logits and K/V bits.
Usage (repo root): PYTHONPATH=. .venv/bin/python docs/notes/fused_ab.py CONTEXTS REPEATS TOKENS
e.g. docs/notes/fused_ab.py 1024,8000 25 1,5"""
import statistics
import sys
import time

import torch
from engine.model.loading import load_folder
from engine.store.models import resolve_model
from engine.tools.sample_text import sample_text

torch.set_num_threads(2)
contexts = [int(c) for c in sys.argv[1].split(",")]
repeats = int(sys.argv[2])
sizes = [int(t) for t in sys.argv[3].split(",")]
model = load_folder(resolve_model("bundled"))
runner = model.runner
text = sample_text()
ids_all = model.tokenizer(text + text)["input_ids"]


def prefilled(ids):
    full = runner.new_full_cache(len(ids) + 64)
    for start in range(0, len(ids), 256):
        piece = ids[start:start + 256]
        full.capture_query = start + 256 >= len(ids)
        runner.forward(torch.tensor(piece), torch.arange(start, start + len(piece)), full, last_only=True)
    return full


def forward(cache, fused, ids, n, draft):
    runner._fused = None if fused else False  # None: the fused layers (built again), False: the Python layers
    return runner.forward(torch.tensor(ids[:n]), torch.arange(len(ids), len(ids) + n), cache, draft=draft)


for ctx in contexts:
    ids = ids_all[:ctx]
    fulls = [prefilled(ids) for _ in range(2)]
    budget = max(64, ctx // 8 // 16 * 16)  # the bench's budget
    retrievals = []
    for _ in range(2):
        r = fulls[0].retrieval(runner.arch.n_heads, budget, 16, 128)
        r.rebuild(list(fulls[0].last_query))
        retrievals.append(r)
    for level, pair, draft in (("L2", fulls, False), ("L1", retrievals, True)):
        held = pair[0].length
        for n in sizes:
            a, b = forward(pair[0], True, ids, n, draft), forward(pair[1], False, ids, n, draft)
            same = torch.equal(a, b) and all(torch.equal(x[:, held:held + n], y[:, held:held + n])
                                             for layer in range(len(runner.layers))
                                             for x, y in zip(pair[0].kv_buffers(layer), pair[1].kv_buffers(layer)))
            for cache in pair:
                cache.rollback(held)
            times = {True: [], False: []}
            for _ in range(repeats):
                for fused in (True, False):
                    t = time.perf_counter()
                    forward(pair[0], fused, ids, n, draft)
                    times[fused].append((time.perf_counter() - t) * 1000)
                    pair[0].rollback(held)
            for fused in (True, False):
                ms = times[fused]
                print(f"{ctx:5d} {level} {'fused ' if fused else 'python'} T={n}  median {statistics.median(ms):6.1f} ms"
                      f"  min {min(ms):6.1f}  max {max(ms):6.1f}" + (f"  same bits {same}" if fused else ""))
            sys.stdout.flush()
