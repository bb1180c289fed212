"""Host steal time, read from /proc/stat: what the bench reports beside each cell."""
from __future__ import annotations

from engine.tools.host_load import (SLEEP, SPIN, CpuTimes, busy_percent, is_virtual_machine, openmp_wait_env,
                                    read_cpu_times, steal_percent)


def test_reads_the_aggregate_cpu_line(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 5 50 800 10 2 3 30 0 0\ncpu0 50 2 25 400 5 1 1 15 0 0\nintr 1 2 3\n")
    assert read_cpu_times(stat) == CpuTimes(total=1000, steal=30, idle=810)  # guest time is already in user


def test_no_reading_where_there_is_no_proc_stat(tmp_path):
    assert read_cpu_times(tmp_path / "missing") is None
    (tmp_path / "odd").write_text("intr 1 2 3\n")
    assert read_cpu_times(tmp_path / "odd") is None


def test_steal_share_between_two_readings():
    assert steal_percent(CpuTimes(1000, 30), CpuTimes(1400, 130)) == 25.0
    assert steal_percent(CpuTimes(1000, 30), CpuTimes(1000, 30)) is None  # no time passed
    assert steal_percent(None, CpuTimes(1000, 30)) is None


def test_busy_share_is_what_programs_in_the_machine_used():
    before, after = CpuTimes(1000, 30, 800), CpuTimes(1400, 130, 1000)  # 400 ticks: 100 steal, 200 idle
    assert busy_percent(before, after) == 25.0
    assert busy_percent(after, after) is None


def test_reads_whether_the_cpu_runs_under_a_hypervisor(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 hypervisor avx512f\n")
    assert is_virtual_machine(info)
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\nbugs\t: hypervisor_thing\n")
    assert not is_virtual_machine(info)
    assert not is_virtual_machine(tmp_path / "missing")


def test_openmp_threads_spin_a_while_only_in_a_quiet_virtual_machine():
    assert openmp_wait_env(True, 5.0) == SPIN
    assert openmp_wait_env(True, 80.0) == SLEEP  # busy programs beside: a spinning waiter costs them
    assert openmp_wait_env(False, 0.0) == SLEEP  # no host to wait for
    assert openmp_wait_env(True, None) == SLEEP  # nothing to read: the polite default
