"""The CPU kernels in kernels.c, compiled on first use with the machine's C compiler and loaded
with ctypes; None where no compiler works (the torch paths then run instead).

Why our own kernels: on a 2-core CPU, torch's int4 kernel and the batch-invariant attention built
from torch ops cost a verification forward about twice a one-token step, which is what decides
whether speculation pays. kernels.c reads each weight block and each key once for all the rows of
a forward, in one pass, with every reduction fixed by the row's own inputs (row-invariant by
construction, no probing). The library is built with -march=native for this CPU into the kernel
cache (TRIFORCE_KERNEL_DIR, else the user cache folder), named by a hash of the source, the
compiler and the CPU, so a changed source or another machine builds its own. TRIFORCE_NATIVE=0
turns the kernels off (the torch paths run, a different target: its snapshots are kept apart).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import platformdirs
import torch  # loads torch's libgomp first: the kernels then share its OpenMP runtime and threads

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels.c")
VERSION = 11  # triforce_kernels_version() of the source this module speaks to
# kernels.c's kind codes: 6 a 32-weight 4-bit kind repacked (repack_q4); the others read the file's
# blocks as stored; STACKED_CODE a projection stacked from parts of several kinds (StackedBlocks)
KIND_CODES = {"Q4_0": 6, "Q4_1": 6, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q5_0": 20, "Q5_1": 21}
STORED_Q4_CODES = {"Q4_0": 22, "Q4_1": 23}  # Q4_0 / Q4_1 read as stored (not repacked)
STACKED_CODE = 1
DRAFT_INT16_CODES = (6, 12, 13, 14, 20, 21, 22, 23)  # kinds with an int16-activation matmul (a drafter's)
MAX_PARTS = 4  # parts a StackedBlocks holds (kernels.c StackedWeight)
_FILE_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}
MAX_DIM = 256  # head sizes the attention kernel takes (a multiple of 8)
BLOCK_KEYS = 32  # keys per block in kernels.c: the buffers it reads hold whole blocks
BUILD_TIMEOUT_S = 600  # a build takes seconds of CPU, but minutes of wall time on a busy machine
_FLAGS = (["-O3", "-march=native", "-fopenmp"], ["-O3", "-fopenmp"], ["-O3"])  # tried in order
_lock = threading.Lock()
_loaded: list[ctypes.CDLL | None] = []  # [] until the first call: built and loaded once per process


def enabled() -> bool:
    """False when TRIFORCE_NATIVE=0 asks for the torch paths."""
    return os.environ.get("TRIFORCE_NATIVE", "1") != "0"


def _cache_dir() -> Path:
    env = os.environ.get("TRIFORCE_KERNEL_DIR")
    return Path(env).expanduser() if env else Path(platformdirs.user_cache_dir("TriForceChat", appauthor=False)) / "kernels"


def _cpu_id() -> str:
    """What -march=native builds for: the CPU's model and feature flags (Linux), else the platform."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        keep = [line for line in text.splitlines() if line.startswith(("model name", "flags", "Features"))]
        return "\n".join(dict.fromkeys(keep))
    except OSError:
        return platform.processor() + platform.machine()


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build(compiler: str, target: Path, flags: list[str]) -> bool:
    """Compile kernels.c into `target`; whether it was built."""
    return not _compile(compiler, target, flags)


