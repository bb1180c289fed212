"""The CPU's feature flags, for tests that compare kernel bodies only a CPU with them builds."""
from __future__ import annotations


def cpu_flags() -> set[str]:
    """The flags /proc/cpuinfo lists (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return set()
