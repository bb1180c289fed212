"""Number formats the panels, the footers and the dialogs share (Qt-free)."""
from __future__ import annotations


def fmt_bytes(n: float | int | None) -> str:
    if n is None:
        return "–"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_tokens(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"


def fmt_rate(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 1:
        return f"{1000 * s:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    return f"{s / 60:.0f} min"
