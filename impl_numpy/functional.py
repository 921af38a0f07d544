"""Scaled dot-product attention in NumPy: broadcasting and explicit max-subtraction.

The same steps, names and comments as ``impl_torch/functional.py`` and
``impl_jax/functional.py``; only the idiom differs. Here the score tensor is worked on in
place, because that is how NumPy code avoids a new L x S temporary per step.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import ml_dtypes  # bfloat16 and the fp8 formats for NumPy
import numpy as np

from attention_spec import (
    AttentionCall,
    AttentionDims,
    AttentionGrads,
    alibi_slope_values,
    call_keywords,
    causal_offset,
    check_attention,
    check_causal_mask_args,
    check_grad_output,
    check_size,
    dtype_name,
    is_fp8,
    output_dtype,
)
from attention_spec.rules import alibi, causal, segments, window

__all__ = [
    "alibi_slopes",
    "attention_weights",
    "causal_mask",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_vjp",
]


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


def _converted(*arrays: object, given: Mapping[str, object]) -> tuple:
    """The call's arrays, converted once: ``arrays`` (query, key, value, grad_output: those the
    function takes) and every array keyword among ``given`` (the function's ``locals()``), with
    :func:`_asarray`. Returns ``(*arrays, keywords)``, ``keywords`` the contract's keywords by
    name (:func:`~attention_spec.call_keywords`), as ``check_attention`` takes them."""
    return (*(_asarray(x) for x in arrays), call_keywords(given, _asarray))


def _cast(x: np.ndarray | None, dtype: np.dtype) -> np.ndarray | None:
    """``x`` in ``dtype``; a finite value too large for it becomes +/-inf (a float64 bias of
    -1e300 is -inf in float32, and masks), as IEEE casting says. None stays None."""
    if x is None:
        return None
    with np.errstate(over="ignore"):
        return x.astype(dtype, copy=False)


def _allowed(
    dims: AttentionDims, offset: int, i, j, mask, q_segment_ids, kv_segment_ids, bands: bool = True
):
    """Step 4's rule for query rows ``i (L|bq, 1)`` and keys ``j (1, S|bk)`` (a whole call, or
    one block of the tiled path, with that block's slices of mask and segment ids):
    ``allowed(i, j) = mask AND causal AND window AND same segment``, broadcastable to
    ``(..., H, L, S)``; None when no rule is given. ``bands=False``: the causal and window
    rules allow every ``(i, j)`` here, or are not given (:func:`_prepared`, which then passes
    None for ``i`` and ``j``), so only mask and segments remain."""
    rules = [] if mask is None else [mask]
    if dims.is_causal and bands:
        rules.append(causal(i, j, offset))  # (L, S)
    if dims.window is not None and bands:
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


@np.errstate(invalid="ignore")  # a +inf score allowed makes its row NaN (the contract), quietly
def _weights(query, key, call: AttentionCall, prepared: _Prepared, with_sink: bool = False):
    """Steps 1-5 of the contract; returns the weights ``(..., H, L, S)`` in the compute dtype
    (``with_sink``: and the sink's share of each row, ``(..., H, L, 1)``, for the backward)."""
    ct = _compute_dtype(query.dtype)
    K, G, L, S, D = call.K, call.G, call.L, call.S, call.D
    allowed, bias, slopes, sinks = prepared.allowed, prepared.bias, prepared.slopes, prepared.sinks

    # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G: the G
    #    query heads of a group are G * L rows against their one key head (a view of the
    #    keys, never a copy per query head).
    q = query.astype(ct, copy=False).reshape(*query.shape[:-3], K, G * L, D)  # (..., K, G*L, D)
    k = key.astype(ct, copy=False)  # (..., K, S, D)
    s = q @ np.swapaxes(k, -1, -2)  # (..., K, G*L, S)
    s = s.reshape(*s.shape[:-3], K * G, L, S)  # (..., H, L, S)
    s *= call.scale
    if s.shape != call.scores_shape:  # a mask, bias or value with more batch than query and key
        s = np.broadcast_to(s, call.scores_shape).copy()  # (..., H, L, S)

    # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
    if call.softcap is not None:
        s /= call.softcap
        np.tanh(s, out=s)
        s *= call.softcap

    # 3. additive terms: s = s + bias (in the compute dtype; may hold -inf) + ALiBi's
    #    -slope[h] * |i + offset - j|.
    if bias is not None:
        s += bias
    if slopes is not None:
        i, j = np.arange(L)[:, None], np.arange(S)[None, :]  # (L, 1), (1, S)
        s += alibi(slopes[:, None, None], i, j, call.offset)  # (H, L, S)

    # 4. allowed: s = -inf where allowed(i, j) = mask AND causal AND window AND segment is False.
    if allowed is not None:
        np.copyto(s, -np.inf, where=~allowed)

    # 5. softmax over S, stable, with a sink per head: one more logit in the denominator; a row
    #    with no allowed key (all -inf) gets all-zero weights, sink or not.
    row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., H, L, 1)
    if sinks is not None:
        row_max = np.maximum(row_max, sinks[:, None, None])  # the sink's logit counts too
    row_max[row_max == -np.inf] = 0.0  # fully masked row: exp(-inf - 0) = 0, not NaN
    s -= row_max
    np.minimum(s, 0.0, out=s)  # exp(s - max) <= 1 even if s was rounded differently (XLA's FMA)
    np.exp(s, out=s)
    row_sum = s.sum(axis=-1, keepdims=True)  # (..., H, L, 1)
    sink = 0.0
    if sinks is not None:
        sink = np.exp(np.minimum(sinks[:, None, None] - row_max, 0.0))  # (..., H, L, 1)
        row_sum += sink  # the sink's share
    row_sum[row_sum == 0.0] = 1.0  # fully masked row: 0 / 1 = 0
    s /= row_sum
    return (s, sink / row_sum) if with_sink else s


class _Prepared(NamedTuple):
    """What steps 1-5 need besides query and key (:func:`_prepared`): the allowed rule
    (broadcastable to ``(..., H, L, S)``, or None), the bias, the ALiBi slopes ``(H,)`` and the
    sinks ``(H,)`` in the compute dtype (each None when not given), and the key/value rows some
    query attends, ``attended (..., K, S)`` (None when every row is)."""

    allowed: np.ndarray | None
    bias: np.ndarray | None
    slopes: np.ndarray | None
    sinks: np.ndarray | None
    attended: np.ndarray | None


def _prepared(query, call: AttentionCall, arrays: Mapping[str, np.ndarray | None]) -> _Prepared:
    """What steps 1-5 need of the validated ``call`` and its array keywords ``arrays`` (by
    name, converted)."""
    ct = _compute_dtype(query.dtype)
    #    The causal and window bands need no elementwise rule when they allow every (i, j) of
    #    the call (``call.bands`` is False; a decode step: one query, bottom-right, sees every
    #    key): then nothing is masked, no key or value row is zeroed (no copy of a KV cache per
    #    step), and no index is built.
    i = np.arange(call.L)[:, None] if call.bands else None  # (L, 1)
    j = np.arange(call.S)[None, :] if call.bands else None  # (1, S)
    allowed = _allowed(
        call, call.offset, i, j, arrays["mask"], arrays["q_segment_ids"],
        arrays["kv_segment_ids"], bands=call.bands,
    )
    bias = _cast(arrays["bias"], ct)
    attended = _attended(allowed, bias, call.scores_shape, call.K)
    slopes, sinks = _cast(arrays["alibi_slopes"], ct), _cast(arrays["sinks"], ct)
    return _Prepared(allowed, bias, slopes, sinks, attended)


def _output_dtype(dtype: np.dtype) -> np.dtype:
    """The output's and the weights' dtype: the query's, or bfloat16 for an fp8 query."""
    return np.dtype(getattr(ml_dtypes, output_dtype(dtype_name(dtype)), dtype))


def _dequantized(x: np.ndarray, name: str, call: AttentionCall, kw: Mapping) -> np.ndarray:
    """Step 0: an fp8 input ``(..., H|K, L|S, D|E)`` as float32 times its descale ``name``
    (``(..., H|K)``, broadcast over the length and head-dim axes; None: 1.0); any other
    input as given."""
    if not is_fp8(dtype_name(x.dtype)):
        return x
    descale = call.keywords[name]  # a float, the ArraySpec of the array given, or None
    x = x.astype(np.float32)
    if descale is None:
        return x
    d = np.asarray(descale if isinstance(descale, float) else kw[name], np.float32)
    return x * d[..., None, None]  # (..., H|K, L|S, D|E)


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
    q_descale: np.ndarray | float | None = None,
    k_descale: np.ndarray | float | None = None,
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
        q_descale, k_descale: for fp8 query / key (``float8_e4m3fn``, ``float8_e5m2``): float32
            broadcastable to ``(..., H)`` / ``(..., K)``, or a number; None is 1.0. An fp8 input
            x stands for ``float(x) * descale``. Weights take no ``v_descale`` (no value).

    Array-likes are converted with ``np.asarray``. Rows with no allowed key are all zeros.
    """
    query, key, kw = _converted(query, key, given=locals())
    call = check_attention(query, key, **kw)
    # 0. dequantize: an fp8 input is float32 times its descale (the contract's float(x) * d);
    #    the steps below then run in float32, and the result is bfloat16 for an fp8 query.
    out_dtype = _output_dtype(query.dtype)
    query, key = (
        _dequantized(query, "q_descale", call, kw),
        _dequantized(key, "k_descale", call, kw),
    )
    prepared = _prepared(query, call, kw)
    key = _unattended_zeroed(key, prepared.attended)
    weights = _weights(query, key, call, prepared)
    return weights.astype(out_dtype, copy=False)


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
    q_descale: np.ndarray | float | None = None,
    k_descale: np.ndarray | float | None = None,
    v_descale: np.ndarray | float | None = None,
) -> np.ndarray:
    """``softmax(query @ key^T * scale [+ bias] [masked]) @ value``, shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: see :func:`attention_weights`.
        q_descale, k_descale, v_descale: for fp8 inputs, see :func:`attention_weights`;
            ``v_descale`` broadcastable to ``(..., K)``. The output of an fp8 query is bfloat16.

    Returns the output in the query's dtype; rows with no allowed key are zeros. Keys and values
    that no query may attend never reach the output, even when they hold NaN or inf.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    call = check_attention(query, key, value, **kw)
    # 0. dequantize: an fp8 input is float32 times its descale (the contract's float(x) * d);
    #    the steps below then run in float32, and the result is bfloat16 for an fp8 query.
    out_dtype = _output_dtype(query.dtype)
    query = _dequantized(query, "q_descale", call, kw)
    key, value = (
        _dequantized(key, "k_descale", call, kw),
        _dequantized(value, "v_descale", call, kw),
    )
    prepared = _prepared(query, call, kw)
    attended = prepared.attended
    key, value = _unattended_zeroed(key, attended), _unattended_zeroed(value, attended)
    weights = _weights(query, key, call, prepared)
    K, G, L, E = call.K, call.G, call.L, call.E

    # 6. output = weights @ value, per group (G * L rows per value head), then back to the
    #    input dtype.
    w = weights.reshape(*weights.shape[:-3], K, G * L, call.S)  # (..., K, G*L, S)
    v = value.astype(weights.dtype, copy=False)  # (..., K, S, E)
    out = (w @ v).reshape(*call.batch, K * G, L, E)  # (..., H, L, E)
    return out.astype(out_dtype, copy=False)


def _sum_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``x`` summed over the axes it was broadcast along to come from ``shape``: the leading axes
    ``shape`` lacks, and the axes where ``shape`` has 1 (the gradient of a broadcast input)."""
    x = x.sum(axis=tuple(range(x.ndim - len(shape)))) if x.ndim > len(shape) else x
    axes = tuple(a for a, n in enumerate(shape) if n == 1 and x.shape[a] != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


def scaled_dot_product_attention_vjp(
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
) -> AttentionGrads:
    """The gradients of ``<scaled_dot_product_attention(...), grad_output>``, by hand.

    Args:
        query, key, value, mask, bias, is_causal, causal_alignment, scale, softcap, window,
            q_segment_ids, kv_segment_ids, sinks, alibi_slopes: as in
            :func:`scaled_dot_product_attention`.
        grad_output: ``(..., H, L, E)``, the cotangent ``dO`` of the output (its exact shape).

    Returns ``AttentionGrads(query, key, value, bias, sinks)``: ``dQ (..., H, L, D)``,
    ``dK (..., K, S, D)`` and ``dV (..., K, S, E)`` (each summed over the G query heads of its
    group), ``dbias`` of the bias's own shape (None without a bias), ``dsinks (H,)`` (None
    without sinks), each in its input's dtype, computed in the compute dtype. Mask, segment ids,
    window, scale, softcap and ALiBi slopes are not differentiated. Masked positions, ``-inf``
    bias entries, rows with no allowed key and keys no query attends get exactly zero gradient.

    The forward's steps in reverse, 6 to 1, with the same numbers: a step's gradient is the
    chain rule applied to that step alone, and the weights ``W``, the output ``O`` and the
    sink's share are the forward's own (recomputed here; the tiled ``flash_attention_vjp``
    rebuilds them block by block from the row log-sum-exp instead).
    """
    query, key, value, grad_output, kw = _converted(query, key, value, grad_output, given=locals())
    call = check_attention(query, key, value, **kw)
    check_grad_output(call, grad_output)
    prepared = _prepared(query, call, kw)
    attended, bias = prepared.attended, kw["bias"]
    key0, value0 = _unattended_zeroed(key, attended), _unattended_zeroed(value, attended)
    weights, w_sink = _weights(query, key0, call, prepared, with_sink=True)
    ct = weights.dtype
    batch, H, K, G, L, S, D, E = call.batch, call.H, call.K, call.G, call.L, call.S, call.D, call.E
    w = weights.reshape(*batch, K, G, L, S)  # (..., K, G, L, S): W, per group
    q = query.astype(ct, copy=False).reshape(*query.shape[:-3], K, G, L, D)  # (..., K, G, L, D)
    k = key0.astype(ct, copy=False)[..., :, None, :, :]  # (..., K, 1, S, D)
    v = value0.astype(ct, copy=False)[..., :, None, :, :]  # (..., K, 1, S, E)
    do = grad_output.astype(ct, copy=False).reshape(*batch, K, G, L, E)  # (..., K, G, L, E)
    out = w @ v  # (..., K, G, L, E): the forward's output O, in the compute dtype

    # 6. output = weights @ value:  dV = W^T dO, summed over the G query heads that read each
    #    key/value head;  dW = dO V^T.
    dv = (np.swapaxes(w, -1, -2) @ do).sum(axis=-3)  # (..., K, S, E)
    dw = do @ np.swapaxes(v, -1, -2)  # (..., K, G, L, S)

    # 5. softmax (the sink a logit with a zero value):  dS = W * (dW - rowsum(dO * O)), since
    #    sum_j W_ij dW_ij = dO_i . O_i;  dsink_h = -sum_i w_sink,i (dO_i . O_i) over the head's
    #    rows. W = 0 wherever step 4 put -inf, so masked positions, -inf bias entries and rows
    #    with no allowed key get dS = 0 exactly.
    row_dot = (do * out).sum(axis=-1, keepdims=True)  # (..., K, G, L, 1): dO_i . O_i
    ds = w * (dw - row_dot)  # (..., K, G, L, S)
    dsinks = None
    if prepared.sinks is not None:
        share = w_sink.reshape(*batch, K, G, L, 1)  # (..., K, G, L, 1): w_sink,i
        per_row = -(share * row_dot).reshape(*batch, H, L)  # (..., H, L); L may be 0
        dsinks = per_row.sum(axis=(*range(len(batch)), -1))  # (H,)

    # 4. allowed: s = -inf where a rule says no: nothing flows back there (dS is 0 already).

    # 3. additive terms:  dbias = dS, summed over the axes the bias was broadcast along
    #    (ALiBi's slopes are not differentiated).
    ds = ds.reshape(*batch, H, L, S)  # (..., H, L, S)
    dbias = None if bias is None else _sum_to(ds, bias.shape)  # the bias's shape

    # 2. softcap, s = c tanh(s / c):  dS *= 1 - tanh^2(s / c), at the step-1 scores.
    if call.softcap is not None:
        t = np.tanh((q @ np.swapaxes(k, -1, -2)) * (call.scale / call.softcap))  # (..., K, G, L, S)
        ds = ds * (1.0 - t * t).reshape(*t.shape[:-4], H, L, S)

    # 1. scores = (query @ key^T) * scale:  dQ = dS K * scale;  dK = dS^T Q * scale, summed
    #    over the G query heads of each group (key/value head k serves heads k*G .. k*G+G-1).
    ds = ds.reshape(*batch, K, G, L, S)  # (..., K, G, L, S)
    dq = (ds @ k).reshape(*batch, H, L, D) * call.scale  # (..., H, L, D)
    dk = (np.swapaxes(ds, -1, -2) @ q).sum(axis=-3) * call.scale  # (..., K, S, D)

    # The gradient of a broadcast input is summed over its broadcast axes; each in its dtype.
    return AttentionGrads(
        query=_sum_to(dq, query.shape).astype(query.dtype, copy=False),
        key=_sum_to(dk, key.shape).astype(key.dtype, copy=False),
        value=_sum_to(dv, value.shape).astype(value.dtype, copy=False),
        bias=None if dbias is None else dbias.astype(bias.dtype, copy=False),
        sinks=None if dsinks is None else dsinks.astype(kw["sinks"].dtype, copy=False),
    )
