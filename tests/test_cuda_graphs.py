"""The static-shape forward behind the CUDA graphs (engine/model/cuda_graphs.py), run eagerly on
the CPU: the same logits as the runner's dynamic forward (float tolerance), the same K/V written,
for L2 (FullCache), L1 (RetrievalCache) and L0 (StreamingCache, with eviction), across decode,
verification, roll back and re-verify; the unsupported cases fall back to the runner. The graph
capture itself is CUDA only (tests/test_cuda.py)."""
from __future__ import annotations

import pytest
import torch

from engine.kv.full import FullCache
from engine.kv.offload import OffloadedCache
from engine.kv.streaming import StreamingCache
from engine.model.cuda_graphs import GraphedForward, GraphedRunner, with_graphs
from random_models import random_runner

CAP = 96


def _runner(kv_heads: int = 2):
    return random_runner(3, vocab=40, hidden=32, layers=3, heads=4, kv_heads=kv_heads)


def _pair(runner, make):
    return make(), make()


def _fwd(runner, cache, ids, start):
    return runner.forward(ids, torch.arange(start, start + len(ids)), cache)


@pytest.mark.parametrize("kv_heads", [2, 4, 1], ids=["gqa", "mha", "mqa"])
def test_static_forward_equals_dynamic_on_the_full_cache(kv_heads):
    runner = _runner(kv_heads)
    a = runner.arch
    make = lambda: FullCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device, exact=False)  # noqa: E731
    dyn, stat = make(), make()
    graphed = GraphedForward(runner, stat, use_graphs=False)
    ids = torch.randint(0, a.vocab_size, (CAP,), generator=torch.Generator().manual_seed(1))
    _fwd(runner, dyn, ids[:40], 0)
    graphed.forward(ids[:40], torch.arange(40))  # a prefill chunk over 33 tokens: the runner's own forward
    assert graphed.eager_calls == 1 and stat.length == 40
    for start, stop in [(40, 47), (43, 50), (50, 51), (51, 52), (52, 85), (85, 92)]:
        for cache in (dyn, stat):
            cache.rollback(min(cache.length, start))
        want = _fwd(runner, dyn, ids[start:stop], start)
        got = graphed.forward(ids[start:stop], torch.arange(start, stop))
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
        assert stat.length == dyn.length == stop
    for layer in range(a.n_layers):
        torch.testing.assert_close(stat.keys[layer][:, :92], dyn.keys[layer][:, :92], rtol=2e-4, atol=2e-4)
        torch.testing.assert_close(stat.values[layer][:, :92], dyn.values[layer][:, :92], rtol=2e-4, atol=2e-4)
    last = graphed.forward(ids[92:94], torch.arange(92, 94), last_only=True)
    assert last.shape == (1, a.vocab_size)


def test_a_mask_off_by_one_would_be_caught():
    """Slots past the length hold stale K/V (rolled back): seeing them changes the logits."""
    runner = _runner()
    a = runner.arch
    cache = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device, exact=False)
    ids = torch.randint(0, a.vocab_size, (60,), generator=torch.Generator().manual_seed(2))
    _fwd(runner, cache, ids[:50], 0)
    cache.rollback(30)
    want = _fwd(runner, cache, ids[30:31], 30)
    cache.rollback(30)
    graphed = GraphedForward(runner, cache, use_graphs=False)
    graphed._slots_all = graphed._slots_all - 5  # sees five slots too many
    got = graphed.forward(ids[30:31], torch.arange(30, 31))
    assert (got - want).abs().max() > 1e-2


