"""Our compact runner against transformers' own forward (the correctness oracle)."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from engine.kv.full import FullCache
from engine.model.runner import LlamaRunner

ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 1024, "rope_theta": 500000.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048, "rope_theta": 10000.0},
}

CASES = [("llama", rope, kv) for rope in ROPES for kv in (2, 4)] + [("mistral", "default", 2), ("qwen2", "default", 2),
                                                                    ("qwen2", "yarn", 4)]


def _pair(folder):
    config = AutoConfig.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours = LlamaRunner.from_folder(folder, config, torch.device("cpu"), torch.float32)
    return hf, ours


@pytest.mark.parametrize("arch,rope,kv_heads", CASES)
def test_logits_match_transformers(tiny_model_dir, arch, rope, kv_heads):
    overrides = {"num_key_value_heads": kv_heads}
    if ROPES[rope]:
        overrides["rope_parameters"] = ROPES[rope]
    hf, ours = _pair(tiny_model_dir(arch, **overrides))
    assert ours.rope.rope_type == (ROPES[rope] or {}).get("rope_type", "default")
    torch.manual_seed(1)
    ids = torch.randint(0, ours.arch.vocab_size, (40,))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]  # [40, V]
    a = ours.arch
    cache = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, 64, torch.float32, "cpu")
    prefill = ours.forward(ids[:32], torch.arange(32), cache)  # [32, V]
    assert (prefill - ref[:32]).abs().max().item() < 1e-4
    # multi-token continuation against the cached prefix (what verification does)
    cont = ours.forward(ids[32:], torch.arange(32, 40), cache)
    assert (cont - ref[32:]).abs().max().item() < 1e-4
    # roll back and recompute: bit-identical
    cache.rollback(35)
    again = ours.forward(ids[35:], torch.arange(35, 40), cache)
    assert torch.equal(again, cont[3:]) or (again - cont[3:]).abs().max().item() < 1e-5


@pytest.mark.bundled
def test_bundled_top1_and_greedy_match_transformers(bundled_float32_dir, bundled_tokenizer, sample_passage):
    hf, ours = _pair(bundled_float32_dir)
    ids = torch.tensor(bundled_tokenizer(sample_passage(1000))["input_ids"][:1000])
    assert len(ids) >= 990
    a = ours.arch
    cache = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, 1200, torch.float32, "cpu")
    ours_top = torch.cat([ours.forward(ids[i:i + 250], torch.arange(i, min(i + 250, len(ids))), cache).argmax(-1)
                          for i in range(0, len(ids), 250)])
    with torch.no_grad():
        ref_top = hf(ids[None]).logits[0].argmax(-1)
    assert torch.equal(ours_top, ref_top)

    prompt = ids[:200]
    with torch.no_grad():
        ref = hf.generate(prompt[None], max_new_tokens=64, do_sample=False, eos_token_id=None)[0, 200:].tolist()
    cache.rollback(0)
    logits = ours.forward(prompt, torch.arange(200), cache, last_only=True)[0]
    mine = []
    for step in range(64):
        token = int(logits.argmax())
        mine.append(token)
        logits = ours.forward(torch.tensor([token]), torch.tensor([200 + step]), cache)[0]
    assert mine == ref
