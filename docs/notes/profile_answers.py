"""cProfile of REPEATS answers of one method at one bench cell (after one answer not profiled), the bench's
prompt and settings: where an answer's time goes, by function, cumulative.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=. .venv/bin/python docs/notes/profile_answers.py CONTEXT WORKLOAD REPEATS METHOD
e.g. docs/notes/profile_answers.py 1024 continue 6 auto. Each answer re-prefills its prompt, so the
runner's forward totals include prefill; compare `speculative.py (step)` between methods."""
import cProfile, pstats, sys, torch, io
from engine.cli.chat_cmd import default_budget
from engine.decoding.session import ChatSession
from engine.model.loading import load_folder
from engine.settings import DecodeSettings
from engine.store.models import resolve_model
from engine.tools.bench import _run_ours, build_prompt
from engine.tools.sample_text import sample_text
torch.set_num_threads(2)
ctx, workload, reps, mode = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
model = load_folder(resolve_model("bundled"))
base = DecodeSettings(budget=default_budget(ctx, DecodeSettings().chunk)).replace(max_new_tokens=64, stop=(), ignore_eos=True)
prompt = build_prompt(model, sample_text(), ctx, workload)
session = ChatSession(model, base.replace(mode="ar"), draft="ngram", capacity=len(prompt) + 128)
_run_ours(session, prompt, base.replace(mode=mode))
pr = cProfile.Profile(); pr.enable()
for r in range(reps):
    got, ms, acc, metrics = _run_ours(session, prompt, base.replace(mode=mode)); print(mode, round(ms,1))
pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats(__import__("os").environ.get("PROFILE_SORT", "cumulative")).print_stats(int(__import__("os").environ.get("PROFILE_LINES", "45"))); print(s.getvalue())
