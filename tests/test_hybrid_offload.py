"""Hybrid offload (engine/kv/offload.py, cpu_heads): an offloaded layer's first KV heads are attended
on the CPU where their K/V live, the rest streamed, in decode/verification forwards; prefill streams
every head. With the CPU standing in for the cards: logits equal the resident cache's within float
tolerance, K/V bit-identical, through prefill, verify, roll back and re-verify; decoding modes are
token-identical to ar on a hybrid placement; tensor parallel splits each card's share the same way."""
from __future__ import annotations

import pytest
import torch

from engine.events import ChatMessage, DocumentText
from engine.kv.full import FullCache
from engine.kv.offload import OffloadedCache
from engine.errors import InvalidSettingError
from engine.model.loading import load_folder
from engine.model.placement import Placement
from engine.decoding.session import ChatSession
from engine.settings import DecodeSettings
from streams import answer_tokens
from test_lossless import assert_identical_or_near_tie
from test_tensor_parallel import SHAPE, _runners

CAP = 256
# 8 query heads over 4 KV heads, 3 layers
LAYERS = SHAPE["num_hidden_layers"]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_folder(tiny_model_dir("llama", **SHAPE))


def _forward(runner, cache, ids: torch.Tensor, start: int) -> torch.Tensor:
    return runner.forward(ids, torch.arange(start, start + len(ids)), cache)


def _same_kv(a, b, length: int, exact_layers: int = 1) -> None:
    """Layer 0's K/V are bit-identical (same inputs); later layers' inputs carry the attention
    outputs' rounding, so their K/V agree within float tolerance."""
    for layer in range(LAYERS):
        for x, y in zip(a.layer_kv(layer, 0, length), b.layer_kv(layer, 0, length)):
            if layer < exact_layers:
                assert torch.equal(x, y), f"layer {layer} K/V differ"
            else:
                torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


STEPS = [(0, 90), (90, 97), (93, 100), (100, 101), (101, 102), (40, 47), (47, 130), (130, 137)]  # prefill, verify,
# roll back + re-verify, decode, decode, an earlier roll back (chat edited), a prefill chunk after hybrid steps, verify


@pytest.mark.parametrize("cpu_heads", [1, 2, 4, {0: 3, 2: 1}], ids=["one", "half", "all", "per-layer"])
@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "serial"])
def test_hybrid_logits_equal_resident_and_kv_identical(model, cpu_heads, prefetch):
    runner = model.runner
    a = runner.arch
    full = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device)
    hybrid = OffloadedCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device, [0, 1, 2],
                            prefetch=prefetch, cpu_heads=cpu_heads)
    stream = OffloadedCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device, [0, 1, 2],
                            prefetch=prefetch)
    ids = torch.randint(0, a.vocab_size, (140,), generator=torch.Generator().manual_seed(4))
    for start, stop in STEPS:
        for cache in (full, hybrid, stream):
            cache.rollback(min(cache.length, start))
        want = _forward(runner, full, ids[start:stop], start)
        got = _forward(runner, hybrid, ids[start:stop], start)
        if start == 0:  # the first prefill streams every head over identical K/V: bit-equal
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        _forward(runner, stream, ids[start:stop], start)
        _same_kv(full, hybrid, stop)
    assert hybrid.cpu_attended_bytes > 0
    assert hybrid.copied_bytes < stream.copied_bytes  # the CPU heads never crossed PCIe in verification
    assert "hybrid" in hybrid.stats().detail


@pytest.mark.parametrize("cpu_heads", [1, 3, 4])
def test_cache_level_kv_bit_identical_and_outputs_close(cpu_heads):
    """The same q/k/v fed straight into a resident and a hybrid cache, layer by layer: stored K/V
    bit-identical in every layer, attention outputs equal within float tolerance."""
    from engine.kv.rope import Rotary
    from transformers import LlamaConfig

    n_layers, hkv, hq, d = 3, 4, 8, 16
    rope = Rotary(LlamaConfig(hidden_size=hq * d, num_attention_heads=hq, max_position_embeddings=CAP), d,
                  torch.device("cpu"), CAP)
    full = FullCache(n_layers, hkv, d, CAP, torch.float32, "cpu")
    hybrid = OffloadedCache(n_layers, hkv, d, CAP, torch.float32, "cpu", [0, 1, 2], cpu_heads=cpu_heads)
    gen = torch.Generator().manual_seed(7)
    for start, stop in [(0, 60), (60, 67), (62, 69), (69, 70)]:
        for cache in (full, hybrid):
            cache.rollback(min(cache.length, start))
        pos = torch.arange(start, stop)
        for cache in (full, hybrid):
            cache.begin(pos, rope)
        for layer in range(n_layers):
            q = torch.randn(hq, stop - start, d, generator=gen)
            k, v = torch.randn(hkv, stop - start, d, generator=gen), torch.randn(hkv, stop - start, d, generator=gen)
            torch.testing.assert_close(hybrid.attend(layer, q, k, v), full.attend(layer, q, k, v), rtol=1e-5, atol=1e-5)
        for cache in (full, hybrid):
            cache.end()
    for layer in range(n_layers):
        assert all(torch.equal(x, y) for x, y in zip(full.layer_kv(layer, 0, 70), hybrid.layer_kv(layer, 0, 70)))


