"""FP8 inputs (Contract v3, "FP8 inputs and caches"): the two formats, which combinations of
query, key and value dtypes a call may have, the descales' rules and ``quantize_fp8``'s.

Pure Python, like the rest of attention_spec: dtypes are names, arrays are read through
:func:`~attention_spec.describe`, and a descale's values are read (when concrete) with
``.tolist()``, which NumPy, torch and JAX arrays all have.

An fp8 input ``x`` with descale ``d`` stands for ``float(x) * d``, ``d`` broadcast over the
input's length and head-dim axes: heads-first, ``q_descale`` broadcasts to ``(..., H)`` and
``k_descale``/``v_descale`` to ``(..., K)``. A descale that is not given (None) is 1.0.

Shape letters: B batch, H query heads, K key/value heads.
"""

from __future__ import annotations

import math
import numbers
import struct
from typing import Any, NamedTuple

from attention_spec.arrays import (
    SUPPORTED_DTYPES,
    ArraySpec,
    Shape,
    check_given,
    describe,
    dtype_name,
)
from attention_spec.errors import make_error

__all__ = [
    "FP8_DTYPES",
    "FP8_MAX",
    "FP8_QUERY_DTYPES",
    "MIN_DESCALE",
    "QuantizeCall",
    "check_descale",
    "check_fp8_dtypes",
    "check_quantize_fp8",
    "check_token_descale",
    "is_fp8",
    "output_dtype",
]

#: The largest finite value of each fp8 format (e4m3fn has no inf; e5m2 is IEEE-like).
FP8_MAX: dict[str, float] = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
#: The fp8 dtypes, by name.
FP8_DTYPES: tuple[str, ...] = tuple(FP8_MAX)
#: The query dtypes allowed with an fp8 key and value (an fp8 KV cache).
FP8_QUERY_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
#: The smallest dynamic descale (``quantize_fp8``): float32's smallest normal number.
MIN_DESCALE: float = 2.0**-126


def is_fp8(dtype: str) -> bool:
    """``dtype`` (a name) is one of the fp8 formats."""
    return dtype in FP8_MAX


def output_dtype(q_dtype: str) -> str:
    """The dtype of the output and the weights: the query's, or bfloat16 for an fp8 query (as
    FlashAttention 3)."""
    return "bfloat16" if is_fp8(q_dtype) else q_dtype


def check_fp8_dtypes(q_dtype: str, k_dtype: str, v_dtype: str | None) -> bool:
    """Whether the call is an fp8 call (some input is fp8), after checking that it is one of
    the two allowed combinations (DTypeError ``fp8_combination``): query, key and value all fp8
    of one format, or key and value fp8 of one format with a float32/float16/bfloat16 query.
    ``v_dtype`` None: a call without a value (``attention_weights``)."""
    given = {"query": q_dtype, "key": k_dtype} | ({} if v_dtype is None else {"value": v_dtype})
    if not any(is_fp8(d) for d in given.values()):
        return False
    kv = {d for name, d in given.items() if name != "query"}
    ok = len(kv) == 1 and is_fp8(next(iter(kv))) and q_dtype in (*kv, *FP8_QUERY_DTYPES)
    if not ok:
        listing = ", ".join(f"{k}={v}" for k, v in given.items())
        raise make_error(
            "fp8_combination",
            "fp8 inputs come as query, key and value all of one fp8 format, or key and value of "
            f"one fp8 format with a query in {FP8_QUERY_DTYPES}; got {listing}",
            expected="all fp8 of one format | fp8 key/value with a float32/16 or bfloat16 query",
            actual=listing,
        )
    return True


