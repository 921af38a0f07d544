"""Tiled online-softmax ("flash") attention in JAX: ``jax.lax`` loops over blocks, a custom vjp.

Why one file of ~830 lines (its NumPy and torch texts have ~560 and ~600): the forward, its
``custom_vjp`` and the backward's two scans must change together, and the structures they hand
each other (``_Block``, ``_RowGrads``, ``_Arrays``, ``_Tiling``) are what the extra lines are.
Split in two, a reader would follow one computation across files.

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
side by side and gives the measured memory and time. Where JAX's idiom shapes the code:

- Loops: the query blocks are a ``jax.lax.scan`` (:func:`_forward`, :func:`_backward`), so XLA
  compiles a few loop bodies of one block each, whatever L and S are; the key blocks of a block
  of rows are :func:`_key_blocks`'s loops, which visit only the blocks some row may see.
- Static shapes: nothing is padded. A last block that does not fit is shifted back to end at L
  (or S): the rows it repeats are written once (and get a zero cotangent in the backward), the
  keys it repeats are masked (``j >= j0``), so nothing is counted twice.
- Pure functions: jit with the static keywords of :data:`STATIC_ARGNAMES`::

      flash = jax.jit(flash_attention, static_argnames=STATIC_ARGNAMES)

- Training: a ``jax.custom_vjp`` (:func:`_flash`) keeps its inputs, its output and the row
  log-sum-exp ``lse``; its backward is FlashAttention-2's (Algorithm 2, in the forward's loop
  order), which visits the blocks the forward visits, rebuilds each block's weights as
  ``P = exp(S - lse)`` and accumulates ``dQ``, ``dK`` and ``dV``: O(L + S) memory beyond inputs,
  output and gradients, plus one block.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim; ``bq`` and ``bk`` are the rows and keys of one block
(``min(block_q, L)``, ``min(block_k, S)``). In einsum strings, ``l`` and ``s`` are a block's rows
and keys.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

from attention_spec import (
    BLOCK_K,
    BLOCK_Q,
    AttentionCall,
    AttentionGrads,
    check_attention,
    check_flag,
    check_paged_attention,
    sequence_pages,
    tiled_blocks,
)
from attention_spec.rules import alibi, block_rules, causal
from attention_spec.rules import window as window_rule
from impl_jax.functional import (
    _PRECISION,
    _allowed,
    _as_given,
    _asarray,
    _attended,
    _cast,
    _check_x64,
    _compute_dtype,
    _converted,
    _dequantized,
    _on_device,
    _output_dtype,
    _unattended_zeroed,
    _vjp_by_jax,
)
from impl_jax.functional import STATIC_ARGNAMES as _SDPA_STATIC_ARGNAMES
from impl_jax.paged import _descaled

__all__ = [
    "BLOCK_K",
    "BLOCK_Q",
    "STATIC_ARGNAMES",
    "flash_attention",
    "flash_attention_vjp",
    "paged_flash_attention",
]

#: The keywords to mark static under ``jax.jit``: those of ``scaled_dot_product_attention`` and
#: the block sizes and ``return_lse``, which decide the shapes and loops XLA compiles.
STATIC_ARGNAMES: tuple[str, ...] = (*_SDPA_STATIC_ARGNAMES, "block_q", "block_k", "return_lse")

#: The blocks of a narrow band, ``(rows, widest)``, for ``attention_spec.tiled_blocks``: a call
#: whose causal and window bands leave each query row at most ``left + 1 + right`` keys, with
#: ``64 + left + right <= 256``, is tiled in blocks of 64 rows and their band's keys. JAX's loop
#: pays per step more than per score, so only bands of up to 256 keys get the smaller blocks
#: (the timings: docs/FLASH.md, "Block sizes").
BAND_BLOCKS: tuple[int, int] = (64, 256)


def _block(x: jax.Array | None, axis: int, start: jax.Array, size: int) -> jax.Array | None:
    """``x[start:start + size]`` along ``axis`` (-2: L, -1: S) of a mask or bias, which
    broadcasts to ``(..., H, L, S)``: an axis of size 1, or one it lacks, is left as it is and
    broadcasts. ``start`` is traced; ``size`` is static."""
    if x is None or x.ndim < -axis or x.shape[axis] == 1:
        return x
    return jax.lax.dynamic_slice_in_dim(x, start, size, axis=x.ndim + axis)


class _Block(NamedTuple):
    """One block of query rows against one block of keys, as its steps 1-6 read it (a pytree;
    None where not given): the rows' queries ``q (..., K, G, bq, D)``, the block's keys
    ``k (..., K, bk, D)`` and values ``v (..., K, bk, E)``, its slices of bias and mask
    (broadcastable to ``(..., H, bq, bk)``), the rows' and keys' segment ids ``(..., bq)``,
    ``(..., bk)``, the ALiBi slopes ``(H,)``, the rows ``i (bq, 1)`` and keys ``j (1, bk)`` in
    the sequence, and ``j0``, the first key the block counts (those below it are not its own)."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    bias: jax.Array | None
    mask: jax.Array | None
    q_ids: jax.Array | None
    kv_ids: jax.Array | None
    slopes: jax.Array | None
    i: jax.Array
    j: jax.Array
    j0: jax.Array


class _RowGrads(NamedTuple):
    """What the backward of a block of query rows reads besides its :class:`_Block`, each
    ``(..., K, G, bq, .)``: the output's cotangent ``do`` (``E``), ``delta = rowsum(dO * O)``
    and the rows' log-sum-exp ``shift`` (``1``; 0 for a row with no key)."""

    do: jax.Array
    delta: jax.Array
    shift: jax.Array


