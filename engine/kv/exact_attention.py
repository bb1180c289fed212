"""Batch-invariant attention on the CPU: a query row's bits do not depend on how many rows share
the forward, so verifying k drafted tokens in one forward gives exactly the logits that k
one-token decoding steps give. That is what makes every speculative mode token-identical to plain
decoding, not only "identical up to float rounding" (a rounding difference of 2^-24 in attention,
widened by the bfloat16 activations of the quantized target to ~2^-9, did flip a near-tie after 19
tokens at 8K context).

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
number of rows (M) and batches: true of the kernels on an Intel Xeon (AVX-512, AMX) with CHUNK =
256 (not with 1024), false on an AMD EPYC (AVX-512, the same torch and MKL), where a row's scores
changed in the last bits with every row count. So the first call probes the machine
(`kernel_path`) and takes the fastest of three paths whose products it finds row-invariant:
- BATCHED: the products above, all rows of a KV head at once;
- ONE_ROW: every row its own one-row product, as a batch over a stride-0 view of the keys and
  values (no copy): scores over the padded keys, probs @ V over them too (p = 0 past the row's
  own keys); invariant where the one-row kernel's result does not depend on the batch size or on
  all-zero chunks after the row's keys (the AMD EPYC). (One product per token, M = G rows, was
  slower there: per KV head at 8K, one token, scores 224 us against 109.)
- ONE_ROW_CHUNKS: ONE_ROW's scores, and probs @ V per row and chunk combined by the cumulative
  sum (each of those products the same shape whatever the forward), for a machine whose one-row
  products change with trailing zeros; rows x heads small calls per layer (with idle OpenMP
  threads sleeping, each call pays a wake-up). Its scores still rest on one-row products giving a
  row the same bits over more keys, which the tests check.
tests/test_exact_attention.py checks the whole function, decode against verification, bit for
bit, on the machine it runs on, for the path it picks and for ONE_ROW_CHUNKS.

BATCHED reads every K/V byte once, as the plain kernel does; a one-token step costs a few more
small tensor ops (~0.1 ms per layer), a verification forward about the same as the plain kernel or
less. The one-row paths read a KV head's keys and values once per row (mostly from cache): on the
EPYC an 8K forward took 49.9 ms for one token and 95.8 for five, against 37.1 and 62.2 batched.
"""
from __future__ import annotations

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
_PATH: dict[int, str] = {}  # head_dim -> the fastest path whose products are row-invariant here


def _batched_products_invariant(dim: int, gen: torch.Generator) -> bool:
    """Does a row of either batched product keep its bits whatever the number of rows and chunks?"""
    keys = torch.randn(2, 3 * CHUNK, dim, generator=gen)  # [Hkv, S, D]
    q = torch.randn(2, MAX_ROWS, dim, generator=gen)  # [Hkv, rows, D]
    probs = torch.rand(3, MAX_ROWS, CHUNK, generator=gen)  # [chunks, rows, CHUNK]
    scores = torch.bmm(q[:, :1], keys.transpose(1, 2))  # [Hkv, 1, S]
    mixed = torch.bmm(probs[:2, :1], keys[0].view(3, CHUNK, dim)[:2])  # [2, 1, D]
    for rows in range(2, MAX_ROWS + 1):
        if not (torch.equal(torch.bmm(q[:, :rows], keys.transpose(1, 2))[:, :1], scores)
                and torch.equal(torch.bmm(probs[:, :rows], keys[0].view(3, CHUNK, dim))[:2, :1], mixed)):
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


def kernel_path(dim: int) -> str:
    """The path exact_gqa_attention takes on this machine at head size `dim`, probed once (a few
    ms): BATCHED where batched products are row-invariant (an Intel Xeon), else ONE_ROW where
    one-row products are invariant in the batch size and in trailing zero chunks (an AMD EPYC),
    else ONE_ROW_CHUNKS (probs @ V invariant by construction, every product the same shape, but
    many small calls)."""
    if dim not in _PATH:
        gen = torch.Generator().manual_seed(0)
        _PATH[dim] = (BATCHED if _batched_products_invariant(dim, gen) else
                      ONE_ROW if _one_row_products_invariant(dim, gen) else ONE_ROW_CHUNKS)
    return _PATH[dim]


def exact_gqa_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, total: int,
                        hidden: torch.Tensor | None = None, path: str | None = None) -> torch.Tensor:
    """q [Hq, T, D] (the last T of `total` positions), keys/values [Hkv, >= padded_length(total), D]
    (buffers whose first `total` positions are held; the rest finite, never seen)
    -> [Hq, T, D]. hidden: hidden_tail(T, total, Hq // Hkv), built once per forward. path: force
    one of BATCHED, ONE_ROW, ONE_ROW_CHUNKS (None: kernel_path(D), this machine's)."""
    n_heads, new, dim = q.shape
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    padded = padded_length(total)
    n_chunks = padded // CHUNK
    if keys.shape[1] < padded:
        raise ValueError(f"exact attention needs {padded} buffer positions, the cache holds {keys.shape[1]}")
    rows = group * new
    path = path or kernel_path(dim)
    q_rows = q.reshape(n_kv, rows, dim) * dim ** -0.5  # [Hkv, G*T, D]; row g*T + t
    if path == BATCHED:
        scores = torch.bmm(q_rows, keys[:, :padded].transpose(1, 2))  # [Hkv, G*T, S_pad]
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
        scores[:, :, total - new + 1:].masked_fill_(hidden, float("-inf"))
    # the row's length is a whole number of chunks and what follows its own keys is -inf: the
    # softmax's lane-wise max and sum only ever add exact zeros for them (hidden keys -> p = 0)
    probs = torch.softmax(scores, dim=-1)  # [Hkv, G*T, S_pad]
    if path == ONE_ROW:
        out = torch.empty(n_kv, rows, 1, dim, dtype=scores.dtype)
        for h in range(n_kv):  # [G*T, 1, S_pad] @ [G*T, S_pad, D] (stride 0): p = 0 past the row's keys
            torch.bmm(probs[h].unsqueeze(1), values[h, :padded].expand(rows, padded, dim), out=out[h])
        return out.view(n_heads, new, dim).to(q.dtype)
    probs = probs.view(n_kv, rows, n_chunks, CHUNK)
    if path == ONE_ROW_CHUNKS:
        per_row = torch.empty(n_kv, rows, n_chunks, 1, dim, dtype=scores.dtype)
        for h in range(n_kv):
            chunks = values[h, :padded].view(n_chunks, CHUNK, dim)
            for r in range(rows):  # [chunks, 1, CHUNK] @ [chunks, CHUNK, D]: one row, the same shape always
                torch.bmm(probs[h, r].unsqueeze(1), chunks, out=per_row[h, r])
        outs = per_row.view(n_kv, rows, n_chunks, dim).cumsum(2)[:, :, -1]  # [Hkv, G*T, D]
        return outs.reshape(n_heads, new, dim).to(q.dtype)
    per_chunk = torch.empty(n_kv, n_chunks, rows, dim, dtype=scores.dtype)
    for h in range(n_kv):  # one KV head at a time: its chunks are one contiguous batch, never copied
        torch.bmm(probs[h].transpose(0, 1), values[h, :padded].view(n_chunks, CHUNK, dim), out=per_chunk[h])
    outs = per_chunk.view(n_kv, n_chunks, rows * dim).cumsum(1)[:, -1]  # [Hkv, G*T * D]
    return outs.reshape(n_heads, new, dim).to(q.dtype)
