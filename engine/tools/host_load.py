"""How much of this machine's CPU time the host took away while a benchmark ran, and how idle
OpenMP threads should wait on this machine.

In a virtual machine, the hypervisor counts "steal" time: moments a virtual CPU was ready to run and
the host ran something else. The load average inside the guest does not see it, while it can
slow every method several-fold. Linux reports it in /proc/stat; elsewhere there is nothing to read, and
the share is None.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuTimes:
    """The machine's CPU time counters (all CPUs, in clock ticks): busy + idle, and steal alone."""

    total: int
    steal: int
    idle: int = 0  # idle + iowait


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
    return CpuTimes(sum(ticks), ticks[7], ticks[3] + ticks[4])


def _percent(before: CpuTimes | None, after: CpuTimes | None, part: Callable[[CpuTimes], int]) -> float | None:
    """Share of the CPU time between two readings that `part` (of a CpuTimes) counts, in per cent."""
    if before is None or after is None or after.total <= before.total:
        return None
    return 100.0 * (part(after) - part(before)) / (after.total - before.total)


def steal_percent(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """Share of the CPU time between two readings that the host stole, in per cent."""
    return _percent(before, after, lambda t: t.steal)


def busy_percent(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """Share of the CPU time between two readings that programs in this machine used, in per cent."""
    return _percent(before, after, lambda t: t.total - t.idle - t.steal)


def is_virtual_machine(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU says it runs under a hypervisor (Linux's "hypervisor" flag)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            return any(line.startswith("flags") and "hypervisor" in line.split() for line in f)
    except OSError:
        return False


# A waiter spins a bounded while (~0.1 ms), then sleeps; libgomp's default with no policy set is
# similar (300,000). PASSIVE sleeps at once.
SPIN = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "200000"}
SLEEP = {"OMP_WAIT_POLICY": "PASSIVE"}
BUSY_LIMIT = 25.0  # per cent of the CPU other programs may take for the app to spin


def openmp_wait_env(virtual: bool, busy: float | None) -> dict[str, str]:
    """How idle OpenMP threads wait between the ~300 small parallel steps of a token. In a virtual
    machine each wake-up of a sleeping thread waits for the host, so there a bounded spin decodes
    faster and the host steals less. Beside busy programs a spinning waiter costs them and us far
    more than a sleeping one, so on a physical machine, or when other programs keep BUSY_LIMIT of
    the CPU busy, threads sleep."""
    return SPIN if virtual and busy is not None and busy < BUSY_LIMIT else SLEEP
