"""``flax.nnx.dot_product_attention`` as a port: the attention function of flax's
``nnx.MultiHeadAttention`` (its default ``attention_fn``).

Run through the same fixtures as the implementations, its failures are a measured list of
where flax's attention differs from the contract (``flax_nnx.xfails``, and the v2 table in
docs/CONFORMANCE.md). What flax expresses, read from its code (flax 0.12) and measured here:
with no dropout and no ``module`` (inference, as here) it reshapes the batch to one axis and
calls ``jax.nn.dot_product_attention(query, key, value, bias, mask, is_causal=...)``, so its
kernel is JAX's, reached through fewer keywords: no ``scale``, no ``local_window_size``, no
``implementation``, no softcap, no sinks. Its keywords are ``mask`` (True: attend), ``bias``
and ``is_causal`` (top-left).

The wrapper translates the contract's keywords into those, never fixing semantics:

- heads-first ``(..., H, L, D)`` in and out, flax's heads-second ``(..., L, H, D)`` inside;
  mask and bias broadcast to ``(..., H, L, S)`` (flax reshapes them with the batch);
- flax has no ``scale``: its scale is ``1/sqrt(D)`` of the head dim it is given, so the query is
  multiplied by ``scale * sqrt(D)`` (in its dtype), what a flax user does; JAX wants E == D, so
  the narrower side gets zero columns (which change nothing) and the same factor corrects the
  scale for the padded D;
- bottom_right causal: NotImplementedError (``is_causal`` is top-left only); softcap and sinks:
  NotImplementedError (no such argument);
- a ``window``, packed ``q_segment_ids``/``kv_segment_ids`` and ``alibi_slopes`` are what a flax
  user hands it: a boolean mask (the window on the diagonal of ``causal_alignment``, both
  alignments, since it is a mask built here) and an additive bias ``-slope[h] * |i + offset -
  j|``, built here from the contract's formulas and combined with the v1 mask and bias;
- fp8 (contract v3): the fp8 arrays go to flax as they are, ``q_descale * k_descale`` folded
  into the scale (the query's factor above) where each is one number and the output times
  ``v_descale`` (:mod:`conformance.ports.descales`); on CPU JAX's kernel under flax refuses fp8
  (measured in the xfails).

:func:`attention_weights` runs the same function with the identity as value, so the output is
the weight matrix. There is no public causal-mask function and no canonical-weights loader, so
this port has no ``causal_mask`` and no modules.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from conformance.ports.descales import jax_output, takes_descales
from conformance.ports.jax_adapter import from_numpy, to_numpy
from conformance.ports.jax_fused import _pad_last, prepare
from conformance.ports.precision import jax_highest

__all__ = ["attention_weights", "from_numpy", "prepare", "scaled_dot_product_attention", "to_numpy"]


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "flax.nnx.dot_product_attention"


@takes_descales(_KERNEL, jax_output)
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
    """flax's dot_product_attention on the contract's layout: query (..., H, L, D),
    key (..., K, S, D), value (..., K, S, E) -> (..., H, L, E)."""
    if softcap is not None:
        raise NotImplementedError("flax.nnx.dot_product_attention has no softcap")
    if sinks is not None:
        raise NotImplementedError("flax.nnx.dot_product_attention has no sinks")
    if is_causal and causal_alignment != "top_left":
        raise NotImplementedError(
            f"flax.nnx.dot_product_attention's is_causal is top-left only; got {causal_alignment!r}"
        )
    H, L, D = query.shape[-3:]
    S, E = key.shape[-2], value.shape[-1]
    offset = S - L if causal_alignment == "bottom_right" else 0
    i, j = jnp.arange(L)[:, None], jnp.arange(S)[None, :]  # (L, 1), (1, S)
    if window is not None:  # a boolean (L, S) band on the alignment's diagonal
        left, right = window
        band = jnp.ones((L, S), bool)
        if left is not None:
            band = band & (j >= i + offset - left)
        if right is not None:
            band = band & (j <= i + offset + right)
        mask = band if mask is None else mask & band
    if q_segment_ids is not None:
        same = q_segment_ids[..., None, :, None] == kv_segment_ids[..., None, None, :]
        mask = same if mask is None else mask & same
    if alibi_slopes is not None:
        distance = jnp.abs(i + offset - j).astype(alibi_slopes.dtype)
        alibi = -alibi_slopes[:, None, None] * distance  # (H, L, S)
        bias = alibi if bias is None else bias + alibi
    batch = jnp.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])

    # Head dims: JAX (under flax) wants E == D; zero columns change nothing. Scale: flax's is
    # 1/sqrt(width) of what it is given, so the query carries the rest.
    width = max(D, E)
    factor = (1.0 / math.sqrt(D) if scale is None else scale) * math.sqrt(width)
    if factor != 1.0:
        query = query * jnp.asarray(factor, query.dtype)
    query, key, value = _pad_last(query, width), _pad_last(key, width), _pad_last(value, width)

    def scores(x):  # (..., H, L, S)-broadcastable -> (batch, H, L, S)
        return None if x is None else jnp.broadcast_to(x, (*batch, H, L, S))

    with jax_highest():  # traced inside: float32 matmuls in float32, never TF32
        out = nnx.dot_product_attention(
            jnp.swapaxes(query, -3, -2),  # (..., L, H, width)
            jnp.swapaxes(key, -3, -2),  # (..., S, K, width)
            jnp.swapaxes(value, -3, -2),  # (..., S, K, width)
            bias=scores(bias),
            mask=scores(mask),
            is_causal=is_causal,
        )  # (..., L, H, width)
    return jnp.swapaxes(out, -3, -2)[..., :E]  # (..., H, L, E)


@takes_descales(_KERNEL, jax_output)
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
    **extra: Any,  # window, segment ids, sinks, ALiBi slopes
) -> jax.Array:
    """The weights (..., H, L, S) from flax's attention: value = identity (S x S)."""
    K, S = key.shape[-3], key.shape[-2]
    identity = jnp.broadcast_to(jnp.eye(S, dtype=query.dtype), (*key.shape[:-3], K, S, S))
    return scaled_dot_product_attention(
        query, key, identity, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, **extra,
    )
