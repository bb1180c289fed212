"""A folder made read-only or full for one command, without touching the machine.

Each helper returns the command prefix that runs a command in its own mount namespace (`unshare
-rm`: no privileges needed where user namespaces are allowed) with the folder bind-mounted
read-only, or replaced by a tiny tmpfs; None where the system refuses namespaces (callers skip).
Plain chmod cannot make a folder read-only for root, and a full disk cannot be made by hand.
"""
from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

_READ_ONLY = 'mount --bind -o ro "$0" "$0" && exec "$@"'
_FULL = 'mount -t tmpfs -o size=$1 tmpfs "$0" && shift && exec "$@"'


@functools.cache
def namespaces_work() -> bool:
    """Can this user make a private mount namespace (and mount in it)?"""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=4k tmpfs /tmp && exec true'],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def read_only(folder: Path) -> list[str] | None:
    """Prefix that runs a command with `folder` read-only (its files still readable)."""
    return ["unshare", "-rm", "sh", "-c", _READ_ONLY, str(folder)] if namespaces_work() else None


def full(folder: Path, size: str = "64k") -> list[str] | None:
    """Prefix that runs a command with `folder` an empty tmpfs of `size`: a full disk after a few writes."""
    return ["unshare", "-rm", "sh", "-c", _FULL, str(folder), size] if namespaces_work() else None
