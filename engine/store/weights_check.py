"""A model folder's safetensors files checked from their headers alone, before any weight loads.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte range, then the bytes. Random bytes, a truncated download or a header
length past the file's end are caught here in milliseconds and named as a ModelFormatError,
instead of a library error after the slow part of loading has begun.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from engine.errors import ModelFormatError

MAX_HEADER_BYTES = 100 * 2**20  # the format's own limit; bigger is garbage, not a header


def check_safetensors_folder(folder: str | Path) -> None:
    """Raise ModelFormatError naming the first *.safetensors file in `folder` that is not one."""
    for path in sorted(Path(folder).glob("*.safetensors")):
        check_safetensors_file(path)


def check_safetensors_file(path: Path) -> None:
    """Raise ModelFormatError unless `path` has a readable header whose tensors lie within the file."""
    try:
        with path.open("rb") as fh:
            size = path.stat().st_size
            head = fh.read(8)
            if len(head) < 8:
                raise _bad(path, f"{size} bytes, shorter than a header")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise _bad(path, f"its header claims {length:,} bytes but the file holds {size:,}")
            header = json.loads(fh.read(length).decode("utf-8"))
    except OSError as exc:
        raise ModelFormatError(f"{path} cannot be read ({exc.strerror or exc}): check the file's permissions") from None
    except (UnicodeDecodeError, ValueError):
        raise _bad(path, "its header is not JSON") from None
    if not isinstance(header, dict):
        raise _bad(path, "its header is not a table of tensors")
    data_bytes = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_bytes):
            raise _bad(path, f"tensor {str(name)[:60]!r} lies outside the file (truncated download?)")


def _bad(path: Path, why: str) -> ModelFormatError:
    return ModelFormatError(f"{path} is not a valid safetensors file ({why}): download or convert the model again")
