"""The grid report (`main.py bench --report`): the targets' tallies from bench JSON files, a miss
just under its bar printed so it cannot read as met, the pooled table over several grids, and a
file that is not a grid refused with a typed error."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import InvalidSettingError
from engine.tools.grid_report import grid_verdict, pooled_table, shown

REPO = Path(__file__).resolve().parent.parent


def _row(method: str, runs: list[float], **extra) -> dict:
    ordered = sorted(runs)
    return {"method": method, "runs_ms_per_token": runs, "median_ms_per_token": ordered[len(runs) // 2],
            "identical_to_ar": True, **extra}


def _cell(workload: str, context: int, auto: list[float], ar: list[float], draft: list[float]) -> dict:
    pairs_ar = sorted(a / b for a, b in zip(ar, auto))
    pairs_best = sorted(d / b for d, b in zip(draft, auto))
    return {"workload": workload, "context_tokens": context, "results": [
        _row("auto", auto, paired_speedup_vs_ar=pairs_ar[len(pairs_ar) // 2], best_fixed="draft-only",
             paired_vs_best_fixed=pairs_best[len(pairs_best) // 2]),
        _row("ar", ar), _row("draft-only", draft), _row("llama.cpp", [30.0] * 5)]}


@pytest.fixture
def grids(tmp_path):
    # auto 10 ms against ar 20 (2x) and draft-only 9.4999 (0.94999x: a miss just under 0.95)
    one = [_cell("continue", 1024, [10.0] * 5, [20.0] * 5, [9.4999] * 5),
           _cell("qa", 8000, [10.0] * 5, [11.0] * 5, [12.0] * 5)]
    two = [_cell("continue", 1024, [10.0] * 5, [21.0] * 5, [10.0] * 5),
           _cell("qa", 8000, [10.0] * 5, [9.0] * 5, [12.0] * 5)]
    paths = []
    for name, cells in (("a.json", one), ("b.json", two)):
        (tmp_path / name).write_text(json.dumps(cells))
        paths.append(str(tmp_path / name))
    return paths


def test_shown_never_rounds_a_miss_up_to_its_bar():
    assert shown(0.94991, 0.95) == "0.9499"
    assert shown(0.951, 0.95) == "0.951"
    assert shown(0.90, 0.95) == "0.900"


def test_verdict_counts_misses_and_peers(grids):
    lines = grid_verdict(grids[0])
    assert lines[1] == "auto >= 1.0 x ar: medians 2 of 2 []; paired 2 of 2 []"
    assert "medians 1 of 2 [('continue 1K', '0.9500', 'draft-only')]" in lines[2]
    assert "8K qa: auto 10.0  llama.cpp 30.0 -> 3.00x" in lines
    assert "not identical to ar: none" in lines
    # five equal repeats: the interval is [min, max] = the ratio itself
    assert "continue 1K 2.000 [2.000-2.000]" in lines[-2]


def test_pooled_table_reads_every_repeat_of_every_grid(grids):
    table = [line.strip("| ").split(" | ") for line in pooled_table(grids)[3:]]
    rows = {tuple(cells[:2]): cells for cells in table}
    assert len(rows) == 4  # two cells, two bars each
    continue_ar = rows[("continue 1K", "ar")]
    assert continue_ar[3:5] == ["2 of 2", "2 of 2"]  # grids met by medians, paired
    assert continue_ar[5] == "2.000"  # the lowest paired ratio
    assert continue_ar[6].startswith("2.050 [2.000-2.100")  # ten repeats pooled
    qa_ar = rows[("qa 8K", "ar")]
    assert qa_ar[3] == "1 of 2" and qa_ar[7] == "5 of 10"


def test_report_through_the_cli_and_a_bad_file(grids, tmp_path):
    got = subprocess.run([sys.executable, str(REPO / "main.py"), "bench", "--report", *grids],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    assert "2 grids: " in got.stdout and "| continue 1K | best | 0.95 | 1 of 2 |" in got.stdout
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a grid"}')
    with pytest.raises(InvalidSettingError, match="not a bench grid"):
        grid_verdict(str(bad))
    got = subprocess.run([sys.executable, str(REPO / "main.py"), "bench", "--report", str(bad)],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert got.returncode == 2 and got.stderr.strip().startswith("error: --report")
