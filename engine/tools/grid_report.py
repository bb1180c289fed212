"""The targets read from bench grids (`main.py bench --json` files): per grid, auto against ar and
against the fastest fixed mode, by medians and paired per repeat, auto against the peers at 8K and
token identity; over several grids of one code, each cell's repeats pooled, with the sign test's
interval for the median of the per-repeat ratios. `main.py bench --report GRID.json ...` prints it.
"""
from __future__ import annotations

import collections
import json
import statistics

from engine.errors import InvalidSettingError
from engine.tools.bench import median_interval, paired_interval

FIXED = ("ar", "draft-only", "retrieval-only", "triforce")
BARS = {"ar": 1.0, "best": 0.95}  # auto's targets: at least ar, at least 0.95x the fastest fixed mode


def shown(ratio: float, bar: float) -> str:
    """`ratio` to 3 places, or to 4 where 3 would round a miss up to its bar (0.94991 -> 0.9499)."""
    return f"{ratio:.4f}" if ratio < bar <= round(ratio, 3) else f"{ratio:.3f}"


def cell_name(cell: dict) -> str:
    """`continue 1K` for a cell of 1,024 context tokens."""
    return f"{cell['workload']} {round(int(cell['context_tokens']) / 1000)}K"


def load_grid(path: str) -> list[dict]:
    """The cells of one bench JSON (a single cell is stored as an object, several as a list)."""
    try:
        with open(path, encoding="utf-8") as fh:
            got = json.load(fh)
    except (OSError, ValueError) as exc:
        raise InvalidSettingError(f"--report {path}: not a readable bench JSON ({exc}): give files "
                                  "that `main.py bench --json` wrote") from exc
    cells = got if isinstance(got, list) else [got]
    if not all(isinstance(c, dict) and "results" in c for c in cells):
        raise InvalidSettingError(f"--report {path}: not a bench grid (no results): give files that "
                                  "`main.py bench --json` wrote")
    return cells


def grid_verdict(path: str) -> list[str]:
    """One grid's tally of the targets, as lines: misses by medians and paired, peers at 8K, identity,
    and each cell's paired ratio with its interval."""
    cells = load_grid(path)
    ratios: dict[str, list[tuple]] = {"ar medians": [], "ar paired": [], "best medians": [], "best paired": []}
    spans: dict[str, list[tuple]] = {"ar": [], "best": []}
    peers, different = [], []
    for cell in cells:
        name = cell_name(cell)
        rows = {r["method"]: r for r in cell["results"]}
        auto = rows["auto"]
        ms = auto["median_ms_per_token"]
        best = min((m for m in FIXED if m in rows), key=lambda m: rows[m]["median_ms_per_token"])
        ratios["ar medians"].append((name, rows["ar"]["median_ms_per_token"] / ms))
        ratios["ar paired"].append((name, auto["paired_speedup_vs_ar"]))
        ratios["best medians"].append((name, rows[best]["median_ms_per_token"] / ms, best))
        ratios["best paired"].append((name, auto["paired_vs_best_fixed"], auto["best_fixed"]))
        runs = {m: r["runs_ms_per_token"] for m, r in rows.items()}
        spans["ar"].append((name, auto["paired_speedup_vs_ar"], paired_interval(runs["ar"], runs["auto"])))
        spans["best"].append((name, auto["paired_vs_best_fixed"],
                              paired_interval(runs[auto["best_fixed"]], runs["auto"])))
        different += [(name, m) for m, r in rows.items() if m in FIXED + ("auto",) and not r["identical_to_ar"]]
        if int(cell["context_tokens"]) >= 8000:
            for peer in ("llama.cpp", "hf"):
                if peer in rows:
                    p = rows[peer]["median_ms_per_token"]
                    peers.append(f"8K {cell['workload']}: auto {ms:.1f}  {peer} {p:.1f} -> {p / ms:.2f}x")
    n = len(cells)
    lines = [path]
    for key, bar in BARS.items():
        parts = []
        for how in ("medians", "paired"):
            misses = [(r[0], shown(r[1], bar)) + tuple(r[2:]) for r in ratios[f"{key} {how}"] if r[1] < bar]
            parts.append(f"{how} {n - len(misses)} of {n} {misses}")
        lines.append(f"auto >= {bar} x {key}: " + "; ".join(parts))
    lines += peers
    lines.append(f"not identical to ar: {different or 'none'}")
    for key, bar in BARS.items():
        text = [f"{name} {ratio:.3f}" + (f" [{s[0]:.3f}-{s[1]:.3f}]" if s else "") for name, ratio, s in spans[key]]
        below = [name for name, _, s in spans[key] if s and s[1] < bar]
        lines.append(f"paired vs {key}: " + ", ".join(text) + f"; interval wholly below {bar}: {below or 'none'}")
    return lines


def pooled_table(paths: list[str]) -> list[str]:
    """The targets over several grids of one code, as a Markdown table: per cell and bar, grids met by
    medians and paired, the lowest paired ratio, and all repeats pooled (median [interval])."""
    got: dict = collections.defaultdict(lambda: {k: {"medians": [], "paired": [], "runs": []} for k in BARS})
    for path in paths:
        for cell in load_grid(path):
            rows = {r["method"]: r for r in cell["results"]}
            auto = rows["auto"]
            for key, other, paired in (("ar", "ar", auto["paired_speedup_vs_ar"]),
                                       ("best", auto["best_fixed"], auto["paired_vs_best_fixed"])):
                g = got[cell_name(cell)][key]
                g["medians"].append(rows[other]["median_ms_per_token"] / auto["median_ms_per_token"])
                g["paired"].append(paired)
                g["runs"] += [o / a for o, a in zip(rows[other]["runs_ms_per_token"], auto["runs_ms_per_token"])]
    lines = [f"{len(paths)} grids: " + ", ".join(paths),
             "| cell | vs | bar | grids met, medians | grids met, paired | lowest paired "
             "| pooled repeats: median [interval] | repeats at or over the bar |",
             "|---|---|---|---|---|---|---|---|"]
    for name, by in got.items():
        for key, bar in BARS.items():
            g = by[key]
            span = median_interval(g["runs"])
            interval = f" [{span[0]:.3f}-{span[1]:.3f}, {100 * span[2]:.1f} %]" if span else ""
            lines.append(f"| {name} | {key} | {bar} | {sum(r >= bar for r in g['medians'])} of {len(g['medians'])} "
                         f"| {sum(r >= bar for r in g['paired'])} of {len(g['paired'])} | {shown(min(g['paired']), bar)} "
                         f"| {statistics.median(g['runs']):.3f}{interval} "
                         f"| {sum(r >= bar for r in g['runs'])} of {len(g['runs'])} |")
    return lines


def print_report(paths: list[str]) -> int:
    """Prints each grid's verdict, then (for two or more grids) the pooled table; returns 0."""
    for path in paths:
        print("\n".join(grid_verdict(path)))
    if len(paths) > 1:
        print("\n".join(pooled_table(paths)))
    return 0
