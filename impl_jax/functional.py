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

from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

from attention_spec import (
    AttentionCall,
    AttentionDims,
    AttentionGrads,
    alibi_slope_values,
    call_keywords,
    causal_offset,
    check_attention,
    check_causal_mask_args,
    check_float64,
    check_grad_output,
    check_size,
    dtype_name,
    is_fp8,
    output_dtype,
)
from attention_spec.rules import alibi, causal, segments, window

__all__ = [
    "STATIC_ARGNAMES",
    "alibi_slopes",
    "attention_weights",
    "causal_mask",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_vjp",
]

#: The keywords to mark static under ``jax.jit``.
STATIC_ARGNAMES: tuple[str, ...] = ("is_causal", "causal_alignment", "scale", "softcap", "window")

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
    return causal(i, j, offset)  # (L, S)


def alibi_slopes(n_heads: int) -> jax.Array:
    """The ALiBi paper's slopes of ``n_heads`` heads, ``(H,)`` float32: ``2 ** (-8 (h + 1) / H)``
    for H a power of two, interleaved from the next power of two otherwise."""
    check_size("n_heads (H)", n_heads)
    return jnp.asarray(alibi_slope_values(n_heads), jnp.float32)


def _compute_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """float64 stays float64; float32, float16 and bfloat16 are computed in float32."""
    return jnp.dtype(jnp.float64) if dtype == jnp.float64 else jnp.dtype(jnp.float32)


def _as_given(x: object) -> object:
    """What validation reads: an array (NumPy, JAX, a tracer) as given, so its own dtype is the
    one a message names (JAX without x64 would turn an int64 mask into int32 first); any other
    array-like converted with ``jnp.asarray``. None stays None (not given)."""
    return x if x is None or hasattr(x, "dtype") else jnp.asarray(x)


def _asarray(x: object) -> jax.Array | None:
    """An array-like as a JAX array (``jnp.asarray``); None stays None."""
    return None if x is None else jnp.asarray(x)


def _converted(*arrays: object, given: Mapping[str, object]) -> tuple:
    """The call's arrays as validation reads them: ``arrays`` (query, key, value, grad_output:
    those the function takes) and every array keyword among ``given`` (the function's
    ``locals()``), with :func:`_as_given`. Returns ``(*arrays, keywords)``, ``keywords`` the
    contract's keywords by name (:func:`~attention_spec.call_keywords`), as
    ``check_attention`` takes them; :func:`_on_device` then makes JAX arrays of them, once
    validation has read their own dtypes."""
    return (*(_as_given(x) for x in arrays), call_keywords(given, _as_given))


def _on_device(*arrays: object, keywords: Mapping[str, object]) -> tuple:
    """``arrays`` and the array keywords of ``keywords``, validated, as JAX arrays
    (:func:`_asarray`): ``(*arrays, keywords)``."""
    return (*(_asarray(x) for x in arrays), call_keywords(keywords, _asarray))


def _cast(x: jax.Array | None, dtype: jnp.dtype) -> jax.Array | None:
    """``x`` in ``dtype`` (a value too large for it becomes +/-inf); None stays None."""
    return None if x is None else x.astype(dtype)


def _check_x64(dtype: object) -> None:
    """float64 (inputs, or a module's weights) needs JAX's 64-bit mode; without it JAX would
    compute in float32: DTypeError ``unsupported_dtype``, the same from every function and
    module."""
    check_float64(dtype_name(dtype), jax.config.jax_enable_x64, _X64_HOW)


_X64_HOW = "JAX's 64-bit mode: jax.config.update('jax_enable_x64', True)"


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


