"""Batch-invariant attention on the CPU: a query row's bits do not depend on how many rows share
the forward, so verifying k drafted tokens in one forward gives exactly the logits that k
one-token decoding steps give. That is what makes every speculative mode token-identical to plain
decoding, not only "identical up to float rounding" (a rounding difference of 2^-24 in attention,
widened by low-precision activations to ~2^-9, is enough to flip a near-tie within an answer at
long contexts).

Where ordinary attention loses it: the softmax sum and the probs @ V product reduce over all S
keys, and a verification row (which sees S - T + i + 1 keys, with the rest masked) is reduced
with a different vector tail and a different BLAS blocking than the same row in a one-token step
(S' = S - T + i + 1 keys, none masked). Here no reduction's shape depends on the forward:
- keys are read in CHUNK-sized chunks aligned to absolute positions (the buffer behind the cache
  is CHUNK-padded); positions a row may not see are masked to -inf;
- scores are dot products of length D; the softmax runs over rows a whole number of chunks long,
  so its lane-wise max and sum meet the -inf tail only as exact zeros (no vector tail);
- probs @ V is computed per chunk, a reduction over exactly CHUNK keys, and the chunks are
  combined by a cumulative sum, a strictly left-to-right loop whose last entry cannot change when
  trailing all-zero chunks are appended.
The assumption left is that the BLAS computes a row of a batched matmul the same whatever the
number of rows (M), the row's place among them and the batch size. Some CPUs and BLAS builds keep a
row's bits at every M (with CHUNK = 256, not 1024); on others a row's bits change between small
row counts (M = 1, 2-3, >= 4 on some AVX-512 parts), and a batch of one (a plain matmul) differs
from larger batches, while from a few rows on, in batches of two or more, every row count, place
and batch size gives the same bits. So the first call for an attention shape probes the machine
(`kernel_plan`, with every row count that shape can bring) and takes the first of three paths
whose products it finds invariant:
- BATCHED: the products above, all rows of a KV head at once, padded with zero rows to the fewest
  rows from which products agree (1 or 4 on the CPUs tested: a one-token step of 3 query heads
  per KV head computes 4 rows); probs @ V over a single chunk runs as two chunks (one all zero);
- ONE_ROW: every row its own one-row product, as a batch over a stride-0 view of the keys and
  values (no copy): scores over the padded keys, probs @ V over them too (p = 0 past the row's
  own keys); for a machine where no padding helps but one-row products do not depend on the
  batch size or on all-zero chunks after the row's keys;
- ONE_ROW_CHUNKS: ONE_ROW's scores, and probs @ V per row and chunk combined by the cumulative
  sum (each of those products the same shape whatever the forward), for a machine whose one-row
  products change with trailing zeros; rows x heads small calls per layer (with idle OpenMP
  threads sleeping, each call pays a wake-up). Its scores still rest on one-row products giving a
  row the same bits over more keys, which the tests check.
tests/test_exact_attention.py checks the whole function, decode against verification, bit for
bit, on the machine it runs on, for the path it picks and for ONE_ROW_CHUNKS, and checks the
probe's choice on data of its own.

BATCHED reads every K/V byte once, as the plain kernel does. The one-row paths read a KV head's
keys and values once per row (mostly from cache), so they are slower, more so for verification
forwards of several rows; they are the fallbacks for machines where padding does not help.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

CHUNK = 256  # keys per chunk (absolute positions c*CHUNK .. (c+1)*CHUNK - 1)
MAX_ROWS = 64  # new tokens per forward this kernel takes; prefill chunks use SDPA (their bits do not matter)


def padded_length(total: int) -> int:
    """Buffer positions the kernel reads for `total` held keys: `total` rounded up to CHUNK."""
    return -(-total // CHUNK) * CHUNK


def hidden_tail(new_tokens: int, total: int, group: int = 1) -> torch.Tensor | None:
    """[G*T, padded_length(total) - total + T - 1] bool (rows g*T + t): True where new row t (the
    (total-T+t)-th token) may not look, over the only keys any row may not see (those after the
    first row's). None when T == 1 (that row sees every held key: only the padding is hidden)."""
    if new_tokens == 1:
        return None
    first = total - new_tokens + 1
    cols = torch.arange(first, padded_length(total))[None, :]  # [1, tail]
    rows = torch.arange(new_tokens)[:, None] + (total - new_tokens)  # [T, 1]
    return (cols > rows).repeat(group, 1)


BATCHED, ONE_ROW, ONE_ROW_CHUNKS = "batched", "one-row", "one-row-chunks"  # the kernel's paths
PAD_CANDIDATES = (1, 2, 4, 8, 16)  # rows a batched product may be padded to, fewest first


class Plan(NamedTuple):
    """How exact_gqa_attention runs on this machine for one attention shape."""
    path: str  # BATCHED, ONE_ROW or ONE_ROW_CHUNKS
    min_rows: int  # BATCHED: a product of fewer rows is padded to this many (1: never padded)


_PLANS: dict[tuple[int, int, int], Plan] = {}  # (head_dim, group, KV heads) -> the plan probed here


def _scores_batched(q_rows: torch.Tensor, keys: torch.Tensor, padded: int) -> torch.Tensor:
    """q_rows [Hkv, M, D], keys [Hkv, >= padded, D] -> [Hkv, M, padded]: dot products of length D."""
    return torch.bmm(q_rows, keys[:, :padded].transpose(1, 2))


def _chunk_products(probs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """probs [M, C, CHUNK] (one KV head's rows), values [>= C*CHUNK, D] -> [max(C, 2), M, D]: each
    chunk's probs @ V, a reduction over exactly CHUNK keys. One chunk is computed as two (the second
    all zero): a batch of one may run a different kernel (a plain matmul, other bits)."""
    rows, n_chunks, _ = probs.shape
    chunks = values[:n_chunks * CHUNK].view(n_chunks, CHUNK, -1)  # [C, CHUNK, D]
    if n_chunks == 1:
        probs = torch.cat([probs, torch.zeros_like(probs)], 1)  # [M, 2, CHUNK]
        chunks = torch.cat([chunks, torch.zeros_like(chunks)])  # [2, CHUNK, D]
    return torch.bmm(probs.transpose(0, 1), chunks)


def _batched_products_invariant(dim: int, group: int, n_kv: int, min_rows: int, gen: torch.Generator) -> bool:
    """Padded to at least `min_rows` rows, does a row of either batched product keep its bits
    whatever the row count this shape can bring (group x 1..MAX_ROWS), its place among the rows,
    the number of keys (scores) or chunks (probs @ V)? Every row and batch entry gets the same
    input, so one product checks every place at once."""
    x = torch.randn(dim, generator=gen)
    key = torch.randn(3 * CHUNK, dim, generator=gen)
    p = torch.rand(CHUNK, generator=gen)
    v = torch.randn(CHUNK, dim, generator=gen)
    keys = key.repeat(n_kv, 1, 1)  # [Hkv, 3*CHUNK, D], every head the same (contiguous, like the cache's)
    rows = max(group, min_rows)  # the first row of a one-token step, over three chunks of keys
    scores = _scores_batched(x.expand(n_kv, rows, dim).contiguous(), keys, 3 * CHUNK)[0, 0]  # [3*CHUNK]
    mixed = None
    for new in range(1, MAX_ROWS + 1):
        rows = max(group * new, min_rows)
        padded = (new % 3 + 1) * CHUNK
        got = _scores_batched(x.expand(n_kv, rows, dim).contiguous(), keys, padded)  # [Hkv, M, S]
        if not torch.equal(got, scores[:padded].expand_as(got)):
            return False
        n_chunks = (1, 2, 3, 5, 9, 33)[new % 6]
        got = _chunk_products(p.expand(rows, n_chunks, CHUNK).contiguous(), v.repeat(n_chunks, 1))[:n_chunks]
        mixed = got[0, 0] if mixed is None else mixed
        if not torch.equal(got, mixed.expand_as(got)):
            return False
    return True


def _one_row_products_invariant(dim: int, gen: torch.Generator) -> bool:
    """Does a one-row product over a stride-0 batch keep its bits whatever the batch size, and for
    probs @ V whatever the number of all-zero chunks after its keys?"""
    keys = torch.randn(4 * CHUNK, dim, generator=gen)  # [S, D]
    q = torch.randn(MAX_ROWS, 1, dim, generator=gen)  # [rows, 1, D]
    probs = torch.rand(MAX_ROWS, 1, 4 * CHUNK, generator=gen)  # [rows, 1, S]
    probs[:, :, 2 * CHUNK + 7:] = 0.0
    scores = torch.bmm(q[:1], keys[:2 * CHUNK].expand(1, 2 * CHUNK, dim).transpose(1, 2))  # [1, 1, S']
    mixed = torch.bmm(probs[:1, :, :3 * CHUNK], keys[:3 * CHUNK].expand(1, 3 * CHUNK, dim))  # [1, 1, D]
    for rows in (1, 2, 3, 5, 9, 17, 33, MAX_ROWS):
        for length in (2 * CHUNK, 3 * CHUNK, 4 * CHUNK):
            got = torch.bmm(q[:rows], keys[:length].expand(rows, length, dim).transpose(1, 2))[:1, :, :2 * CHUNK]
            if not torch.equal(got, scores):
                return False
            if length > 2 * CHUNK:
                got = torch.bmm(probs[:rows, :, :length], keys[:length].expand(rows, length, dim))[:1]
                if not torch.equal(got, mixed):
                    return False
    return True


def kernel_plan(dim: int, group: int = 1, n_kv: int = 2) -> Plan:
    """How exact_gqa_attention runs here for head size `dim`, `group` query heads per KV head and
    `n_kv` KV heads, probed once per shape (tens of ms): BATCHED with the fewest padded rows whose
    batched products are row-invariant (1 or 4 on the CPUs tested), else ONE_ROW where
    one-row products are invariant in the batch size and in trailing zero chunks, else
    ONE_ROW_CHUNKS (probs @ V invariant by construction, every product the same shape, but many
    small calls)."""
    shape = (dim, group, n_kv)
    if shape not in _PLANS:
        gen = torch.Generator().manual_seed(0)
        for min_rows in PAD_CANDIDATES:
            if _batched_products_invariant(dim, group, n_kv, min_rows, gen):
                _PLANS[shape] = Plan(BATCHED, min_rows)
                break
        else:
            _PLANS[shape] = Plan(ONE_ROW if _one_row_products_invariant(dim, gen) else ONE_ROW_CHUNKS, 1)
    return _PLANS[shape]


def kernel_path(dim: int, group: int = 1, n_kv: int = 2) -> str:
    """The path kernel_plan picks here for that shape."""
    return kernel_plan(dim, group, n_kv).path


def exact_gqa_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, total: int,
                        hidden: torch.Tensor | None = None, path: str | None = None) -> torch.Tensor:
    """q [Hq, T, D] (the last T of `total` positions), keys/values [Hkv, >= padded_length(total), D]
    (buffers whose first `total` positions are held; the rest finite, never seen)
    -> [Hq, T, D]. hidden: hidden_tail(T, total, Hq // Hkv), built once per forward. path: force
    one of BATCHED, ONE_ROW, ONE_ROW_CHUNKS (None: kernel_plan's, this machine's)."""
    n_heads, new, dim = q.shape
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    padded = padded_length(total)
    n_chunks = padded // CHUNK
    if keys.shape[1] < padded:
        raise ValueError(f"exact attention needs {padded} buffer positions, the cache holds {keys.shape[1]}")
    rows = group * new
    plan = kernel_plan(dim, group, n_kv)
    path = path or plan.path
    q_rows = q.reshape(n_kv, rows, dim) * dim ** -0.5  # [Hkv, G*T, D]; row g*T + t
    if path == BATCHED:
        if plan.path == BATCHED and rows < plan.min_rows:  # zero rows: their scores are 0, never used
            q_rows = torch.cat([q_rows, q_rows.new_zeros(n_kv, plan.min_rows - rows, dim)], 1)
        scores = _scores_batched(q_rows, keys, padded)  # [Hkv, M, S_pad], M >= G*T
    else:
        scores = torch.empty(n_kv, rows, 1, padded, dtype=q_rows.dtype)
        for h in range(n_kv):  # a batch of one-row products over the same keys (a stride-0 view: no copy)
            keys_t = keys[h, :padded].expand(rows, padded, dim).transpose(1, 2)  # [G*T, D, S_pad]
            torch.bmm(q_rows[h].unsqueeze(1), keys_t, out=scores[h])
        scores = scores.view(n_kv, rows, padded)
    if new == 1:
        scores[:, :, total:].fill_(float("-inf"))
    else:
        if hidden is None:
            hidden = hidden_tail(new, total, group)
        scores[:, :rows, total - new + 1:].masked_fill_(hidden, float("-inf"))
    # the row's length is a whole number of chunks and what follows its own keys is -inf: the
    # softmax's lane-wise max and sum only ever add exact zeros for them (hidden keys -> p = 0)
    probs = torch.softmax(scores, dim=-1)  # [Hkv, M, S_pad]
    if path == ONE_ROW:
        out = torch.empty(n_kv, rows, 1, dim, dtype=scores.dtype)
        for h in range(n_kv):  # [G*T, 1, S_pad] @ [G*T, S_pad, D] (stride 0): p = 0 past the row's keys
            torch.bmm(probs[h].unsqueeze(1), values[h, :padded].expand(rows, padded, dim), out=out[h])
        return out.view(n_heads, new, dim).to(q.dtype)
    probs = probs.view(n_kv, -1, n_chunks, CHUNK)
    if path == ONE_ROW_CHUNKS:
        per_row = torch.empty(n_kv, rows, n_chunks, 1, dim, dtype=scores.dtype)
        for h in range(n_kv):
            chunks = values[h, :padded].view(n_chunks, CHUNK, dim)
            for r in range(rows):  # [chunks, 1, CHUNK] @ [chunks, CHUNK, D]: one row, the same shape always
                torch.bmm(probs[h, r].unsqueeze(1), chunks, out=per_row[h, r])
        outs = per_row.view(n_kv, rows, n_chunks, dim).cumsum(2)[:, :, -1]  # [Hkv, G*T, D]
        return outs.reshape(n_heads, new, dim).to(q.dtype)
    # one KV head at a time: its chunks are one contiguous batch, never copied; [C', M, D] each
    per_chunk = torch.stack([_chunk_products(probs[h], values[h]) for h in range(n_kv)])  # [Hkv, C', M, D]
    outs = per_chunk.cumsum(1)[:, -1, :rows]  # [Hkv, G*T, D]: chunks summed strictly left to right
    return outs.reshape(n_heads, new, dim).to(q.dtype)
