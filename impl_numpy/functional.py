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


def _asarray(x: object) -> np.ndarray | None:
    """An array-like as a NumPy array (``np.asarray``); None stays None (not given)."""
    return None if x is None else np.asarray(x)


def _cast(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``x`` in ``dtype``; a finite value too large for it becomes +/-inf (a float64 bias of
    -1e300 is -inf in float32, and masks), as IEEE casting says."""
    with np.errstate(over="ignore"):
        return x.astype(dtype, copy=False)


def _allowed(dims: AttentionDims, mask, causal_alignment: str) -> np.ndarray | None:
    """Step 4's rule, ``allowed(i, j) = mask AND causal``, broadcastable to ``(..., H, L, S)``;
    None when every position is allowed."""
    allowed = mask
    if dims.is_causal:
        causal = causal_mask(dims.L, dims.S, alignment=causal_alignment)  # (L, S)
        allowed = causal if allowed is None else allowed & causal
    return allowed


def _attended(allowed, bias, scores_shape: tuple[int, ...], K: int) -> np.ndarray | None:
    """``(..., K, S)``: True where some query of key/value head k's group may attend key j (it
    is allowed, and its bias is not -inf), for scores of ``scores_shape`` ``(..., H, L, S)`` (a
    whole call, or one block of the tiled path); None when no rule excludes any position."""
    seen = allowed
    if bias is not None:
        seen = bias != -np.inf if seen is None else seen & (bias != -np.inf)
    if seen is None:
        return None
    seen = seen.reshape((1,) * (3 - seen.ndim) + seen.shape).any(axis=-2)  # (..., H|1, S|1)
    *batch, H, _, S = scores_shape
    seen = np.broadcast_to(seen, (*batch, H, S))  # (..., H, S)
    return seen.reshape(*batch, K, H // K, S).any(axis=-2)  # (..., K, S)


def _unattended_zeroed(x: np.ndarray, attended) -> np.ndarray:
    """Key or value rows ``(..., K, S, D|E)`` that no query attends set to zero, so NaN or inf
    held there (padding, unused cache slots) never reaches the output through 0 * NaN."""
    return x if attended is None else np.where(attended[..., None], x, 0.0)


def _weights(query, key, dims: AttentionDims, allowed, bias) -> np.ndarray:
    """Steps 1-5 of the contract; returns the weights ``(..., H, L, S)`` in the compute dtype."""
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

    # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
    if dims.softcap is not None:
        s /= dims.softcap
        np.tanh(s, out=s)
        s *= dims.softcap

    # 3. additive terms: s = s + bias (in the compute dtype; may hold -inf).
    if bias is not None:
        s += bias

    # 4. allowed: s = -inf where allowed(i, j) = mask AND causal is False.
    if allowed is not None:
        np.copyto(s, -np.inf, where=~allowed)

    # 5. softmax over S, stable; a row with no allowed key (all -inf) gets all-zero weights.
    row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., H, L, 1)
    row_max[~np.isfinite(row_max)] = 0.0  # fully masked row: exp(-inf - 0) = 0, not NaN
    s -= row_max
    np.minimum(s, 0.0, out=s)  # exp(s - max) <= 1 even if s was rounded differently (XLA's FMA)
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

    Array-likes are converted with ``np.asarray``. Rows with no allowed key are all zeros.
    """
    query, key, mask, bias = _asarray(query), _asarray(key), _asarray(mask), _asarray(bias)
    dims = check_attention(
        query,
        key,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
    )
    bias = None if bias is None else _cast(bias, _compute_dtype(query.dtype))
    allowed = _allowed(dims, mask, causal_alignment)
    key = _unattended_zeroed(key, _attended(allowed, bias, dims.scores_shape, dims.K))
    weights = _weights(query, key, dims, allowed, bias)
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

    Returns the output in the query's dtype; rows with no allowed key are zeros. Keys and values
    that no query may attend never reach the output, even when they hold NaN or inf.
    """
    query, key, value = _asarray(query), _asarray(key), _asarray(value)
    mask, bias = _asarray(mask), _asarray(bias)
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
    )
    bias = None if bias is None else _cast(bias, _compute_dtype(query.dtype))
    allowed = _allowed(dims, mask, causal_alignment)
    attended = _attended(allowed, bias, dims.scores_shape, dims.K)
    key, value = _unattended_zeroed(key, attended), _unattended_zeroed(value, attended)
    weights = _weights(query, key, dims, allowed, bias)
    K, G, L, E = dims.K, dims.G, dims.L, dims.E

    # 6. output = weights @ value, per group, then back to the input dtype.
    w = weights.reshape(*weights.shape[:-3], K, G, L, dims.S)  # (..., K, G, L, S)
    v = value.astype(weights.dtype, copy=False)[..., :, None, :, :]  # (..., K, 1, S, E)
    out = (w @ v).reshape(*dims.batch, K * G, L, E)  # (..., H, L, E)
    return out.astype(query.dtype, copy=False)
