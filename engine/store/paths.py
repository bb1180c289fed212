"""Where the app keeps its data: models, chats, snapshots.

`TRIFORCE_HOME` overrides the platform's app-data folder (tests point it at a temp dir).
"""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from engine.errors import StoreError

APP_NAME = "TriForceChat"


def app_home() -> Path:
    """Root of everything the app writes; created on first use."""
    env = os.environ.get("TRIFORCE_HOME")
    root = Path(env).expanduser() if env else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    return _make_folder(root, "TRIFORCE_HOME" if env else "the app-data folder")


def _make_folder(path: Path, what: str) -> Path:
    """mkdir -p, or a StoreError that names the path and what to do (a file in the way, no permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise StoreError(f"{what} {path} is a file, not a folder: point TRIFORCE_HOME to a folder "
                         "(or move the file aside)") from None
    except NotADirectoryError:
        raise StoreError(f"{what} {path} cannot be created: a part of that path is a file, not a folder. "
                         "Point TRIFORCE_HOME to a folder") from None
    except OSError as exc:
        raise StoreError(f"{what} {path} cannot be created ({exc.strerror or exc}): check its permissions "
                         "or point TRIFORCE_HOME to a writable folder") from None
    return path


def model_cache_dir() -> Path:
    """Converted models (safetensors + tokenizer files), one folder each."""
    return _make_folder(app_home() / "models", "the model cache")


SNAPSHOT_CACHE_BYTES = 20 * 2**30  # default disk kept for snapshots (the app's Settings change it)


def snapshot_dir() -> Path:
    """Prefilled-book KV snapshots."""
    return _make_folder(app_home() / "snapshots", "the snapshot folder")


def chat_db_path() -> Path:
    """The SQLite chat store."""
    return app_home() / "chats.sqlite3"
