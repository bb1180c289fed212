"""The issue's per-cell targets over several bench JSON files of one code (`main.py bench --json`): per
cell, how many grids met each bar by medians and paired, the lowest paired ratio of any grid, and
every repeat of every grid pooled: the median of the per-repeat ratios with its sign-test interval
(engine/tools/bench.py `median_interval`) and the share of repeats at or over the bar. "Best" is, per
grid, the fixed mode with the lowest median there, as `bench` recorded it (auto's `best_fixed`).

    python3 docs/notes/grids_pooled.py docs/bench/bench-cpu-s51-zen3-64.json [...]
"""
from __future__ import annotations

import collections
import json
import statistics
import sys

from engine.tools.bench import median_interval
from grid_verdict import cell_name, shown

BARS = {"ar": 1.0, "best": 0.95}


def pooled(paths: list[str]) -> None:
    got = collections.defaultdict(lambda: {k: {"medians": [], "paired": [], "runs": []} for k in BARS})
    for path in paths:
        for cell in json.load(open(path)):
            rows = {r["method"]: r for r in cell["results"]}
            auto = rows["auto"]
            for key, other, paired in (("ar", "ar", auto["paired_speedup_vs_ar"]),
                                       ("best", auto["best_fixed"], auto["paired_vs_best_fixed"])):
                g = got[cell_name(cell)][key]
                g["medians"].append(rows[other]["median_ms_per_token"] / auto["median_ms_per_token"])
                g["paired"].append(paired)
                g["runs"] += [o / a for o, a in zip(rows[other]["runs_ms_per_token"], auto["runs_ms_per_token"])]
    print(f"{len(paths)} grids: " + ", ".join(paths))
    print("| cell | vs | bar | grids met, medians | grids met, paired | lowest paired | pooled repeats: median [interval] | repeats at or over the bar |")
    print("|---|---|---|---|---|---|---|---|")
    for name, by in got.items():
        for key, bar in BARS.items():
            g = by[key]
            span = median_interval(g["runs"])
            interval = f" [{span[0]:.3f}-{span[1]:.3f}, {100 * span[2]:.1f} %]" if span else ""
            over = sum(r >= bar for r in g["runs"])
            low = min(g["paired"])
            low_text = f"{low:.3f}" if shown(low, bar) == round(low, 3) else f"{low:.4f}"  # 0.94991: 0.9499
            print(f"| {name} | {key} | {bar} | {sum(r >= bar for r in g['medians'])} of {len(g['medians'])} "
                  f"| {sum(r >= bar for r in g['paired'])} of {len(g['paired'])} | {low_text} "
                  f"| {statistics.median(g['runs']):.3f}{interval} | {over} of {len(g['runs'])} |")


if __name__ == "__main__":
    pooled(sys.argv[1:])
