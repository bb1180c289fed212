"""SnapshotStore: bit-identical round trip, longest-prefix choice, corruption, keys, LRU eviction."""
from __future__ import annotations

import json
import logging
import os
import struct
import time

import pytest
import torch
from safetensors import safe_open

from engine.errors import StoreError
from engine.store.snapshots import TOKENS, SnapshotStore


def kv(n_tokens: int, layers: int = 2, seed: int = 0, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Per-layer K/V prefixes shaped [B, H, S, D], as the session code would store them."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for layer in range(layers):
        for kind in ("k", "v"):
            out[f"layer{layer}.{kind}"] = torch.randn(1, 2, n_tokens, 8, generator=gen).to(dtype)
    return out


@pytest.fixture
def store(tmp_path):
    return SnapshotStore(tmp_path / "snaps", max_bytes=2**30)


def test_default_root_follows_triforce_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIFORCE_HOME", str(tmp_path / "home"))
    assert SnapshotStore().root == tmp_path / "home" / "snapshots"


def test_round_trip_is_bit_identical(store):
    tokens = list(range(100, 164))
    tensors = {**kv(64), "bf16": torch.randn(3, 5).to(torch.bfloat16), "mask": torch.rand(7) > 0.5,
               "scalar": torch.tensor(3.5, dtype=torch.float64), "empty": torch.zeros(0, 4),
               "view": torch.arange(40, dtype=torch.int64).reshape(5, 8)[:, 2:5]}  # a non-contiguous view
    path = store.save("smollm2-135m@fp32", tokens, tensors, extra={"layers": 2})
    assert path.exists() and path.parent == store.root
    with safe_open(path, framework="pt") as f:  # a standard safetensors file
        meta = f.metadata()
        assert meta["model_key"] == "smollm2-135m@fp32" and meta["n_tokens"] == "64"
        assert set(f.keys()) == {*tensors, TOKENS}
    match = store.find("smollm2-135m@fp32", tokens)
    assert match.matched == 64 and match.stored_tokens == 64 and match.extra == {"layers": 2}
    got_tokens, got = store.load(match)
    assert got_tokens == tokens and set(got) == set(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape
        assert torch.equal(got[name].view(-1).view(torch.uint8) if t.numel() else got[name],
                           t.contiguous().view(-1).view(torch.uint8) if t.numel() else t)


def test_longest_prefix_wins(store):
    base = list(range(1000, 1200))
    store.save("m", base[:50], kv(50, seed=1))
    store.save("m", base[:120] + [7] * 30, kv(150, seed=2))  # diverges after 120 tokens
    store.save("m", [5] + base[1:180], kv(180, seed=3))  # differs at token 0: never a match
    match = store.find("m", base)
    assert (match.matched, match.stored_tokens) == (120, 150)
    assert store.find("m", base[:40]).matched == 40
    assert store.find("m", [9, 9, 9]) is None
    assert store.find("m", base, min_tokens=121) is None
    assert store.find("m", [5] + base[1:10]).stored_tokens == 180


def test_saving_an_extension_replaces_its_prefix(store):
    tokens = list(range(300))
    first = store.save("m", tokens[:100], kv(100))
    second = store.save("m", tokens, kv(300))
    assert not first.exists() and second.exists()
    assert len(store.entries()) == 1
    assert store.save("m", tokens, kv(300, seed=9)) == second  # same tokens: replaced in place


def test_mismatched_model_key_is_ignored(store):
    tokens = list(range(64))
    path = store.save("llama-3.1-8b@bf16", tokens, kv(64))
    assert store.find("smollm2-135m@fp32", tokens) is None
    assert path.exists()  # another model's snapshot is not corrupt, just not ours
    match = store.find("llama-3.1-8b@bf16", tokens)
    # a match whose file now claims another model (e.g. swapped on disk) is refused and deleted
    forged = type(match)(match.path, "other-model", match.matched, match.stored_tokens, match.nbytes)
    assert store.load(forged) is None and not path.exists()


def _corrupt_truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def _corrupt_flip_data_byte(path):
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))


def _corrupt_header(path):
    data = bytearray(path.read_bytes())
    data[8:20] = b"not json at!"
    path.write_bytes(bytes(data))


