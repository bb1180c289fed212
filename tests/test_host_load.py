"""Host steal time, read from /proc/stat: what the bench reports beside each cell."""
from __future__ import annotations

from engine.tools.host_load import CpuTimes, read_cpu_times, steal_percent


def test_reads_the_aggregate_cpu_line(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 10 2 3 30 0 0\ncpu0 50 2 25 400 5 1 1 15 0 0\nintr 1 2 3\n")
    assert read_cpu_times(stat) == CpuTimes(total=1000, steal=30)  # guest time is already in user


def test_no_reading_where_there_is_no_proc_stat(tmp_path):
    assert read_cpu_times(tmp_path / "missing") is None
    (tmp_path / "odd").write_text("intr 1 2 3\n")
    assert read_cpu_times(tmp_path / "odd") is None


def test_steal_share_between_two_readings():
    assert steal_percent(CpuTimes(1000, 30), CpuTimes(1400, 130)) == 25.0
    assert steal_percent(CpuTimes(1000, 30), CpuTimes(1000, 30)) is None  # no time passed
    assert steal_percent(None, CpuTimes(1000, 30)) is None
