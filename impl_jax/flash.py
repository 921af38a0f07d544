"""Tiled online-softmax ("flash") attention in JAX: ``jax.lax.scan`` over blocks, one compile.

The contract of :func:`impl_jax.functional.scaled_dot_product_attention` (same keywords, same
validation and errors, fully masked rows are zeros), computed without ever holding the
``(..., H, L, S)`` scores: one block of ``block_q`` query rows meets one block of ``block_k`` keys
at a time, and a running row max ``m``, a running row sum ``l`` and an output accumulator ``acc``
carry what the earlier key blocks contributed (the online softmax). When a new block raises the
row max, what was summed under the old max is rescaled by ``exp(m_old - m_new)``; the division by
the row sum happens once, after the last key block. Under causal masking, key blocks that lie
entirely above the diagonal are skipped, so causal attention costs about half.

The same steps, numbers, names and comments as ``impl_jax/functional.py`` (steps 1-6) and as
``impl_numpy/flash.py`` and ``impl_torch/flash.py``; docs/FLASH.md puts the plain and tiled paths
side by side and gives the measured memory and time. What JAX asks for:

- Both loops are ``jax.lax.scan``: an outer scan over query blocks, an inner scan over key
  blocks. XLA compiles one loop body holding one ``(..., H, bq, bk)`` block of scores, whatever
  L and S are, and ``jax.grad`` differentiates it. The trip counts are static (every key block
  is a step); the causal skip is a ``jax.lax.cond`` on the block's position, which on a jitted
  CPU or GPU program runs only the branch it takes. (A ``fori_loop`` whose bound depends on the
  query block would be traced, hence a ``while_loop``, which reverse mode cannot go through.
  NumPy and torch loop in Python and simply stop at the last visible block.)
- ``scan`` wants every block the same size, and nothing is padded: the last block, when the
  block size does not divide the length, is shifted back to end at L (or S). Its first rows are
  then computed twice, to the same values, and written once; its first keys were counted by the
  block before it, and are masked out of this one (step 5, tiling).
- Everything is pure: jit with the static keywords of :data:`STATIC_ARGNAMES`::

      flash = jax.jit(flash_attention, static_argnames=STATIC_ARGNAMES)

  Under ``jax.grad`` the scans keep each step's intermediates for the backward pass, so the
  memory saving is the forward's; a backward that recomputes blocks from the returned ``lse``
  (``jax.custom_vjp``) is what FlashAttention adds on top, and is not here.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim; ``bq`` and ``bk`` are the rows and keys of one block
(``min(block_q, L)``, ``min(block_k, S)``). In einsum strings, ``l`` and ``s`` are a block's rows
and keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attention_spec import (
    BLOCK_K,
    BLOCK_Q,
    AttentionDims,
    causal_offset,
    check_attention,
    check_block_sizes,
    check_flag,
)
from attention_spec.rules import alibi, block_rules
from impl_jax.functional import (
    _PRECISION,
    _V2_ARRAYS,
    _allowed,
    _as_given,
    _asarray,
    _attended,
    _cast,
    _check_x64,
    _compute_dtype,
    _unattended_zeroed,
)
from impl_jax.functional import STATIC_ARGNAMES as _SDPA_STATIC_ARGNAMES

__all__ = ["BLOCK_K", "BLOCK_Q", "STATIC_ARGNAMES", "flash_attention"]

#: The keywords to mark static under ``jax.jit``: those of ``scaled_dot_product_attention`` and
#: the block sizes and ``return_lse``, which decide the shapes and loops XLA compiles.
STATIC_ARGNAMES: tuple[str, ...] = (*_SDPA_STATIC_ARGNAMES, "block_q", "block_k", "return_lse")


def _block(x: jax.Array | None, axis: int, start: jax.Array, size: int) -> jax.Array | None:
    """``x[start:start + size]`` along ``axis`` (-2: L, -1: S) of a mask or bias, which
    broadcasts to ``(..., H, L, S)``: an axis of size 1, or one it lacks, is left as it is and
    broadcasts. ``start`` is traced; ``size`` is static."""
    if x is None or x.ndim < -axis or x.shape[axis] == 1:
        return x
    return jax.lax.dynamic_slice_in_dim(x, start, size, axis=x.ndim + axis)


def _attend_block(
    carry, q_blk, k_blk, v_blk, bias_blk, mask_blk, q_ids, kv_ids, slopes, i, j, j0, *,
    dims: AttentionDims, offset: int,
):  # fmt: skip
    """Steps 1-6 for one block of query rows ``i`` ``(bq, 1)`` against one block of keys ``j``
    ``(1, bk)``, of which those below ``j0`` are not this block's: ``(m, l, acc)`` in and out."""
    m, l, acc = carry  # (..., H, bq, 1), (..., H, bq, 1), (..., H, bq, E)
    H, K, G = dims.H, dims.K, dims.G
    bq, bk = q_blk.shape[-2], k_blk.shape[-2]

    # 4. allowed, this block: mask AND causal AND window AND segment (all True inside every
    #    band), and only the keys from j0 on (tiling: a last block shifted back to end at S
    #    shares its keys below j0 with the block before it, which counted them already).
    allowed = _allowed(dims, offset, i, j, mask_blk, q_ids, kv_ids)
    allowed = j >= j0 if allowed is None else allowed & (j >= j0)  # (..., bq, bk)
    attended = _attended(allowed, bias_blk, (*dims.batch, H, bq, bk), K)  # (..., K, bk)
    k_blk = _unattended_zeroed(k_blk, attended)  # (..., K, bk, D)
    v_blk = _unattended_zeroed(v_blk, attended)  # (..., K, bk, E)

    # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G.
    s = jnp.einsum("...kgld,...ksd->...kgls", q_blk, k_blk, precision=_PRECISION)
    s = s.reshape(*s.shape[:-4], H, bq, bk) * dims.scale  # (..., H, bq, bk); h reads kv h // G

    # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
    if dims.softcap is not None:
        s = dims.softcap * jnp.tanh(s / dims.softcap)

    # 3. additive terms: this block's slice of the bias, may hold -inf, and ALiBi's
    #    -slope[h] * |i + offset - j| at this block's rows and keys.
    if bias_blk is not None:
        s = s + bias_blk
    if slopes is not None:
        s = s + alibi(slopes[:, None, None], i, j, offset)  # (H, bq, bk)

    # 4. allowed: s = -inf where allowed(i, j) is False, in this block.
    s = jnp.where(allowed, s, -jnp.inf)
    s = jnp.broadcast_to(s, (*dims.batch, H, bq, bk))  # a value with more batch than query, key

    # 5. online softmax: raise the running max, rescale what was summed under the old one by
    #    exp(m_old - m_new), add this block's exp(s - m_new).
    m_new = jnp.maximum(m, jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True)))
    shift = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # nothing allowed yet: exp(-inf) = 0
    alpha = jnp.exp(m - shift)  # (..., H, bq, 1); 0 while m is still -inf
    s = s - shift
    p = jnp.exp(jnp.where(s > 0.0, 0.0, s))  # (..., H, bq, bk); exp(s - max) <= 1
    l = alpha * l + jnp.sum(p, axis=-1, keepdims=True)

    # 6. output, accumulated: acc = alpha * acc + p @ value, per group.
    p = p.reshape(*dims.batch, K, G, bq, bk)  # (..., K, G, bq, bk)
    pv = jnp.einsum("...kgls,...kse->...kgle", p, v_blk, precision=_PRECISION)
    acc = alpha * acc + pv.reshape(*dims.batch, H, bq, dims.E)  # (..., H, bq, E)
    return m_new, l, acc


