"""The fp8 part of the broken ports (Contract v3, "FP8 inputs and caches"): step 0's dequantize
of an fp8 input, the result dtype, and ``quantize_fp8``, each with the bugs of
``broken_ports.BUGS`` named ``fp8_*`` switched in. With no bug they pass every ``sdpa.fp8.*``,
``weights.fp8.*`` and ``quantize.*`` run (test_broken_ports.py asserts it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from attention_spec import SUPPORTED_DTYPES, check_quantize_fp8, dtype_name, is_fp8

__all__ = ["broken_quantize", "dequantized", "key_by_query_head", "result_dtype"]


def dequantized(x: np.ndarray, descale: Any, bug: str | None, which: str = "") -> np.ndarray:
    """An fp8 input ``(..., H|K, L|S, D|E)`` as float32 times its descale (None: 1.0), broadcast
    over the length and head-dim axes; any other input as it is. ``which``: ``"query"``,
    ``"key"`` or ``"value"`` (the bugs of one descale)."""
    if not is_fp8(x.dtype.name):
        return x
    d = np.float32(1.0) if descale is None else np.asarray(descale, np.float32)
    d = d[..., None, None]  # (..., H|K, 1, 1)
    if bug == "fp8_e5m2_rounding_for_e4m3" and x.dtype.name == "float8_e4m3fn":
        x = x.astype(np.float32).astype(ml_dtypes.float8_e5m2)  # 2 mantissa bits, not 3
    if bug == "fp8_descale_ignored":
        return x.astype(np.float32)
    if bug == "fp8_descale_twice":
        return x.astype(np.float32) * d * d
    if bug == "fp8_k_descale_twice" and which == "key":
        return x.astype(np.float32) * d * d
    if bug == "fp8_v_descale_dropped" and which == "value":
        return x.astype(np.float32)
    if bug == "fp8_descale_in_fp8":  # x * d in the fp8 format, saturated, then widened
        top = float(ml_dtypes.finfo(x.dtype).max)
        scaled = np.clip(x.astype(np.float32) * d, -top, top).astype(x.dtype)
        return scaled.astype(np.float32)
    return x.astype(np.float32) * d


def key_by_query_head(key: np.ndarray, k_descale: Any, H: int) -> np.ndarray:
    """An fp8 key ``(..., K, S, D)`` widened to the H query heads ``(..., H, S, D)`` (query
    head h reads key/value head h // G) and dequantized with ``k_descale[..., h % K]``: the
    descale's head index taken from the query head (wrapped into K), not from the key/value
    head. A scalar descale (or none) is the same for every head, so only a per-head one shows."""
    K = key.shape[-3]
    d = np.float32(1.0) if k_descale is None else np.asarray(k_descale, np.float32)
    d = np.broadcast_to(d, (*d.shape[:-1], K) if d.ndim else (K,))  # (..., K)
    wide = np.take(key, np.arange(H) // (H // K), axis=-3).astype(np.float32)  # (..., H, S, D)
    return wide * np.take(d, np.arange(H) % K, axis=-1)[..., None, None]


def result_dtype(query: np.ndarray, bug: str | None) -> np.dtype:
    """The output's and the weights' dtype: bfloat16 for an fp8 query, else the query's."""
    if is_fp8(query.dtype.name) and bug != "fp8_output_in_fp8":
        return np.dtype(ml_dtypes.bfloat16)
    return query.dtype


def broken_quantize(bug: str | None) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    """``quantize_fp8(x, dtype, axes=, descale=)`` -> ``(x_fp8, descale)`` with ``bug``."""

    def quantize_fp8(x, dtype="float8_e4m3fn", *, axes=(-2, -1), descale=None):
        finite = None
        if x is not None and dtype_name(x.dtype) in SUPPORTED_DTYPES:
            with np.errstate(over="ignore"):  # a float64 beyond float32's range: refused
                finite = bool(np.isfinite(np.asarray(x).astype(np.float32)).all())
        call = check_quantize_fp8(x, dtype, axes, descale, finite)
        x32 = np.asarray(x).astype(np.float32)
        if call.descale is None:
            amax = np.abs(x32).max(axis=call.axes, keepdims=True)
            d = np.maximum(amax / np.float32(call.fp8_max), np.float32(2.0**-126))
            d = np.where(amax == 0, np.float32(1.0), d).astype(np.float32)
        else:
            given = call.descale if isinstance(call.descale, float) else descale
            d = np.broadcast_to(np.asarray(given, np.float32), call.shape).reshape(call.keep)
        quotient = x32 / d
        if bug != "fp8_quantize_not_saturating":
            quotient = np.clip(quotient, -call.fp8_max, call.fp8_max)
        fmt = np.dtype(getattr(ml_dtypes, call.dtype))
        with np.errstate(all="ignore"):
            values = quotient.astype(fmt)
        if bug == "fp8_quantize_round_toward_zero":  # one step back where rounding went up
            up = np.abs(values.astype(np.float32)) > np.abs(quotient)
            values = np.where(up, values.view(np.uint8) - np.uint8(1), values.view(np.uint8))
            values = values.astype(np.uint8).view(fmt)
        return values, d.reshape(call.shape).astype(np.float32)

    return quantize_fp8
