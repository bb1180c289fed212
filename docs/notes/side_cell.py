"""The set-up the side-by-side notes scripts share: from `CONTEXT WORKLOAD REPEATS OTHERS` on the
command line, the bundled model, the bench's prompt and settings for that cell, and one session per
method ("auto" first, then OTHERS) on one prefill, as `bench` builds them (engine/tools/bench_steps.py)."""
import statistics
import sys
import time

import torch
from engine.cli.chat_cmd import default_budget
from engine.model.loading import load_folder
from engine.settings import DecodeSettings, Mode
from engine.store.models import resolve_model
from engine.tools.bench import build_prompt
from engine.tools.bench_steps import run_side_by_side, sessions_on_one_prefill
from engine.tools.sample_text import sample_text


def cell(ctx: int, workload: str):
    """-> (model, settings, prompt): the bundled model, the bench's settings and prompt for the cell."""
    torch.set_num_threads(2)
    model = load_folder(resolve_model("bundled"))
    base = DecodeSettings(budget=default_budget(ctx, DecodeSettings().chunk)).replace(
        max_new_tokens=64, stop=(), ignore_eos=True)
    return model, base, build_prompt(model, sample_text(), ctx, workload)


def side_cell(argv: list[str]):
    """-> (repeats, methods, prompt, sessions) for the cell argv names."""
    reps, methods = int(argv[3]), ["auto"] + argv[4].split(",")
    model, base, prompt = cell(int(argv[1]), argv[2])
    return reps, methods, prompt, sessions_on_one_prefill(model, methods, prompt, base, "ngram", len(prompt) + 128)


def short_label(label: str) -> str:
    """A structure's label as the cycle traces print it: d = draft-only γ1, t = triforce γ1 γ2, r =
    retrieval-only γ2 (`draft-only g1=4` -> `dg1=4`)."""
    return label.replace("draft-only ", "d").replace("triforce ", "t").replace("retrieval-only ", "r")


def cycle_forwards(decoder, on_forward=None) -> list:
    """A list that holds, during each of `decoder`'s cycles, the forwards it ran so far as (level,
    tokens, seconds); emptied as each cycle starts. `on_forward(level, tokens, seconds)`, if given,
    sees each forward before the decoder records it."""
    held = []
    timed, step = decoder.timed, decoder.step

    def timed_and_held(level, tokens, seconds):
        if on_forward is not None:
            on_forward(level, tokens, seconds)
        held.append((level, tokens, seconds))
        return timed(level, tokens, seconds)

    def step_afresh(seq):
        held.clear()
        return step(seq)

    decoder.timed, decoder.step = timed_and_held, step_afresh
    return held


def timer(obj, name: str, key: str, spent: dict) -> None:
    """Wrap obj.`name` (an instance's method, or a class's) so that each call's wall time adds to spent[key]."""
    plain = getattr(obj, name)

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return plain(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - t
    setattr(obj, name, timed)


def watch_choices(policy, name: str, scorings: dict, ran: dict, spent: dict | None = None) -> None:
    """Wrap `policy`'s choose so that each choice counts in ran[name][its short label], each scoring
    in scorings[name] (counted as its pricing of ar inside choose, once a scoring; the code before
    engine/decoding/rescore.py too), and choose's seconds add to spent[name] if given."""
    choose, best_of = policy.choose, policy._best_of
    inside = [False]

    def counted_best_of(mode, settings):
        if inside[0] and mode is Mode.AR:
            scorings[name] += 1
        return best_of(mode, settings)

    def counted_choose(*args, **kwargs):
        inside[0] = True
        t = time.perf_counter()
        try:
            chosen = choose(*args, **kwargs)
        finally:
            inside[0] = False
            if spent is not None:
                spent[name] += time.perf_counter() - t
        ran[name][short_label(chosen.label)] += 1
        return chosen
    policy.choose, policy._best_of = counted_choose, counted_best_of


def run_reps(reps: int, methods: list[str], prompt, sessions, after=None) -> None:
    """Answer `reps` times side by side, the order rotated by one each repeat; print each repeat's
    ms/token per method, then call `after()` if given."""
    for r in range(reps):
        turn = r % len(methods)
        got = run_side_by_side(sessions, methods[turn:] + methods[:turn], prompt)
        print(f"rep {r}: " + ", ".join(f"{m} {got[m].ms_per_token:.1f}" for m in methods), flush=True)
        if after is not None:
            after()


def timed_reps(sessions, names: list[str], prompt, reps: int, after=None) -> dict[str, list[float]]:
    """Answer `reps` times side by side, the order rotated by one each repeat; print each repeat's
    ms/token per name, then call `after()` if given. -> name -> its ms/token per repeat."""
    times = {n: [] for n in names}
    for r in range(reps):
        turn = r % len(names)
        got = run_side_by_side(sessions, names[turn:] + names[:turn], prompt)
        for n in names:
            times[n].append(got[n].ms_per_token)
        print(f"rep {r}:", {n: round(got[n].ms_per_token, 2) for n in names}, flush=True)
        if after is not None:
            after()
    return times


def print_later_medians(times: dict[str, list[float]]) -> None:
    """Each name's median over the answers after the first, and its paired median ratio to ar's."""
    print("median (later answers)", {n: round(statistics.median(v[1:]), 2) for n, v in times.items()})
    print("ratio to ar (paired median, later answers)",
          {n: round(statistics.median([a / b for a, b in zip(times["ar"][1:], v[1:])]), 3) for n, v in times.items()})


if __name__ == "__main__":
    print(side_cell(sys.argv)[:2])
