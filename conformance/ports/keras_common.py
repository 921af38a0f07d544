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
  keras's ``attn_logits_soft_cap`` (which only JAX on TPU takes; keras raises elsewhere).

:func:`attention_weights` runs the same kernel with the identity as value, so the output is the
weight matrix. There is no public causal-mask function, so the keras ports have no
``causal_mask``.
"""

from __future__ import annotations

import math
from typing import Any

import keras
from keras import ops

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
) -> Any:
    """keras.ops.dot_product_attention on the contract's layout: query (..., H, L, D),
    key (..., K, S, D), value (..., K, S, E) -> (..., H, L, E)."""
    if is_causal and causal_alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"keras has no causal alignment {causal_alignment!r}")
    if is_causal and causal_alignment == "bottom_right":
        raise NotImplementedError("keras.ops.dot_product_attention's is_causal is top-left only")
    D, E = query.shape[-1], value.shape[-1]

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
    )
