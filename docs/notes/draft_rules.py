"""draft-only's single lengths against rules that draft longer right after a draft kept whole, as
auto's replay prices them (engine/decoding/lookup_replay.py) at one bench cell: after each answer,
over auto's window of logged lookups and its step-cost table, the replayed ms/token of each single
length γ1 = 1-8 and of the best pairs (γ1 then b after a whole draft, any a, b in 1-8), with the
structure auto last ran. Forwards only (no Python, no drafting): what the rule saves in L2 checks.
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=. .venv/bin/python \
    docs/notes/draft_rules.py CONTEXT WORKLOAD REPEATS OTHERS   (e.g. 8000 continue 4 draft-only)"""
import sys

from side_cell import run_reps, side_cell

reps, methods, prompt, sessions = side_cell(sys.argv)
decoder = sessions["auto"].decoder
policy = decoder.policy


def priced() -> None:
    cost = lambda n: policy.costs.estimate("l2", n)  # noqa: E731

    def ms(a: int, b: int = 0) -> float:
        seconds, tokens, _ = policy.lookups.replay(a, cost, b)
        return 1000.0 * seconds / tokens

    singles = {a: ms(a) for a in range(1, 9)}
    pairs = sorted(((ms(a, b), f"{a}/{b}") for a in range(1, 9) for b in range(1, 9) if a != b))
    best = min(singles.values())
    print("    singles", {a: round(v, 2) for a, v in singles.items()})
    print("    best pairs", [(name, round(v, 2), f"{v / best:.3f}x") for v, name in pairs[:4]],
          "| auto ran", decoder.structure.label)


run_reps(reps, methods, prompt, sessions, priced)
