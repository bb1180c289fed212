"""Where a decoding cycle's time goes outside the target's forward, per method, at one bench cell:
the decoder's and the policy's methods wrapped with a perf_counter accumulator (lighter than
cProfile), methods interleaved answer by answer, ms per cycle printed per piece (medians over the
answers after a first unmeasured one of each method). auto's cycles are listed with what made each
choice: !x an exploration, !f a refresh of the runner-up, !s a re-time of another draft length, !a ar re-timed.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=. .venv/bin/python \
    docs/notes/overhead_split.py CONTEXT WORKLOAD REPEATS METHOD[,METHOD...]
e.g. docs/notes/overhead_split.py 1024 continue 6 auto,draft-only (draft-only:6: at gamma1 = 6)
PROFILE_POLICY=1: also cProfile the policy's choose, realized and the lookups' logging (times then inflate)."""
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections import defaultdict

import torch

from engine.cli.chat_cmd import default_budget
from engine.decoding import speculative
from engine.decoding.lookup_replay import LookupLog
from engine.decoding.policy import Policy
from engine.decoding.session import ChatSession
from engine.model import draft_vocab
from engine.model.loading import load_folder
from engine.settings import DecodeSettings
from engine.store.models import resolve_model
from engine.tools.bench import _run_ours, build_prompt
from engine.tools.sample_text import sample_text

torch.set_num_threads(2)
ctx, workload, reps, methods = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
spent: dict[str, float] = defaultdict(float)
calls: dict[str, int] = defaultdict(int)
depth = [0]
PROFILED = cProfile.Profile() if os.environ.get("PROFILE_POLICY") else None  # set: cProfile the policy's calls
ran: list[str] = []  # the structures of this answer's cycles
why = [""]  # what made the policy's last choice: x explore, f refresh, s size re-time, a ar re-time


def wrap(owner, name: str, label: str) -> None:
    inner = getattr(owner, name)

    def timed(*args, **kwargs):
        depth[0] += 1
        if PROFILED is not None and label in ("choose", "realized", "_log_lookups"):
            PROFILED.enable()
        t = time.perf_counter()
        try:
            got = inner(*args, **kwargs)
            if label == "_choose":
                ran.append(got.label.replace("draft-only ", "d").replace("retrieval-only", "r").replace("triforce", "t")
                           .replace(" ", "") + (f"!{why[0]}" if why[0] else ""))
                why[0] = ""
            return got
        finally:
            took = time.perf_counter() - t
            spent[label] += took
            if PROFILED is not None and label in ("choose", "realized", "_log_lookups"):
                PROFILED.disable()
            if label == "runner.forward" and depth[0] > 1:  # called inside a decoding cycle
                spent["forward in step"] += took
            calls[label] += 1
            depth[0] -= 1
    setattr(owner, name, timed)


def tag(name: str, reason) -> None:
    """Policy.`name` marks the choice it belongs to with `reason` (a function of its arguments)."""
    inner = getattr(Policy, name)

    def tagged(self, *args, **kwargs):
        mark = reason(*args, **kwargs)
        if mark and (not why[0] or mark != "a"):  # (a probe after a refresh or size re-time is theirs)
            why[0] = mark
        return inner(self, *args, **kwargs)
    setattr(Policy, name, tagged)


tag("_close_explorations", lambda but=None: "x" if but is not None else "")
tag("refreshed", lambda mode: "f")
tag("_retime", lambda s: "s")
tag("_probe", lambda s: "a")
D = speculative.HierarchicalDecoder
for owner, name in ((D, "step"), (D, "_choose"), (D, "_verify_l2"), (D, "_log_lookups"), (D, "_settle_shadows"),
                    (D, "_shadow_l0"), (D, "checked"), (D, "timed"), (Policy, "realized"), (Policy, "choose"),
                    (LookupLog, "replay"), (D, "_learn_lookups"), (draft_vocab.DraftVocabulary, "note")):
    wrap(owner, name, name)
wrap(speculative.NgramDrafter, "propose", "ngram.propose")
wrap(speculative.LlamaRunner, "forward", "runner.forward")

model = load_folder(resolve_model("bundled"))
base = DecodeSettings(budget=default_budget(ctx, DecodeSettings().chunk)).replace(max_new_tokens=64, stop=(), ignore_eos=True)
prompt = build_prompt(model, sample_text(), ctx, workload)
session = ChatSession(model, base.replace(mode="ar"), draft="ngram", capacity=len(prompt) + 128)
rows: dict[str, list[dict[str, float]]] = defaultdict(list)
for r in range(reps + 1):
    for method in methods:
        spent.clear(), calls.clear(), ran.clear()
        mode, _, g1 = method.partition(":")  # "draft-only:6": that mode at gamma1 = 6
        run = base.replace(mode=mode, gamma1=int(g1)) if g1 else base.replace(mode=mode)
        _, ms, _, metrics = _run_ours(session, prompt, run)
        cycles = calls["step"]
        row = {k: v / cycles * 1000 for k, v in spent.items()}
        row["cycles"], row["ms/token"] = cycles, ms
        row["outside forwards"] = (spent["step"] - spent["forward in step"]) / cycles * 1000
        row["steps ms/token"] = spent["step"] / 63 * 1000
        if r:
            rows[method].append(row)
        print(method, r, f"{ms:.2f} ms/token", cycles, "cycles", f"{row['steps ms/token']:.2f} in steps",
              f"{row['outside forwards']:.3f} ms/cycle outside forwards", f"{row.get('forward in step', 0):.2f} in forwards", metrics.structure, flush=True)
        if method == "auto":
            print("   ", " ".join(ran))
keys = ["ms/token", "steps ms/token", "cycles", "step", "forward in step", "outside forwards", "_choose", "choose", "replay",
        "_verify_l2", "realized", "_learn_lookups", "note", "_log_lookups", "_settle_shadows", "_shadow_l0", "checked", "timed", "ngram.propose"]
print("ms per cycle, medians over", reps, "answers")
print(f"{'':18}" + "".join(f"{m:>14}" for m in methods))
for k in keys:
    print(f"{k:18}" + "".join(f"{statistics.median(row.get(k, 0.0) for row in rows[m]):14.3f}" for m in methods))
if PROFILED is not None:
    pstats.Stats(PROFILED).sort_stats(os.environ.get("PROFILE_SORT", "tottime")).print_stats(30)
