"""One L1 forward of the bundled model (the target on its retrieval cache at the bench's budget) with
int16 activations, with int16 activations and a subset of the vocabulary (engine/model/draft_vocab.py:
the first 8,192 ids and the document's tokens), with the float kernel, and one L2 forward (the full
cache); alternating in one process, medians.
Usage (repo root): PYTHONPATH=. .venv/bin/python docs/notes/l1_vocab_ab.py CONTEXT REPEATS TOKENS
e.g. docs/notes/l1_vocab_ab.py 4096 15 1,3"""
import statistics, sys, time
import torch
from engine.model.loading import load_folder
from engine.store.models import resolve_model
from engine.tools.sample_text import sample_text
torch.set_num_threads(2)
ctx, reps = int(sys.argv[1]), int(sys.argv[2])
sizes = [int(t) for t in sys.argv[3].split(",")]
model = load_folder(resolve_model("bundled"))
runner = model.runner
ids = model.tokenizer(sample_text())["input_ids"][:ctx]
full = runner.new_full_cache(len(ids) + 64)
for start in range(0, len(ids), 256):
    piece = ids[start:start + 256]
    full.capture_query = start + 256 >= len(ids)
    runner.forward(torch.tensor(piece), torch.arange(start, start + len(piece)), full, last_only=True)
budget = max(64, ctx // 8 // 16 * 16)
r = full.retrieval(runner.arch.n_heads, budget, 16, 128)
r.rebuild(list(full.last_query))
from engine.model.draft_vocab import DraftVocabulary
vocab = DraftVocabulary(runner)
vocab.cover(ids)
print("vocab", vocab.count)
times = {}
for rep in range(reps):
    for n in sizes:
        for name, cache, draft, v in (("L1 int16", r, True, None), ("L1 i16+voc", r, True, vocab), ("L1 float", r, False, None), ("L2", full, False, None)):
            held = cache.length
            t = time.perf_counter()
            runner.forward(torch.tensor(ids[:n]), torch.arange(len(ids), len(ids) + n), cache, draft=draft, vocab=v)
            times.setdefault((name, n), []).append((time.perf_counter() - t) * 1000)
            cache.rollback(held)
for (name, n), v in times.items():
    print(f"{ctx} {name:9s} T={n} median {statistics.median(v):6.1f} ms  min {min(v):6.1f}")
