"""Every verification cycle of `auto`'s answers at one bench cell, with fixed methods run between
them as the bench does: what ran, its wall ms, the tokens it yielded and checked, and what the policy
predicted for ar and for the structure it chose. Shows where auto loses time against the best fixed mode.
Usage (repo root): OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. .venv/bin/python docs/notes/auto_trace.py CONTEXT WORKLOAD REPEATS [OTHERS]
e.g. docs/notes/auto_trace.py 2048 qa 4 ar,draft-only; a fixed method may name its draft length,
e.g. docs/notes/auto_trace.py 1024 continue 6 ar,draft-only:4,draft-only:8.
Since the seventeenth pass the retrieval budget is the bench's (~1/8 of the context; before, 1024 at
every context), and each method's line gives the host steal during its run. Since the twenty-first
each auto answer also prints what the policy weighed last, its acceptance estimates, cycles tried per
mode, the retrieval budget, ar's ratio and each mode's realized wall/model ratio."""
import collections
import statistics
import sys
import time

import torch
from engine.cli.chat_cmd import default_budget
from engine.decoding.structure import Structure
from engine.decoding.session import ChatSession
from engine.model.loading import load_folder
from engine.settings import DecodeSettings, Mode
from engine.store.models import resolve_model
from engine.tools.bench import _run_ours, build_prompt
from engine.tools.host_load import read_cpu_times, steal_percent
from engine.tools.sample_text import sample_text

torch.set_num_threads(2)
ctx, workload, reps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
others = sys.argv[4].split(",") if len(sys.argv) > 4 else ["ar"]
model = load_folder(resolve_model("bundled"))
base = DecodeSettings(budget=default_budget(ctx, DecodeSettings().chunk)).replace(  # the bench's budget
    max_new_tokens=64, stop=(), ignore_eos=True)
prompt = build_prompt(model, sample_text(), ctx, workload)
session = ChatSession(model, base.replace(mode="ar"), draft="ngram", capacity=len(prompt) + 128)
dec = session.decoder
orig = dec.step
cycles = []


def drafted():
    st = dec.stats
    return st.l0_l2.proposed + st.l1_l2.proposed  # the drafts L2 checked so far


def step(seq):
    t, before = time.perf_counter(), drafted()
    out = orig(seq)
    ms = (time.perf_counter() - t) * 1000
    p = dec.policy
    ar = p.seconds_per_token(Structure(Mode.AR))
    me = p.seconds_per_token(dec.structure) if dec.structure is not None else None
    cycles.append((dec.structure.label, ms, len(out), ar and ar * 1000, me and me * 1000, drafted() - before + 1))
    return out


dec.step = step
runs = collections.defaultdict(list)
for r in range(reps):
    for m in ["auto"] + others:
        mode, _, gamma = m.partition(":")
        settings = base.replace(mode=mode, gamma1=int(gamma)) if gamma else base.replace(mode=mode)
        cycles.clear()
        before = read_cpu_times()
        got, ms, acc, metrics = _run_ours(session, prompt, settings)
        steal = steal_percent(before, read_cpu_times())
        runs[m].append(ms)
        print(f"rep {r} {m:14s} {ms:5.1f} ms/token, {len(cycles)} cycles, host steal "
              f"{'?' if steal is None else f'{steal:.1f} %'}")
        if m == "auto":
            by = collections.defaultdict(lambda: [0, 0.0, 0])
            for label, cms, n, par, pme, _ in cycles:
                by[label][0] += 1; by[label][1] += cms; by[label][2] += n
            for label, (k, tot, n) in by.items():
                print(f"    {label:28s} {k:3d} cycles {tot:7.1f} ms {n:3d} tokens  {tot / max(n, 1):5.1f} ms/token")
            print("    quiet costs (ms):", {lv: {k: round(v * 1000, 1) for k, v in sorted(row.items())}
                                               for lv, row in dec.policy.costs.table.items() if row})
            print("    sequence:", " ".join(f"{c[0].split(' ')[0][:5]}{c[0][-1] if c[0] != 'ar' else ''}:{c[1]:.0f}/{c[2]}"
                                         f"(ar~{c[3]:.0f},me~{c[4]:.0f})" if c[3] and c[4] else f"{c[0]}:{c[1]:.0f}/{c[2]}"
                                         for c in cycles))
            print("    weighed:", " | ".join(f"{c.structure} {c.ms_per_token:.1f}{'' if c.measured else '?'}" for c in dec.policy.candidates))
            p = dec.policy
            print("    acc:", {b: round(a.rate, 3) for b, a in p.acceptance.items()}, "tried", {m.value: n for m, n in p.tried.items()}, "budget", dec.budget(), "ar_ratio", p._ar_ratio and round(p._ar_ratio, 2), "time", {m.value: round(c.time, 2) for m, c in p.ratios.modes.items()}, "yield", {b: round(c.expected / max(c.tokens, 1e-9), 2) for b, c in p.ratios.boundaries.items()})
            print("    checked per cycle:", " ".join(str(c[5]) for c in cycles))
        elif cycles:
            print("    sequence:", " ".join(f"{c[1]:.0f}/{c[2]}" for c in cycles))
        sys.stdout.flush()
for m in runs:
    print(m, round(statistics.median(runs[m]), 1), [round(x, 1) for x in runs[m]])
