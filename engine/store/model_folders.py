"""A model folder on disk: what a resolved spec is, and the checks and hashes every source shares
(the bundled GGUF, other GGUFs, the Hugging Face hub, a local folder: engine/store/models.py)."""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import Cancelled, ModelFormatError

Progress = Callable[[str, float | None], None]
Cancel = Callable[[], bool]

WEIGHTS_STAMP = "triforce-weights.json"  # cached weights hash, next to the weights
ORIGIN_FILE = "triforce-origin.json"  # what a converted folder was made from
TMP_PREFIX = ".tmp-"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
# owner/name as the hub allows them; anything else cannot be a repo id
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
SPEC_HELP = (
    "pass 'bundled', a preset name (see `main.py models`), a Hugging Face repo id like "
    "'HuggingFaceTB/SmolLM2-360M-Instruct', a local folder with config.json + *.safetensors, or a .gguf file"
)


class ResolveCancelled(Cancelled):
    """The caller's `cancel()` returned True; nothing half-written was left behind."""


@dataclass(frozen=True)
class ModelFolder:
    """A model ready to load: config.json + *.safetensors + tokenizer files in `path`."""

    path: Path
    name: str  # for people
    model_id: str  # stable id for caches (repo id, folder name, gguf stem)
    weights_hash: str  # sha256 over the weights files' content
    source: str  # "bundled" | "hub" | "folder" | "gguf"


@dataclass(frozen=True)
class LocalModel:
    """A model found in a local cache (listing only: no hashing, no validation beyond files present)."""

    name: str
    model_id: str
    path: Path
    source: str  # "bundled" | "gguf" | "hub" | "folder"
    model_type: str
    size_bytes: int
    # GGUF files only (path is then the .gguf): its block kinds and what a CPU run needs
    kinds: str = ""  # "Q4_K 60%, Q6_K 40%"
    runs: str = ""  # "every kind runs natively" / "... widened to float32"
    widened: tuple[str, ...] = ()  # kinds widened to float32 at load
    ram_bytes: int = 0  # mapped file + widened tensors + K/V at `context` tokens
    context: int = 0


# ---------------------------------------------------------------- folders and hashing


def folder_model(path: Path, source: str, model_id: str, name: str) -> ModelFolder:
    missing = _missing_parts(path)
    if missing:
        raise ModelFormatError(f"{path} is not a model folder we can load: it has no {' and no '.join(missing)}")
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{path / 'config.json'} is not valid JSON ({exc})") from None
    return ModelFolder(path=path, name=name, model_id=model_id, weights_hash=folder_weights_hash(path), source=source)


def _missing_parts(path: Path) -> list[str]:
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not weight_files(path):
        missing.append("*.safetensors weights (convert .bin checkpoints to safetensors first)")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        missing.append("tokenizer files (tokenizer.json or tokenizer.model)")
    return missing


def is_complete(path: Path) -> bool:
    return path.is_dir() and not _missing_parts(path)


def weight_files(path: Path) -> list[Path]:
    return sorted(p for p in path.glob("*.safetensors") if p.is_file())


def folder_weights_hash(path: Path) -> str:
    """sha256 over each weights file's name and sha256; cached next to them, keyed by size and mtime."""
    files = weight_files(path)
    # stat() follows symlinks, so HF cache snapshots (links to blobs) are keyed by the blobs
    key = {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in files}
    stamp = path / WEIGHTS_STAMP
    cached = read_json(stamp) or {}
    if cached.get("format") == 2 and cached.get("files") == key and isinstance(cached.get("sha256"), str):
        return cached["sha256"]
    blob_names = {f.name: _blob_sha256(f) for f in files}
    hashes = {f.name: blob_names[f.name] or sha256_file(f) for f in files}
    digest = hashlib.sha256("".join(f"{name}\0{h}\n" for name, h in hashes.items()).encode()).hexdigest()
    if None in blob_names.values():  # we had to read the weights: remember the result
        write_json_atomic(stamp, {"format": 2, "files": key, "sha256": digest})
    return digest


def _blob_sha256(path: Path) -> str | None:
    """The HF cache names an LFS blob by its sha256: use that instead of reading gigabytes
    (and instead of writing a stamp into someone else's cache)."""
    if path.is_symlink():
        name = path.resolve().name
        if re.fullmatch(r"[0-9a-f]{64}", name):
            return name
    return None


def write_json_atomic(path: Path, value: dict) -> None:
    """Write-then-rename; a read-only folder just means we compute it again next time."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(value), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def looks_like_path(spec: str) -> bool:
    return (
        spec.lower().endswith((".gguf", ".safetensors", ".json"))
        or spec.startswith((".", "/", "~", "\\"))
        or "\\" in spec
        or (len(spec) > 1 and spec[1] == ":")  # Windows drive
        or spec.count("/") > 1
    )


def report_progress(progress: Progress | None, message: str, fraction: float | None) -> None:
    if progress is not None:
        progress(message, fraction)


def check_cancel(cancel: Cancel | None) -> None:
    if cancel is not None and cancel():
        raise ResolveCancelled("cancelled")


def read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