def _block_scores(blk: _Block, *, call: AttentionCall, bands: bool):
    """Steps 1-4 for one block of query rows ``blk.i`` ``(bq, 1)`` against one block of keys
    ``blk.j`` ``(1, bk)``, of which those below ``blk.j0`` are not this block's. Returns
    ``s (..., H, bq, bk)`` (-inf where not allowed), the attended mask of the block's key/value
    rows ``(..., K, bk)`` (or None), and ``tanh(s1 / softcap)`` of the step-1 scores (or None).
    ``bands=False`` (static): the causal and window rules allow every position of the block and
    it starts at ``j0``, so only mask and segments are applied elementwise (:func:`_key_blocks`)."""
    H, K = call.H, call.K
    i, j = blk.i, blk.j
    bq, bk = blk.q.shape[-2], blk.k.shape[-2]

    # 4. allowed, this block: the rules a boundary crosses, elementwise (mask AND causal AND
    #    window AND segment; a block inside every band needs none of the bands), and only the
    #    keys from j0 on (tiling: a block shifted back to end at the band's or the keys' end
    #    shares its keys below j0 with the block before it, which counted them already).
    allowed = _allowed(call, call.offset, i, j, blk.mask, blk.q_ids, blk.kv_ids, bands=bands)
    if bands:
        allowed = j >= blk.j0 if allowed is None else allowed & (j >= blk.j0)  # (..., bq, bk)
    attended = _attended(allowed, blk.bias, (*call.batch, H, bq, bk), K)  # (..., K, bk)
    k_blk = _unattended_zeroed(blk.k, attended)  # (..., K, bk, D)

    # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G. The scale
    #    goes on the block's queries: XLA would recompute s * scale inside each of its readers,
    #    the row max rounded and s - max as one unrounded FMA, which at logits of 1e10 differ
    #    by hundreds (exp of that: 0, a row of zeros); the matmul's output is read as it is.
    s = jnp.einsum("...kgld,...ksd->...kgls", blk.q * call.scale, k_blk, precision=_PRECISION)
    s = s.reshape(*s.shape[:-4], H, bq, bk)  # (..., H, bq, bk); h reads kv h // G

    # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
    tanh = None
    if call.softcap is not None:
        tanh = jnp.tanh(s / call.softcap)
        s = call.softcap * tanh

    # 3. additive terms: this block's slice of the bias, may hold -inf, and ALiBi's
    #    -slope[h] * |i + offset - j| at this block's rows and keys.
    if blk.bias is not None:
        s = s + blk.bias
    if blk.slopes is not None:
        s = s + alibi(blk.slopes[:, None, None], i, j, call.offset)  # (H, bq, bk)

    # 4. allowed: s = -inf where allowed(i, j) is False, in this block.
    if allowed is not None:
        s = jnp.where(allowed, s, -jnp.inf)
    s = jnp.broadcast_to(s, (*call.batch, H, bq, bk))  # a value with more batch than query, key
    return s, attended, tanh


def _attend_block(carry, blk: _Block, *, call: AttentionCall, bands: bool = True):
    """Steps 1-6 for one block of query rows against one block of keys: ``(m, l, acc)`` in and
    out."""
    m, l, acc = carry  # (..., H, bq, 1), (..., H, bq, 1), (..., H, bq, E)
    H, K, G = call.H, call.K, call.G
    bq, bk = blk.q.shape[-2], blk.k.shape[-2]

    # 1.-4. this block's scores (_block_scores: the steps written out, as in sdpa)
    s, attended, _ = _block_scores(blk, call=call, bands=bands)  # (..., H, bq, bk)
    v_blk = _unattended_zeroed(blk.v, attended)  # (..., K, bk, E)

    # 5. online softmax: raise the running max, rescale what was summed under the old one by
    #    exp(m_old - m_new), add this block's exp(s - m_new).
    m_new = jnp.maximum(m, jnp.max(s, axis=-1, keepdims=True))  # (..., H, bq, 1)
    shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # nothing allowed yet: not NaN
    alpha = jnp.exp(m - shift)  # (..., H, bq, 1); 0 while m is still -inf
    s = s - shift
    s = jnp.minimum(s, 0.0)  # exp(s - max) <= 1 even if s was rounded differently
    p = jnp.exp(s)  # (..., H, bq, bk), unnormalized weights
    l = alpha * l + jnp.sum(p, axis=-1, keepdims=True)

    # 6. output, accumulated: acc = alpha * acc + p @ value, per group.
    p = p.reshape(*call.batch, K, G, bq, bk)  # (..., K, G, bq, bk)
    pv = jnp.einsum("...kgls,...kse->...kgle", p, v_blk, precision=_PRECISION)
    acc = alpha * acc + pv.reshape(*call.batch, H, bq, call.E)  # (..., H, bq, E)
    return m_new, l, acc


