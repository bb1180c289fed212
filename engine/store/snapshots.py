"""Prefilled-book KV snapshots on disk: save once, find by longest token prefix, load validated.

One safetensors file per snapshot holds the caller's tensors (e.g. per-layer K/V prefixes) plus
the token ids themselves (`__tokens__`, int32), so a prefix match is exact. The header metadata
carries the model key, the token count and sha256, and a manifest (dtype, shape, crc32 per
tensor). Files are written to a temp name and renamed, so a crash never leaves half a snapshot
under a real name; anything corrupt, truncated or mismatched is deleted and treated as absent.
Eviction is least-recently-used (file mtime = last use) once the folder exceeds `max_bytes`.
Temp files count against `max_bytes` too; a killed writer's (its pid gone) are removed at start.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import sys
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.store import paths
from engine.errors import StoreError
from engine.store.turns import pid_alive

log = logging.getLogger(__name__)

FORMAT = "triforce-kv-snapshot"
VERSION = "1"
TOKENS = "__tokens__"
SUFFIX = ".safetensors"
_HEADER_LIMIT = 100 * 2**20  # a header bigger than this is garbage, not a snapshot

_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    **{getattr(torch, n): c for n, c in (("uint16", "U16"), ("uint32", "U32"), ("uint64", "U64")) if hasattr(torch, n)},
}


@dataclass(frozen=True)
class SnapshotMatch:
    """A stored snapshot whose first `matched` tokens equal the query's first `matched` tokens."""

    path: Path
    model_key: str
    matched: int
    stored_tokens: int
    nbytes: int
    extra: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class SnapshotInfo:
    path: Path
    model_key: str
    tokens: int
    nbytes: int
    last_used: float  # unix seconds


class CorruptSnapshot(Exception):
    """Internal: a file that must not be loaded."""


