"""FP8 quantization in JAX (Contract v3, "FP8 inputs and caches"): ``quantize_fp8``.

The same steps, names and comments as ``impl_numpy/fp8.py`` and ``impl_torch/fp8.py``; the three
agree bit for bit. XLA rewrites ``x / broadcast(d)`` as ``x * (1 / d)`` (one reciprocal, then
multiplies), which is an ulp off for a quarter to a half of the quotients, and a quotient an ulp
off a tie rounds to the other fp8 neighbour: the two divisions here take their operands through
``jax.lax.optimization_barrier``, so XLA sees no broadcast divisor and divides.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from attention_spec import MIN_DESCALE, SUPPORTED_DTYPES, check_quantize_fp8, dtype_name

__all__ = ["quantize_fp8"]


def _divided(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a / b`` in float32, correctly rounded: both at ``a``'s shape behind an optimization
    barrier, so XLA cannot turn the division into a multiplication by a reciprocal."""
    a, b = jax.lax.optimization_barrier((a, jnp.broadcast_to(b, a.shape)))
    return a / b


def quantize_fp8(
    x: jax.Array,
    dtype: str = "float8_e4m3fn",
    *,
    axes: int | Sequence[int] = (-2, -1),
    descale: jax.Array | float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``x`` in fp8 with its descale: ``x ~ float(x_fp8) * descale``.

    Args:
        x: float64/32/16 or bfloat16, any shape (heads-first ``(..., H, L, D)``: the default
            ``axes=(-2, -1)`` gives one descale per head, ``(..., H)``).
        dtype: ``"float8_e4m3fn"`` (max 448) or ``"float8_e5m2"`` (max 57344).
        axes: the axes one descale covers.
        descale: None (dynamic: ``max(max|x| over axes / fp8_max, 2**-126)``, 1.0 where
            max|x| is 0) or a static float32 descale broadcastable to x's shape without
            ``axes`` (a calibrated scale).

    Returns ``(x_fp8, descale)``: ``x_fp8`` of x's shape in ``dtype``, ``x / descale`` computed
    in float32, clipped to ``[-fp8_max, fp8_max]`` (saturating, never NaN) and rounded to
    nearest even; ``descale`` float32 of x's shape without ``axes``. A non-finite x is checked
    where x is concrete (not under ``jit``).
    """
    x = x if x is None or hasattr(x, "dtype") else jnp.asarray(x)
    finite = None
    if x is not None and dtype_name(x.dtype) in SUPPORTED_DTYPES:
        try:
            finite = bool(jnp.isfinite(jnp.asarray(x).astype(jnp.float32)).all())
        except jax.errors.ConcretizationTypeError:  # under jit: unchecked
            finite = None
    call = check_quantize_fp8(x, dtype, axes, descale, finite)

    # 1. x in float32 first (a float64 x rounds twice, as torch's own cast does).
    x32 = jnp.asarray(x).astype(jnp.float32)

    # 2. descale: dynamic, max|x| over the axes / fp8_max (at least 2**-126; 1.0 for an all-zero
    #    slice), or the given one; kept with the axes as 1 to broadcast against x.
    if call.descale is None:
        amax = jnp.abs(x32).max(axis=call.axes, keepdims=True)  # x's shape, axes as 1
        d = jnp.maximum(_divided(amax, jnp.float32(call.fp8_max)), jnp.float32(MIN_DESCALE))
        d = jnp.where(amax == 0, jnp.float32(1.0), d)
    else:
        given = call.descale if isinstance(call.descale, float) else descale
        d = jnp.broadcast_to(jnp.asarray(given, jnp.float32), call.shape).reshape(call.keep)

    # 3. quotient x / descale in float32, clipped to [-fp8_max, fp8_max] (saturating: never
    #    NaN), rounded once to nearest even into fp8.
    quotient = _divided(x32, d)  # x's shape
    quotient = jnp.clip(quotient, -call.fp8_max, call.fp8_max)
    x_fp8 = quotient.astype(jnp.dtype(call.dtype))
    return x_fp8, d.reshape(call.shape).astype(jnp.float32)
