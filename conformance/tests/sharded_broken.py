"""Deliberately broken sharded attention: the mistakes of ring and head-parallel code, one each.

:func:`make_port` returns a port with ``ring_attention``, ``head_parallel_attention`` and
``head_parallel_gqa`` (the signatures of ``impl_numpy/sharded.py``): a compressed copy of the
NumPy simulation with one bug switched on. With no bug it passes every sharded run of the
conformance runner (a test asserts that), so a run it fails is failed because of the bug. The
block computation is the real one (``impl_numpy.sharded._attend_block``): the bugs are in what
is sharded around it, but for one, which switches off the block's zeroing of key and value rows
no row of the block attends.

conformance/tests/test_broken_ports.py proves that the runner's sharded runs catch every one of
them (:data:`BUGS` names one run each must fail).
"""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace
from unittest import mock

import numpy as np

import impl_numpy
from attention_spec import causal_offset, check_attention
from attention_spec.sharded import block_visible, check_ring, check_shard_config
from impl_numpy import sharded
from impl_numpy.flash import _block
from impl_numpy.functional import _cast, _compute_dtype, scaled_dot_product_attention

__all__ = ["BUGS", "make_port"]

#: bug -> (what it does, a run id that must fail because of it)
BUGS: dict[str, tuple[str, str]] = {
    "merge_without_lse": (
        "partial outputs added as they are, not reweighted by exp(lse_part - lse)",
        "ring.n2.causal.top_left.l64_s64.float64",
    ),
    "skips_own_shard": (
        "the ring rotates before its first block and runs n - 1 steps: no device ever "
        "attends its own key/value shard",
        "ring.n4.full.gqa.h6_k3.l96_s96.float64",
    ),
    "zigzag_chunks_swapped": (
        "a zigzag key/value shard is packed (chunk 2n-1-r, chunk r) but read as (r, 2n-1-r): "
        "its two chunks take each other's positions",
        "ring_zigzag.n2.causal.top_left.l64_s64.float64",
    ),
    "causal_skip_by_shard": (
        "causal skips every step whose key shard comes after the query shard (src > r), "
        "right only for contiguous shards of L = S",
        "ring.n2.causal.bottom_right.l64_s96.float64",
    ),
    "head_parallel_tiling": (
        "device r takes the query heads h with h % K among its key/value heads (tiling), "
        "not the contiguous block r*H/n ..",
        "head_parallel.n2.gqa.h6_k2.float32",
    ),
    "merge_unstable": (
        "merge by exp(lse) itself, without subtracting the larger lse: exp(200) overflows",
        "ring.n2.large_logits.shifted.l64_s64.float32",
    ),
    "merge_unguarded": (
        "merge with no guard for rows that have seen nothing: exp(-inf - -inf) is NaN",
        "ring.n4.causal.bottom_right.l96_s64.float64",
    ),
    "garbage_not_zeroed": (
        "a block multiplies the zero weights of keys no row of it attends by their values: "
        "NaN held there (padding) leaks, 0 * NaN = NaN",
        "ring.n2.garbage.padding.l32_s64.float32",
    ),
}


def _merge(out, lse, out_blk, lse_blk, bug):
    """``impl_numpy.sharded._merge``, or its broken variant."""
    if bug == "merge_without_lse":
        return out + out_blk, np.logaddexp(lse, lse_blk)
    if bug == "merge_unstable":
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            a, b = np.exp(lse), np.exp(lse_blk)  # exp(200) is inf in float32
            total = a + b
            return (a / total)[..., None] * out + (b / total)[..., None] * out_blk, np.log(total)
    if bug == "merge_unguarded":
        with np.errstate(invalid="ignore"):
            new = np.logaddexp(lse, lse_blk)
            share, share_blk = np.exp(lse - new)[..., None], np.exp(lse_blk - new)[..., None]
            return share * out + share_blk * out_blk, new
    return sharded._merge(out, lse, out_blk, lse_blk)