def flash_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    sinks: jax.Array | None = None,
    alibi_slopes: jax.Array | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    return_lse: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """``scaled_dot_product_attention`` computed block by block, shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in
            :func:`impl_jax.functional.attention_weights`.
        block_q: query rows per block (any integer >= 1; it need not divide L, and may exceed it).
        block_k: keys per block (likewise for S).
        return_lse: also return the row log-sum-exp of the final scores (after softcap, the
            additive terms and every rule, the sink included), ``lse = log(sum_j exp(s_ij)
            [+ exp(sink)])`` of shape ``(..., H, L)`` in the compute dtype (float64 for float64
            input, else float32); ``-inf`` for a row with no allowed key. It is what a backward
            pass needs to rebuild the weights: ``exp(s - lse)``.

    Returns the output in the query's dtype (rows with no allowed key are zeros, with zero
    gradient), or ``(output, lse)`` when ``return_lse``. Key blocks outside the causal and
    window bands, and blocks whose segments cannot meet, are skipped (``jax.lax.cond``).

    Raises the errors of ``scaled_dot_product_attention``, and ConfigError for a block size < 1.
    """
    query, key, value = _as_given(query), _as_given(key), _as_given(value)
    mask, bias = _as_given(mask), _as_given(bias)
    values = (q_segment_ids, kv_segment_ids, sinks, alibi_slopes)
    kw = {name: _as_given(x) for name, x in zip(_V2_ARRAYS, values)}
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
        **kw,
    )
    check_block_sizes(block_q, block_k)
    return_lse = check_flag("return_lse", return_lse)
    _check_x64(query)
    query, key, value = _asarray(query), _asarray(key), _asarray(value)
    mask, bias = _asarray(mask), _asarray(bias)
    q_ids, kv_ids, sinks, slopes = (_asarray(kw[name]) for name in _V2_ARRAYS)
    ct = _compute_dtype(query.dtype)
    H, K, G, L, S, D, E = dims.H, dims.K, dims.G, dims.L, dims.S, dims.D, dims.E
    offset = causal_offset(L, S, causal_alignment)  # query i sees key j iff j <= i + offset
    if L == 0 or S == 0:  # no block to scan: no rows, or no keys (every row fully masked)
        out = jnp.zeros((*dims.batch, H, L, E), query.dtype)
        lse = jnp.full((*dims.batch, H, L), -jnp.inf, ct)
        return (out, lse) if return_lse else out

    q = query.astype(ct).reshape(*query.shape[:-3], K, G, L, D)  # (..., K, G, L, D)
    k = key.astype(ct)  # (..., K, S, D)
    v = value.astype(ct)  # (..., K, S, E)
    bias, sinks, slopes = _cast(bias, ct), _cast(sinks, ct), _cast(slopes, ct)
    bq, bk = min(block_q, L), min(block_k, S)
    n_q, n_k = -(-L // bq), -(-S // bk)  # blocks of query rows, blocks of keys
    step = dict(dims=dims, offset=offset)

    def query_block(_, t):
        """Query rows ``t * bq ..`` (the last block shifted back to end at L): steps 1-6."""
        i0 = jnp.minimum(t * bq, L - bq)  # first row
        q_blk = jax.lax.dynamic_slice_in_dim(q, i0, bq, axis=q.ndim - 2)  # (..., K, G, bq, D)
        i = (i0 + jnp.arange(bq))[:, None]  # (bq, 1)
        bias_rows = _block(bias, -2, i0, bq)  # this block's rows of bias and mask
        mask_rows = _block(mask, -2, i0, bq)
        q_ids_rows = _block(q_ids, -1, i0, bq)  # (..., bq): this block's rows' segments

        # 4. allowed, whole blocks: the key blocks start at the first key of the window's band
        #    (the keys before it are masked for every row), so a band of bk keys is one block.
        lo = 0
        if dims.window is not None and dims.window[0] is not None:
            lo = jnp.clip(i0 + offset - dims.window[0], 0, S)

        def key_block(carry, u):
            """Keys ``lo + u * bk ..`` (the last block shifted back to end at S)."""
            j0 = lo + u * bk  # first key this block counts
            j_start = jnp.minimum(j0, S - bk)  # first key it holds
            j = (j_start + jnp.arange(bk))[None, :]  # (1, bk)
            kv_ids_blk = _block(kv_ids, -1, j_start, bk)  # (..., bk)
            blk = (
                q_blk,
                jax.lax.dynamic_slice_in_dim(k, j_start, bk, axis=k.ndim - 2),  # (..., K, bk, D)
                jax.lax.dynamic_slice_in_dim(v, j_start, bk, axis=v.ndim - 2),  # (..., K, bk, E)
                _block(bias_rows, -1, j_start, bk),
                _block(mask_rows, -1, j_start, bk),
                q_ids_rows, kv_ids_blk, slopes, i, j, j0,
            )  # fmt: skip
            # 4. allowed, whole blocks: a key block outside the causal and window bands of these
            #    rows, or whose segments cannot meet theirs, is masked for every row: skipped.
            if not (dims.is_causal or dims.window is not None or q_ids is not None):
                return _attend_block(carry, *blk, **step), None
            some, _ = block_rules(dims.is_causal, dims.window, offset, i0, i0 + bq, j0,
                                  j_start + bk, q_ids_rows, kv_ids_blk)  # fmt: skip
            some = some & (j0 < S)  # past the last key: the band started late, nothing left

            def attend(c):
                return _attend_block(c, *blk, **step)

            return jax.lax.cond(some, attend, lambda c: c, carry), None

        m = jnp.full((*dims.batch, H, bq, 1), -jnp.inf, ct)  # running row max of the scores
        l = jnp.zeros((*dims.batch, H, bq, 1), ct)  # running row sum of exp(s - m)
        acc = jnp.zeros((*dims.batch, H, bq, E), ct)  # running sum of exp(s - m) @ value
        (m, l, acc), _ = jax.lax.scan(key_block, (m, l, acc), jnp.arange(n_k))

        # 5. (end) the sink joins the denominator once, as one more logit with no value; then
        #    divide by the row sum once, after the last key block. A row with no allowed key
        #    has l = 0 and acc = 0: 0 / 1 = 0 (sink or not), and its log-sum-exp is -inf.
        empty = l == 0.0  # (..., H, bq, 1): rows that saw no allowed key
        if sinks is not None:
            m_sink = jnp.maximum(m, jax.lax.stop_gradient(sinks)[:, None, None])
            shift = jnp.where(jnp.isfinite(m_sink), m_sink, 0.0)
            alpha = jnp.exp(m - shift)
            sink = sinks[:, None, None] - shift
            l = alpha * l + jnp.exp(jnp.where(sink > 0.0, 0.0, sink))
            acc, m = alpha * acc, m_sink
        l = jnp.where(empty, 1.0, l)
        row_lse = jnp.where(empty, -jnp.inf, m + jnp.log(l))[..., 0]  # (..., H, bq)
        return None, (acc / l, row_lse)  # (..., H, bq, E), (..., H, bq)

    _, (outs, lses) = jax.lax.scan(query_block, None, jnp.arange(n_q))  # (n_q, ..., H, bq, .)
    # The blocks in row order: the last one holds rows L - bq .. L, of which the first `drop`
    # are already in the block before it.
    drop = n_q * bq - L
    out = jnp.moveaxis(outs[:-1], 0, -3).reshape(*dims.batch, H, (n_q - 1) * bq, E)
    out = jnp.concatenate([out, outs[-1][..., drop:, :]], axis=-2)  # (..., H, L, E)
    lse = jnp.moveaxis(lses[:-1], 0, -2).reshape(*dims.batch, H, (n_q - 1) * bq)
    lse = jnp.concatenate([lse, lses[-1][..., drop:]], axis=-1)  # (..., H, L), compute dtype
    out = out.astype(query.dtype)  # back to the input dtype
    return (out, lse) if return_lse else out
