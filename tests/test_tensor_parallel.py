"""Tensor parallel (engine/model/runner_tp.py, engine/kv/sharded.py) with the CPU standing in for
every card: the same numbers as one card up to float rounding, lossless decoding on top of it,
offloaded shares bit-identical to resident ones, and a planner plan driving the whole load."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.kv.full import FullCache
from engine.kv.offload import OffloadedCache, cache_factory_for_plan
from engine.kv.sharded import ShardedFullCache, ShardedRetrievalCache
from engine.errors import InvalidSettingError
from engine.events import ChatMessage, DocumentText
from engine.model.loading import load_folder
from engine.offload.shapes import ModelShape
from engine.model.placement import Placement
from engine.offload.planner import DeviceSpec, GpuSpec, plan_placement
from engine.model.runner import LlamaRunner, read_safetensors
from engine.model.runner_tp import TensorParallelRunner, plan_shards, split_evenly
from engine.decoding.session import ChatSession
from engine.settings import DecodeSettings
from streams import answer_tokens
from test_lossless import assert_identical_or_near_tie

CAP = 256
# 8 query heads over 4 KV heads, 3 layers, intermediate 96: splits 1, 2 and 4 ways
SHAPE = dict(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4, intermediate_size=96)


def _runners(folder, cards: int) -> tuple[LlamaRunner, TensorParallelRunner]:
    one = load_folder(folder).runner
    one.kv_dtype = torch.float32  # one card keeps K/V in its dtype (float16 is the CPU target's storage)
    state = read_safetensors(folder)
    return one, TensorParallelRunner(one.config, state, ["cpu"] * cards, torch.float32)


def _forward(runner, cache, ids: torch.Tensor, start: int) -> torch.Tensor:
    return runner.forward(ids, torch.arange(start, start + len(ids)), cache)


@pytest.mark.parametrize("arch,overrides,cards", [
    ("llama", {}, 2), ("llama", {}, 4), ("qwen2", {}, 2), ("llama", {"tie_word_embeddings": True}, 2),
    ("llama", {"num_key_value_heads": 8}, 2),  # MHA
], ids=["llama-2", "llama-4", "qwen2-bias", "tied", "mha"])
def test_logits_and_kv_match_one_card(tiny_model_dir, arch, overrides, cards):
    folder = tiny_model_dir(arch, **{**SHAPE, **overrides})
    one, tp = _runners(folder, cards)
    full, sharded = one.new_full_cache(CAP), tp.new_full_cache(CAP)
    assert isinstance(sharded, ShardedFullCache) and len(sharded.parts) == cards
    ids = torch.randint(0, one.arch.vocab_size, (48,), generator=torch.Generator().manual_seed(3))
    for start, stop in ((0, 40), (40, 41), (41, 45)):  # prefill, decode, verification of 4
        a, b = _forward(one, full, ids[start:stop], start), _forward(tp, sharded, ids[start:stop], start)
        assert b.shape == a.shape
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        assert (b.argmax(-1) == a.argmax(-1)).float().mean() > 0.95
    full.rollback(42)
    sharded.rollback(42)
    assert sharded.length == 42 and all(p.length == 42 for p in sharded.parts)
    for layer in range(one.arch.n_layers):
        for x, y in zip(full.layer_kv(layer, 0, 42), sharded.layer_kv(layer, 0, 42)):
            torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-4)
    assert sharded.bytes_per_token() == full.bytes_per_token()


def test_shards_follow_kv_head_groups():
    from engine.model.runner import Architecture

    arch = Architecture("llama", 10, 64, 2, 8, 4, 8, 96, 1e-5, False, False, 512)
    shards = plan_shards(arch, ["cpu", "cpu"])
    assert [s.kv_heads for s in shards] == [(0, 2), (2, 4)]
    assert [s.q_heads for s in shards] == [(0, 4), (4, 8)]
    assert [s.ffn for s in shards] == [(0, 48), (48, 96)]
    assert [s.vocab for s in shards] == [(0, 5), (5, 10)]
    assert split_evenly(10, 3) == [(0, 4), (4, 7), (7, 10)]
    with pytest.raises(InvalidSettingError, match="KV heads"):
        plan_shards(arch, ["cpu"] * 3)


def test_sharded_retrieval_selects_what_one_card_selects(tiny_model_dir):
    """The same K/V and queries in an unsplit and a 2-way split cache: each card's retrieval
    cache holds exactly its heads' rows of the unsplit selection."""
    folder = tiny_model_dir("llama", **SHAPE)
    one, tp = _runners(folder, 2)
    a = one.arch
    full, sharded = one.new_full_cache(CAP), tp.new_full_cache(CAP)
    g = torch.Generator().manual_seed(5)
    held = 200
    for layer in range(a.n_layers):
        k = torch.randn(a.n_kv_heads, held, a.head_dim, generator=g)
        v = torch.randn(a.n_kv_heads, held, a.head_dim, generator=g)
        full.load_prefix(layer, k, v)
        sharded.load_prefix(layer, k, v)
    full.length = sharded.length = held
    for layer in range(a.n_layers):  # load_prefix splits heads; layer_kv gathers them back
        assert all(torch.equal(x, y) for x, y in zip(full.layer_kv(layer, 0, held), sharded.layer_kv(layer, 0, held)))
    queries = [torch.randn(a.n_heads, a.head_dim, generator=g) for _ in range(a.n_layers)]
    whole = full.retrieval(a.n_heads, budget=64, chunk=8, headroom=32)
    split = sharded.retrieval(a.n_heads, budget=64, chunk=8, headroom=32)
    assert isinstance(split, ShardedRetrievalCache)
    whole.rebuild(queries)
    split.rebuild(queries)
    assert split.length == whole.length and split.budget == 64 and split.room() == whole.room()
    for layer in range(a.n_layers):
        keys = torch.cat([p.keys[layer][:, :p.length] for p in split.parts])
        assert torch.equal(keys, whole.keys[layer][:, :whole.length])