def _ring(
    query, key, value, *, n_shards, layout="contiguous", mask=None, bias=None, is_causal=False,
    causal_alignment="top_left", scale=None, softcap=None, bug=None,
):  # fmt: skip
    """``impl_numpy.sharded.ring_attention``, compressed, with the one ``bug`` switched in."""
    query, key, value = np.asarray(query), np.asarray(key), np.asarray(value)
    check_shard_config(n_shards, layout)
    dims = check_attention(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap,
    )  # fmt: skip
    ring = check_ring(dims, n_shards, layout)
    ct = _compute_dtype(query.dtype)
    n, chunks, Lc, Sc = ring.n, ring.chunks, ring.Lc, ring.Sc
    H, K, G, L, D, E = dims.H, dims.K, dims.G, dims.L, dims.D, dims.E
    if L == 0 or dims.S == 0:
        return np.zeros((*dims.batch, H, L, E), query.dtype)
    offset = causal_offset(L, dims.S, causal_alignment)
    q = query.astype(ct).reshape(*query.shape[:-3], K, G, L, D)
    bias = None if bias is None else _cast(bias, ct)
    packed = [c[::-1] if bug == "zigzag_chunks_swapped" else c for c in chunks]
    held = [
        (np.concatenate([key[..., b * Sc : (b + 1) * Sc, :] for b in packed[r]], axis=-2),
         np.concatenate([value[..., b * Sc : (b + 1) * Sc, :] for b in packed[r]], axis=-2))
        for r in range(n)
    ]  # fmt: skip
    outs = [[np.zeros((*dims.batch, H, Lc, E), ct) for _ in chunks[r]] for r in range(n)]
    lses = [[np.full((*dims.batch, H, Lc), -np.inf, ct) for _ in chunks[r]] for r in range(n)]
    steps = range(1, n) if bug == "skips_own_shard" else range(n)
    keep_garbage = mock.patch.object(sharded, "_unattended_zeroed", lambda x, attended: x)
    for t in steps:
        if bug == "skips_own_shard":  # rotated before computing
            held = [held[(r - 1) % n] for r in range(n)]
        for r in range(n):
            src = (r - t) % n
            if dims.is_causal and bug == "causal_skip_by_shard" and src > r:
                continue
            k_shard, v_shard = held[r]
            for a, q_chunk in enumerate(chunks[r]):
                q_pos = q_chunk * Lc + np.arange(Lc)
                rows = (q_chunk * Lc, (q_chunk + 1) * Lc)
                for b, k_chunk in enumerate(chunks[src]):
                    if dims.is_causal and not block_visible(q_chunk, k_chunk, Lc, Sc, offset):
                        continue
                    cols = (k_chunk * Sc, (k_chunk + 1) * Sc)
                    with keep_garbage if bug == "garbage_not_zeroed" else nullcontext():
                        out_blk, lse_blk = sharded._attend_block(
                            q[..., rows[0] : rows[1], :],
                            k_shard[..., b * Sc : (b + 1) * Sc, :].astype(ct)[..., :, None, :, :],
                            v_shard[..., b * Sc : (b + 1) * Sc, :].astype(ct)[..., :, None, :, :],
                            q_pos, k_chunk * Sc + np.arange(Sc),
                            _block(_block(mask, -2, *rows), -1, *cols),
                            _block(_block(bias, -2, *rows), -1, *cols), dims=dims, offset=offset,
                        )  # fmt: skip
                    outs[r][a], lses[r][a] = _merge(outs[r][a], lses[r][a], out_blk, lse_blk, bug)
        if bug != "skips_own_shard" and t < n - 1:
            held = [held[(r - 1) % n] for r in range(n)]
    out = np.empty((*dims.batch, H, L, E), ct)
    for r in range(n):
        for a, q_chunk in enumerate(chunks[r]):
            out[..., q_chunk * Lc : (q_chunk + 1) * Lc, :] = outs[r][a]
    return out.astype(query.dtype)


def _head_parallel(query, key, value, *, n_shards, mask=None, bias=None, bug=None, **kw):
    """``impl_numpy.sharded.head_parallel_attention``, or with tiled head groups."""
    if bug != "head_parallel_tiling":
        return sharded.head_parallel_attention(
            query, key, value, n_shards=n_shards, mask=mask, bias=bias, **kw
        )
    H, K = query.shape[-3], key.shape[-3]
    Kn = K // n_shards
    outs = []
    for r in range(n_shards):
        kv = list(range(r * Kn, (r + 1) * Kn))
        heads = [h for h in range(H) if h % K in kv]  # tiling: h reads kv head h % K
        picked = [_block(x, -3, 0, H)[..., heads, :, :] if x is not None and x.ndim >= 3
                  and x.shape[-3] == H else x for x in (mask, bias)]  # fmt: skip
        outs.append(scaled_dot_product_attention(
            query[..., heads, :, :], key[..., kv, :, :], value[..., kv, :, :],
            mask=picked[0], bias=picked[1], **kw,
        ))  # fmt: skip
    return np.concatenate(outs, axis=-3)


def make_port(bug: str | None) -> SimpleNamespace:
    """The sharded functions with ``bug`` (a key of :data:`BUGS`, or None for none), as a port
    the conformance runner takes (``functions=SHARDED_ALIASES``)."""

    def ring_attention(query, key, value, *, n_shards, **kw):
        return _ring(query, key, value, n_shards=n_shards, bug=bug, **kw)

    def head_parallel_attention(query, key, value, *, n_shards, **kw):
        return _head_parallel(query, key, value, n_shards=n_shards, bug=bug, **kw)

    return SimpleNamespace(
        __name__=f"sharded_broken.{bug}",
        GroupedQueryAttention=impl_numpy.GroupedQueryAttention,  # for head_parallel_gqa
        MultiHeadAttention=impl_numpy.MultiHeadAttention,
        ring_attention=ring_attention,
        head_parallel_attention=head_parallel_attention,
        head_parallel_gqa=sharded.head_parallel_gqa,
    )
