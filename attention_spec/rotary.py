"""Rotary position embedding (RoPE): validation, the frequencies, and a module's RoPE settings.

SEMANTICS.md, "Rotary position embedding": ``apply_rotary(x, positions, *, theta=10000.0,
rotary_dim=None, interleaved=False)`` rotates the first ``rotary_dim`` features of every head of
``x (..., heads, L, D)`` in pairs; pair p of token t turns by the angle
``positions[..., t] * theta ** (-2p / rotary_dim)``. Pairs are ``(x[p], x[p + rotary_dim/2])``
(half-split: Llama, GPT-NeoX, Hugging Face ``rotate_half``) or, with ``interleaved=True``,
``(x[2p], x[2p+1])`` (GPT-J, RoFormer). Features beyond ``rotary_dim`` pass through.

Pure Python, like :mod:`attention_spec.validate`: the three implementations call
:func:`check_rotary` before any arithmetic, and build their frequency arrays from
:func:`rotary_frequencies` (Python float64, rounded once to the compute dtype), so the three
agree to the last bit on the angles' inputs whatever their own ``pow`` would have given.

Shape letters (SEMANTICS.md): B batch (``...``), L length, D head dim; "heads" is H or K.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from attention_spec.arrays import (
    FLOAT_DTYPES,
    ArraySpec,
    broadcast_shapes,
    check_dtype,
    check_given,
    describe,
    format_dims,
)
from attention_spec.errors import make_error
from attention_spec.keywords import check_flag, real_keyword

__all__ = [
    "DEFAULT_THETA",
    "INTEGER_DTYPES",
    "RopeConfig",
    "RotaryDims",
    "check_rope_config",
    "check_rope_inv_freq",
    "check_rotary",
    "rotary_frequencies",
]

#: ``theta`` when not given: the base of the RoPE paper, Llama 1 and 2, GPT-NeoX.
DEFAULT_THETA: float = 10000.0
#: The dtypes positions may have (token indices).
INTEGER_DTYPES: tuple[str, ...] = (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
)

Shape = tuple[int, ...]


def rotary_frequencies(theta: float, rotary_dim: int) -> tuple[float, ...]:
    """``theta ** (-2p / rotary_dim)`` for p = 0 .. rotary_dim/2 - 1, as Python floats.

    The one place the formula lives; every implementation rounds these float64 numbers once to
    its compute dtype (so pair 0's frequency is exactly 1 and the others are correctly rounded).
    """
    return tuple(theta ** (-2 * p / rotary_dim) for p in range(rotary_dim // 2))


@dataclass(frozen=True)
class RotaryDims:
    """The sizes and keywords of one ``apply_rotary`` call, after validation.

    ``batch`` is x's leading dims (before its heads axis); positions broadcast to
    ``(*batch, L)``. ``theta`` is a Python float, ``rotary_dim`` the resolved int (default D),
    ``interleaved`` a Python bool.
    """

    batch: Shape
    heads: int
    L: int
    D: int
    rotary_dim: int
    theta: float
    interleaved: bool
    attention_factor: float = 1.0
    has_inv_freq: bool = False

    @property
    def positions_shape(self) -> Shape:
        """``(*batch, L)``: one position per token, shared by every head."""
        return (*self.batch, self.L)

    @property
    def frequencies(self) -> tuple[float, ...]:
        """:func:`rotary_frequencies` of this call, ``rotary_dim / 2`` Python floats (unused
        when the caller gave ``inv_freq``, ``has_inv_freq``)."""
        return rotary_frequencies(self.theta, self.rotary_dim)


def _text(x: object) -> str:
    """A keyword's value in a message: Python's repr of a number or a string, an array by its
    shape (never a framework's repr)."""
    if x is None or isinstance(x, bool | str):
        return repr(x)
    if isinstance(x, numbers.Integral):  # np.int64(5) is shown 5
        return str(int(x))
    if isinstance(x, numbers.Real):  # np.float32(0.5) is shown 0.5
        return repr(float(x))
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"an array of shape {tuple(int(n) for n in shape)}"
    return f"{x} ({type(x).__name__})" if isinstance(x, numbers.Number) else type(x).__name__


def check_theta(theta: object, name: str = "theta") -> float:
    """``theta`` as a Python float: a finite real number > 0 (ConfigError ``rope_theta``)."""
    value = real_keyword(name, "rope_theta", theta)
    if not (value > 0 and math.isfinite(value)):
        raise make_error(
            "rope_theta",
            f"{name} must be a finite number > 0 (the base of the rotary frequencies, "
            f"10000.0 in the RoPE paper); got {_text(theta)}",
            expected="finite number > 0",
            actual=_text(theta),
        )
    return value


def check_attention_factor(factor: object, name: str = "attention_factor") -> float:
    """``attention_factor`` as a Python float: finite and > 0 (ConfigError ``attention_factor``).

    The factor multiplies cos and sin (YaRN's ``0.1 ln(s) + 1``); 1.0 leaves RoPE unscaled.
    """
    value = real_keyword(name, "attention_factor", factor)
    if not (value > 0 and math.isfinite(value)):
        raise make_error(
            "attention_factor",
            f"{name} must be a finite number > 0 (it multiplies cos and sin; 1.0 for plain "
            f"RoPE); got {_text(factor)}",
            expected="finite number > 0",
            actual=_text(factor),
        )
    return value


def _check_inv_freq(inv_freq: Any, rotary_dim: int) -> None:
    """A given ``inv_freq`` is floating (DTypeError ``inv_freq_dtype``) of shape
    ``(rotary_dim/2,)`` (DimensionMismatchError ``inv_freq_shape``)."""
    spec = describe(inv_freq)
    if spec.dtype not in FLOAT_DTYPES:
        raise make_error(
            "inv_freq_dtype",
            f"inv_freq must be floating (one frequency per rotated pair); got {spec.dtype}",
            expected=" | ".join(FLOAT_DTYPES),
            actual=spec.dtype,
        )
    if spec.shape != (rotary_dim // 2,):
        raise make_error(
            "inv_freq_shape",
            f"inv_freq must have shape (rotary_dim/2,) = ({rotary_dim // 2},), one frequency per "
            f"pair of the rotary_dim={rotary_dim} rotated features; got {spec.shape}",
            expected=f"({rotary_dim // 2},)",
            actual=str(spec.shape),
        )


def _check_rotary_dim_type(rotary_dim: object) -> None:
    """A given ``rotary_dim`` is an integer (a keyword check, before any array is read)."""
    integral = isinstance(rotary_dim, numbers.Integral) and not isinstance(rotary_dim, bool)
    if rotary_dim is not None and not integral:
        raise make_error(
            "rotary_dim",
            f"rotary_dim must be an even integer (or None for the head dim D); got "
            f"{_text(rotary_dim)}",
            expected="even integer or None",
            actual=_text(rotary_dim),
        )


def _resolve_rotary_dim(rotary_dim: object, D: int) -> int:
    """``rotary_dim`` (default D) as an int: even, 2 <= rotary_dim <= D (ConfigError)."""
    _check_rotary_dim_type(rotary_dim)
    resolved = D if rotary_dim is None else int(rotary_dim)
    if not (resolved % 2 == 0 and 2 <= resolved <= D):
        given = f"{resolved}" if rotary_dim is not None else f"None, which means D={D}"
        raise make_error(
            "rotary_dim",
            f"rotary_dim must be even and in [2, D={D}] (the leading features rotated in "
            f"pairs); got {given}" + (". Pass rotary_dim= an even number" if D >= 2 else ""),
            expected=f"even, 2 <= rotary_dim <= {D}",
            actual=str(resolved),
        )
    return resolved


def check_rotary(
    x: Any,
    positions: Any,
    *,
    theta: object = DEFAULT_THETA,
    rotary_dim: object = None,
    interleaved: object = False,
    inv_freq: Any = None,
    attention_factor: object = 1.0,
) -> RotaryDims:
    """Validate one ``apply_rotary`` call and return its sizes and keywords as Python values.

    ``x (..., heads, L, D)`` in one of the four dtypes; ``positions`` integers, broadcastable to
    ``(..., L)``, the batch dims of x without its heads axis (one position per token, shared by
    every head; the output has x's shape). ``inv_freq`` (floating, ``(rotary_dim/2,)``) replaces
    the frequencies ``theta ** (-2p / rotary_dim)`` when given; ``attention_factor`` multiplies
    cos and sin (Contract v3, "Scaled rotary frequencies"). Checked in this order: the keywords
    (``interleaved`` a bool, ``theta`` finite > 0, ``attention_factor`` finite > 0,
    ``rotary_dim`` an integer), the arrays given, x's rank and dtype, the positions' dtype,
    ``rotary_dim`` against D, inv_freq's dtype and shape, the positions' shape.

    Raises:
        ConfigError ``not_a_bool``, ``rope_theta``, ``attention_factor``, ``rotary_dim``;
        DTypeError ``not_an_array``, ``unsupported_dtype``, ``positions_dtype``,
        ``inv_freq_dtype``; DimensionMismatchError ``rank``, ``inv_freq_shape``,
        ``positions_shape``.
    """
    interleaved = check_flag("interleaved", interleaved)
    theta = check_theta(theta)
    factor = check_attention_factor(attention_factor)
    _check_rotary_dim_type(rotary_dim)
    check_given(x=x, positions=positions)
    xs, ps = describe(x), describe(positions)
    if len(xs.shape) < 3:
        raise make_error(
            "rank",
            f"x must have at least 3 dims (..., heads, L, D); got shape {xs.shape}",
            expected="(..., heads, L, D)",
            actual=str(xs.shape),
        )
    check_dtype("x", xs.dtype)
    if ps.dtype not in INTEGER_DTYPES:
        raise make_error(
            "positions_dtype",
            f"positions must be integers (token indices); got {ps.dtype}. Cast them to an "
            "integer dtype",
            expected=" | ".join(INTEGER_DTYPES),
            actual=ps.dtype,
        )
    *batch, heads, L, D = xs.shape
    resolved = _resolve_rotary_dim(rotary_dim, D)
    if inv_freq is not None:
        _check_inv_freq(inv_freq, resolved)
    target = (*batch, L)
    fits = len(ps.shape) <= len(target) and broadcast_shapes(ps.shape, target) == target
    if not fits:
        letters = [*(["B"] if len(batch) == 1 else [f"B{i + 1}" for i in range(len(batch))]), "L"]
        target_text = format_dims(letters, target)
        raise make_error(
            "positions_shape",
            f"positions must broadcast to {target_text}, the batch dims of x {xs.shape} without "
            f"its heads axis (one position per token, shared by every head); got {ps.shape}",
            expected=target_text,
            actual=str(ps.shape),
        )
    return RotaryDims(
        tuple(batch), heads, L, D, resolved, theta, interleaved, factor, inv_freq is not None
    )


# ---------------------------------------------------------------------------------------------
# A module's RoPE settings
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RopeConfig:
    """How a module rotates its queries and keys: ``apply_rotary``'s keywords, resolved;
    ``inv_freq`` as Python floats (None: theta's frequencies)."""

    theta: float
    interleaved: bool
    rotary_dim: int
    inv_freq: tuple[float, ...] | None = None
    attention_factor: float = 1.0

    def keywords(self) -> dict[str, Any]:
        """``apply_rotary``'s keywords but ``inv_freq`` (an array of the module's framework,
        built from :attr:`inv_freq`): ``theta=, rotary_dim=, interleaved=``, and
        ``attention_factor=`` only when it is not 1.0. A port written before contract v3 (its
        ``apply_rotary`` has no attention_factor, PORTING.md's example of 2026-11-30) passes
        ``**keywords()`` on unchanged: the key appears only for a module that sets it."""
        keywords = {"theta": self.theta, "rotary_dim": self.rotary_dim,
                    "interleaved": self.interleaved}
        if self.attention_factor != 1.0:
            keywords["attention_factor"] = self.attention_factor
        return keywords

    def module_keywords(self) -> dict[str, Any]:
        """The module constructor's keywords that rebuild this configuration (JSON values;
        ``rope_inv_freq`` and ``rope_attention_factor`` only when given, so a file without
        them is the same bytes as before they existed)."""
        config = {"rope_theta": self.theta, "rope_interleaved": self.interleaved,
                  "rotary_dim": self.rotary_dim}
        if self.inv_freq is not None:
            config["rope_inv_freq"] = list(self.inv_freq)
        if self.attention_factor != 1.0:
            config["rope_attention_factor"] = self.attention_factor
        return config


def check_rope_inv_freq(rope_inv_freq: Any, rotary_dim: int) -> tuple[float, ...] | None:
    """A module's ``rope_inv_freq`` (an array, or the JSON list of a weight file) as Python
    floats, checked like ``apply_rotary``'s ``inv_freq``: floating (DTypeError
    ``inv_freq_dtype``) of shape ``(rotary_dim/2,)`` (DimensionMismatchError
    ``inv_freq_shape``). None stays None (theta's frequencies)."""
    if rope_inv_freq is None:
        return None
    if isinstance(rope_inv_freq, (list, tuple)):  # a weight file's JSON list
        _check_inv_freq(ArraySpec((len(rope_inv_freq),), "float64"), rotary_dim)
        return tuple(float(f) for f in rope_inv_freq)
    _check_inv_freq(rope_inv_freq, rotary_dim)
    return tuple(float(f) for f in rope_inv_freq.tolist())


def check_rope_config(
    rope_theta: object,
    rope_interleaved: object,
    rotary_dim: object,
    head_dim: int,
    rope_inv_freq: Any = None,
    rope_attention_factor: object = 1.0,
) -> RopeConfig | None:
    """A module's RoPE keywords, validated against its query/key head dim D; None when RoPE is
    off (``rope_theta=None``).

    ``rope_inv_freq`` (``(rotary_dim/2,)`` floating) replaces theta's frequencies and
    ``rope_attention_factor`` multiplies cos and sin, as ``apply_rotary``'s ``inv_freq`` and
    ``attention_factor`` (Contract v3, "Scaled rotary frequencies"). ``rotary_dim``,
    ``rope_interleaved=True``, ``rope_inv_freq`` or ``rope_attention_factor != 1`` without
    ``rope_theta`` is refused rather than ignored (ConfigError ``rope_theta``): RoPE is on
    exactly when ``rope_theta`` is given.

    Raises:
        ConfigError ``not_a_bool``, ``rope_theta``, ``rotary_dim``, ``attention_factor``;
        DTypeError ``inv_freq_dtype``; DimensionMismatchError ``inv_freq_shape``.
    """
    interleaved = check_flag("rope_interleaved", rope_interleaved)
    factor = check_attention_factor(rope_attention_factor, "rope_attention_factor")
    if rope_theta is None:
        options = {"rotary_dim": rotary_dim is not None, "rope_interleaved": interleaved,
                   "rope_inv_freq": rope_inv_freq is not None,
                   "rope_attention_factor": factor != 1.0}
        values = {"rotary_dim": rotary_dim, "rope_interleaved": interleaved,
                  "rope_inv_freq": rope_inv_freq, "rope_attention_factor": factor}
        given = ", ".join(f"{name}={_text(values[name])}" for name, on in options.items() if on)
        if given:
            raise make_error(
                "rope_theta",
                f"{given} given without rope_theta: RoPE is on only when rope_theta is given "
                "(10000.0 for Llama 2, 500000.0 for Llama 3)",
                expected="rope_theta given, or no RoPE keywords",
                actual=given,
            )
        return None
    theta = check_theta(rope_theta, "rope_theta")
    resolved = _resolve_rotary_dim(rotary_dim, head_dim)
    inv_freq = check_rope_inv_freq(rope_inv_freq, resolved)
    return RopeConfig(theta, interleaved, resolved, inv_freq, factor)
