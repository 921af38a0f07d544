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

from attention_spec import (
    AttentionDims,
    alibi_slope_values,
    causal_offset,
    check_attention,
    check_causal_mask_args,
    check_size,
)
from attention_spec.rules import alibi, causal, segments, window

__all__ = ["alibi_slopes", "attention_weights", "causal_mask", "scaled_dot_product_attention"]


def causal_mask(q_len: int, kv_len: int, *, alignment: str = "top_left") -> np.ndarray:
    """Boolean ``(L, S)`` mask, True where query i may attend key j (``j <= i + offset``).

    ``alignment="top_left"``: offset 0. ``"bottom_right"``: offset ``S - L`` (KV-cache decoding).
    """
    check_causal_mask_args(q_len, kv_len, alignment)
    offset = causal_offset(q_len, kv_len, alignment)
    i = np.arange(q_len)[:, None]  # (L, 1)
    j = np.arange(kv_len)[None, :]  # (1, S)
    return causal(i, j, offset)  # (L, S)


def alibi_slopes(n_heads: int) -> np.ndarray:
    """The ALiBi paper's slopes of ``n_heads`` heads, ``(H,)`` float32: ``2 ** (-8 (h + 1) / H)``
    for H a power of two, interleaved from the next power of two otherwise."""
    check_size("n_heads (H)", n_heads)
    return np.asarray(alibi_slope_values(n_heads), np.float32)


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """float64 stays float64; float32, float16 and bfloat16 are computed in float32."""
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _asarray(x: object) -> np.ndarray | None:
    """An array-like as a NumPy array (``np.asarray``); None stays None (not given)."""
    return None if x is None else np.asarray(x)


def _cast(x: np.ndarray | None, dtype: np.dtype) -> np.ndarray | None:
    """``x`` in ``dtype``; a finite value too large for it becomes +/-inf (a float64 bias of
    -1e300 is -inf in float32, and masks), as IEEE casting says. None stays None."""
    if x is None:
        return None
    with np.errstate(over="ignore"):
        return x.astype(dtype, copy=False)


def _allowed(dims: AttentionDims, offset: int, i, j, mask, q_segment_ids, kv_segment_ids):
    """Step 4's rule for query rows ``i (L|bq, 1)`` and keys ``j (1, S|bk)`` (a whole call, or
    one block of the tiled path, with that block's slices of mask and segment ids):
    ``allowed(i, j) = mask AND causal AND window AND same segment``, broadcastable to
    ``(..., H, L, S)``; None when no rule is given."""
    rules = [] if mask is None else [mask]
    if dims.is_causal:
        rules.append(causal(i, j, offset))  # (L, S)
    if dims.window is not None:
        rules.append(window(i, j, offset, dims.window))  # (L, S)
    if q_segment_ids is not None:
        rules.append(segments(q_segment_ids, kv_segment_ids))  # (..., 1, L, S)
    if not rules:
        return None
    allowed = rules[0]
    for rule in rules[1:]:
        allowed = allowed & rule
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


def _weights(query, key, dims: AttentionDims, offset: int, allowed, bias, slopes, sinks):
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

    # 3. additive terms: s = s + bias (in the compute dtype; may hold -inf) + ALiBi's
    #    -slope[h] * |i + offset - j|.
    if bias is not None:
        s += bias
    if slopes is not None:
        i, j = np.arange(L)[:, None], np.arange(S)[None, :]  # (L, 1), (1, S)
        s += alibi(slopes[:, None, None], i, j, offset)  # (H, L, S)

    # 4. allowed: s = -inf where allowed(i, j) = mask AND causal AND window AND segment is False.
    if allowed is not None:
        np.copyto(s, -np.inf, where=~allowed)

    # 5. softmax over S, stable, with a sink per head: one more logit in the denominator; a row
    #    with no allowed key (all -inf) gets all-zero weights, sink or not.
    row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., H, L, 1)
    if sinks is not None:
        row_max = np.maximum(row_max, sinks[:, None, None])  # the sink's logit counts too
    row_max[~np.isfinite(row_max)] = 0.0  # fully masked row: exp(-inf - 0) = 0, not NaN
    s -= row_max
    np.minimum(s, 0.0, out=s)  # exp(s - max) <= 1 even if s was rounded differently (XLA's FMA)
    np.exp(s, out=s)
    row_sum = s.sum(axis=-1, keepdims=True)  # (..., H, L, 1)
    if sinks is not None:
        row_sum += np.exp(np.minimum(sinks[:, None, None] - row_max, 0.0))  # the sink's share
    row_sum[row_sum == 0.0] = 1.0  # fully masked row: 0 / 1 = 0
    s /= row_sum
    return s


