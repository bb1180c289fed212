"""Where the app keeps its data: models, chats, snapshots.

`TRIFORCE_HOME` overrides the platform's app-data folder (tests point it at a temp dir).
"""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "TriForceChat"


def app_home() -> Path:
    """Root of everything the app writes; created on first use."""
    env = os.environ.get("TRIFORCE_HOME")
    root = Path(env).expanduser() if env else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    root.mkdir(parents=True, exist_ok=True)
    return root


def model_cache_dir() -> Path:
    """Converted models (safetensors + tokenizer files), one folder each."""
    path = app_home() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


SNAPSHOT_CACHE_BYTES = 20 * 2**30  # default disk kept for snapshots (the app's Settings change it)


def snapshot_dir() -> Path:
    """Prefilled-book KV snapshots."""
    path = app_home() / "snapshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


def chat_db_path() -> Path:
    """The SQLite chat store."""
    return app_home() / "chats.sqlite3"
