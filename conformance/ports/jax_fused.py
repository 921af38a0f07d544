"""``jax.nn.dot_product_attention`` as a port: JAX's own kernel (flax's attention uses it too).

Run through the same fixtures as the implementations, its failures are a measured list of
where JAX's kernel differs from the contract (``jax_fused.xfails``, and the table in
docs/CONFORMANCE.md). The generator also uses it to cross-check the goldens.

The wrapper does layout plumbing only, never semantics:

- heads-first ``(..., H, L, D)`` in and out, heads-second ``(B, L, H, D)`` for JAX, with the
  leading batch dims flattened into one (JAX takes exactly one; it does not broadcast batch
  dims, so query/key/value with different batch dims still fail inside JAX);
- JAX requires the value head dim to equal the query/key head dim; the wrapper pads the smaller
  side with zeros (zero columns change neither the scores nor the output) and passes the
  default scale 1/sqrt(D) of the unpadded D;
- mask and bias are broadcast to ``(..., H, L, S)`` and flattened like the batch;
- bottom_right causal alignment and softcap do not exist in JAX: NotImplementedError;
- under ``jax.jit`` on CPU, float16 fails to compile (JAX asks XLA for an ``F16_F16_F32`` dot,
  which XLA:CPU rejects; eager JAX catches that and retries with the default precision, but
  under jit the error only comes at compile time, outside JAX's ``try``). :func:`prepare` jits
  like every JAX port and falls back to eager execution for exactly that error, so float16 is
  still measured;
- fp8 (contract v3): the fp8 arrays go to JAX as they are, ``q_descale * k_descale`` folded into
  ``scale`` where each is one number and the output times ``v_descale``
  (:mod:`conformance.ports.descales`). :func:`prepare` runs a call with descales eagerly: they
  fold as numbers, and the adapter's fp8 jit would check the call with ``attention_spec`` first,
  validation this port does not have. On CPU JAX refuses fp8 (measured in the xfails).

float32 runs with HIGHEST-precision matmuls (``jax.default_matmul_precision("highest")``
entered inside the function, so it holds while ``jit`` traces it): JAX's DEFAULT precision is
TF32 on recent NVIDIA GPUs, whose errors (1e-4 to 1e-3) are far above the fixtures' float32
bounds (~1e-6); that is a precision setting, not the kernel's semantics.

:func:`pinned` gives this port with ``implementation=`` fixed (``"cudnn"``: JAX's cuDNN
attention), so the benchmark gates that row on its own kernel.

:func:`attention_weights` runs the same kernel with the identity as value, so the output is the
weight matrix. There is no public causal-mask function, so this port has no ``causal_mask``.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from attention_spec import AttentionGrads
from conformance.ports import jax_adapter
from conformance.ports.descales import DESCALES, jax_output, takes_descales, without_descales
from conformance.ports.jax_adapter import from_numpy, to_numpy
from conformance.ports.precision import jax_highest

__all__ = [
    "attention_weights",
    "from_numpy",
    "pinned",
    "prepare",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_vjp",
    "to_numpy",
]


def _pad_last(x: jax.Array, size: int) -> jax.Array:
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - x.shape[-1])])


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "jax.nn.dot_product_attention"


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
    implementation: str | None = None,
) -> jax.Array:
    """JAX's dot_product_attention on the contract's layout: query (..., H, L, D),
    key (..., K, S, D), value (..., K, S, E) -> (..., H, L, E). ``implementation`` is passed
    through (None: JAX's default, XLA). A window goes to JAX's own ``local_window_size``
    (top-left only, as its causal rule); packed segments become a boolean mask and ALiBi an
    additive bias, built here from the formulas."""
    if softcap is not None:
        raise NotImplementedError("jax.nn.dot_product_attention has no softcap")
    if sinks is not None:
        raise NotImplementedError("jax.nn.dot_product_attention has no sinks")
    if (is_causal or window is not None) and causal_alignment != "top_left":
        raise NotImplementedError(
            "jax.nn.dot_product_attention's is_causal and local_window_size are top-left only; "
            f"got {causal_alignment!r}"
        )
    local_window = None
    if window is not None:  # JAX's (left, right) in keys before and after the diagonal
        left, right = window
        big = max(query.shape[-2], key.shape[-2])  # an unbounded side: the whole sequence
        local_window = (big if left is None else left, big if right is None else right)
    if q_segment_ids is not None:
        same = q_segment_ids[..., None, :, None] == kv_segment_ids[..., None, None, :]
        mask = same if mask is None else mask & same
    if alibi_slopes is not None:
        rows = jnp.arange(query.shape[-2])[:, None]  # top-left: the diagonal is j = i
        distance = jnp.abs(rows - jnp.arange(key.shape[-2])[None, :]).astype(alibi_slopes.dtype)
        alibi = -alibi_slopes[:, None, None] * distance  # (H, L, S)
        bias = alibi if bias is None else bias + alibi
    H, L, D = query.shape[-3:]
    S, E = key.shape[-2], value.shape[-1]
    batch = jnp.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    if scale is None:
        scale = 1.0 / math.sqrt(D)

    # Head dims: JAX wants value's E equal to D; zero columns change nothing.
    width = max(D, E)
    query, key, value = _pad_last(query, width), _pad_last(key, width), _pad_last(value, width)

    # One batch dim, heads second: (..., N, T, X) -> (B, T, N, X). Each of query, key and
    # value keeps its own batch: JAX does not broadcast them.
    def to_jax(x):
        return jnp.swapaxes(x.reshape(math.prod(x.shape[:-3]), *x.shape[-3:]), -3, -2)

    def flat_scores(x):  # (..., H, L, S)-broadcastable -> (B, H, L, S)
        if x is None:
            return None
        return jnp.broadcast_to(x, (*batch, H, L, S)).reshape(math.prod(batch), H, L, S)

    with jax_highest():  # traced inside: float32 matmuls in float32, never TF32
        out = jax.nn.dot_product_attention(
            to_jax(query),
            to_jax(key),
            to_jax(value),
            bias=flat_scores(bias),
            mask=flat_scores(mask),
            scale=scale,
            is_causal=is_causal,
            local_window_size=local_window,
            implementation=implementation,
        )  # (B, L, H, width)
    out = jnp.swapaxes(out, -3, -2)[..., :E]  # (B, H, L, E)
    return out.reshape(*batch, H, L, E)


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
    implementation: str | None = None,
) -> AttentionGrads:
    """JAX's own backward of its kernel: ``jax.vjp`` of :func:`scaled_dot_product_attention`
    (the same call, the same translation) with ``grad_output`` as the cotangent. Gradients for
    query, key, value and bias (None where not given); no sinks (NotImplementedError)."""
    keywords = dict(mask=mask, is_causal=is_causal, causal_alignment=causal_alignment,
                    scale=scale, softcap=softcap, window=window, q_segment_ids=q_segment_ids,
                    kv_segment_ids=kv_segment_ids, sinks=sinks, alibi_slopes=alibi_slopes,
                    implementation=implementation)  # fmt: skip

    def forward(query, key, value, bias):
        return scaled_dot_product_attention(query, key, value, bias=bias, **keywords)

    with jax_highest():
        out, pullback = jax.vjp(forward, query, key, value, bias)
        dq, dk, dv, dbias = pullback(grad_output.astype(out.dtype))
    return AttentionGrads(dq, dk, dv, dbias, None)


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
    implementation: str | None = None,
    **extra: Any,  # window, segment ids, sinks, ALiBi slopes
) -> jax.Array:
    """The weights (..., H, L, S) from JAX's kernel: attention with value = identity (S x S)."""
    K, S = key.shape[-3], key.shape[-2]
    identity = jnp.broadcast_to(jnp.eye(S, dtype=query.dtype), (*key.shape[:-3], K, S, S))
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
        implementation=implementation,
        **extra,
    )


