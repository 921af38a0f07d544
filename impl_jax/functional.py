"""Scaled dot-product attention in JAX: pure functions, einsum, jit/vmap/grad.

The same steps, names and comments as ``impl_numpy/functional.py`` and
``impl_torch/functional.py``; only the idiom differs. Here GQA is an einsum over query heads
grouped as ``(K, G)`` against the unexpanded key/value (no copy), and every function is pure:
jit it with the string, bool and float keywords static::

    sdpa = jax.jit(scaled_dot_product_attention, static_argnames=STATIC_ARGNAMES)

Layout is heads-first like the other two, ``(..., H, L, D)``; ``jax.nn.dot_product_attention``
is heads-second, ``(B, L, H, D)``: transpose at the edges.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attention_spec import AttentionDims, causal_offset, check_attention, check_causal_mask_args

__all__ = ["STATIC_ARGNAMES", "attention_weights", "causal_mask", "scaled_dot_product_attention"]

#: The keywords to mark static under ``jax.jit``.
STATIC_ARGNAMES: tuple[str, ...] = ("is_causal", "causal_alignment", "scale", "softcap")

#: A reference computes float32 matmuls in float32, also where XLA would pick TF32 or bf16 passes.
_PRECISION = jax.lax.Precision.HIGHEST


def causal_mask(q_len: int, kv_len: int, *, alignment: str = "top_left") -> jax.Array:
    """Boolean ``(L, S)`` mask, True where query i may attend key j (``j <= i + offset``).

    ``alignment="top_left"``: offset 0. ``"bottom_right"``: offset ``S - L`` (KV-cache decoding).
    """
    check_causal_mask_args(q_len, kv_len, alignment)
    offset = causal_offset(q_len, kv_len, alignment)
    i = jnp.arange(q_len)[:, None]  # (L, 1)
    j = jnp.arange(kv_len)[None, :]  # (1, S)
    return j <= i + offset  # (L, S)


def _compute_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """float64 stays float64; float32, float16 and bfloat16 are computed in float32."""
    return jnp.dtype(jnp.float64) if dtype == jnp.float64 else jnp.dtype(jnp.float32)


def _weights(query, key, dims: AttentionDims, mask, bias, is_causal, causal_alignment, softcap):
    """Steps 1-6 of the contract; returns the weights ``(..., H, L, S)`` in the compute dtype."""
    ct = _compute_dtype(query.dtype)
    H, K, G, L, S, D = dims.H, dims.K, dims.G, dims.L, dims.S, dims.D

    # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G.
    q = query.astype(ct).reshape(*query.shape[:-3], K, G, L, D)  # (..., K, G, L, D)
    k = key.astype(ct)  # (..., K, S, D)
    s = jnp.einsum("...kgld,...ksd->...kgls", q, k, precision=_PRECISION)  # a group per kv head
    s = s.reshape(*s.shape[:-4], H, L, S)  # (..., H, L, S)
    s = s * dims.scale
    s = jnp.broadcast_to(s, dims.scores_shape)  # a mask, bias or value with more batch than q, k

    # 2. softcap: s = softcap * tanh(s / softcap), before any bias or mask.
    if softcap is not None:
        s = softcap * jnp.tanh(s / softcap)

    # 3. bias: added, may hold -inf.
    if bias is not None:
        s = s + bias.astype(ct)

    # 4. mask: False -> -inf.
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)

    # 5. causal: query i sees key j iff j <= i + offset.
    if is_causal:
        s = jnp.where(causal_mask(L, S, alignment=causal_alignment), s, -jnp.inf)

    # 6. softmax over S, stable; a row with no allowed key (all -inf) gets all-zero weights.
    row_max = jnp.max(s, axis=-1, keepdims=True, initial=-jnp.inf)  # (..., H, L, 1)
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)  # exp(-inf - 0) = 0, not NaN
    e = jnp.exp(s - jax.lax.stop_gradient(row_max))  # (..., H, L, S)
    row_sum = jnp.sum(e, axis=-1, keepdims=True)  # (..., H, L, 1)
    return e / jnp.where(row_sum == 0.0, 1.0, row_sum)  # fully masked row: 0 / 1 = 0


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
) -> jax.Array:
    """Attention weights ``softmax(scores)``, shape ``(..., H, L, S)``, in the query's dtype.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        mask: boolean, broadcastable to ``(..., H, L, S)``; True = may attend.
        bias: floating, broadcastable to ``(..., H, L, S)``; added to the scores, may hold -inf.
        is_causal: apply the causal rule of ``causal_alignment`` ("top_left" | "bottom_right").
        scale: score scale, default ``1/sqrt(D)``.
        softcap: if given, scores become ``softcap * tanh(scores / softcap)`` before bias/mask.

    Rows with no allowed key are all zeros, with zero gradient.
    """
    query, key = jnp.asarray(query), jnp.asarray(key)
    mask = None if mask is None else jnp.asarray(mask)
    bias = None if bias is None else jnp.asarray(bias)
    dims = check_attention(
        query,
        key,
        mask=mask,
        bias=bias,
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
    )
    weights = _weights(query, key, dims, mask, bias, is_causal, causal_alignment, softcap)
    return weights.astype(query.dtype)


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
) -> jax.Array:
    """``softmax(query @ key^T * scale [+ bias] [masked]) @ value``, shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
        mask, bias, is_causal, causal_alignment, scale, softcap: see :func:`attention_weights`.

    Returns the output in the query's dtype; rows with no allowed key are zeros.
    """
    query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    mask = None if mask is None else jnp.asarray(mask)
    bias = None if bias is None else jnp.asarray(bias)
    dims = check_attention(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
    )
    weights = _weights(query, key, dims, mask, bias, is_causal, causal_alignment, softcap)
    K, G, L, E = dims.K, dims.G, dims.L, dims.E

    # 7. output = weights @ value, per group, then back to the input dtype.
    w = weights.reshape(*weights.shape[:-3], K, G, L, dims.S)  # (..., K, G, L, S)
    v = value.astype(weights.dtype)  # (..., K, S, E)
    out = jnp.einsum("...kgls,...kse->...kgle", w, v, precision=_PRECISION)  # (..., K, G, L, E)
    return out.reshape(*dims.batch, K * G, L, E).astype(query.dtype)  # (..., H, L, E)