def _corrupt_token_hash(path):
    # Rewrite the header with a wrong token hash (same length, so the layout stays valid).
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    sha = header["__metadata__"]["tokens_sha256"]
    header["__metadata__"]["tokens_sha256"] = ("0" if sha[0] != "0" else "1") + sha[1:]
    body = json.dumps(header, separators=(",", ":")).encode().ljust(length)
    path.write_bytes(data[:8] + body + data[8 + length:])


@pytest.mark.parametrize("corrupt", [_corrupt_truncate, _corrupt_flip_data_byte, _corrupt_header, _corrupt_token_hash])
def test_corrupt_snapshot_is_deleted_and_ignored(store, corrupt, caplog):
    tokens = list(range(80))
    path = store.save("m", tokens, kv(80))
    corrupt(path)
    with caplog.at_level(logging.WARNING, logger="engine.store.snapshots"):
        match = store.find("m", tokens)
        assert match is None or store.load(match) is None
    assert not path.exists()
    assert "deleting invalid KV snapshot" in caplog.text
    assert store.find("m", tokens) is None


def test_lru_eviction_by_last_use(tmp_path):
    one = sum(t.numel() * t.element_size() for t in kv(256).values())  # ~32 KiB per snapshot
    store = SnapshotStore(tmp_path / "snaps", max_bytes=int(3.5 * one))
    paths = [store.save("m", [i] * 256, kv(256, seed=i)) for i in range(3)]
    for age, path in zip((300, 200, 100), paths):  # 0 oldest, 2 newest
        os.utime(path, (time.time() - age, time.time() - age))
    assert store.load(store.find("m", [0] * 256)) is not None  # using 0 makes it the newest
    newest = store.save("m", [3] * 256, kv(256, seed=3))
    assert [p.exists() for p in paths] == [True, False, True] and newest.exists()
    assert store.total_bytes() <= store.max_bytes
    os.utime(paths[0], (time.time() - 50, time.time() - 50))  # coarse clocks: make "newest" unambiguous
    store.max_bytes = int(1.5 * one)
    assert [p.name for p in (e.path for e in store.entries())] == [newest.name]
    store.clear()
    assert store.total_bytes() == 0 and store.entries() == []


def test_snapshot_bigger_than_cache_is_not_saved(tmp_path, caplog):
    store = SnapshotStore(tmp_path / "snaps", max_bytes=1000)
    with caplog.at_level(logging.WARNING, logger="engine.store.snapshots"):
        assert store.save("m", list(range(64)), kv(64)) is None
    assert "over the" in caplog.text and store.total_bytes() == 0


def test_write_failure_is_a_store_error_and_leaves_nothing(store, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(StoreError, match="No space left.*Free disk space"):
        store.save("m", [1, 2, 3], kv(3))
    assert list(store.root.iterdir()) == []


def test_bad_arguments(store):
    with pytest.raises(ValueError):
        store.save("m", [], kv(1))
    with pytest.raises(ValueError):
        store.save("m", [1], {TOKENS: torch.zeros(1)})
    with pytest.raises(ValueError):
        store.save("", [1], kv(1))


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_killed_writers_temp_files_removed_at_start_live_ones_kept_and_counted(tmp_path):
    root = tmp_path / "snaps"
    root.mkdir()
    dead = root / f".abc.safetensors.{_dead_pid()}.1.tmp"  # a kill -9 mid-save leaves this
    dead.write_bytes(b"x" * 50_000)
    live = root / f".def.safetensors.{os.getpid()}.1.tmp"  # a save in progress in a running process
    live.write_bytes(b"y" * 40_000)
    store = SnapshotStore(root, max_bytes=2**30)
    assert not dead.exists() and live.exists()  # removed at start, not an hour later
    assert store.total_bytes() == 40_000  # the save in progress counts against the cap
    one = sum(t.numel() * t.element_size() for t in kv(256).values())
    store.max_bytes = 40_000 + int(1.5 * one)
    first = store.save("m", [1] * 256, kv(256, seed=1))
    second = store.save("m", [2] * 256, kv(256, seed=2))
    assert not first.exists() and second.exists() and live.exists()  # evicted to fit beside the temp
    assert store.total_bytes() <= store.max_bytes
