"""The offloaded full cache (engine/kv/offload.py) is FullCache bit for bit, on the CPU standing
in for both sides: prefill, multi-token verification, roll back and regenerate, with some and
all layers offloaded, prefetching or serial; a whole chat with an offloaded plan; a layer split
across two "devices" (both the CPU here); the retrieval rebuild from an offloaded cache."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.kv.full import FullCache
from engine.kv.offload import OffloadedCache, cache_factory_for_plan, offloaded_layers
from engine.kv.retrieval import RetrievalCache
from engine.events import ChatMessage, DocumentText
from engine.model.loading import load_folder
from engine.offload.shapes import ModelShape
from engine.offload.planner import DeviceSpec, GpuSpec, plan_placement
from engine.model.runner import LlamaRunner
from engine.decoding.session import ChatSession
from engine.settings import DecodeSettings
from streams import answer_tokens

LAYERS = 4
CAP = 256


@pytest.fixture(scope="module")
def tiny4(tiny_model_dir):
    return load_folder(tiny_model_dir("llama", num_hidden_layers=LAYERS))


def _caches(runner: LlamaRunner, offloaded, **options):
    a = runner.arch
    full = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device, exact=False)
    off = OffloadedCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device, offloaded, **options)
    return full, off


def _step(runner, caches, tokens: torch.Tensor, start: int, capture: bool = False) -> list[torch.Tensor]:
    out = []
    for cache in caches:
        cache.capture_query = capture
        out.append(runner.forward(tokens, torch.arange(start, start + len(tokens)), cache))
    return out


def _same_state(full: FullCache, off: OffloadedCache) -> None:
    assert off.length == full.length
    for layer in range(full.n_layers):
        for a, b in zip(full.layer_kv(layer, 0, full.length), off.layer_kv(layer, 0, off.length)):
            assert torch.equal(a, b), f"layer {layer} differs"


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "serial"])
@pytest.mark.parametrize("offloaded", [[1], [1, 2, 3], [0, 1, 2, 3]], ids=["one", "three", "all"])
def test_offloaded_cache_equals_full_cache_bit_for_bit(tiny4, offloaded, prefetch):
    runner = tiny4.runner
    full, off = _caches(runner, offloaded, prefetch=prefetch)
    ids = torch.randint(0, runner.arch.vocab_size, (160,), generator=torch.Generator().manual_seed(1))
    # prefill in two chunks, the last one capturing the query for the retrieval cache
    a, b = _step(runner, (full, off), ids[:64], 0)
    assert torch.equal(a, b)
    a, b = _step(runner, (full, off), ids[64:120], 64, capture=True)
    assert torch.equal(a, b)
    for qa, qb in zip(full.last_query, off.last_query):
        assert torch.equal(qa, qb)
    _same_state(full, off)
    # verification of gamma2 + 1 = 7 tokens, then a rejection: roll back and regenerate
    a, b = _step(runner, (full, off), ids[120:127], 120)
    assert torch.equal(a, b)
    for cache in (full, off):
        cache.rollback(123)
    a, b = _step(runner, (full, off), ids[140:147], 123)
    assert torch.equal(a, b)
    for token in range(3):  # single-token decode steps
        a, b = _step(runner, (full, off), ids[150 + token:151 + token], full.length)
        assert torch.equal(a, b)
    _same_state(full, off)
    # an earlier roll back (chat edited) then regenerate from there
    for cache in (full, off):
        cache.rollback(50)
    a, b = _step(runner, (full, off), ids[100:110], 50)
    assert torch.equal(a, b)
    _same_state(full, off)
    assert (off.copied_bytes > 0) == (len(offloaded) > 2)  # one layer per slot: it never leaves its slot
    stats = off.stats()
    assert stats.device == "cpu" and stats.detail.startswith(f"{len(offloaded)} of {LAYERS} layers offloaded")
    assert stats.bytes_reserved == full.stats().bytes_reserved


def test_only_filled_prefix_is_streamed(tiny4):
    """Each offloaded layer moves its `length` held tokens per forward, not its capacity; a slot
    that still holds a layer's prefix (two or fewer layers offloaded per card) is not copied again."""
    runner = tiny4.runner
    a = runner.arch
    row = 2 * a.n_kv_heads * a.head_dim * 4  # one token of one layer, K and V, fp32
    ids = torch.arange(40) + 5
    _, off = _caches(runner, [0, 1, 2], prefetch_between=False)
    _step(runner, [off], ids[:30], 0)
    assert off.copied_bytes == 0  # nothing held yet
    _step(runner, [off], ids[30:33], 30)
    # layers 0 and 2 share slot 0 and cross again (30 held tokens each); layer 1 kept slot 1
    assert off.copied_bytes == 2 * 30 * row
    _, two = _caches(runner, [1, 3])
    _step(runner, [two], ids[:30], 0)
    _step(runner, [two], ids[30:33], 30)
    two.rollback(31)
    _step(runner, [two], ids[33:35], 31)
    assert two.copied_bytes == 0  # both layers stayed in their slots


