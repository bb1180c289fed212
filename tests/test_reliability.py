"""The reliability script's small version: the quick bad inputs and a few kill -9s over `chat`.

The full run (`python -m tests.reliability`: every bad input and 100 kills) is a command, not a test.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.__main__ import passage
from tests.reliability.bad_inputs import CASES, make_files, run_table
from tests.reliability.kill_loop import run_kills


@pytest.mark.slow
def test_quick_bad_inputs_fail_cleanly(tmp_path: Path, tiny_model_dir) -> None:
    lines: list[str] = []
    table = run_table(make_files(tmp_path / "inputs", tiny_model_dir("llama")), quick=True, report=lines.append)
    assert table.tried + table.skipped == sum(c.quick for c in CASES) and table.tried >= 8
    assert table.clean == table.tried, "\n".join(lines)
    assert (table.tracebacks, table.junk, table.lost) == (0, 0, 0), "\n".join(lines)


@pytest.mark.slow
def test_a_few_kills_leave_the_store_whole(tmp_path: Path, tiny_model_dir) -> None:
    counts = run_kills(3, tiny_model_dir("llama"), passage(tmp_path / "passage.md"), tmp_path / "home", seed=7,
                       max_new_tokens=32, report=lambda line: None)
    assert counts.kills == 3
    assert (counts.corrupt, counts.lost, counts.orphans) == (0, 0, 0), counts.problems
    assert counts.temps_left == 0
