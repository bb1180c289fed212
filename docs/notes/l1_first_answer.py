"""Why L1 drafts worse in a session's first answer: the same question answered with fixed
retrieval-only in a fresh session, then again, then under auto forced onto retrieval-only from its
first cycle and after four ar cycles; per cycle, the tokens each yielded. Then the answer's tokens
that were outside L1's vocabulary subset (engine/model/draft_vocab.py: the first 8,192 ids and the
prompt's) when they came: each is a rejection in the first answer and none after, as the subset
keeps every token it has seen.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=. .venv/bin/python docs/notes/l1_first_answer.py CONTEXT WORKLOAD"""
import sys

import torch
from engine.cli.chat_cmd import default_budget
from engine.decoding.session import ChatSession
from engine.decoding.structure import Structure
from engine.model.draft_vocab import COMMON_TOKENS
from engine.model.loading import load_folder
from engine.settings import DecodeSettings, Mode
from engine.store.models import resolve_model
from engine.tools.bench import _run_ours, build_prompt
from engine.tools.sample_text import sample_text

torch.set_num_threads(2)
ctx, workload = int(sys.argv[1]), sys.argv[2]
model = load_folder(resolve_model("bundled"))
base = DecodeSettings(budget=default_budget(ctx, DecodeSettings().chunk)).replace(  # the bench's budget
    max_new_tokens=64, stop=(), ignore_eos=True)
prompt = build_prompt(model, sample_text(), ctx, workload)
session = ChatSession(model, base.replace(mode="ar"), draft="ngram", capacity=len(prompt) + 128)
dec = session.decoder
orig = dec.step
cycles = []


def step(seq):
    out = orig(seq)
    cycles.append(f"{dec.structure.label}/{len(out)}")
    return out


dec.step = step
ro = Structure(Mode.RETRIEVAL_ONLY, base.gamma1, base.gamma2)
answer = None
for name, script in [("fixed retrieval-only, first answer", None), ("fixed retrieval-only, again", None),
                     ("auto forced to retrieval-only", [ro] * 200),
                     ("auto forced to ar x4, then retrieval-only", [Structure(Mode.AR)] * 4 + [ro] * 200)]:
    cycles.clear()
    dec.policy.forced = list(script) if script else None
    got, ms, _, _ = _run_ours(session, prompt, base.replace(mode="auto" if script else "retrieval-only"))
    dec.policy.forced = None
    answer = answer or got
    yields = [c.rsplit("/", 1)[1] for c in cycles]
    print(f"{name}: {ms:.1f} ms/token, {len(cycles)} cycles, tokens per cycle {' '.join(yields)}")
member, new = set(range(COMMON_TOKENS)) | set(prompt), []
for t in answer:
    if t not in member:
        new.append(model.tokenizer.decode([t]))
        member.add(t)
print(f"budget {base.budget}; of the answer's {len(answer)} tokens, {len(new)} were new to L1's vocabulary "
      f"when they came: {new}")