def _grad_block(carry, blk: _Block, *, rows: _RowGrads, call: AttentionCall, bands: bool = True):
    """The backward of one block (FlashAttention-2): ``(dq_blk, dk, dv, dbias)`` in and out;
    ``rows`` holds the block of rows' ``do``, ``delta`` and ``shift``; the block's keys start at
    ``blk.j[0, 0]``."""
    dq_blk, dk, dv, dbias = carry  # (..., K, G, bq, D), (..., K, S, D), (..., K, S, E), bias's
    H, K, G = call.H, call.K, call.G
    bq, bk = blk.q.shape[-2], blk.k.shape[-2]
    j_start = blk.j[0, 0]

    # 1.-4. this block's scores, as the forward made them
    s, attended, tanh = _block_scores(blk, call=call, bands=bands)  # (..., H, bq, bk)
    k_blk = _unattended_zeroed(blk.k, attended)  # (..., K, bk, D)
    v_blk = _unattended_zeroed(blk.v, attended)  # (..., K, bk, E)

    # 5. the block's weights, rebuilt from the row log-sum-exp: P = exp(S - lse).
    s = s.reshape(*call.batch, K, G, bq, bk) - rows.shift
    s = jnp.minimum(s, 0.0)  # P <= 1 even if S was rounded differently
    p = jnp.exp(s)  # (..., K, G, bq, bk)

    # 6. output:  dV += P^T dO (summed over the group);  dP = dO V^T.
    dv_blk = jnp.einsum("...kgls,...kgle->...kse", p, rows.do, precision=_PRECISION)
    dv = _add_rows(dv, dv_blk, j_start)  # (..., K, S, E)
    dp = jnp.einsum("...kgle,...kse->...kgls", rows.do, v_blk, precision=_PRECISION)

    # 5. softmax:  dS = P * (dP - D); zero wherever P is (masked, -inf bias, no key).
    ds = p * (dp - rows.delta)  # (..., K, G, bq, bk)

    # 3. additive terms:  dbias += dS, summed to the bias block's shape.
    if dbias is not None:
        ds_h = ds.reshape(*call.batch, H, bq, bk)  # (..., H, bq, bk)
        dbias = _add_block(dbias, _sum_to(ds_h, blk.bias.shape), blk.i[0, 0], j_start)

    # 2. softcap:  dS *= 1 - tanh^2(s / softcap).
    if tanh is not None:
        ds = ds * (1.0 - tanh * tanh).reshape(*tanh.shape[:-3], K, G, bq, bk)

    # 1. scores:  dQ += dS K * scale;  dK += dS^T Q * scale (summed over the group).
    dq_blk = dq_blk + call.scale * jnp.einsum(
        "...kgls,...ksd->...kgld", ds, k_blk, precision=_PRECISION
    )
    dk_blk = jnp.einsum("...kgls,...kgld->...ksd", ds, blk.q, precision=_PRECISION)
    dk = _add_rows(dk, call.scale * dk_blk, j_start)  # (..., K, S, D)
    return dq_blk, dk, dv, dbias


