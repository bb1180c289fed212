"""Check that a change meant only to be faster leaves auto's prices bit-identical, on states taken
from the bench's own cells (docs/notes/policy_cycle_cost.py checks the choices on a simulation).

  record DIR CONTEXT WORKLOAD [REPEATS]: answer REPEATS times side by side with fixed draft-only
      (as `bench` does) and pickle auto's policy and settings to DIR/policy_WORKLOAD_CONTEXT.pkl
  digest DIR: load every pickle in DIR and print one hash over each mode's best structure, the
      corrected and model prices of ~200 structures, every boundary's expected tokens and six
      choices in a row (from a copy), then the number of lines hashed

Record with the old code, then digest with the old and the new: the hashes must match. (A field a
change adds to a pickled class is missing from old pickles: `digest` gives `Realized` an empty
cache where it lacks one.)
Usage (repo root): OMP_WAIT_POLICY=ACTIVE GOMP_SPINCOUNT=200000 PYTHONPATH=docs/notes:. \
    .venv/bin/python docs/notes/price_digest.py record /tmp/states 1024 qa 3"""
import copy
import copyreg
import glob
import hashlib
import os
import pickle
import sys

from engine.decoding.lookup_replay import Window
from engine.decoding.size_retime import draft_rules
from engine.decoding.structure import Structure
from engine.settings import Mode


def _window(items, tags, total) -> Window:
    w = Window()
    for item, tag in zip(items, tags):
        w.append(item, tag)
    w.total = total
    return w


copyreg.pickle(Window, lambda w: (_window, (list(w), list(w.tags), w.total)))  # (a deque subclass)


def record(folder: str, context: str, workload: str, repeats: str = "3") -> None:
    from side_cell import run_reps, side_cell
    reps, methods, prompt, sessions = side_cell(["", context, workload, repeats, "draft-only"])
    run_reps(reps, methods, prompt, sessions)
    decoder = sessions["auto"].decoder
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"policy_{workload}_{context}.pkl"), "wb") as f:
        pickle.dump((decoder.policy, decoder.settings), f)


def digest(folder: str) -> None:
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "policy_*.pkl"))):
        with open(path, "rb") as f:
            policy, settings = pickle.load(f)
        policy.ratios.__dict__.setdefault("_pooled", {})
        name = os.path.basename(path)
        for mode in (Mode.AR, Mode.DRAFT_ONLY, Mode.RETRIEVAL_ONLY, Mode.TRIFORCE):
            policy.reprice()
            ms, s = policy._best_of(mode, settings)
            out.append(f"{name} best {mode} {ms!r} {s.label}")
        policy.reprice()
        structures = [Structure(Mode.AR)] + [Structure(Mode.DRAFT_ONLY, g, 6) for g in range(1, 17)]
        structures += draft_rules(Structure(Mode.DRAFT_ONLY, 4, 6))
        structures += [Structure(m, g1, g2) for m in (Mode.RETRIEVAL_ONLY, Mode.TRIFORCE)
                       for g1 in range(1, 9) for g2 in range(1, 13)]
        for s in structures:
            out.append(f"{s.label} {policy.seconds_per_token(s)!r} {policy.seconds_per_token(s, corrected=False)!r} "
                       f"{policy.cycle_cost(s)!r}")
        for boundary in ("l0_l1", "l1_l2", "l0_l2"):
            out.append(" ".join(repr(policy._expected(boundary, g)) for g in range(1, 17)))
        out.append(repr([policy._l1_per_token(g) for g in range(1, 9)]))
        chooser = copy.deepcopy(policy)
        for i in range(6):
            s = chooser.choose(settings.replace(mode="auto"), True, 4096, None, 64 - i)
            out.append(f"choose {s.label} {[(c.structure, repr(c.ms_per_token)) for c in chooser.candidates]}")
            chooser.realized(s, 0.02 + 0.003 * i, 1 + i % 3, checked=2, forwards=[("l2", 2)])
    print(hashlib.sha1("\n".join(out).encode()).hexdigest()[:12], len(out))


if __name__ == "__main__":
    {"record": record, "digest": digest}[sys.argv[1]](*sys.argv[2:])