def _float32(x: float) -> float:
    """``x`` rounded to float32, as a Python float (+/-inf beyond float32's range)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _fits(shape: Shape, target: Shape) -> bool:
    """``shape`` broadcasts to ``target`` without growing it."""
    return len(shape) <= len(target) and all(
        a in (1, b) for a, b in zip(reversed(shape), reversed(target))
    )


def _flat(values: Any) -> list[float]:
    """A nested list (``.tolist()``) flattened."""
    if not isinstance(values, list):
        return [values]
    return [v for item in values for v in _flat(item)]


def _concrete_values(x: Any) -> list[float] | None:
    """The values of array ``x`` as Python floats, or None when they are not concrete (a JAX
    tracer under ``jit``)."""
    try:
        return _flat(x.tolist())
    except Exception:  # a traced value: unchecked, as JAX's own functions do
        return None


def _check_descale_value(name: str, values: list[float]) -> None:
    bad = next((v for v in values if not (math.isfinite(v) and v > 0)), None)
    if bad is not None:
        raise make_error(
            "descale_value",
            f"{name} must be finite and > 0 (an fp8 input x stands for float(x) * {name}); "
            f"got {bad}",
            expected="finite > 0",
            actual=str(bad),
        )


def _descale(name: str, x: Any, target: Shape, text: str) -> float | ArraySpec:
    """A given descale: a Python/NumPy real number (returned as a float32-rounded Python float)
    or a float32 array broadcastable to ``target`` (its ArraySpec)."""
    if isinstance(x, numbers.Real) and not isinstance(x, bool) and not hasattr(x, "ndim"):
        value = _float32(float(x))
        _check_descale_value(name, [value])
        return value
    if type(x).__module__ == "numpy" and isinstance(x, numbers.Real) and not hasattr(x, "__len__"):
        value = _float32(float(x))  # a NumPy scalar (np.float16(2.0), np.int64(3), ...)
        _check_descale_value(name, [value])
        return value
    spec = describe(x) if hasattr(x, "shape") and hasattr(x, "dtype") else None
    if spec is None or spec.dtype != "float32":
        got = spec.dtype if spec is not None else type(x).__name__
        raise make_error(
            "descale_dtype",
            f"{name} must be a float32 array or a real number; got {got}",
            expected="float32",
            actual=got,
        )
    if not _fits(spec.shape, target):
        raise make_error(
            "descale_shape",
            f"{name} must broadcast to {text}; got {spec.shape}",
            expected=text,
            actual=str(spec.shape),
        )
    values = _concrete_values(x)
    if values is not None:
        _check_descale_value(name, values)
    return spec


def check_descale(
    name: str, x: Any, input_dtype: str, target: Shape, text: str | None = None
) -> float | ArraySpec | None:
    """One descale of an attention call: ``q_descale`` (``target`` ``(..., H)``), ``k_descale``
    or ``v_descale`` (``(..., K)``) for an input of ``input_dtype``; ``text`` names the target
    in a message (``"(B=2, H=6)"``). Rules, in order: ``descale_not_fp8`` (a descale given for
    an input that is not fp8, even 1.0: None is the only "no descale"), ``descale_dtype`` (an
    array not float32), ``descale_shape``, ``descale_value`` (not finite or <= 0; checked where
    the values are concrete). Returns None (not given: 1.0), a float (a scalar, rounded to
    float32) or the array's ArraySpec."""
    if x is None:
        return None
    if not is_fp8(input_dtype):
        raise make_error(
            "descale_not_fp8",
            f"{name} is only for an fp8 input (float8_e4m3fn, float8_e5m2); this input is "
            f"{input_dtype}: leave {name} as None",
            expected="None",
            actual=f"{name} given for {input_dtype}",
        )
    return _descale(name, x, target, text or str(target))


