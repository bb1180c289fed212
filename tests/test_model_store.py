"""engine.store.models: specs -> ready model folders, with caching and clean failures."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.store import model_folders
from engine.store import models as model_store
from engine.errors import ModelFormatError, ModelNotFoundError
from engine.store.models import ModelFolder, list_local_models, resolve_model
from engine.store.paths import model_cache_dir


def cache_entries() -> list[str]:
    """What is in the model cache, apart from the bundled model conftest links in."""
    return sorted(p.name for p in model_cache_dir().iterdir() if p.name != model_store.BUNDLED_NAME)


def forbid(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    def boom(*_a, **_k):
        raise AssertionError("must not be called on a cached load")

    for name in names:  # wherever the function lives (the shared folder helpers have their own module)
        for module in (model_store, model_folders):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, boom)


# ---------------------------------------------------------------- bundled model


def test_bundled_folder_holds_only_small_metadata(bundled_model: ModelFolder) -> None:
    """The bundled GGUF runs as stored: its folder in the cache holds the config and tokenizer read
    from the file's metadata, and no weights (neither float32 safetensors nor a packed copy)."""
    path = bundled_model.path
    assert bundled_model.source == "bundled"
    assert bundled_model.model_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152 and config["num_hidden_layers"] == 30
    assert config["num_key_value_heads"] == 3 and config["tie_word_embeddings"] is True
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 100000.0}
    assert "quantization_config" not in config
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (path / name).is_file(), name
    assert not list(path.glob("*.safetensors")) and not (path / "gguf-blocks.triforce").exists()
    assert sum(f.stat().st_size for f in path.iterdir()) < 8_000_000  # the tokenizer is most of it
    assert bundled_model.weights_hash == model_store.BUNDLED_SHA256  # the file's own content hash
    assert model_store.gguf_model_file(path).samefile(model_store.bundled_gguf_path())
    assert not list(path.parent.glob(model_store.TMP_PREFIX + "*"))


def test_bundled_second_resolve_uses_cache(bundled_model: ModelFolder, monkeypatch) -> None:
    # the metadata folder is linked into this test's cache: resolving must not touch the GGUF
    forbid(monkeypatch, "write_gguf_folder", "bundled_gguf_path", "sha256_file")
    for spec in ("bundled", "smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m", " Bundled "):
        again = resolve_model(spec)
        assert again.path.resolve() == bundled_model.path.resolve()
        assert again.weights_hash == bundled_model.weights_hash
        assert again.source == "bundled"


def test_bundled_metadata_is_read_once_into_empty_cache(bundled_model_dir: Path, monkeypatch) -> None:
    (model_cache_dir() / model_store.BUNDLED_NAME).unlink()  # start from an empty cache
    calls = []
    real = model_store.write_gguf_folder

    def counted(gguf, dest, origin, progress, cancel):
        calls.append(gguf)
        real(gguf, dest, origin, progress, cancel)

    monkeypatch.setattr(model_store, "write_gguf_folder", counted)
    first = resolve_model("bundled")
    assert len(calls) == 1 and calls[0].name == model_store.BUNDLED_GGUF
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (first.path / name).read_bytes() == (bundled_model_dir / name).read_bytes(), name
    forbid(monkeypatch, "bundled_gguf_path", "sha256_file")
    second = resolve_model("bundled")
    assert len(calls) == 1
    assert second == first


def test_an_older_float32_conversion_is_replaced(bundled_model_dir: Path) -> None:
    """A cache made by the float32 conversion (safetensors + packed blocks, no format mark) is
    replaced by the metadata folder, and its hundreds of MB go with it."""
    (model_cache_dir() / model_store.BUNDLED_NAME).unlink()
    old = model_cache_dir() / model_store.BUNDLED_NAME
    old.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(bundled_model_dir / name, old / name)
    (old / "model.safetensors").write_bytes(b"x" * 1000)
    (old / "gguf-blocks.triforce").write_bytes(b"x" * 1000)
    (old / model_store.ORIGIN_FILE).write_text(json.dumps({"source": "bundled", "gguf_sha256": "0" * 64}))
    model = resolve_model("bundled")
    assert model.path == old and model_store.is_gguf_folder(old)
    assert not (old / "model.safetensors").exists() and not (old / "gguf-blocks.triforce").exists()
    assert cache_entries() == []  # no leftovers beside it


def test_cancel_leaves_nothing(bundled_model_dir: Path) -> None:
    (model_cache_dir() / model_store.BUNDLED_NAME).unlink()
    with pytest.raises(model_store.ResolveCancelled):
        resolve_model("bundled", cancel=lambda: True)
    assert list(model_cache_dir().iterdir()) == []


