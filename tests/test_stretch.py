"""A longer context as a user option (engine/model/stretch.py): YaRN with the smallest factor that
fits, checked against transformers' own YaRN forward past the trained context."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from engine.errors import InvalidSettingError, UnsupportedModelError
from engine.kv.full import FullCache
from engine.model.loading import load_folder
from engine.model.stretch import (Stretch, describe_rope, rope_tag, stretch_config, stretch_factor,
                                  stretched_dict, stretched_shape)

TRAINED = 128  # the tiny model's trained context: the test reads positions far past it


def test_the_factor_is_the_smallest_that_fits():
    assert stretch_factor(8192, 16384) == 2.0
    assert stretch_factor(8192, 32768) == 4.0
    assert stretch_factor(8192, 12288) == 1.5
    assert stretch_factor(8192, 4096) == 1.0  # never a compression


def test_a_config_and_its_json_stretch_alike():
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=8192)
    as_dict = stretched_dict(config.to_dict(), 16384 + 128, scale=16384)
    stretch_config(config, Stretch(16384 + 128, scale=16384))
    assert config.max_position_embeddings == as_dict["max_position_embeddings"] == 16512
    for key in ("rope_type", "factor", "original_max_position_embeddings"):
        assert config.rope_parameters[key] == as_dict["rope_parameters"][key]
    assert config.rope_parameters["factor"] == 2.0 and config.rope_parameters["original_max_position_embeddings"] == 8192
    assert describe_rope(config) == "YaRN x2 over a trained 8192" == describe_rope(as_dict)
    assert rope_tag(config) == "yarn-2-8192"


def test_no_stretch_within_the_trained_context():
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=8192)
    before = dict(config.rope_parameters)
    stretch_config(config, 4096)
    assert config.max_position_embeddings == 8192 and dict(config.rope_parameters) == before
    assert describe_rope(config) is None and rope_tag(config) == ""


def test_too_far_or_already_scaled_is_refused():
    cfg = {"max_position_embeddings": 8192, "rope_theta": 10000.0}
    with pytest.raises(InvalidSettingError, match="at most 65536"):
        stretched_dict(cfg, 8192 * 9)
    scaled = {**cfg, "rope_parameters": {"rope_type": "llama3", "factor": 8.0}}
    with pytest.raises(UnsupportedModelError, match="already scales"):
        stretched_dict(scaled, 16384)


def test_the_planner_counts_the_stretched_kv():
    from engine.offload.planner import plan_placement
    from engine.offload.shapes import ModelShape
    from engine.settings import DecodeSettings

    shape = ModelShape.from_config({"model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
                                    "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
                                    "intermediate_size": 1536, "max_position_embeddings": 8192}, name="m")
    stretched = stretched_shape(shape, 32768)
    assert stretched.max_context == 32768 and stretched_shape(shape, 4096) is shape
    settings = DecodeSettings().fit_budget(16384)
    short = plan_placement(stretched, None, 16384, settings, "cpu", raise_on_misfit=False)
    long = plan_placement(stretched, None, 32768, settings, "cpu", raise_on_misfit=False)
    kv = [plan.bytes_by_component()["full_kv"]["cpu"] for plan in (short, long)]
    assert kv[1] == 2 * kv[0]  # the KV of the whole stretched window is counted, not cut at 8192


def test_stretched_logits_match_transformers_yarn(tiny_model_dir):
    """Load a tiny random Llama trained on 128 tokens with --context 512: our runner is YaRN x4, and
    its logits at positions up to 4x past the trained context are transformers' YaRN model's."""
    folder = tiny_model_dir("llama", max_position_embeddings=TRAINED)
    model = load_folder(folder, device="cpu", file_blocks=False, context=4 * TRAINED)
    assert model.max_context == 4 * TRAINED and model.runner.rope.rope_type == "yarn"
    oracle_config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    oracle_config.update(max_position_embeddings=4 * TRAINED,
                         rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                          "original_max_position_embeddings": TRAINED})
    hf = AutoModelForCausalLM.from_pretrained(folder, config=LlamaConfig(**oracle_config), dtype=torch.float32).eval()
    torch.manual_seed(2)
    n = 4 * TRAINED - 16
    ids = torch.randint(0, model.runner.arch.vocab_size, (n,))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]  # [n, V]
    a = model.runner.arch
    cache = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, 4 * TRAINED, torch.float32, "cpu")
    ours = torch.cat([model.runner.forward(ids[i:i + 100], torch.arange(i, min(n, i + 100)), cache)
                      for i in range(0, n, 100)])  # [n, V], chunked like a prefill
    past = slice(TRAINED, n)
    assert (ours[past] - ref[past]).abs().max().item() < 1e-4
    # and the stretch is not a no-op: the unstretched model's logits there differ
    plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        unstretched = plain(ids[None]).logits[0]
    assert (unstretched[past] - ref[past]).abs().max().item() > 1e-3  # 10x the tolerance above


def test_the_engine_opens_a_model_stretched_to_its_context(tiny_model_dir):
    from engine.api import Engine

    folder = tiny_model_dir("llama", max_position_embeddings=TRAINED)
    engine = Engine(devices="cpu", snapshots=False, context=3 * TRAINED)
    model = engine.load_weights(engine.resolve(str(folder)))
    assert model.max_context == 3 * TRAINED and model.runner.rope.rope_type == "yarn"
    assert model.config.rope_parameters["factor"] == 3.0
    assert Engine(devices="cpu").load_weights(engine.resolve(str(folder))).max_context == TRAINED


def test_chat_refuses_a_context_out_of_range_in_one_line(tiny_model_dir, capsys):
    from engine.cli import main

    with pytest.raises(SystemExit) as refused:  # refused as it is parsed, before anything loads
        main(["chat", "--model", "/no/such/model", "--ask", "hi", "--no-save", "--context", "0"])
    assert refused.value.code == 2 and "--context: 0 is out of range" in capsys.readouterr().err
    folder = tiny_model_dir("llama", max_position_embeddings=TRAINED)
    assert main(["chat", "--model", str(folder), "--ask", "hi", "--no-save", "--context", str(9 * TRAINED)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (after the tiny model's own progress lines)
    assert last.startswith("error: --context 1152 would stretch") and last.endswith("use at most 1024 tokens")
