"""FP8 quantization in PyTorch (Contract v3, "FP8 inputs and caches"): ``quantize_fp8``.

The same steps, names and comments as ``impl_numpy/fp8.py`` and ``impl_jax/fp8.py``; the three
agree bit for bit. torch's float64-to-fp8 cast goes through float32 and rounds twice, and its
float32-to-fp8 cast does not saturate, so the quotient is computed in float32 and clipped first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attention_spec import MIN_DESCALE, SUPPORTED_DTYPES, check_quantize_fp8, dtype_name
from impl_torch.functional import _as_tensor

__all__ = ["quantize_fp8"]


def quantize_fp8(
    x: torch.Tensor,
    dtype: str = "float8_e4m3fn",
    *,
    axes: int | Sequence[int] = (-2, -1),
    descale: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
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
    x = _as_tensor(x, None)
    finite = None
    if x is not None and dtype_name(x.dtype) in SUPPORTED_DTYPES:
        finite = bool(torch.isfinite(x.to(torch.float32)).all())
    if isinstance(descale, torch.Tensor) or descale is None or isinstance(descale, float | int):
        given = descale
    else:
        given = _as_tensor(descale, None if x is None else x.device)
    call = check_quantize_fp8(x, dtype, axes, given, finite)

    # 1. x in float32 first (a float64 x rounds twice, as torch's own cast does).
    x32 = x.to(torch.float32)

    # 2. descale: dynamic, max|x| over the axes / fp8_max (at least 2**-126; 1.0 for an all-zero
    #    slice), or the given one; kept with the axes as 1 to broadcast against x.
    if call.descale is None:
        amax = x32.abs().amax(dim=call.axes, keepdim=True)  # x's shape, axes as 1
        d = torch.clamp(amax / call.fp8_max, min=MIN_DESCALE)
        d = torch.where(amax == 0, torch.ones_like(d), d)
    else:
        value = call.descale if isinstance(call.descale, float) else given
        d = torch.as_tensor(value, dtype=torch.float32, device=x.device)
        d = d.broadcast_to(call.shape).reshape(call.keep)

    # 3. quotient x / descale in float32, clipped to [-fp8_max, fp8_max] (saturating: never
    #    NaN), rounded once to nearest even into fp8.
    quotient = x32 / d  # x's shape
    quotient = torch.clamp(quotient, -call.fp8_max, call.fp8_max)
    x_fp8 = quotient.to(getattr(torch, call.dtype))
    return x_fp8, d.reshape(call.shape).to(torch.float32)
