"""Checks that need an NVIDIA GPU (skipped elsewhere; CI has none). Run on a GPU machine with
`python -m pytest tests/test_cuda.py`: the offloaded cache's side-stream prefetch and the
hierarchical loop's losslessness on CUDA."""
from __future__ import annotations

import pytest
import torch

from engine.kv.full import FullCache
from engine.kv.offload import OffloadedCache
from engine.decoding.drafters import ModelDrafter, NgramDrafter
from engine.settings import DecodeSettings
from engine.decoding.speculative import HierarchicalDecoder
from engine.model.runner_tp import TensorParallelRunner
from random_models import random_runner, random_weights

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

CAP = 4096


def _prompt(n: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(7)
    base = torch.randint(0, vocab, (n // 4,), generator=g).tolist()
    return (base * 4)[:n]  # repetitive, so n-gram drafts get accepted sometimes


def _verify_rounds_agree(runner, ids: torch.Tensor, resident, off) -> None:
    """Verify 7 tokens, keep 3, five times (write-back and roll-back): identical logits, then
    identical K/V in every layer."""
    for step in range(5):
        start = resident.length
        outs = [runner.forward(ids[start:start + 7], torch.arange(start, start + 7, device="cuda"), c)
                for c in (resident, off)]
        assert torch.equal(outs[0], outs[1]), f"step {step}"
        resident.rollback(start + 3)
        off.rollback(start + 3)
    torch.cuda.synchronize()
    for layer in range(runner.arch.n_layers):
        for x, y in zip(resident.layer_kv(layer, 0, resident.length), off.layer_kv(layer, 0, off.length)):
            assert torch.equal(x.cpu(), y.cpu()), f"layer {layer}"


@pytest.mark.parametrize("prefetch", [True, False])
def test_offloaded_cache_equals_resident_on_cuda(prefetch):
    runner = random_runner(0, vocab=512, hidden=256, layers=6, heads=8, kv_heads=2, device="cuda",
                           dtype=torch.bfloat16)
    a = runner.arch
    full = FullCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device)
    off = OffloadedCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, runner.device,
                         [1, 2, 3, 4, 5], prefetch=prefetch)
    ids = torch.tensor(_prompt(3000, 512), device="cuda")
    for cache in (full, off):
        cache.capture_query = True
    outs = [runner.forward(ids[:2900], torch.arange(2900, device="cuda"), c, last_only=True) for c in (full, off)]
    assert torch.equal(outs[0], outs[1])
    _verify_rounds_agree(runner, ids, full, off)


def _generate(target, drafter, mode: str, prompt: list[int], n: int, offload: bool) -> list[int]:
    full = target.new_full_cache(CAP, list(range(1, target.arch.n_layers)) if offload else ())
    settings = DecodeSettings(mode=mode, budget=256, chunk=16, gamma1=3, gamma2=6, max_new_tokens=n)
    full.capture_query = True
    logits = target.forward(torch.tensor(prompt, device=target.device),
                            torch.arange(len(prompt), device=target.device), full, last_only=True)[0]
    decoder = HierarchicalDecoder(target, full, drafter, settings, torch.Generator().manual_seed(0))
    decoder.after_prefill(list(full.last_query))
    seq = prompt + [int(logits.argmax())]
    while len(seq) < len(prompt) + n:
        seq += [tok for tok, _ in decoder.step(seq)]
    return seq[len(prompt):len(prompt) + n]


@pytest.mark.parametrize("offload", [False, True])
def test_every_mode_matches_ar_on_cuda_float32(offload):
    target = random_runner(0, vocab=256, hidden=128, layers=4, heads=4, kv_heads=2, device="cuda")
    draft = random_runner(3, vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, device="cuda")
    prompt = _prompt(1500, 256)
    reference = _generate(target, NgramDrafter(), "ar", prompt, 96, offload=False)
    for mode, drafter in (("triforce", ModelDrafter(draft, 4, 124)), ("triforce", NgramDrafter()),
                          ("retrieval-only", NgramDrafter()), ("draft-only", ModelDrafter(draft, 4, 124))):
        got = _generate(target, drafter, mode, prompt, 96, offload)
        assert got == reference, f"{mode} with {type(drafter).__name__} differs from AR"


def _cards() -> list[str]:
    """Two cards when there are two; otherwise both shares on the one card (same code path)."""
    return ["cuda:0", "cuda:1"] if torch.cuda.device_count() > 1 else ["cuda:0", "cuda:0"]


def test_tensor_parallel_offloaded_shares_equal_resident_on_cuda():
    config, state = random_weights(0, vocab=512, hidden=256, layers=6, heads=8, kv_heads=4)
    tp = TensorParallelRunner(config, state, _cards(), torch.bfloat16)
    one = random_runner(0, vocab=512, hidden=256, layers=6, heads=8, kv_heads=4, device="cuda", dtype=torch.bfloat16)
    resident, off, single = tp.new_full_cache(CAP), tp.new_full_cache(CAP, [1, 2, 3, 4, 5]), one.new_full_cache(CAP)
    ids = torch.tensor(_prompt(3000, 512), device="cuda")
    outs = [r.forward(ids[:2900], torch.arange(2900, device="cuda"), c, last_only=True)
            for r, c in ((tp, resident), (tp, off), (one, single))]
    assert torch.equal(outs[0], outs[1])
    assert (outs[0] - outs[2]).abs().max() < 0.1 * outs[2].abs().max()  # bf16 rounding of split matmuls only
    _verify_rounds_agree(tp, ids, resident, off)


def test_tensor_parallel_every_mode_matches_ar_on_cuda_float32():
    config, state = random_weights(0, vocab=256, hidden=128, layers=4, heads=4, kv_heads=2)
    target = TensorParallelRunner(config, state, _cards(), torch.float32)
    prompt = _prompt(1500, 256)
    reference = _generate(target, NgramDrafter(), "ar", prompt, 96, offload=False)
    for mode, offload in (("triforce", False), ("triforce", True), ("retrieval-only", True)):
        got = _generate(target, NgramDrafter(), mode, prompt, 96, offload)
        assert got == reference, f"{mode} (offload={offload}) differs from AR on tensor parallel"


# --- CUDA graphs (engine/model/cuda_graphs.py) -----------------------------------------------------
def test_graph_replay_equals_eager_logits_for_l0_l1_l2():
    """Each fixed-shape step captured once per token count and replayed: the same logits as the
    runner's eager forward (float tolerance: masked full-capacity attention sums in another order)."""
    from engine.kv.streaming import StreamingCache
    from engine.model.cuda_graphs import GraphedForward

    runner = random_runner(0, vocab=256, hidden=128, layers=4, heads=4, kv_heads=2, device="cuda")
    a = runner.arch
    ids = torch.tensor(_prompt(3000, 256), device="cuda")

    def pos(start, stop):
        return torch.arange(start, stop, device="cuda")
    # L2: full cache on the card
    eager_full, graph_full = (FullCache(a.n_layers, a.n_kv_heads, a.head_dim, CAP, runner.dtype, "cuda") for _ in range(2))
    for c in (eager_full, graph_full):
        c.capture_query = True
        runner.forward(ids[:2000], pos(0, 2000), c, last_only=True)
    graphed = GraphedForward(runner, graph_full, use_graphs=True)
    for start, stop in [(2000, 2007), (2003, 2010), (2010, 2011), (2011, 2012), (2012, 2019)]:
        for c in (eager_full, graph_full):
            c.rollback(min(c.length, start))
        want = runner.forward(ids[start:stop], pos(start, stop), eager_full)
        got = graphed.forward(ids[start:stop], pos(start, stop))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert graphed.replays == 5 and len(graphed._graphs) == 2  # 7-token and 1-token shapes, captured once each
    # L1: retrieval cache after a rebuild
    r_eager = eager_full.retrieval(a.n_heads, 256, 16, 64)
    r_graph = graph_full.retrieval(a.n_heads, 256, 16, 64)
    for c, r in ((eager_full, r_eager), (graph_full, r_graph)):
        c.rollback(2000)
        c.capture_query = True
        runner.forward(ids[2000:2001], pos(2000, 2001), c)
        r.rebuild(list(c.last_query))
    g1 = GraphedForward(runner, r_graph, use_graphs=True)
    held = r_eager.length
    for n in (5, 5, 1):
        r_eager.rollback(held)
        r_graph.rollback(held)
        want = runner.forward(ids[2001:2001 + n], pos(2001, 2001 + n), r_eager)
        torch.testing.assert_close(g1.forward(ids[2001:2001 + n], pos(2001, 2001 + n)), want, rtol=1e-4, atol=1e-4)
    # L0: a StreamingLLM cache, evicting as it goes
    draft = random_runner(3, vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, device="cuda")
    d = draft.arch
    s_eager, s_graph = (StreamingCache(d.n_layers, d.n_kv_heads, d.head_dim, 4, 60, 8, draft.dtype, "cuda")
                        for _ in range(2))
    g0 = GraphedForward(draft, s_graph, use_graphs=True)
    at = 0
    for n in [30] + [1] * 50:
        for c in (s_eager, s_graph):
            c.make_room(n)
        want = draft.forward(ids[at:at + n], pos(at, at + n), s_eager, last_only=True)
        torch.testing.assert_close(g0.forward(ids[at:at + n], pos(at, at + n), last_only=True), want,
                                   rtol=1e-4, atol=1e-4)
        at += n
    assert s_eager.evicted > 0 and g0.replays == 51


def test_every_mode_matches_ar_with_graphs_on_cuda_float32():
    from engine.model.cuda_graphs import GraphedRunner

    target = GraphedRunner(random_runner(0, vocab=256, hidden=128, layers=4, heads=4, kv_heads=2, device="cuda"))
    draft = GraphedRunner(random_runner(3, vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, device="cuda"))
    prompt = _prompt(1500, 256)
    reference = _generate(target, NgramDrafter(), "ar", prompt, 96, offload=False)
    for mode, drafter in (("triforce", ModelDrafter(draft, 4, 124)), ("retrieval-only", NgramDrafter()),
                          ("draft-only", ModelDrafter(draft, 4, 124))):
        got = _generate(target, drafter, mode, prompt, 96, offload=False)
        assert got == reference, f"{mode} with graphs differs from AR with graphs"