def test_hybrid_would_catch_a_wrong_head_order(model):
    """Swapping the CPU and streamed heads' outputs changes the logits: the comparison has power."""
    runner = model.runner
    a = runner.arch
    full = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device)
    ids = torch.randint(0, a.vocab_size, (60,), generator=torch.Generator().manual_seed(5))
    _forward(runner, full, ids[:50], 0)
    want = _forward(runner, full, ids[50:57], 50)
    full.rollback(50)
    original = torch.cat

    def swapped(tensors, *args, **kwargs):
        if len(tensors) == 2 and tensors[0].dim() == 3 and tensors[0].shape[1:] == tensors[1].shape[1:] \
                and tensors[0].shape[0] == tensors[1].shape[0]:
            tensors = [tensors[1], tensors[0]]
        return original(tensors, *args, **kwargs)

    hybrid = OffloadedCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device, [0, 1, 2],
                            cpu_heads=2)
    _forward(runner, hybrid, ids[:50], 0)
    torch.cat = swapped
    try:
        got = _forward(runner, hybrid, ids[50:57], 50)
    finally:
        torch.cat = original
    assert (got - want).abs().max() > 1e-3


def test_bad_split_is_a_setting_error(model):
    a = model.runner.arch
    with pytest.raises(InvalidSettingError, match="cpu_heads"):
        OffloadedCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, torch.float32, "cpu", [0], cpu_heads={1: 1})
    with pytest.raises(InvalidSettingError, match="cpu_heads"):
        OffloadedCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, torch.float32, "cpu", [0], cpu_heads=5)


def test_tensor_parallel_shares_split_the_same_way(tiny_model_dir):
    _, tp = _runners(tiny_model_dir("llama", **SHAPE), 2)
    resident, hybrid = tp.new_full_cache(CAP), tp.new_full_cache(CAP, [0, 1, 2], cpu_heads=1)
    assert all(p.cpu_heads == {0: 1, 1: 1, 2: 1} for p in hybrid.parts)
    ids = torch.randint(0, tp.arch.vocab_size, (60,), generator=torch.Generator().manual_seed(6))
    for start, stop in [(0, 40), (40, 47), (43, 50), (50, 51)]:
        for cache in (resident, hybrid):
            cache.rollback(min(cache.length, start))
        want, got = _forward(tp, resident, ids[start:stop], start), _forward(tp, hybrid, ids[start:stop], start)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    _same_kv(resident, hybrid, 51)
    assert all(p.cpu_attended_bytes > 0 for p in hybrid.parts)


MODES = [
    dict(mode="triforce", budget=32, chunk=8, gamma1=2, gamma2=4),
    dict(mode="triforce", budget=64, chunk=16, gamma1=4, gamma2=8),
    dict(mode="retrieval-only", budget=32, chunk=8, gamma2=3),
    dict(mode="draft-only", gamma1=4),
]


def _hybrid_factory(runner, size: int):
    return runner.new_full_cache(size, [0, 1, 2], cpu_heads={0: 1, 1: 2, 2: 4})