def _sum_to(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``x`` summed over the axes it was broadcast along to come from ``shape``."""
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead > 0 else x
    axes = tuple(a for a, n in enumerate(shape) if n == 1 and x.shape[a] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def _add_rows(x: jax.Array, update: jax.Array, start: jax.Array) -> jax.Array:
    """``x[..., start:start + n, :] += update`` (``update (..., n, X)``; start traced)."""
    starts = [0] * (x.ndim - 2) + [start, 0]
    current = jax.lax.dynamic_slice(x, starts, update.shape)
    return jax.lax.dynamic_update_slice(x, current + update, starts)


def _add_block(x: jax.Array, update: jax.Array, i0: jax.Array, j0: jax.Array) -> jax.Array:
    """``x[..., i0:i0+bq, j0:j0+bk] += update`` on a mask or bias that broadcasts to
    ``(..., H, L, S)``: an axis of size 1 (or one it lacks) is added to whole, as :func:`_block`
    reads it."""
    starts = [0] * x.ndim
    if x.ndim >= 2 and x.shape[-2] != 1:
        starts[-2] = i0
    if x.ndim >= 1 and x.shape[-1] != 1:
        starts[-1] = j0
    current = jax.lax.dynamic_slice(x, starts, update.shape)
    return jax.lax.dynamic_update_slice(x, current + update, starts)


@dataclasses.dataclass(frozen=True)
class _Tiling:
    """What a call's loops need besides its arrays (static under jit): the validated call (its
    sizes, causal offset and keywords), the block sizes, and the number of blocks each way."""

    call: AttentionCall
    bq: int
    bk: int

    @property
    def n_q(self) -> int:
        return -(-self.call.L // self.bq)

    @property
    def n_k(self) -> int:
        return -(-self.call.S // self.bk)

    @property
    def n_band(self) -> int:
        """Key blocks a block of rows can visit: a window bounded on the left, with causal or a
        bounded right side, reaches at most ``bq + left + right`` keys (right: 0 with causal)
        from the band's first key, where the blocks start; otherwise every block, ``n_k``."""
        window = self.call.window
        if window is None or window[0] is None:
            return self.n_k
        right = 0 if self.call.is_causal else window[1]
        if right is None:
            return self.n_k
        return min(self.n_k, -(-(self.bq + window[0] + right) // self.bk))

    @property
    def diagonal(self) -> bool:
        """Causal without a window: every key block left of a row block's diagonal is allowed
        to all its rows, and only the blocks the diagonal crosses need the causal rule."""
        return self.call.is_causal and self.call.window is None

    @property
    def bn(self) -> int:
        """Keys per block across the causal diagonal, which crosses ``bq - 1`` keys of a block
        of rows: ``bq`` (so the masked blocks cover the triangle, not ``bk`` keys past it), at
        most ``bk``, and at least ``bk / 4`` (a few rows do not take ``bk`` one-key steps)."""
        return min(self.bk, max(self.bq, -(-self.bk // 4)))


def _key_blocks(tiling: _Tiling, carry, step, blk_of, i0, q_ids_rows, kv_ids):
    """The inner loop over key blocks for the rows ``i0 .. i0 + bq``: ``carry`` in and out.

    ``step(carry, blk_of(j_start, size, j, j0, kv_ids_blk), bands=...)`` is one block of
    ``size`` keys from ``j_start`` (``j (1, size)``, its :class:`_Block`), counting those from
    ``j0`` on."""
    call, bk, S = tiling.call, tiling.bk, tiling.call.S
    # 4. allowed, whole blocks: only the key blocks some row may see are visited, and only those
    #    a boundary crosses are masked elementwise. Causal: the blocks every row sees, then the
    #    diagonal's; no band: every block; a window: from the band's first key, the steps a band
    #    can need. A block outside the bands, or whose segments cannot meet, is skipped.

    def visit(carry, j0, j_start, size: int, bands: bool, skips: bool):
        """One block, run through ``step`` unless every one of its positions is outside the
        bands or segments of the rows (4. allowed, whole blocks: skipped with ``lax.cond``;
        its keys are sliced only in the branch that runs)."""
        j = (j_start + jnp.arange(size))[None, :]  # (1, size)
        kv_ids_blk = _block(kv_ids, -1, j_start, size)  # (..., size)

        def run(c):
            return step(c, blk_of(j_start, size, j, j0, kv_ids_blk), bands=bands)

        if not (skips or q_ids_rows is not None):
            return run(carry)
        some, _ = block_rules(call.is_causal, call.window, tiling.call.offset, i0, i0 + tiling.bq,
                              j0, j_start + size, q_ids_rows, kv_ids_blk)
        some = some & (j0 < S)  # past the last key: the band started late, nothing left
        return jax.lax.cond(some, run, lambda c: c, carry)

    if tiling.diagonal:
        # Causal, no window: rows i0 .. i0 + bq see every key before `every` and none from
        # `hi` on. The blocks of bk keys before `every` are visited unmasked; from the last of
        # them to `hi`, blocks of bn keys are masked elementwise, the last one shifted back to
        # end at `hi`. Nothing past the diagonal is visited: the trip counts depend on i0
        # (`fori_loop` with traced bounds, a `while_loop`; the backward is this file's own, so
        # reverse mode never goes through it).
        every = jnp.clip(i0 + tiling.call.offset + 1, 0, S)  # keys [0, every): allowed to all rows
        hi = jnp.clip(i0 + tiling.bq + tiling.call.offset, 0, S)  # keys [0, hi): to some row
        n_every = every // bk

        def inside(u, c):
            return visit(c, u * bk, u * bk, bk, bands=False, skips=False)

        carry = jax.lax.fori_loop(0, n_every, inside, carry)
        lo, bn = n_every * bk, tiling.bn

        def across(u, c):
            j0 = lo + u * bn  # first key this block counts
            j_start = jnp.maximum(jnp.minimum(j0, hi - bn), 0)  # first key it holds
            return visit(c, j0, j_start, bn, bands=True, skips=False)

        return jax.lax.fori_loop(0, (hi - lo + bn - 1) // bn, across, carry)

    if not call.is_causal and call.window is None:
        # No band: every block of bk keys is visited unmasked, then the last keys (S % bk of
        # them) in a block shifted back to end at S, which masks the keys it shares.
        n_whole = S // bk

        def whole(c, u):
            return visit(c, u * bk, u * bk, bk, bands=False, skips=False), None

        carry = jax.lax.scan(whole, carry, jnp.arange(n_whole))[0]
        if S % bk:
            carry = visit(carry, n_whole * bk, S - bk, bk, bands=True, skips=False)
        return carry

    # A window: the key blocks start at the first key of the window's band (the keys before
    # it are masked for every row), so a band of bk keys is one block; a window's band is a
    # few blocks: the scan takes those steps, not one per key block.
    lo = 0
    if call.window is not None and call.window[0] is not None:
        lo = jnp.clip(i0 + tiling.call.offset - call.window[0], 0, S)

    def band(c, u):
        j0 = lo + u * bk  # first key this block counts
        j_start = jnp.minimum(j0, S - bk)  # first key it holds (the last: shifted to end at S)
        return visit(c, j0, j_start, bk, bands=True, skips=call.window is not None), None

    return jax.lax.scan(band, carry, jnp.arange(tiling.n_band))[0]


def _in_row_order(blocks: jax.Array, tiling: _Tiling) -> jax.Array:
    """``(n_q, ..., bq, X)`` blocks of rows -> ``(..., L, X)``: the last block holds rows
    ``L - bq .. L``, of which the first ``n_q * bq - L`` are already in the block before it."""
    n_q, bq, L = tiling.n_q, tiling.bq, tiling.call.L
    drop = n_q * bq - L
    rows = jnp.moveaxis(blocks[:-1], 0, -3)  # (..., n_q - 1, bq, X)
    rows = rows.reshape(*rows.shape[:-3], (n_q - 1) * bq, rows.shape[-1])
    return jnp.concatenate([rows, blocks[-1][..., drop:, :]], axis=-2)  # (..., L, X)


class _Arrays(NamedTuple):
    """The arrays of one tiled call, a pytree (None where not given): ``query (..., H, L, D)``,
    ``key (..., K, S, D)``, ``value (..., K, S, E)``, ``bias`` (broadcastable to
    ``(..., H, L, S)``) and ``sinks (H,)``, the differentiated ones; ``mask``, the segment ids
    ``q_ids (..., L)`` and ``kv_ids (..., S)``, and ALiBi's ``slopes (H,)``. :func:`_flash`
    takes them as given; :func:`_in_compute_dtype` makes what the loops read."""

    query: jax.Array
    key: jax.Array
    value: jax.Array
    bias: jax.Array | None
    sinks: jax.Array | None
    mask: jax.Array | None
    q_ids: jax.Array | None
    kv_ids: jax.Array | None
    slopes: jax.Array | None


def _arrays(query, key, value, keywords: Mapping[str, jax.Array | None]) -> _Arrays:
    """The :class:`_Arrays` of a call: query, key, value and its array ``keywords`` by name."""
    return _Arrays(
        query, key, value, keywords["bias"], keywords["sinks"], keywords["mask"],
        keywords["q_segment_ids"], keywords["kv_segment_ids"], keywords["alibi_slopes"],
    )


def _in_compute_dtype(x: _Arrays, call: AttentionCall) -> _Arrays:
    """``x`` as the loops read it: query grouped as ``(..., K, G, L, D)``, and query, key,
    value, bias, sinks and slopes in the compute dtype (mask and segment ids as they are)."""
    ct = _compute_dtype(x.query.dtype)
    q = x.query.astype(ct).reshape(*x.query.shape[:-3], call.K, call.G, call.L, call.D)
    return x._replace(
        query=q, key=x.key.astype(ct), value=x.value.astype(ct), bias=_cast(x.bias, ct),
        sinks=_cast(x.sinks, ct), slopes=_cast(x.slopes, ct),
    )


def _row_blocks(x: _Arrays, q_blk, i, i0, bq: int):
    """One block of query rows, ``q_blk (..., K, G, bq, D)`` at rows ``i (bq, 1)`` from ``i0``:
    ``(blk_of, q_ids_rows)``. ``blk_of(j_start, size, j, j0, kv_ids_blk)`` is the
    :class:`_Block` of these rows and the ``size`` keys from ``j_start`` (bk or bn keys), the
    same in the forward and the backward; ``q_ids_rows (..., bq)``: these rows' segments."""
    bias_rows = _block(x.bias, -2, i0, bq)  # this block's rows of bias and mask
    mask_rows = _block(x.mask, -2, i0, bq)
    q_ids_rows = _block(x.q_ids, -1, i0, bq)  # (..., bq): this block's rows' segments
    k, v = x.key, x.value

    def blk_of(j_start, size, j, j0, kv_ids_blk):
        return _Block(
            q=q_blk,
            k=jax.lax.dynamic_slice_in_dim(k, j_start, size, k.ndim - 2),  # (..., K, bk, D)
            v=jax.lax.dynamic_slice_in_dim(v, j_start, size, v.ndim - 2),  # (..., K, bk, E)
            bias=_block(bias_rows, -1, j_start, size),
            mask=_block(mask_rows, -1, j_start, size),
            q_ids=q_ids_rows, kv_ids=kv_ids_blk, slopes=x.slopes, i=i, j=j, j0=j0,
        )

    return blk_of, q_ids_rows


def _forward(x: _Arrays, tiling: _Tiling):
    """The tiled forward: ``(output (..., H, L, E), lse (..., H, L))`` in the compute dtype.
    ``x``: :func:`_in_compute_dtype`'s, ``x.query (..., K, G, L, D)``, ``x.key (..., K, S, D)``,
    ``x.value (..., K, S, E)``."""
    call, bq = tiling.call, tiling.bq
    H, L, E = call.H, call.L, call.E
    q, sinks = x.query, x.sinks
    ct = q.dtype
    step = functools.partial(_attend_block, call=call)

    def query_block(_, t):
        """Query rows ``t * bq ..`` (the last block shifted back to end at L): steps 1-6."""
        i0 = jnp.minimum(t * bq, L - bq)  # first row
        q_blk = jax.lax.dynamic_slice_in_dim(q, i0, bq, axis=q.ndim - 2)  # (..., K, G, bq, D)
        i = (i0 + jnp.arange(bq))[:, None]  # (bq, 1)
        blk_of, q_ids_rows = _row_blocks(x, q_blk, i, i0, bq)

        m = jnp.full((*call.batch, H, bq, 1), -jnp.inf, ct)  # running row max of the scores
        l = jnp.zeros((*call.batch, H, bq, 1), ct)  # running row sum of exp(s - m)
        acc = jnp.zeros((*call.batch, H, bq, E), ct)  # running sum of exp(s - m) @ value
        m, l, acc = _key_blocks(tiling, (m, l, acc), step, blk_of, i0, q_ids_rows, x.kv_ids)

        # 5. (end) the sink joins the denominator once, as one more logit with no value; then
        #    divide by the row sum once, after the last key block. A row with no allowed key
        #    has l = 0 and acc = 0: 0 / 1 = 0 (sink or not), and its log-sum-exp is -inf.
        empty = l == 0.0  # (..., H, bq, 1): rows that saw no allowed key
        if sinks is not None:
            m_sink = jnp.maximum(m, sinks[:, None, None])  # (..., H, bq, 1)
            shift = jnp.where(m_sink == -jnp.inf, 0.0, m_sink)
            alpha = jnp.exp(m - shift)
            l = alpha * l + jnp.exp(jnp.minimum(sinks[:, None, None] - shift, 0.0))
            acc, m = alpha * acc, m_sink
        l = jnp.where(empty, 1.0, l)
        row_lse = jnp.where(empty, -jnp.inf, m + jnp.log(l))  # (..., H, bq, 1)
        return None, (acc / l, row_lse)  # (..., H, bq, E), (..., H, bq, 1)

    _, (outs, lses) = jax.lax.scan(query_block, None, jnp.arange(tiling.n_q))  # (n_q, ..., bq, .)
    return _in_row_order(outs, tiling), _in_row_order(lses, tiling)[..., 0]


def _backward(x: _Arrays, out, lse, do, tiling: _Tiling):
    """The tiled backward (FlashAttention-2, Algorithm 2, in the forward's loop order):
    ``(dQ (..., H, L, D), dK (..., K, S, D), dV (..., K, S, E), dbias (the bias's shape) or
    None, dsinks (H,) or None)`` in the compute dtype, at the call's batch; ``x`` as in
    :func:`_forward`.

    For each block of query rows, ``D_i = rowsum(dO_i * O_i)``; for each key block the forward
    visited, ``P = exp(S - lse)``, ``dV += P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - D)``,
    ``dQ += dS K``, ``dK += dS^T Q`` (:func:`_grad_block`)."""
    call, bq = tiling.call, tiling.bq
    H, K, G, L, S, D, E = call.H, call.K, call.G, call.L, call.S, call.D, call.E
    q, sinks = x.query, x.sinks
    ct = q.dtype

    def query_block(carry, t):
        """Query rows ``t * bq ..``; the rows below ``t * bq`` that the shifted last block
        repeats get a zero cotangent, so they add nothing twice."""
        dk, dv, dbias, dsinks = carry
        i0 = jnp.minimum(t * bq, L - bq)  # first row
        q_blk = jax.lax.dynamic_slice_in_dim(q, i0, bq, axis=q.ndim - 2)  # (..., K, G, bq, D)
        i = (i0 + jnp.arange(bq))[:, None]  # (bq, 1)
        fresh = i >= t * bq  # (bq, 1): the rows this block counts
        do_blk = jax.lax.dynamic_slice_in_dim(do, i0, bq, axis=do.ndim - 2)  # (..., H, bq, E)
        do_blk = jnp.where(fresh, do_blk, 0.0).reshape(*call.batch, K, G, bq, E)
        o_blk = jax.lax.dynamic_slice_in_dim(out, i0, bq, axis=out.ndim - 2)
        o_blk = o_blk.reshape(*call.batch, K, G, bq, E)
        delta = jnp.sum(do_blk * o_blk, axis=-1, keepdims=True)  # (..., K, G, bq, 1)
        row_lse = jax.lax.dynamic_slice_in_dim(lse, i0, bq, axis=lse.ndim - 1)  # (..., H, bq)
        shift = jnp.where(row_lse == -jnp.inf, 0.0, row_lse)[..., None]  # no key: P = 0
        blk_of, q_ids_rows = _row_blocks(x, q_blk, i, i0, bq)

        # 5. (end) the sink: dsink_h = -sum_i w_sink,i (dO_i . O_i), w_sink,i = exp(sink - lse_i).
        if sinks is not None:
            w_sink = jnp.exp(jnp.minimum(sinks[:, None, None] - shift, 0.0))  # (..., H, bq, 1)
            per_row = -(w_sink * delta.reshape(w_sink.shape))[..., 0]  # (..., H, bq)
            dsinks = dsinks + per_row.sum(axis=(*range(per_row.ndim - 2), -1))  # (H,)

        rows = _RowGrads(do_blk, delta, shift.reshape(*call.batch, K, G, bq, 1))
        step = functools.partial(_grad_block, rows=rows, call=call)
        dq_blk = jnp.zeros((*call.batch, K, G, bq, D), ct)  # (..., K, G, bq, D)
        carry = (dq_blk, dk, dv, dbias)
        dq_blk, dk, dv, dbias = _key_blocks(tiling, carry, step, blk_of, i0, q_ids_rows, x.kv_ids)
        return (dk, dv, dbias, dsinks), dq_blk.reshape(*call.batch, H, bq, D)

    dk = jnp.zeros((*call.batch, K, S, D), ct)  # (..., K, S, D), accumulated over query blocks
    dv = jnp.zeros((*call.batch, K, S, E), ct)  # (..., K, S, E), likewise
    dbias = None if x.bias is None else jnp.zeros(x.bias.shape, ct)  # the bias's shape
    dsinks = None if sinks is None else jnp.zeros((H,), ct)
    (dk, dv, dbias, dsinks), dqs = jax.lax.scan(
        query_block, (dk, dv, dbias, dsinks), jnp.arange(tiling.n_q)
    )
    return _in_row_order(dqs, tiling), dk, dv, dbias, dsinks  # dQ: (..., H, L, D)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _flash(x: _Arrays, tiling: _Tiling):
    """``(output, lse)`` in the compute dtype, differentiable in query, key, value, bias and
    sinks through the tiled backward; the residuals are the inputs, the output and ``lse``."""
    return _flash_forward(x, tiling)[0]


def _flash_forward(x: _Arrays, tiling: _Tiling):
    out, lse = _forward(_in_compute_dtype(x, tiling.call), tiling)
    return (out, lse), (x, out, lse)


def _flash_backward(tiling: _Tiling, residuals, cotangents):
    x, out, lse = residuals
    do, _ = cotangents  # lse is not differentiated
    dq, dk, dv, dbias, dsinks = _backward(
        _in_compute_dtype(x, tiling.call), out, lse, do.astype(out.dtype), tiling
    )

    # The gradient of a broadcast input is summed over its broadcast axes; each in its dtype.
    def back(grad, given):
        return None if given is None else _sum_to(grad, given.shape).astype(given.dtype)

    grads = _Arrays(
        query=back(dq, x.query), key=back(dk, x.key), value=back(dv, x.value),
        bias=back(dbias, x.bias), sinks=back(dsinks, x.sinks),
        mask=None, q_ids=None, kv_ids=None, slopes=None,  # not differentiated
    )
    return (grads,)


_flash.defvjp(_flash_forward, _flash_backward)


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
    q_descale: jax.Array | float | None = None,
    k_descale: jax.Array | float | None = None,
    v_descale: jax.Array | float | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
    return_lse: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """``scaled_dot_product_attention`` computed block by block, shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes, q_descale, k_descale, v_descale: as in
            :func:`impl_jax.functional.scaled_dot_product_attention` (fp8 inputs,
            Contract v3: dequantized first, step 0; the output of an fp8 query is bfloat16).
        block_q: query rows per block (any integer >= 1; it need not divide L, and may exceed it);
            None: the default, ``attention_spec.tiled_blocks``: ``BLOCK_Q``, or fewer rows
            under a narrow window (``BAND_BLOCKS``).
        block_k: keys per block (likewise for S); None: ``BLOCK_K``, or a narrow window's band.
        return_lse: also return the row log-sum-exp of the final scores (after softcap, the
            additive terms and every rule, the sink included), ``lse = log(sum_j exp(s_ij)
            [+ exp(sink)])`` of shape ``(..., H, L)`` in the compute dtype (float64 for float64
            input, else float32); ``-inf`` for a row with no allowed key. It is what a backward
            pass needs to rebuild the weights: ``exp(s - lse)``. It is not differentiated.

    Returns the output in the query's dtype (rows with no allowed key are zeros, with zero
    gradient), or ``(output, lse)`` when ``return_lse``. Key blocks outside the causal and
    window bands, and blocks whose segments cannot meet, are skipped (``jax.lax.cond``).
    Differentiable in query, key, value, bias and sinks through a ``jax.custom_vjp`` whose
    backward is the tiled one, in O(L + S) memory.

    Raises the errors of ``scaled_dot_product_attention``, and ConfigError for a block size < 1.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    call = check_attention(query, key, value, **kw)
    block_q, block_k = tiled_blocks(BAND_BLOCKS, block_q, block_k, call.is_causal, call.window)
    return_lse = check_flag("return_lse", return_lse)
    _check_x64(query.dtype)
    query, key, value, kw = _on_device(query, key, value, keywords=kw)
    # 0. dequantize: an fp8 input is float32 times its descale (the contract's float(x) * d);
    #    the steps below then run in float32, and the result is bfloat16 for an fp8 query.
    out_dtype = _output_dtype(query.dtype)
    query = _dequantized(query, "q_descale", call, kw)
    key, value = (
        _dequantized(key, "k_descale", call, kw),
        _dequantized(value, "v_descale", call, kw),
    )
    H, L, S, E = call.H, call.L, call.S, call.E
    if L == 0 or S == 0:  # no block to scan: no rows, or no keys (every row fully masked)
        out = jnp.zeros((*call.batch, H, L, E), out_dtype)
        lse = jnp.full((*call.batch, H, L), -jnp.inf, _compute_dtype(query.dtype))
        return (out, lse) if return_lse else out

    tiling = _Tiling(call, min(block_q, L), min(block_k, S))
    out, lse = _flash(_arrays(query, key, value, kw), tiling)
    out = out.astype(out_dtype)  # back to the input dtype (bfloat16 for fp8)
    return (out, lse) if return_lse else out


def flash_attention_vjp(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    grad_output: jax.Array,
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
    block_q: int | None = None,
    block_k: int | None = None,
) -> AttentionGrads:
    """The gradients of ``<flash_attention(...), grad_output>``, by ``jax.vjp`` through the
    ``custom_vjp`` (whose backward is the tiled one).

    Args: those of :func:`flash_attention` (without ``return_lse``), and ``grad_output``
        ``(..., H, L, E)``, the cotangent ``dO`` of the output (its exact shape).

    Returns ``AttentionGrads(query, key, value, bias, sinks)`` as
    :func:`impl_jax.functional.scaled_dot_product_attention_vjp` does. Jit it with
    :data:`STATIC_ARGNAMES` (``return_lse`` aside).
    """
    tiled = functools.partial(flash_attention, block_q=block_q, block_k=block_k)
    return _vjp_by_jax(
        tiled, given=locals(),
        # the block sizes are checked before grad_output, as NumPy's flash_attention_vjp does
        checks=(lambda: tiled_blocks(BAND_BLOCKS, block_q, block_k, False, None),),
    )


# ---------------------------------------------------------------------------------------------
# Paged key/value caches (Contract v3): the tiled read, each sequence's own pages in blocks
# ---------------------------------------------------------------------------------------------


def paged_flash_attention(
    query: jax.Array,
    key_cache: jax.Array,
    value_cache: jax.Array,
    block_table: jax.Array,
    seq_lens: jax.Array,
    cu_seqlens_q: jax.Array,
    *,
    is_causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: jax.Array | None = None,
    alibi_slopes: jax.Array | None = None,
    q_descale: jax.Array | float | None = None,
    k_descale: jax.Array | float | None = None,
    v_descale: jax.Array | float | None = None,
    block_k: int | None = None,
) -> jax.Array:
    """:func:`impl_jax.paged.paged_attention`, read block by block: ``(T, H, E)``; each
    sequence reads its own pages, a block of whole pages at a time, and an fp8 cache is
    dequantized as it is read.

    The schedule is made on the host, as :func:`impl_jax.varlen.varlen_flash_attention`'s
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
    ``seq_lens`` that is not concrete (traced, under ``jax.jit``). Under ``jax.jit``, close over
    ``seq_lens`` and ``cu_seqlens_q`` (concrete constants of the traced function, one
    compilation per schedule); ``block_table`` may be traced.
    """
    query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, sinks, alibi_slopes = (
        _as_given(x)
        for x in (query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, sinks,
                  alibi_slopes)
    )
    call = check_paged_attention(
        query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, is_causal=is_causal,
        window=window, scale=scale, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
    )
    _check_x64(query.dtype)
    schedule = sequence_pages(call, block_k)  # [(n, q0, q1, S, blocks)], Python ints
    query, key_cache, value_cache, block_table, sinks, alibi_slopes = (
        _asarray(x) for x in (query, key_cache, value_cache, block_table, sinks, alibi_slopes)
    )
    ct = _compute_dtype(query.dtype)
    H, K, G, D, E, page_size = call.H, call.K, call.G, call.D, call.E, call.page_size
    slopes = None if alibi_slopes is None else alibi_slopes.astype(ct).reshape(K, G, 1, 1)
    rows = [jnp.zeros((0, H, E), ct)]  # then (L_n, H, E) per sequence (N may be 0)
    for n, q0, q1, S, blocks in schedule:  # one sequence at a time: its queries, its pages
        L = q1 - q0
        at_n = jnp.array([n])  # (1,): sequence n, for its descale row
        # Its queries, grouped by key/value head, at positions S - L + i (bottom-right).
        q = _descaled(query[q0:q1], call.q_descale, q_descale, at_n).astype(ct)
        q = q.reshape(L, K, G, D).transpose(1, 2, 0, 3).reshape(K, G * L, D)  # (K, G * L, D)
        i = S - L + jnp.arange(L)[:, None]  # (L, 1)
        m = jnp.full((K, G, L, 1), -jnp.inf, ct)  # running row max of the scores
        l = jnp.zeros((K, G, L, 1), ct)  # running row sum of exp(s - m)
        acc = jnp.zeros((K, G, L, E), ct)  # running sum of exp(s - m) @ value
        # The blocks as a lax.fori_loop (as flash_attention's are lax loops): XLA then holds one
        # block's gather, not every block's (the steps unrolled held all of them: O(P) memory).
        # A block is `width` pages; the last one reads past the sequence's band, masked, its
        # row padded so that no block reads past the table.
        first, width = (blocks[0][0], blocks[0][1] - blocks[0][0]) if blocks else (0, 1)
        row = jnp.pad(block_table[n], (0, width))  # (max_pages + width,)

        def block(b, carry, n=n, S=S, L=L, q=q, i=i, at_n=at_n, first=first, width=width,
                  row=row):
            m, l, acc = carry
            p0 = first + b * width
            # 0. the block: pages block_table[n, p0:p1], keys j = p0 * page_size + 0 .. bk - 1;
            #    only j < S exists (the last page's tail is masked, its values zeroed). An fp8
            #    page is dequantized as it is read: float32 times the sequence's descale.
            pages = jax.lax.dynamic_slice_in_dim(row, p0, width)  # (p1 - p0,)
            j = p0 * page_size + jnp.arange(width * page_size)  # (bk,)
            exists = j < S  # (bk,)
            k = _descaled(key_cache[pages], call.k_descale, k_descale, at_n)  # (p1-p0, ps, K, D)
            v = _descaled(value_cache[pages], call.v_descale, v_descale, at_n)  # (.., ps, K, E)
            k = k.astype(ct).reshape(-1, K, D).transpose(1, 2, 0)  # (K, D, bk)
            v = v.astype(ct).reshape(-1, K, E)  # (bk, K, E)
            # the last page's slots past S, zeroed: a mask, as p0 is traced (NumPy, torch: a slice)
            v = jnp.where(exists[:, None, None], v, 0.0)
            v = v.transpose(1, 0, 2)  # (K, bk, E); no 0*NaN meets a weight

            # 1. scores = (query . key) * scale; query head h = k * G + g reads key/value head k.
            s = jnp.matmul(q, k, precision=_PRECISION)  # (K, G * L, bk)
            s = s.reshape(K, G, L, -1) * call.scale  # (K, G, L, bk)
            # 2. softcap
            if call.softcap is not None:
                s = call.softcap * jnp.tanh(s / call.softcap)
            # 3. ALiBi, -slope[h] * |i - j|
            if slopes is not None:
                s = s + alibi(slopes, i, j, 0)
            # 4. allowed: the key exists (j < S), causal and window on the positions i
            allowed = exists
            if call.is_causal:
                allowed = allowed & causal(i, j, 0)
            if call.window is not None:
                allowed = allowed & window_rule(i, j, 0, call.window)
            s = jnp.where(allowed, s, -jnp.inf)  # (K, G, L, bk)

            # 5. online softmax, as flash_attention's: raise the max, rescale, add exp(s - m_new).
            m_new = jnp.maximum(m, s.max(axis=-1, keepdims=True))  # (K, G, L, 1)
            shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # nothing allowed yet: not NaN
            alpha = jnp.exp(m - shift)
            e = jnp.exp(jnp.minimum(s - shift, 0.0))  # (K, G, L, bk); 0 where not allowed
            l = alpha * l + e.sum(axis=-1, keepdims=True)

            # 6. output, accumulated: acc = alpha * acc + e @ value, per group.
            pv = jnp.matmul(e.reshape(K, G * L, -1), v, precision=_PRECISION)  # (K, G * L, E)
            acc = alpha * acc + pv.reshape(K, G, L, E)  # (K, G, L, E)
            return m_new, l, acc

        m, l, acc = jax.lax.fori_loop(0, len(blocks), block, (m, l, acc))

        # 5. (end) the sink joins the denominator once; a row with no key is 0 / 1 = 0.
        empty = l == 0.0
        if sinks is not None:
            sink = sinks.astype(ct).reshape(K, G, 1, 1)
            m_sink = jnp.maximum(m, sink)
            shift = jnp.where(m_sink == -jnp.inf, 0.0, m_sink)
            alpha = jnp.exp(m - shift)
            l = alpha * l + jnp.exp(jnp.minimum(sink - shift, 0.0))
            acc = alpha * acc
        out = acc / jnp.where(empty, 1.0, l)  # (K, G, L, E)
        rows.append(out.transpose(2, 0, 1, 3).reshape(L, H, E))  # (L, H, E)

    return jnp.concatenate(rows).astype(_output_dtype(query.dtype))  # (T, H, E): the rows in order
