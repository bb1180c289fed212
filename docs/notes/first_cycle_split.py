"""Where each method's cycles of an answer spend their time, side by side as the bench runs them: per
method its first three cycles split by phase (retrieval rebuild and sync, L1's vocabulary, n-gram
lookups, L1's drafting, L2's check, the policy's choice), then the rest summed.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=. .venv/bin/python \
    docs/notes/first_cycle_split.py CONTEXT WORKLOAD REPEATS OTHERS   (e.g. 8000 continue 4 triforce,draft-only)"""
import collections, sys, time
from engine.kv.retrieval import RetrievalCache
from engine.model.draft_vocab import DraftVocabulary
from engine.decoding import drafters, speculative
from engine.tools.bench_steps import run_side_by_side
from side_cell import side_cell, timer

reps, methods, prompt, sessions = side_cell(sys.argv)
acc = collections.Counter()
timer(RetrievalCache, "rebuild", "r.rebuild", acc)
timer(RetrievalCache, "sync", "r.sync", acc)
timer(DraftVocabulary, "_rebuild", "vocab._rebuild", acc)
timer(DraftVocabulary, "cover", "vocab.cover", acc)
timer(DraftVocabulary, "note", "vocab.note", acc)
timer(drafters.NgramDrafter, "propose", "ngram.propose", acc)
timer(drafters.RetrievalDrafter, "propose", "L1.propose", acc)
timer(speculative.HierarchicalDecoder, "_verify_l2", "verify_l2", acc)
timer(speculative.HierarchicalDecoder, "_log_lookups", "log_lookups", acc)
timer(speculative.HierarchicalDecoder, "_shadow_l0", "shadow_l0", acc)
timer(speculative.HierarchicalDecoder, "_choose", "choose", acc)
log = collections.defaultdict(list)
for m in methods:
    dec = sessions[m].decoder
    orig = dec.step
    def step(seq, dec=dec, orig=orig, m=m):
        acc.clear()
        t = time.perf_counter()
        out = orig(seq)
        wall = time.perf_counter() - t
        log[m].append((dec.structure.label, wall * 1000, len(out), {k: round(v * 1000, 1) for k, v in acc.items()}))
        return out
    dec.step = step
for r in range(reps):
    for m in methods: log[m].clear()
    turn = r % len(methods)
    order = methods[turn:] + methods[:turn]
    got = run_side_by_side(sessions, order, prompt)
    print(f"rep {r}: " + ", ".join(f"{m} {got[m].ms_per_token:.1f}" for m in methods))
    for m in methods:
        cyc = log[m]
        print(f"  {m}: {len(cyc)} cycles; first 3:")
        for c in cyc[:3]:
            print(f"     {c[0]:24s} {c[1]:6.1f} ms {c[2]} tok {c[3]}")
        rest = cyc[3:]
        if rest:
            print(f"     rest: {sum(c[1] for c in rest):.0f} ms {sum(c[2] for c in rest)} tok")
    sys.stdout.flush()
