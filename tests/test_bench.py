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
    # A B C, B C A: every repeat runs every method, ours in an order rotated by one, the peers after
    assert runs == ["ar", "auto", "triforce", "hf", "auto", "triforce", "ar", "hf"]
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
    assert report["interleave"] == "step"
    table = format_report(report)
    assert "interleaved step by step" in table and "auto ran:" in table and "llama.cpp skipped" in table and "(min-max)" in table and "paired" in table
    assert "auto against the fastest fixed mode" in table
    # two repeats are too few for a 90 % interval: none is printed or kept
    assert by["auto"]["paired_vs_best_fixed_interval"] is None and "% interval" not in table


def test_paired_speedup_is_the_median_of_same_repeat_ratios():
    from engine.tools.bench import paired_speedup

    # a slow spell in repeat 2 hits both methods alike and one in repeat 3 only the second: the
    # ratio of medians reads 0.88x, the paired ratio the 2x that two of three repeats measured
    ar, fast = [40.0, 100.0, 44.0], [20.0, 50.0, 60.0]
    assert 44.0 / 50.0 == 0.88
    assert paired_speedup(ar, fast) == 2.0
    assert paired_speedup([], fast) is None


def test_a_paired_ratios_interval_is_the_sign_tests_order_statistics():
    from engine.tools.bench import median_interval, paired_interval

    # five repeats: only the extremes reach 90 %, at 1 - 2/32; nine: the second from each end, at 1 - 2 x 10/512
    assert median_interval([1.1, 0.9, 1.0, 1.3, 0.8]) == (0.8, 1.3, 1 - 2 / 32)
    nine = [0.91, 1.02, 0.97, 1.10, 0.88, 1.05, 0.99, 0.93, 1.20]
    assert median_interval(nine) == (0.91, 1.10, 1 - 2 * 10 / 512)
    assert median_interval(nine, level=0.8) == (0.93, 1.05, 1 - 2 * 46 / 512)
    assert median_interval([1.0, 2.0, 3.0, 4.0]) is None  # four values cover at most 87.5 %
    assert paired_interval([10.0] * 5, [10.0, 5.0, 20.0, 8.0, 12.5]) == [0.5, 2.0, 0.9375]


def test_the_median_interval_covers_a_skewed_medians_as_often_as_it_says():
    import random

    from engine.tools.bench import median_interval

    # host noise only adds time: a long right tail. Over many draws of nine, [x(2), x(8)] must hold
    # the true median about 96.1 % of the time, whatever the distribution
    rng, true_median, trials = random.Random(7), 1.0 + 0.5 * 0.6931471805599453, 4000
    hits = 0
    for _ in range(trials):
        low, high, coverage = median_interval([1.0 + rng.expovariate(2.0) for _ in range(9)])
        hits += low <= true_median <= high
    assert coverage == pytest.approx(0.9609375)
    assert abs(hits / trials - coverage) < 0.015


def test_the_report_prints_auto_s_paired_ratios_with_their_intervals():
    row = {"ms_per_token": 10.0, "tokens_per_s": 100.0, "speedup_vs_ar": 1.0, "acceptance": {},
           "identical_to_ar": True, "paired_speedup_vs_ar": 1.0}
    report = {"model": "m", "device": "cpu", "workload": "qa", "context_tokens": 2048, "new_tokens": 64,
              "settings": {}, "results": [
                  dict(row, method="auto", best_fixed="retrieval-only", paired_vs_best_fixed=0.93,
                       paired_vs_best_fixed_interval=[0.88, 1.01, 0.9609375], paired_speedup_vs_ar=1.12,
                       paired_vs_ar_interval=[1.02, 1.2, 0.9609375]),
                  dict(row, method="ar")]}
    assert ("auto against the fastest fixed mode (retrieval-only), paired per repeat: 0.93x "
            "(0.88-1.01, 96 % interval); against ar: 1.12x (1.02-1.20, 96 % interval)") in format_report(report)


class _StolenRuns:
    """/proc/stat as the bench reads it: the cell's start, then a reading before and after each run
    (100 ticks, of which the script's next number stolen), then the cell's end."""

    def __init__(self, stolen_per_run: list[int]) -> None:
        self.script, self.calls, self.now = iter(stolen_per_run), 0, (0, 0)

    def __call__(self):
        from engine.tools.host_load import CpuTimes

        self.calls += 1
        if self.calls > 1 and self.calls % 2 == 1:  # after a run
            total, steal = self.now
            self.now = (total + 100, steal + next(self.script))
        return CpuTimes(*self.now)


def test_a_repeat_the_host_stole_from_is_set_aside_and_run_again(tiny, sample_text, monkeypatch):
    """--max-steal: the repeat measured while the hypervisor took half the CPU is run again, every
    method of it alike; its times stay in the report, apart from the kept ones."""
    import engine.tools.bench as bench

    monkeypatch.setattr(bench, "read_cpu_times", _StolenRuns([0, 50, 1, 0, 0, 0]))  # per run, 100 ticks each
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "200000")
    lines: list[str] = []
    report = run_bench(tiny, sample_text, 600, 6, ["ar", "auto"], DecodeSettings(budget=64, chunk=16), "ngram",
                       "continue", repeats=2, log=lines.append, max_steal=10.0, interleave="answer")
    runs = [line.split("] ")[1].split(":")[0] for line in lines if line.startswith("  [")]
    assert runs == ["ar", "auto", "auto", "ar", "ar", "auto"]  # three repeats ran, two were kept
    assert sum("set aside" in line for line in lines) == 1
    assert report["steal_percent_by_repeat"] == [1.0, 0.0] and report["steal_percent"] == 8.5  # 51 of 600
    (aside,) = report["set_aside_repeats"]
    assert aside["steal_percent"] == 50.0 and set(aside["ms_per_token"]) == {"ar", "auto"}
    assert report["openmp_wait"] == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "200000"}  # how threads waited
    for r in report["results"]:
        assert len(r["runs_ms_per_token"]) == 2 and len(report["steal_percent_by_repeat"]) == 2
    assert "host steal 8.5 % (by repeat 1.0, 0.0); 1 repeats set aside at over 10.0 % steal (50.0)" in format_report(report)


