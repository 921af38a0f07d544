"""Deliberately broken backward passes: the bugs seen in real attention backward code, one per port.

:func:`broken_vjp` has the signature of ``impl_numpy.functional.scaled_dot_product_attention_vjp``
(and, with ``block_q``/``block_k``, of ``flash_attention_vjp``) and validates like it. It makes
the forward densely in float64 (the scores, the row log-sum-exp ``lse``, the output), then runs
FlashAttention-2's backward block by block (one block when no block sizes are given), and is
right except for its one ``bug``:

- ``kv_not_summed``: dK and dV of key/value head n are those of query head n * G alone, not
  summed over the group's G query heads.
- ``kv_summed_tiling``: dK and dV summed over the query heads h with h % K == n (tiling), not
  over the contiguous group h // G == n.
- ``softcap_factor_missing``: the backward of the softcap, ``1 - tanh^2(s / softcap)``, is left
  out.
- ``delta_missing``: ``dS = P * dP`` without the ``- rowsum(dO * O)`` term of the softmax.
- ``nan_fully_masked``: ``P = exp(S - lse)`` unguarded: a row with no allowed key has
  ``lse = -inf`` and gives NaN, which the key and value gradients then sum.
- ``dbias_not_reduced``: dbias is dS at the full ``(..., H, L, S)``, not summed to the bias's
  broadcast shape.
- ``scale_twice``: dQ multiplied by the scale twice.
- ``lse_offset``: the block's weights are rebuilt with the lse of rows starting at the key
  block's first index, not the query block's (right with one block, wrong when tiled).
- ``skip_diagonal_block``: under causal masking, the key blocks the diagonal crosses are
  skipped along with those above it.

The unbroken version (``bug="none"``) passes every ``grad`` and ``flash_grad`` run;
``test_broken_ports.py`` proves that the suite catches each bug.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial

import numpy as np

from attention_spec import (
    AttentionGrads,
    causal_offset,
    check_attention,
    check_block_sizes,
    check_grad_output,
    rules,
)

__all__ = ["GRAD_BUGS", "broken_vjp"]

#: The bugs of :func:`broken_vjp`; those after ``scale_twice`` need more than one block.
GRAD_BUGS: tuple[str, ...] = (
    "kv_not_summed",
    "kv_summed_tiling",
    "softcap_factor_missing",
    "delta_missing",
    "nan_fully_masked",
    "dbias_not_reduced",
    "scale_twice",
    "lse_offset",
    "skip_diagonal_block",
)


def _sum_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``x`` summed over the axes it was broadcast along to come from ``shape``."""
    x = x.sum(axis=tuple(range(x.ndim - len(shape)))) if x.ndim > len(shape) else x
    axes = tuple(a for a, n in enumerate(shape) if n == 1 and x.shape[a] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def broken_vjp(
    query,
    key,
    value,
    grad_output,
    *,
    mask=None,
    bias=None,
    is_causal=False,
    causal_alignment="top_left",
    scale=None,
    softcap=None,
    window=None,
    q_segment_ids=None,
    kv_segment_ids=None,
    sinks=None,
    alibi_slopes=None,
    block_q=None,
    block_k=None,
    bug: str,
) -> AttentionGrads:
    """The backward of SEMANTICS.md's attention, with the one ``bug`` switched in."""
    query, key, value = np.asarray(query), np.asarray(key), np.asarray(value)
    mask = None if mask is None else np.asarray(mask)
    bias = None if bias is None else np.asarray(bias)
    arrays = {"q_segment_ids": q_segment_ids, "kv_segment_ids": kv_segment_ids, "sinks": sinks,
          "alibi_slopes": alibi_slopes}
    arrays = {name: None if x is None else np.asarray(x) for name, x in arrays.items()}
    dims = check_attention(
        query, key, value, mask=mask, bias=bias, causal_alignment=causal_alignment, scale=scale,
        is_causal=is_causal, softcap=softcap, window=window, **arrays,
    )
    if block_q is not None or block_k is not None:
        check_block_sizes(block_q, block_k)
    check_grad_output(dims, np.asarray(grad_output) if grad_output is not None else None)
    H, K, G, L, S = dims.H, dims.K, dims.G, dims.L, dims.S
    bq, bk = block_q or max(L, 1), block_k or max(S, 1)
    offset = causal_offset(L, S, causal_alignment)
    f64 = np.float64

    # The forward, densely: rule (..., H|1, L, S), scores s (..., H, L, S), lse, output.
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    rule = np.ones((L, S), bool) if mask is None else mask
    if dims.is_causal:
        rule = rule & rules.causal(i, j, offset)
    if dims.window is not None:
        rule = rule & rules.window(i, j, offset, dims.window)
    if arrays["q_segment_ids"] is not None:
        rule = rule & rules.segments(arrays["q_segment_ids"], arrays["kv_segment_ids"])
    add = None if bias is None else bias.astype(f64)
    if arrays["alibi_slopes"] is not None:
        slopes = arrays["alibi_slopes"].astype(f64)[:, None, None]  # (H, 1, 1)
        add = rules.alibi(slopes, i, j, offset) + (0.0 if add is None else add)
    allowed = np.broadcast_to(rule if bias is None else rule & (bias != -np.inf),
                              (*dims.batch, H, L, S))
    seen = allowed.reshape(*dims.batch, K, G, L, S).any(axis=(-3, -2))[..., None]  # (..., K,S,1)
    k = np.where(seen, key.astype(f64), 0.0)  # (..., K, S, D): unattended rows zeroed
    v = np.where(seen, value.astype(f64), 0.0)  # (..., K, S, E)
    heads = np.arange(H) // G
    kh, vh = np.take(k, heads, axis=-3), np.take(v, heads, axis=-3)  # (..., H, S, D|E)
    q = query.astype(f64)
    s = q @ np.swapaxes(kh, -1, -2) * dims.scale  # (..., H, L, S)
    tanh = None
    if softcap is not None:
        tanh = np.tanh(s / softcap)
        s = softcap * tanh
    if add is not None:
        s = s + add
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)
    sinks = arrays["sinks"]
    sink = None if sinks is None else sinks.astype(f64)[:, None, None]  # (H, 1, 1)
    if sink is not None:
        m = np.maximum(m, sink)
    m = np.where(m == -np.inf, 0.0, m)
    z = np.exp(s - m).sum(axis=-1, keepdims=True)
    empty = z == 0.0  # (..., H, L, 1): rows with no allowed key
    if sink is not None:
        z = z + np.exp(sink - m)
    lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, z)))  # (..., H, L, 1)
    p_full = np.exp(s - np.where(empty, 0.0, lse))  # (..., H, L, S), 0 where not allowed
    out = p_full @ vh  # (..., H, L, E)

    # The backward, block by block (FlashAttention-2).
    do = np.asarray(grad_output).astype(f64)
    delta = (do * out).sum(axis=-1, keepdims=True)  # (..., H, L, 1)
    if bug == "delta_missing":
        delta = np.zeros_like(delta)
    dq = np.zeros((*dims.batch, H, L, dims.D))
    dkh = np.zeros((*dims.batch, H, S, dims.D))
    dvh = np.zeros((*dims.batch, H, S, dims.E))
    ds_full = np.zeros((*dims.batch, H, L, S))
    for i0 in range(0, L, bq):
        i1 = min(i0 + bq, L)
        for j0 in range(0, S, bk):
            j1 = min(j0 + bk, S)
            if dims.is_causal and j0 > i1 - 1 + offset:
                continue  # above the diagonal: every position masked
            if bug == "skip_diagonal_block" and dims.is_causal and j1 - 1 > i0 + offset:
                continue  # BUG: a block the diagonal crosses is skipped too
            if not allowed[..., i0:i1, j0:j1].any():
                continue  # outside the window's band, or segments that cannot meet
            r0 = min(j0, L - (i1 - i0)) if bug == "lse_offset" else i0  # BUG: the key offset
            row_lse = lse[..., r0 : r0 + i1 - i0, :]
            if bug != "nan_fully_masked":  # BUG otherwise: exp(-inf - -inf) = NaN
                row_lse = np.where(row_lse == -np.inf, 0.0, row_lse)
            p = np.exp(s[..., i0:i1, j0:j1] - row_lse)  # (..., H, bq, bk)
            do_blk = do[..., i0:i1, :]
            dvh[..., j0:j1, :] += np.swapaxes(p, -1, -2) @ do_blk
            dp = do_blk @ np.swapaxes(vh[..., j0:j1, :], -1, -2)
            ds = p * (dp - delta[..., i0:i1, :])
            ds_full[..., i0:i1, j0:j1] = ds
            if tanh is not None and bug != "softcap_factor_missing":
                ds = ds * (1.0 - tanh[..., i0:i1, j0:j1] ** 2)
            dq_scale = dims.scale**2 if bug == "scale_twice" else dims.scale
            dq[..., i0:i1, :] += dq_scale * (ds @ kh[..., j0:j1, :])
            dkh[..., j0:j1, :] += dims.scale * (np.swapaxes(ds, -1, -2) @ q[..., i0:i1, :])

    def group_sum(x):  # (..., H, S, X) -> (..., K, S, X)
        if bug == "kv_not_summed":
            return x.reshape(*dims.batch, K, G, *x.shape[-2:])[..., 0, :, :]
        if bug == "kv_summed_tiling":
            return x.reshape(*dims.batch, G, K, *x.shape[-2:]).sum(axis=-4)
        return x.reshape(*dims.batch, K, G, *x.shape[-2:]).sum(axis=-3)

    dsinks = None
    if sink is not None:  # dsink_h = -sum_i w_sink,i * (dO_i . O_i)
        w_sink = np.exp(sink - np.where(empty, np.inf, lse))  # (..., H, L, 1); 0: no key
        dsinks = -(w_sink * delta).reshape(-1, H, L).sum(axis=(0, 2))
    dbias = None
    if bias is not None:
        dbias = ds_full if bug == "dbias_not_reduced" else _sum_to(ds_full, bias.shape)
    return AttentionGrads(
        query=_sum_to(dq, query.shape).astype(query.dtype),
        key=_sum_to(group_sum(dkh), key.shape).astype(key.dtype),
        value=_sum_to(group_sum(dvh), value.shape).astype(value.dtype),
        bias=None if dbias is None else dbias.astype(bias.dtype),
        sinks=None if dsinks is None else dsinks.astype(arrays["sinks"].dtype),
    )


def _quiet(fn: Callable) -> Callable:
    """A broken port gives NaN where it gives NaN, without NumPy's warnings."""

    def wrapped(*args, **kwargs):
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return fn(*args, **kwargs)

    wrapped.__signature__ = inspect.signature(fn)
    wrapped.__name__ = wrapped.__qualname__ = "broken_vjp." + fn.keywords["bug"]
    return wrapped


def vjp_pair(bug: str) -> tuple[Callable, Callable]:
    """``(scaled_dot_product_attention_vjp, flash_attention_vjp)`` with ``bug`` (or "none"):
    the first backward in one block, the second in the blocks it is given."""
    return _quiet(partial(broken_vjp, bug=bug)), _quiet(partial(broken_vjp, bug=bug))
