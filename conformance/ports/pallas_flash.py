"""A Pallas flash-attention kernel as a port: the contract's forward pass for JAX arrays.

The JAX twin of :mod:`conformance.ports.triton_flash`, checked the same way
(``python -m conformance --impl conformance.ports.pallas_flash``). One kernel,
:func:`_flash_forward_kernel`, launched with ``pl.pallas_call`` over the grid
``(batch element, query head, query block)``, does all the arithmetic: ``block_q`` query rows
walk the keys ``block_k`` at a time with the online softmax (running row max ``m``, running row
sum ``l``, output accumulator ``acc``, rescaled by ``exp(m_old - m_new)`` when the max rises),
and divide by ``l`` once at the end. Around it, in plain JAX before the launch:

- validation through ``attention_spec.check_attention`` (the same call, errors and messages as
  the three implementations), then this kernel's limit: float32, float16 and bfloat16 only
  (float64 is ``DTypeError`` ``unsupported_dtype``);
- the layout the kernel reads: query, key and value broadcast over the batch dims and
  flattened to one batch axis ``B``, every axis a tile reads zero-padded (head dims to a power
  of two >= 16, lengths past the last block), mask (as int8) and bias (as float32) kept at
  their own size along every axis they broadcast on (size 1), so a ``(B, 1, 1, S)`` padding
  mask is never expanded to ``(B, H, L, S)``. GQA is in the key/value ``BlockSpec``: query
  head h's program is handed key/value head ``h // G``.
- the choice of how to run: ``jax.lax.platform_dependent`` lowers the kernel with
  ``interpret=True`` on the CPU (Pallas's interpreter: the kernel body as ordinary XLA
  operations, a loop over the grid) and compiles it on GPUs through Pallas's Triton lowering
  (``CompilerParams`` of ``jax.experimental.pallas.triton``), decided where the call is
  lowered, so one jitted function serves both.

Each program reads a tile of ``tile_q = max(16, next_pow2(block_q))`` rows starting at its
first row and keeps the first ``block_q``; keys likewise, so any block size the caller asks
for (2 x 3, 1 x 1, ...) is the tiling, with power-of-two tiles as GPU dot instructions want.
It writes its whole tile to its own slot of an ``(B, H, n_blocks, tile_q, E)`` output, so no
two programs write the same element; the wrapper keeps the first ``block_q`` rows of each.

The steps and their numbers are the contract's (SEMANTICS.md); scores, softmax and
accumulator are float32, the dots take the input dtype with a float32 result (float32 dots
at ``Precision.HIGHEST``, not TF32), and the weights are rounded to the input dtype before
``weights @ value``, as FlashAttention does.

Functions the runner calls: :func:`scaled_dot_product_attention`, :func:`flash_attention`,
:func:`attention_weights` (the kernel with the identity as value), and the JAX adapters
``from_numpy``, ``to_numpy``, ``prepare`` (``jax.jit`` with the scalar keywords static).
Contract v3's :func:`varlen_attention` and :func:`paged_attention` run a second kernel,
:func:`_token_major_kernel` (a program per query head and query block of one sequence, over
the grid ``(H, T // 16 + N)``, each finding its sequence in ``cu_seqlens_q``; paged, the
sequence's pages read one key block each through ``block_table``, an index input read inside
the kernel, never a gathered copy), with masked loads and stores (``pallas.triton.load`` and
``store``) instead of padded copies. Both kernels take contract v3's fp8 forms: fp8
key/value (and query) go into the kernel as fp8 and are converted to float32 there, as
FlashAttention 3 does; the descales enter as factors per (batch element or sequence, head):
``q_descale * k_descale`` on the scores (query head h reading the ``k_descale`` of its
key/value head), ``v_descale`` on the output; the weights stay float32 before the value
product (the strict bound's computation).

Why one file of ~900 lines, two kernels: the runner imports a port as one module, whose
xfails file is the module's, and the broken-kernel tests (``conformance/tests/
test_kernel_ports.py``) recompile this module's source with one edit each; the heads-first
kernel and the token-major one stay in the file they are patched in.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``; ``B`` alone
the flattened batch inside the kernel wrapper), H query heads, K key/value heads, G = H // K,
L query length, S key/value length, D query/key head dim, E value head dim; ``bq`` and ``bk``
the rows and keys of one tile.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from attention_spec import (
    NO_VALUE,
    AttentionDims,
    causal_offset,
    check_attention,
    check_block_sizes,
    check_flag,
)
from attention_spec.errors import make_error
from conformance.ports.jax_adapter import from_numpy, prepare, to_numpy

__all__ = [
    "BLOCK_K",
    "BLOCK_Q",
    "attention_weights",
    "flash_attention",
    "from_numpy",
    "paged_attention",
    "prepare",
    "scaled_dot_product_attention",
    "to_numpy",
    "varlen_attention",
]

#: Default rows and keys per block of ``scaled_dot_product_attention`` (and of
#: ``flash_attention`` when not given), as in the Triton port.
BLOCK_Q: int = 64
BLOCK_K: int = 64

#: The input dtypes this kernel computes (the contract's four, less float64).
KERNEL_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")

#: Dot tiles are powers of two and, for GPU dot instructions, at least 16 on every side.
_MIN_TILE = 16

#: Triton-lowering launch parameters on GPUs (ignored by the interpreter).
_GPU_PARAMS = pltriton.CompilerParams(num_warps=4, num_stages=2)


def _tile_of(ref, i0, j0, tile_q: int, tile_k: int) -> jax.Array:
    """This program's ``(bq, bk)`` tile of a mask or bias ref ``(L or 1, S or 1)``: rows from
    ``i0`` and keys from ``j0``, or the one row/column an axis of size 1 broadcasts."""
    rows = pl.ds(i0, tile_q) if ref.shape[0] > 1 else pl.ds(0, 1)
    cols = pl.ds(j0, tile_k) if ref.shape[1] > 1 else pl.ds(0, 1)
    return jnp.broadcast_to(ref[rows, cols], (tile_q, tile_k))


def _dot(a: jax.Array, b: jax.Array, contract_b: int) -> jax.Array:
    """``a @ b`` (``contract_b=0``) or ``a @ b^T`` (``contract_b=1``), float32 result; float32
    operands at full precision (the Triton lowering would otherwise use TF32)."""
    return lax.dot_general(
        a,
        b,
        (((1,), (contract_b,)), ((), ())),
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )


def _flash_forward_kernel(
    q_ref, k_ref, v_ref, mask_ref, bias_ref, q_seg_ref, kv_seg_ref, sinks_ref, slopes_ref,
    q_ds_ref, k_ds_ref, v_ds_ref, o_ref, lse_ref, *,
    L: int, S: int, scale: float, softcap: float | None, offset: int, is_causal: bool,
    window: tuple[int | None, int | None] | None,
    block_q: int, block_k: int, tile_q: int, tile_k: int, dot_dtype, p_dtype,
):
    """One program: ``block_q`` query rows from ``i0`` of one query head of one batch element.

    Refs (padded; see the module docstring): ``q_ref (L', D)``, ``k_ref (S', D)`` and
    ``v_ref (S', E)`` of the key/value head ``h // G``, ``mask_ref`` (int8) and ``bias_ref``
    (float32) ``(L' or 1, S' or 1)``, ``q_seg_ref (L',)`` and ``kv_seg_ref (S',)`` this batch
    element's segment ids, ``sinks_ref`` and ``slopes_ref`` ``(1,)`` this query head's sink
    logit and ALiBi slope (float32), each None when not given; ``q_ds_ref (1,)`` the fp8
    descale of this query head, ``k_ds_ref`` and ``v_ds_ref (1,)`` those of its key/value head
    (float32, this batch element's; None when not fp8); ``o_ref (bq, E)`` and ``lse_ref (bq,)``
    this program's output tile and row log-sum-exp. ``dot_dtype``: the dots' operands (float32
    for fp8, converted here); ``p_dtype``: the weights before the value product.
    """
    i0 = pl.program_id(2) * block_q
    lane_q = jnp.arange(tile_q, dtype=jnp.int32)
    lane_k = jnp.arange(tile_k, dtype=jnp.int32)
    rows = i0 + lane_q  # (bq,) query positions i
    row_ok = (lane_q < block_q) & (rows < L)
    q = q_ref[pl.ds(i0, tile_q), :].astype(dot_dtype)  # (bq, D)
    score_scale = scale
    v_descale = 1.0
    if k_ds_ref is not None:  # 0. dequantize: an fp8 input is float(x) * descale, folded
        score_scale = scale * q_ds_ref[...] * k_ds_ref[...]  # into the scale, (1,)
        v_descale = v_ds_ref[...]
    left, right = (None, None) if window is None else window
    if q_seg_ref is not None:
        q_seg = q_seg_ref[pl.ds(i0, tile_q)]  # (bq,) this block's rows' segments

    def one_key_block(j, carry):
        m, l, acc = carry
        j0 = j * block_k
        cols = j0 + lane_k  # (bk,) key positions j
        k = k_ref[pl.ds(j0, tile_k), :].astype(dot_dtype)  # (bk, D)

        # 1. scores = (query @ key^T) * scale (times q_descale * k_descale), float32.
        s = _dot(q, k, contract_b=1) * score_scale  # (bq, bk)

        # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
        if softcap is not None:
            s = softcap * jnp.tanh(s / softcap)

        # 3. additive terms: this block's tile of the bias (may hold -inf), then ALiBi's
        #    -slope[h] * |i + offset - j|, computed here for this block's rows and keys.
        if bias_ref is not None:
            bias = _tile_of(bias_ref, i0, j0, tile_q, tile_k)  # (bq, bk)
            s = s + bias
        if slopes_ref is not None:
            distance = jnp.abs(rows[:, None] + offset - cols[None, :]).astype(jnp.float32)
            s = s + -slopes_ref[...] * distance

        # 4. allowed(i, j) = mask AND causal AND window AND same segment, and the lanes that
        #    are no position: a key past S is padding, zeros, which makes its score 0, not
        #    -inf, so the ragged last block is masked here. A -inf bias excludes its key as a
        #    False mask does (a NaN key's score plus -inf would be NaN, not -inf).
        allowed = row_ok[:, None] & (lane_k < block_k)[None, :] & (cols[None, :] < S)
        if mask_ref is not None:
            allowed &= _tile_of(mask_ref, i0, j0, tile_q, tile_k) != 0
        if bias_ref is not None:
            allowed &= bias != -jnp.inf
        if is_causal:
            allowed &= cols[None, :] <= rows[:, None] + offset
        if left is not None:
            allowed &= cols[None, :] >= rows[:, None] + offset - left
        if right is not None:
            allowed &= cols[None, :] <= rows[:, None] + offset + right
        if q_seg_ref is not None:
            allowed &= q_seg[:, None] == kv_seg_ref[pl.ds(j0, tile_k)][None, :]
        s = jnp.where(allowed, s, -jnp.inf)

        # 5. online softmax: raise the running max, rescale what was summed under the old one
        #    by exp(m_old - m_new), add this block's exp(s - m_new). Nothing allowed yet: the
        #    max is -inf, and the shift 0 keeps exp(-inf - shift) = 0 instead of NaN. The
        #    exponent is clamped at 0: XLA or Triton may fuse s - shift with the scaling into
        #    one FMA that rounds differently from the max (SEMANTICS.md v2).
        m_new = jnp.maximum(m, s.max(axis=1))  # (bq,)
        shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        alpha = jnp.exp(m - shift)  # (bq,); 0 while m is still -inf
        p = jnp.exp(jnp.minimum(s - shift[:, None], 0.0))  # (bq, bk), unnormalized weights
        l = l * alpha + p.sum(axis=1)

        # 6. output, accumulated: acc = alpha * acc + p @ value, the weights first rounded to
        #    p_dtype: the input dtype (FlashAttention's practice; exact for float32), float32
        #    for fp8 (the strict bound's computation). A value row that
        #    no row of this block attends is selected away, not multiplied by its zero weight:
        #    NaN or inf there (padding, unused cache slots) never reaches the output.
        v = v_ref[pl.ds(j0, tile_k), :].astype(dot_dtype)  # (bk, E)
        attended = allowed.astype(jnp.int32).max(axis=0) != 0  # (bk,) keys some row attends
        v = jnp.where(attended[:, None], v, jnp.zeros_like(v))
        p = p.astype(p_dtype).astype(dot_dtype)
        acc = acc * alpha[:, None] + _dot(p, v, contract_b=0)  # (bq, E)
        return m_new, l, acc

    # 4. allowed, whole blocks: the keys outside the causal and window bands of these rows are
    #    masked for every row, so their blocks are never visited (causal costs about half, a
    #    window of W keys costs W, not S). The first row's band starts first, the last row's
    #    ends last.
    i_last = jnp.minimum(i0 + block_q, L) - 1
    j_start, j_end = 0, S
    if is_causal:
        j_end = jnp.clip(i_last + offset + 1, 0, j_end)
    if left is not None:
        j_start = jnp.clip(i0 + offset - left, 0, S)
    if right is not None:
        j_end = jnp.clip(i_last + offset + right + 1, 0, j_end)
    first, last = j_start // block_k, (j_end + block_k - 1) // block_k  # key blocks to visit
    m = jnp.full((tile_q,), -jnp.inf, jnp.float32)  # running row max of the scores
    l = jnp.zeros((tile_q,), jnp.float32)  # running row sum of exp(s - m)
    acc = jnp.zeros((tile_q, o_ref.shape[-1]), jnp.float32)  # running sum of exp(s - m) @ v
    m, l, acc = lax.fori_loop(first, jnp.maximum(first, last), one_key_block, (m, l, acc))

    # 5. (end) the sink joins the denominator once, as one more logit with no value, untouched
    #    by scale, softcap, bias, ALiBi and masks; then divide by the row sum once. A row with
    #    no allowed key has l = 0 and acc = 0: 0 / 1 = 0 (sink or not), never NaN, and its
    #    log-sum-exp is -inf.
    empty = l == 0.0  # (bq,) rows that saw no allowed key
    if sinks_ref is not None:
        sink = sinks_ref[...]  # (1,)
        m_sink = jnp.maximum(m, sink)
        shift = jnp.where(m_sink == -jnp.inf, 0.0, m_sink)
        alpha = jnp.exp(m - shift)
        l = l * alpha + jnp.exp(jnp.minimum(sink - shift, 0.0))
        acc, m = acc * alpha[:, None], m_sink
    l = jnp.where(empty, 1.0, l)
    lse_ref[...] = jnp.where(empty, -jnp.inf, m + jnp.log(l))
    # 6. (end) times the value's descale (1.0 if not fp8), to the output dtype: the query's,
    #    bfloat16 for an fp8 query.
    o_ref[...] = (v_descale * acc / l[:, None]).astype(o_ref.dtype)


def _validate(query, key, value, **keywords) -> AttentionDims:
    """The contract's validation (attention_spec), then this kernel's own limit: no float64."""
    dims = check_attention(query, key, value, **keywords)  # value: NO_VALUE for weights
    # fp8 is taken, in the contract's combinations (check_attention refuses the others).
    if query.dtype.name not in KERNEL_DTYPES and query.dtype.name not in FP8_DTYPES:
        supported = ", ".join([*KERNEL_DTYPES, *FP8_DTYPES])
        raise make_error(
            "unsupported_dtype",
            f"the Pallas kernel computes {supported}; got {query.dtype.name} "
            "(impl_jax computes float64)",
            expected=" | ".join(KERNEL_DTYPES),
            actual=query.dtype.name,
        )
    return dims


def _tile(n: int) -> int:
    """The kernel's tile side for ``n`` positions or features: a power of two, at least 16."""
    return max(_MIN_TILE, pl.next_power_of_2(n))


def _pad_to(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``x`` zero-padded at the end of each axis up to ``shape``."""
    return jnp.pad(x, [(0, n - m) for m, n in zip(x.shape, shape)])


def _flat_batch(x: jax.Array, batch: tuple[int, ...], core: int = 3) -> jax.Array:
    """``(*batch_x, <core axes>)`` -> ``(B, <core axes>)``, broadcast over the batch dims it
    lacks (``core``: 3 for query ``(..., H, L, D)``, 1 for segment ids ``(..., L)``)."""
    shape = x.shape[len(x.shape) - core :]
    return jnp.broadcast_to(x, (*batch, *shape)).reshape(math.prod(batch), *shape)


def _per_batch_head(x: jax.Array | float | None, batch: tuple[int, ...], heads: int) -> jax.Array:
    """A heads-first descale (None, a number, or float32 broadcastable to ``(..., heads)``) as
    float32 ``(B, heads, 1)``: one factor per batch element and head."""
    x = jnp.asarray(1.0 if x is None else x, jnp.float32)
    return jnp.broadcast_to(x, (*batch, heads)).reshape(math.prod(batch), heads, 1)


def _as_scores_operand(x: jax.Array, dims: AttentionDims, dtype, L_pad: int, S_pad: int):
    """A mask or bias, broadcastable to ``(..., H, L, S)``, as ``(B or 1, H or 1, L' or 1,
    S' or 1)`` in ``dtype``: only the batch dims are broadcast (and only when the operand has
    any of its own), the other axes keep size 1 where they broadcast."""
    x = x.reshape((1,) * (len(dims.scores_shape) - x.ndim) + x.shape).astype(dtype)
    Hx, Lx, Sx = x.shape[-3:]
    if all(n == 1 for n in x.shape[:-3]):
        x = x.reshape(1, Hx, Lx, Sx)
    else:
        x = _flat_batch(x, dims.batch)
    return _pad_to(x, (x.shape[0], Hx, L_pad if Lx > 1 else 1, S_pad if Sx > 1 else 1))


def _forward(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    dims: AttentionDims,
    causal_alignment: str,
    mask: jax.Array | None,
    bias: jax.Array | None,
    q_segment_ids: jax.Array | None,
    kv_segment_ids: jax.Array | None,
    sinks: jax.Array | None,
    alibi_slopes: jax.Array | None,
    block_q: int,
    block_k: int,
    q_descale: jax.Array | float | None = None,
    k_descale: jax.Array | float | None = None,
    v_descale: jax.Array | float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Launch the kernel on validated inputs; returns the output ``(..., H, L, E)`` (the
    query's dtype, bfloat16 for an fp8 query) and the row log-sum-exp ``(..., H, L)``
    (float32). fp8 key/value (and query) go into the kernel as fp8, with their descales
    ``q_descale`` broadcastable to ``(..., H)`` and ``k_descale``/``v_descale`` to ``(..., K)``."""
    H, G, L, S, E = dims.H, dims.G, dims.L, dims.S, dims.E
    fp8 = key.dtype.name in FP8_DTYPES
    out_dtype = jnp.bfloat16 if query.dtype.name in FP8_DTYPES else query.dtype
    if math.prod(dims.output_shape) == 0:  # L = 0 or an empty batch: nothing to launch
        lse = jnp.full((*dims.batch, H, L), -jnp.inf, jnp.float32)
        return jnp.zeros(dims.output_shape, out_dtype), lse
    n_q, n_k = -(-L // block_q), -(-S // block_k)
    tile_q, tile_k, Dp, Ep = _tile(block_q), _tile(block_k), _tile(dims.D), _tile(E)
    L_pad = (n_q - 1) * block_q + tile_q  # the last program's tile ends here
    S_pad = max(n_k - 1, 0) * block_k + tile_k
    B = math.prod(dims.batch)

    q = _pad_to(_flat_batch(query, dims.batch), (B, H, L_pad, Dp))  # (B, H, L', D)
    k = _pad_to(_flat_batch(key, dims.batch), (B, dims.K, S_pad, Dp))  # (B, K, S', D)
    v = _pad_to(_flat_batch(value, dims.batch), (B, dims.K, S_pad, Ep))  # (B, K, S', E)
    operands = {"q": q, "k": k, "v": v}
    in_specs = [
        pl.BlockSpec((pl.squeezed, pl.squeezed, L_pad, Dp), lambda b, h, i: (b, h, 0, 0)),
        pl.BlockSpec((pl.squeezed, pl.squeezed, S_pad, Dp), lambda b, h, i: (b, h // G, 0, 0)),
        pl.BlockSpec((pl.squeezed, pl.squeezed, S_pad, Ep), lambda b, h, i: (b, h // G, 0, 0)),
    ]
    for name, x, dtype in (("mask", mask, jnp.int8), ("bias", bias, jnp.float32)):
        if x is None:  # bias: float32, the compute dtype, first (v2)
            continue
        x = _as_scores_operand(x, dims, dtype, L_pad, S_pad)  # (B or 1, H or 1, L' or 1, ...)
        Bx, Hx = x.shape[:2]
        operands[name] = x
        in_specs.append(
            pl.BlockSpec(
                (pl.squeezed, pl.squeezed, *x.shape[2:]),
                lambda b, h, i, Bx=Bx, Hx=Hx: (b if Bx > 1 else 0, h if Hx > 1 else 0, 0, 0),
            )
        )
    if q_segment_ids is not None:  # (B, L') and (B, S'): this batch element's ids
        for name, ids, n in (("q_seg", q_segment_ids, L_pad), ("kv_seg", kv_segment_ids, S_pad)):
            operands[name] = _pad_to(_flat_batch(ids, dims.batch, core=1), (B, n))
            in_specs.append(pl.BlockSpec((pl.squeezed, n), lambda b, h, i: (b, 0)))
    for name, x in (("sinks", sinks), ("slopes", alibi_slopes)):
        if x is not None:  # (H, 1) float32: query head h's sink logit or slope
            operands[name] = x.astype(jnp.float32).reshape(H, 1)
            in_specs.append(pl.BlockSpec((pl.squeezed, 1), lambda b, h, i: (h, 0)))
    if fp8:  # (B, H, 1) and (B, K, 1) float32: this query head's and its key/value head's
        for name, x, heads, head in (("q_ds", q_descale, H, lambda h: h),
                                     ("k_ds", k_descale, dims.K, lambda h: h // G),
                                     ("v_ds", v_descale, dims.K, lambda h: h // G)):
            operands[name] = _per_batch_head(x, dims.batch, heads)
            in_specs.append(
                pl.BlockSpec(
                    (pl.squeezed, pl.squeezed, 1), lambda b, h, i, head=head: (b, head(h), 0)
                )
            )
    # The dots take float32 for fp8 (converted in the kernel, exact), else the input dtype;
    # the weights stay float32 for fp8 before the value product, as in the token-major kernel
    # (FlashAttention 3's fp8 weights, rounded before the division by the row sum, failed the
    # kernel bound in the Triton port: measured there).
    dot_dtype = jnp.float32 if fp8 else query.dtype
    p_dtype = jnp.float32 if fp8 else query.dtype

    kernel = functools.partial(
        _flash_forward_kernel,
        L=L, S=S, scale=dims.scale, softcap=dims.softcap,
        offset=causal_offset(L, S, causal_alignment), is_causal=dims.is_causal,
        window=dims.window, block_q=block_q, block_k=block_k, tile_q=tile_q, tile_k=tile_k,
        dot_dtype=dot_dtype, p_dtype=p_dtype,
    )
    names = list(operands)

    def with_refs(*refs):  # the given operands' refs in order, then o_ref, lse_ref
        given = dict(zip(names, refs))
        optional = ("mask", "bias", "q_seg", "kv_seg", "sinks", "slopes", "q_ds", "k_ds", "v_ds")
        kernel(given["q"], given["k"], given["v"], *(given.get(n) for n in optional),
               *refs[len(names):])

    def launch(*operands: jax.Array, interpret: bool) -> tuple[jax.Array, jax.Array]:
        return pl.pallas_call(
            with_refs,
            out_shape=(
                jax.ShapeDtypeStruct((B, H, n_q, tile_q, Ep), out_dtype),
                jax.ShapeDtypeStruct((B, H, n_q, tile_q), jnp.float32),
            ),
            grid=(B, H, n_q),  # (batch element, query head, query block)
            in_specs=in_specs,
            out_specs=(
                pl.BlockSpec(
                    (pl.squeezed, pl.squeezed, pl.squeezed, tile_q, Ep),
                    lambda b, h, i: (b, h, i, 0, 0),
                ),
                pl.BlockSpec(
                    (pl.squeezed, pl.squeezed, pl.squeezed, tile_q), lambda b, h, i: (b, h, i, 0)
                ),
            ),
            interpret=interpret,
            compiler_params=_GPU_PARAMS,
        )(*operands)

    # Interpreted on the CPU, compiled elsewhere: decided by the platform it is lowered for.
    out, lse = lax.platform_dependent(
        *operands.values(),
        cpu=functools.partial(launch, interpret=True),
        default=functools.partial(launch, interpret=False),
    )  # (B, H, n_q, tile_q, E'), (B, H, n_q, tile_q)
    out = out[:, :, :, :block_q, :E].reshape(B, H, n_q * block_q, E)[:, :, :L]
    lse = lse[:, :, :, :block_q].reshape(B, H, n_q * block_q)[:, :, :L]
    return out.reshape(dims.output_shape), lse.reshape(*dims.batch, H, L)


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
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    return_lse: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """The contract's attention output ``(..., H, L, E)``, computed by the Pallas kernel.

    Args:
        query: ``(..., H, L, D)``; float32, float16 or bfloat16; or fp8 (``float8_e4m3fn``/
            ``float8_e5m2``) with fp8 key and value of the same format (FlashAttention 3's).
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key, or key and value both fp8
            under a float query (an fp8 cache). fp8 is loaded and converted in the kernel.
        mask: boolean, broadcastable to ``(..., H, L, S)``; True = may attend.
        bias: floating, broadcastable to ``(..., H, L, S)``; added to the scores, may hold -inf.
        is_causal: apply the causal rule of ``causal_alignment`` ("top_left" | "bottom_right").
        scale: score scale, default ``1/sqrt(D)``.
        softcap: if given, scores become ``softcap * tanh(scores / softcap)`` before bias/mask.
        window: ``(left, right)``, each an int >= 0 or None (unbounded): query i sees keys
            ``i + offset - left .. i + offset + right``, on ``causal_alignment``'s diagonal.
        q_segment_ids, kv_segment_ids: integers broadcastable to ``(..., L)`` and ``(..., S)``;
            a query attends only keys of its own segment (packed documents).
        sinks: ``(H,)`` floating: one extra logit per query head in the softmax's denominator,
            with no value.
        alibi_slopes: ``(H,)`` floating: ``-slope[h] * |i + offset - j|`` added to the scores.
        q_descale: for an fp8 query, float32 broadcastable to ``(..., H)``; k_descale and
            v_descale: for fp8 key/value, broadcastable to ``(..., K)``. An fp8 x stands for
            ``float(x) * descale``: q_descale * k_descale multiply the scores (query head h
            reads the k_descale of its key/value head), v_descale the output.
        block_q: query rows per program (any integer >= 1; it need not divide L).
        block_k: keys per step of a program's loop (any integer >= 1; it need not divide S).
        return_lse: also return the row log-sum-exp of the final scores, the sink included,
            ``(..., H, L)`` float32; ``-inf`` for a row with no allowed key.

    Jit it with every keyword but the arrays static (``prepare`` does).

    Returns the output in the query's dtype (bfloat16 for an fp8 query; rows with no allowed
    key are zeros), or ``(output, lse)``.

    Raises the contract's errors (attention_spec) before any launch, ConfigError for a block
    size < 1, and DTypeError ``unsupported_dtype`` for float64.
    """
    dims = _validate(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale,
    )
    check_block_sizes(block_q, block_k)
    return_lse = check_flag("return_lse", return_lse)
    out, lse = _forward(
        query, key, value, dims, causal_alignment, mask, bias, q_segment_ids, kv_segment_ids,
        sinks, alibi_slopes, block_q, block_k, q_descale, k_descale, v_descale,
    )
    return (out, lse) if return_lse else out


def scaled_dot_product_attention(
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
) -> jax.Array:
    """:func:`flash_attention` with the default blocks (``BLOCK_Q`` x ``BLOCK_K``)."""
    return flash_attention(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale,
    )


def attention_weights(
    query: jax.Array,
    key: jax.Array,
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
) -> jax.Array:
    """The weights ``(..., H, L, S)`` as the kernel computes them: the kernel run with the
    identity as value (E = S, one value column per key), so that output row i is weight row i.
    For checking the kernel weight by weight. fp8 query/key with ``q_descale``/``k_descale``
    as in :func:`flash_attention` (no value, no ``v_descale``): the identity is float32 then;
    bfloat16 weights for an fp8 query."""
    dims = _validate(
        query, key, NO_VALUE, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale,
    )
    K, S = dims.K, dims.S
    eye_dtype = jnp.float32 if key.dtype.name in FP8_DTYPES else query.dtype
    identity = jnp.broadcast_to(jnp.eye(S, dtype=eye_dtype), (K, S, S))  # (K, S, E=S)
    out, _ = _forward(
        query, key, identity, dataclasses.replace(dims, E=S), causal_alignment, mask, bias,
        q_segment_ids, kv_segment_ids, sinks, alibi_slopes, BLOCK_Q, BLOCK_K, q_descale,
        k_descale,
    )
    return out


# -- contract v3: packed (varlen) rows and paged key/value caches, fp8 inputs -----------------


def _sequence_of_block(cu_q_ref, g: jax.Array, N: int, block_q: int) -> jax.Array:
    """The sequence n of query block g (a scalar): the last n whose first block,
    ``cu_q[n] // block_q + n``, is <= g, by binary search over ``cu_q_ref (N + 1,)``.

    Sequence n owns blocks ``first(n) .. first(n + 1) - 1``, at least ``cdiv(L_n, block_q)``
    of them (one for an empty sequence), and ``first`` rises by at least one per sequence, so
    ``T // block_q + N`` blocks cover every sequence and no block holds two sequences' rows.
    """

    def halve(_, bounds):  # n in [lo, hi]
        lo, hi = bounds
        mid = (lo + hi + 1) // 2
        owns = cu_q_ref[mid] // block_q + mid <= g  # block g is sequence mid's or later
        return jnp.where(owns, mid, lo), jnp.where(owns, hi, mid - 1)

    start = (jnp.int32(0), jnp.int32(N - 1))
    return lax.fori_loop(0, (N - 1).bit_length(), halve, start)[0]


def _token_major_kernel(
    cu_q_ref, cu_k_ref, seq_lens_ref, block_table_ref, q_ref, k_ref, v_ref, sinks_ref,
    slopes_ref, q_ds_ref, k_ds_ref, v_ds_ref, o_ref, *,
    N: int, H: int, G: int, D: int, E: int, scale: float, softcap: float | None, is_causal: bool,
    bottom_right: bool, window: tuple[int | None, int | None] | None, paged: bool,
    has_descale: bool, block_q: int, block_k: int, tile_q: int, tile_k: int, tile_d: int,
    tile_e: int, dot_dtype, p_dtype,
):
    """One program: ``block_q`` query rows (``i0 .. i0 + block_q - 1``, positions within the
    sequence) of query head h of sequence n, the grid ``(H, T // block_q + N)``: query block g
    is sequence n's block ``g - first(n)`` (:func:`_sequence_of_block`), so the grid grows with
    T and N, not with N times T (the lengths are traced under ``jax.jit``: no host maximum).

    Refs, whole arrays (read here by index, never copied per sequence): ``cu_q_ref (N + 1,)``,
    ``cu_k_ref (N + 1,)`` (varlen), ``seq_lens_ref (N,)`` and ``block_table_ref (N, max_pages)``
    (paged), int32; ``q_ref (T, H, D)``; ``k_ref (P, page_size, K, D)`` and ``v_ref
    (P, page_size, K, E)`` (paged; varlen: ``(1, Tk, K, D|E)``, one "page" of the packed rows);
    ``sinks_ref`` and ``slopes_ref`` ``(H,)`` float32 or None; ``q_ds_ref (N, H)``, ``k_ds_ref``
    and ``v_ds_ref (N, K)``, the fp8 descales, float32; ``o_ref (T, H, E)``.

    Varlen: the sequence's query rows are ``cu_q[n] .. cu_q[n+1] - 1`` and its keys
    ``cu_k[n] .. cu_k[n+1] - 1`` (no other sequence's key is ever loaded: no block straddles
    two sequences). Paged: its ``L_n`` queries are its last positions (bottom-right), a key
    block is one page (``block_k = page_size``), and key block b is page
    ``block_table[n, b]``, read here entry by entry.
    """
    h = pl.program_id(0)
    g = pl.program_id(1)  # query block g of all sequences' blocks (_sequence_of_block)
    n = _sequence_of_block(cu_q_ref, g, N, block_q)
    i0 = (g - (cu_q_ref[n] // block_q + n)) * block_q  # the block's first row in sequence n
    kv = h // G  # contiguous groups: heads kv*G .. kv*G + G - 1 share key/value head kv
    q_start = cu_q_ref[n]
    L = cu_q_ref[n + 1] - q_start  # L_n
    if paged:
        S = seq_lens_ref[n]  # S_n, the new tokens included
        k_start = 0
    else:
        k_start = cu_k_ref[n]
        S = cu_k_ref[n + 1] - k_start
    offset = 0
    if bottom_right:
        offset = S - L  # key i + offset is row i's diagonal

    lane_q = jnp.arange(tile_q, dtype=jnp.int32)
    lane_k = jnp.arange(tile_k, dtype=jnp.int32)
    d = jnp.arange(tile_d, dtype=jnp.int32)
    e = jnp.arange(tile_e, dtype=jnp.int32)
    rows = i0 + lane_q  # (bq,) positions i within the sequence
    row_ok = (lane_q < block_q) & (rows < L)
    d_ok = d[None, :] < D  # (1, D)
    e_ok = e[None, :] < E  # (1, E)
    q_rows = pl.ds(q_start + i0, tile_q)  # the packed rows q_start + rows
    q_ptr = q_ref.at[q_rows, h, pl.ds(0, tile_d)]
    q = pltriton.load(q_ptr, mask=row_ok[:, None] & d_ok, other=jnp.zeros((), q_ref.dtype))
    q = q.astype(dot_dtype)  # (bq, D)
    score_scale = scale
    v_descale = 1.0
    if has_descale:  # 0. dequantize: an fp8 input is float(x) * descale, folded into the scale
        score_scale = scale * q_ds_ref[n, h] * k_ds_ref[n, kv]
        v_descale = v_ds_ref[n, kv]
    if slopes_ref is not None:
        slope = slopes_ref[h]
    left, right = (None, None) if window is None else window

    def one_key_block(b, carry):  # one block of the sequence's keys
        m, l, acc = carry
        j0 = b * block_k
        cols = j0 + lane_k  # (bk,) key positions j within the sequence
        col_ok = (lane_k < block_k) & (cols < S)  # never a key past S_n
        if paged:  # key j: page block_table[n, j // page_size], slot j % page_size
            page = block_table_ref[n, b]
            slot = 0
        else:  # key j: packed row cu_k[n] + j
            page = jnp.int32(0)
            slot = k_start + j0
        k_ptr = k_ref.at[page, pl.ds(slot, tile_k), kv, pl.ds(0, tile_d)]
        k = pltriton.load(k_ptr, mask=col_ok[:, None] & d_ok, other=jnp.zeros((), k_ref.dtype))

        # 1. scores = (query @ key^T) * scale (times q_descale * k_descale), float32.
        s = _dot(q, k.astype(dot_dtype), contract_b=1) * score_scale  # (bq, bk)

        # 2. softcap, as in _flash_forward_kernel.
        if softcap is not None:
            s = softcap * jnp.tanh(s / softcap)

        # 3. ALiBi: -slope[h] * |i + offset - j| at positions within the sequence.
        if slopes_ref is not None:
            distance = jnp.abs(rows[:, None] + offset - cols[None, :]).astype(jnp.float32)
            s = s + -slope * distance

        # 4. allowed(i, j) = the sequence's own keys AND causal AND window.
        allowed = row_ok[:, None] & col_ok[None, :]
        if is_causal:
            allowed &= cols[None, :] <= rows[:, None] + offset
        if left is not None:
            allowed &= cols[None, :] >= rows[:, None] + offset - left
        if right is not None:
            allowed &= cols[None, :] <= rows[:, None] + offset + right
        s = jnp.where(allowed, s, -jnp.inf)  # (bq, bk)

        # 5. online softmax, as in _flash_forward_kernel.
        m_new = jnp.maximum(m, s.max(axis=1))  # (bq,)
        shift = jnp.where(m_new == -jnp.inf, 0.0, m_new)
        alpha = jnp.exp(m - shift)
        p = jnp.exp(jnp.minimum(s - shift[:, None], 0.0))  # (bq, bk)
        l = l * alpha + p.sum(axis=1)

        # 6. output, accumulated; value rows no row attends (unused slots: NaN) selected away.
        v_ptr = v_ref.at[page, pl.ds(slot, tile_k), kv, pl.ds(0, tile_e)]
        v = pltriton.load(v_ptr, mask=col_ok[:, None] & e_ok, other=jnp.zeros((), v_ref.dtype))
        attended = allowed.astype(jnp.int32).max(axis=0) != 0  # (bk,)
        v = jnp.where(attended[:, None], v.astype(dot_dtype), jnp.zeros((), dot_dtype))
        p = p.astype(p_dtype).astype(dot_dtype)
        acc = acc * alpha[:, None] + _dot(p, v, contract_b=0)  # (bq, E)
        return m_new, l, acc

    # 4. allowed, whole blocks: only this sequence's S_n keys, and of those only the causal
    #    and window bands of these rows (no block at all for a program past L_n).
    i_last = jnp.minimum(i0 + block_q, L) - 1
    j_start = 0
    j_end = jnp.where(i0 < L, S, 0)
    if is_causal:
        j_end = jnp.minimum(j_end, jnp.maximum(0, i_last + offset + 1))
    if left is not None:
        j_start = jnp.clip(i0 + offset - left, 0, S)
    if right is not None:
        j_end = jnp.minimum(j_end, jnp.maximum(0, i_last + offset + right + 1))
    first, last = j_start // block_k, (j_end + block_k - 1) // block_k  # key blocks to visit
    m = jnp.full((tile_q,), -jnp.inf, jnp.float32)  # running row max of the scores
    l = jnp.zeros((tile_q,), jnp.float32)  # running row sum of exp(s - m)
    acc = jnp.zeros((tile_q, tile_e), jnp.float32)  # running sum of exp(s - m) @ value
    m, l, acc = lax.fori_loop(first, jnp.maximum(first, last), one_key_block, (m, l, acc))

    # 5. (end) the sink in the denominator (no descale, no scale); rows with no key give 0.
    empty = l == 0.0
    if sinks_ref is not None:
        sink = sinks_ref[h]
        m_sink = jnp.maximum(m, sink)
        shift = jnp.where(m_sink == -jnp.inf, 0.0, m_sink)
        alpha = jnp.exp(m - shift)
        l = l * alpha + jnp.exp(jnp.minimum(sink - shift, 0.0))
        acc = acc * alpha[:, None]
    l = jnp.where(empty, 1.0, l)
    out = acc * v_descale / l[:, None]  # (bq, E)
    o_ptr = o_ref.at[q_rows, h, pl.ds(jnp.int32(0), tile_e)]  # int32 starts (x64 on)
    pltriton.store(o_ptr, out.astype(o_ref.dtype), mask=row_ok[:, None] & e_ok)


#: The fp8 formats the token-major kernel loads and converts itself (contract v3).
FP8_DTYPES: tuple[str, ...] = ("float8_e4m3fn", "float8_e5m2")

#: Rows per program of the token-major kernel, and varlen's keys per block (paged: a page).
TOKEN_BLOCK: int = 16


def _check_token_major_dtype(query: jax.Array) -> None:
    """This kernel's limit after the contract's validation: no float64 (fp8 is taken)."""
    if query.dtype.name in KERNEL_DTYPES or query.dtype.name in FP8_DTYPES:
        return
    supported = ", ".join([*KERNEL_DTYPES, *FP8_DTYPES])
    raise make_error(
        "unsupported_dtype",
        f"the Pallas kernel computes {supported}; got {query.dtype.name} "
        "(impl_jax computes float64)",
        expected=" | ".join(KERNEL_DTYPES),
        actual=query.dtype.name,
    )


def _per_sequence(x: jax.Array | float | None, N: int, heads: int) -> jax.Array:
    """A descale (None, a number, or float32 ``()``, ``(heads,)``, ``(N, heads)``) as float32
    ``(N, heads)``."""
    x = 1.0 if x is None else x
    return jnp.broadcast_to(jnp.asarray(x, jnp.float32), (N, heads))


def _token_major(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    cu_q: jax.Array,
    cu_k: jax.Array | None,
    seq_lens: jax.Array | None,
    block_table: jax.Array | None,
    *,
    H: int, K: int, D: int, E: int, scale: float, softcap: float | None, is_causal: bool,
    bottom_right: bool, window, sinks, alibi_slopes, q_descale, k_descale, v_descale,
) -> jax.Array:
    """Launch :func:`_token_major_kernel` on validated inputs; returns ``(T, H, E)``.
    ``key``/``value``: packed ``(Tk, K, D|E)`` (varlen) or pages ``(P, page_size, K, D|E)``
    (paged, with ``seq_lens`` and ``block_table``)."""
    T = query.shape[0]
    N = cu_q.shape[0] - 1
    fp8 = key.dtype.name in FP8_DTYPES
    out_dtype = jnp.bfloat16 if query.dtype.name in FP8_DTYPES else query.dtype
    if T * H * E == 0 or N == 0:
        return jnp.zeros((T, H, E), out_dtype)
    paged = block_table is not None
    cu_q = cu_q.astype(jnp.int32)
    if paged:
        seq_lens, block_table = seq_lens.astype(jnp.int32), block_table.astype(jnp.int32)
        cu_k = cu_q  # unused
        block_k = key.shape[1]  # a key block is one page
    else:
        cu_k = cu_k.astype(jnp.int32)
        seq_lens, block_table = cu_q, cu_q[None, :]  # unused
        key, value = key[None], value[None]  # (1, Tk, K, D|E): one "page", no copy
        block_k = TOKEN_BLOCK
    # Dots: the input dtype with float32 accumulators; float32 for fp8 (converted in the
    # kernel, exact in float32) and for a float query with an fp8 cache.
    dot_dtype = jnp.float32 if fp8 else query.dtype
    # Weights before the value product: rounded to the input dtype (FlashAttention's
    # practice); kept in float32 for fp8 (the strict bound's computation).
    p_dtype = jnp.float32 if fp8 else query.dtype
    block_q = TOKEN_BLOCK
    n_blocks = T // block_q + N  # every sequence's query blocks (_sequence_of_block)
    operands = {
        "cu_q": cu_q, "cu_k": cu_k, "seq_lens": seq_lens, "block_table": block_table,
        "q": query, "k": key, "v": value,
    }
    for name, x in (("sinks", sinks), ("slopes", alibi_slopes)):
        if x is not None:
            operands[name] = jnp.asarray(x).astype(jnp.float32)  # (H,)
    if fp8:
        operands["q_ds"] = _per_sequence(q_descale, N, H)
        operands["k_ds"] = _per_sequence(k_descale, N, K)
        operands["v_ds"] = _per_sequence(v_descale, N, K)
    kernel = functools.partial(
        _token_major_kernel,
        N=N, H=H, G=H // K, D=D, E=E, scale=scale, softcap=softcap, is_causal=is_causal,
        bottom_right=bottom_right, window=window, paged=paged, has_descale=fp8,
        block_q=block_q, block_k=block_k, tile_q=_tile(block_q), tile_k=_tile(block_k),
        tile_d=_tile(D), tile_e=_tile(E), dot_dtype=dot_dtype, p_dtype=p_dtype,
    )
    names = list(operands)

    def with_refs(*refs):  # the given operands' refs in order, then o_ref
        given = dict(zip(names, refs))
        order = ("cu_q", "cu_k", "seq_lens", "block_table", "q", "k", "v", "sinks", "slopes",
                 "q_ds", "k_ds", "v_ds")
        kernel(*(given.get(name) for name in order), refs[-1])

    def launch(*operands: jax.Array, interpret: bool) -> jax.Array:
        return pl.pallas_call(
            with_refs,
            out_shape=jax.ShapeDtypeStruct((T, H, E), out_dtype),
            grid=(H, n_blocks),  # (query head, query block of some sequence)
            interpret=interpret,
            compiler_params=_GPU_PARAMS,
        )(*operands)

    # Interpreted on the CPU, compiled elsewhere: decided by the platform it is lowered for.
    return lax.platform_dependent(
        *operands.values(),
        cpu=functools.partial(launch, interpret=True),
        default=functools.partial(launch, interpret=False),
    )  # (T, H, E)


def varlen_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: jax.Array | None = None,
    alibi_slopes: jax.Array | None = None,
    q_descale: jax.Array | float | None = None,
    k_descale: jax.Array | float | None = None,
    v_descale: jax.Array | float | None = None,
) -> jax.Array:
    """Attention over N packed sequences ``(Tq, H, E)``, by :func:`_token_major_kernel`: one
    program per (query block, head) of one sequence, its key loop over that sequence's keys.

    Args:
        query: ``(Tq, H, D)``; key ``(Tk, K, D)``; value ``(Tk, K, E)``: float32, float16,
            bfloat16, or fp8 (``float8_e4m3fn``/``float8_e5m2``, loaded and converted in the
            kernel) as the contract allows.
        cu_seqlens_q, cu_seqlens_k: integer ``(N + 1,)``: sequence n is query rows
            ``[cu_q[n], cu_q[n+1])`` against key rows ``[cu_k[n], cu_k[n+1])``.
        is_causal, causal_alignment, window, scale, softcap, sinks, alibi_slopes: as in
            :func:`flash_attention`, on each sequence's own diagonal.
        q_descale, k_descale, v_descale: fp8 descales, ``()``, ``(H|K,)`` or ``(N, H|K)``.

    Returns the output in the query's dtype (bfloat16 for an fp8 query).
    """
    from attention_spec.varlen import check_varlen

    varlen = check_varlen(
        query, key, value, cu_seqlens_q, cu_seqlens_k, is_causal=is_causal,
        causal_alignment=causal_alignment, window=window, scale=scale, softcap=softcap,
        sinks=sinks, alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale,
    )
    _check_token_major_dtype(query)
    call = varlen.call
    return _token_major(
        query, key, value, cu_seqlens_q, cu_seqlens_k, None, None,
        H=varlen.H, K=varlen.K, D=varlen.D, E=varlen.E, scale=call.scale,
        softcap=call.softcap, is_causal=call.is_causal,
        bottom_right=call.causal_alignment == "bottom_right", window=call.window,
        sinks=sinks, alibi_slopes=alibi_slopes,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
    )


def paged_attention(
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
) -> jax.Array:
    """Packed queries over a paged cache ``(T, H, E)``, by :func:`_token_major_kernel`: one
    program per (query block, head) of one sequence, walking the sequence's pages one key
    block each through ``block_table`` inside the kernel (no gathered copy).

    Args:
        query: ``(T, H, D)``; sequence n's ``L_n`` queries are its last positions.
        key_cache: ``(P, page_size, K, D)``; value_cache: ``(P, page_size, K, E)``.
        block_table: integer ``(N, max_pages)``; entries past a sequence's pages never read.
        seq_lens: integer ``(N,)``; cu_seqlens_q: integer ``(N + 1,)``.
        is_causal, window, scale, softcap, sinks, alibi_slopes, q_descale, k_descale,
            v_descale: as in :func:`varlen_attention`, bottom-right.

    Returns the output in the query's dtype (bfloat16 for an fp8 query).
    """
    from attention_spec.paged import check_paged_attention

    call = check_paged_attention(
        query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, is_causal=is_causal,
        window=window, scale=scale, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
    )
    _check_token_major_dtype(query)
    return _token_major(
        query, key_cache, value_cache, cu_seqlens_q, None, seq_lens, block_table,
        H=call.H, K=call.K, D=call.D, E=call.E, scale=call.scale, softcap=call.softcap,
        is_causal=call.is_causal, bottom_right=True, window=call.window, sinks=sinks,
        alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
    )
