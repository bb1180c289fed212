"""The issue's targets, read from one or more bench JSON files (`main.py bench --json`): auto against
ar and against the fastest fixed mode, by medians and paired per repeat, in every cell; auto
against the peers at 8K; token identity. Prints the lines the closing notes quote, then each cell's
paired ratios with their sign-test intervals (engine/tools/bench.py `median_interval`, computed from
the repeats' times, so older JSONs get them too): a miss whose interval reaches the bar is one the
repeats cannot place below it.

    python3 docs/notes/grid_verdict.py docs/bench/bench-cpu-s35-zen1-64.json [...]
"""
from __future__ import annotations

import json
import sys

from engine.tools.bench import paired_interval

FIXED = ("ar", "draft-only", "retrieval-only", "triforce")


def shown(ratio: float, bar: float) -> float:
    """`ratio` rounded to 3 places, or to 4 where 3 would round a miss up to its bar (0.94991 -> 0.9499)."""
    return round(ratio, 3) if ratio >= bar or round(ratio, 3) < bar else round(ratio, 4)


def cell_name(cell: dict) -> str:
    return f"{cell['workload']} {round(int(cell['context_tokens']) / 1000)}K"


def verdict(path: str) -> None:
    cells = json.load(open(path))
    vs_ar, vs_ar_paired, vs_best, vs_best_paired, peers, different = [], [], [], [], [], []
    spans = {"ar": [], "best": []}  # per cell: (name, paired ratio, interval)
    for cell in cells:
        name = cell_name(cell)
        rows = {r["method"]: r for r in cell["results"]}
        auto = rows["auto"]
        ratio_ar = rows["ar"]["median_ms_per_token"] / auto["median_ms_per_token"]
        vs_ar.append((name, ratio_ar))
        vs_ar_paired.append((name, auto["paired_speedup_vs_ar"]))
        best = min((m for m in FIXED if m in rows), key=lambda m: rows[m]["median_ms_per_token"])
        vs_best.append((name, rows[best]["median_ms_per_token"] / auto["median_ms_per_token"], best))
        vs_best_paired.append((name, auto["paired_vs_best_fixed"], auto["best_fixed"]))
        runs = {m: r["runs_ms_per_token"] for m, r in rows.items()}
        spans["ar"].append((name, auto["paired_speedup_vs_ar"], paired_interval(runs["ar"], runs["auto"])))
        spans["best"].append((name, auto["paired_vs_best_fixed"], paired_interval(runs[auto["best_fixed"]], runs["auto"])))
        different += [(name, m) for m, r in rows.items() if m in FIXED + ("auto",) and not r["identical_to_ar"]]
        if int(cell["context_tokens"]) >= 8000:
            for peer in ("llama.cpp", "hf"):
                if peer in rows:
                    a, p = auto["median_ms_per_token"], rows[peer]["median_ms_per_token"]
                    peers.append(f"8K {cell['workload']}: auto {a:.1f}  {peer} {p:.1f} -> {p / a:.2f}x")
    # a miss compares the unrounded ratio (0.94991 is a miss)
    miss = lambda rows, bar: [(r[0], shown(r[1], bar)) + tuple(r[2:]) for r in rows if r[1] < bar]  # noqa: E731
    n = len(cells)
    print(path)
    print(f"auto>=ar medians {n - len(miss(vs_ar, 1.0))} of {n} {miss(vs_ar, 1.0)} "
          f"paired {n - len(miss(vs_ar_paired, 1.0))} {miss(vs_ar_paired, 1.0)}")
    print(f"auto>=0.95 best medians {n - len(miss(vs_best, 0.95))} of {n} {miss(vs_best, 0.95)} "
          f"paired {n - len(miss(vs_best_paired, 0.95))} {miss(vs_best_paired, 0.95)}")
    for line in peers:
        print(line)
    print("not identical to ar:", different or "none")
    for key, bar in (("ar", 1.0), ("best", 0.95)):
        cells_text = [f"{name} {ratio:.3f}" + (f" [{span[0]:.3f}-{span[1]:.3f}]" if span else "")
                      for name, ratio, span in spans[key]]
        coverage = next((span[2] for _, _, span in spans[key] if span), None)
        below = [name for name, _, span in spans[key] if span and span[1] < bar]
        print(f"paired vs {key} with {'-' if coverage is None else f'{100 * coverage:.1f} %'} intervals: "
              + ", ".join(cells_text) + f"; interval wholly below {bar}: {below or 'none'}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        verdict(p)
