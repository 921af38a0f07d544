"""Scaled dot-product attention in PyTorch: tensor ops, autograd, any device.

The same steps, names and comments as ``impl_numpy/functional.py`` and
``impl_jax/functional.py``; only the idiom differs. Here a step works in place (``mul_``,
``add_``, ``masked_fill_``, ``sub_``, ``exp_``) wherever autograd keeps nothing that the write
would spoil (softcap's ``tanh`` keeps its output, so it stays out of place): the
``(..., H, L, S)`` scores are the one large tensor, and each new copy of it costs a full pass and
an allocation. The same code runs with and without autograd, on every device.

GQA is a grouped view: the G query heads of a key/value head are G * L rows of
one matmul against that head's keys (``(..., K, G*L, D)``; NumPy does the same, JAX's einsum
names the group axis), so no key or value is copied per query head (``repeat_interleave``
would copy the whole KV cache at every decode step), and nothing leaves the device the tensors
are on.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch

from attention_spec import (
    ARRAY_KEYWORDS,
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


def causal_mask(
    q_len: int,
    kv_len: int,
    *,
    alignment: str = "top_left",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean ``(L, S)`` mask, True where query i may attend key j (``j <= i + offset``).

    ``alignment="top_left"``: offset 0. ``"bottom_right"``: offset ``S - L`` (KV-cache decoding).
    ``device`` is torch's addition: the mask is built where the scores live.
    """
    check_causal_mask_args(q_len, kv_len, alignment)
    offset = causal_offset(q_len, kv_len, alignment)
    i = torch.arange(q_len, device=device)[:, None]  # (L, 1)
    j = torch.arange(kv_len, device=device)[None, :]  # (1, S)
    return causal(i, j, offset)  # (L, S)


