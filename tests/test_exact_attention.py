"""The CPU target's batch-invariant attention (engine/kv/exact_attention.py): a verification row
gets the bits of a one-token step, so speculative decoding is token-identical to plain decoding."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from engine.kv.attention import causal_mask, gqa_attention
from engine.kv.exact_attention import CHUNK, MAX_ROWS, exact_gqa_attention, hidden_tail, padded_length
from engine.kv.exact_attention import BATCHED, ONE_ROW, ONE_ROW_CHUNKS, PAD_CANDIDATES, Plan, kernel_plan
from engine.kv.full import FullCache
from engine.kv.rope import Rotary, rotate
from engine.settings import MAX_DRAFT, DecodeSettings


def _kv(n_kv: int, positions: int, dim: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n_kv, positions, dim, generator=gen), torch.randn(n_kv, positions, dim, generator=gen)


# held positions before the forward: inside one chunk, at a chunk edge, across several chunks
@pytest.mark.parametrize("held", [0, 5, CHUNK - 3, CHUNK, 3 * CHUNK + 17])
@pytest.mark.parametrize("new", [2, 7, 13, 34])
@pytest.mark.parametrize("path", [None, ONE_ROW_CHUNKS])  # the path this machine's probe picks; the strict one
def test_a_verification_row_has_the_bits_of_a_one_token_step(held, new, path):
    keys, values = _kv(3, padded_length(held + new), 64)
    q = torch.randn(9, new, 64)  # 9 query heads over 3 KV heads
    together = exact_gqa_attention(q, keys, values, held + new, path=path)
    for i in range(new):
        alone = exact_gqa_attention(q[:, i:i + 1].contiguous(), keys, values, held + i + 1, path=path)
        assert torch.equal(alone[:, 0], together[:, i]), f"row {i} of {new} after {held} held differs"


def _rows_keep_their_bits(min_rows: int, gen: torch.Generator) -> bool:
    """Independent of the probe's inputs: distinct random rows, one row placed at a random place of
    products of G*T rows (padded to min_rows), scored over 1-3 chunks, mixed over 2-9 chunks."""
    keys = torch.randn(3, 3 * CHUNK, 64, generator=gen)  # [Hkv, S, D]
    chunks = torch.randn(9, CHUNK, 64, generator=gen)  # [C, CHUNK, D]
    x, p = torch.randn(3, 64, generator=gen), torch.rand(9, CHUNK, generator=gen)
    want_scores = want_mix = None
    for new in (1, 2, 5, 13, 34, MAX_ROWS):
        rows = max(3 * new, min_rows)
        at = int(torch.randint(rows, (1,), generator=gen))
        q = torch.randn(3, rows, 64, generator=gen)
        q[:, at] = x
        n = (new % 3 + 1) * CHUNK
        got = torch.bmm(q, keys[:, :n].transpose(1, 2))[:, at]  # [Hkv, n]
        want_scores = got if want_scores is None else want_scores
        n_chunks = (2, 3, 9)[new % 3]
        probs = torch.rand(n_chunks, rows, CHUNK, generator=gen)
        probs[:, at] = p[:n_chunks]
        mix = torch.bmm(probs, chunks[:n_chunks])[:2, at]  # [2, D]: the row in the first two chunks
        want_mix = mix if want_mix is None else want_mix
        common = min(n, want_scores.shape[1])
        if not (torch.equal(got[:, :common], want_scores[:, :common]) and torch.equal(mix, want_mix)):
            return False
    return True


def test_the_probe_decides_by_what_this_machine_computes():
    """kernel_plan takes BATCHED unpadded where a batched product's row keeps its bits at every
    row count (an Intel Xeon), and where it pads, padding does make the rows keep their bits (on an
    AMD EPYC, products of 4 or more rows agreed with each other and not with 1-3 rows)."""
    plan = kernel_plan(64, 3, 3)
    assert plan.path in (BATCHED, ONE_ROW, ONE_ROW_CHUNKS) and plan.min_rows in PAD_CANDIDATES
    if _rows_keep_their_bits(1, torch.Generator().manual_seed(4)):
        assert plan == Plan(BATCHED, 1)
    if plan.path == BATCHED:
        for seed in range(3):
            assert _rows_keep_their_bits(plan.min_rows, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("held,new", [(0, 1), (40, 1), (300, 6), (1000, 34)])
@pytest.mark.parametrize("path", [BATCHED, ONE_ROW, ONE_ROW_CHUNKS])
def test_it_is_causal_attention(held, new, path):
    """Against the plain kernel (float rounding apart): each new row sees keys 0..its own."""
    total = held + new
    keys, values = _kv(2, padded_length(total), 16, seed=1)
    q = torch.randn(4, new, 16)
    got = exact_gqa_attention(q, keys, values, total, path=path)
    want = gqa_attention(q, keys[:, :total], values[:, :total], causal_mask(new, total, "cpu"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_positions_past_the_held_ones_are_never_seen():
    """Whatever the padding behind the held keys holds (stale rolled-back tokens), the answer is the same."""
    keys, values = _kv(2, 2 * CHUNK, 16)
    q = torch.randn(4, 3, 16)
    before = exact_gqa_attention(q, keys, values, CHUNK + 10, hidden_tail(3, CHUNK + 10, 2))
    keys[:, CHUNK + 10:] = 1e4
    values[:, CHUNK + 10:] = -1e4
    assert torch.equal(exact_gqa_attention(q, keys, values, CHUNK + 10), before)


def test_a_buffer_without_the_padding_is_refused():
    keys, values = _kv(1, CHUNK + 1, 8)
    with pytest.raises(ValueError, match="buffer positions"):
        exact_gqa_attention(torch.randn(2, 1, 8), keys, values, CHUNK + 1)


def test_the_cpu_full_cache_pads_its_buffers_and_every_verification_fits_the_kernel():
    cache = FullCache(2, 2, 16, capacity=CHUNK + 1, dtype=torch.float32, device="cpu")
    assert cache.keys[0].shape[1] == 2 * CHUNK and cache.capacity == CHUNK + 1
    largest = DecodeSettings(mode="triforce", gamma1=MAX_DRAFT, gamma2=32)
    largest.validate()
    assert largest.speculation_tokens() <= MAX_ROWS


def test_a_prefill_chunk_attends_in_the_prefill_dtype_and_stores_float32():
    """The CPU target on the file's blocks prefills with bfloat16 attention (FullCache.prefill_dtype);
    the K/V it stores and every decoding or verification step stay float32."""
    rope = Rotary(LlamaConfig(head_dim=16, hidden_size=64, num_attention_heads=4), 16, torch.device("cpu"), 512)
    gen = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(4, 100, 16, generator=gen), torch.randn(2, 100, 16, generator=gen), torch.randn(2, 100, 16, generator=gen)
    outs = {}
    for low in (None, torch.bfloat16):
        cache = FullCache(1, 2, 16, capacity=128, dtype=torch.float32, device="cpu", prefill_dtype=low)
        cache.begin(torch.arange(100), rope)
        outs[low] = cache.attend(0, q, k, v)
        cache.end()
        assert cache.keys[0].dtype == torch.float32 and outs[low].dtype == torch.float32
        cos, sin = rope.cos_sin(torch.arange(100), torch.float32)
        assert torch.equal(cache.keys[0][:, :100], rotate(k, cos, sin))  # stored as computed, in float32
        cache.begin(torch.tensor([100]), rope)  # a decoding step: the exact float32 kernel either way
        outs[(low, "step")] = cache.attend(0, q[:, :1], k[:, :1], v[:, :1])
        cache.end()
    cos, sin = rope.cos_sin(torch.arange(100), torch.float32)
    low = [t.bfloat16() for t in (rotate(q, cos, sin), rotate(k, cos, sin), v)]
    want = gqa_attention(*low, causal_mask(100, 100, "cpu")).float()
    assert torch.equal(outs[torch.bfloat16], want)
    assert not torch.equal(outs[None], want)
    torch.testing.assert_close(outs[torch.bfloat16], outs[None], rtol=0.05, atol=0.05)
    assert torch.equal(outs[(None, "step")], outs[(torch.bfloat16, "step")])  # same K/V, same float32 step