def _compile(compiler: str, target: Path, flags: list[str]) -> str:
    """Compile into a temporary file, then rename: another process never loads a half-written one.
    Returns "" when built, else what went wrong (the compiler's last words)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    cmd = [compiler, *flags, "-shared", "-fPIC", "-o", str(tmp), str(SOURCE), "-lm"]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("native kernels: %s failed (%s)", " ".join(cmd), exc)
        tmp.unlink(missing_ok=True)
        return f"{Path(compiler).name} failed ({exc})"
    if result.returncode != 0:
        log.debug("native kernels: %s failed: %s", " ".join(cmd), result.stderr.strip()[-500:])
        tmp.unlink(missing_ok=True)
        lines = result.stderr.strip().splitlines()
        return f"{Path(compiler).name} {' '.join(flags)} failed: {lines[-1][-160:] if lines else result.returncode}"
    os.replace(tmp, target)
    return ""


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    i64, ptr, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.triforce_block_matmul.argtypes = [i32, ptr, i64, i64, ptr, i64, ptr, i32]
    lib.triforce_block_matmul.restype = i32
    lib.triforce_block_matmul_q16a.argtypes = [ptr, i64, i64, ptr, i64, ptr, i32]
    lib.triforce_block_matmul_q16a.restype = i32
    lib.triforce_block_matmul_draft.argtypes = [i32, ptr, i64, i64, ptr, i64, ptr, i32]
    lib.triforce_block_matmul_draft.restype = i32
    lib.triforce_dequantize.argtypes = [i32, ptr, i64, i64, ptr, i32]
    lib.triforce_dequantize.restype = i32
    lib.triforce_attention.argtypes = [ptr, ptr, ptr, i32, i64, i64, i64, i64, i64, i64, ctypes.c_float, ptr, i32]
    lib.triforce_attention.restype = i32
    lib.triforce_prefill_attention.argtypes = [ptr, ptr, ptr, i32, i64, i64, i64, i64, i64, i64, ctypes.c_float,
                                               ptr, i32]
    lib.triforce_prefill_attention.restype = i32
    lib.triforce_rms_norm.argtypes = [ptr, ptr, i64, i64, ctypes.c_float, ptr]
    lib.triforce_rope.argtypes = [ptr, i64, i64, ptr, ptr, i64, i64, i64, ptr]
    lib.triforce_silu_mul.argtypes = [ptr, i64, i64, ptr]
    lib.triforce_layer_scratch.argtypes = [i64] * 6
    lib.triforce_layer_scratch.restype = i64
    f32 = ctypes.c_float
    lib.triforce_layer.argtypes = [i32, ptr, i64, i64, f32, ptr, ptr, i32, ptr, i32, ptr, i32, ptr, i32, ptr,
                                   i64, i64, i64, i64, ptr, ptr, ptr, ptr, i32, i64, i64, f32, ptr, i32]
    lib.triforce_layer.restype = i32
    lib.triforce_to_half.argtypes = [ptr, i64, ptr]
    lib.triforce_to_half.restype = None
    for name in ("triforce_rms_norm", "triforce_rope", "triforce_silu_mul"):
        getattr(lib, name).restype = None
    return lib


def _try_load() -> tuple[ctypes.CDLL | None, str]:
    """The kernels built (or found in the cache) and loaded, or None and why not."""
    compiler = _compiler()
    if compiler is None:
        return None, "no C compiler found (set CC)"
    if not SOURCE.is_file():
        return None, f"{SOURCE} is missing"
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{compiler} does not run ({exc})"
    source = SOURCE.read_bytes()
    reason = "the build failed"
    for flags in _FLAGS:
        key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), version.encode(),
                                         _cpu_id().encode(), platform.machine().encode()])).hexdigest()[:16]
        target = _cache_dir() / f"triforce-kernels-{key}{'.dll' if os.name == 'nt' else '.so'}"
        try:
            if not target.is_file():
                failed = _compile(compiler, target, flags)
                if failed:
                    reason = failed
                    continue
            lib = ctypes.CDLL(str(target))
            if lib.triforce_kernels_version() != VERSION:
                reason = f"{target} is another version"
                continue
            return _declare(lib), ""
        except (OSError, AttributeError) as exc:  # unwritable cache, a library that does not load or lacks a symbol
            reason = f"{target} could not be built or loaded ({exc})"
            log.debug("native kernels: %s", reason)
    return None, reason


def _load() -> ctypes.CDLL | None:
    """_try_load, and one log line where the kernels do not run: nothing that goes wrong here
    reaches the caller (the torch paths then run)."""
    try:
        lib, reason = _try_load()
    except Exception as exc:  # noqa: BLE001 - an unforeseen failure must not stop the engine either
        lib, reason = None, f"{type(exc).__name__}: {exc}"
    if lib is None:
        log.warning("native kernels unavailable (%s): the slower torch paths run", reason)
    return lib


def _kernels() -> ctypes.CDLL | None:
    if _loaded:  # ~360 calls per forward: no lock once loaded (the list is only ever appended once)
        return _loaded[0]
    with _lock:
        if not _loaded:
            _loaded.append(_load())
        return _loaded[0]


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (disabled, no compiler, or the build failed): built at most once
    per process, in about a second. Callers decide with this (or available()) once per object; the
    functions below run whatever was decided, even if TRIFORCE_NATIVE changes later."""
    return _kernels() if enabled() else None


def available() -> bool:
    """Whether the native kernels run in this process."""
    return library() is not None


