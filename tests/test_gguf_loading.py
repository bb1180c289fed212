"""A GGUF loads as stored: memory-mapped blocks, config and tokenizer from its metadata, no float32 copy."""
from __future__ import annotations

import json
import mmap
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.errors import ModelFormatError, ModelNotFoundError, UnsupportedModelError
from engine.model.folder_tokenizer import FolderConfig, FolderTokenizer
from engine.store.gguf_file import read_header
from engine.model.quant import StackedWeight
from engine.model.loading import load_folder
from engine.model.quant import QuantWeight
from engine.store import models as model_store
from engine.store.models import resolve_model
from engine.store.paths import model_cache_dir
from tiny_gguf import write_gguf

# q and v differ from k (a stacked q|k|v), o in a kind no kernel runs (widened), gate|up one kind
# stored back to back (one view of the file), down and the output head in their own kinds
MIXED = {"q": "Q4_0", "k": "Q8_0", "v": "Q4_0", "o": "MXFP4", "gate": "Q4_1", "up": "Q4_1", "down": "Q8_0",
         "embed": "Q8_0", "output": "Q4_0"}


def _entries() -> list[str]:
    return sorted(p.name for p in model_cache_dir().iterdir() if p.name != model_store.BUNDLED_NAME) \
        if model_cache_dir().is_dir() else []


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory, bundled_model_dir) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("gguf") / "mixed.gguf"
    return path, write_gguf(path, bundled_model_dir, MIXED)


def _is_file_view(array: np.ndarray) -> bool:
    """A read-only view whose memory is a mapped file (no array of its own)."""
    base = array
    while isinstance(base, np.ndarray):
        if base.flags.writeable or (base.flags.owndata and base is not array):
            return False
        base = base.base
    return isinstance(getattr(base, "obj", base), mmap.mmap)