def alibi_slopes(n_heads: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """The ALiBi paper's slopes of ``n_heads`` heads, ``(H,)`` float32: ``2 ** (-8 (h + 1) / H)``
    for H a power of two, interleaved from the next power of two otherwise."""
    check_size("n_heads (H)", n_heads)
    return torch.tensor(alibi_slope_values(n_heads), dtype=torch.float32, device=device)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; float32, float16 and bfloat16 are computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _as_tensor(x: object, device: torch.device | None) -> torch.Tensor | None:
    """An array-like as a tensor (``torch.as_tensor``) on ``device``; None stays None (not
    given). A NumPy bfloat16 or fp8 array (``ml_dtypes``), which torch cannot read, goes
    through float32, exactly."""
    if x is None or isinstance(x, torch.Tensor):
        return x
    name = getattr(getattr(x, "dtype", None), "name", None)
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return torch.as_tensor(x.astype("float32"), device=device).to(getattr(torch, name))
    return torch.as_tensor(x, device=device)


def _as_tensors(*arrays: object) -> tuple[torch.Tensor | None, ...]:
    """:func:`_as_tensor` of each, on the device of the first tensor among them."""
    device = next((a.device for a in arrays if isinstance(a, torch.Tensor)), None)
    return tuple(_as_tensor(a, device) for a in arrays)


def _converted(*arrays: object, given: Mapping[str, object]) -> tuple:
    """The call's arrays, converted once: ``arrays`` (query, key, value, grad_output: those the
    function takes) and every array keyword among ``given`` (the function's ``locals()``), with
    :func:`_as_tensors` (on one device). Returns ``(*arrays, keywords)``, ``keywords`` the
    contract's keywords by name (:func:`~attention_spec.call_keywords`), as ``check_attention``
    takes them."""
    keywords = call_keywords(given)
    names = [name for name in ARRAY_KEYWORDS if name in keywords]
    converted = _as_tensors(*arrays, *(keywords[name] for name in names))
    n = len(arrays)
    return (*converted[:n], keywords | dict(zip(names, converted[n:])))


def _cast(x: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``x`` in ``dtype`` (a value too large for it becomes +/-inf); None stays None."""
    return None if x is None else x.to(dtype)


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


def _attended(allowed, bias, scores_shape: tuple[int, ...], K: int) -> torch.Tensor | None:
    """``(..., K, S)``: True where some query of key/value head k's group may attend key j (it
    is allowed, and its bias is not -inf), for scores of ``scores_shape`` ``(..., H, L, S)`` (a
    whole call, or one block of the tiled path); None when no rule excludes any position."""
    seen = allowed
    if bias is not None:
        seen = bias != float("-inf") if seen is None else seen & (bias != float("-inf"))
    if seen is None:
        return None
    seen = seen.reshape((1,) * (3 - seen.dim()) + tuple(seen.shape)).any(dim=-2)  # (..., H|1, S|1)
    *batch, H, _, S = scores_shape
    seen = seen.expand(*batch, H, S)  # (..., H, S)
    return seen.reshape(*batch, K, H // K, S).any(dim=-2)  # (..., K, S)


def _unattended_zeroed(x: torch.Tensor, attended) -> torch.Tensor:
    """Key or value rows ``(..., K, S, D|E)`` that no query attends set to zero, so NaN or inf
    held there (padding, unused cache slots) never reaches the output or a gradient."""
    return x if attended is None else torch.where(attended[..., None], x, 0.0)


def _weights(query, key, call: AttentionCall, prepared: _Prepared):
    """Steps 1-5 of the contract; returns the weights ``(..., H, L, S)`` in the compute dtype."""
    ct = _compute_dtype(query.dtype)
    H, K, G, L, S, D = call.H, call.K, call.G, call.L, call.S, call.D
    allowed, bias, slopes, sinks = prepared.allowed, prepared.bias, prepared.slopes, prepared.sinks

    # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G: the G
    #    query heads of a group are G * L rows against their one key head (a view of the
    #    keys, never a copy per query head).
    q = query.to(ct).reshape(*query.shape[:-3], K, G * L, D)  # (..., K, G*L, D)
    k = key.to(ct)  # (..., K, S, D)
    s = q @ k.transpose(-2, -1)  # (..., K, G*L, S)
    s = s.view(*s.shape[:-3], H, L, S)  # (..., H, L, S)
    s.mul_(call.scale)
    if s.shape != call.scores_shape:  # a mask, bias or value with more batch than query and key
        s = s.expand(call.scores_shape).clone()  # (..., H, L, S)

    # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
    if call.softcap is not None:
        s = call.softcap * torch.tanh(s / call.softcap)  # out of place: tanh keeps its output

    # 3. additive terms: s = s + bias (in the compute dtype; may hold -inf) + ALiBi's
    #    -slope[h] * |i + offset - j|.
    if bias is not None:
        s.add_(bias)
    if slopes is not None:
        i = torch.arange(L, device=s.device)[:, None]  # (L, 1)
        j = torch.arange(S, device=s.device)[None, :]  # (1, S)
        s.add_(alibi(slopes[:, None, None], i, j, call.offset))  # (H, L, S)

    # 4. allowed: s = -inf where allowed(i, j) = mask AND causal AND window AND segment is False.
    if allowed is not None:
        s.masked_fill_(~allowed, float("-inf"))

    # 5. softmax over S, stable, with a sink per head: one more logit in the denominator; a row
    #    with no allowed key (all -inf) gets all-zero weights, sink or not.
    #    Not torch.softmax, one kernel for these dozen ops: it leaves such a row NaN, and its
    #    gradient too, and knows no sink, and zeroing the row after it copies the scores under
    #    autograd. So torch writes NumPy's lines, with autograd or without (amax has no initial
    #    value: with no key at all, S = 0, the row max is -inf).
    row_max = (
        s.detach().amax(dim=-1, keepdim=True)  # (..., H, L, 1)
        if S > 0
        else s.new_full((*s.shape[:-1], 1), float("-inf"))
    )
    if sinks is not None:
        row_max = torch.maximum(row_max, sinks.detach()[:, None, None])  # the sink counts too
    row_max = torch.where(row_max == float("-inf"), 0.0, row_max)  # exp(-inf - 0) = 0, not NaN
    s.sub_(row_max).clamp_(max=0.0)  # exp(s - max) <= 1 even if s was rounded differently
    e = s.exp_()  # (..., H, L, S)
    row_sum = e.sum(dim=-1, keepdim=True)  # (..., H, L, 1)
    if sinks is not None:
        row_sum = row_sum + (sinks[:, None, None] - row_max).clamp(max=0.0).exp()  # its share
    return e / torch.where(row_sum == 0.0, 1.0, row_sum)  # fully masked row: 0 / 1 = 0


class _Prepared(NamedTuple):
    """What steps 1-5 need besides query and key (:func:`_prepared`): the allowed rule
    (broadcastable to ``(..., H, L, S)``, or None), the bias, the ALiBi slopes ``(H,)`` and the
    sinks ``(H,)`` in the compute dtype (each None when not given), and the key/value rows some
    query attends, ``attended (..., K, S)`` (None when every row is)."""

    allowed: torch.Tensor | None
    bias: torch.Tensor | None
    slopes: torch.Tensor | None
    sinks: torch.Tensor | None
    attended: torch.Tensor | None


def _prepared(query, call: AttentionCall, arrays: Mapping[str, torch.Tensor | None]) -> _Prepared:
    """What steps 1-5 need of the validated ``call`` and its array keywords ``arrays`` (by
    name, converted)."""
    ct = _compute_dtype(query.dtype)
    #    The causal and window bands need no elementwise rule when they allow every (i, j) of
    #    the call (``call.bands`` is False; a decode step: one query, bottom-right, sees every
    #    key): then nothing is masked, no key or value row is zeroed (no copy of a KV cache per
    #    step), and no index is built.
    i = torch.arange(call.L, device=query.device)[:, None] if call.bands else None  # (L, 1)
    j = torch.arange(call.S, device=query.device)[None, :] if call.bands else None  # (1, S)
    allowed = _allowed(
        call, call.offset, i, j, arrays["mask"], arrays["q_segment_ids"],
        arrays["kv_segment_ids"], bands=call.bands,
    )
    bias = _cast(arrays["bias"], ct)
    attended = _attended(allowed, bias, call.scores_shape, call.K)
    slopes, sinks = _cast(arrays["alibi_slopes"], ct), _cast(arrays["sinks"], ct)
    return _Prepared(allowed, bias, slopes, sinks, attended)


def _output_dtype(dtype: torch.dtype) -> torch.dtype:
    """The output's and the weights' dtype: the query's, or bfloat16 for an fp8 query."""
    return getattr(torch, output_dtype(dtype_name(dtype)))


def _dequantized(x: torch.Tensor, name: str, call: AttentionCall, kw: Mapping) -> torch.Tensor:
    """Step 0: an fp8 input ``(..., H|K, L|S, D|E)`` as float32 times its descale ``name``
    (``(..., H|K)``, broadcast over the length and head-dim axes; None: 1.0); any other
    input as given."""
    if not is_fp8(dtype_name(x.dtype)):
        return x
    descale = call.keywords[name]  # a float, the ArraySpec of the array given, or None
    x = x.to(torch.float32)
    if descale is None:
        return x
    d = _as_tensor(descale if isinstance(descale, float) else kw[name], x.device)
    return x * d.to(torch.float32)[..., None, None]  # (..., H|K, L|S, D|E)


def attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    q_descale: torch.Tensor | float | None = None,
    k_descale: torch.Tensor | float | None = None,
) -> torch.Tensor:
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

    Array-likes are converted with ``torch.as_tensor`` (on the device of the tensors given).
    Rows with no allowed key are all zeros, with zero gradient.
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
    return weights.to(out_dtype)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    q_descale: torch.Tensor | float | None = None,
    k_descale: torch.Tensor | float | None = None,
    v_descale: torch.Tensor | float | None = None,
) -> torch.Tensor:
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

    # 6. output = weights @ value, per group (G * L rows per value head), then back to the
    #    input dtype.
    K, G, L, E = call.K, call.G, call.L, call.E
    w = weights.reshape(*weights.shape[:-3], K, G * L, call.S)  # (..., K, G*L, S)
    v = value.to(weights.dtype)  # (..., K, S, E)
    out = (w @ v).reshape(*call.batch, K * G, L, E)  # (..., H, L, E)
    return out.to(out_dtype)


