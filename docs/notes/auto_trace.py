"""Per-cycle trace of auto beside ar and fixed draft-only at one bench cell (the bench's settings).

Usage (from the repo root):
    OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. .venv/bin/python docs/notes/auto_trace.py WORKLOAD CONTEXT ANSWERS [METHODS]
e.g. docs/notes/auto_trace.py continue 1024 6 draft-only:4,draft-only:8
Per auto answer: each cycle's structure, wall time, tokens, tokens checked and the policy's
predicted ms/token; after each round, every method's ms/token and the host steal during its run.
"""
import argparse
import statistics
import sys
from engine.api import Engine
from engine.cli.chat_cmd import add_decode_arguments, build_settings
from engine.tools.bench import build_prompt, _run_ours
from engine.tools.sample_text import sample_text
from engine.decoding.session import ChatSession
from engine.decoding.policy import Policy
from engine.tools.host_load import read_cpu_times, steal_percent

workload, ctx, answers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fixed = sys.argv[4].split(",") if len(sys.argv) > 4 else ["draft-only:4", "draft-only:8"]
p = argparse.ArgumentParser(); add_decode_arguments(p)
args = p.parse_args([])
engine = Engine(devices="cpu", snapshots=False, file_blocks=None)
model = engine.load_weights(engine.resolve("bundled"))
prompt = build_prompt(model, sample_text("hamlet"), ctx, workload)
s = build_settings(argparse.Namespace(**{**vars(args), "max_new_tokens": 64}), ctx)
s = s.replace(max_new_tokens=64, stop=(), ignore_eos=True)
sess = ChatSession(model, s.replace(mode="ar"), draft="ngram", capacity=min(model.max_context, len(prompt) + 128))
log = []
orig = Policy.realized
def realized(self, st, seconds, tokens, checked=0):
    log.append((st.label, seconds * 1000, tokens, checked, (self.seconds_per_token(st) or 0) * 1000))
    return orig(self, st, seconds, tokens, checked)
Policy.realized = realized
res = {}
for a in range(answers):
    for m in ["ar", "auto"] + fixed:
        mode, _, g = m.partition(":")
        st = s.replace(mode=mode, gamma1=int(g) if g else s.gamma1)
        log.clear(); c0 = read_cpu_times()
        toks, ms, _, met = _run_ours(sess, prompt, st)
        res.setdefault(m, []).append(ms); res.setdefault(m + ' steal', []).append(steal_percent(c0, read_cpu_times()))
        if m == "auto":
            print(f"answer {a}: auto {ms:.1f} ms/token, {len(log)} cycles")
            for row in log:
                print("   %-22s %6.1f ms %d tok chk %d  predicted %.1f ms/tok -> real %.1f" % (row[0], row[1], row[2], row[3], row[4], row[1] / row[2]))
    print("   ", {k: round(v[-1], 1) for k, v in res.items()}, flush=True)
print({k: round(statistics.median(v), 1) for k, v in res.items()})
