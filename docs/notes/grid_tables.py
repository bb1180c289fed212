"""The README's two tables for one bench grid (`main.py bench --json`): median ms/token per method
with host steal, and auto's ratios against ar, the fastest fixed mode and the peers.

    python3 docs/notes/grid_tables.py docs/bench/bench-cpu-s36-zen4-64.json
"""
from __future__ import annotations

import json
import sys

OURS = ("auto", "ar", "triforce", "draft-only", "retrieval-only")
FIXED = OURS[1:]
SHOWN = OURS + ("hf", "llama.cpp")


def tables(path: str) -> None:
    cells = json.load(open(path))
    print("| workload, context | host steal % (by kept repeat) | " + " | ".join(SHOWN) + " |")
    print("|---" * (len(SHOWN) + 2) + "|")
    for cell in cells:
        rows = {r["method"]: r for r in cell["results"]}
        best = min(FIXED, key=lambda m: rows[m]["median_ms_per_token"])
        shown = []
        for m in SHOWN:
            r = rows.get(m)
            if r is None:
                shown.append("-")
                continue
            text = f"{r['median_ms_per_token']:.1f}"
            if m == best:
                text = f"**{text}**"
            if m not in OURS and r.get("match_length", 64) < int(cell["new_tokens"]):
                text += f" (first {r['match_length']})"
            shown.append(text)
        steal = ", ".join(str(x) for x in cell["steal_percent_by_repeat"])
        print(f"| {cell['workload']} {cell['context_tokens']} | {cell['steal_percent']} ({steal}) | " + " | ".join(shown) + " |")
    print()
    print("| workload, context | auto vs ar (medians / paired) | auto vs fastest fixed (medians / paired) "
          "| auto vs llama.cpp | auto vs hf | auto ran (last answer) | ours same as ar |")
    print("|---" * 7 + "|")
    for cell in cells:
        rows = {r["method"]: r for r in cell["results"]}
        auto = rows["auto"]
        a = auto["median_ms_per_token"]
        best = auto["best_fixed"]
        peer = lambda m: f"{rows[m]['median_ms_per_token'] / a:.2f}x" if m in rows else "-"  # noqa: E731
        same = all(rows[m]["identical_to_ar"] for m in OURS if m in rows)
        print(f"| {cell['workload']} {cell['context_tokens']} "
              f"| {rows['ar']['median_ms_per_token'] / a:.2f}x / {auto['paired_speedup_vs_ar']:.2f}x "
              f"| {rows[best]['median_ms_per_token'] / a:.2f}x / {auto['paired_vs_best_fixed']:.2f}x ({best}) "
              f"| {peer('llama.cpp')} | {peer('hf')} | {auto['structure'].split('; ')[-1]} | {same} |")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        tables(p)