def test_set_aside_at_most_as_many_repeats_as_asked(tiny, sample_text, monkeypatch):
    """A host busy all along: after `repeats` set aside, the next repeats are kept (and say so)."""
    import engine.tools.bench as bench

    monkeypatch.setattr(bench, "read_cpu_times", _StolenRuns([60] * 8))
    report = run_bench(tiny, sample_text, 600, 4, ["ar"], DecodeSettings(budget=64, chunk=16), "ngram",
                       "continue", repeats=2, log=lambda m: None, max_steal=10.0, interleave="answer")
    assert len(report["set_aside_repeats"]) == 2 and report["steal_percent_by_repeat"] == [60.0, 60.0]
    assert len(report["results"][0]["runs_ms_per_token"]) == 2


class _Clock:
    """time.perf_counter for bench_steps: only the fake streams move it."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _FakeSession:
    """A session whose answer is a script: (seconds the call costs, tokens it yields) per event, a
    prefill first; every call is logged, so the test sees who ran when."""

    def __init__(self, name: str, script: list[tuple[float, tuple[int, ...]]], clock: _Clock, calls: list) -> None:
        self.name, self.script, self.clock, self.calls = name, script, clock, calls

    def stream_ids(self, prompt):
        from engine.events import Finished, FinishReason, Level, PrefillProgress, TokenText

        self.calls.append(self.name)
        self.clock.now += 5.0  # the prefill: never decode time
        yield PrefillProgress(len(prompt), len(prompt), 0, 5.0)
        for i, (seconds, ids) in enumerate(self.script):
            if i:
                self.calls.append(self.name)
            self.clock.now += seconds
            yield TokenText("x", ids, Level.L2)
        self.calls.append(self.name)
        yield Finished(FinishReason.LENGTH, "x")


def test_side_by_side_asks_each_method_in_turn_and_times_only_its_own_calls(monkeypatch):
    """Step interleaving: a round asks every method for its next token, in the order given, until
    all have finished; a method's time is its own calls' after its first token, so the seconds the
    others spend between its calls never count, and a cycle's later tokens cost nothing."""
    import engine.tools.bench_steps as steps

    clock, calls = _Clock(), []
    monkeypatch.setattr(steps.time, "perf_counter", clock.perf_counter)
    # "ar": one forward (0.02 s) per token; "spec": a 0.05 s cycle that yields three tokens, one a call
    ar = _FakeSession("ar", [(0.5, (1,))] + [(0.02, (t,)) for t in (2, 3, 4, 5, 6, 7)], clock, calls)
    spec = _FakeSession("spec", [(0.5, (1,)), (0.05, (2,)), (0.0, (3,)), (0.0, (4,)), (0.05, (5,)), (0.0, (6,)),
                                 (0.0, (7,))], clock, calls)
    runs = steps.run_side_by_side({"ar": ar, "spec": spec}, ["spec", "ar"], [9, 9, 9])
    assert calls[:6] == ["spec", "ar"] * 3 and len(calls) == 2 * 8  # in turn, spec first each round
    assert runs["ar"].tokens == runs["spec"].tokens == [1, 2, 3, 4, 5, 6, 7]
    assert runs["ar"].timed_tokens == runs["spec"].timed_tokens == 6  # the first token is not timed
    assert runs["ar"].decode_s == pytest.approx(6 * 0.02)  # the prefill and first token (5.5 s) left out
    assert runs["spec"].decode_s == pytest.approx(2 * 0.05)
    assert runs["ar"].ms_per_token == pytest.approx(20.0) and runs["spec"].ms_per_token == pytest.approx(100 / 6)


def test_sessions_on_one_prefill_compute_the_prompt_once_and_answer_alike(tiny, sample_text):
    """Each method gets its own session; only the first computes the prompt, the others copy its K/V
    and recompute just the last prefill chunk (the logits that start the answer)."""
    from engine.tools.bench import build_prompt
    from engine.tools.bench_steps import run_side_by_side, sessions_on_one_prefill

    prompt = build_prompt(tiny, sample_text, 600, "continue")
    settings = DecodeSettings(budget=64, chunk=16, max_new_tokens=10, ignore_eos=True, stop=())
    sessions = sessions_on_one_prefill(tiny, ["ar", "triforce", "auto"], prompt, settings, "ngram", 700)
    assert sessions["ar"].prefilled_tokens_total == len(prompt)
    assert sessions["triforce"].prefilled_tokens_total == sessions["auto"].prefilled_tokens_total == 0
    assert sessions["triforce"].held == sessions["auto"].held == prompt
    runs = run_side_by_side(sessions, ["auto", "triforce", "ar"], prompt)
    assert runs["auto"].tokens == runs["triforce"].tokens == runs["ar"].tokens and len(runs["ar"].tokens) == 10
    assert 0 < sessions["triforce"].prefilled_tokens_total < len(prompt)  # the last chunk only
    assert runs["triforce"].metrics.mode == "triforce" and runs["auto"].metrics.mode == "auto"
