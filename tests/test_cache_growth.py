"""A session's full cache can start small and grow when a turn needs more: the held K/V moves
over exactly, so every answer is token-identical to a session that reserved the whole context."""
from __future__ import annotations

import pytest

from engine.kv.full import FullCache
from engine.kv.offload import OffloadedCache
from engine.errors import ContextOverflowError
from engine.events import ChatMessage, DocumentText
from engine.model.loading import load_folder
from engine.decoding.session import ChatSession
from engine.settings import DecodeSettings
from streams import answer_tokens

SETTINGS = DecodeSettings(mode="triforce", budget=64, chunk=16, gamma1=3, gamma2=5, max_new_tokens=24)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_folder(tiny_model_dir("llama", num_hidden_layers=3))


def _two_turns(session: ChatSession, sample_text: str) -> list[list[int]]:
    """A short first turn, then a document that outgrows a small cache."""
    first, _ = answer_tokens(session, [ChatMessage("user", "Say hello.")])
    doc = [DocumentText("Hamlet", sample_text[:4000])]
    second, _ = answer_tokens(session, [ChatMessage("user", "Who keeps watch?")], doc)
    return [first, second]


def test_a_growing_cache_gives_the_same_tokens_as_a_full_size_one(tiny, sample_text):
    reference = _two_turns(ChatSession(tiny, SETTINGS, capacity=8192), sample_text)
    grown = ChatSession(tiny, SETTINGS, capacity=8192, initial_capacity=128)
    moved = []
    make_room = grown._make_room

    def watching(prompt_len):
        held = grown.full.length
        make_room(prompt_len)
        moved.append((held, grown.capacity))
    grown._make_room = watching
    got = _two_turns(grown, sample_text)
    assert got == reference and all(len(t) > 5 for t in got)
    # the first turn fits in 128 tokens; the document's turn grows the cache, carrying the first
    # turn's K/V over, to one 4096-token step
    assert moved[0] == (0, 128) and moved[1][0] > 50 and moved[1][1] == 4096 and grown.grown == 1
    assert grown.full.capacity == grown.capacity and grown.full.length == len(grown.held)


def test_growing_may_change_which_layers_are_offloaded(tiny, sample_text):
    """The cache factory hears each new size: here a small cache is resident and a big one
    offloads two layers (as a planner would on a full card). Tokens stay identical."""
    sizes = []

    def factory(runner, size):
        sizes.append(size)
        return runner.new_full_cache(size, [1, 2] if size > 1024 else ())

    reference = _two_turns(ChatSession(tiny, SETTINGS, capacity=8192), sample_text)
    session = ChatSession(tiny, SETTINGS, capacity=8192, initial_capacity=128, cache_factory=factory)
    assert isinstance(session.full, FullCache) and not isinstance(session.full, OffloadedCache)
    assert _two_turns(session, sample_text) == reference
    assert sizes[0] == 128 and sizes[-1] > 1024
    assert isinstance(session.full, OffloadedCache) and session.full.offloaded == [1, 2]


def test_growth_stops_at_the_context_with_the_usual_message(tiny, sample_text):
    session = ChatSession(tiny, SETTINGS, capacity=600, initial_capacity=128)
    with pytest.raises(ContextOverflowError, match="this model's context holds 600"):
        answer_tokens(session, [ChatMessage("user", "Who keeps watch?")], [DocumentText("Hamlet", sample_text[:4000])])
    assert session.capacity == 128 and session.grown == 0  # refused before anything moved


def test_replanning_a_loaded_model_keeps_weights_and_offloads_only_what_the_size_needs():
    """Planned for the whole 128K context, the weights stay put; the KV for a shorter chat is
    planned again with them (plan_placement(same_as=)), so it stays on the card."""
    from engine.offload.shapes import shape_for
    from engine.model.placement import placement_for_shapes

    settings = DecodeSettings()
    one = placement_for_shapes(shape_for("meta-llama/Llama-3.1-8B-Instruct"),
                               shape_for("meta-llama/Llama-3.2-1B-Instruct"), None, settings, "4090")
    assert one.plan.mode == "single-gpu" and one.plan.context_tokens == 131072
    assert [len(one.offloaded_for(n)) for n in (16384, 65536, 131072)] == [0, 15, 25]
    two = placement_for_shapes(shape_for("NousResearch/Yarn-Llama-2-7b-128k"), shape_for("JackFram/llama-68m"),
                               None, settings, "4090x2")
    assert two.plan.mode == "tensor-parallel" and two.plan_for(16384).mode == "tensor-parallel"
    assert [len(two.offloaded_for(n)) for n in (16384, 65536, 131072)] == [0, 4, 19]


def test_a_tensor_parallel_session_grows_into_offloading_as_the_plan_says(tiny_model_dir, sample_text):
    """Two small "GPUs" (the CPU standing in): at 256 tokens every layer's KV stays on the cards;
    the document's turn needs more, the plan for that size offloads every layer, and each card's
    share moves to CPU memory. Tokens equal AR's on the same split model."""
    import dataclasses

    from engine.kv.sharded import ShardedFullCache
    from engine.offload.shapes import ModelShape
    from engine.model.placement import Placement, placement_for_shapes
    from engine.offload.planner import DeviceSpec, GpuSpec

    folder = tiny_model_dir("llama", num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4,
                            intermediate_size=96)
    shape = ModelShape.from_config(load_folder(folder).config, name="tiny")
    gpu = GpuSpec("test GPU", 1 << 34, 1 << 34, 1000.0, 25.0)
    spec = DeviceSpec("test", 1 << 36, 1 << 36, gpus=(gpu, gpu), allreduce_us=0.0)
    roomy = placement_for_shapes(shape, None, 4096, SETTINGS, spec, headroom_bytes=0)
    card = roomy.plan.device("cuda:0")
    layer_share = card.component("full_kv") // shape.layers  # at 4096 tokens
    tight = dataclasses.replace(gpu, free_bytes=card.used_bytes - card.component("full_kv") + 3 * layer_share - 1)
    placed = placement_for_shapes(shape, None, 4096, SETTINGS, dataclasses.replace(spec, gpus=(tight, tight)),
                                  headroom_bytes=0)
    assert placed.plan.mode == "tensor-parallel" and placed.offloaded_for(4096) == [0, 1, 2]
    assert placed.offloaded_for(256) == []
    model = load_folder(folder, placement=Placement(tensor_parallel=("cpu", "cpu")))
    reference = _two_turns(ChatSession(model, SETTINGS.replace(mode="ar"), capacity=4096), sample_text)
    session = ChatSession(model, SETTINGS, capacity=4096, initial_capacity=256, cache_factory=placed.cache_factory())
    assert isinstance(session.full, ShardedFullCache) and not isinstance(session.full.parts[0], OffloadedCache)
    assert _two_turns(session, sample_text) == reference
    assert session.capacity == 4096 and all(isinstance(p, OffloadedCache) and p.offloaded == [0, 1, 2]
                                            for p in session.full.parts)