def _prepared(query, key, dims: AttentionDims, causal_alignment: str, mask, bias, kw):
    """What steps 1-5 need: the causal offset, the allowed rule, the bias, slopes and sinks in
    the compute dtype, and the key/value rows no query attends (``kw``: the v2 arrays)."""
    ct = _compute_dtype(query.dtype)
    offset = causal_offset(dims.L, dims.S, causal_alignment)  # query i sees key j iff ...
    i, j = np.arange(dims.L)[:, None], np.arange(dims.S)[None, :]  # (L, 1), (1, S)
    allowed = _allowed(dims, offset, i, j, mask, kw["q_segment_ids"], kw["kv_segment_ids"])
    bias = _cast(bias, ct)
    attended = _attended(allowed, bias, dims.scores_shape, dims.K)
    return offset, allowed, bias, _cast(kw["alibi_slopes"], ct), _cast(kw["sinks"], ct), attended


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
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
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
        window: ``(left, right)``: query i sees keys ``i + offset - left .. i + offset + right``
            (inclusive; a side of None is unbounded), with the diagonal of ``causal_alignment``.
        q_segment_ids, kv_segment_ids: integers broadcastable to ``(..., L)`` and ``(..., S)``,
            both or neither: a query attends only keys of its own segment (packed documents).
        sinks: ``(H,)`` floating, one extra logit per head in the softmax's denominator.
        alibi_slopes: ``(H,)`` floating: ``-slope[h] * |i + offset - j|`` is added to the scores.

    Array-likes are converted with ``np.asarray``. Rows with no allowed key are all zeros.
    """
    query, key, mask, bias = _asarray(query), _asarray(key), _asarray(mask), _asarray(bias)
    kw = {"q_segment_ids": q_segment_ids, "kv_segment_ids": kv_segment_ids, "sinks": sinks,
          "alibi_slopes": alibi_slopes}  # fmt: skip
    kw = {name: _asarray(x) for name, x in kw.items()}
    dims = check_attention(
        query,
        key,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
        window=window,
        **kw,
    )
    offset, allowed, bias, slopes, sinks, attended = _prepared(
        query, key, dims, causal_alignment, mask, bias, kw
    )
    key = _unattended_zeroed(key, attended)
    weights = _weights(query, key, dims, offset, allowed, bias, slopes, sinks)
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
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
) -> np.ndarray:
    """``softmax(query @ key^T * scale [+ bias] [masked]) @ value``, shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: see :func:`attention_weights`.

    Returns the output in the query's dtype; rows with no allowed key are zeros. Keys and values
    that no query may attend never reach the output, even when they hold NaN or inf.
    """
    query, key, value = _asarray(query), _asarray(key), _asarray(value)
    mask, bias = _asarray(mask), _asarray(bias)
    kw = {"q_segment_ids": q_segment_ids, "kv_segment_ids": kv_segment_ids, "sinks": sinks,
          "alibi_slopes": alibi_slopes}  # fmt: skip
    kw = {name: _asarray(x) for name, x in kw.items()}
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
    offset, allowed, bias, slopes, sinks, attended = _prepared(
        query, key, dims, causal_alignment, mask, bias, kw
    )
    key, value = _unattended_zeroed(key, attended), _unattended_zeroed(value, attended)
    weights = _weights(query, key, dims, offset, allowed, bias, slopes, sinks)
    K, G, L, E = dims.K, dims.G, dims.L, dims.E

    # 6. output = weights @ value, per group, then back to the input dtype.
    w = weights.reshape(*weights.shape[:-3], K, G, L, dims.S)  # (..., K, G, L, S)
    v = value.astype(weights.dtype, copy=False)[..., :, None, :, :]  # (..., K, 1, S, E)
    out = (w @ v).reshape(*dims.batch, K * G, L, E)  # (..., H, L, E)
    return out.astype(query.dtype, copy=False)
