"""The set-up the side-by-side notes scripts share: from `CONTEXT WORKLOAD REPEATS OTHERS` on the
command line, the bundled model, the bench's prompt and settings for that cell, and one session per
method ("auto" first, then OTHERS) on one prefill, as `bench` builds them (engine/tools/bench_steps.py)."""
import sys

import torch
from engine.cli.chat_cmd import default_budget
from engine.model.loading import load_folder
from engine.settings import DecodeSettings
from engine.store.models import resolve_model
from engine.tools.bench import build_prompt
from engine.tools.bench_steps import sessions_on_one_prefill
from engine.tools.sample_text import sample_text


def side_cell(argv: list[str]):
    """-> (repeats, methods, prompt, sessions) for the cell argv names."""
    torch.set_num_threads(2)
    ctx, workload, reps = int(argv[1]), argv[2], int(argv[3])
    methods = ["auto"] + argv[4].split(",")
    model = load_folder(resolve_model("bundled"))
    base = DecodeSettings(budget=default_budget(ctx, DecodeSettings().chunk)).replace(
        max_new_tokens=64, stop=(), ignore_eos=True)
    prompt = build_prompt(model, sample_text(), ctx, workload)
    return reps, methods, prompt, sessions_on_one_prefill(model, methods, prompt, base, "ngram", len(prompt) + 128)


if __name__ == "__main__":
    print(side_cell(sys.argv)[:2])
