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
256 (not with 1024), false on an AMD EPYC (AVX-512, same torch and MKL), where a row's scores
differed in the last bits for every M but its own. So the first call probes this machine
(`rows_are_invariant`): where the batched products are not row-invariant, every row is its own
product with one row (M = 1 always: scores as a batch of rows over the same keys, read through a
stride-0 view, and probs @ V one row at a time). That path is invariant by construction, since
every row's product has the same shape whatever the forward, and costs more (at 8K, per layer,
scores 232 us instead of 177 for one token, 830 instead of 400 for five).
tests/test_exact_attention.py checks the whole function, decode against verification, bit for
bit, on the machine it runs on, on both paths.

It reads every K/V byte once, as the plain kernel does; a one-token step costs a few more small
tensor ops (~0.1 ms per layer), a verification forward about the same as the plain kernel or less.
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


_INVARIANT: dict[int, bool] = {}  # head_dim -> are batched products row-invariant on this machine?


def rows_are_invariant(dim: int) -> bool:
    """Does this machine's batched matmul give a row the same bits whatever the number of rows and
    chunks, for both products of the kernel at head size `dim`? Probed once per size (~10 ms) over
    the row counts a forward uses."""
    if dim not in _INVARIANT:
        gen = torch.Generator().manual_seed(0)
        keys = torch.randn(2, 3 * CHUNK, dim, generator=gen)  # [Hkv, S, D]
        q = torch.randn(2, MAX_ROWS, dim, generator=gen)  # [Hkv, rows, D]
        probs = torch.rand(3, MAX_ROWS, CHUNK, generator=gen)  # [chunks, rows, CHUNK]
        scores = torch.bmm(q[:, :1], keys.transpose(1, 2))  # [Hkv, 1, S]
        mixed = torch.bmm(probs[:2, :1], keys[0].view(3, CHUNK, dim)[:2])  # [2, 1, D]
        same = True
        for rows in range(2, MAX_ROWS + 1):
            same = same and torch.equal(torch.bmm(q[:, :rows], keys.transpose(1, 2))[:, :1], scores)
            same = same and torch.equal(torch.bmm(probs[:, :rows], keys[0].view(3, CHUNK, dim))[:2, :1], mixed)
            if not same:
                break
        _INVARIANT[dim] = same
    return _INVARIANT[dim]


def exact_gqa_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, total: int,
                        hidden: torch.Tensor | None = None, rowwise: bool | None = None) -> torch.Tensor:
    """q [Hq, T, D] (the last T of `total` positions), keys/values [Hkv, >= padded_length(total), D]
    (buffers whose first `total` positions are held; the rest finite, never seen)
    -> [Hq, T, D]. hidden: hidden_tail(T, total, Hq // Hkv), built once per forward. rowwise:
    force one path (None: the batched one where this machine's products are row-invariant)."""
    n_heads, new, dim = q.shape
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    padded = padded_length(total)
    n_chunks = padded // CHUNK
    if keys.shape[1] < padded:
        raise ValueError(f"exact attention needs {padded} buffer positions, the cache holds {keys.shape[1]}")
    rows = group * new
    if rowwise is None:
        rowwise = not rows_are_invariant(dim)
    q_rows = q.reshape(n_kv, rows, dim) * dim ** -0.5  # [Hkv, G*T, D]; row g*T + t
    if rowwise:
        scores = torch.empty(n_kv, rows, 1, padded, dtype=q_rows.dtype)
        for h in range(n_kv):  # a batch of one-row products over the same keys (a stride-0 view: no copy)
            keys_t = keys[h, :padded].expand(rows, padded, dim).transpose(1, 2)  # [G*T, D, S_pad]
            torch.bmm(q_rows[h].unsqueeze(1), keys_t, out=scores[h])
        scores = scores.view(n_kv, rows, padded)
    else:
        scores = torch.bmm(q_rows, keys[:, :padded].transpose(1, 2))  # [Hkv, G*T, S_pad]
    if new == 1:
        scores[:, :, total:].fill_(float("-inf"))
    else:
        if hidden is None:
            hidden = hidden_tail(new, total, group)
        scores[:, :, total - new + 1:].masked_fill_(hidden, float("-inf"))
    # the row's length is a whole number of chunks and what follows its own keys is -inf: the
    # softmax's lane-wise max and sum only ever add exact zeros for them (hidden keys -> p = 0)
    probs = torch.softmax(scores, dim=-1).view(n_kv, rows, n_chunks, CHUNK)
    if rowwise:
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