def _attended(allowed, bias, scores_shape: tuple[int, ...], K: int) -> jax.Array | None:
    """``(..., K, S)``: True where some query of key/value head k's group may attend key j (it
    is allowed, and its bias is not -inf), for scores of ``scores_shape`` ``(..., H, L, S)`` (a
    whole call, or one block of the tiled path); None when no rule excludes any position."""
    seen = allowed
    if bias is not None:
        seen = bias != -jnp.inf if seen is None else seen & (bias != -jnp.inf)
    if seen is None:
        return None
    seen = seen.reshape((1,) * (3 - seen.ndim) + seen.shape).any(axis=-2)  # (..., H|1, S|1)
    *batch, H, _, S = scores_shape
    seen = jnp.broadcast_to(seen, (*batch, H, S))  # (..., H, S)
    return seen.reshape(*batch, K, H // K, S).any(axis=-2)  # (..., K, S)


def _unattended_zeroed(x: jax.Array, attended) -> jax.Array:
    """Key or value rows ``(..., K, S, D|E)`` that no query attends set to zero, so NaN or inf
    held there (padding, unused cache slots) never reaches the output or a gradient."""
    return x if attended is None else jnp.where(attended[..., None], x, 0.0)


def _min0(x: jax.Array) -> jax.Array:
    """``min(x, 0)``, differentiated as ``x``: step 5's clamp that keeps ``exp(s - max) <= 1``.
    ``jnp.minimum`` would halve the gradient at the row max's own key, where ``x = 0``, and
    ``jnp.where(x > 0, 0, x)`` would cut it wherever jitted XLA rounds ``x`` above 0."""
    return x - jax.lax.stop_gradient(jnp.maximum(x, 0.0))


def _weights(query, key, call: AttentionCall, prepared: _Prepared):
    """Steps 1-5 of the contract; returns the weights ``(..., H, L, S)`` in the compute dtype."""
    ct = _compute_dtype(query.dtype)
    H, K, G, L, S, D = call.H, call.K, call.G, call.L, call.S, call.D
    allowed, bias, slopes, sinks = prepared.allowed, prepared.bias, prepared.slopes, prepared.sinks

    # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G. The scale
    #    goes on the queries: XLA would recompute s * scale inside each reader of s, the row max
    #    rounded and s - max as one unrounded FMA, which at logits of 1e10 differ by hundreds
    #    (exp of that: 0, a row of zeros); the matmul's output is read as it is.
    q = query.astype(ct).reshape(*query.shape[:-3], K, G, L, D)  # (..., K, G, L, D)
    k = key.astype(ct)  # (..., K, S, D)
    s = jnp.einsum("...kgld,...ksd->...kgls", q * call.scale, k, precision=_PRECISION)
    s = s.reshape(*s.shape[:-4], H, L, S)  # (..., H, L, S); a group per kv head
    s = jnp.broadcast_to(s, call.scores_shape)  # a mask, bias or value with more batch than q, k

    # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
    if call.softcap is not None:
        s = call.softcap * jnp.tanh(s / call.softcap)

    # 3. additive terms: s = s + bias (in the compute dtype; may hold -inf) + ALiBi's
    #    -slope[h] * |i + offset - j|.
    if bias is not None:
        s = s + bias
    if slopes is not None:
        i, j = jnp.arange(L)[:, None], jnp.arange(S)[None, :]  # (L, 1), (1, S)
        s = s + alibi(slopes[:, None, None], i, j, call.offset)  # (H, L, S)

    # 4. allowed: s = -inf where allowed(i, j) = mask AND causal AND window AND segment is False.
    if allowed is not None:
        s = jnp.where(allowed, s, -jnp.inf)

    # 5. softmax over S, stable, with a sink per head: one more logit in the denominator; a row
    #    with no allowed key (all -inf) gets all-zero weights, sink or not.
    row_max = jnp.max(s, axis=-1, keepdims=True, initial=-jnp.inf)  # (..., H, L, 1)
    if sinks is not None:
        row_max = jnp.maximum(row_max, sinks[:, None, None])  # the sink's logit counts too
    row_max = jnp.where(row_max == -jnp.inf, 0.0, row_max)  # exp(-inf - 0) = 0, not NaN
    row_max = jax.lax.stop_gradient(row_max)  # a constant for autodiff, as torch's detach()
    s = _min0(s - row_max)  # exp(s - max) <= 1 even if s was rounded differently
    e = jnp.exp(s)  # (..., H, L, S)
    row_sum = jnp.sum(e, axis=-1, keepdims=True)  # (..., H, L, 1)
    if sinks is not None:
        row_sum = row_sum + jnp.exp(_min0(sinks[:, None, None] - row_max))  # the sink's share
    return e / jnp.where(row_sum == 0.0, 1.0, row_sum)  # fully masked row: 0 / 1 = 0


class _Prepared(NamedTuple):
    """What steps 1-5 need besides query and key (:func:`_prepared`): the allowed rule
    (broadcastable to ``(..., H, L, S)``, or None), the bias, the ALiBi slopes ``(H,)`` and the
    sinks ``(H,)`` in the compute dtype (each None when not given), and the key/value rows some
    query attends, ``attended (..., K, S)`` (None when every row is)."""

    allowed: jax.Array | None
    bias: jax.Array | None
    slopes: jax.Array | None
    sinks: jax.Array | None
    attended: jax.Array | None


def _prepared(query, call: AttentionCall, arrays: Mapping[str, jax.Array | None]) -> _Prepared:
    """What steps 1-5 need of the validated ``call`` and its array keywords ``arrays`` (by
    name, converted)."""
    ct = _compute_dtype(query.dtype)
    #    The causal and window bands need no elementwise rule when they allow every (i, j) of
    #    the call (``call.bands`` is False; a decode step: one query, bottom-right, sees every
    #    key): then nothing is masked, no key or value row is zeroed (no copy of a KV cache per
    #    step), and no index is built.
    i = jnp.arange(call.L)[:, None] if call.bands else None  # (L, 1)
    j = jnp.arange(call.S)[None, :] if call.bands else None  # (1, S)
    allowed = _allowed(
        call, call.offset, i, j, arrays["mask"], arrays["q_segment_ids"],
        arrays["kv_segment_ids"], bands=call.bands,
    )
    bias = _cast(arrays["bias"], ct)
    attended = _attended(allowed, bias, call.scores_shape, call.K)
    slopes, sinks = _cast(arrays["alibi_slopes"], ct), _cast(arrays["sinks"], ct)
    return _Prepared(allowed, bias, slopes, sinks, attended)


def _output_dtype(dtype: jnp.dtype) -> jnp.dtype:
    """The output's and the weights' dtype: the query's, or bfloat16 for an fp8 query."""
    return jnp.dtype(output_dtype(dtype_name(dtype)))


def _dequantized(x: jax.Array, name: str, call: AttentionCall, kw: Mapping) -> jax.Array:
    """Step 0: an fp8 input ``(..., H|K, L|S, D|E)`` as float32 times its descale ``name``
    (``(..., H|K)``, broadcast over the length and head-dim axes; None: 1.0); any other
    input as given."""
    if not is_fp8(dtype_name(x.dtype)):
        return x
    descale = call.keywords[name]  # a float, the ArraySpec of the array given, or None
    x = x.astype(jnp.float32)
    if descale is None:
        return x
    d = jnp.asarray(descale if isinstance(descale, float) else kw[name], jnp.float32)
    return x * d[..., None, None]  # (..., H|K, L|S, D|E)


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

    Array-likes are converted with ``jnp.asarray`` (after validation, which reads a NumPy
    array's own dtype). Rows with no allowed key are all zeros, with zero gradient.
    """
    query, key, kw = _converted(query, key, given=locals())
    call = check_attention(query, key, **kw)
    _check_x64(query.dtype)
    query, key, kw = _on_device(query, key, keywords=kw)
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
    return weights.astype(out_dtype)


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
    that no query may attend never reach the output or a gradient, even holding NaN or inf.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    call = check_attention(query, key, value, **kw)
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
    prepared = _prepared(query, call, kw)
    attended = prepared.attended
    key, value = _unattended_zeroed(key, attended), _unattended_zeroed(value, attended)
    weights = _weights(query, key, call, prepared)
    K, G, L, E = call.K, call.G, call.L, call.E

    # 6. output = weights @ value, per group, then back to the input dtype.
    w = weights.reshape(*weights.shape[:-3], K, G, L, call.S)  # (..., K, G, L, S)
    v = value.astype(weights.dtype)  # (..., K, S, E)
    out = jnp.einsum("...kgls,...kse->...kgle", w, v, precision=_PRECISION)  # (..., K, G, L, E)
    return out.reshape(*call.batch, K * G, L, E).astype(out_dtype)  # (..., H, L, E)


def scaled_dot_product_attention_vjp(
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
) -> AttentionGrads:
    """The gradients of ``<scaled_dot_product_attention(...), grad_output>``, by ``jax.vjp``.

    Args:
        query, key, value, mask, bias, is_causal, causal_alignment, scale, softcap, window,
            q_segment_ids, kv_segment_ids, sinks, alibi_slopes: as in
            :func:`scaled_dot_product_attention`.
        grad_output: ``(..., H, L, E)``, the cotangent ``dO`` of the output (its exact shape).

    Returns ``AttentionGrads(query, key, value, bias, sinks)``: ``dQ (..., H, L, D)``,
    ``dK (..., K, S, D)``, ``dV (..., K, S, E)``, ``dbias`` of the bias's shape (None without a
    bias), ``dsinks (H,)`` (None without sinks), each in its input's dtype. The forward above
    is differentiated as written (``jax.vjp``): it is built so that masked positions, ``-inf``
    bias entries, rows with no allowed key and keys no query attends get exactly zero gradient
    (the row max is a ``stop_gradient``; masks select with ``jnp.where``). impl_numpy writes
    the same backward out by hand. Jit it like the forward, with :data:`STATIC_ARGNAMES`.
    """
    return _vjp_by_jax(scaled_dot_product_attention, given=locals())


def _vjp_by_jax(
    forward: Callable[..., jax.Array],
    *,
    given: Mapping[str, object],
    checks: tuple[Callable[[], None], ...] = (),
) -> AttentionGrads:
    """The one body of the ``*_vjp`` functions (here and in ``impl_jax.flash``): the call
    validated (``check_attention``, then ``checks``, the function's own, then the cotangent's
    shape and x64) before any arithmetic, and the gradients of ``<forward(...), grad_output>``
    by ``jax.vjp``.

    ``given`` is the ``*_vjp`` function's ``locals()`` (query, key, value, grad_output and its
    keywords); ``forward(query, key, value, **keywords)`` is differentiated with respect to
    query, key, value, bias and sinks (None where not given).
    """
    query, key, value, grad_output, kw = _converted(
        given["query"], given["key"], given["value"], given["grad_output"], given=given
    )
    call = check_attention(query, key, value, **kw)
    for check in checks:
        check()
    check_grad_output(call, grad_output)
    _check_x64(query.dtype)
    query, key, value, grad_output, kw = _on_device(query, key, value, grad_output, keywords=kw)

    def differentiated(query, key, value, bias, sinks):  # None: not given
        return forward(query, key, value, **(kw | {"bias": bias, "sinks": sinks}))

    primals = (query, key, value, kw["bias"], kw["sinks"])
    out, pullback = jax.vjp(differentiated, *primals)
    return AttentionGrads(*pullback(grad_output.astype(out.dtype)))