@pytest.mark.parametrize("offloaded", [[1], [0, 1, 2]], ids=["one", "all"])
def test_offloaded_shares_equal_resident_shares_bit_for_bit(tiny_model_dir, offloaded):
    folder = tiny_model_dir("llama", **SHAPE)
    _, tp = _runners(folder, 2)
    resident, off = tp.new_full_cache(CAP), tp.new_full_cache(CAP, offloaded)
    assert all(isinstance(p, OffloadedCache) and p.offloaded == offloaded for p in off.parts)
    ids = torch.randint(0, tp.arch.vocab_size, (60,), generator=torch.Generator().manual_seed(2))
    for cache in (resident, off):
        cache.capture_query = True
    steps = [(0, 30), (30, 35), (33, 36), (36, 37)]
    for start, stop in steps:
        for cache in (resident, off):
            cache.rollback(start)
        a, b = _forward(tp, resident, ids[start:stop], start), _forward(tp, off, ids[start:stop], start)
        assert torch.equal(a, b), f"logits differ for tokens {start}..{stop}"
    assert all(torch.equal(x, y) for x, y in zip(resident.last_query, off.last_query) if x is not None)
    for layer in range(tp.arch.n_layers):
        assert all(torch.equal(x, y) for x, y in zip(resident.layer_kv(layer, 0, 37), off.layer_kv(layer, 0, 37)))
    if len(offloaded) > 2:  # more layers than staging slots: every card streamed its share
        assert all(p.copied_bytes > 0 for p in off.parts)
    assert "split across 2 cards" in off.stats().detail


@pytest.fixture(scope="module")
def tp_model(tiny_model_dir):
    return load_folder(tiny_model_dir("llama", **SHAPE), placement=Placement(tensor_parallel=("cpu", "cpu")))


