"""The command line's one validation layer: argparse `type=` functions every subcommand shares.

Every value is checked as argparse reads it, before a model, a prompt or a download is touched:
numbers are finite and in their range, integers fit where they go (an SQLite row id, a torch
seed), text is UTF-8 (argv of a non-UTF-8 locale or a stray byte arrives surrogate-escaped).
A refusal is argparse's own one line, `error: argument --seed: ...`, and exit 2.

`harden(parser)` gives every option declared with a bare `int`, `float` or no type the default
check (an int64 count of 0 or more, a finite float, UTF-8 text), so a flag added later without a
checked type cannot bring back a traceback; a flag with a narrower range names its own type.
"""
from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

INT64_MAX = 2**63 - 1  # SQLite's INTEGER and most C longs
SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes an unsigned 64-bit seed
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d{1,3})?")


def text(value: str) -> str:
    """Free text (a question, a title, a spec): must be valid UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(
            f'"{_short(_bytes_shown(value))}" is not UTF-8 text: retype it in a UTF-8 terminal '
            "(a file: rename it to UTF-8)") from None
    return value


def integer(low: int = 0, high: int = INT64_MAX, what: str = "") -> Callable[[str], int]:
    """A whole number from `low` to `high` (`what` names the unit in the message)."""

    def parse(value: str) -> int:
        number = int(text(value).strip())  # ValueError: argparse's "invalid int value: 'x'"
        if not low <= number <= high:
            unit = f" {what}" if what else ""
            raise argparse.ArgumentTypeError(f"{_short(value)} is out of range: use {low} to {high}{unit}")
        return number

    parse.__name__ = "int"  # argparse names the type in "invalid int value"
    parse.checked = True
    return parse


def real(low: float = -math.inf, high: float = math.inf, what: str = "") -> Callable[[str], float]:
    """A finite number from `low` to `high` (nan and inf are refused whatever the range)."""

    def parse(value: str) -> float:
        number = float(text(value).strip())  # ValueError: argparse's "invalid float value: 'x'"
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"{value} is not a finite number: use {_span(low, high, what)}")
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range: use {_span(low, high, what)}")
        return number

    parse.__name__ = "float"
    parse.checked = True
    return parse


def integer_list(low: int, high: int, what: str = "") -> Callable[[str], list[int]]:
    """A comma-separated list of whole numbers, each from `low` to `high` (e.g. 1024,2048,4096)."""
    one = integer(low, high, what)

    def parse(value: str) -> list[int]:
        parts = [p for p in text(value).split(",") if p.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"{value!r} is empty: give numbers like 1024 or 1024,2048")
        return [one(p) for p in parts]

    parse.__name__ = "list"
    parse.checked = True
    return parse


def device(value: str) -> str:
    """A device's name as written (auto, cpu, cuda, cuda:N); whether it exists is checked
    later, by engine.api.check_device, before any weight loads."""
    if not DEVICE_PATTERN.fullmatch(text(value).strip()):
        raise argparse.ArgumentTypeError(f"{_short(value)!r} is not a device: use auto, cpu, cuda or cuda:N")
    return value.strip()


MIN_TEMPERATURE = 1e-3  # below it logits / temperature overflow float32 (inf, nan); 0 is greedy
MIN_TOP_P = 1e-6  # a top-p that rounds to 0 in float32 would keep no token at all


def temperature(value: str) -> float:
    """0 (greedy) or a sampling temperature from MIN_TEMPERATURE to 5."""
    number = real(0, 5)(value)
    if 0 < number < MIN_TEMPERATURE:
        raise argparse.ArgumentTypeError(f"{value} is too small to sample with: use 0 (greedy) or "
                                         f"{MIN_TEMPERATURE:g} to 5")
    return number


temperature.__name__ = "float"
temperature.checked = True
ROW_ID = integer(1, INT64_MAX)  # a chat id: SQLite rows are numbered from 1 within int64
SEED = integer(0, SEED_MAX)
COUNT = integer(0, INT64_MAX)  # the default for an int option that names no range
FINITE = real()  # the default for a float option that names no range
for _parse in (text, device):
    _parse.checked = True


def harden(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every value-taking option of `parser` (and its subparsers) a checked type: bare `int`
    becomes COUNT, `float` FINITE, no type `text`; options with choices or a checked type stay."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                harden(sub)
            continue
        if action.nargs == 0 or getattr(action.type, "checked", False):
            continue
        if action.type is int:
            action.type = COUNT
        elif action.type is float:
            action.type = FINITE
        elif action.type is None or action.type is str:
            action.type = text
    return parser


def unchecked_options(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    """Options whose values no checked type reads (for the test that keeps every flag checked)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += unchecked_options(sub, f"{prefix}{name} ")
        elif action.nargs != 0 and not getattr(action.type, "checked", False) and action.option_strings:
            found.append(prefix + action.option_strings[-1])
    return found


def _bytes_shown(value: str) -> str:
    # the bytes argv held (surrogate-escaped by Python), as ASCII with \x escapes
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no byte made
        raw = value.encode("utf-8", "surrogatepass")
    return raw.decode("ascii", "backslashreplace")


def _short(value: str, limit: int = 40) -> str:
    return value if len(value) <= limit else value[:limit] + "..."


def _span(low: float, high: float, what: str) -> str:
    unit = f" {what}" if what else ""
    if math.isinf(low) and math.isinf(high):
        return f"a finite number{unit}"
    if math.isinf(high):
        return f"{low:g} or more{unit}"
    if math.isinf(low):
        return f"{high:g} or less{unit}"
    return f"{low:g} to {high:g}{unit}"