def attention_supports(head_dim: int, buffer_positions: int) -> bool:
    """Whether attention() takes buffers of this head size and length (and runs here)."""
    return head_dim % 8 == 0 and head_dim <= MAX_DIM and buffer_positions % BLOCK_KEYS == 0 and available()


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()  # x.data_ptr() of a view is where its first element is (offset included)


GROUP_BLOCKS = 4  # a repacked 4-bit row's blocks come in groups of four (kernels.c GROUP_BLOCKS)


def repack_q4(kind: str, blocks: np.ndarray) -> np.ndarray:
    """Q4_0 / Q4_1 blocks [out, nb * 18 or 20] uint8 -> [out, nb * 24]: per group of four blocks
    (a row's last group may hold 1-3) their d and m as float32 (Q4_0's m = -8 d, exact: a power of
    two), then the same 16 bytes of nibbles of each. The float kernel reads each block's scales as
    they are, where it converted two halves and broadcast them (a quarter of a 1-token matmul of the
    bundled model's layers), and its products keep their bits; the int16-activation kernel reads a
    group's nibbles and its scales in one load each."""
    out = blocks.shape[0]
    raw = np.ascontiguousarray(blocks).reshape(out, -1, _FILE_BLOCK_BYTES[kind])  # [out, nb, bytes]
    nb = raw.shape[1]
    d = raw[..., 0:2].copy().view(np.float16).astype(np.float32)[..., 0]  # [out, nb]
    m = raw[..., 2:4].copy().view(np.float16).astype(np.float32)[..., 0] if kind == "Q4_1" \
        else np.float32(-8.0) * d
    packed = np.empty((out, nb * 24), dtype=np.uint8)
    for first in range(0, nb, GROUP_BLOCKS):
        n = min(GROUP_BLOCKS, nb - first)
        group = packed[:, first * 24:(first + n) * 24]
        group[:, :4 * n] = d[:, first:first + n].view(np.uint8).reshape(out, -1)
        group[:, 4 * n:8 * n] = m[:, first:first + n].view(np.uint8).reshape(out, -1)
        group[:, 8 * n:] = raw[:, first:first + n, -16:].reshape(out, -1)
    return packed


def dequantize_stored(kind: str, blocks: np.ndarray, in_features: int) -> torch.Tensor | None:
    """A stored kind's blocks [out, in / weights per block * block bytes] uint8 -> float32 [out, in],
    gguf's dequantize bit for bit, in one threaded pass; None for a kind the kernels do not read as
    stored (the caller's torch path runs)."""
    code = STORED_Q4_CODES.get(kind, KIND_CODES.get(kind))
    if code is None or code in (6, 8):
        return None
    blocks = np.ascontiguousarray(blocks)
    y = torch.empty(blocks.shape[0], in_features, dtype=torch.float32)
    rc = _kernels().triforce_dequantize(code, blocks.ctypes.data, blocks.shape[0], in_features, y.data_ptr(),
                                        torch.get_num_threads())
    if rc:
        raise ValueError(f"dequantize rejected {kind} blocks {blocks.shape} of {in_features} weights a row ({rc})")
    return y