@pytest.mark.parametrize("overrides", [
    dict(mode="triforce", budget=32, chunk=8, gamma1=2, gamma2=4),
    dict(mode="triforce", budget=64, chunk=16, gamma1=4, gamma2=8),
    dict(mode="retrieval-only", budget=32, chunk=8, gamma2=3),
    dict(mode="draft-only", gamma1=4),
], ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()))
def test_every_mode_on_tensor_parallel_is_token_identical_to_ar(tp_model, sample_text, overrides):
    _check_against_ar(tp_model, sample_text, overrides, "ngram")


def test_tensor_parallel_target_with_a_one_card_draft_model_is_token_identical_to_ar(tp_model, tiny_model_dir,
                                                                                     sample_text):
    """The draft model runs on one card with its StreamingLLM cache (the same weights here, so
    it is accepted often); the split target still decides every token."""
    draft = load_folder(tiny_model_dir("llama", **SHAPE))
    final = _check_against_ar(tp_model, sample_text, dict(mode="triforce", budget=64, chunk=16, gamma1=3, gamma2=6),
                              draft)
    assert final.metrics.level("l0_l1").accepted > 0


def _check_against_ar(tp_model, sample_text, overrides, draft):
    assert isinstance(tp_model.runner, TensorParallelRunner)
    doc = [DocumentText("Hamlet", sample_text[:3000])]
    messages = [ChatMessage("user", "Repeat the first line of the play.")]
    base = DecodeSettings(max_new_tokens=40)
    reference, _ = answer_tokens(ChatSession(tp_model, base.replace(mode="ar"), draft="none", capacity=2048), messages, doc)
    fast = ChatSession(tp_model, base.replace(**overrides), draft=draft, capacity=2048)
    got, final = answer_tokens(fast, messages, doc)
    assert isinstance(fast.full, ShardedFullCache)
    assert_identical_or_near_tie(tp_model, fast.prompt_tokens(messages, doc), reference, got)
    assert len(got) > 5
    if overrides["mode"] != "draft-only":
        assert isinstance(fast.decoder.retrieval, ShardedRetrievalCache) and fast.decoder.rebuilds >= 1
    return final


def test_a_two_card_plan_loads_tensor_parallel_with_offloaded_kv(tiny_model_dir, sample_text):
    """Two small "GPUs" (the CPU standing in for both): the planner picks tensor parallel and
    offloads some layers' KV; Placement.from_plan loads the weights that way, the session puts
    each card's share of those layers in CPU memory, and TriForce gives AR's tokens."""
    folder = tiny_model_dir("llama", **SHAPE)
    config = load_folder(folder).config
    shape = ModelShape.from_config(config, name="tiny")
    settings = DecodeSettings(mode="triforce", budget=64, chunk=8, gamma1=3, gamma2=5, max_new_tokens=32)
    big = GpuSpec("test GPU", 1 << 34, 1 << 34, 1000.0, 25.0)
    # free all-reduces: on a model this small, splitting pays only when syncs cost nothing
    ram = DeviceSpec("test", 1 << 36, 1 << 36, gpus=(big, big), allreduce_us=0.0)
    roomy = plan_placement(shape, None, 2048, settings, ram, headroom_bytes=0)
    assert roomy.mode == "tensor-parallel" and roomy.kv_layers_offloaded == 0
    card = roomy.device("cuda:0")
    layer_share = card.component("full_kv") // shape.layers
    # one byte short of all three layers' share: two staging buffers fit, so every layer streams
    tight = dataclasses.replace(big, free_bytes=card.used_bytes - card.component("full_kv") + 3 * layer_share - 1)
    plan = plan_placement(shape, None, 2048, settings, dataclasses.replace(ram, gpus=(tight, tight)), headroom_bytes=0)
    assert plan.mode == "tensor-parallel" and plan.kv_layers_offloaded == 3
    placement = Placement.from_plan(plan, cards={"cuda:0": "cpu", "cuda:1": "cpu"})
    assert placement.tensor_parallel == ("cpu", "cpu") and placement.offloaded == (0, 1, 2)
    model = load_folder(folder, placement=placement)
    assert isinstance(model.runner, TensorParallelRunner)

    doc = [DocumentText("Hamlet", sample_text[:2500])]
    messages = [ChatMessage("user", "Repeat the first line of the play.")]
    reference, _ = answer_tokens(ChatSession(model, settings.replace(mode="ar"), draft="none", capacity=2048), messages, doc)
    session = ChatSession(model, settings, draft="ngram", capacity=2048, cache_factory=cache_factory_for_plan(plan))
    got, final = answer_tokens(session, messages, doc)
    assert all(isinstance(p, OffloadedCache) and p.offloaded == list(placement.offloaded) for p in session.full.parts)
    assert got == reference and len(got) > 5
    full_stats = next(c for c in final.metrics.caches if c.name == "full")
    assert "split across 2 cards" in full_stats.detail and "3 of 3 layers offloaded" in full_stats.detail