def check_token_descale(name: str, x: Any, dtype: str, N: int, letter: str,
                        n: int) -> float | ArraySpec | None:
    """A descale of a token-major call (``paged_attention``, ``varlen_attention``): None, a
    number, or a float32 array of shape exactly ``()``, ``(n,)`` or ``(N, n)`` (one per head,
    or per sequence and head; ``letter`` names n: H or K); anything else ``descale_shape``
    (SEMANTICS.md, "FP8 inputs and caches"). The other rules (an input that is not fp8, the
    dtype, the values) are :func:`check_descale`'s."""
    text = f"(), ({letter}={n},) or (N={N}, {letter}={n})"
    checked = check_descale(name, x, dtype, (N, n), text)
    if isinstance(checked, ArraySpec) and checked.shape not in ((), (n,), (N, n)):
        raise make_error(
            "descale_shape",
            f"{name} of a token-major call must be {text}; got {checked.shape}",
            expected=text,
            actual=str(checked.shape),
        )
    return checked


class QuantizeCall(NamedTuple):
    """A validated ``quantize_fp8`` call: the fp8 ``dtype`` (a name), its ``fp8_max``, the
    reduced ``axes`` (non-negative, sorted), ``shape`` of the descale (x's shape without
    ``axes``), ``keep`` (the descale's shape with the axes kept as 1, for broadcasting against
    x) and ``descale`` (None: dynamic; a float or the ArraySpec of a static one)."""

    dtype: str
    fp8_max: float
    axes: tuple[int, ...]
    shape: Shape
    keep: Shape
    descale: float | ArraySpec | None


def check_quantize_fp8(
    x: Any, dtype: Any, axes: Any, descale: Any, finite: bool | None = None
) -> QuantizeCall:
    """Validate ``quantize_fp8(x, dtype, axes=, descale=)``: x an array (``not_an_array``) of
    float64/32/16 or bfloat16 (``unsupported_dtype``); ``dtype`` an fp8 format
    (``unsupported_dtype``); ``axes`` ints inside x's rank, none repeated (``axes_value``); a
    static ``descale`` float32 (or a real number) broadcastable to x's shape without ``axes``
    (``descale_dtype``, ``descale_shape``, ``descale_value``); ``finite``, whether x is finite
    in float32 (None: not concrete, unchecked), else ``fp8_nonfinite``."""
    check_given(x=x)
    spec = describe(x)
    if spec.dtype not in SUPPORTED_DTYPES:
        raise make_error(
            "unsupported_dtype",
            f"quantize_fp8's x must be one of {SUPPORTED_DTYPES}; got {spec.dtype}",
            expected=" | ".join(SUPPORTED_DTYPES),
            actual=spec.dtype,
        )
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    if not is_fp8(name):
        raise make_error(
            "unsupported_dtype",
            f"quantize_fp8's dtype must be one of {FP8_DTYPES}; got {name}",
            expected=" | ".join(FP8_DTYPES),
            actual=str(name),
        )
    rank = len(spec.shape)
    listed = (axes,) if isinstance(axes, numbers.Integral) else axes
    try:
        listed = tuple(listed)
    except TypeError:
        listed = (axes,)
    good = all(isinstance(a, numbers.Integral) and not isinstance(a, bool) for a in listed)
    normal = tuple(int(a) % rank for a in listed) if good and rank else ()
    if (
        not good
        or any(not -rank <= int(a) < rank for a in listed)
        or len(set(normal)) != len(listed)
    ):
        raise make_error(
            "axes_value",
            f"quantize_fp8's axes must be distinct ints in [-{rank}, {rank}) for x of shape "
            f"{spec.shape}; got {axes}",
            expected=f"distinct axes in [-{rank}, {rank})",
            actual=str(axes),
        )
    kept = sorted(normal)
    shape = tuple(n for a, n in enumerate(spec.shape) if a not in kept)
    keep = tuple(1 if a in kept else n for a, n in enumerate(spec.shape))
    given = None if descale is None else _descale("descale", descale, shape, str(shape))
    if finite is False:
        raise make_error(
            "fp8_nonfinite",
            "quantize_fp8's x must be finite in float32 (a float64 beyond 3.4e38 is inf there)",
            expected="finite x",
            actual="inf or NaN in x",
        )
    return QuantizeCall(name, FP8_MAX[name], tuple(kept), shape, keep, given)