class BlockMatrix:
    """A weight kept as the file's own GGUF blocks for block_matmul: the array [out, in / 32 *
    block bytes] uint8 (C-contiguous, held here so its memory stays put; 4-bit kinds repacked,
    repack_q4) and what a call needs, looked up once (a numpy array's .ctypes costs ~3 us, a matmul
    call ~40)."""

    __slots__ = ("array", "code", "pointer", "out")

    def __init__(self, kind: str, blocks: np.ndarray, as_stored: bool = False) -> None:
        """as_stored: Q4_0 / Q4_1 read as the file stores them (no repacked copy: the same weights
        and, on CPUs without AVX-512, the same bits; a little slower a block)."""
        # Q8_0 and the K / 5-bit kinds are read as stored: a C-contiguous (maybe read-only, memory-
        # mapped) array is used in place, never copied
        repack = kind in _FILE_BLOCK_BYTES and not as_stored
        self.array = repack_q4(kind, blocks) if repack else np.ascontiguousarray(blocks)
        code = STORED_Q4_CODES[kind] if kind in STORED_Q4_CODES and as_stored else KIND_CODES[kind]
        self.code, self.pointer, self.out = code, self.array.ctypes.data, self.array.shape[0]

    def _operands(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x made contiguous, and the output y [T, out] float32 a kernel writes."""
        x = x if x.is_contiguous() else x.contiguous()
        return x, torch.empty(x.shape[0], self.out, dtype=torch.float32)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] float32 @ W.T -> [T, out] float32."""
        x, y = self._operands(x)
        rc = _kernels().triforce_block_matmul(self.code, self.pointer, self.out, x.shape[1], x.data_ptr(),
                                              x.shape[0], y.data_ptr(), torch.get_num_threads())
        if rc:
            raise MemoryError(f"block matmul of x {tuple(x.shape)} failed ({rc})")
        return y

    @property
    def nbytes(self) -> int:
        """Bytes the kernel reads per forward (the repacked or stored blocks)."""
        return int(self.array.nbytes)

    @property
    def drafts_int16(self) -> bool:
        """Whether matmul_int16 runs an int16-activation kernel (every kind but Q8_0)."""
        return self.code in DRAFT_INT16_CODES

    def matmul_int16(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] float32 @ W.T -> [T, out] float32 with x quantized to int16 per 32 elements
        (within ~1e-5 of the float product, cheaper): a drafter's approximation of matmul, except
        for the K kinds, whose matmul is this product. Q8_0 weights (and Q8_0 parts of a stack)
        run matmul."""
        if not self.drafts_int16:
            return self.matmul(x)
        x, y = self._operands(x)
        rc = _kernels().triforce_block_matmul_draft(self.code, self.pointer, self.out, x.shape[1], x.data_ptr(),
                                                    x.shape[0], y.data_ptr(), torch.get_num_threads())
        if rc:
            raise ValueError(f"int16-activation matmul rejected x {tuple(x.shape)} ({rc})")
        return y


class _StackedWeight(ctypes.Structure):
    _fields_ = [("parts", ctypes.c_int64), ("kinds", ctypes.c_int64 * MAX_PARTS),
                ("blocks", ctypes.c_void_p * MAX_PARTS), ("rows", ctypes.c_int64 * MAX_PARTS),
                ("cols", ctypes.c_void_p * MAX_PARTS)]


class StackedBlocks(BlockMatrix):
    """A projection stacked along `out` from parts, each the file's own tensor where it lies (q | k |
    v, gate | up: nothing concatenated) and of its own kind (a Q4_K_M file's v in Q6_K beside q and k
    in Q4_K): one kernel call computes each part's rows with its own kind's kernel into its columns.
    cols[i] (int32 [rows of part i], or None) is the column among part i's own that each of its rows
    goes to: a Llama's Q and K, stored by llama.cpp in another row order than the model's, run as
    stored. `array` is the descriptor kernels.c reads; the parts (and cols) stay alive here."""

    __slots__ = ("parts", "cols")

    def __init__(self, parts: list[BlockMatrix], cols: list[np.ndarray | None] | None = None) -> None:
        if not 1 <= len(parts) <= MAX_PARTS or any(p.code == STACKED_CODE for p in parts):
            raise ValueError(f"StackedBlocks takes 1-{MAX_PARTS} single-kind parts, not {len(parts)}")
        cols = list(cols) if cols is not None else [None] * len(parts)
        self.cols = [None if c is None else np.ascontiguousarray(c, dtype=np.int32) for c in cols]
        for part, col in zip(parts, self.cols):
            if col is not None and (col.shape != (part.out,) or not np.array_equal(np.sort(col), np.arange(part.out))):
                raise ValueError("StackedBlocks: a part's cols must be a permutation of its rows")
        self.parts = parts
        desc = _StackedWeight(len(parts))
        for i, (part, col) in enumerate(zip(parts, self.cols)):
            desc.kinds[i], desc.blocks[i], desc.rows[i] = part.code, part.pointer, part.out
            desc.cols[i] = None if col is None else col.ctypes.data
        self.array = desc
        self.code, self.pointer, self.out = STACKED_CODE, ctypes.addressof(desc), sum(p.out for p in parts)

    @property
    def nbytes(self) -> int:
        return sum(int(p.array.nbytes) for p in self.parts)

    @property
    def drafts_int16(self) -> bool:
        """Whether some part runs an int16-activation kernel in matmul_int16."""
        return any(p.drafts_int16 for p in self.parts)


def block_matmul(kind: str, blocks: np.ndarray, x: torch.Tensor) -> torch.Tensor:
    """x [T, in] float32 @ W.T -> [T, out] float32, W the file's own GGUF blocks as stored: blocks
    [out, in / weights per block * block bytes] uint8 (any kind in KIND_CODES). One-off calls; a
    model keeps BlockMatrix."""
    return BlockMatrix(kind, blocks).matmul(x)


KV_DTYPES = (torch.float32, torch.float16)  # what attention() reads


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, total: int) -> torch.Tensor:
    """q [Hq, T, D] float32 (the last T of `total` positions), keys/values [Hkv, cap, D] float32 or
    float16 contiguous buffers holding `total` positions -> [Hq, T, D] float32: causal GQA,
    row-invariant (float16 K/V are widened to float32 in the kernel)."""
    lib = _kernels()
    q = q.contiguous()
    n_heads, n_tokens, dim = q.shape
    if not (keys.is_contiguous() and values.is_contiguous()) or keys.dtype not in KV_DTYPES \
            or values.dtype != keys.dtype:
        raise ValueError("native attention reads contiguous [Hkv, cap, D] float32 or float16 buffers")
    out = torch.empty_like(q)
    half = int(keys.dtype == torch.float16)
    rc = lib.triforce_attention(_ptr(q), _ptr(keys), _ptr(values), half, keys.shape[1], n_heads, keys.shape[0],
                                n_tokens, dim, total, dim ** -0.5, _ptr(out), torch.get_num_threads())
    if rc:
        raise ValueError(f"native attention rejected q {tuple(q.shape)}, K/V {tuple(keys.shape)}, total {total} ({rc})")
    return out


def prefill_attention_supports(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether prefill_attention() takes these operands (and runs here): CPU float32 queries, float32
    or float16 K/V of one dtype whose positions are contiguous rows, a head size a multiple of 8."""
    dim = q.shape[-1]
    return (q.device.type == "cpu" and q.dtype == torch.float32 and keys.device.type == "cpu"
            and keys.dtype in KV_DTYPES and values.dtype == keys.dtype and dim % 8 == 0 and dim <= MAX_DIM
            and keys.stride()[1:] == (dim, 1) and values.stride() == keys.stride() and available())


