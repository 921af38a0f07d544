"""A port's result against its golden: shape, dtype, and the max error under the bound.

The NaN and inf rules: a NaN or an infinity where the golden is finite is an infinite error; a
golden infinity is met only by the same infinity (an empty row's -inf lse); a golden NaN is met
only by a NaN (a +inf bias), and any number there is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from conformance.runner.failures import _Failed


def _fmt_index(index: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(int(i)) for i in index) + ")"


def _compare(got: Any, golden: np.ndarray, dtype: str, bound: float, what: str) -> float:
    """Max |got - golden| (NaN counts as inf, but where the golden is NaN, anything else does);
    raises _Failed on shape, dtype or bound.

    The failure locates the error: the index of the worst element, expected and got to full
    precision (Python's shortest round-trip repr), the relative error there and the error as a
    multiple of the bound."""
    got = np.asarray(got)
    if got.shape != golden.shape:
        raise _Failed(f"{what} shape {got.shape}, expected {golden.shape}")
    if got.dtype.name != dtype:
        raise _Failed(
            f"{what} dtype {got.dtype.name}, expected {dtype} (the result must be cast back "
            "to the input dtype)"
        )
    if golden.size == 0:
        return 0.0
    with np.errstate(all="ignore"):
        values = got.astype(np.float64)
        want = golden.astype(np.float64)
        diff = np.asarray(np.abs(values - want))  # an array even 0-d (a scalar descale)
        exact = np.isinf(want) & (values == want)  # a golden -inf (an empty row's lse) is met
        exact |= np.isnan(want) & np.isnan(values)  # so is a golden NaN (+inf bias allowed)
        diff[~np.isfinite(values) & ~exact] = math.inf
        diff[np.isnan(want) & ~exact] = math.inf  # a number where the golden is NaN is wrong
        diff[exact] = 0.0
    flat = int(np.argmax(diff))
    err = float(diff.flat[flat])
    if not err <= bound:
        index = np.unravel_index(flat, golden.shape)
        expected, actual = float(want[index]), float(values[index])
        relative = err / abs(expected) if expected != 0 else math.inf
        times = err / bound if bound > 0 else math.inf
        raise _Failed(
            f"{what} max error {err:.3g} > bound {bound:.3g} ({times:.3g}x the bound; relative "
            f"error {relative:.3g}) at {_fmt_index(index)}: expected {expected!r}, "
            f"got {actual!r}",
            err,
            bound,
        )
    return err


@dataclass
class Comparison:
    """One result of a port against its golden: ``got`` (NumPy) against ``want``, under the
    case's bound for ``name`` (0 when the case has none: exact). ``where`` prefixes messages."""

    name: str
    got: Any
    want: np.ndarray
    where: str = ""
    dtype: str | None = None  # the result's dtype when it is not the case's (lse: compute dtype)