def test_static_forward_equals_dynamic_on_the_retrieval_cache():
    runner = _runner()
    a = runner.arch
    fulls = [FullCache(a.n_layers, a.n_kv_heads, a.head_dim, 256, runner.dtype, runner.device, exact=False) for _ in range(2)]
    ids = torch.randint(0, a.vocab_size, (220,), generator=torch.Generator().manual_seed(3))
    retrievals = []
    for full in fulls:
        full.capture_query = True
        _fwd(runner, full, ids[:200], 0)
        r = full.retrieval(a.n_heads, budget=64, chunk=8, headroom=40)
        r.rebuild(list(full.last_query))
        retrievals.append(r)
    dyn, stat = retrievals
    graphed = GraphedForward(runner, stat, use_graphs=False)
    held = dyn.length
    for n in (5, 1, 7):
        for cache in (dyn, stat):
            cache.rollback(held)
        want = _fwd(runner, dyn, ids[200:200 + n], 200)
        got = graphed.forward(ids[200:200 + n], torch.arange(200, 200 + n))
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
    assert graphed.eager_calls == 0


def test_static_forward_equals_dynamic_on_the_streaming_cache_with_eviction():
    runner = _runner()
    a = runner.arch
    make = lambda: StreamingCache(a.n_layers, a.n_kv_heads, a.head_dim, 4, 20, 8, runner.dtype, runner.device)  # noqa: E731
    dyn, stat = make(), make()
    graphed = GraphedForward(runner, stat, use_graphs=False)
    ids = torch.randint(0, a.vocab_size, (80,), generator=torch.Generator().manual_seed(4))
    pos = 0
    for n in (20, 1, 1, 3, 5, 1, 4, 8, 2, 1):
        for cache in (dyn, stat):
            cache.make_room(n)
        want = _fwd(runner, dyn, ids[pos:pos + n], pos)
        got = graphed.forward(ids[pos:pos + n], torch.arange(pos, pos + n))
        torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
        assert stat.length == dyn.length
        pos += n
    assert dyn.evicted > 0 and graphed.eager_calls == 0


def test_unsupported_caches_and_devices_use_the_runners_forward():
    runner = _runner()
    a = runner.arch
    off = OffloadedCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device, [1])
    wrapped = GraphedRunner(runner, use_graphs=False)
    ids = torch.arange(10) % a.vocab_size
    ref = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device, exact=False)
    assert torch.equal(wrapped.forward(ids, torch.arange(10), off), runner.forward(ids, torch.arange(10), ref))
    assert wrapped.arch is runner.arch and wrapped.device == runner.device  # a drop-in for the runner
    full = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, 12, runner.dtype, runner.device, exact=False)
    g = wrapped.graphed(full)
    assert g is wrapped.graphed(full)
    full.capture_query = True
    assert not g.supports(1)  # the retrieval rebuild's query capture runs eagerly
    full.capture_query = False
    assert g.supports(12) and not g.supports(13)  # past capacity: the runner raises its own error
    assert with_graphs(runner) is runner  # no CUDA here
    from engine.model.runner_tp import TensorParallelRunner
    from random_models import random_weights

    config, state = random_weights(3, vocab=40, hidden=32, layers=3, heads=4, kv_heads=2)
    tp = TensorParallelRunner(config, state, ["cpu", "cpu"], torch.float32)
    assert GraphedForward(tp, full).kind is None  # tensor parallel stays eager


def test_a_session_with_graphs_wraps_the_target_and_the_draft_model(tiny_model_dir, monkeypatch):
    """cuda_graphs reaches both runners the decoder calls (L0's draft model included); off CUDA the
    wrapper is the identity, so the seam is checked with a recording stand-in."""
    import engine.model.cuda_graphs as cuda_graphs
    from engine.decoding.session import ChatSession
    from engine.model.loading import load_folder
    from engine.settings import DecodeSettings

    wrapped = []
    monkeypatch.setattr(cuda_graphs, "with_graphs", lambda runner: wrapped.append(runner) or runner)
    target = load_folder(tiny_model_dir("llama"), device="cpu")
    draft = load_folder(tiny_model_dir("llama"), device="cpu")
    ChatSession(target, DecodeSettings(budget=32, chunk=8), draft=draft, cuda_graphs=True)
    assert target.runner in wrapped and draft.runner in wrapped
