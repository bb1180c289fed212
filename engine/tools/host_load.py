"""How much of this machine's CPU time the host took away while a benchmark ran.

In a virtual machine, the hypervisor counts "steal" time: moments a virtual CPU was ready to run and
the host ran something else. The load average inside the guest does not see it (the grid of
2026-12-03 ran at load average 1.2-1.3 while `top` showed 29-32 % steal, and ar took 43-139 ms/token
at continue 1K-2K where it takes ~28-33 quiet). Linux reports it in /proc/stat; elsewhere there is nothing to read, and
the share is None.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuTimes:
    """The machine's CPU time counters (all CPUs, in clock ticks): busy + idle, and steal alone."""

    total: int
    steal: int


def read_cpu_times(path: Path = PROC_STAT) -> CpuTimes | None:
    """The aggregate `cpu` line of /proc/stat, or None where there is none (not Linux)."""
    try:
        with open(path) as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) < 9:
        return None
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    return CpuTimes(sum(ticks), ticks[7])


def steal_percent(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """Share of the CPU time between two readings that the host stole, in per cent."""
    if before is None or after is None or after.total <= before.total:
        return None
    return 100.0 * (after.steal - before.steal) / (after.total - before.total)
