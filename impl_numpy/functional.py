"""Scaled dot-product attention in NumPy: broadcasting and explicit max-subtraction.

The same steps, names and comments as ``impl_torch/functional.py`` and
``impl_jax/functional.py``; only the idiom differs. Here the score tensor is worked on in
place, because that is how NumPy code avoids a new L x S temporary per step.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
import numpy as np

from attention_spec import AttentionDims, causal_offset, check_attention, check_causal_mask_args

__all__ = ["attention_weights", "causal_mask", "scaled_dot_product_attention"]


def causal_mask(q_len: int, kv_len: int, *, alignment: str = "top_left") -> np.ndarray:
    """Boolean ``(L, S)`` mask, True where query i may attend key j (``j <= i + offset``).

    ``alignment="top_left"``: offset 0. ``"bottom_right"``: offset ``S - L`` (KV-cache decoding).
    """
    check_causal_mask_args(q_len, kv_len, alignment)
    offset = causal_offset(q_len, kv_len, alignment)
    i = np.arange(q_len)[:, None]  # (L, 1)
    j = np.arange(kv_len)[None, :]  # (1, S)
    return j <= i + offset  # (L, S)


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """float64 stays float64; float32, float16 and bfloat16 are computed in float32."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _weights(query, key, dims: AttentionDims, mask, bias, is_causal, causal_alignment, softcap):
    """Steps 1-6 of the contract; returns the weights ``(..., H, L, S)`` in the compute dtype."""
    ct = _compute_dtype(query.dtype)
    K, G, L, S, D = dims.K, dims.G, dims.L, dims.S, dims.D

    # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G.
    q = query.astype(ct, copy=False).reshape(*query.shape[:-3], K, G, L, D)  # (..., K, G, L, D)
    k = key.astype(ct, copy=False)[..., :, None, :, :]  # (..., K, 1, S, D)
    s = q @ np.swapaxes(k, -1, -2)  # (..., K, G, L, S): a group of G query heads per kv head
    s = s.reshape(*s.shape[:-4], K * G, L, S)  # (..., H, L, S)
    s *= dims.scale
    if s.shape != dims.scores_shape:  # a mask, bias or value with more batch than query and key
        s = np.broadcast_to(s, dims.scores_shape).copy()  # (..., H, L, S)

    # 2. softcap: s = softcap * tanh(s / softcap), before any bias or mask.
    if softcap is not None:
        s /= softcap
        np.tanh(s, out=s)
        s *= softcap

    # 3. bias: added, may hold -inf.
    if bias is not None:
        s += bias.astype(ct, copy=False)

    # 4. mask: False -> -inf.
    if mask is not None:
        np.copyto(s, -np.inf, where=~mask)

    # 5. causal: query i sees key j iff j <= i + offset.
    if is_causal:
        np.copyto(s, -np.inf, where=~causal_mask(L, S, alignment=causal_alignment))

    # 6. softmax over S, stable; a row with no allowed key (all -inf) gets all-zero weights.
    row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., H, L, 1)
    row_max[~np.isfinite(row_max)] = 0.0  # fully masked row: exp(-inf - 0) = 0, not NaN
    s -= row_max
    np.exp(s, out=s)
    row_sum = s.sum(axis=-1, keepdims=True)  # (..., H, L, 1)
    row_sum[row_sum == 0.0] = 1.0  # fully masked row: 0 / 1 = 0
    s /= row_sum
    return s


def attention_weights(
    query: np.ndarray,
    key: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
) -> np.ndarray:
    """Attention weights ``softmax(scores)``, shape ``(..., H, L, S)``, in the query's dtype.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        mask: boolean, broadcastable to ``(..., H, L, S)``; True = may attend.
        bias: floating, broadcastable to ``(..., H, L, S)``; added to the scores, may hold -inf.
        is_causal: apply the causal rule of ``causal_alignment`` ("top_left" | "bottom_right").
        scale: score scale, default ``1/sqrt(D)``.
        softcap: if given, scores become ``softcap * tanh(scores / softcap)`` before bias/mask.

    Rows with no allowed key are all zeros.
    """
    query, key = np.asarray(query), np.asarray(key)
    mask = None if mask is None else np.asarray(mask)
    bias = None if bias is None else np.asarray(bias)
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
    return weights.astype(query.dtype, copy=False)


def scaled_dot_product_attention(
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
) -> np.ndarray:
    """``softmax(query @ key^T * scale [+ bias] [masked]) @ value``, shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
        mask, bias, is_causal, causal_alignment, scale, softcap: see :func:`attention_weights`.

    Returns the output in the query's dtype; rows with no allowed key are zeros.
    """
    query, key, value = np.asarray(query), np.asarray(key), np.asarray(value)
    mask = None if mask is None else np.asarray(mask)
    bias = None if bias is None else np.asarray(bias)
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
    v = value.astype(weights.dtype, copy=False)[..., :, None, :, :]  # (..., K, 1, S, E)
    out = (w @ v).reshape(*dims.batch, K * G, L, E)  # (..., H, L, E)
    return out.astype(query.dtype, copy=False)