def scaled_dot_product_attention_vjp(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    grad_output: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> AttentionGrads:
    """The gradients of ``<scaled_dot_product_attention(...), grad_output>``, by autograd.

    Args:
        query, key, value, mask, bias, is_causal, causal_alignment, scale, softcap, window,
            q_segment_ids, kv_segment_ids, sinks, alibi_slopes: as in
            :func:`scaled_dot_product_attention`.
        grad_output: ``(..., H, L, E)``, the cotangent ``dO`` of the output (its exact shape).

    Returns ``AttentionGrads(query, key, value, bias, sinks)``: ``dQ (..., H, L, D)``,
    ``dK (..., K, S, D)``, ``dV (..., K, S, E)``, ``dbias`` of the bias's shape (None without a
    bias), ``dsinks (H,)`` (None without sinks), each in its input's dtype. The forward above
    is differentiated as written (``torch.autograd.grad``): it is built so that masked
    positions, ``-inf`` bias entries, rows with no allowed key and keys no query attends get
    exactly zero gradient (the row max is detached; unattended rows are selected away, not
    multiplied by zero). impl_numpy writes the same backward out by hand.
    """
    return _vjp_by_autograd(scaled_dot_product_attention, given=locals())


def _vjp_by_autograd(
    forward: Callable[..., torch.Tensor],
    *,
    given: Mapping[str, object],
    checks: tuple[Callable[[], None], ...] = (),
) -> AttentionGrads:
    """The one body of the ``*_vjp`` functions (here and in ``impl_torch.flash``): the inputs as
    tensors on one device, the call validated (``check_attention``, then ``checks``, the
    function's own, then the cotangent's shape) before any arithmetic, and the gradients of
    ``<forward(...), grad_output>`` by ``torch.autograd.grad``.

    ``given`` is the ``*_vjp`` function's ``locals()`` (query, key, value, grad_output and its
    keywords); ``forward(query, key, value, **keywords)`` is differentiated with respect to
    query, key, value, bias and sinks (those given).
    """
    query, key, value, grad_output, kw = _converted(
        given["query"], given["key"], given["value"], given["grad_output"], given=given
    )
    call = check_attention(query, key, value, **kw)
    for check in checks:
        check()
    check_grad_output(call, grad_output)

    # The differentiated inputs as leaves of a new graph (what was not given stays None).
    inputs = {"query": query, "key": key, "value": value, "bias": kw["bias"], "sinks": kw["sinks"]}
    leaves = {n: None if x is None else x.detach().requires_grad_() for n, x in inputs.items()}
    with torch.enable_grad():
        out = forward(
            leaves["query"], leaves["key"], leaves["value"],
            **(kw | {"bias": leaves["bias"], "sinks": leaves["sinks"]}),
        )
    wrt = [x for x in leaves.values() if x is not None]
    grads = torch.autograd.grad(
        out, wrt, grad_output.to(out.dtype), allow_unused=True, materialize_grads=True
    )  # an unused input (S = 0): zeros
    grads = iter(grads)
    return AttentionGrads(**{n: None if x is None else next(grads) for n, x in leaves.items()})
