"""How well n-gram lookups predict the answer, by the length of the match that found them.

For each cell, the greedy ar answer (128 new tokens) is generated once; then at every answer
position the n-gram drafter (max_n 4, min_n 2) is looked up on the tokens before it and its draft
of 4 is compared with what the answer holds there. Prints per match length: (lookups, mean tokens
matched of 4, lookups matched whole), and a trace, one character per position: '.' no draft,
a digit the tokens a 4-gram draft matched (or a 2/3-gram draft's, when > 0), 'a' / 'b' a 2- / 3-gram
draft refuted at its first token.
Usage (repo root): OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. .venv/bin/python docs/notes/ngram_match_stats.py 1024,2048,4096,8000 continue,qa
"""
import collections
import sys

import torch
from engine.decoding.session import ChatSession
from engine.decoding.drafters import NgramDrafter, common_prefix
from engine.model.loading import load_folder
from engine.settings import DecodeSettings
from engine.store.models import resolve_model
from engine.tools.bench import _run_ours, build_prompt
from engine.tools.sample_text import sample_text
torch.set_num_threads(2)
model = load_folder(resolve_model("bundled"))
base = DecodeSettings().replace(max_new_tokens=128, stop=(), ignore_eos=True, mode="ar")
for ctx in [int(c) for c in sys.argv[1].split(",")]:
  for wl in sys.argv[2].split(","):
    prompt = build_prompt(model, sample_text(), ctx, wl)
    session = ChatSession(model, base, draft="ngram", capacity=len(prompt) + 160)
    ans, ms, _, _ = _run_ours(session, prompt, base)
    seq = prompt + ans
    st = collections.defaultdict(lambda: [0, 0, 0])  # n -> [lookups, sum accepted of 4, full 4]
    miss = 0; trace = []
    d = NgramDrafter()  # its index grows with the prefix, as in decoding
    for i in range(len(prompt), len(seq) - 4):
        pre = seq[:i]
        d._sync(pre)
        got = None
        for n in range(4, 1, -1):
            end = d._index.get(tuple(pre[-n:]))
            if end is not None and end < len(pre):
                got = (n, pre[end:end + 4]); break
        if got is None:
            miss += 1; trace.append('.'); continue
        n, dr = got
        acc = common_prefix(dr, seq[i:i + 4])
        st[n][0] += 1; st[n][1] += acc; st[n][2] += acc == 4
        trace.append(str(acc) if n == 4 else 'abc'[n - 2] if acc == 0 else str(acc))
    print(ctx, wl, f"ar {ms:.1f} ms/tok  miss {miss}", {n: (v[0], round(v[1] / v[0], 2), v[2]) for n, v in sorted(st.items())})
    print("  ", "".join(trace))
    sys.stdout.flush()