@pytest.mark.parametrize("overrides", MODES, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()))
def test_every_mode_is_token_identical_to_ar_on_a_hybrid_placement(model, sample_text, overrides):
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    messages = [ChatMessage("user", "Repeat the first line of the play.")]
    base = DecodeSettings(max_new_tokens=40)
    ar = ChatSession(model, base.replace(mode="ar"), draft="none", capacity=2048, cache_factory=_hybrid_factory)
    reference, _ = answer_tokens(ar, messages, doc)
    fast = ChatSession(model, base.replace(**overrides), draft="ngram", capacity=2048, cache_factory=_hybrid_factory)
    got, _ = answer_tokens(fast, messages, doc)
    assert isinstance(fast.full, OffloadedCache) and fast.full.cpu_attended_bytes > 0
    assert_identical_or_near_tie(model, fast.prompt_tokens(messages, doc), reference, got)
    assert len(got) > 5


def test_tensor_parallel_hybrid_triforce_is_token_identical_to_ar(tiny_model_dir, sample_text):
    tp_model = load_folder(tiny_model_dir("llama", **SHAPE), placement=Placement(tensor_parallel=("cpu", "cpu")))
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    messages = [ChatMessage("user", "Repeat the first line of the play.")]
    base = DecodeSettings(max_new_tokens=40)

    def factory(runner, size):
        return runner.new_full_cache(size, [0, 1, 2], cpu_heads=1)
    reference, _ = answer_tokens(ChatSession(tp_model, base.replace(mode="ar"), draft="none", capacity=2048,
                                             cache_factory=factory), messages, doc)
    fast = ChatSession(tp_model, base.replace(mode="triforce", budget=64, chunk=16, gamma1=3, gamma2=6), draft="ngram",
                       capacity=2048, cache_factory=factory)
    got, _ = answer_tokens(fast, messages, doc)
    assert_identical_or_near_tie(tp_model, fast.prompt_tokens(messages, doc), reference, got)
    assert len(got) > 5


def test_a_hybrid_plan_drives_the_cache_and_the_placement(model, sample_text):
    """A small "GPU" forces layers out; with fast CPU attention the planner splits their heads; the
    plan's cache factory and Placement.from_plan carry the split; TriForce gives AR's tokens."""
    import dataclasses

    from engine.kv.offload import cache_factory_for_plan, hybrid_split
    from engine.offload.planner import DeviceSpec, GpuSpec, plan_placement
    from engine.offload.shapes import ModelShape

    shape = ModelShape.from_config(model.runner.config, name="tiny")
    settings = DecodeSettings(mode="triforce", budget=64, chunk=8, gamma1=3, gamma2=5, max_new_tokens=32)
    big = GpuSpec("test GPU", 1 << 34, 1 << 34, 1000.0, 25.0)
    ram = DeviceSpec("test", 1 << 36, 1 << 36, gpus=(big,), hop_us=0.0)
    card = plan_placement(shape, None, 2048, settings, ram, headroom_bytes=0).device("cuda:0")
    tight = dataclasses.replace(big, free_bytes=card.used_bytes - card.component("full_kv") + 2 * card.component("full_kv") // LAYERS)
    plan = plan_placement(shape, None, 2048, settings, dataclasses.replace(ram, gpus=(tight,)), headroom_bytes=0,
                          cpu_attn_gbps=60)
    assert plan.offload_mode == "hybrid" and plan.kv_layers_offloaded >= 1
    split = hybrid_split(plan)
    assert split and all(plan.kv_devices[i] == "cpu" and 0 < c <= shape.kv_heads for i, c in split.items())
    placement = Placement.from_plan(plan, cards={"cuda:0": "cpu"})
    assert dict(placement.cpu_heads) == split and placement.cache_options() == {"cpu_heads": split}
    stream = plan_placement(shape, None, 2048, settings, dataclasses.replace(ram, gpus=(tight,)), headroom_bytes=0,
                            cpu_attn_gbps=0)
    assert hybrid_split(stream) == {} and Placement.from_plan(stream).cache_options() == {}

    doc = [DocumentText("Hamlet", sample_text[:2500])]
    messages = [ChatMessage("user", "Repeat the first line of the play.")]
    reference, _ = answer_tokens(ChatSession(model, settings.replace(mode="ar"), draft="none", capacity=2048), messages, doc)
    session = ChatSession(model, settings, draft="ngram", capacity=2048, cache_factory=cache_factory_for_plan(plan))
    got, final = answer_tokens(session, messages, doc)
    assert session.full.cpu_heads == split and session.full.cpu_attended_bytes > 0
    assert_identical_or_near_tie(model, session.prompt_tokens(messages, doc), reference, got)
    full_stats = next(c for c in final.metrics.caches if c.name == "full")
    assert "hybrid" in full_stats.detail
