"""Deliberately broken sharded attention: the mistakes of ring and head-parallel code, one each.

:func:`make_port` returns a port with ``ring_attention``, ``head_parallel_attention`` and
``head_parallel_gqa`` (the signatures of ``impl_numpy/sharded.py``) with one bug switched on.
A bug that is one step of the ring (the merge by lse, the decision to skip a block:
:data:`RING_STEP_BUGS`) is the real ``ring_attention`` in a copy of ``impl_numpy.sharded`` with
that step replaced; the others run a compressed copy of the NumPy simulation. With no bug it
passes every sharded run of the conformance runner (a test asserts that), so a run it fails is
failed because of the bug. The block computation is the real one
(``impl_numpy.sharded._attend_block``): the bugs are in what is sharded around it, but for one,
which switches off the block's zeroing of key and value rows no row of the block attends.

conformance/tests/test_broken_ports.py proves that the runner's sharded runs catch every one of
them (:data:`BUGS` names one run each must fail).
"""

from __future__ import annotations

import importlib.util
from contextlib import nullcontext
from dataclasses import replace
from types import ModuleType, SimpleNamespace
from unittest import mock

import numpy as np

import impl_numpy
from attention_spec import causal_offset, check_attention
from attention_spec.rules import alibi, block_rules
from attention_spec.sharded import (
    block_computed,
    check_ring,
    check_shard_config,
    check_ulysses,
)
from impl_numpy import functional, sharded, ulysses
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
    "window_skip_first_row": (
        "a block is skipped when the window band of the query chunk's first row misses it: "
        "the chunk's later rows lose keys of the next key chunk",
        "ring.n4.window.both.bottom_right.l32_s48.float64",
    ),
    "segments_of_query_chunk": (
        "a block reads the key segment ids at its query chunk's places, not its key chunk's",
        "ring.n4.segments.packed.causal.l32_s32.float64",
    ),
    "sink_every_block": (
        "the sink joins every block's softmax, so it is counted once per computed block",
        "ring.n2.sinks.padding.l32_s32.float64",
    ),
    "sink_dropped": (
        "the ring forgets the sink (a row's weights sum to 1)",
        "ring.n2.sinks.padding.l32_s32.float64",
    ),
    "alibi_shard_positions": (
        "ALiBi's distance |i + offset - j| counted from the block's first row and key, not in "
        "the whole sequence",
        "ring.n2.alibi.causal.bottom_right.l32_s48.float64",
    ),
    "head_parallel_sinks_whole": (
        "every device takes the first H/n sinks (and slopes), not those of its query heads",
        "head_parallel.n2.sinks.basic.float32",
    ),
    "head_parallel_segments_split": (
        "segment ids split across the devices along their first axis, like the per-head sinks: "
        "device r gives every batch row the ids of batch row r",
        "head_parallel.n2.segments.two_docs.float64",
    ),
    "head_parallel_gqa_settings_dropped": (
        "the head-parallel module attends with the functional defaults: its window, sinks, "
        "ALiBi, softcap and scale never reach the devices",
        "head_parallel_gqa.n2.v2.window.causal.gqa.float32",
    ),
    "head_parallel_gqa_sinks_whole": (
        "every device takes the module's first H/n sinks (and slopes), not its query heads'",
        "head_parallel_gqa.n2.v2.sinks.gqa.padding.float32",
    ),
    # all-to-all sequence parallelism (Ulysses, USP; contract v3)
    "ulysses_kv_heads_from_queries": (
        "the key/value split reads the head count from the queries: device d takes key/value "
        "heads d*H/n .. (mod K), as if K were H, tearing the GQA groups apart (DeepSpeed PR 8316)",
        "ulysses.n4.ulysses.gqa.h8_k2.head_mask.sinks.alibi.l32_s48.float64",
    ),
    "ulysses_kv_heads_uneven": (
        "key/value heads cut into chunks of ceil(K/n): at K = 1, n = 4 that is [1, 0, 0, 0], "
        "and devices 1 to 3 have no key/value head (DeepSpeed's [4, 4, 4, 0])",
        "ulysses.n4.ulysses.gqa.h8_k1.causal.l32_s32.float64",
    ),
    "ulysses_padded_separately": (
        "query heads and key/value heads padded to a multiple of n separately: K < n gets zero "
        "heads up to n, and device d reads padded head d, not its group's (vllm-omni PR 5716)",
        "ulysses.n4.ulysses.gqa.h8_k2.head_mask.sinks.alibi.l32_s48.float64",
    ),
    "ulysses_output_order": (
        "the second all-to-all joins the heads it receives in reverse source order: the "
        "inverse of the first exchange's permutation is wrong",
        "ulysses.n2.causal.top_left.l64_s64.float64",
    ),
    "ulysses_sinks_first": (
        "every device takes the first H/n sinks and slopes, not those of its query heads",
        "ulysses.n2.sinks.padding.l32_s32.float64",
    ),
    "ulysses_causal_offset_local": (
        "the causal diagonal (and the window's and ALiBi's) taken from the device's own shard, "
        "causal_offset(L/n, S/n), not from the whole sequence it holds after the all-to-all: "
        "bottom-right with L != S loses or gains keys",
        "ulysses.n4.causal.bottom_right.l64_s96.float64",
    ),
    "usp_ring_inside_group": (
        "USP's ring runs among the members of one Ulysses group (who hold different heads of "
        "the same positions), not across the groups",
        "usp.n4.causal.top_left.l64_s64.float64",
    ),
}