def test_layer_split_plan_loads_layers_on_their_cards(tiny_model_dir):
    folder = tiny_model_dir("llama", **SHAPE)
    shape = ModelShape.from_config(load_folder(folder).config, name="tiny")
    plan = plan_placement(shape, None, 2048, DecodeSettings(), "4090x2", tensor_parallel=False)
    forced = dataclasses.replace(plan, mode="layer-split", layer_devices=("cuda:0", "cuda:1", "cuda:1"))
    placement = Placement.from_plan(forced, cards={"cuda:0": "cpu", "cuda:1": "cpu"})
    assert placement.layer_devices == ("cpu",) * 3 and not placement.tensor_parallel
    assert Placement.from_plan(forced).layer_devices == ("cuda:0", "cuda:1", "cuda:1")
    runner = load_folder(folder, placement=placement).runner
    assert isinstance(runner, LlamaRunner) and len(runner.layer_devices) == 3


def test_runner_refuses_an_unsharded_cache(tp_model):
    a = tp_model.runner.arch
    with pytest.raises(TypeError, match="sharded cache"):
        tp_model.runner.forward(torch.tensor([1, 2]), torch.arange(2),
                                FullCache(a.n_layers, a.n_kv_heads, a.head_dim, 8, torch.float32, "cpu"))


def test_tensor_parallel_snapshots_are_kept_apart_from_one_card_ones(tp_model, tiny_model_dir):
    """Split matmuls round differently, so a book prefilled on one card is not restored into a
    tensor-parallel session (nor the reverse): the snapshot key says how the K/V was computed."""
    one = load_folder(tiny_model_dir("llama", **SHAPE))
    one.runner.kv_dtype = torch.float32  # as a card stores K/V (the CPU's float16 has its own key part)
    key_one = ChatSession(one, DecodeSettings(), capacity=8192)._snapshot_key()
    key_tp = ChatSession(tp_model, DecodeSettings(), capacity=8192)._snapshot_key()
    assert key_tp == key_one + ":tp2"
    assert tp_model.where == "cpu+cpu (tensor parallel)" and one.where == "cpu"


def test_a_natively_prefilled_book_is_kept_apart_from_an_sdpa_one(tiny_model_dir, monkeypatch):
    """The native prefill kernel and SDPA store K/V of other bits: a snapshot made by one is never
    restored into a session that prefills with the other."""
    from engine import native

    model = load_folder(tiny_model_dir("llama", **SHAPE))
    monkeypatch.setattr(native, "available", lambda: True)
    key_native = ChatSession(model, DecodeSettings(), capacity=8192)._snapshot_key()
    monkeypatch.setattr(native, "available", lambda: False)
    key_sdpa = ChatSession(model, DecodeSettings(), capacity=8192)._snapshot_key()
    assert key_native != key_sdpa and ":attn-native" not in key_sdpa