def test_a_mixed_gguf_runs_each_tensor_as_stored(mixed_gguf):
    path, stored = mixed_gguf
    model = load_folder(resolve_model(str(path)), device="cpu")
    runner = model.runner
    layer = runner.layers[0]
    assert isinstance(layer.wqkv, StackedWeight) and layer.wqkv.kind == "Q4_0+Q8_0+Q4_0"
    assert isinstance(layer.wo, torch.Tensor)  # MXFP4: widened to float32
    assert isinstance(layer.w_gate_up, QuantWeight) and layer.w_gate_up.kind == "Q4_1"
    assert isinstance(layer.w_down, QuantWeight) and layer.w_down.kind == "Q8_0"
    assert isinstance(runner.embed, QuantWeight) and runner.embed.kind == "Q8_0"
    assert isinstance(runner.lm_head, QuantWeight) and runner.lm_head.kind == "Q4_0"
    # gate|up and down are views of the mapped file, no copy of their bytes
    assert all(_is_file_view(w.blocks) for w in (layer.w_gate_up, layer.w_down, runner.embed, runner.lm_head))
    # q|k|v too: each part the stored tensor, Q and K rows reordered by the kernel's columns, not copied
    assert all(_is_file_view(p.blocks) for p in layer.wqkv.parts) and layer.wqkv.parts[0].row_order is not None
    # every weight is the file's own values, rows back in transformers' order
    gate, up = stored["model.layers.0.mlp.gate_proj.weight"], stored["model.layers.0.mlp.up_proj.weight"]
    assert torch.equal(layer.w_gate_up.dequantize(), torch.from_numpy(np.concatenate([gate, up])))
    qkv = np.concatenate([stored[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(layer.wqkv.dequantize(), torch.from_numpy(qkv))
    assert torch.equal(layer.wo, torch.from_numpy(stored["model.layers.0.self_attn.o_proj.weight"]))
    assert torch.equal(runner.lm_head.dequantize(), torch.from_numpy(stored["lm_head.weight"]))
    # the float32 oracle from the same file gives the same logits up to float32 sum order
    oracle = load_folder(resolve_model(str(path)), device="cpu", file_blocks=False)
    assert not oracle.runner.weights_tag and runner.weights_tag
    ids = torch.tensor([1, 17, 300, 99, 5, 8])
    got = runner.forward(ids, torch.arange(6), runner.new_full_cache(16))
    want = oracle.runner.forward(ids, torch.arange(6), oracle.runner.new_full_cache(16))
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_the_oracle_equals_transformers_reading_of_the_same_gguf(mixed_gguf):
    """Our reader's float32 weights (Q/K rows un-interleaved, blocks widened) equal what the file
    defines and what transformers' own GGUF loader makes of it, tensor for tensor."""
    from transformers import AutoModelForCausalLM

    from engine.model.gguf_weights import state_dict

    path, stored = mixed_gguf
    folder = resolve_model(str(path))
    ours = state_dict(read_header(path), FolderConfig.from_folder(folder.path))
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).state_dict()
    assert set(ours) == set(stored)
    for name, value in ours.items():
        assert torch.equal(value, torch.from_numpy(stored[name])), name
        assert torch.equal(value, hf[name]), name


def test_the_model_cache_holds_only_small_metadata(mixed_gguf):
    path, _ = mixed_gguf
    folder = resolve_model(str(path))
    load_folder(folder, device="cpu")
    files = {p.name: p.stat().st_size for p in folder.path.iterdir()}
    assert not [n for n in files if n.endswith((".safetensors", ".triforce", ".bin"))]
    assert sum(files.values()) < path.stat().st_size + 200_000  # the tokenizer; nothing of the weights


@pytest.mark.bundled
def test_bundled_model_runs_mapped_with_no_float32_copy(bundled_model_dir, bundled_float32_dir):
    """The bundled Q4_1 file: every projection and the embedding run from the file's blocks; the
    widened oracle equals transformers' own float32 conversion of the same file bit for bit."""
    model = load_folder(bundled_model_dir)
    runner = model.runner
    assert runner.weights_tag == "gguf-native-f32" or runner.weights_tag == "gguf-int4-bf16"
    assert all(isinstance(w, QuantWeight) for layer in runner.layers
               for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down))
    assert runner.embed.kind == "Q8_0" and runner.lm_head is runner.embed
    assert _is_file_view(runner.embed.blocks) and _is_file_view(runner.layers[5].w_down.blocks)
    assert _is_file_view(runner.layers[5].w_gate_up.blocks)  # ffn_gate and ffn_up are stored back to back
    header = read_header(model_store.gguf_model_file(bundled_model_dir))
    assert runner.nbytes() < 110e6
    from safetensors.torch import load_file

    from engine.model.gguf_weights import state_dict

    ours = state_dict(header, model.config)
    theirs = load_file(str(bundled_float32_dir / "model.safetensors"))
    theirs.setdefault("lm_head.weight", theirs["model.embed_tokens.weight"])
    ours.setdefault("lm_head.weight", ours["model.embed_tokens.weight"])
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.bundled
def test_folder_tokenizer_matches_transformers(bundled_model_dir, bundled_tokenizer, sample_passage):
    """The tokenizer a warm start reads without transformers gives transformers' ids, texts and
    chat layouts on the bundled model."""
    ours = FolderTokenizer(bundled_model_dir)
    theirs = bundled_tokenizer
    text = sample_passage(300)
    for special in (True, False):
        assert ours(text, add_special_tokens=special)["input_ids"] == theirs(text, add_special_tokens=special)["input_ids"]
    batch = [text[:200], "Hello, world!", "  spaced  out\n\nlines  ", "émigré 東京 🙂"]
    assert ours(batch, add_special_tokens=False)["input_ids"] == theirs(batch, add_special_tokens=False)["input_ids"]
    offsets = ours(text[:500], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    assert [tuple(o) for o in offsets] == [tuple(o) for o in theirs(text[:500], add_special_tokens=False,
                                                                    return_offsets_mapping=True)["offset_mapping"]]
    chats = [[{"role": "user", "content": "Who speaks first?"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text[:400]},
              {"role": "assistant", "content": "Bernardo."}, {"role": "user", "content": "And then?"}]]
    for chat in chats:
        for generation in (True, False):
            want = theirs.apply_chat_template(chat, add_generation_prompt=generation, tokenize=True)
            want = want["input_ids"] if hasattr(want, "keys") else want
            assert ours.apply_chat_template(chat, add_generation_prompt=generation, tokenize=True) == list(want)
            assert ours.apply_chat_template(chat, add_generation_prompt=generation, tokenize=False) == \
                theirs.apply_chat_template(chat, add_generation_prompt=generation, tokenize=False)
    ids = ours.apply_chat_template(chats[1], add_generation_prompt=True)
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == \
            theirs.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
    assert ours.get_vocab() == theirs.get_vocab()
    assert (ours.eos_token_id, ours.bos_token_id, ours.pad_token_id) == \
        (theirs.eos_token_id, theirs.bos_token_id, theirs.pad_token_id)


# ---------------------------------------------------------------- files we cannot run: typed errors


def test_a_truncated_gguf_is_a_typed_error(mixed_gguf, tmp_path):
    path, _ = mixed_gguf
    cut = tmp_path / "cut.gguf"
    data = path.read_bytes()
    for keep in (30, len(data) // 3, len(data) - 100):  # in the header, the metadata, the tensor data
        cut.write_bytes(data[:keep])
        with pytest.raises(ModelFormatError, match="truncated or damaged.*download it again"):
            resolve_model(str(cut))
    assert _entries() == []


def test_a_damaged_tensor_table_is_a_typed_error(mixed_gguf, tmp_path):
    path, _ = mixed_gguf
    data = bytearray(path.read_bytes())
    header = read_header(path)
    first = min(t.start for t in header.tensors.values())
    at = data.rfind(b"blk.0.attn_q.weight", 0, first) + len(b"blk.0.attn_q.weight")
    data[at:at + 4] = (9).to_bytes(4, "little")  # nine dimensions
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match="truncated or damaged"):
        resolve_model(str(bad))


def test_an_unsupported_architecture_is_a_typed_error(tmp_path, bundled_model_dir):
    path = tmp_path / "other.gguf"
    write_gguf(path, bundled_model_dir, vocab_size=64, arch="gpt2")
    with pytest.raises(UnsupportedModelError, match="'gpt2' model: only Llama-family GGUFs"):
        resolve_model(str(path))
    assert _entries() == []


def test_a_gguf_without_a_tokenizer_is_a_typed_error(tmp_path, bundled_model_dir):
    path = tmp_path / "no-tokenizer.gguf"
    write_gguf(path, bundled_model_dir, vocab_size=64, tokenizer=False)
    with pytest.raises(ModelFormatError, match="no tokenizer in its metadata.*converted with its tokenizer"):
        resolve_model(str(path))
    assert _entries() == []


def test_a_gguf_moved_after_opening_is_a_typed_error(tmp_path, bundled_model_dir):
    path = tmp_path / "moving.gguf"
    write_gguf(path, bundled_model_dir)
    folder = resolve_model(str(path))
    shutil.move(path, tmp_path / "moved.gguf")
    with pytest.raises(ModelNotFoundError, match="is gone"):
        load_folder(folder, device="cpu")
    assert load_folder(resolve_model(str(tmp_path / "moved.gguf")), device="cpu").runner.weights_tag == ""


def test_forcing_file_blocks_on_a_float_only_gguf_is_a_typed_error(tmp_path, bundled_model_dir):
    path = tmp_path / "floats.gguf"
    write_gguf(path, bundled_model_dir)
    with pytest.raises(UnsupportedModelError, match="load it in float32"):
        load_folder(resolve_model(str(path)), device="cpu", file_blocks=True)


def test_config_from_metadata(mixed_gguf):
    path, _ = mixed_gguf
    folder = resolve_model(str(path))
    config = json.loads((folder.path / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"], config["head_dim"]) == (64, 2, 4, 2, 128, 16)
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert config["tie_word_embeddings"] is False and config["max_position_embeddings"] == 2048


def test_llama3_rope_scaling_is_read_from_the_rope_freqs_tensor(tmp_path, bundled_model_dir):
    """llama.cpp stores Llama 3's RoPE scaling as per-frequency divisors (rope_freqs.weight), as the
    1B-shape tool writes them: the config names the scaling transformers computes, and the runner's
    frequencies are the file's (base frequencies divided by its divisors)."""
    from engine.tools.gguf_1b import llama3_divisors

    from tiny_gguf import HEAD_DIM

    divisors = llama3_divisors(HEAD_DIM, 500000.0, 32.0, 1.0, 4.0, 8192)
    assert divisors.min() == 1.0 and divisors.max() == pytest.approx(32.0) and 1 < np.median(divisors) < 32
    path = tmp_path / "llama3.gguf"
    write_gguf(path, bundled_model_dir, {"q": "Q8_0"}, theta=500000.0, rope_freqs=divisors)
    folder = resolve_model(str(path))
    config = json.loads((folder.path / "config.json").read_text())
    assert config["rope_parameters"] == {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}
    runner = load_folder(folder, device="cpu").runner
    base = 1.0 / 500000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    assert runner.rope.rope_type == "llama3"
    assert np.allclose(runner.rope.inv_freq.numpy(), base / divisors, rtol=1e-5)
    wrong = tmp_path / "odd.gguf"
    write_gguf(wrong, bundled_model_dir, theta=500000.0, rope_freqs=divisors[::-1].copy())
    with pytest.raises(UnsupportedModelError, match="RoPE factors"):
        resolve_model(str(wrong))
