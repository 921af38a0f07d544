"""``keras.ops.dot_product_attention`` on the contract's layout: the code of the keras ports.

Keras picks its backend once per process, when ``keras`` is first imported, from the
environment variable ``KERAS_BACKEND``. So each backend is its own port module, which sets the
variable and then imports this one: :mod:`conformance.ports.keras_ops` (JAX) and
:mod:`conformance.ports.keras_ops_torch` (torch). ``python -m conformance`` runs each port in a
child process of its own, so both can be checked in one command; in one Python process only the
first one imported can load (:func:`require_backend` says so instead of measuring the wrong
backend).

The wrapper does layout plumbing only, never semantics:

- heads-first ``(..., H, L, D)`` in and out, heads-second ``(B, L, H, D)`` for keras, by
  swapping the two axes; the rank is kept (keras takes exactly 4-D inputs and refuses others);
- ``mask`` and ``bias`` are keras's own ``mask`` and ``bias`` (same broadcast layout
  ``(B, H, L, S)``), passed as given, as is ``is_causal``;
- keras documents value with the shape of key, and its JAX backend refuses E != D; the wrapper
  pads the smaller head dim with zeros (zero columns change neither the scores nor the output),
  passing the default scale 1/sqrt(D) of the unpadded D when it pads the query;
- bottom-right causal alignment does not exist in keras: NotImplementedError; ``softcap`` goes to
  keras's ``attn_logits_soft_cap`` (which only JAX on TPU takes; keras raises elsewhere);
- fp8 (contract v3): the fp8 tensors go to keras as they are, ``q_descale * k_descale`` folded
  into ``scale`` where each is one number and the output times ``v_descale``
  (:mod:`conformance.ports.descales`); on CPU keras refuses fp8 on both backends (measured in
  the xfails);
- the v2 rules are what a keras user hands the op: a ``window`` (placed on the diagonal of
  ``causal_alignment``, both alignments, since it is a mask built here) and packed
  ``q_segment_ids``/``kv_segment_ids`` become a boolean ``mask`` (AND the caller's),
  ``alibi_slopes`` an additive ``bias`` ``-slope[h] * |i + offset - j|`` in the slopes' dtype
  (plus the caller's), built here from the contract's formulas with ``keras.ops``; keras has no
  ``sinks``: NotImplementedError.

:func:`attention_weights` runs the same kernel with the identity as value, so the output is the
weight matrix. There is no public causal-mask function, so the keras ports have no
``causal_mask``.
"""

from __future__ import annotations

import math
from typing import Any

import keras
from keras import ops

from conformance.ports.descales import is_fp8, takes_descales

__all__ = ["attention_weights", "require_backend", "scaled_dot_product_attention"]


def require_backend(name: str) -> None:
    """Raise ImportError unless keras runs on ``name`` in this process."""
    if keras.backend.backend() != name:
        raise ImportError(
            f"keras is already imported in this process with the {keras.backend.backend()!r} "
            f"backend, and picks its backend once per process: run the {name} keras port in a "
            "process of its own (python -m conformance gives each port a child process, except "
            "with --in-process or --list)"
        )


def _pad_last(x: Any, extra: int) -> Any:
    """``x`` with ``extra`` zero columns appended to its last axis (none when ``extra <= 0``)."""
    if extra <= 0:
        return x
    return ops.pad(x, [(0, 0)] * (len(x.shape) - 1) + [(0, extra)])


def _output(out: Any, query: Any, factor: Any) -> Any:
    """keras's output times the v_descale ``factor`` (float32), in the contract's dtype."""
    target = "bfloat16" if is_fp8(query.dtype) else keras.backend.standardize_dtype(query.dtype)
    if factor is not None:
        out = ops.multiply(ops.cast(out, "float32"), ops.convert_to_tensor(factor))
    return ops.cast(out, target)


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "keras.ops.dot_product_attention"


@takes_descales(_KERNEL, _output)
def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    *,
    mask: Any = None,
    bias: Any = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: Any = None,
    kv_segment_ids: Any = None,
    sinks: Any = None,
    alibi_slopes: Any = None,
) -> Any:
    """keras.ops.dot_product_attention on the contract's layout: query (..., H, L, D),
    key (..., K, S, D), value (..., K, S, E) -> (..., H, L, E)."""
    if sinks is not None:
        raise NotImplementedError("keras.ops.dot_product_attention has no sinks")
    if is_causal and causal_alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"keras has no causal alignment {causal_alignment!r}")
    if is_causal and causal_alignment == "bottom_right":
        raise NotImplementedError("keras.ops.dot_product_attention's is_causal is top-left only")
    D, E = query.shape[-1], value.shape[-1]
    mask, bias = _extra_as_mask_and_bias(
        mask, bias, query.shape[-2], key.shape[-2], causal_alignment, window, q_segment_ids,
        kv_segment_ids, alibi_slopes,
    )

    # Head dims: keras wants value's E equal to D; zero columns change nothing. query and key
    # get the same number of columns, so a key whose D differs from the query's still differs.
    if E > D:
        if scale is None and D > 0:
            scale = 1.0 / math.sqrt(D)
        query, key = _pad_last(query, E - D), _pad_last(key, E - D)
    value = _pad_last(value, D - E)

    # Heads second: (..., N, T, X) -> (..., T, N, X).
    out = ops.dot_product_attention(
        ops.swapaxes(query, -3, -2),
        ops.swapaxes(key, -3, -2),
        ops.swapaxes(value, -3, -2),
        bias=bias,
        mask=mask,
        scale=scale,
        is_causal=is_causal,
        attn_logits_soft_cap=softcap,
    )  # (..., L, H, max(D, E))
    return ops.swapaxes(out, -3, -2)[..., :E]  # (..., H, L, E)


def _extra_as_mask_and_bias(mask, bias, L, S, alignment, window, q_ids, kv_ids, slopes):
    """The window and segments folded into the boolean mask, ALiBi into the bias."""
    offset = 0 if alignment == "top_left" else S - L
    rows = ops.expand_dims(ops.arange(L), 1) + offset  # (L, 1): each row's diagonal key
    keys = ops.expand_dims(ops.arange(S), 0)  # (1, S)
    extra = []
    if window is not None:
        left, right = window
        if left is not None:
            extra.append(ops.greater_equal(keys, rows - left))
        if right is not None:
            extra.append(ops.less_equal(keys, rows + right))
    if q_ids is not None:
        extra.append(ops.equal(q_ids[..., None, :, None], kv_ids[..., None, None, :]))
    for allowed in extra:  # (L, S) or (..., 1, L, S)
        mask = allowed if mask is None else ops.logical_and(mask, allowed)
    if slopes is not None:
        distance = ops.cast(ops.abs(rows - keys), slopes.dtype)  # (L, S)
        alibi = -slopes[:, None, None] * distance  # (H, L, S)
        bias = alibi if bias is None else bias + alibi
    return mask, bias


@takes_descales(_KERNEL, _output)
def attention_weights(
    query: Any,
    key: Any,
    *,
    mask: Any = None,
    bias: Any = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    **extra: Any,  # window, segment ids, sinks, ALiBi slopes
) -> Any:
    """The weights (..., H, L, S) from keras's kernel: attention with value = identity (S x S)."""
    K, S = key.shape[-3], key.shape[-2]
    identity = ops.eye(S, dtype=query.dtype)  # (S, E=S)
    identity = ops.broadcast_to(identity, (*key.shape[:-3], K, S, S))
    return scaled_dot_product_attention(
        query,
        key,
        identity,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
        **extra,
    )