class SnapshotStore:
    """A folder of snapshots bounded by `max_bytes` (default paths.SNAPSHOT_CACHE_BYTES, 20 GiB)."""

    def __init__(self, root: str | os.PathLike | None = None, max_bytes: int = paths.SNAPSHOT_CACHE_BYTES) -> None:
        if sys.byteorder != "little":
            raise RuntimeError("snapshots are stored little-endian; big-endian hosts are not supported")
        self.root = Path(root) if root is not None else paths.snapshot_dir()
        self.root.mkdir(parents=True, exist_ok=True)
        self._max_bytes = int(max_bytes)
        self._lock = threading.Lock()  # eviction and the header cache
        self._headers: dict[tuple[str, int, int], tuple[dict, torch.Tensor]] = {}
        self._remove_stale_temps()

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        """Change the cache size; evicts at once if the folder is now over it."""
        self._max_bytes = int(value)
        self.evict()

    # -- save -----------------------------------------------------------------------------------
    def save(self, model_key: str, tokens: Sequence[int], tensors: Mapping[str, torch.Tensor],
             extra: Mapping[str, object] | None = None) -> Path | None:
        """Store `tensors` as the state after prefilling `tokens` with model `model_key`.

        Tensors may live on any device and be views (one is copied to the CPU at a time).
        `extra` is JSON-able info returned with every match (e.g. dtype, layer count).
        Returns the file, or None (logged) when this snapshot alone exceeds max_bytes.
        Snapshots whose tokens are a prefix of these are deleted: this one serves all their matches.
        Raises StoreError if the disk is full or the folder not writable.
        """
        if not model_key:
            raise ValueError("model_key must be a non-empty string")
        token_ids = _token_tensor(tokens)
        if TOKENS in tensors:
            raise ValueError(f"{TOKENS!r} is reserved for the token ids")
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor) or t.dtype not in _DTYPES or t.layout != torch.strided:
                raise ValueError(f"tensor {name!r}: need a dense tensor of one of {sorted(_DTYPES.values())}")
        items = [(TOKENS, token_ids), *tensors.items()]
        nbytes = sum(t.numel() * t.element_size() for _, t in items)
        if nbytes > self._max_bytes:
            log.warning("snapshot of %d tokens is %.1f GiB, over the %.1f GiB snapshot cache: not saved",
                        len(token_ids), nbytes / 2**30, self._max_bytes / 2**30)
            return None
        tokens_sha = _tokens_sha256(token_ids)
        target = self.root / (hashlib.sha256(f"{model_key}\0{tokens_sha}".encode()).hexdigest()[:32] + SUFFIX)
        meta = {"format": FORMAT, "version": VERSION, "model_key": model_key, "n_tokens": str(len(token_ids)),
                "tokens_sha256": tokens_sha, "created": str(time.time()), "extra": json.dumps(dict(extra or {}))}
        temp = self.root / f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        self.evict(max_bytes=self._max_bytes - nbytes)  # room first: the temp file counts against the cap
        try:
            with open(temp, "wb") as fh:
                _write_safetensors(fh, items, meta)
                fh.flush()
                os.fsync(fh.fileno())  # the rename must never expose a file whose bytes are not on disk
            os.replace(temp, target)
        except OSError as exc:
            _drop_temp(temp)
            raise StoreError(f"Cannot save the prefilled-book snapshot in {self.root} ({exc.strerror or exc}). "
                             "Free disk space, lower the snapshot cache size (the app's settings) or turn "
                             "snapshots off (--no-snapshot).") from exc
        except BaseException:
            _drop_temp(temp)
            raise
        self._drop_prefixes_of(model_key, token_ids, keep=target)
        self.evict(keep=target)
        return target

    # -- find -----------------------------------------------------------------------------------
    def find(self, model_key: str, tokens: Sequence[int], min_tokens: int = 1) -> SnapshotMatch | None:
        """The snapshot of `model_key` sharing the longest token prefix with `tokens` (at least min_tokens).

        Ties go to the smaller file (cheaper to load). Reads only headers and token ids, never the KV.
        """
        query = torch.as_tensor(list(tokens), dtype=torch.int64)
        best: SnapshotMatch | None = None
        for path in self._files():
            try:
                meta, stored = self._header_and_tokens(path)
            except FileNotFoundError:
                continue  # evicted or replaced meanwhile
            except CorruptSnapshot as exc:
                self._discard(path, str(exc))
                continue
            if meta["model_key"] != model_key:
                continue
            matched = _common_prefix(stored, query)
            if matched < max(min_tokens, 1):
                continue
            size = path.stat().st_size if path.exists() else 0
            candidate = SnapshotMatch(path, model_key, matched, len(stored), size, json.loads(meta["extra"]))
            if best is None or (matched, -size) > (best.matched, -best.nbytes):
                best = candidate
        return best

    # -- load -----------------------------------------------------------------------------------
    def load(self, match: SnapshotMatch, verify: bool = True) -> tuple[list[int], dict[str, torch.Tensor]] | None:
        """Read a found snapshot onto the CPU, validated: model key, token hash, manifest shapes
        and dtypes, and (verify=True) each tensor's crc32. An invalid file is deleted (logged) and
        None returned: treat it as no snapshot. The caller trims tensors to `match.matched` tokens.
        """
        from safetensors import SafetensorError, safe_open

        try:
            meta, _ = _read_header(match.path)
            if meta["model_key"] != match.model_key:
                raise CorruptSnapshot(f"model key {meta['model_key']!r}, expected {match.model_key!r}")
            manifest = json.loads(meta["manifest"])
            with safe_open(match.path, framework="pt", device="cpu") as f:
                if set(f.keys()) != set(manifest):
                    raise CorruptSnapshot("tensor names differ from the manifest")
                tensors = {}
                for name, spec in manifest.items():
                    t = f.get_tensor(name)  # one copy: from the mapped file into the tensor
                    if _DTYPES.get(t.dtype) != spec["dtype"] or list(t.shape) != spec["shape"]:
                        raise CorruptSnapshot(f"tensor {name!r} is {t.dtype}{list(t.shape)}, manifest says "
                                              f"{spec['dtype']}{spec['shape']}")
                    if verify and f"{_crc32(t):08x}" != spec["crc32"]:
                        raise CorruptSnapshot(f"tensor {name!r} fails its checksum")
                    tensors[name] = t
            token_ids = tensors.pop(TOKENS)
            if len(token_ids) != int(meta["n_tokens"]) or _tokens_sha256(token_ids) != meta["tokens_sha256"]:
                raise CorruptSnapshot("token ids do not match their recorded hash")
        except FileNotFoundError:
            return None
        except (CorruptSnapshot, SafetensorError, OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            self._discard(match.path, f"{type(exc).__name__}: {exc}")
            return None
        _touch(match.path)
        return token_ids.tolist(), tensors

    # -- housekeeping ---------------------------------------------------------------------------
    def entries(self) -> list[SnapshotInfo]:
        """Valid-looking snapshots, most recently used first."""
        out = []
        for path in self._files():
            try:
                meta, stored = self._header_and_tokens(path)
                st = path.stat()
            except (FileNotFoundError, CorruptSnapshot):
                continue
            out.append(SnapshotInfo(path, meta["model_key"], len(stored), st.st_size, st.st_mtime))
        return sorted(out, key=lambda e: e.last_used, reverse=True)

    def total_bytes(self) -> int:
        """Bytes of all snapshot files in the folder, temp files of saves in progress included."""
        return sum(size for _, size, _ in self._stats()) + sum(size for _, size in self._temps())

    def evict(self, max_bytes: int | None = None, keep: Path | None = None) -> int:
        """Delete least-recently-used snapshots until the folder fits `max_bytes`; returns bytes freed."""
        limit = self._max_bytes if max_bytes is None else max_bytes
        freed = 0
        with self._lock:
            self._remove_stale_temps()
            stats = sorted(self._stats(), key=lambda s: s[2])  # oldest use first
            # saves in progress (ours or another process's) use disk too, and cannot be evicted
            total = sum(size for _, size, _ in stats) + sum(size for _, size in self._temps())
            for path, size, _ in stats:
                if total <= limit:
                    break
                if path == keep:
                    continue
                if _unlink(path):
                    total -= size
                    freed += size
        return freed

    def clear(self) -> None:
        """Delete every snapshot."""
        self.evict(max_bytes=-1)

    def delete(self, path: Path) -> None:
        _unlink(path)

    # -- internals ------------------------------------------------------------------------------
    def _files(self) -> list[Path]:
        return [p for p in self.root.glob("*" + SUFFIX) if not p.name.startswith(".")]

    def _stats(self) -> list[tuple[Path, int, float]]:
        out = []
        for path in self._files():
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            out.append((path, st.st_size, st.st_mtime))
        return out

    def _header_and_tokens(self, path: Path) -> tuple[dict, torch.Tensor]:
        st = path.stat()
        key = (path.name, st.st_ino, st.st_size)  # a rewrite (os.replace) changes the inode
        cached = self._headers.get(key)
        if cached is None:
            meta, offsets = _read_header(path)
            begin, end = offsets[TOKENS]
            with open(path, "rb") as fh:
                fh.seek(begin)
                raw = fh.read(end - begin)
            if len(raw) != end - begin:
                raise CorruptSnapshot("truncated token ids")
            cached = (meta, torch.frombuffer(bytearray(raw), dtype=torch.int32) if raw else torch.empty(0, dtype=torch.int32))
            with self._lock:
                for old in [k for k in self._headers if k[0] == path.name]:
                    del self._headers[old]
                self._headers[key] = cached
        return cached

    def _drop_prefixes_of(self, model_key: str, token_ids: torch.Tensor, keep: Path) -> None:
        for path in self._files():
            if path == keep:
                continue
            try:
                meta, stored = self._header_and_tokens(path)
            except (FileNotFoundError, CorruptSnapshot):
                continue
            if meta["model_key"] == model_key and len(stored) < len(token_ids) \
                    and _common_prefix(stored, token_ids) == len(stored):
                _unlink(path)

    def _discard(self, path: Path, why: str) -> None:
        log.warning("deleting invalid KV snapshot %s: %s", path.name, why)
        _unlink(path)

    def _temps(self) -> list[tuple[Path, int]]:
        """(path, bytes) of the temp files of saves in progress."""
        out = []
        for temp in self.root.glob(".*.tmp"):
            try:
                out.append((temp, temp.stat().st_size))
            except FileNotFoundError:
                continue  # renamed into place or removed meanwhile
        return out

    def _remove_stale_temps(self) -> int:
        """Delete temp files whose writer is gone (a kill mid-save); returns how many went. A temp
        of a live process (another instance saving right now) stays, unless a day old."""
        removed = 0
        for temp, _ in self._temps():
            writer = _temp_writer_pid(temp)
            try:
                if writer is None or not pid_alive(writer) or time.time() - temp.stat().st_mtime > 86400:
                    temp.unlink()
                    removed += 1
            except OSError:
                pass
        return removed


def _temp_writer_pid(temp: Path) -> int | None:
    # ".<name>.safetensors.<pid>.<thread id>.tmp"
    parts = temp.name.split(".")
    return int(parts[-3]) if len(parts) >= 4 and parts[-3].isdigit() else None


def _token_tensor(tokens: Sequence[int]) -> torch.Tensor:
    ids = torch.as_tensor(list(tokens), dtype=torch.int64)
    if ids.ndim != 1 or len(ids) == 0:
        raise ValueError("tokens must be a non-empty sequence of ints")
    if int(ids.min()) < 0 or int(ids.max()) >= 2**31:
        raise ValueError("token ids must be in [0, 2**31)")
    return ids.to(torch.int32)


def _tokens_sha256(token_ids: torch.Tensor) -> str:
    return hashlib.sha256(token_ids.to(torch.int32).contiguous().numpy().tobytes()).hexdigest()


def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = (a[:n].to(torch.int64) != b[:n].to(torch.int64)).nonzero()
    return int(diff[0]) if len(diff) else n


def _bytes_view(t: torch.Tensor):
    """The tensor's bytes as a numpy uint8 array, without a copy for contiguous CPU tensors."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


def _crc32(t: torch.Tensor) -> int:
    return zlib.crc32(_bytes_view(t)) if t.numel() else 0


def _write_safetensors(fh, items: list[tuple[str, torch.Tensor]], meta: dict[str, str]) -> None:
    """Stream tensors into the safetensors layout one at a time (no whole-file copy in memory).

    The header goes first but the crc32s are known only after the data, so it is written with
    zeroed checksums of the same width and rewritten in place at the end.
    """
    # Larger items first keeps every tensor aligned to its element size (the header is 8-aligned).
    items = sorted(items, key=lambda kv: (-kv[1].element_size(), kv[0]))
    specs, offset = {}, 0
    for name, t in items:
        size = t.numel() * t.element_size()
        specs[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size

    def header(crcs: dict[str, int]) -> bytes:
        manifest = {n: {"dtype": s["dtype"], "shape": s["shape"], "crc32": f"{crcs.get(n, 0):08x}"}
                    for n, s in specs.items()}
        body = json.dumps({"__metadata__": {**meta, "manifest": json.dumps(manifest)}, **specs},
                          separators=(",", ":")).encode()
        body += b" " * (-len(body) % 8)
        return struct.pack("<Q", len(body)) + body

    first = header({})
    fh.write(first)
    crcs = {}
    for name, t in items:
        if t.numel():
            data = _bytes_view(t)  # per tensor: at most one CPU copy alive at a time
            crcs[name] = zlib.crc32(data)
            fh.write(memoryview(data))
    final = header(crcs)
    assert len(final) == len(first)
    fh.seek(0)
    fh.write(final)


def _read_header(path: Path) -> tuple[dict, dict[str, tuple[int, int]]]:
    """Parse and check a snapshot's header: (metadata, absolute byte ranges by tensor name)."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) < 8:
            raise CorruptSnapshot("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if length > _HEADER_LIMIT:
            raise CorruptSnapshot("header length is implausible")
        body = fh.read(length)
        size = os.fstat(fh.fileno()).st_size
    try:
        header = json.loads(body)
        meta = header.pop("__metadata__")
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise CorruptSnapshot(f"not a v{VERSION} snapshot")
        for key in ("model_key", "n_tokens", "tokens_sha256", "manifest", "extra"):
            if not isinstance(meta.get(key), str):
                raise CorruptSnapshot(f"metadata lacks {key}")
        start = 8 + length
        offsets = {name: (start + spec["data_offsets"][0], start + spec["data_offsets"][1])
                   for name, spec in header.items()}
        manifest = json.loads(meta["manifest"])
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise CorruptSnapshot(f"unreadable header ({exc})") from None
    if TOKENS not in offsets or set(offsets) != set(manifest):
        raise CorruptSnapshot("tensors do not match the manifest")
    if max((end for _, end in offsets.values()), default=8 + length) != size:
        raise CorruptSnapshot(f"file is {size} bytes, header describes {max(e for _, e in offsets.values())}")
    return meta, offsets


def _touch(path: Path) -> None:
    try:
        os.utime(path)  # mtime = last use, for LRU eviction
    except OSError:
        pass


def _drop_temp(temp: Path) -> None:
    # after a failed save: on a full or read-only disk removing the temp file may fail too, and
    # must not hide why the save failed (a stale temp is removed at the next start)
    try:
        temp.unlink(missing_ok=True)
    except OSError:
        pass


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:  # e.g. still open by a reader on Windows; try again at the next eviction
        log.warning("could not delete snapshot %s: %s", path.name, exc)
        return False
