"""FP8 quantization in NumPy (Contract v3, "FP8 inputs and caches"): ``quantize_fp8``.

The same steps, names and comments as ``impl_torch/fp8.py`` and ``impl_jax/fp8.py``; the three
agree bit for bit. NumPy spells the fp8 formats through ``ml_dtypes``.
"""

from __future__ import annotations

from collections.abc import Sequence

import ml_dtypes
import numpy as np

from attention_spec import MIN_DESCALE, SUPPORTED_DTYPES, check_quantize_fp8, dtype_name

__all__ = ["quantize_fp8"]


def quantize_fp8(
    x: np.ndarray,
    dtype: str = "float8_e4m3fn",
    *,
    axes: int | Sequence[int] = (-2, -1),
    descale: np.ndarray | float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
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
    nearest even; ``descale`` float32 of x's shape without ``axes``.
    """
    x = None if x is None else np.asarray(x)
    finite = None
    if x is not None and dtype_name(x.dtype) in SUPPORTED_DTYPES:
        with np.errstate(over="ignore"):  # a float64 beyond float32's range is inf: refused
            finite = bool(np.isfinite(x.astype(np.float32)).all())
    call = check_quantize_fp8(x, dtype, axes, descale, finite)

    # 1. x in float32 first (a float64 x rounds twice, as torch's own cast does).
    x32 = x.astype(np.float32)

    # 2. descale: dynamic, max|x| over the axes / fp8_max (at least 2**-126; 1.0 for an all-zero
    #    slice), or the given one; kept with the axes as 1 to broadcast against x.
    if call.descale is None:
        amax = np.abs(x32).max(axis=call.axes, keepdims=True)  # x's shape, axes as 1
        d = np.maximum(amax / np.float32(call.fp8_max), np.float32(MIN_DESCALE))
        d = np.where(amax == 0, np.float32(1.0), d)
    else:
        given = call.descale if isinstance(call.descale, float) else descale
        d = np.broadcast_to(np.asarray(given, np.float32), call.shape).reshape(call.keep)

    # 3. quotient x / descale in float32, clipped to [-fp8_max, fp8_max] (saturating: never
    #    NaN), rounded once to nearest even into fp8.
    quotient = x32 / d  # x's shape
    quotient = np.clip(quotient, -call.fp8_max, call.fp8_max)
    x_fp8 = quotient.astype(getattr(ml_dtypes, call.dtype))
    return x_fp8, d.reshape(call.shape).astype(np.float32)
