"""The adapter: what validation reads of an array, and the shape facts every check shares.

Validation is pure Python on shapes (tuples of ints) and dtype *names* (``"float32"``,
``"bfloat16"``, ``"bool"``, ...). Every check takes the arrays themselves (NumPy, torch, JAX,
MLX, or anything with a ``.shape`` and a ``.dtype``) and reads them through one function,
:func:`describe`, so each implementation hands its arrays over as they are and the frameworks
raise the same error for the same mistake. Where there is no array yet (the query a module is
about to project), an :class:`ArraySpec` stands in for it.

Shape letters: B batch, H query heads, K key/value heads, L query length, S key/value length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attention_spec.errors import make_error

__all__ = [
    "FLOAT_DTYPES",
    "SUPPORTED_DTYPES",
    "ArraySpec",
    "Shape",
    "batch_letters",
    "broadcast_shapes",
    "check_dtype",
    "check_float64",
    "check_given",
    "compute_dtype",
    "describe",
    "dtype_name",
    "format_dims",
    "target_text",
]

#: The dtypes query, key and value may have (NumPy spells bfloat16 through ml_dtypes).
SUPPORTED_DTYPES: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16")
#: The dtypes a bias, sinks and ALiBi slopes may have.
FLOAT_DTYPES: tuple[str, ...] = SUPPORTED_DTYPES

Shape = tuple[int, ...]


@dataclass(frozen=True)
class ArraySpec:
    """What validation reads of an array: its shape and its dtype's name.

    Also what a caller passes where there is no array yet, e.g. the ``(B, H, L, D)`` query that
    a module's projection will make: ``ArraySpec((B, H, L, D), "float32")``.
    """

    shape: Shape
    dtype: str


#: dtype -> its name, as :func:`dtype_name` found it: validation reads a dozen dtypes per call
#: (a decode step's), and NumPy's ``.name`` and torch's ``str()`` take microseconds each.
_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """The contract's name of a framework's dtype: ``"float32"``, ``"bfloat16"``, ``"bool"``.

    NumPy and JAX dtypes carry it as ``.name``; torch spells it ``torch.bfloat16`` (and MLX
    ``mlx.core.bfloat16``), from which the last dotted part is taken.
    """
    try:
        return _DTYPE_NAMES[dtype]
    except (KeyError, TypeError):  # not seen yet, or not hashable
        pass
    name = getattr(dtype, "name", None)
    if not isinstance(name, str):
        name = str(dtype).rsplit(".", 1)[-1]
    try:
        _DTYPE_NAMES[dtype] = name
    except TypeError:
        pass
    return name


def describe(array: Any) -> ArraySpec | None:
    """The :class:`ArraySpec` of ``array`` (anything with ``.shape`` and ``.dtype``); None stays
    None (an argument that was not given)."""
    if array is None or isinstance(array, ArraySpec):
        return array
    return ArraySpec(tuple(map(int, array.shape)), dtype_name(array.dtype))


def compute_dtype(dtype: str) -> str:
    """The dtype the arithmetic runs in: float64 for float64, float32 for the other three."""
    return "float64" if dtype == "float64" else "float32"


def check_given(**arrays: Any) -> None:
    """Each named argument is an array, not None (DTypeError ``not_an_array``)."""
    for name, array in arrays.items():
        if array is None:
            raise make_error(
                "not_an_array",
                f"{name} must be an array (or anything the framework converts to one); got None",
                expected="array",
                actual="None",
            )


def check_dtype(name: str, dtype: str) -> None:
    """``dtype`` is one of the four supported (DTypeError ``unsupported_dtype``)."""
    if dtype not in SUPPORTED_DTYPES:
        raise make_error(
            "unsupported_dtype",
            f"{name} dtype must be one of {SUPPORTED_DTYPES}; got {dtype}",
            expected=" | ".join(SUPPORTED_DTYPES),
            actual=dtype,
        )


def check_float64(dtype: str, available: bool, how: str) -> None:
    """float64 inputs need the framework's 64-bit mode (``how`` says how to turn it on); without
    it they would silently be computed in float32 (DTypeError ``unsupported_dtype``)."""
    if dtype == "float64" and not available:
        raise make_error(
            "unsupported_dtype",
            f"float64 inputs need {how}; without it they would be computed in float32",
            expected="float32 | float16 | bfloat16 (or float64 with 64-bit mode on)",
            actual="float64",
        )


def broadcast_shapes(*shapes: Shape) -> Shape | None:
    """NumPy's right-aligned broadcast of ``shapes``, or None when they do not broadcast."""
    ndim = max([0, *(len(s) for s in shapes)])
    out = []
    for axis in range(-ndim, 0):
        sizes = {s[axis] for s in shapes if len(s) >= -axis} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def format_dims(letters: Sequence[str], dims: Sequence[int]) -> str:
    """``format_dims("HLS", (8, 5, 7))`` -> ``"(H=8, L=5, S=7)"``."""
    return "(" + ", ".join(f"{a}={n}" for a, n in zip(letters, dims)) + ")"


def batch_letters(n: int) -> list[str]:
    """The letters of ``n`` batch dims in a message: ``["B"]``, or ``["B1", "B2", ...]``."""
    return ["B"] if n == 1 else [f"B{i + 1}" for i in range(n)]


def target_text(batch: Shape, *named: tuple[str, int]) -> str:
    """A target shape in a message: ``target_text((2,), ("H", 8), ("L", 5))`` ->
    ``"(B=2, H=8, L=5)"``."""
    letters = [*batch_letters(len(batch)), *(letter for letter, _ in named)]
    return format_dims(letters, (*batch, *(n for _, n in named)))