#: The Ulysses bugs (of :func:`_ulysses`).
ULYSSES_BUGS = tuple(b for b in BUGS if b.startswith("ulysses_"))


def _local_offset(Lc: int, Sc: int):
    """The bug ``ulysses_causal_offset_local``: the device's attention validates to a call whose
    diagonal is its own shard's, ``causal_offset(Lc, Sc)``, instead of the sequence's."""

    def check(*args, **kw):
        call = check_attention(*args, **kw)
        return replace(call, offset=causal_offset(Lc, Sc, call.causal_alignment), bands=True)

    return mock.patch.object(functional, "check_attention", check)


def _ulysses(query, key, value, *, n_shards, mask=None, bias=None, sinks=None,
             alibi_slopes=None, bug=None, **kw):
    """``impl_numpy.ulysses.ulysses_attention``, compressed (device d's heads, every position:
    what the first all-to-all gives it), with the one ``bug`` switched in."""
    query, key, value = np.asarray(query), np.asarray(key), np.asarray(value)
    check_shard_config(n_shards)
    keywords = dict(mask=mask, bias=bias, sinks=sinks, alibi_slopes=alibi_slopes, **kw)
    plan = check_ulysses(check_attention(query, key, value, **keywords), n_shards)
    n, H, K = n_shards, query.shape[-3], key.shape[-3]
    Hn = H // n
    if bug == "ulysses_padded_separately" and K < n:  # zero heads up to n: head d on device d
        pads = [np.zeros((*x.shape[:-3], n - K, *x.shape[-2:]), x.dtype) for x in (key, value)]
        key, value = np.concatenate([key, pads[0]], -3), np.concatenate([value, pads[1]], -3)
    outs = []
    for d in range(n):
        lo, hi = plan.heads[d]
        kv = list(range(*plan.kv_heads[d]))
        if bug == "ulysses_kv_heads_from_queries":
            kv = sorted({h % K for h in range(d * Hn, (d + 1) * Hn)})
        elif bug == "ulysses_kv_heads_uneven":
            c = -(-K // n)
            kv = list(range(d * c, min((d + 1) * c, K)))
        elif bug == "ulysses_padded_separately":
            kv = [d] if K < n else kv
        first = (0, Hn) if bug == "ulysses_sinks_first" else (lo, hi)
        on_heads = {
            **kw,
            "mask": _block(mask, -3, lo, hi),
            "bias": _block(bias, -3, lo, hi),
            "sinks": _block(None if sinks is None else np.asarray(sinks), -1, *first),
            "alibi_slopes": _block(None if alibi_slopes is None else np.asarray(alibi_slopes),
                                   -1, *first),
        }
        q = query[..., lo:hi, :, :]
        local = bug == "ulysses_causal_offset_local"
        with _local_offset(plan.Lc, plan.Sc) if local else nullcontext():
            outs.append(scaled_dot_product_attention(q, key[..., kv, :, :], value[..., kv, :, :],
                                                     **on_heads))
    if bug == "ulysses_output_order":
        outs = outs[::-1]
    return np.concatenate(outs, axis=-3)


def _usp_ring_inside_group() -> ModuleType:
    """A fresh copy of ``impl_numpy.ulysses`` whose USP ring of member j is the devices of
    ring group j, (j, 0) .. (j, u - 1), instead of (0, j) .. (r - 1, j) (u == r here)."""
    spec = importlib.util.find_spec("impl_numpy.ulysses")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._ring_of = lambda plan, j: [(j, m) for m in range(plan.u)]
    return module


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


def _computed(dims, offset, q_chunk, k_chunk, Lc, Sc, q_ids, kv_ids, bug):
    """``attention_spec.sharded.block_computed``, or the window band of the first row only."""
    if bug == "window_skip_first_row" and dims.window is not None:
        i0, j0 = q_chunk * Lc, k_chunk * Sc
        some, _ = block_rules(dims.is_causal, dims.window, offset, i0, i0 + 1, j0, j0 + Sc,
                              q_ids, kv_ids)
        return bool(some)
    return block_computed(dims, offset, q_chunk, k_chunk, Lc, Sc, q_ids, kv_ids)


def _local_alibi(slopes, i, j, offset):
    """The bug ``alibi_shard_positions``: distances from the block's first row and key."""
    return alibi(slopes, i - i.min(), j - j.min(), offset)


def _ring(
    query, key, value, *, n_shards, layout="contiguous", mask=None, bias=None, is_causal=False,
    causal_alignment="top_left", scale=None, softcap=None, window=None, q_segment_ids=None,
    kv_segment_ids=None, sinks=None, alibi_slopes=None, bug=None,
):
    """``impl_numpy.sharded.ring_attention``, compressed, with the one ``bug`` switched in."""
    query, key, value = np.asarray(query), np.asarray(key), np.asarray(value)
    q_ids, kv_ids = q_segment_ids, kv_segment_ids
    check_shard_config(n_shards, layout)
    dims = check_attention(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_ids, kv_segment_ids=kv_ids, sinks=sinks, alibi_slopes=alibi_slopes,
    )
    ring = check_ring(dims, n_shards, layout)
    ct = _compute_dtype(query.dtype)
    n, chunks, Lc, Sc = ring.n, ring.chunks, ring.Lc, ring.Sc
    H, K, G, L, D, E = dims.H, dims.K, dims.G, dims.L, dims.D, dims.E
    if L == 0 or dims.S == 0:
        return np.zeros((*dims.batch, H, L, E), query.dtype)
    offset = causal_offset(L, dims.S, causal_alignment)
    q = query.astype(ct).reshape(*query.shape[:-3], K, G, L, D)
    bias, sinks, slopes = _cast(bias, ct), _cast(sinks, ct), _cast(alibi_slopes, ct)
    if bug == "sink_dropped":
        sinks = None
    packed = [c[::-1] if bug == "zigzag_chunks_swapped" else c for c in chunks]
    held = [
        (np.concatenate([key[..., b * Sc : (b + 1) * Sc, :] for b in packed[r]], axis=-2),
         np.concatenate([value[..., b * Sc : (b + 1) * Sc, :] for b in packed[r]], axis=-2))
        for r in range(n)
    ]
    outs = [[np.zeros((*dims.batch, H, Lc, E), ct) for _ in chunks[r]] for r in range(n)]
    lses = [[np.full((*dims.batch, H, Lc), -np.inf, ct) for _ in chunks[r]] for r in range(n)]
    steps = range(1, n) if bug == "skips_own_shard" else range(n)
    keep_garbage = mock.patch.object(sharded, "_unattended_zeroed", lambda x, attended: x)
    patches = {
        "garbage_not_zeroed": keep_garbage,
        "alibi_shard_positions": mock.patch.object(sharded, "alibi", _local_alibi),
    }
    patch = patches.get(bug, nullcontext())
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
                q_ids_rows = _block(q_ids, -1, *rows)
                for b, k_chunk in enumerate(chunks[src]):
                    cols = (k_chunk * Sc, (k_chunk + 1) * Sc)
                    kv_ids_blk = _block(kv_ids, -1, *cols)
                    if bug == "segments_of_query_chunk":
                        kv_ids_blk = _block(kv_ids, -1, *rows)
                    if not _computed(dims, offset, q_chunk, k_chunk, Lc, Sc, q_ids_rows,
                                     kv_ids_blk, bug):
                        continue
                    with patch:
                        out_blk, lse_blk = sharded._attend_block(
                            q[..., rows[0] : rows[1], :],
                            k_shard[..., b * Sc : (b + 1) * Sc, :].astype(ct)[..., :, None, :, :],
                            v_shard[..., b * Sc : (b + 1) * Sc, :].astype(ct)[..., :, None, :, :],
                            q_pos, k_chunk * Sc + np.arange(Sc),
                            _block(_block(mask, -2, *rows), -1, *cols),
                            _block(_block(bias, -2, *rows), -1, *cols), q_ids_rows, kv_ids_blk,
                            dims=dims, offset=offset, slopes=slopes,
                        )
                    if bug == "sink_every_block" and sinks is not None:
                        sink = np.broadcast_to(sinks[:, None], lse_blk.shape)
                        out_blk, lse_blk = sharded._merge(out_blk, lse_blk, 0.0, sink)
                    outs[r][a], lses[r][a] = _merge(outs[r][a], lses[r][a], out_blk, lse_blk, bug)
        if bug != "skips_own_shard" and t < n - 1:
            held = [held[(r - 1) % n] for r in range(n)]
    out = np.empty((*dims.batch, H, L, E), ct)
    for r in range(n):
        for a, q_chunk in enumerate(chunks[r]):
            if sinks is not None and bug != "sink_every_block":
                sink = np.broadcast_to(sinks[:, None], lses[r][a].shape)
                outs[r][a], _ = sharded._merge(outs[r][a], lses[r][a], 0.0, sink)
            out[..., q_chunk * Lc : (q_chunk + 1) * Lc, :] = outs[r][a]
    return out.astype(query.dtype)


def _head_parallel(
    query, key, value, *, n_shards, mask=None, bias=None, sinks=None, alibi_slopes=None, bug=None,
    **kw,
):
    """``impl_numpy.sharded.head_parallel_attention``, or with tiled head groups, or with every
    device's sinks and slopes the first H/n, or with the segment ids split like the heads."""
    per_head = {"sinks": sinks, "alibi_slopes": alibi_slopes}
    if bug not in ("head_parallel_tiling", "head_parallel_sinks_whole",
                   "head_parallel_segments_split"):
        return sharded.head_parallel_attention(
            query, key, value, n_shards=n_shards, mask=mask, bias=bias, **per_head, **kw
        )
    query, key, value = np.asarray(query), np.asarray(key), np.asarray(value)
    H, K = query.shape[-3], key.shape[-3]
    Hn, Kn = H // n_shards, K // n_shards
    outs = []
    for r in range(n_shards):
        kv = list(range(r * Kn, (r + 1) * Kn))
        heads = list(range(r * Hn, (r + 1) * Hn))
        if bug == "head_parallel_tiling":
            heads = [h for h in range(H) if h % K in kv]  # tiling: h reads kv head h % K
        picked = [_block(x, -3, 0, H)[..., heads, :, :] if x is not None and x.ndim >= 3
                  and x.shape[-3] == H else x for x in (mask, bias)]
        first = heads if bug == "head_parallel_tiling" else list(range(Hn))
        vectors = {k: None if x is None else np.asarray(x)[first] for k, x in per_head.items()}
        ids = {k: v for k, v in kw.items() if k.endswith("segment_ids") and v is not None}
        if bug == "head_parallel_segments_split":  # (B, L) -> device r's (B/n, L) slice
            ids = {k: np.array_split(np.asarray(v), n_shards)[r] for k, v in ids.items()}
        outs.append(scaled_dot_product_attention(
            query[..., heads, :, :], key[..., kv, :, :], value[..., kv, :, :],
            mask=picked[0], bias=picked[1], **vectors, **{**kw, **ids},
        ))
    return np.concatenate(outs, axis=-3)


def _head_parallel_gqa(module, x, context=None, *, n_shards, bug=None, **kw):
    """``impl_numpy.sharded.head_parallel_gqa``, or with the module's settings (window, softcap,
    scale, sinks, slopes) dropped, or with every device given the module's first H/n sinks and
    slopes (tiled n times, which the real code then splits by heads)."""
    if bug not in ("head_parallel_gqa_settings_dropped", "head_parallel_gqa_sinks_whole"):
        return sharded.head_parallel_gqa(module, x, context, n_shards=n_shards, **kw)
    settings = module._option_keywords()
    if bug == "head_parallel_gqa_settings_dropped":
        settings = dict.fromkeys(settings)  # every setting None: the functional defaults
    else:
        Hn = module.dims.H // n_shards
        for name in ("sinks", "alibi_slopes"):
            if settings[name] is not None:
                # (H,): device r reads [:Hn]
                settings[name] = np.tile(settings[name][:Hn], n_shards)
    with mock.patch.object(module, "_option_keywords", lambda: dict(settings)):
        return sharded.head_parallel_gqa(module, x, context, n_shards=n_shards, **kw)


#: The ring bugs that replace one step of ``impl_numpy.sharded`` (R5's ``_merge``, or
#: ``block_computed``), in a copy of the module: the real ring runs around the broken step.
RING_STEP_BUGS = ("merge_without_lse", "merge_unstable", "merge_unguarded", "window_skip_first_row")


def _ring_with_broken_step(bug: str) -> ModuleType:
    """A fresh copy of ``impl_numpy.sharded`` (not the one in ``sys.modules``) whose merge or
    block-skip decision is :func:`_merge`'s or :func:`_computed`'s with ``bug``."""
    spec = importlib.util.find_spec("impl_numpy.sharded")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if bug.startswith("merge_"):
        module._merge = lambda out, lse, out_blk, lse_blk: _merge(out, lse, out_blk, lse_blk, bug)
    else:
        module.block_computed = lambda *args: _computed(*args, bug)
    return module


def make_port(bug: str | None) -> SimpleNamespace:
    """The sharded functions with ``bug`` (a key of :data:`BUGS`, or None for none), as a port
    the conformance runner takes (``functions=SHARDED_ALIASES``)."""

    def ring_attention(query, key, value, *, n_shards, **kw):
        if bug in RING_STEP_BUGS:
            return stepped.ring_attention(query, key, value, n_shards=n_shards, **kw)
        return _ring(query, key, value, n_shards=n_shards, bug=bug, **kw)

    stepped = _ring_with_broken_step(bug) if bug in RING_STEP_BUGS else None

    def head_parallel_attention(query, key, value, *, n_shards, **kw):
        return _head_parallel(query, key, value, n_shards=n_shards, bug=bug, **kw)

    def head_parallel_gqa(module, x, context=None, *, n_shards, **kw):
        return _head_parallel_gqa(module, x, context, n_shards=n_shards, bug=bug, **kw)

    def ulysses_attention(query, key, value, *, n_shards, **kw):
        if bug in ULYSSES_BUGS:
            return _ulysses(query, key, value, n_shards=n_shards, bug=bug, **kw)
        return ulysses.ulysses_attention(query, key, value, n_shards=n_shards, **kw)

    usp = _usp_ring_inside_group() if bug == "usp_ring_inside_group" else ulysses

    def usp_attention(query, key, value, **kw):
        return usp.usp_attention(query, key, value, **kw)

    return SimpleNamespace(
        __name__=f"sharded_broken.{bug}",
        GroupedQueryAttention=impl_numpy.GroupedQueryAttention,  # for head_parallel_gqa
        MultiHeadAttention=impl_numpy.MultiHeadAttention,
        ring_attention=ring_attention,
        head_parallel_attention=head_parallel_attention,
        head_parallel_gqa=head_parallel_gqa,
        ulysses_attention=ulysses_attention,
        usp_attention=usp_attention,
    )
