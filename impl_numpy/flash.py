"""Tiled online-softmax ("flash") attention in NumPy: plain Python loops over blocks.

The contract of :func:`impl_numpy.functional.scaled_dot_product_attention` (same keywords, same
validation and errors, fully masked rows are zeros), computed without ever holding the
``(..., H, L, S)`` scores: one block of ``block_q`` query rows meets one block of ``block_k`` keys
at a time, and a running row max ``m``, a running row sum ``l`` and an output accumulator ``acc``
carry what the earlier key blocks contributed (the online softmax). When a new block raises the
row max, what was summed under the old max is rescaled by ``exp(m_old - m_new)``; the division by
the row sum happens once, after the last key block. Under causal masking, key blocks that lie
entirely above the diagonal are never visited, so causal attention costs about half; only the
blocks a rule's boundary crosses are masked elementwise, and in those, key and value rows that
no row of the block may attend are zeroed (garbage there never reaches the output).

The same steps, numbers, names and comments as ``impl_numpy/functional.py`` (steps 1-6) and as
``impl_torch/flash.py`` and ``impl_jax/flash.py``; docs/FLASH.md puts the plain and tiled paths
side by side and gives the measured memory and time.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim; ``bq`` and ``bk`` are the rows and keys of one block
(``block_q``/``block_k``, or fewer in the last block).
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
import numpy as np

from attention_spec import (
    BLOCK_K,
    BLOCK_Q,
    causal_offset,
    check_attention,
    check_block_sizes,
    check_flag,
)
from attention_spec.rules import alibi, block_rules, key_band
from impl_numpy.functional import (
    _allowed,
    _asarray,
    _attended,
    _cast,
    _compute_dtype,
    _unattended_zeroed,
)

__all__ = ["BLOCK_K", "BLOCK_Q", "flash_attention"]


def _block(x: np.ndarray | None, axis: int, start: int, stop: int) -> np.ndarray | None:
    """``x[start:stop]`` along ``axis`` (-2: L, -1: S) of a mask or bias, which broadcasts to
    ``(..., H, L, S)`` (or of segment ids, ``(..., L)``, ``(..., S)``): an axis of size 1, or one
    it lacks, is left as it is and broadcasts."""
    if x is None or x.ndim < -axis or x.shape[axis] == 1:
        return x
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return x[tuple(index)]


def flash_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    return_lse: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """``scaled_dot_product_attention`` computed block by block, shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in
            :func:`impl_numpy.functional.attention_weights`.
        block_q: query rows per block (any integer >= 1; it need not divide L, and may exceed it).
        block_k: keys per block (likewise for S).
        return_lse: also return the row log-sum-exp of the final scores (after softcap, the
            additive terms and every rule, the sink included), ``lse = log(sum_j exp(s_ij)
            [+ exp(sink)])`` of shape ``(..., H, L)`` in the compute dtype (float64 for float64
            input, else float32); ``-inf`` for a row with no allowed key. It is what a backward
            pass needs to rebuild the weights: ``exp(s - lse)``.

    Returns the output in the query's dtype (rows with no allowed key are zeros), or
    ``(output, lse)`` when ``return_lse``. Key blocks outside the causal and window bands are
    never visited, blocks whose segments cannot meet are skipped, and only the blocks a rule's
    boundary crosses are masked elementwise.

    Raises the errors of ``scaled_dot_product_attention``, and ConfigError for a block size < 1.
    """
    query, key, value = _asarray(query), _asarray(key), _asarray(value)
    mask, bias = _asarray(mask), _asarray(bias)
    q_ids, kv_ids = _asarray(q_segment_ids), _asarray(kv_segment_ids)
    sinks, slopes = _asarray(sinks), _asarray(alibi_slopes)
    dims = check_attention(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
        window=window,
        q_segment_ids=q_ids,
        kv_segment_ids=kv_ids,
        sinks=sinks,
        alibi_slopes=slopes,
    )
    check_block_sizes(block_q, block_k)
    return_lse = check_flag("return_lse", return_lse)
    ct = _compute_dtype(query.dtype)
    H, K, G, L, S, D, E = dims.H, dims.K, dims.G, dims.L, dims.S, dims.D, dims.E
    offset = causal_offset(L, S, causal_alignment)  # query i sees key j iff j <= i + offset

    q = query.astype(ct, copy=False).reshape(*query.shape[:-3], K, G, L, D)  # (..., K, G, L, D)
    k = key.astype(ct, copy=False)[..., :, None, :, :]  # (..., K, 1, S, D)
    v = value.astype(ct, copy=False)[..., :, None, :, :]  # (..., K, 1, S, E)
    bias, sinks, slopes = _cast(bias, ct), _cast(sinks, ct), _cast(slopes, ct)

    out = np.empty((*dims.batch, H, L, E), ct)  # (..., H, L, E), filled one query block at a time
    lse = np.empty((*dims.batch, H, L), ct)  # (..., H, L)
    for i0 in range(0, L, block_q):  # one block of query rows at a time
        i1 = min(i0 + block_q, L)
        bq = i1 - i0
        m = np.full((*dims.batch, H, bq, 1), -np.inf, ct)  # running row max of the scores
        l = np.zeros((*dims.batch, H, bq, 1), ct)  # running row sum of exp(s - m)
        acc = np.zeros((*dims.batch, H, bq, E), ct)  # running sum of exp(s - m) @ value
        i = np.arange(i0, i1)[:, None]  # (bq, 1)
        q_ids_rows = _block(q_ids, -1, i0, i1)  # (..., bq): this block's rows' segments

        # 4. allowed, whole blocks: the keys outside the causal and window bands of these rows
        #    are masked for every row, so their blocks are never visited (a window of W keys
        #    costs W, not S); a block whose segments cannot meet is skipped. The key blocks
        #    start at the band's first key, so a band of block_k keys is one block, not two.
        lo, hi = key_band(dims.is_causal, dims.window, offset, i0, i1, S)
        for j0 in range(lo, hi, block_k):  # one block of keys at a time
            j1 = min(j0 + block_k, S)
            bk = j1 - j0
            kv_ids_blk = _block(kv_ids, -1, j0, j1)  # (..., bk)
            some, every = block_rules(dims.is_causal, dims.window, offset, i0, i1, j0, j1,
                                      q_ids_rows, kv_ids_blk)  # fmt: skip
            if not some:
                continue

            # 4. allowed, this block: the rules a boundary crosses, elementwise (mask AND
            #    causal AND window AND segment); a block inside every band needs none of them.
            j = np.arange(j0, j1)[None, :]  # (1, bk)
            mask_blk = _block(_block(mask, -2, i0, i1), -1, j0, j1)
            if every:
                allowed = mask_blk  # (..., bq|1, bk|1) or None
            else:
                allowed = _allowed(dims, offset, i, j, mask_blk, q_ids_rows, kv_ids_blk)
            bias_blk = _block(_block(bias, -2, i0, i1), -1, j0, j1)
            attended = _attended(allowed, bias_blk, (*dims.batch, H, bq, bk), K)  # (..., K, bk)
            attended = None if attended is None else attended[..., None, :]  # (..., K, 1, bk)
            k_blk = _unattended_zeroed(k[..., j0:j1, :], attended)  # (..., K, 1, bk, D)
            v_blk = _unattended_zeroed(v[..., j0:j1, :], attended)  # (..., K, 1, bk, E)

            # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G.
            s = q[..., i0:i1, :] @ np.swapaxes(k_blk, -1, -2)  # (..., K, G, bq, bk)
            s = s.reshape(*s.shape[:-4], H, bq, bk)  # (..., H, bq, bk); head h reads kv h // G
            if s.shape[:-3] != dims.batch:  # a value with more batch than query and key
                s = np.broadcast_to(s, (*dims.batch, H, bq, bk)).copy()
            s *= dims.scale

            # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
            if dims.softcap is not None:
                s /= dims.softcap
                np.tanh(s, out=s)
                s *= dims.softcap

            # 3. additive terms: this block's slice of the bias, may hold -inf, and ALiBi's
            #    -slope[h] * |i + offset - j| at this block's rows and keys.
            if bias_blk is not None:
                s += bias_blk
            if slopes is not None:
                s += alibi(slopes[:, None, None], i, j, offset)  # (H, bq, bk)

            # 4. allowed: s = -inf where allowed(i, j) is False, in this block.
            if allowed is not None:
                np.copyto(s, -np.inf, where=~allowed)

            # 5. online softmax: raise the running max, rescale what was summed under the old
            #    one by exp(m_old - m_new), add this block's exp(s - m_new).
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # (..., H, bq, 1)
            shift = np.where(np.isfinite(m_new), m_new, 0.0)  # nothing allowed yet: not NaN
            alpha = np.exp(m - shift)  # (..., H, bq, 1); 0 while m is still -inf
            s -= shift
            np.minimum(s, 0.0, out=s)  # exp(s - max) <= 1 even if s was rounded differently
            p = np.exp(s, out=s)  # (..., H, bq, bk), unnormalized weights
            l = alpha * l + p.sum(axis=-1, keepdims=True)

            # 6. output, accumulated: acc = alpha * acc + p @ value, per group.
            pv = p.reshape(*dims.batch, K, G, bq, bk) @ v_blk  # (..., K, G, bq, E)
            acc = alpha * acc + pv.reshape(*dims.batch, H, bq, E)  # (..., H, bq, E)
            m = m_new
            del s, p  # this block's scores go before the next block's are made

        # 5. (end) the sink joins the denominator once, as one more logit with no value; then
        #    divide by the row sum once, after the last key block. A row with no allowed key
        #    has l = 0 and acc = 0: 0 / 1 = 0 (sink or not), and its log-sum-exp is -inf.
        empty = l == 0.0  # (..., H, bq, 1): rows that saw no allowed key
        if sinks is not None:
            m_sink = np.maximum(m, sinks[:, None, None])  # (..., H, bq, 1)
            shift = np.where(np.isfinite(m_sink), m_sink, 0.0)
            alpha = np.exp(m - shift)
            l = alpha * l + np.exp(np.minimum(sinks[:, None, None] - shift, 0.0))
            acc, m = alpha * acc, m_sink
        l = np.where(empty, 1.0, l)
        out[..., i0:i1, :] = acc / l  # (..., H, bq, E)
        lse[..., i0:i1] = np.where(empty, -np.inf, m + np.log(l))[..., 0]  # (..., H, bq)

    out = out.astype(query.dtype, copy=False)  # back to the input dtype
    return (out, lse) if return_lse else out  # lse: (..., H, L) in the compute dtype