def prefill_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """q [Hq, T, D] float32 (the last T of S positions), keys/values [Hkv, S, D] (views of any
    buffer whose positions are contiguous rows: head stride free) -> [Hq, T, D] float32: causal GQA
    through kernels.c's blocked prefill kernel (both threads, float16 K/V widened in the kernel).
    A row's bits depend only on its own query and keys, never on the rows or heads sharing the call."""
    lib = _kernels()
    q = q.contiguous()
    n_heads, n_tokens, dim = q.shape
    n_kv, total = keys.shape[0], keys.shape[1]
    out = torch.empty_like(q)
    half = int(keys.dtype == torch.float16)
    rc = lib.triforce_prefill_attention(_ptr(q), _ptr(keys), _ptr(values), half, keys.stride(0), n_heads, n_kv,
                                        n_tokens, dim, total, dim ** -0.5, _ptr(out), torch.get_num_threads())
    if rc:
        raise ValueError(f"native prefill attention rejected q {tuple(q.shape)}, K/V {tuple(keys.shape)} ({rc})")
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama RMSNorm of x [T, H] float32 with weight [H] float32, in one call."""
    x = x.contiguous()
    y = torch.empty_like(x)
    _kernels().triforce_rms_norm(_ptr(x), _ptr(weight), x.shape[0], x.shape[1], eps, _ptr(y))
    return y


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """engine.kv.rope.rotate in one call: x [H, T, D] float32 (any strides with unit stride along D),
    cos/sin [T, D] float32 -> [H, T, D] contiguous."""
    n_heads, n_tokens, dim = x.shape
    if x.stride(2) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(n_heads, n_tokens, dim, dtype=torch.float32)
    _kernels().triforce_rope(_ptr(x), x.stride(0), x.stride(1), _ptr(cos), _ptr(sin), n_heads, n_tokens, dim, _ptr(out))
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [T, 2I] float32 = [gate | up] -> [T, I], in one call."""
    gate_up = gate_up.contiguous()
    n_tokens, width = gate_up.shape
    out = torch.empty(n_tokens, width // 2, dtype=torch.float32)
    _kernels().triforce_silu_mul(_ptr(gate_up), n_tokens, width // 2, _ptr(out))
    return out
