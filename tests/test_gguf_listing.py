"""`main.py models` and the picker list local GGUF files with their block kinds, the RAM they need
and which kinds run natively."""
from __future__ import annotations

import json
import shutil

import pytest

from engine.api import list_local_models
from engine.cli import models_cmd
from engine.store.models import resolve_model
from engine.store.paths import model_cache_dir
from tiny_gguf import FFN, HEAD_DIM, HIDDEN, KV_HEADS, LAYERS, write_gguf

BYTES_PER_32 = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "MXFP4": 17, "Q8_0": 34, "F32": 128}
MIXED = {"q": "Q4_0", "k": "Q8_0", "v": "Q4_0", "o": "MXFP4", "gate": "Q4_1", "up": "Q4_1", "down": "Q8_0",
         "embed": "Q8_0", "output": "Q4_0"}
VOCAB = 512


def _expected(kinds: dict[str, str]) -> tuple[dict[str, int], int]:
    """Bytes per kind of a tiny_gguf file, and the float32 bytes of its MXFP4 tensors, from the shapes."""
    shapes = {"q": (HIDDEN, HIDDEN), "k": (KV_HEADS * HEAD_DIM, HIDDEN), "v": (KV_HEADS * HEAD_DIM, HIDDEN),
              "o": (HIDDEN, HIDDEN), "gate": (FFN, HIDDEN), "up": (FFN, HIDDEN), "down": (HIDDEN, FFN)}
    elements = {role: LAYERS * r * c for role, (r, c) in shapes.items()}
    elements.update(embed=VOCAB * HIDDEN, output=VOCAB * HIDDEN)
    by_kind: dict[str, int] = {"F32": (2 * LAYERS + 1) * HIDDEN * 4}  # the norms
    widened = 0
    for role, n in elements.items():
        kind = kinds.get(role, "F32")
        by_kind[kind] = by_kind.get(kind, 0) + n // 32 * BYTES_PER_32[kind]
        widened += 4 * n if kind == "MXFP4" else 0
    return by_kind, widened


def test_a_gguf_in_the_model_folder_is_listed_with_kinds_ram_and_what_runs_natively(bundled_model_dir):
    model_cache_dir().mkdir(parents=True, exist_ok=True)
    path = model_cache_dir() / "mixed.gguf"
    write_gguf(path, bundled_model_dir, MIXED, vocab_size=VOCAB)
    entry = next(m for m in list_local_models() if m.path == path)
    by_kind, widened = _expected(MIXED)
    total = sum(by_kind.values())
    text = ", ".join(f"{k} {n / total:.0%}" for k, n in sorted(by_kind.items(), key=lambda kv: -kv[1])
                     if n / total >= 0.005)
    assert entry.kinds == text and "MXFP4" in text and "Q4_1" in text
    assert entry.widened == ("MXFP4",)
    native = [k for k, n in sorted(by_kind.items(), key=lambda kv: -kv[1]) if k != "MXFP4" and n / total >= 0.005]
    assert entry.runs == f"{', '.join(native)} native; MXFP4 widened to float32 (slower, more RAM)"
    kv = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2048 * 2  # the file's context (2048) is under 8192: float16 K/V
    assert entry.context == 2048
    assert entry.ram_bytes == total - by_kind["MXFP4"] + widened + kv
    assert entry.model_type == "llama" and entry.size_bytes == path.stat().st_size
    # the listed path is a spec that loads
    assert resolve_model(str(entry.path)).source == "gguf"
    report = models_cmd.collect()
    row = next(r for r in report["local"] if r["path"] == str(path))
    assert row["widened_to_float32"] == ["MXFP4"] and row["ram_bytes"] == entry.ram_bytes
    assert json.loads(json.dumps(report)) == report
    shown = models_cmd.format_report(report)
    assert text in shown and "MXFP4 widened to float32" in shown and "K/V at 2,048 tokens" in shown


def test_an_opened_gguf_is_listed_once_where_it_is(tmp_path, bundled_model_dir):
    path = tmp_path / "native.gguf"
    write_gguf(path, bundled_model_dir, {role: "Q8_0" for role in MIXED}, vocab_size=VOCAB)
    folder = resolve_model(str(path))
    rows = [m for m in list_local_models() if m.source == "gguf"]
    assert [m.path for m in rows] == [path] and rows[0].model_id == folder.model_id
    assert rows[0].runs == "every kind runs natively" and rows[0].widened == ()
    assert rows[0].kinds.startswith("Q8_0 ")
    # moved away: no stale row pointing at a missing file
    shutil.move(path, tmp_path / "elsewhere.bin")
    assert not [m for m in list_local_models() if m.source == "gguf"]


def test_a_damaged_gguf_is_listed_with_what_to_do(bundled_model_dir):
    model_cache_dir().mkdir(parents=True, exist_ok=True)
    good = model_cache_dir() / "good.gguf"
    write_gguf(good, bundled_model_dir, MIXED, vocab_size=VOCAB)
    cut = model_cache_dir() / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:5000])
    rows = {m.path.name: m for m in list_local_models()}
    assert "truncated or damaged" in rows["cut.gguf"].runs and "download it again" in rows["cut.gguf"].runs
    assert rows["cut.gguf"].ram_bytes == 0 and rows["good.gguf"].kinds


def test_the_picker_shows_kinds_and_ram(bundled_model_dir):
    pytest.importorskip("PySide6")
    from app.model_picker import local_choices

    model_cache_dir().mkdir(parents=True, exist_ok=True)
    path = model_cache_dir() / "mixed.gguf"
    write_gguf(path, bundled_model_dir, MIXED, vocab_size=VOCAB)
    choice = next(c for c in local_choices() if c.spec == str(path))
    assert "MXFP4 widened to float32" in choice.note and "GB RAM at 2,048 tokens" in choice.note
    assert "Q4_1" in choice.note