def prepare(alias: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """Jit like every JAX port; eager only where XLA:CPU refuses JAX's float16 dot precision,
    and for an fp8 call with descales (the module docstring says why)."""
    jitted = jax_adapter.prepare(alias, without_descales(function))

    def run(*args: Any, **kwargs: Any) -> Any:
        if any(kwargs.get(name) is not None for name in DESCALES):
            return function(*args, **kwargs)
        try:
            return jitted(*args, **kwargs)
        except ValueError as exc:
            if "not supported by dot_general" not in str(exc):
                raise
            return function(*args, **kwargs)

    return run


def pinned(implementation: str) -> types.ModuleType:
    """This port with ``implementation`` fixed (``"xla"`` or ``"cudnn"``), named
    ``conformance.ports.jax_fused[<implementation>]``; its xfails are this port's own file."""
    port = types.ModuleType(f"{__name__}[{implementation}]", f"jax.nn.dpa, {implementation}")
    port.__file__ = __file__
    for name in (
        "scaled_dot_product_attention",
        "attention_weights",
        "scaled_dot_product_attention_vjp",
    ):
        setattr(port, name, functools.partial(globals()[name], implementation=implementation))
    port.from_numpy, port.to_numpy, port.prepare = from_numpy, to_numpy, prepare
    return port
