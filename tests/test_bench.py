"""The bench: methods interleaved per repeat, median/min/max per method, exactness against ar,
load averages, and an optional llama.cpp peer that is skipped with one clear line when absent."""
from __future__ import annotations

import pytest

from engine.model.loading import load_folder
from engine.settings import DecodeSettings
from engine.tools.bench import format_report, match_length, run_bench


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_folder(tiny_model_dir("llama"))


def test_match_length_counts_leading_agreement():
    assert match_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert match_length([], [1]) == 0


def test_bench_interleaves_methods_and_reports_spread(tiny, sample_text, monkeypatch, tmp_path):
    monkeypatch.setenv("TRIFORCE_LLAMA_CPP_PYTHON", str(tmp_path / "no-such-python"))
    lines: list[str] = []
    methods = ["auto", "ar", "triforce", "hf", "llama.cpp"]
    report = run_bench(tiny, sample_text, 600, 12, methods, DecodeSettings(budget=64, chunk=16), "ngram",
                       "continue", repeats=2, log=lines.append)
    runs = [line.split("] ")[1].split(":")[0] for line in lines if line.startswith("  [")]
    assert runs == ["ar", "auto", "triforce", "hf"] * 2  # A B C, A B C: every repeat runs every method
    assert any(line.startswith("llama.cpp skipped: llama-cpp-python not found") for line in lines)
    by = {r["method"]: r for r in report["results"]}
    assert set(by) == {"auto", "ar", "triforce", "hf"} and "llama.cpp" in report["skipped"]
    for r in by.values():
        assert len(r["runs_ms_per_token"]) == 2
        assert r["min_ms_per_token"] <= r["median_ms_per_token"] == r["ms_per_token"] <= r["max_ms_per_token"]
        assert r["speedup_vs_ar"] == pytest.approx(by["ar"]["ms_per_token"] / r["ms_per_token"])
        pairs = [a / b for a, b in zip(by["ar"]["runs_ms_per_token"], r["runs_ms_per_token"])]
        assert r["paired_speedup_vs_ar"] == pytest.approx(sum(pairs) / 2)  # the median of two
    assert by["ar"]["paired_speedup_vs_ar"] == 1.0
    assert by["auto"]["best_fixed"] in {"ar", "triforce"}
    best = by[by["auto"]["best_fixed"]]
    assert best["ms_per_token"] == min(by["ar"]["ms_per_token"], by["triforce"]["ms_per_token"])
    pairs = [a / b for a, b in zip(best["runs_ms_per_token"], by["auto"]["runs_ms_per_token"])]
    assert by["auto"]["paired_vs_best_fixed"] == pytest.approx(sum(pairs) / 2)
    for name in ("auto", "triforce", "hf"):
        assert by[name]["identical_to_ar"] and by[name]["match_length"] == by[name]["new_tokens"] == 12
    assert by["auto"]["structure"] and by["auto"]["candidates"]
    assert len(report["load_average_before"]) == 3 and len(report["load_average_after"]) == 3
    table = format_report(report)
    assert "auto ran:" in table and "llama.cpp skipped" in table and "(min-max)" in table and "paired" in table
    assert "auto against the fastest fixed mode" in table


def test_paired_speedup_is_the_median_of_same_repeat_ratios():
    from engine.tools.bench import paired_speedup

    # a slow spell in repeat 2 hits both methods alike and one in repeat 3 only the second: the
    # ratio of medians reads 0.88x, the paired ratio the 2x that two of three repeats measured
    ar, fast = [40.0, 100.0, 44.0], [20.0, 50.0, 60.0]
    assert 44.0 / 50.0 == 0.88
    assert paired_speedup(ar, fast) == 2.0
    assert paired_speedup([], fast) is None