def test_session_with_offloaded_plan_gives_the_same_tokens(tiny4, sample_text):
    """A plan from the planner (a small GPU forces most layers out) drives the session's cache;
    greedy TriForce with n-gram drafting gives exactly the resident session's tokens."""
    config = tiny4.runner.config
    shape = ModelShape.from_config(config, name="tiny")
    settings = DecodeSettings(mode="triforce", budget=64, chunk=8, gamma1=3, gamma2=5, max_new_tokens=32)
    big = GpuSpec("test GPU", 1 << 34, 1 << 34, 1000.0, 25.0)
    ram = DeviceSpec("test", 1 << 36, 1 << 36, gpus=(big,))
    roomy = plan_placement(shape, None, 2048, settings, ram, headroom_bytes=0)
    gpu = roomy.device("cuda:0")
    layer_kv = gpu.component("full_kv") // LAYERS
    tight = dataclasses.replace(big, free_bytes=gpu.used_bytes - gpu.component("full_kv") + 3 * layer_kv + 1)
    plan = plan_placement(shape, None, 2048, settings, dataclasses.replace(ram, gpus=(tight,)), headroom_bytes=0)
    assert plan.mode == "single-gpu" and plan.kv_layers_offloaded == 3
    layers = offloaded_layers(plan)
    assert len(layers) == 3

    doc = [DocumentText("Hamlet", sample_text[:2500])]
    messages = [ChatMessage("user", "Repeat the first line of the play.")]

    def run(**kwargs):
        session = ChatSession(tiny4, settings, draft="ngram", capacity=2048, **kwargs)
        return (session, *answer_tokens(session, messages, doc))

    _, reference, _ = run()
    session, got, final = run(cache_factory=cache_factory_for_plan(plan))
    assert isinstance(session.full, OffloadedCache) and session.full.offloaded == layers
    assert got == reference and len(got) > 5
    full_stats = next(c for c in final.metrics.caches if c.name == "full")
    assert full_stats.detail == "3 of 4 layers offloaded to CPU memory"
    assert session.decoder.rebuilds >= 1  # the retrieval cache was built from the offloaded layers


def test_cpu_plan_offloads_nothing(tiny4):
    shape = ModelShape.from_config(tiny4.runner.config, name="tiny")
    settings = DecodeSettings()
    cpu = plan_placement(shape, None, 2048, settings, "cpu")
    assert offloaded_layers(cpu) == []
    cache = cache_factory_for_plan(cpu)(tiny4.runner, 512)
    assert isinstance(cache, FullCache) and cache.stats().device == "cpu"


def test_two_device_layer_split_gives_identical_logits(tiny_model_dir, tiny4):
    """Layers 0-1 on one "device", 2-3 on another (both the CPU here): the runner hands the hidden
    state over at the boundary, each layer's cache buffers live with its layer."""
    path = tiny_model_dir("llama", num_hidden_layers=LAYERS)
    one = tiny4.runner
    split = LlamaRunner.from_folder(path, one.config, torch.device("cpu"), one.dtype,
                                    layer_devices=["cpu", "cpu", "cpu", "cpu"])
    assert split.layer_devices == [torch.device("cpu")] * LAYERS
    a = one.arch
    ref = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, one.dtype, one.device, exact=False)
    placed = OffloadedCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, one.dtype, "cpu", [3],
                            layer_devices=split.layer_devices)
    ids = torch.randint(0, a.vocab_size, (70,), generator=torch.Generator().manual_seed(2))
    for start, stop in ((0, 50), (50, 57), (57, 58)):
        x = one.forward(ids[start:stop], torch.arange(start, stop), ref)
        y = split.forward(ids[start:stop], torch.arange(start, stop), placed)
        assert torch.equal(x, y)
    with pytest.raises(ValueError, match="layer_devices"):
        LlamaRunner.from_folder(path, one.config, torch.device("cpu"), one.dtype, layer_devices=["cpu"])


