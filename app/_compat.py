"""Work-arounds for known bugs in the Qt binding we run on. Applied once, when `app` is imported."""
from __future__ import annotations

import ctypes
import sys

IMMORTAL = 1 << 40  # far more references than any process will ever drop


def immortalize_singletons() -> bool:
    """Make None/True/False immortal, as Python 3.12 does, when PySide6 6.12 runs on Python 3.11.

    PySide6 6.12.0's abi3 wheels return None (every void method: setValue, setVisible, ...) and
    sometimes bools without taking a reference: harmless on 3.12+, where those objects are
    immortal, but on 3.11 each call costs the singleton one reference until the interpreter
    aborts with "deallocating None". (6.11 is fine; pin `PySide6-Essentials<6.12` to avoid it.)
    Returns True when it applied the work-around.
    """
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    from PySide6 import __version__ as pyside_version
    if tuple(int(p) for p in pyside_version.split(".")[:2]) < (6, 12):
        return False
    for obj in (None, True, False):
        refcnt = ctypes.c_ssize_t.from_address(id(obj))  # ob_refcnt: the first field of every PyObject
        if refcnt.value < IMMORTAL:
            refcnt.value += IMMORTAL
    return True
