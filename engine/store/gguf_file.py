"""A GGUF file read as stored: its metadata and tensor table parsed, its tensor data memory-mapped.

Layout (little-endian): "GGUF", version u32 (2 or 3), tensor count u64, metadata count u64; the
metadata (key string, value type u32, value); the tensor table (name, dims u32, dims u64 each,
fastest first, ggml type u32, offset u64 from the data section); the data section at the next
multiple of `general.alignment` (32 by default). Strings are a u64 length and UTF-8 bytes.

Nothing here copies tensor data: `blocks` and `values` are read-only views of the mapped file, so
the operating system pages them in when a kernel first reads them. Token lists are read only when
asked for (`string_arrays`): a warm load walks past them.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.errors import ModelFormatError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# metadata value types of fixed width: struct format
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9

# ggml type id -> (name, weights per block, bytes per block); plain floats are blocks of one
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}
FLOAT_KINDS = {"F32": np.float32, "F16": np.float16}  # BF16 has no numpy dtype: read as uint16


class _Damaged(Exception):
    """Raised inside the parser; open_gguf turns it into a ModelFormatError naming the file."""


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of the table: where its bytes are and how they are stored."""

    name: str
    kind: str  # "Q4_1", "F32", ...
    shape: tuple[int, ...]  # torch order: (out, in) for a weight
    start: int  # absolute offset in the file
    nbytes: int

    @property
    def elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (the last dimension) as stored."""
        _, per_block, block_bytes = _type_by_name(self.kind)
        return self.shape[-1] // per_block * block_bytes


@dataclass
class GgufFile:
    """A parsed GGUF: `metadata` (scalars, numeric arrays as numpy, string arrays as lists when read,
    else their length), `tensors` by name, and the mapped file the views point into."""

    path: Path
    version: int
    metadata: dict
    tensors: dict[str, GgufTensor]
    size: int
    _map: mmap.mmap | None = field(default=None, repr=False)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_key(self, name: str, default=None):
        """`{architecture}.{name}` from the metadata (e.g. "attention.head_count")."""
        return self.metadata.get(f"{self.architecture}.{name}", default)

    def blocks(self, name: str) -> np.ndarray:
        """The tensor's bytes as stored, a read-only view [rows, row bytes] uint8 of the mapped file."""
        t = self.tensors[name]
        flat = np.frombuffer(self._mapping(), dtype=np.uint8, count=t.nbytes, offset=t.start)
        return flat.reshape(-1, t.row_bytes)

    def span(self, names: list[str]) -> np.ndarray | None:
        """One read-only view [rows, row bytes] over tensors stored back to back in this order with
        the same kind and row length (e.g. ffn_gate then ffn_up), or None where they are not."""
        tensors = [self.tensors[n] for n in names]
        first = tensors[0]
        for before, after in zip(tensors, tensors[1:]):
            if after.start != before.start + before.nbytes or (after.kind, after.shape[-1]) != (first.kind, first.shape[-1]):
                return None
        total = sum(t.nbytes for t in tensors)
        return np.frombuffer(self._mapping(), dtype=np.uint8, count=total, offset=first.start).reshape(-1, first.row_bytes)

    def holds(self, array: np.ndarray) -> bool:
        """Whether `array` is memory of the mapped file (a kernel reading it reads the file's pages)."""
        return np.may_share_memory(array, np.frombuffer(self._mapping(), dtype=np.uint8))

    def values(self, name: str) -> np.ndarray:
        """An F32/F16 tensor as a read-only numpy view of its shape (BF16: its raw uint16 bits)."""
        t = self.tensors[name]
        dtype = FLOAT_KINDS.get(t.kind, np.uint16 if t.kind == "BF16" else None)
        if dtype is None:
            raise ValueError(f"{name} is stored as {t.kind} blocks, not as plain values")
        return np.frombuffer(self._mapping(), dtype=dtype, count=t.elements, offset=t.start).reshape(t.shape)

    def release(self, name: str) -> None:
        """Tell the kernel this tensor's pages are not needed now (after a kernel copied them): they
        leave this process's resident set and come back from the file if read again."""
        t = self.tensors[name]
        start = t.start - t.start % mmap.PAGESIZE
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            try:
                self._map.madvise(mmap.MADV_DONTNEED, start, t.start + t.nbytes - start)
            except (OSError, ValueError):
                pass

    def _mapping(self) -> mmap.mmap:
        if self._map is None:
            with open(self.path, "rb") as fh:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        return self._map