def test_failed_metadata_write_leaves_nothing(tmp_path: Path, bundled_model_dir: Path, monkeypatch) -> None:
    """Reading the metadata dying half-way through writing must leave no folder behind."""
    from engine.store import gguf_meta

    def half(gguf, dest):
        Path(dest, "config.json").write_text("{")
        raise OSError("disk full")

    monkeypatch.setattr(gguf_meta, "write_metadata", half)
    gguf = tmp_path / "x.gguf"
    write_tiny_gguf(gguf, bundled_model_dir, vocab_size=64)
    with pytest.raises(OSError, match="disk full"):
        resolve_model(str(gguf))
    assert cache_entries() == []


# ---------------------------------------------------------------- local folders


def test_local_folder(tiny_model_dir, monkeypatch) -> None:
    folder = tiny_model_dir("llama")
    model = resolve_model(str(folder))
    assert model.source == "folder" and model.model_id == folder.name and model.path == folder
    forbid(monkeypatch, "sha256_file")  # the hash is cached next to the weights
    assert resolve_model(str(folder)).weights_hash == model.weights_hash
    assert cache_entries() == []


def test_weights_hash_follows_content(tiny_model_dir, tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(tiny_model_dir("llama"), folder)
    before = resolve_model(str(folder)).weights_hash
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert resolve_model(str(folder)).weights_hash != before


@pytest.mark.parametrize(
    "remove, expected",
    [("config.json", "config.json"), ("model.safetensors", "safetensors"), ("tokenizer.json", "tokenizer")],
)
def test_incomplete_folder(tiny_model_dir, tmp_path: Path, remove: str, expected: str) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir("llama"), folder)
    (folder / remove).unlink()
    with pytest.raises(ModelFormatError, match=expected):
        resolve_model(str(folder))


# ---------------------------------------------------------------- bad specs


@pytest.mark.parametrize("spec", ["nonsense", "", "   ", "a b/c d", "org/name/extra"])
def test_unknown_spec(spec: str) -> None:
    with pytest.raises(ModelNotFoundError, match="pass 'bundled'"):
        resolve_model(spec)
    assert cache_entries() == []


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="no such file"):
        resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFoundError, match="no such file"):
        resolve_model("./missing-folder")


