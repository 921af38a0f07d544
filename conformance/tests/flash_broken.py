"""Deliberately broken tiled attention: the classic bugs of the online softmax, one per port.

Each function has the signature of ``impl_numpy.flash.flash_attention``, validates like it and is
right except for one bug, the kind that passes a test with one block or no masking:

- ``no_rescale``: the accumulator and the running sum are not rescaled by ``exp(m_old - m_new)``
  when a new key block raises the row max; blocks summed under different maxima are mixed.
- ``early_normalize``: the accumulator is divided by the running sum after every key block, and
  the sum of the earlier blocks is then forgotten: right with one key block, wrong with two.
- ``skip_partial_block``: under causal masking, the blocks the diagonal crosses (partly masked)
  are skipped along with the blocks above it (fully masked).
- ``unguarded_max``: the row max of a row with nothing allowed yet (-inf) is used as the shift,
  so ``exp(-inf - -inf)`` is NaN in fully masked rows and blocks.

tests/test_flash.py proves that its checks catch every one of them; the conformance suite's
broken ports (``broken_ports.py``) reuse :data:`BROKEN`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from attention_spec import causal_offset, check_attention, check_block_sizes, rules
from impl_numpy.flash import BLOCK_K, BLOCK_Q, _block
from impl_numpy.functional import _compute_dtype

__all__ = ["BROKEN"]


def _broken_flash(
    query,
    key,
    value,
    *,
    mask=None,
    bias=None,
    is_causal=False,
    causal_alignment="top_left",
    scale=None,
    softcap=None,
    block_q=BLOCK_Q,
    block_k=BLOCK_K,
    return_lse=False,
    window=None,
    q_segment_ids=None,
    kv_segment_ids=None,
    sinks=None,
    alibi_slopes=None,
    bug: str,
):
    """impl_numpy.flash.flash_attention, compressed, with the one ``bug`` switched in."""
    query, key = np.asarray(query), np.asarray(key)
    value = None if value is None else np.asarray(value)
    mask = None if mask is None else np.asarray(mask)
    bias = None if bias is None else np.asarray(bias)
    arrays = {"q_segment_ids": q_segment_ids, "kv_segment_ids": kv_segment_ids, "sinks": sinks,
          "alibi_slopes": alibi_slopes}  # fmt: skip
    arrays = {name: None if x is None else np.asarray(x) for name, x in arrays.items()}
    dims = check_attention(
        query, key, value, mask=mask, bias=bias, causal_alignment=causal_alignment, scale=scale,
        is_causal=is_causal, softcap=softcap, window=window, **arrays,
    )  # fmt: skip
    check_block_sizes(block_q, block_k)
    ct = _compute_dtype(query.dtype)
    H, K, G, L, S, D, E = dims.H, dims.K, dims.G, dims.L, dims.S, dims.D, dims.E
    offset = causal_offset(L, S, causal_alignment)
    # The v2 rules and the mask as one dense (..., H|1, L, S) rule, ALiBi folded into the bias,
    # and key/value rows that no query of their group attends zeroed (garbage never leaks).
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    rule = np.ones((L, S), bool) if mask is None else mask
    is_causal = dims.is_causal
    if is_causal:
        rule = rule & rules.causal(i, j, offset)
    if dims.window is not None:
        rule = rule & rules.window(i, j, offset, dims.window)
    if arrays["q_segment_ids"] is not None:
        rule = rule & rules.segments(arrays["q_segment_ids"], arrays["kv_segment_ids"])
    bias = None if bias is None else bias.astype(ct)
    if arrays["alibi_slopes"] is not None:
        slopes = arrays["alibi_slopes"].astype(ct)[:, None, None]  # (H, 1, 1)
        bias = rules.alibi(slopes, i, j, offset) + (0.0 if bias is None else bias)
    seen = rule if bias is None else rule & (bias != -np.inf)
    seen = np.broadcast_to(seen, (*dims.batch, H, L, S)).any(axis=-2)  # (..., H, S)
    seen = seen.reshape(*dims.batch, K, G, S).any(axis=-2)[..., None, :, None]  # (..., K,1,S,1)
    q = query.astype(ct).reshape(*query.shape[:-3], K, G, L, D)  # (..., K, G, L, D)
    k = np.where(seen, key.astype(ct)[..., :, None, :, :], 0.0)  # (..., K, 1, S, D)
    v = np.where(seen, value.astype(ct)[..., :, None, :, :], 0.0)  # (..., K, 1, S, E)
    out = np.empty((*dims.batch, H, L, E), ct)
    lse = np.empty((*dims.batch, H, L), ct)
    for i0 in range(0, L, block_q):
        i1 = min(i0 + block_q, L)
        bq = i1 - i0
        m = np.full((*dims.batch, H, bq, 1), -np.inf, ct)
        l = np.zeros((*dims.batch, H, bq, 1), ct)
        acc = np.zeros((*dims.batch, H, bq, E), ct)
        j_end = min(S, max(0, i1 + offset)) if is_causal else S
        if is_causal and bug == "skip_partial_block":  # BUG: only blocks all rows see in full
            seen = max(0, min(S, i0 + offset + 1))  # keys that the block's first row sees
            j_end = seen if seen == S else seen // block_k * block_k
        for j0 in range(0, j_end, block_k):
            j1 = min(j0 + block_k, S)
            bk = j1 - j0
            s = q[..., i0:i1, :] @ np.swapaxes(k[..., j0:j1, :], -1, -2)
            s = np.broadcast_to(s.reshape(*s.shape[:-4], H, bq, bk), (*dims.batch, H, bq, bk))
            s = s * dims.scale
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            if bias is not None:
                s = s + _block(_block(bias, -2, i0, i1), -1, j0, j1)
            s = np.where(_block(_block(rule, -2, i0, i1), -1, j0, j1), s, -np.inf)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            if bug == "unguarded_max":  # BUG: -inf - -inf = NaN in a row with nothing allowed
                shift = m_new
            else:
                shift = np.where(m_new == -np.inf, 0.0, m_new)
            alpha = np.exp(m - shift)
            if bug == "no_rescale":  # BUG: what was summed under the old max is kept as it was
                alpha = np.where(np.isfinite(m), 1.0, 0.0)
            p = np.exp(s - shift)
            pv = (p.reshape(*dims.batch, K, G, bq, bk) @ v[..., j0:j1, :]).reshape(acc.shape)
            l_new = alpha * l + p.sum(axis=-1, keepdims=True)
            if bug == "early_normalize":  # BUG: divides now, and forgets l_old next time
                acc = (alpha * acc + pv) / np.where(l_new == 0.0, 1.0, l_new)
            else:
                acc = alpha * acc + pv
            l, m = l_new, m_new
        empty = l == 0.0
        if arrays["sinks"] is not None and bug != "early_normalize":  # one more logit, no value
            sink = arrays["sinks"].astype(ct)[:, None, None]  # (H, 1, 1)
            m_sink = np.maximum(m, sink)
            alpha = np.exp(m - m_sink)
            l, acc, m = alpha * l + np.exp(sink - m_sink), alpha * acc, m_sink
        l = np.where(empty, 1.0, l)
        out[..., i0:i1, :] = acc if bug == "early_normalize" else acc / l
        lse[..., i0:i1] = np.where(empty, -np.inf, m + np.log(l))[..., 0]
    out = out.astype(query.dtype)
    return (out, lse) if return_lse else out


def _quiet(fn: Callable) -> Callable:
    """A broken port gives NaN where it gives NaN, without NumPy's warnings."""

    def wrapped(*args, **kwargs):
        with np.errstate(invalid="ignore", divide="ignore"):
            return fn(*args, **kwargs)

    wrapped.__name__ = wrapped.__qualname__ = f"{fn.func.__name__}.{fn.keywords['bug']}"
    return wrapped


#: name -> a flash_attention with that bug.
BROKEN: dict[str, Callable] = {
    bug: _quiet(partial(_broken_flash, bug=bug))
    for bug in ("no_rescale", "early_normalize", "skip_partial_block", "unguarded_max")
}
