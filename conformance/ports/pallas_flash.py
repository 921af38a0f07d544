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
    "prepare",
    "scaled_dot_product_attention",
    "to_numpy",
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
    o_ref, lse_ref, *,
    L: int, S: int, scale: float, softcap: float | None, offset: int, is_causal: bool,
    window: tuple[int | None, int | None] | None,
    block_q: int, block_k: int, tile_q: int, tile_k: int,
):  # fmt: skip
    """One program: ``block_q`` query rows from ``i0`` of one query head of one batch element.

    Refs (padded; see the module docstring): ``q_ref (L', D)``, ``k_ref (S', D)`` and
    ``v_ref (S', E)`` of the key/value head ``h // G``, ``mask_ref`` (int8) and ``bias_ref``
    (float32) ``(L' or 1, S' or 1)``, ``q_seg_ref (L',)`` and ``kv_seg_ref (S',)`` this batch
    element's segment ids, ``sinks_ref`` and ``slopes_ref`` ``(1,)`` this query head's sink
    logit and ALiBi slope (float32), each None when not given; ``o_ref (bq, E)`` and
    ``lse_ref (bq,)`` this program's output tile and row log-sum-exp.
    """
    i0 = pl.program_id(2) * block_q
    lane_q = jnp.arange(tile_q, dtype=jnp.int32)
    lane_k = jnp.arange(tile_k, dtype=jnp.int32)
    rows = i0 + lane_q  # (bq,) query positions i
    row_ok = (lane_q < block_q) & (rows < L)
    q = q_ref[pl.ds(i0, tile_q), :]  # (bq, D)
    left, right = (None, None) if window is None else window
    if q_seg_ref is not None:
        q_seg = q_seg_ref[pl.ds(i0, tile_q)]  # (bq,) this block's rows' segments

    def one_key_block(j, carry):
        m, l, acc = carry
        j0 = j * block_k
        cols = j0 + lane_k  # (bk,) key positions j
        k = k_ref[pl.ds(j0, tile_k), :]  # (bk, D)

        # 1. scores = (query @ key^T) * scale, float32.
        s = _dot(q, k, contract_b=1) * scale  # (bq, bk)

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
        #    the input dtype (FlashAttention's practice; exact for float32). A value row that
        #    no row of this block attends is selected away, not multiplied by its zero weight:
        #    NaN or inf there (padding, unused cache slots) never reaches the output.
        v = v_ref[pl.ds(j0, tile_k), :]  # (bk, E)
        attended = allowed.astype(jnp.int32).max(axis=0) != 0  # (bk,) keys some row attends
        v = jnp.where(attended[:, None], v, jnp.zeros_like(v))
        acc = acc * alpha[:, None] + _dot(p.astype(v.dtype), v, contract_b=0)  # (bq, E)
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
    # 6. (end) back to the input dtype.
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)


def _validate(query, key, value, **keywords) -> AttentionDims:
    """The contract's validation (attention_spec), then this kernel's own limit: no float64."""
    dims = check_attention(query, key, value, **keywords)  # value: NO_VALUE for weights
    if query.dtype.name not in KERNEL_DTYPES:
        raise make_error(
            "unsupported_dtype",
            f"the Pallas kernel computes {', '.join(KERNEL_DTYPES)}; got {query.dtype.name} "
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
) -> tuple[jax.Array, jax.Array]:
    """Launch the kernel on validated inputs; returns the output ``(..., H, L, E)`` and the
    row log-sum-exp ``(..., H, L)`` (float32)."""
    H, G, L, S, E = dims.H, dims.G, dims.L, dims.S, dims.E
    if math.prod(dims.output_shape) == 0:  # L = 0 or an empty batch: nothing to launch
        lse = jnp.full((*dims.batch, H, L), -jnp.inf, jnp.float32)
        return jnp.zeros(dims.output_shape, query.dtype), lse
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

    kernel = functools.partial(
        _flash_forward_kernel,
        L=L, S=S, scale=dims.scale, softcap=dims.softcap,
        offset=causal_offset(L, S, causal_alignment), is_causal=dims.is_causal,
        window=dims.window, block_q=block_q, block_k=block_k, tile_q=tile_q, tile_k=tile_k,
    )  # fmt: skip
    names = list(operands)

    def with_refs(*refs):  # the given operands' refs in order, then o_ref, lse_ref
        given = dict(zip(names, refs))
        optional = ("mask", "bias", "q_seg", "kv_seg", "sinks", "slopes")
        kernel(given["q"], given["k"], given["v"], *(given.get(n) for n in optional),
               *refs[len(names):])  # fmt: skip

    def launch(*operands: jax.Array, interpret: bool) -> tuple[jax.Array, jax.Array]:
        return pl.pallas_call(
            with_refs,
            out_shape=(
                jax.ShapeDtypeStruct((B, H, n_q, tile_q, Ep), query.dtype),
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
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    return_lse: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """The contract's attention output ``(..., H, L, E)``, computed by the Pallas kernel.

    Args:
        query: ``(..., H, L, D)``; float32, float16 or bfloat16.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
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
        block_q: query rows per program (any integer >= 1; it need not divide L).
        block_k: keys per step of a program's loop (any integer >= 1; it need not divide S).
        return_lse: also return the row log-sum-exp of the final scores, the sink included,
            ``(..., H, L)`` float32; ``-inf`` for a row with no allowed key.

    Jit it with every keyword but the arrays static (``prepare`` does).

    Returns the output in the query's dtype (rows with no allowed key are zeros), or
    ``(output, lse)``.

    Raises the contract's errors (attention_spec) before any launch, ConfigError for a block
    size < 1, and DTypeError ``unsupported_dtype`` for float64.
    """
    dims = _validate(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes,
    )  # fmt: skip
    check_block_sizes(block_q, block_k)
    return_lse = check_flag("return_lse", return_lse)
    out, lse = _forward(
        query, key, value, dims, causal_alignment, mask, bias, q_segment_ids, kv_segment_ids,
        sinks, alibi_slopes, block_q, block_k,
    )  # fmt: skip
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
) -> jax.Array:
    """:func:`flash_attention` with the default blocks (``BLOCK_Q`` x ``BLOCK_K``)."""
    return flash_attention(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes,
    )  # fmt: skip


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
) -> jax.Array:
    """The weights ``(..., H, L, S)`` as the kernel computes them: the kernel run with the
    identity as value (E = S, one value column per key), so that output row i is weight row i.
    For checking the kernel weight by weight."""
    dims = _validate(
        query, key, NO_VALUE, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes,
    )  # fmt: skip
    K, S = dims.K, dims.S
    identity = jnp.broadcast_to(jnp.eye(S, dtype=query.dtype), (K, S, S))  # (K, S, E=S)
    out, _ = _forward(
        query, key, identity, dataclasses.replace(dims, E=S), causal_alignment, mask, bias,
        q_segment_ids, kv_segment_ids, sinks, alibi_slopes, BLOCK_Q, BLOCK_K,
    )  # fmt: skip
    return out
