"""How fast can n-gram speculation be, at best, in each bench cell? A bound for issue 11's per-cell
targets: with the n-gram drafter, no schedule of draft lengths (no policy, online or not) beats the
one found here by dynamic programming over ar's own greedy answer.

Per cell (the bench's prompt, `bench --workload both`): ar's greedy answer of N tokens; this
machine's forward time at that context for checks of 1..MAX_CHECK tokens (interleaved, medians);
then, position by position, which draft length to propose so that the answer costs the fewest
forward-seconds. A greedy check accepts a deterministic draft's tokens while they equal ar's, so
the answer fixes every draft's fate: the minimum is exact for forward costs (it leaves out
drafting, sampling and Python, which only add). Printed: ar's step, the best fixed draft length,
and that bound, in ms per token and as speed over ar.

Usage: OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. .venv/bin/python docs/notes/ngram_bound.py CONTEXTS WORKLOADS NEW_TOKENS REPEATS
e.g.   docs/notes/ngram_bound.py 1024,2048,4096,8000 continue,qa 32,64 9
"""
import statistics
import sys
import time

import torch

from engine.decoding.drafters import NgramDrafter, common_prefix
from engine.decoding.session import ChatSession
from engine.model.loading import load_folder
from engine.settings import DecodeSettings
from engine.store.models import resolve_model
from engine.tools.bench import _run_ours, build_prompt
from engine.tools.sample_text import sample_text

MAX_CHECK = 9  # tokens one verification forward checks at most here (drafts of up to 8)


def step_costs(session: ChatSession, prompt: list[int], repeats: int) -> dict[int, float]:
    """Seconds of one target forward checking T tokens after the prompt, T = 1..MAX_CHECK (medians,
    the sizes interleaved within each repeat; the first repeat warms up)."""
    runner, full = session.target.runner, session.full
    held = full.length
    times: dict[int, list[float]] = {t: [] for t in range(1, MAX_CHECK + 1)}
    for rep in range(repeats + 1):
        for t in times:
            ids, pos = torch.tensor(prompt[-t:]), torch.arange(held, held + t)
            started = time.perf_counter()
            runner.forward(ids, pos, full)
            elapsed = time.perf_counter() - started
            full.rollback(held)
            if rep:
                times[t].append(elapsed)
    return {t: statistics.median(v) for t, v in times.items()}


def drafts_along(prompt: list[int], answer: list[int]) -> list[list[int]]:
    """The n-gram drafter's longest draft (MAX_CHECK - 1 tokens) at every position of the answer."""
    drafter = NgramDrafter()
    return [drafter.propose(prompt + answer[:i], MAX_CHECK - 1, None, None).tokens for i in range(len(answer))]


def bound(drafts: list[list[int]], answer: list[int], cost: dict[int, float]) -> tuple[float, dict[int, float]]:
    """(fewest forward-seconds for the whole answer over every draft-length schedule, seconds of each
    fixed draft length g = 0..MAX_CHECK-1), both per token. drafts: drafts_along(prompt, answer)."""
    n = len(answer)

    def advance(i: int, g: int) -> tuple[float, int]:
        draft = drafts[i][:g]
        return cost[len(draft) + 1], min(n, i + common_prefix(draft, answer[i:i + len(draft)]) + 1)

    best = [0.0] * (n + 1)  # best[i]: fewest seconds from position i to the end
    for i in range(n - 1, -1, -1):
        best[i] = min(c + best[j] for c, j in (advance(i, g) for g in range(MAX_CHECK)))
    fixed = {}
    for g in range(MAX_CHECK):
        i, total = 0, 0.0
        while i < n:
            c, i = advance(i, g)
            total += c
        fixed[g] = total / n
    return best[0] / n, fixed


def main() -> None:
    contexts = [int(x) for x in sys.argv[1].split(",")]
    workloads = sys.argv[2].split(",")
    lengths = [int(x) for x in sys.argv[3].split(",")]
    repeats = int(sys.argv[4])
    torch.set_num_threads(2)
    model = load_folder(resolve_model("bundled"))
    for workload in workloads:
        for context in contexts:
            prompt = build_prompt(model, sample_text(), context, workload)
            settings = DecodeSettings().replace(mode="ar", max_new_tokens=max(lengths), stop=(), ignore_eos=True)
            session = ChatSession(model, settings, draft="ngram", capacity=len(prompt) + max(lengths) + 64)
            answer, _, _, _ = _run_ours(session, prompt, settings)
            session.full.rollback(len(prompt) - 1)  # the prompt held as when its answer began
            cost = step_costs(session, prompt[:-1], repeats)
            drafts = drafts_along(prompt, answer)
            steps = " ".join(f"{t}:{cost[t] * 1e3:.1f}" for t in cost)
            print(f"== {workload} {context}: forward ms by tokens checked {steps}")
            for n in lengths:
                best, fixed = bound(drafts[:n], answer[:n], cost)
                g = min(range(1, MAX_CHECK), key=lambda k: fixed[k])
                ar = cost[1]
                print(f"  {n} tokens: ar {ar * 1e3:.1f} ms/token; best fixed draft length {g}: {fixed[g] * 1e3:.1f}"
                      f" ({ar / fixed[g]:.2f}x ar); best schedule: {best * 1e3:.1f} ({ar / best:.2f}x ar)")


if __name__ == "__main__":
    main()
