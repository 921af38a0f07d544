"""The keywords' rules: flags, sizes, scalars, the window, the causal alignment.

Keyword scalars (``scale``, ``softcap``, sizes) are turned into Python numbers here, once, so the
implementations compute with the same ``float`` whatever the caller passed (a NumPy scalar, a
0-d tensor, a ``Fraction``), and messages show Python numbers, never the caller's ``repr()``.

A scalar is checked twice: on its own, before any array (:func:`check_config`: a real number,
finite, > 0 for softcap), and against the compute dtype of the call, after every shape rule
(:func:`check_ranges`), so a range never hides a shape mistake.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

from attention_spec.arrays import compute_dtype
from attention_spec.errors import make_error

__all__ = [
    "ALIGNMENTS",
    "FINITE_MAX",
    "SOFTCAP_RANGE",
    "causal_offset",
    "check_alignment",
    "check_causal_mask_args",
    "check_config",
    "check_flag",
    "check_ranges",
    "check_scale",
    "check_size",
    "check_softcap",
    "check_window",
    "divisors",
    "is_int",
    "real_keyword",
    "shown_as_given",
    "value_text",
]

#: The two causal alignments (see :func:`causal_offset`).
ALIGNMENTS: tuple[str, ...] = ("top_left", "bottom_right")
#: The largest finite number of each compute dtype (float32 for float32, float16, bfloat16).
FINITE_MAX: dict[str, float] = {"float64": 1.7976931348623157e308, "float32": 3.4028234663852886e38}
#: softcap's allowance per compute dtype, ``[tiny / u, u / tiny]`` (``tiny`` the smallest normal
#: number, ``u`` the unit roundoff): float32 ``[2**-102, 2**102]``, float64 ``[2**-969, 2**969]``.
#: XLA on the CPU flushes subnormal numbers to zero; the cap meets the scores as ``s / softcap``
#: in the forward and as ``g * softcap`` in the gradient, so inside the allowance whatever a
#: flush zeroes is smaller than ``u`` and the frameworks agree to their own rounding; outside it
#: they do not (docs/SEMANTICS.md, "softcap", with the measurements).
SOFTCAP_RANGE: dict[str, tuple[float, float]] = {
    "float64": (2.0**-969, 2.0**969),
    "float32": (2.0**-102, 2.0**102),
}
#: How a message writes the allowance.
_SOFTCAP_TEXT: dict[str, str] = {"float64": "[2**-969, 2**969]", "float32": "[2**-102, 2**102]"}


def is_int(n: object) -> bool:
    """``n`` is an integer (Python's or NumPy's), not a bool."""
    return isinstance(n, numbers.Integral) and not isinstance(n, bool)


def value_text(x: object) -> str:
    """How a message shows a keyword's value: a number as Python writes it (``np.float64(0.5)``
    is shown ``0.5``), an array by its shape (never the caller's ``repr()``, which differs
    between frameworks)."""
    if x is None or isinstance(x, bool | str):
        return repr(x)
    if isinstance(x, float | complex):
        return repr(complex(x) if isinstance(x, complex) else float(x))
    if isinstance(x, int):
        digits = str(abs(int(x)))
        if len(digits) > 30:
            return f"{'-' if x < 0 else ''}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}"
        return str(int(x))
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"an array of shape {tuple(int(n) for n in shape)}"
    if isinstance(x, numbers.Number):
        return f"{x} ({type(x).__name__})"
    return type(x).__name__


def shown_as_given(given: object) -> Callable[[float], str]:
    """How a message shows a converted keyword: as given when it is a Python int or float, else
    as the Python float it was converted to (``got 0.5`` for a 0-d array, in every framework)."""
    if type(given) in (int, float):  # exactly Python's: np.float64(0.5) is shown 0.5
        return lambda converted: value_text(given)
    return value_text


def check_size(name: str, n: object, *, minimum: int = 1) -> None:
    """``n`` is an integer >= ``minimum`` (ConfigError ``non_positive_size``).

    ``name`` says which size, with its letter: ``"n_heads (H)"``, ``"block_q"``.
    """
    if not (is_int(n) and n >= minimum):
        raise make_error(
            "non_positive_size",
            f"{name} must be an integer >= {minimum}; got {value_text(n)}",
            expected=f"integer >= {minimum}",
            actual=value_text(n),
        )


def _is_numpy_bool(x: object) -> bool:
    return type(x).__module__ == "numpy" and type(x).__name__ in ("bool", "bool_")


def check_flag(name: str, x: object) -> bool:
    """``x`` as a bool: a Python or NumPy bool, else ConfigError ``not_a_bool`` (a string such as
    ``"False"`` would otherwise be true)."""
    if isinstance(x, bool) or _is_numpy_bool(x):
        return bool(x)
    raise make_error(
        "not_a_bool",
        f"{name} must be a bool (True or False); got {value_text(x)}",
        expected="bool",
        actual=value_text(x),
    )


def real_keyword(name: str, code: str, x: object) -> float:
    """A keyword scalar as a Python float: a real number (int, float, NumPy scalar, Fraction) or
    an array of exactly one real element. Anything else is ConfigError ``code``; a number too
    large for a float is returned as +/-inf (the caller's range rule then says so)."""
    value = x
    if not isinstance(x, numbers.Real) and hasattr(x, "shape") and hasattr(x, "item"):
        if math.prod(int(n) for n in x.shape) == 1:
            try:
                value = x.item()
            except Exception:  # a traced value under jax.jit: not a concrete number
                raise make_error(
                    code,
                    f"{name} must be a concrete number; got a traced value (under jax.jit, mark "
                    f"{name} static)",
                    expected="real number",
                    actual=type(x).__name__,
                ) from None
    if isinstance(value, bool) or _is_numpy_bool(value) or not isinstance(value, numbers.Real):
        raise make_error(
            code,
            f"{name} must be a real number; got {value_text(x)}",
            expected="real number",
            actual=value_text(x),
        )
    try:
        return float(value)
    except OverflowError:  # an int (or Fraction) beyond float64
        return math.inf if value > 0 else -math.inf


def check_alignment(alignment: object) -> str:
    """``causal_alignment`` is one of :data:`ALIGNMENTS` (ConfigError ``unknown_alignment``);
    returns it."""
    if not (isinstance(alignment, str) and alignment in ALIGNMENTS):
        raise make_error(
            "unknown_alignment",
            f"causal_alignment must be one of {ALIGNMENTS}; got {value_text(alignment)}",
            expected=" | ".join(ALIGNMENTS),
            actual=value_text(alignment),
        )
    return alignment


def check_scale(scale: object) -> float | None:
    """``scale`` on its own: None, or a real number that is not NaN and not infinite (an int or
    Fraction beyond float64 is left to :func:`check_ranges`); ConfigError ``scale_not_finite``.
    Zero and negative scales are allowed."""
    if scale is None:
        return None
    exact = isinstance(scale, numbers.Rational)  # an int or Fraction: inf only by overflow
    shown = shown_as_given(scale)
    value = real_keyword("scale", "scale_not_finite", scale)
    if math.isnan(value) or (math.isinf(value) and not exact):
        raise make_error(
            "scale_not_finite",
            f"scale must be a finite real number (zero and negative are allowed); "
            f"got {shown(value)}",
            expected="finite real number",
            actual=shown(value),
        )
    return value


def check_softcap(softcap: object) -> float | None:
    """``softcap`` on its own: None (no cap), or a real number > 0 that is not infinite (an int
    beyond float64 is left to :func:`check_ranges`); ConfigError ``softcap_not_positive``."""
    if softcap is None:
        return None
    exact = isinstance(softcap, numbers.Rational)
    shown = shown_as_given(softcap)
    value = real_keyword("softcap", "softcap_not_positive", softcap)
    if not value > 0 or (math.isinf(value) and not exact):
        raise make_error(
            "softcap_not_positive",
            f"softcap must be a finite number > 0 (or None for no cap); got {shown(value)}",
            expected="finite number > 0",
            actual=shown(value),
        )
    return value


def check_config(
    *, causal_alignment: str = "top_left", scale: object = None, softcap: object = None
) -> tuple[float | None, float | None]:
    """Validate the scalar keywords that need no array (ConfigError); return ``scale`` and
    ``softcap`` as Python floats (None stays None). An integer too large for a float is not
    finite here; :func:`check_ranges` then checks them against the compute dtype."""
    check_alignment(causal_alignment)
    return check_scale(scale), check_softcap(softcap)


def check_ranges(
    dtype: str, scale: float | None, softcap: float | None, given: dict[str, object]
) -> None:
    """``scale`` finite in the compute dtype of ``dtype`` inputs (``scale_range``), ``softcap``
    in its :data:`SOFTCAP_RANGE` (``softcap_range``). ``given`` holds the values as the caller
    passed them, for the message."""
    ct = compute_dtype(dtype)
    if scale is not None and not abs(scale) <= FINITE_MAX[ct]:
        shown = shown_as_given(given["scale"])(scale)
        raise make_error(
            "scale_range",
            f"scale must be finite in the compute dtype {ct} (|scale| <= {FINITE_MAX[ct]:.8g}, "
            f"for {dtype} inputs); got {shown}",
            expected=f"|scale| <= {FINITE_MAX[ct]:.8g}",
            actual=shown,
        )
    low, high = SOFTCAP_RANGE[ct]
    if softcap is not None and not low <= softcap <= high:
        shown = shown_as_given(given["softcap"])(softcap)
        raise make_error(
            "softcap_range",
            f"softcap must be in {_SOFTCAP_TEXT[ct]} for {dtype} inputs (compute dtype {ct}): "
            f"outside it, flushing subnormal numbers to zero (XLA does) changes s / softcap or "
            f"its gradient, and the frameworks would differ; got {shown}. Use None for no cap",
            expected=f"softcap in {_SOFTCAP_TEXT[ct]}",
            actual=shown,
        )


def check_window(window: object) -> tuple[int | None, int | None] | None:
    """``window`` as ``(left, right)`` of Python ints >= 0 or None (ConfigError
    ``window_value``): a pair (tuple or list of two), each side an integer >= 0 or None for
    unbounded. None (no window), and ``(None, None)`` (unbounded both ways), are None."""
    if window is None:
        return None
    pair = isinstance(window, tuple | list) and len(window) == 2
    if pair and all(side is None or (is_int(side) and side >= 0) for side in window):
        sides = tuple(None if side is None else int(side) for side in window)
        return None if sides == (None, None) else sides  # unbounded both ways: no window
    shown = (
        f"({', '.join(value_text(side) for side in window)})"
        if isinstance(window, tuple | list) else value_text(window)
    )
    raise make_error(
        "window_value",
        f"window must be a pair (left, right), each side an integer >= 0 or None for "
        f"unbounded; got {shown}",
        expected="(left, right): int >= 0 or None each",
        actual=shown,
    )


def divisors(n: int, limit: int = 10**6) -> list[int] | None:
    """The divisors of ``n`` for an error message, or None when ``n`` is too large to list them
    (a message never costs work proportional to a size)."""
    if not (0 < n <= limit):
        return None
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def causal_offset(q_len: int, kv_len: int, alignment: str = "top_left") -> int:
    """The diagonal of the causal rule: query i may attend key j iff ``j <= i + offset``.

    ``top_left`` (torch ``is_causal``, jax, flax, keras, onnx): offset 0.
    ``bottom_right`` (flash-attn >= 2.1, torch ``causal_lower_right``, every KV cache): the last
    query row lines up with the last key, offset ``S - L``. With L > S the first ``L - S`` rows
    are then fully masked.
    """
    check_alignment(alignment)
    return 0 if alignment == "top_left" else kv_len - q_len


def check_causal_mask_args(q_len: int, kv_len: int, alignment: str) -> None:
    """Validate the arguments of ``causal_mask`` (ConfigError)."""
    check_alignment(alignment)
    check_size("q_len (L)", q_len, minimum=0)
    check_size("kv_len (S)", kv_len, minimum=0)
