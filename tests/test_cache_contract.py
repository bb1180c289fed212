"""One contract, every cache kind: begin/attend/end appends, length counts, rollback forgets (and
re-attending after a rollback is bit-identical), bytes follow the length, a full cache refuses to
overflow, and attention equals plain softmax attention over the held tokens.

Kinds: Full, Retrieval (budget >= context: it mirrors the full cache), Streaming (window >= context:
no eviction, slot positions == absolute positions), Offloaded (CPU standing in for the card, one
layer in "pinned" memory), Sharded (two parts, the CPU standing in for both cards)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from transformers import LlamaConfig

from engine import native
from engine.errors import ContextOverflowError
from engine.kv.full import FullCache
from engine.kv.offload import OffloadedCache
from engine.kv.retrieval import RetrievalCache
from engine.kv.rope import Rotary, rotate
from engine.kv.sharded import ShardedFullCache
from engine.kv.streaming import StreamingCache

LAYERS, HQ, HKV, D, CAP = 2, 4, 2, 8, 64
ROPE = Rotary(LlamaConfig(hidden_size=HQ * D, num_attention_heads=HQ, num_key_value_heads=HKV,
                          max_position_embeddings=CAP), D, torch.device("cpu"), CAP)


@dataclass
class Kind:
    """A cache under test: how to make it over a prefix of `held` tokens, and how one layer attends."""

    name: str
    make: Callable[[list], object]  # prefix forwards -> cache holding them
    attend: Callable[[object, int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = \
        lambda cache, layer, q, k, v: cache.attend(layer, q, k, v)


def _qkv(n: int, seed: int):
    """Per layer: q [Hq, n, D], k/v [Hkv, n, D] (before RoPE)."""
    g = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(h, n, D, generator=g) for h in (HQ, HKV, HKV)) for _ in range(LAYERS)]


def _forward(kind: Kind, cache, start: int, qkv) -> list[torch.Tensor]:
    """One forward of len(qkv[0][0][0]) new tokens at absolute positions start.. -> per-layer outputs."""
    n = qkv[0][0].shape[1]
    cache.begin(torch.arange(start, start + n), ROPE)
    outs = [kind.attend(cache, layer, *qkv[layer]) for layer in range(LAYERS)]
    cache.end()
    return outs


def _reference(history: list, start: int, qkv) -> list[torch.Tensor]:
    """Plain causal softmax attention in float64 over every token so far (history + the new ones)."""
    outs = []
    n = qkv[0][0].shape[1]
    total = start + n
    cos, sin = ROPE.cos_sin(torch.arange(total), torch.float64)
    for layer in range(LAYERS):
        k = torch.cat([h[layer][1] for h in history] + [qkv[layer][1]], dim=1).double()
        v = torch.cat([h[layer][2] for h in history] + [qkv[layer][2]], dim=1).double()
        k = rotate(k, cos, sin)
        q = rotate(qkv[layer][0].double(), cos[start:], sin[start:])
        k = k.repeat_interleave(HQ // HKV, dim=0)
        v = v.repeat_interleave(HQ // HKV, dim=0)
        scores = q @ k.transpose(1, 2) / math.sqrt(D)  # [Hq, n, total]
        allowed = torch.arange(total)[None, :] <= torch.arange(start, total)[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append(torch.softmax(scores, -1) @ v)
    return outs


def _full_with(prefix: list, cache=None, name: str = "full"):
    cache = cache or FullCache(LAYERS, HKV, D, CAP, torch.float32, "cpu")
    start = 0
    for qkv in prefix:
        cache.capture_query = True
        _forward(KINDS_BY_NAME[name], cache, start, qkv)
        start += qkv[0][0].shape[1]
    return cache


def _retrieval(prefix: list):
    full = _full_with(prefix)
    retrieval = full.retrieval(HQ, budget=32, chunk=4, headroom=24)
    retrieval.rebuild(list(full.last_query))
    return retrieval


def _streaming(prefix: list):
    cache = StreamingCache(LAYERS, HKV, D, sinks=2, window=CAP - 2, slack=0, dtype=torch.float32, device="cpu")
    start = 0
    for qkv in prefix:
        _forward(KINDS_BY_NAME["streaming"], cache, start, qkv)
        start += qkv[0][0].shape[1]
    return cache


def _sharded_attend(cache, layer, q, k, v):
    half_q, half_kv = HQ // 2, HKV // 2
    outs = [part.attend(layer, q[s * half_q:(s + 1) * half_q], k[s * half_kv:(s + 1) * half_kv],
                        v[s * half_kv:(s + 1) * half_kv]) for s, part in enumerate(cache.parts)]
    return torch.cat(outs, dim=0)


KINDS = [
    Kind("full", lambda prefix: _full_with(prefix)),
    Kind("retrieval", _retrieval),
    Kind("streaming", _streaming),
    Kind("offloaded", lambda prefix: _full_with(prefix, OffloadedCache(LAYERS, HKV, D, CAP, torch.float32, "cpu",
                                                                       offloaded=[1]))),
    Kind("sharded", lambda prefix: _full_with(prefix, ShardedFullCache(
        [FullCache(LAYERS, HKV // 2, D, CAP, torch.float32, "cpu") for _ in range(2)]), "sharded"), _sharded_attend),
]
KINDS_BY_NAME = {k.name: k for k in KINDS}


@pytest.fixture(params=KINDS, ids=lambda k: k.name)
def kind(request) -> Kind:
    return request.param


def test_append_length_bytes_and_attention(kind: Kind):
    prefix = [_qkv(12, seed=1), _qkv(8, seed=2)]  # 20 tokens held before the cache is under test
    cache = kind.make(prefix)
    assert cache.length == 20
    step = _qkv(5, seed=3)
    got = _forward(kind, cache, 20, step)
    assert cache.length == 25
    assert cache.nbytes_used() == 25 * cache.bytes_per_token() > 0
    assert cache.nbytes_reserved() == cache.capacity * cache.bytes_per_token() >= cache.nbytes_used()
    assert cache.stats().tokens == 25
    want = _reference(prefix, 20, step)
    for layer in range(LAYERS):
        torch.testing.assert_close(got[layer].double(), want[layer], atol=1e-5, rtol=1e-5)


def test_rollback_then_the_same_forward_is_bit_identical(kind: Kind):
    cache = kind.make([_qkv(16, seed=4)])
    step = _qkv(4, seed=5)
    first = _forward(kind, cache, 16, step)
    cache.rollback(16)
    assert cache.length == 16
    again = _forward(kind, cache, 16, step)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    # a rejected speculation, then a different continuation: as if the rejected tokens never existed
    cache.rollback(17)
    other = _qkv(3, seed=6)
    got = _forward(kind, cache, 17, other)
    history = [_qkv(16, seed=4), [tuple(t[:, :1] for t in layer) for layer in step]]
    want = _reference(history, 17, other)
    for layer in range(LAYERS):
        torch.testing.assert_close(got[layer].double(), want[layer], atol=1e-5, rtol=1e-5)


def test_rollback_past_the_end_is_refused(kind: Kind):
    cache = kind.make([_qkv(8, seed=7)])
    with pytest.raises(ValueError):
        cache.rollback(cache.length + 1)


def test_a_full_cache_refuses_to_overflow(kind: Kind):
    cache = kind.make([_qkv(8, seed=8)])
    room = cache.capacity - cache.length
    with pytest.raises(ContextOverflowError):
        cache.begin(torch.arange(8, 8 + room + 1), ROPE)


@pytest.mark.skipif(not native.available(), reason="the native kernels were not built here")
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_a_retrieval_cache_holding_everything_attends_with_l2s_bits(kv_dtype):
    """Where the full cache attends through the native kernel, L1 does too, over the values as L2
    stores them: holding every token (budget >= context), its forward gives L2's bits exactly (it
    ran the batched matmuls before, 2x slower at ~1K keys and not bit-equal)."""
    prefix = [_qkv(12, seed=1), _qkv(8, seed=2)]
    full = _full_with(prefix, FullCache(LAYERS, HKV, D, CAP, torch.float32, "cpu", kv_dtype=kv_dtype))
    retrieval = full.retrieval(HQ, budget=32, chunk=4, headroom=24)
    retrieval.rebuild(list(full.last_query))
    assert retrieval.keys[0].dtype == full.keys[0].dtype == kv_dtype
    step = _qkv(3, seed=5)
    from_l1 = _forward(KINDS_BY_NAME["retrieval"], retrieval, 20, step)
    from_l2 = _forward(KINDS_BY_NAME["full"], full, 20, step)
    for a, b in zip(from_l1, from_l2):
        assert torch.equal(a, b)


@pytest.mark.parametrize("per_head", [True, False])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_a_retrieval_rebuild_copies_each_heads_best_chunks_whole_in_position_order(kv_dtype, per_head, monkeypatch):
    """Under budget, each KV head keeps the first chunk (sinks), the most recent chunks and the
    chunks whose mean key scores highest against its group's summed query, in position order, then
    the partial tail chunk: checked token by token against the full cache (the copy moves whole
    chunks as rows; it was an element-wise gather)."""
    monkeypatch.setattr(RetrievalCache, "ROWS_PER_HEAD", per_head)  # False: the one-launch path cards take
    chunk, budget = 4, 16  # 4 of the prefix's 9 whole chunks (38 tokens: 2 in the tail)
    full = _full_with([_qkv(20, seed=3), _qkv(18, seed=4)],
                      FullCache(LAYERS, HKV, D, CAP, torch.float32, "cpu", kv_dtype=kv_dtype))
    retrieval = full.retrieval(HQ, budget=budget, chunk=chunk, headroom=24)
    queries = list(full.last_query)
    retrieval.rebuild(queries)
    n_chunks, keep = 38 // chunk, budget // chunk
    recent = retrieval.recent_chunks(keep)
    assert retrieval.length == budget + 2 and retrieval.selected == budget
    for layer in range(LAYERS):
        keys, values = full.layer_kv(layer, 0, 38)
        means = keys[:, :n_chunks * chunk].float().reshape(HKV, n_chunks, chunk, D).mean(2)
        q = queries[layer].float().reshape(HKV, HQ // HKV, D).sum(1)
        for h in range(HKV):
            scores = means[h] @ q[h]
            forced = {0, *range(n_chunks - recent, n_chunks)}
            ranked = sorted(set(range(n_chunks)) - forced, key=lambda c: -scores[c].item())
            chosen = sorted(forced | set(ranked[:keep - len(forced)]))
            tokens = [c * chunk + i for c in chosen for i in range(chunk)] + [36, 37]
            assert torch.equal(retrieval.keys[layer][h, :budget + 2], keys[h, tokens])
            assert torch.equal(retrieval.values[layer][h, :budget + 2], values[h, tokens])
