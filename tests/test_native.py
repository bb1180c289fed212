"""The native CPU kernels (engine/native/kernels.c): built here, equal to the float32 oracle within
float rounding, and row-invariant bit for bit: a token's row has the same bits whatever the number
of rows in the call, which is what makes verification give the bits of plain decoding."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from cpu_features import cpu_flags
from int16_reference import check_int16_is_the_quantized_product, int16_reference
from kquant_pack import pack_k

from engine import native
from engine.kv.attention import causal_mask, gqa_attention
from engine.kv.full import FullCache
from engine.kv.rope import Rotary
from engine.model.quant import DENSE_ABOVE, QuantWeight, dequantize_blocks

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")

KINDS = ("Q4_0", "Q4_1", "Q8_0")


def _blocks(kind: str, out: int, width: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return quants.quantize(rng.standard_normal((out, width)).astype(np.float32), GGMLQuantizationType[kind])


def test_the_kernels_build_and_load_where_a_compiler_is():
    assert native.available()
    assert native.library().triforce_kernels_version() == native.VERSION


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("out,width", [(1, 32), (7, 96), (130, 576)])
def test_block_matmul_is_the_oracle_within_float_rounding(kind, out, width):
    """The file's blocks read as stored, times float32 activations: x @ dequantize(W).T up to the
    order of a float32 sum (no bfloat16 rounding of x as in torch's int4 kernel)."""
    blocks = _blocks(kind, out, width, seed=out)
    oracle_w = dequantize_blocks(kind, blocks, width)
    x = torch.randn(9, width, generator=torch.Generator().manual_seed(3))
    got = native.block_matmul(kind, np.ascontiguousarray(blocks), x)
    want = x @ oracle_w.T
    assert got.shape == (9, out)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    # the tolerance has teeth: the high and low nibbles read the other way round fail it by far
    if kind != "Q8_0":
        start = 4 if kind == "Q4_1" else 2
        raw = np.array(blocks).reshape(out, width // 32, -1)
        raw[..., start:] = (raw[..., start:] << 4) | (raw[..., start:] >> 4)
        wrong = native.block_matmul(kind, np.ascontiguousarray(raw.reshape(out, -1)), x)
        assert (wrong - want).abs().max() > 100 * 1e-5 * float(want.abs().max())


@pytest.mark.parametrize("kind", KINDS)
def test_a_weight_row_has_the_same_bits_whatever_the_number_of_tokens(kind):
    blocks = np.ascontiguousarray(_blocks(kind, 67, 128, seed=5))
    x = torch.randn(DENSE_ABOVE, 128, generator=torch.Generator().manual_seed(4))
    alone = torch.cat([native.block_matmul(kind, blocks, x[i:i + 1]) for i in range(DENSE_ABOVE)])
    for size in (2, 3, 4, 5, 7, 8, 13, DENSE_ABOVE):
        for start in (0, 1, DENSE_ABOVE - size):
            got = native.block_matmul(kind, blocks, x[start:start + size])
            assert torch.equal(got, alone[start:start + size]), f"{size} tokens from {start}"


def _kv(n_kv: int, positions: int, dim: int, seed: int = 0, half: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    keys, values = torch.randn(n_kv, positions, dim, generator=gen), torch.randn(n_kv, positions, dim, generator=gen)
    return (keys.half(), values.half()) if half else (keys, values)


def _buffer(total: int) -> int:
    return -(-total // 256) * 256


@pytest.mark.parametrize("held,new", [(0, 1), (0, 5), (31, 2), (511, 3), (1000, 34), (2100, 9)])
@pytest.mark.parametrize("heads,n_kv,dim", [(9, 3, 64), (4, 1, 128), (4, 4, 16), (8, 2, 40)])
def test_attention_is_causal_gqa_attention_within_float_rounding(held, new, heads, n_kv, dim):
    total = held + new
    keys, values = _kv(n_kv, _buffer(total), dim, seed=held)
    q = torch.randn(heads, new, dim, generator=torch.Generator().manual_seed(new))
    got = native.attention(q, keys, values, total)
    want = gqa_attention(q, keys[:, :total], values[:, :total], causal_mask(new, total, "cpu"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("held", [0, 30, 31, 32, 500, 511, 512, 1500])  # block (32) and segment (512) edges
@pytest.mark.parametrize("new", [2, 7, 34, 64])
def test_a_verification_row_has_the_bits_of_a_one_token_step(held, new):
    total = held + new
    keys, values = _kv(3, _buffer(total), 64, seed=new)
    q = torch.randn(9, new, 64, generator=torch.Generator().manual_seed(held))
    together = native.attention(q, keys, values, total)
    for i in range(new):
        alone = native.attention(q[:, i:i + 1], keys, values, held + i + 1)
        assert torch.equal(alone[:, 0], together[:, i]), f"row {i} of {new} after {held} held differs"


@pytest.mark.parametrize("heads,n_kv,dim", [(8, 2, 40), (4, 1, 128), (6, 6, 24), (12, 3, 72)])
@pytest.mark.parametrize("half", [False, True])
def test_a_rows_bits_do_not_depend_on_the_rows_attended_with_it(heads, n_kv, dim, half):
    """The kernel attends rows in groups of six (one widening of each K/V chunk for all of them);
    which rows share a group changes with the number of new tokens, the bits of a row must not."""
    held, new = 45, 5
    total = held + new
    keys, values = _kv(n_kv, _buffer(total), dim, seed=dim, half=half)
    q = torch.randn(heads, new, dim, generator=torch.Generator().manual_seed(heads))
    together = native.attention(q, keys, values, total)
    for i in range(new):
        alone = native.attention(q[:, i:i + 1], keys, values, held + i + 1)
        assert torch.equal(alone[:, 0], together[:, i]), f"row {i} differs"
    for h in range(heads):  # one query head alone: a group of its own
        kv_head = h // (heads // n_kv)
        single = native.attention(q[h:h + 1], keys[kv_head:kv_head + 1].contiguous(),
                                  values[kv_head:kv_head + 1].contiguous(), total)
        assert torch.equal(single[0], together[h]), f"head {h} differs"


def test_what_lies_past_the_held_keys_is_never_seen():
    keys, values = _kv(2, 512, 16)
    q = torch.randn(4, 3, 16)
    before = native.attention(q, keys, values, 300)
    keys[:, 300:], values[:, 300:] = 1e4, float("nan")
    assert torch.equal(native.attention(q, keys, values, 300), before)


def test_shapes_it_cannot_take_are_refused():
    keys, values = _kv(1, 40, 8)  # 40 positions: not whole blocks of 32 keys
    with pytest.raises(ValueError):
        native.attention(torch.randn(2, 1, 8), keys, values, 20)
    assert not native.attention_supports(64, 40) and not native.attention_supports(12, 64)
    assert native.attention_supports(64, 256)


def test_the_cpu_full_cache_decodes_and_verifies_through_the_native_kernel():
    """FullCache on the CPU attends natively: k tokens verified in one forward give the bits of k
    one-token steps, through RoPE and the cache's own buffers."""
    from transformers import LlamaConfig

    rope = Rotary(LlamaConfig(head_dim=64, hidden_size=576, num_attention_heads=9), 64, torch.device("cpu"), 1024)
    gen = torch.Generator().manual_seed(7)
    prefix, new = 300, 6
    q, k, v = (torch.randn(h, prefix + new, 64, generator=gen) for h in (9, 3, 3))
    outs = {}
    for step in (new, 1):
        cache = FullCache(1, 3, 64, capacity=prefix + new, dtype=torch.float32, device="cpu")
        assert cache.native_attention
        cache.begin(torch.arange(prefix), rope)
        cache.attend(0, q[:, :prefix], k[:, :prefix], v[:, :prefix])
        cache.end()
        rows = []
        for start in range(prefix, prefix + new, step):
            cache.begin(torch.arange(start, start + step), rope)
            rows.append(cache.attend(0, q[:, start:start + step], k[:, start:start + step], v[:, start:start + step]))
            cache.end()
        outs[step] = torch.cat(rows, dim=1)
    assert torch.equal(outs[1], outs[new])


def test_turned_off_the_torch_paths_run_and_keep_their_own_target(monkeypatch):
    """TRIFORCE_NATIVE=0: no native kernel; a GGUF weight falls back to torch's int4 kernel (bfloat16
    activations, packed on first use), which is still row-invariant."""
    monkeypatch.setenv("TRIFORCE_NATIVE", "0")
    assert not native.available() and native.library() is None
    weight = QuantWeight("Q4_1", _blocks("Q4_1", 64, 64), 64)
    assert not weight.native and weight.packed_int4 is None
    x = torch.randn(5, 64)
    together = weight.matmul(x)
    assert weight.packed_int4 is not None
    assert torch.equal(weight.matmul(x[2:3]), together[2:3])
    oracle = x @ weight.dequantize().T
    assert (together - oracle).abs().max() > 1e-4 * oracle.abs().max()  # the bfloat16 target, not the oracle


@pytest.mark.parametrize("held,new", [(0, 1), (300, 6), (1500, 34)])
def test_float16_kv_is_read_as_its_float32_widening(held, new):
    """K/V stored in float16 (the CPU target's cache): the kernel widens each value exactly, so it
    computes what it computes on the float32 widening of the same buffers, bit for bit."""
    total = held + new
    keys, values = _kv(3, _buffer(total), 64, seed=held)
    keys16, values16 = keys.half(), values.half()
    q = torch.randn(9, new, 64, generator=torch.Generator().manual_seed(new))
    got = native.attention(q, keys16, values16, total)
    assert torch.equal(got, native.attention(q, keys16.float(), values16.float(), total))
    for i in (0, new - 1):
        alone = native.attention(q[:, i:i + 1], keys16, values16, held + i + 1)
        assert torch.equal(alone[:, 0], got[:, i])


def test_the_runners_cpu_cache_stores_float16_and_prefills_from_it():
    cache = FullCache(2, 3, 64, capacity=300, dtype=torch.float32, device="cpu", kv_dtype=torch.float16)
    assert cache.kv_dtype == torch.float16 and cache.keys[0].dtype == torch.float16
    assert cache.bytes_per_token() == 2 * 2 * 3 * 64 * 2
    from transformers import LlamaConfig

    rope = Rotary(LlamaConfig(head_dim=64, hidden_size=576, num_attention_heads=9), 64, torch.device("cpu"), 512)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(h, 100, 64, generator=gen) for h in (9, 3, 3))
    cache.begin(torch.arange(100), rope)  # a prefill chunk (over MAX_ROWS): SDPA over the widened K/V
    out = cache.attend(0, q, k, v)
    cache.end()
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(cache.values[0][:, :100].float(), v, rtol=1e-3, atol=1e-3)
    plain = FullCache(2, 3, 64, capacity=300, dtype=torch.float32, device="cpu", exact=False, kv_dtype=torch.float16)
    assert plain.kv_dtype == torch.float32  # only where the native kernel reads it


@pytest.mark.skipif(not {"avx512f", "avx512dq"} <= cpu_flags(),
                    reason="no AVX-512 here: the 8-lane attention is the only one built")
def test_the_512_bit_attention_gives_the_8_lane_bits(tmp_path):
    """Where the compiler targets AVX-512, attention runs two 8-lane registers' work in each 512-bit
    one, lane for lane in the same order, and groups six rows: the same bits as the 8-lane build of
    the same source, so the target decodes alike with and without AVX-512."""
    compiler = native._compiler()
    narrow = tmp_path / "narrow.so"
    assert native._build(compiler, narrow, ["-O3", "-march=native", "-mno-avx512f", "-fopenmp"])
    lib = native._declare(__import__("ctypes").CDLL(str(narrow)))
    for heads, n_kv, dim, half in [(9, 3, 64, True), (9, 3, 64, False), (4, 1, 128, True), (12, 3, 72, True),
                                   (8, 2, 40, False)]:
        for held, new in [(0, 1), (45, 5), (700, 8), (1500, 3)]:
            total = held + new
            keys, values = _kv(n_kv, _buffer(total), dim, seed=held, half=half)
            q = torch.randn(heads, new, dim, generator=torch.Generator().manual_seed(dim))
            wide = native.attention(q, keys, values, total)
            out = torch.empty_like(q)
            assert lib.triforce_attention(q.data_ptr(), keys.data_ptr(), values.data_ptr(), int(half), keys.shape[1],
                                          heads, n_kv, new, dim, total, dim ** -0.5, out.data_ptr(), 2) == 0
            assert torch.equal(out, wide), (heads, n_kv, dim, half, held, new)


@pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="no AVX2 here: only the plain-C body is built")
def test_the_int16_activation_matmul_bodies_agree(tmp_path):
    """The int16-activation matmul (a drafter's) has three bodies: AVX512-VNNI, AVX2 (vpmaddwd, for
    CPUs without VNNI) and plain C. They sum the same integer products; only float rounding differs.
    Widths of 3, 5 and 18 blocks cover a row's last, partial group of four; 5 tokens a full pass of
    four and one more."""
    compiler = native._compiler()
    for name, flags in (("avx2", ["-mno-avx512f"]), ("plain", ["-mno-avx2"])):
        built = tmp_path / f"{name}.so"
        assert native._build(compiler, built, ["-O3", "-march=native", *flags, "-fopenmp"])
        lib = native._declare(__import__("ctypes").CDLL(str(built)))
        for width in (96, 160, 576):
            blocks = np.ascontiguousarray(_blocks("Q4_1", 11, width, seed=width))
            matrix = native.BlockMatrix("Q4_1", blocks)
            x = torch.randn(5, width, generator=torch.Generator().manual_seed(2))
            y = torch.full((5, 11), float("nan"))
            assert lib.triforce_block_matmul_q16a(matrix.pointer, 11, width, x.data_ptr(), 5, y.data_ptr(), 2) == 0
            torch.testing.assert_close(y, matrix.matmul_int16(x), rtol=1e-5, atol=1e-5, msg=f"{name} {width}")
            torch.testing.assert_close(y, int16_reference("Q4_1", blocks, x), rtol=1e-5, atol=1e-5,
                                       msg=f"{name} {width}")


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_4_bit_blocks_are_repacked_with_their_exact_float32_scales(kind):
    """The kernel reads a 4-bit row in groups of four blocks, [d0..d3 f32][m0..m3 f32][the file's 16
    bytes of each] (the last group of a row may hold fewer, laid out alike): d and m are the file's
    halves widened exactly, and Q4_0's m is -8 d, so d * q + m is the file's weight bit for bit."""
    blocks = _blocks(kind, 3, 6 * 32)  # 6 blocks a row: a group of four, then one of two
    packed = native.repack_q4(kind, blocks)
    assert packed.shape == (3, 6 * 24)
    raw = np.asarray(blocks).reshape(3, 6, -1)
    d = raw[..., 0:2].copy().view(np.float16).astype(np.float32)[..., 0]  # [3, 6]
    m = raw[..., 2:4].copy().view(np.float16).astype(np.float32)[..., 0] if kind == "Q4_1" else -8.0 * d
    for first, n in ((0, 4), (4, 2)):
        group = packed[:, first * 24:(first + n) * 24]
        assert np.array_equal(group[:, :4 * n].copy().view(np.float32), d[:, first:first + n])
        assert np.array_equal(group[:, 4 * n:8 * n].copy().view(np.float32), m[:, first:first + n])
        assert np.array_equal(group[:, 8 * n:].reshape(3, n, 16), raw[:, first:first + n, -16:])


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("out,width", [(1, 32), (7, 96), (5, 64), (130, 576), (40, 1536), (3, 224)])
def test_the_int16_activation_matmul_is_the_quantized_product(kind, out, width):
    """L1's cheaper matmul (only ever a drafter's, whose tokens L2 checks): the activations' int16
    quantization times the file's nibbles, within float rounding of that product computed in
    float64, ~1e-5 from the float32 product, and the same for a row whatever the tokens beside it."""
    blocks = np.ascontiguousarray(_blocks(kind, out, width, seed=out))
    check_int16_is_the_quantized_product(native.BlockMatrix(kind, blocks), kind, blocks, width)


def test_q8_0_weights_draft_through_the_float_kernel():
    blocks = np.ascontiguousarray(_blocks("Q8_0", 9, 64))
    matrix = native.BlockMatrix("Q8_0", blocks)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(1))
    assert not matrix.drafts_int16 and torch.equal(matrix.matmul_int16(x), matrix.matmul(x))


def test_the_float16_stores_round_as_torch_does(tmp_path):
    """The whole-layer call (engine/model/fused_layers.py) stores K/V as float16 itself: round to
    nearest even, as torch's copy does, with F16C and in the plain-C body a CPU without it builds
    (ties, subnormals, the overflow edge at 65520, infinities and NaN)."""
    special = [0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, -70000.0, 5.96e-8, 2.98e-8, 2.99e-8, 8.9e-8,
               6.1e-5, 6.09e-5, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11, float("inf"), float("-inf")]
    x = torch.cat([torch.tensor(special), torch.randn(4000, generator=torch.Generator().manual_seed(3)) * 300,
                   torch.randn(1000, generator=torch.Generator().manual_seed(4)) * 1e-5])
    expected = x.half().view(torch.int16)
    plain = tmp_path / "no-f16c.so"
    assert native._build(native._compiler(), plain, ["-O3", "-march=native", "-mno-f16c", "-fopenmp"])
    for lib in (native.library(), native._declare(__import__("ctypes").CDLL(str(plain)))):
        out = torch.empty(x.shape[0], dtype=torch.int16)
        lib.triforce_to_half(x.data_ptr(), x.shape[0], out.data_ptr())
        assert torch.equal(out, expected)
    nan, source = torch.empty(1, dtype=torch.int16), torch.tensor([float("nan")])
    native.library().triforce_to_half(source.data_ptr(), 1, nan.data_ptr())
    assert nan.view(torch.float16).isnan().all()


# ---------------------------------------------------------------- kinds read as stored: K super-blocks, 5-bit

STORED_KINDS = ("Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1")
# a byte of each field of a row's first block, and the bit flipped in it: a nibble's, a scale's, a
# min's, a fifth/sixth bit's (the fields a kernel could misread)
FAULTS = {"Q4_K": {"scale": (4, 0x10), "min": (8, 0x10), "top scale bits": (0, 0x40), "nibble": (60, 0x10)},
          "Q5_K": {"scale": (5, 0x10), "min": (9, 0x10), "fifth bit": (20, 0x02), "nibble": (100, 0x01)},
          "Q6_K": {"low nibble": (5, 0x04), "high nibble": (70, 0x40), "sixth bits": (140, 0x20), "scale": (194, 0x10)},
          "Q5_0": {"scale": (1, 0x04), "fifth bit": (4, 0x01), "nibble": (9, 0x80)},
          "Q5_1": {"min": (3, 0x04), "fifth bit": (5, 0x10), "nibble": (12, 0x01)}}


def _stored_blocks(kind: str, out: int, width: int, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((out, width)).astype(np.float32)
    return pack_k(kind, rows) if kind.endswith("_K") else quants.quantize(rows, GGMLQuantizationType[kind])


FLOAT_STORED_KINDS = ("Q5_0", "Q5_1")  # read as stored, times float32 activations
K_KINDS = ("Q4_K", "Q5_K", "Q6_K")  # read as stored, times int16 activations


@pytest.mark.parametrize("kind", FLOAT_STORED_KINDS)
@pytest.mark.parametrize("out,width", [(1, 256), (7, 512), (130, 1536)])
def test_stored_kinds_matmul_is_the_oracle_and_a_misread_field_fails_it(kind, out, width):
    """The file's bytes read as stored times float32 activations: x @ dequantize(W).T up to the
    order of a float32 sum. One bit of one nibble, scale, min or high-bit field read wrong (here: the
    blocks with that bit flipped) misses the oracle by far more than the tolerance."""
    blocks = _stored_blocks(kind, out, width, seed=out)
    x = torch.randn(9, width, generator=torch.Generator().manual_seed(3))
    want = x @ dequantize_blocks(kind, blocks, width).T
    tolerance = 1e-5 * float(want.abs().max())
    got = native.block_matmul(kind, blocks, x)
    assert got.shape == (9, out)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=tolerance)
    for field, (at, bit) in FAULTS[kind].items():
        wrong = blocks.copy()
        wrong[0, at] ^= bit
        missed = (native.block_matmul(kind, wrong, x) - want).abs().max()
        assert missed > 100 * tolerance, (kind, field, float(missed))


def activation_rounding_bound(blocks: np.ndarray, kind: str, x: torch.Tensor) -> torch.Tensor:
    """[T, out]: how far x @ W.T may move when x is rounded to int16 per 32 elements: each activation
    by at most half a step, max |x| / 65534 over its 32, times |w| (1 % over it for the float32
    arithmetic of the rounding)."""
    width = x.shape[1]
    step = x.double().reshape(x.shape[0], -1, 32).abs().amax(-1, keepdim=True).expand(-1, -1, 32) / 65534
    return 1.01 * step.reshape(x.shape[0], width) @ dequantize_blocks(kind, blocks, width).double().abs().T


@pytest.mark.parametrize("kind", K_KINDS)
@pytest.mark.parametrize("out,width", [(1, 256), (7, 512), (130, 1536)])
def test_k_kinds_matmul_is_the_int16_activation_product_and_a_misread_field_fails_it(kind, out, width):
    """The K kinds' matmul (the target's: decoding and verification) is the product of the file's
    exact weights with x rounded to int16 per 32 elements (tests/int16_reference.py) up to float32
    rounding, and so within the activations' rounding bound of the float64 product x @ W.T (a bound a
    few 1e-4 of the output: not vacuous). One bit of one nibble, scale, min or high-bit field read
    wrong misses the quantized product by far more than its tolerance, and the float64 product by
    more than the bound."""
    blocks = _stored_blocks(kind, out, width, seed=out)
    x = torch.randn(9, width, generator=torch.Generator().manual_seed(3))
    exact = x.double() @ dequantize_blocks(kind, blocks, width).double().T  # [9, out]
    want = int16_reference(kind, blocks, x)
    tolerance = 1e-5 * float(want.abs().max())
    got = native.block_matmul(kind, blocks, x)
    assert got.shape == (9, out)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=tolerance)
    bound = activation_rounding_bound(blocks, kind, x) + tolerance
    assert ((got.double() - exact).abs() <= bound).all()
    assert float(bound.max()) < 1e-3 * float(exact.abs().max())
    assert not torch.equal(got, (x @ dequantize_blocks(kind, blocks, width).T))  # not the float32 product
    for field, (at, bit) in FAULTS[kind].items():
        wrong = blocks.copy()
        wrong[0, at] ^= bit
        off = native.block_matmul(kind, wrong, x)
        assert (off - want).abs().max() > 100 * tolerance, (kind, field)
        assert ((off.double() - exact).abs() > bound).any(), (kind, field)


@pytest.mark.parametrize("kind", STORED_KINDS)
def test_a_stored_kinds_row_has_the_same_bits_whatever_the_number_of_tokens(kind):
    blocks = _stored_blocks(kind, 67, 512, seed=5)
    x = torch.randn(DENSE_ABOVE, 512, generator=torch.Generator().manual_seed(4))
    alone = torch.cat([native.block_matmul(kind, blocks, x[i:i + 1]) for i in range(DENSE_ABOVE)])
    for size in (2, 3, 4, 5, 7, 8, 13, DENSE_ABOVE):
        assert torch.equal(native.block_matmul(kind, blocks, x[:size]), alone[:size]), size


def test_stored_blocks_are_read_in_place_from_a_read_only_map(tmp_path):
    """A memory-mapped file's bytes (read-only) are what the kernel reads: no copy is made."""
    blocks = _stored_blocks("Q4_K", 33, 512, seed=6)
    path = tmp_path / "blocks.bin"
    blocks.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=blocks.shape)
    matrix = native.BlockMatrix("Q4_K", mapped)
    assert matrix.pointer == mapped.ctypes.data and not matrix.array.flags.writeable
    x = torch.randn(2, 512)
    assert torch.equal(matrix.matmul(x), native.block_matmul("Q4_K", blocks, x))
    weight = QuantWeight("Q4_K", mapped, 512)
    assert torch.equal(weight.matmul(x), matrix.matmul(x)) and torch.equal(weight.rows(torch.tensor([3])),
                                                                            weight.dequantize()[3:4])


def test_a_stacked_weight_runs_each_part_with_its_own_kernel_in_one_call():
    parts = [native.BlockMatrix(kind, _stored_blocks(kind, rows, 512, seed=rows))
             for kind, rows in (("Q4_K", 40), ("Q6_K", 24), ("Q8_0", 8), ("Q4_1", 16))]
    stacked = native.StackedBlocks(parts)
    assert stacked.out == 88 and stacked.code == native.STACKED_CODE and stacked.drafts_int16
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(7))
    assert torch.equal(stacked.matmul(x), torch.cat([p.matmul(x) for p in parts], dim=1))
    with pytest.raises(ValueError):
        native.StackedBlocks([stacked])
