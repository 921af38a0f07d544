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

:func:`flash_attention_vjp` is the tiled backward (FlashAttention-2's Algorithm 2, written here
with the forward's loop order): the forward keeps only its output and the row log-sum-exp
``lse``; the backward visits the same blocks the forward visits, rebuilds each block's weights as
``P = exp(S - lse)`` and accumulates ``dQ``, ``dK`` and ``dV`` block by block, so no
``(..., H, L, S)`` array ever exists: the memory beyond inputs, output and gradients is
O(L + S) plus one block.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim; ``bq`` and ``bk`` are the rows and keys of one block
(``block_q``/``block_k``, or fewer in the last block).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
import numpy as np

from attention_spec import (
    BLOCK_K,
    BLOCK_Q,
    AttentionCall,
    AttentionGrads,
    check_attention,
    check_flag,
    check_grad_output,
    check_paged_attention,
    sequence_pages,
    tiled_blocks,
)
from attention_spec.rules import alibi, block_rules, causal, key_band
from attention_spec.rules import window as window_rule
from impl_numpy.functional import (
    _allowed,
    _attended,
    _cast,
    _compute_dtype,
    _converted,
    _dequantized,
    _output_dtype,
    _sum_to,
    _unattended_zeroed,
)
from impl_numpy.paged import _asarray, _descaled

__all__ = ["BLOCK_K", "BLOCK_Q", "flash_attention", "flash_attention_vjp", "paged_flash_attention"]

#: The blocks of a narrow band, ``(rows, widest)``, for ``attention_spec.tiled_blocks``: a call
#: whose causal and window bands leave each query row at most ``left + 1 + right`` keys, with
#: ``128 + left + right <= 512``, is tiled in blocks of 128 rows and their band's keys, so a
#: block computes few scores outside the band (the timings: docs/FLASH.md, "Block sizes").
BAND_BLOCKS: tuple[int, int] = (128, 512)


def _block(x: np.ndarray | None, axis: int, start: int, stop: int) -> np.ndarray | None:
    """``x[start:stop]`` along ``axis`` (-2: L, -1: S) of a mask or bias, which broadcasts to
    ``(..., H, L, S)`` (or of segment ids, ``(..., L)``, ``(..., S)``): an axis of size 1, or one
    it lacks, is left as it is and broadcasts."""
    if x is None or x.ndim < -axis or x.shape[axis] == 1:
        return x
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return x[tuple(index)]


class _Blocks:
    """The tiling of one call, shared by the forward and the backward: which key blocks each
    block of query rows visits, and each visited block's steps 1-4.

    Built from the validated call and its arrays as :func:`_in_compute_dtype` makes them:
    ``q (..., K, G, L, D)``, ``k (..., K, 1, S, D)``, ``v (..., K, 1, S, E)``; mask, bias,
    segment ids, sinks and slopes (bias, sinks and slopes in the compute dtype).
    """

    def __init__(self, call: AttentionCall, x: _Arrays, block_q: int, block_k: int):
        self.call = call
        self.q, self.k, self.v = x.query, x.key, x.value
        self.mask, self.bias, self.sinks = x.mask, x.bias, x.sinks
        self.q_ids, self.kv_ids, self.slopes = x.q_ids, x.kv_ids, x.slopes
        self.block_q, self.block_k = block_q, block_k

    def query_blocks(self):
        """``(i0, i1)`` of each block of query rows, in order."""
        for i0 in range(0, self.call.L, self.block_q):
            yield i0, min(i0 + self.block_q, self.call.L)

    def key_blocks(self, i0: int, i1: int):
        """The key blocks rows ``[i0, i1)`` visit, ``(j0, j1, every)``. ``every``: every
        position of the block is allowed by causal, window and segments (only the mask remains).
        """
        call, offset = self.call, self.call.offset
        q_ids_rows = _block(self.q_ids, -1, i0, i1)  # (..., bq): this block's rows' segments
        # 4. allowed, whole blocks: the keys outside the causal and window bands of these rows
        #    are masked for every row, so their blocks are never visited (a window of W keys
        #    costs W, not S); a block whose segments cannot meet is skipped. The key blocks
        #    start at the band's first key, so a band of block_k keys is one block, not two,
        #    and the last one ends at the band's last key (past the diagonal, nothing is
        #    computed): every key of a block is allowed to some row by causal and window.
        lo, hi = key_band(call.is_causal, call.window, offset, i0, i1, call.S)
        for j0 in range(lo, hi, self.block_k):
            j1 = min(j0 + self.block_k, hi)
            kv_ids_blk = _block(self.kv_ids, -1, j0, j1)  # (..., bk)
            some, every = block_rules(
                call.is_causal, call.window, offset, i0, i1, j0, j1, q_ids_rows, kv_ids_blk
            )
            if some:
                yield j0, j1, every

    def scores(self, i0: int, i1: int, j0: int, j1: int, every: bool):
        """Steps 1-4 on the block of rows ``[i0, i1)`` and keys ``[j0, j1)``.

        Returns ``s (..., H, bq, bk)`` (-inf where not allowed), the block's key and value rows
        ``(..., K, 1, bk, D|E)`` with the rows no row of the block attends zeroed, the bias
        block (or None) and, with softcap, ``tanh(s1 / softcap)`` of the step-1 scores ``s1``
        (what the backward's softcap factor needs; None without softcap).
        """
        call, offset = self.call, self.call.offset
        H, K, bq, bk = call.H, call.K, i1 - i0, j1 - j0
        i = np.arange(i0, i1)[:, None]  # (bq, 1)
        j = np.arange(j0, j1)[None, :]  # (1, bk)

        # 4. allowed, this block: the rules a boundary crosses, elementwise (mask AND causal AND
        #    window AND segment); a block inside every band needs none of them.
        mask_blk = _block(_block(self.mask, -2, i0, i1), -1, j0, j1)
        if every:
            allowed = mask_blk  # (..., bq|1, bk|1) or None
        else:
            q_ids_rows = _block(self.q_ids, -1, i0, i1)
            kv_ids_blk = _block(self.kv_ids, -1, j0, j1)
            allowed = _allowed(call, offset, i, j, mask_blk, q_ids_rows, kv_ids_blk)
        bias_blk = _block(_block(self.bias, -2, i0, i1), -1, j0, j1)
        #    Which key rows some row of the block attends: inside the band every key is
        #    attended as far as causal and window go, so only mask, segments and bias decide.
        banded = mask_blk is None and self.q_ids is None  # allowed is causal and window only
        attended = _attended(None if banded else allowed, bias_blk, (*call.batch, H, bq, bk), K)
        attended = None if attended is None else attended[..., None, :]  # (..., K, 1, bk)
        k_blk = _unattended_zeroed(self.k[..., j0:j1, :], attended)  # (..., K, 1, bk, D)
        v_blk = _unattended_zeroed(self.v[..., j0:j1, :], attended)  # (..., K, 1, bk, E)

        # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G.
        s = self.q[..., i0:i1, :] @ np.swapaxes(k_blk, -1, -2)  # (..., K, G, bq, bk)
        s = s.reshape(*s.shape[:-4], H, bq, bk)  # (..., H, bq, bk); head h reads kv h // G
        if s.shape[:-3] != call.batch:  # a value with more batch than query and key
            s = np.broadcast_to(s, (*call.batch, H, bq, bk)).copy()
        s *= call.scale

        # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
        tanh = None
        if call.softcap is not None:
            s /= call.softcap
            tanh = np.tanh(s, out=s)
            s = tanh * call.softcap

        # 3. additive terms: this block's slice of the bias, may hold -inf, and ALiBi's
        #    -slope[h] * |i + offset - j| at this block's rows and keys.
        if bias_blk is not None:
            s += bias_blk
        if self.slopes is not None:
            s += alibi(self.slopes[:, None, None], i, j, offset)  # (H, bq, bk)

        # 4. allowed: s = -inf where allowed(i, j) is False, in this block.
        if allowed is not None:
            np.copyto(s, -np.inf, where=~allowed)
        return s, k_blk, v_blk, bias_blk, tanh


@np.errstate(invalid="ignore")  # a +inf score allowed makes its row NaN (the contract), quietly
def _forward(blocks: _Blocks) -> tuple[np.ndarray, np.ndarray]:
    """The tiled forward: ``(output (..., H, L, E), lse (..., H, L))`` in the compute dtype."""
    call, sinks, ct = blocks.call, blocks.sinks, blocks.q.dtype
    H, K, G, L, E = call.H, call.K, call.G, call.L, call.E
    out = np.empty((*call.batch, H, L, E), ct)  # (..., H, L, E), filled one query block at a time
    lse = np.empty((*call.batch, H, L), ct)  # (..., H, L)
    for i0, i1 in blocks.query_blocks():  # one block of query rows at a time
        bq = i1 - i0
        m = np.full((*call.batch, H, bq, 1), -np.inf, ct)  # running row max of the scores
        l = np.zeros((*call.batch, H, bq, 1), ct)  # running row sum of exp(s - m)
        acc = np.zeros((*call.batch, H, bq, E), ct)  # running sum of exp(s - m) @ value
        for j0, j1, every in blocks.key_blocks(i0, i1):  # one block of keys at a time
            # 1.-4. this block's scores (blocks.scores: the steps written out, as in sdpa)
            s, _, v_blk, _, _ = blocks.scores(i0, i1, j0, j1, every)  # (..., H, bq, bk)
            bk = j1 - j0

            # 5. online softmax: raise the running max, rescale what was summed under the old
            #    one by exp(m_old - m_new), add this block's exp(s - m_new).
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # (..., H, bq, 1)
            shift = np.where(m_new == -np.inf, 0.0, m_new)  # nothing allowed yet: not NaN
            alpha = np.exp(m - shift)  # (..., H, bq, 1); 0 while m is still -inf
            s -= shift
            np.minimum(s, 0.0, out=s)  # exp(s - max) <= 1 even if s was rounded differently
            p = np.exp(s, out=s)  # (..., H, bq, bk), unnormalized weights
            l = alpha * l + p.sum(axis=-1, keepdims=True)

            # 6. output, accumulated: acc = alpha * acc + p @ value, per group.
            pv = p.reshape(*call.batch, K, G, bq, bk) @ v_blk  # (..., K, G, bq, E)
            acc = alpha * acc + pv.reshape(*call.batch, H, bq, E)  # (..., H, bq, E)
            m = m_new
            del s, p  # this block's scores go before the next block's are made

        # 5. (end) the sink joins the denominator once, as one more logit with no value; then
        #    divide by the row sum once, after the last key block. A row with no allowed key
        #    has l = 0 and acc = 0: 0 / 1 = 0 (sink or not), and its log-sum-exp is -inf.
        empty = l == 0.0  # (..., H, bq, 1): rows that saw no allowed key
        if sinks is not None:
            m_sink = np.maximum(m, sinks[:, None, None])  # (..., H, bq, 1)
            shift = np.where(m_sink == -np.inf, 0.0, m_sink)
            alpha = np.exp(m - shift)
            l = alpha * l + np.exp(np.minimum(sinks[:, None, None] - shift, 0.0))
            acc, m = alpha * acc, m_sink
        l = np.where(empty, 1.0, l)
        out[..., i0:i1, :] = acc / l  # (..., H, bq, E)
        lse[..., i0:i1] = np.where(empty, -np.inf, m + np.log(l))[..., 0]  # (..., H, bq)
    return out, lse


@np.errstate(invalid="ignore")  # a +inf score allowed makes its row NaN (the contract), quietly
def _backward(blocks: _Blocks, out, lse, do):
    """The tiled backward (FlashAttention-2, Algorithm 2, in the forward's loop order):
    ``(dQ, dK, dV, dbias, dsinks)`` in the compute dtype, dQ ``(..., H, L, D)``, dK and dV
    ``(..., K, S, D|E)`` at the call's batch, dbias of the bias's shape (or None), dsinks
    ``(H,)`` (or None).

    ``out (..., H, L, E)`` and ``lse (..., H, L)`` are the forward's, ``do (..., H, L, E)``
    the cotangent of the output. For each block of query rows, ``D_i = rowsum(dO_i * O_i)``;
    for each key block the forward visited, its weights are rebuilt from the row log-sum-exp,
    ``P = exp(S - lse)``, and the steps of the plain backward run on the block: ``dV += P^T dO``,
    ``dP = dO V^T``, ``dS = P * (dP - D)``, ``dQ += dS K``, ``dK += dS^T Q``.
    """
    call, q, sinks, ct = blocks.call, blocks.q, blocks.sinks, blocks.q.dtype
    H, K, G, L, S, D, E = call.H, call.K, call.G, call.L, call.S, call.D, call.E
    dq = np.zeros((*call.batch, K, G, L, D), ct)  # (..., K, G, L, D), one query block at a time
    dk = np.zeros((*call.batch, K, S, D), ct)  # (..., K, S, D), accumulated over query blocks
    dv = np.zeros((*call.batch, K, S, E), ct)  # (..., K, S, E), likewise
    dbias = None if blocks.bias is None else np.zeros(blocks.bias.shape, ct)  # the bias's shape
    dsinks = None if sinks is None else np.zeros((*call.batch, H, L), ct)  # per row, summed last
    for i0, i1 in blocks.query_blocks():  # one block of query rows at a time
        bq = i1 - i0
        do_blk = do[..., i0:i1, :].reshape(*call.batch, K, G, bq, E)  # (..., K, G, bq, E)
        o_blk = out[..., i0:i1, :].reshape(*call.batch, K, G, bq, E)
        delta = (do_blk * o_blk).sum(axis=-1, keepdims=True)  # (..., K, G, bq, 1): dO_i . O_i
        row_lse = lse[..., i0:i1, None]  # (..., H, bq, 1)
        shift = np.where(row_lse == -np.inf, 0.0, row_lse)  # a row with no key: P = 0
        q_blk = q[..., i0:i1, :]  # (..., K, G, bq, D)

        # 5. (end) the sink: dsink_h = -sum_i w_sink,i (dO_i . O_i), w_sink,i = exp(sink - lse_i).
        if sinks is not None:
            w_sink = np.exp(np.minimum(sinks[:, None, None] - shift, 0.0))  # (..., H, bq, 1)
            dsinks[..., i0:i1] = -(w_sink * delta.reshape(w_sink.shape))[..., 0]

        for j0, j1, every in blocks.key_blocks(i0, i1):  # the blocks the forward visited
            s, k_blk, v_blk, bias_blk, tanh = blocks.scores(i0, i1, j0, j1, every)
            bk = j1 - j0

            # 5. the block's weights, rebuilt from the row log-sum-exp: P = exp(S - lse).
            s -= shift
            np.minimum(s, 0.0, out=s)  # P <= 1 even if S was rounded differently
            p = np.exp(s, out=s).reshape(*call.batch, K, G, bq, bk)  # (..., K, G, bq, bk)

            # 6. output:  dV += P^T dO (summed over the group);  dP = dO V^T.
            dv[..., j0:j1, :] += (np.swapaxes(p, -1, -2) @ do_blk).sum(axis=-3)  # (..., K, bk, E)
            dp = do_blk @ np.swapaxes(v_blk, -1, -2)  # (..., K, G, bq, bk)

            # 5. softmax:  dS = P * (dP - D); zero wherever P is (masked, -inf bias, no key).
            ds = p * (dp - delta)  # (..., K, G, bq, bk)

            # 3. additive terms:  dbias += dS, summed to the bias block's shape.
            if dbias is not None:
                ds_h = ds.reshape(*call.batch, H, bq, bk)  # (..., H, bq, bk)
                _block(_block(dbias, -2, i0, i1), -1, j0, j1)[...] += _sum_to(ds_h, bias_blk.shape)

            # 2. softcap:  dS *= 1 - tanh^2(s / softcap).
            if tanh is not None:
                ds = ds * (1.0 - tanh * tanh).reshape(*tanh.shape[:-3], K, G, bq, bk)

            # 1. scores:  dQ += dS K * scale;  dK += dS^T Q * scale (summed over the group).
            dq[..., i0:i1, :] += (ds @ k_blk) * call.scale  # (..., K, G, bq, D)
            dk[..., j0:j1, :] += (np.swapaxes(ds, -1, -2) @ q_blk).sum(axis=-3) * call.scale
            del s, p, dp, ds  # this block's arrays go before the next block's are made

    dq = dq.reshape(*call.batch, H, L, D)  # (..., H, L, D)
    if dsinks is not None:  # (..., H, L) -> (H,); L may be 0
        dsinks = dsinks.sum(axis=(*range(len(call.batch)), -1))
    return dq, dk, dv, dbias, dsinks


class _Arrays(NamedTuple):
    """The arrays of one tiled call (None where not given): ``query (..., H, L, D)``,
    ``key (..., K, S, D)``, ``value (..., K, S, E)``, ``bias`` (broadcastable to
    ``(..., H, L, S)``) and ``sinks (H,)``, the differentiated ones; ``mask``, the segment ids
    ``q_ids (..., L)`` and ``kv_ids (..., S)``, and ALiBi's ``slopes (H,)``."""

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    bias: np.ndarray | None
    sinks: np.ndarray | None
    mask: np.ndarray | None
    q_ids: np.ndarray | None
    kv_ids: np.ndarray | None
    slopes: np.ndarray | None


def _arrays(query, key, value, keywords: Mapping[str, np.ndarray | None]) -> _Arrays:
    """The :class:`_Arrays` of a call: query, key, value and its array ``keywords`` by name."""
    return _Arrays(
        query, key, value, keywords["bias"], keywords["sinks"], keywords["mask"],
        keywords["q_segment_ids"], keywords["kv_segment_ids"], keywords["alibi_slopes"],
    )


def _in_compute_dtype(x: _Arrays, call: AttentionCall) -> _Arrays:
    """``x`` as the loops read it: query grouped as ``(..., K, G, L, D)``, key and value with
    a group axis, and query, key, value, bias, sinks and slopes in the compute dtype (mask and
    segment ids as they are)."""
    ct = _compute_dtype(x.query.dtype)
    K, G, L, D = call.K, call.G, call.L, call.D
    q = x.query.astype(ct, copy=False).reshape(*x.query.shape[:-3], K, G, L, D)  # (..., K, G, L, D)
    k = x.key.astype(ct, copy=False)[..., :, None, :, :]  # (..., K, 1, S, D)
    v = x.value.astype(ct, copy=False)[..., :, None, :, :]  # (..., K, 1, S, E)
    return x._replace(
        query=q, key=k, value=v, bias=_cast(x.bias, ct), sinks=_cast(x.sinks, ct),
        slopes=_cast(x.slopes, ct),
    )


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
    q_descale: np.ndarray | float | None = None,
    k_descale: np.ndarray | float | None = None,
    v_descale: np.ndarray | float | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
    return_lse: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """``scaled_dot_product_attention`` computed block by block, shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes, q_descale, k_descale, v_descale: as in
            :func:`impl_numpy.functional.scaled_dot_product_attention` (fp8 inputs,
            Contract v3: dequantized first, step 0; the output of an fp8 query is bfloat16).
        block_q: query rows per block (any integer >= 1; it need not divide L, and may exceed it);
            None: the default, ``attention_spec.tiled_blocks``: ``BLOCK_Q``, or fewer rows
            under a narrow window (``BAND_BLOCKS``).
        block_k: keys per block (likewise for S); None: ``BLOCK_K``, or a narrow window's band.
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
    query, key, value, kw = _converted(query, key, value, given=locals())
    call = check_attention(query, key, value, **kw)
    block_q, block_k = tiled_blocks(BAND_BLOCKS, block_q, block_k, call.is_causal, call.window)
    return_lse = check_flag("return_lse", return_lse)
    # 0. dequantize: an fp8 input is float32 times its descale (the contract's float(x) * d);
    #    the steps below then run in float32, and the result is bfloat16 for an fp8 query.
    out_dtype = _output_dtype(query.dtype)
    query = _dequantized(query, "q_descale", call, kw)
    key, value = (
        _dequantized(key, "k_descale", call, kw),
        _dequantized(value, "v_descale", call, kw),
    )
    x = _arrays(query, key, value, kw)
    blocks = _Blocks(call, _in_compute_dtype(x, call), block_q, block_k)
    out, lse = _forward(blocks)  # (..., H, L, E), (..., H, L) in the compute dtype
    out = out.astype(out_dtype, copy=False)  # back to the input dtype (bfloat16 for fp8)
    return (out, lse) if return_lse else out


def flash_attention_vjp(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    grad_output: np.ndarray,
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
    block_q: int | None = None,
    block_k: int | None = None,
) -> AttentionGrads:
    """The gradients of ``<flash_attention(...), grad_output>``, block by block, by hand.

    Args: those of :func:`flash_attention` (without ``return_lse``), and ``grad_output``
        ``(..., H, L, E)``, the cotangent ``dO`` of the output (its exact shape).

    Returns ``AttentionGrads(query, key, value, bias, sinks)`` as
    :func:`impl_numpy.functional.scaled_dot_product_attention_vjp` does (each gradient of its
    input's shape and dtype; None for an input not given), computed with one tiled forward
    (which keeps only the output and ``lse``) and the tiled backward (:func:`_backward`): the
    memory beyond inputs, output and gradients is O(L + S) plus one block, and the backward
    skips the blocks the forward skips.
    """
    query, key, value, grad_output, kw = _converted(query, key, value, grad_output, given=locals())
    call = check_attention(query, key, value, **kw)
    block_q, block_k = tiled_blocks(BAND_BLOCKS, block_q, block_k, call.is_causal, call.window)
    check_grad_output(call, grad_output)
    x = _arrays(query, key, value, kw)
    blocks = _Blocks(call, _in_compute_dtype(x, call), block_q, block_k)
    out, lse = _forward(blocks)  # what the forward keeps: O and lse
    do = grad_output.astype(out.dtype, copy=False)  # (..., H, L, E) in the compute dtype
    dq, dk, dv, dbias, dsinks = _backward(blocks, out, lse, do)

    # The gradient of a broadcast input is summed over its broadcast axes; each in its dtype.
    return AttentionGrads(
        query=_sum_to(dq, query.shape).astype(query.dtype, copy=False),
        key=_sum_to(dk, key.shape).astype(key.dtype, copy=False),
        value=_sum_to(dv, value.shape).astype(value.dtype, copy=False),
        bias=None if dbias is None else dbias.astype(x.bias.dtype, copy=False),
        sinks=None if dsinks is None else dsinks.astype(x.sinks.dtype, copy=False),
    )


# ---------------------------------------------------------------------------------------------
# Paged key/value caches (Contract v3): the tiled read, each sequence's own pages in blocks
# ---------------------------------------------------------------------------------------------


@np.errstate(invalid="ignore")  # a +inf score allowed makes its row NaN (the contract), quietly
def paged_flash_attention(
    query: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_table: np.ndarray,
    seq_lens: np.ndarray,
    cu_seqlens_q: np.ndarray,
    *,
    is_causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    q_descale: np.ndarray | float | None = None,
    k_descale: np.ndarray | float | None = None,
    v_descale: np.ndarray | float | None = None,
    block_k: int | None = None,
) -> np.ndarray:
    """:func:`impl_numpy.paged.paged_attention`, read block by block: ``(T, H, E)``; each
    sequence reads its own pages, a block of whole pages at a time, and an fp8 cache is
    dequantized as it is read.

    The schedule is made on the host, as :func:`impl_numpy.varlen.varlen_flash_attention`'s
    (``attention_spec.sequence_pages``, from the concrete ``cu_seqlens_q`` and ``seq_lens``):
    for each sequence n with ``L_n >= 1`` queries, the blocks of its pages that hold keys its
    queries may attend (``j < seq_lens[n]``, inside the causal and window bands). A block is
    ``key_cache[block_table[n, p0:p1]]`` (``(bk, K, D|E)``, ``bk = (p1 - p0) * page_size``),
    folded into the running max, sum and accumulator of the sequence's ``L_n`` rows (the online
    softmax of :func:`flash_attention`); the keys ``>= seq_lens[n]`` of its last page are
    masked, and their values zeroed. No contiguous copy of a sequence's keys, or of the pool, is
    ever made, and no page past a sequence's keys is read: the memory beyond inputs and output
    is one block of one sequence, ``O(H * L_n * bk)`` scores and ``O(bk * K * (D + E))`` keys
    and values, whatever P and max_pages are.

    Args: those of ``paged_attention``, ``seq_lens`` and ``cu_seqlens_q`` concrete (the blocks
        are scheduled from them on the host), and
        block_k: keys per block (any integer >= 1); None: ``attention_spec.paged_block_k``'s
            default for each sequence's query rows (2048 keys decoding, 512 for 256 rows or
            more). A block is ``max(1, block_k // page_size)`` whole pages.

    Returns what ``paged_attention`` returns. Raises its errors, ConfigError for a block size
    < 1, and ConfigError ``cu_seqlens_value`` / ``seq_lens_value`` for a ``cu_seqlens_q`` /
    ``seq_lens`` that is not concrete (traced, under ``jax.jit``).
    """
    query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, sinks, alibi_slopes = (
        _asarray(x)
        for x in (query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, sinks,
                  alibi_slopes)
    )
    call = check_paged_attention(
        query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, is_causal=is_causal,
        window=window, scale=scale, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
    )
    schedule = sequence_pages(call, block_k)  # [(n, q0, q1, S, blocks)], Python ints
    ct = _compute_dtype(query.dtype)
    H, K, G, D, E, page_size = call.H, call.K, call.G, call.D, call.E, call.page_size
    slopes = None if alibi_slopes is None else alibi_slopes.astype(ct).reshape(K, G, 1, 1)
    rows = [np.zeros((0, H, E), ct)]  # then (L_n, H, E) per sequence (N may be 0)
    for n, q0, q1, S, blocks in schedule:  # one sequence at a time: its queries, its pages
        L = q1 - q0
        at_n = np.array([n])  # (1,): sequence n, for its descale row
        # Its queries, grouped by key/value head, at positions S - L + i (bottom-right).
        q = _descaled(query[q0:q1], call.q_descale, q_descale, at_n).astype(ct, copy=False)
        q = q.reshape(L, K, G, D).transpose(1, 2, 0, 3).reshape(K, G * L, D)  # (K, G * L, D)
        i = S - L + np.arange(L)[:, None]  # (L, 1)
        m = np.full((K, G, L, 1), -np.inf, ct)  # running row max of the scores
        l = np.zeros((K, G, L, 1), ct)  # running row sum of exp(s - m)
        acc = np.zeros((K, G, L, E), ct)  # running sum of exp(s - m) @ value
        for p0, p1 in blocks:  # one block of the sequence's pages at a time
            # 0. the block: pages block_table[n, p0:p1], keys j = p0 * page_size + 0 .. bk - 1;
            #    only j < S exists (the last page's tail is masked, its values zeroed). An fp8
            #    page is dequantized as it is read: float32 times the sequence's descale.
            pages = block_table[n, p0:p1]  # (p1 - p0,)
            j = p0 * page_size + np.arange((p1 - p0) * page_size)  # (bk,)
            exists = j < S  # (bk,)
            k = _descaled(key_cache[pages], call.k_descale, k_descale, at_n)  # (p1-p0, ps, K, D)
            v = _descaled(value_cache[pages], call.v_descale, v_descale, at_n)  # (.., ps, K, E)
            k = k.astype(ct, copy=False).reshape(-1, K, D).transpose(1, 2, 0)  # (K, D, bk)
            v = v.astype(ct, copy=False).reshape(-1, K, E)  # (bk, K, E)
            v[S - p0 * page_size :] = 0.0  # the last page's slots past S, in the block's copy
            v = v.transpose(1, 0, 2)  # (K, bk, E); no 0*NaN meets a weight

            # 1. scores = (query . key) * scale; query head h = k * G + g reads key/value head k.
            s = q @ k  # (K, G * L, bk)
            s = s.reshape(K, G, L, -1) * call.scale  # (K, G, L, bk)
            # 2. softcap
            if call.softcap is not None:
                s = call.softcap * np.tanh(s / call.softcap)
            # 3. ALiBi, -slope[h] * |i - j|
            if slopes is not None:
                s = s + alibi(slopes, i, j, 0)
            # 4. allowed: the key exists (j < S), causal and window on the positions i
            allowed = exists
            if call.is_causal:
                allowed = allowed & causal(i, j, 0)
            if call.window is not None:
                allowed = allowed & window_rule(i, j, 0, call.window)
            s = np.where(allowed, s, -np.inf)  # (K, G, L, bk)

            # 5. online softmax, as flash_attention's: raise the max, rescale, add exp(s - m_new).
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # (K, G, L, 1)
            shift = np.where(m_new == -np.inf, 0.0, m_new)  # nothing allowed yet: not NaN
            alpha = np.exp(m - shift)
            e = np.exp(np.minimum(s - shift, 0.0))  # (K, G, L, bk); 0 where not allowed
            l = alpha * l + e.sum(axis=-1, keepdims=True)

            # 6. output, accumulated: acc = alpha * acc + e @ value, per group.
            pv = e.reshape(K, G * L, -1) @ v  # (K, G * L, E)
            acc = alpha * acc + pv.reshape(K, G, L, E)  # (K, G, L, E)
            m = m_new

        # 5. (end) the sink joins the denominator once; a row with no key is 0 / 1 = 0.
        empty = l == 0.0
        if sinks is not None:
            sink = sinks.astype(ct).reshape(K, G, 1, 1)
            m_sink = np.maximum(m, sink)
            shift = np.where(m_sink == -np.inf, 0.0, m_sink)
            alpha = np.exp(m - shift)
            l = alpha * l + np.exp(np.minimum(sink - shift, 0.0))
            acc = alpha * acc
        out = acc / np.where(empty, 1.0, l)  # (K, G, L, E)
        rows.append(out.transpose(2, 0, 1, 3).reshape(L, H, E))  # (L, H, E)

    return np.concatenate(rows).astype(_output_dtype(query.dtype))  # (T, H, E): the rows in order