def test_not_a_gguf(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_text("this is not a model")
    with pytest.raises(ModelFormatError, match="not a GGUF"):
        resolve_model(str(fake))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\0" * 10)
    with pytest.raises(ModelFormatError, match="not a .gguf"):
        resolve_model(str(other))
    assert cache_entries() == []


@pytest.mark.parametrize("keep", [100, 2_000_000])
def test_truncated_gguf(tmp_path: Path, keep: int) -> None:
    """Cut inside the header and inside the tensor data."""
    source = model_store.bundled_gguf_path()
    cut = tmp_path / "cut.gguf"
    with source.open("rb") as fh:
        cut.write_bytes(fh.read(keep))
    with pytest.raises(ModelFormatError, match="truncated"):
        resolve_model(str(cut))
    assert cache_entries() == []


def test_offline_unknown_repo() -> None:
    with pytest.raises(ModelNotFoundError, match="connect"):
        resolve_model("no-such-org/no-such-model")


# ---------------------------------------------------------------- GGUF files


def write_tiny_gguf(path: Path, tokenizer_dir: Path, vocab_size: int = 1024) -> None:
    """A 2-layer llama GGUF with the first `vocab_size` tokens of the bundled BPE tokenizer
    (small vocab: transformers' GGUF tokenizer import is slow per token)."""
    import gguf

    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = {text: idx for text, idx in tok["model"]["vocab"].items() if idx < vocab_size}
    tokens = sorted(vocab, key=vocab.get)
    special = {t["id"] for t in tok["added_tokens"] if t.get("special")}
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in tok["model"]["merges"]]
    hidden, layers, heads, kv, ffn = 64, 2, 4, 2, 128
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(hidden // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(tokens))])
    w.add_token_merges([f"{a} {b}" for a, b in pairs if a in vocab and b in vocab and a + b in vocab])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    rng = np.random.default_rng(0)

    def rand(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    rand("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        rand(f"blk.{i}.attn_q.weight", hidden, hidden)
        rand(f"blk.{i}.attn_k.weight", kv * hidden // heads, hidden)
        rand(f"blk.{i}.attn_v.weight", kv * hidden // heads, hidden)
        rand(f"blk.{i}.attn_output.weight", hidden, hidden)
        rand(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        rand(f"blk.{i}.ffn_up.weight", ffn, hidden)
        rand(f"blk.{i}.ffn_down.weight", hidden, ffn)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    rand("output.weight", len(tokens), hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_any_gguf_is_read_once(tmp_path: Path, bundled_model_dir: Path, monkeypatch) -> None:
    gguf_file = tmp_path / "Tiny Model.gguf"
    write_tiny_gguf(gguf_file, bundled_model_dir)
    seen = []
    model = resolve_model(str(gguf_file), progress=lambda msg, frac: seen.append(frac))
    assert model.source == "gguf" and model.name == "Tiny Model"
    assert model.path.parent == model_cache_dir() and model.path.name.startswith("gguf-Tiny_Model-")
    assert seen[-1] == 1.0
    config = json.loads((model.path / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 64
    assert config["tie_word_embeddings"] is False and config["max_position_embeddings"] == 2048
    assert (model.path / "tokenizer.json").is_file() and not list(model.path.glob("*.safetensors"))
    assert model.weights_hash == model_store.sha256_file(gguf_file)
    # cached: keyed by content, so neither the metadata reader nor the full hash runs again
    forbid(monkeypatch, "write_gguf_folder", "sha256_file")
    assert resolve_model(str(gguf_file)) == model
    assert [e.model_id for e in list_local_models() if e.source == "gguf"] == [model.model_id]


def test_copy_of_bundled_gguf_is_the_bundled_model(tmp_path: Path, bundled_model: ModelFolder, monkeypatch) -> None:
    copy = tmp_path / "smol.gguf"
    shutil.copy(model_store.bundled_gguf_path(), copy)
    forbid(monkeypatch, "write_gguf_folder")
    assert resolve_model(str(copy)).path.resolve() == bundled_model.path.resolve()


# ---------------------------------------------------------------- Hugging Face cache


def make_hub_cache(root: Path, repo_id: str, model_dir: Path, revision: str = "0123456789abcdef" * 2 + "01234567") -> Path:
    """Lay out `model_dir` the way huggingface_hub caches a download: blobs + snapshot links + refs/main."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for f in sorted(model_dir.iterdir()):
        if f.name == model_store.WEIGHTS_STAMP:  # ours, left by earlier tests: never on the hub
            continue
        blob = repo / "blobs" / model_store.sha256_file(f)  # as the hub names LFS blobs
        shutil.copy(f, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    return snapshot


def test_hub_offline_from_cache(tiny_model_dir, tmp_path: Path, monkeypatch) -> None:
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = make_hub_cache(hub, "tiny-org/tiny-llama", tiny_model_dir("llama"))
    other = make_hub_cache(hub, "tiny-org/not-llama", tiny_model_dir("llama"))
    (other / "config.json").resolve().write_text('{"model_type": "bert"}')
    model = resolve_model("tiny-org/tiny-llama")
    assert model.source == "hub" and model.model_id == "tiny-org/tiny-llama" and model.name == "tiny-llama"
    assert model.path == snapshot
    # same weights, same hash, whatever the source; read from the blob names, nothing written there
    assert model.weights_hash == resolve_model(str(tiny_model_dir("llama"))).weights_hash
    assert not (snapshot / model_store.WEIGHTS_STAMP).exists()
    listed = {m.model_id: m for m in list_local_models()}
    assert "tiny-org/tiny-llama" in listed and "tiny-org/not-llama" not in listed
    assert listed["tiny-org/tiny-llama"].model_type == "llama"
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE"):
        resolve_model("tiny-org/other")
    assert cache_entries() == []


def test_download_progress_and_cancel() -> None:
    """The tqdm class handed to snapshot_download forwards bytes and file counts, and cancels."""
    seen = []
    flag = {"cancel": False}
    bar_class = model_store._tqdm_class("org/name", lambda msg, frac: seen.append((msg, frac)), lambda: flag["cancel"])
    files = bar_class(total=4, desc="Fetching 4 files")
    data = bar_class(total=2_000_000, desc="Reconstructing (incomplete total...)", unit="B", unit_scale=True)
    files.update(1)
    data.update(1_000_000)
    assert seen == [("downloading org/name: 1 of 4 files", 0.25), ("downloading org/name: 1 of 2 MB", 0.5)]
    flag["cancel"] = True
    with pytest.raises(model_store.ResolveCancelled):
        data.update(1)
    files.close()
    data.close()