def _type_by_name(kind: str) -> tuple[str, int, int]:
    for entry in GGML_TYPES.values():
        if entry[0] == kind:
            return entry
    raise KeyError(kind)


def read_header(path: Path, string_arrays: tuple[str, ...] = ()) -> GgufFile:
    """Parse a GGUF's metadata and tensor table (nothing of the tensor data is read). String
    arrays named in `string_arrays` (e.g. "tokenizer.ggml.tokens") are read as lists; others
    become their length. Raises ModelFormatError for a file that is not a whole GGUF."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            if size < 24:
                raise _Damaged("shorter than a GGUF header")
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        if mapped[:4] != MAGIC:
            raise ModelFormatError(f"{path} is not a GGUF file (it does not start with the GGUF signature)")
        return _parse(path, mapped, size, set(string_arrays))
    except (_Damaged, struct.error, UnicodeDecodeError, ValueError, OverflowError, MemoryError) as exc:
        raise ModelFormatError(f"{path} is truncated or damaged ({exc}): download it again") from None


def _parse(path: Path, mapped: mmap.mmap, size: int, wanted: set[str]) -> GgufFile:
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", mapped, 4)
    if version not in VERSIONS:
        raise _Damaged(f"GGUF version {version}; versions {VERSIONS} are read")
    if n_tensors > size // 24 or n_kv > size // 12:
        raise _Damaged("impossible tensor or metadata counts")
    pos = 24

    def string() -> str:
        nonlocal pos
        (length,) = struct.unpack_from("<Q", mapped, pos)
        if pos + 8 + length > size:
            raise _Damaged("a string runs past the end of the file")
        text = mapped[pos + 8:pos + 8 + length].decode("utf-8")
        pos += 8 + length
        return text

    def value(kind: int, keep: bool):
        nonlocal pos
        if kind in _SCALARS:
            (v,) = struct.unpack_from("<" + _SCALARS[kind], mapped, pos)
            pos += struct.calcsize(_SCALARS[kind])
            return v
        if kind == _STRING:
            return string()
        if kind != _ARRAY:
            raise _Damaged(f"unknown metadata value type {kind}")
        item, count = struct.unpack_from("<IQ", mapped, pos)
        pos += 12
        if item in _SCALARS:
            width = struct.calcsize(_SCALARS[item])
            if pos + width * count > size:
                raise _Damaged("an array runs past the end of the file")
            array = np.frombuffer(mapped, dtype="<" + _SCALARS[item], count=count, offset=pos).copy()
            pos += width * count
            return array
        if item == _STRING:
            if keep:
                return [string() for _ in range(count)]
            for _ in range(count):  # variable length: walk past them
                (length,) = struct.unpack_from("<Q", mapped, pos)
                pos += 8 + length
            if pos > size:
                raise _Damaged("a string array runs past the end of the file")
            return count
        if item == _ARRAY:
            return [value(_ARRAY, keep) for _ in range(count)]
        raise _Damaged(f"unknown array item type {item}")

    metadata: dict = {}
    for _ in range(n_kv):
        key = string()
        (kind,) = struct.unpack_from("<I", mapped, pos)
        pos += 4
        metadata[key] = value(kind, key in wanted)
    table = []
    for _ in range(n_tensors):
        name = string()
        (n_dims,) = struct.unpack_from("<I", mapped, pos)
        if not 1 <= n_dims <= 4:
            raise _Damaged(f"tensor {name} has {n_dims} dimensions")
        dims = struct.unpack_from(f"<{n_dims}Q", mapped, pos + 4)
        type_id, offset = struct.unpack_from("<IQ", mapped, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        table.append((name, tuple(reversed(dims)), type_id, offset))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    data_start = -(-pos // alignment) * alignment
    tensors = {}
    for name, shape, type_id, offset in table:
        if type_id not in GGML_TYPES:
            raise _Damaged(f"tensor {name} has unknown ggml type {type_id}")
        kind, per_block, block_bytes = GGML_TYPES[type_id]
        elements = int(np.prod(shape, dtype=np.int64))
        if shape[-1] % per_block:
            raise _Damaged(f"tensor {name}'s rows of {shape[-1]} do not fill {kind} blocks")
        nbytes = elements // per_block * block_bytes
        start = data_start + offset
        if start + nbytes > size:
            raise _Damaged(f"tensor {name} runs past the end of the file")
        tensors[name] = GgufTensor(name, kind, shape, start, nbytes)
    return GgufFile(path, version, metadata, tensors, size, mapped)