def test_retrieval_rebuild_from_offloaded_cache_matches(tiny4):
    runner = tiny4.runner
    full, off = _caches(runner, [0, 2, 3])
    ids = torch.randint(0, runner.arch.vocab_size, (200,), generator=torch.Generator().manual_seed(3))
    _step(runner, (full, off), ids, 0, capture=True)
    built = []
    for cache in (full, off):
        r = RetrievalCache(cache, runner.arch.n_heads, budget=64, chunk=8, headroom=64)
        r.rebuild(list(cache.last_query))
        built.append(r)
    for layer in range(LAYERS):
        assert torch.equal(built[0].keys[layer][:, :built[0].length], built[1].keys[layer][:, :built[1].length])
        assert torch.equal(built[0].values[layer][:, :built[0].length], built[1].values[layer][:, :built[1].length])
    # the piecewise path (keys held on another device) gives the same chunk means
    r = built[1]
    r.SCORE_PIECE = 24  # 3 chunks per piece, last piece partial
    keys = off.layer_kv(2, 0, 200)[0]
    direct = r._chunk_means(keys, 25, torch.device("cpu"))
    pieces = r._chunk_means_in_pieces(keys, 25, torch.device("cpu"))
    assert torch.allclose(direct, pieces, rtol=0, atol=1e-6) and pieces.shape == (runner.arch.n_kv_heads, 25, 16)


# --- main.py gpu-check ----------------------------------------------------------------------
def test_gpu_check_without_cuda_fails_cleanly():
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    repo = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, str(repo / "main.py"), "gpu-check"], cwd=repo, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: gpu-check needs an NVIDIA GPU"), r.stderr


def test_gpu_check_code_paths_on_cpu_tiny(tmp_path):
    """`--device cpu --quick`: the same measurements on tiny shapes (numbers mean nothing here)."""
    import json

    from engine.tools.gpu_check import format_table, run_check, write_json

    result = run_check("cpu", quick=True, log=lambda _m: None)
    assert [c["context"] for c in result["contexts"]] == [128, 256]
    for row in result["contexts"]:
        assert row["offload_logits_identical"] is True
        assert row["offload_serial_bytes"] > 0 and row["l2_verify_offload_ms"] > 0 and row["l1_ms"] > 0
        assert row["triforce_offloaded"]["ms_per_token"] > 0
        assert row["chunk_tokens"] == 32 and row["chunk_offload_serial_ms"] > 0 and row["chunk_onchip_ms"] > 0
    for row in result["contexts"]:  # the fast paths: hybrid offload and the graphs' static forward
        assert "hybrid_error" not in row and "graph_error" not in row
        assert row["hybrid_cpu_heads"] == 1 and row["hybrid_logits_close"] is True
        assert row["hybrid_cpu_bytes"] > 0 and row["hybrid_streamed_bytes"] > 0 and row["l2_verify_hybrid_ms"] > 0
        assert row["l2_decode_hybrid_ms"] > 0 and row["l2_decode_offload_ms"] > 0
        for step in ("l1", "l2_decode", "l2_verify"):
            assert row[f"{step}_graph_ms"] > 0 and row[f"{step}_graph_max_diff"] < 1e-4
        assert row["triforce_graphs"]["ms_per_token"] > 0 and row["triforce_hybrid"]["ms_per_token"] > 0
    assert result["draft_step_graph_ms"] > 0
    assert {(r["dtype"], r["new_tokens"]) for r in result["cpu_attention"]["rows"]} == {
        ("bfloat16", 1), ("bfloat16", 7), ("float32", 1), ("float32", 7)}
    for table_name, gbps in (("paper_setting", result["cpu_attention"]["gbps"]), ("paper_setting_60", 60.0)):
        paper = result[table_name]
        assert set(paper) == {"4090", "4090x2", "4090x2 layer-split"}
        assert paper["4090x2"]["mode"] == "tensor-parallel" and paper["4090x2 layer-split"]["mode"] == "layer-split"
        assert all(m["cpu_attn_gbps"] == gbps and m["tuned_ms_per_token"] > 0 for m in paper.values())
    table = format_table(result)
    assert "L2 verify, all KV offloaded, prefetch" in table and "overlap hidden" in table and "paper 108" in table
    assert "L2 verify, all KV offloaded, hybrid" in table and "L2 verify, static path, eager (no CUDA)" in table
    assert "CPU attention at the stated 60 GB/s" in table and "CPU attention on this host" in table
    assert "prefill chunk, all KV offloaded, prefetch" in table
    tp = result["tensor_parallel"]  # the CPU standing in for both cards
    assert tp["cards"] == ["cpu", "cpu"] and tp["tp_l2_decode_ms"] > 0 and tp["hop_us"] > 0
    assert tp["tp_l2_verify_offload_ms"] > 0 and tp["tp_offload_bytes"] > 0
    assert "tensor parallel over cpu+cpu at 128" in table
    out = tmp_path / "gpu.json"
    write_json(result, str(out))
    assert json.loads(out.read_text())["contexts"][1]["context"] == 256
