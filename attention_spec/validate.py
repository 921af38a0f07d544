"""Shape, dtype and keyword validation: the one place where bad input is caught.

Pure Python on shapes (tuples of ints) and dtype *names* (``"float32"``, ``"bfloat16"``,
``"bool"``, ...). The checks take the arrays themselves (NumPy, torch, JAX, or anything with a
``.shape`` and a ``.dtype``) and read them through one adapter, :func:`describe`, so each
implementation hands its arrays over as they are and the three frameworks raise the same error
class, code and message for the same mistake. Where there is no array yet (the query a module is
about to project), an :class:`ArraySpec` stands in for it.

Keyword scalars (``scale``, ``softcap``, sizes) are turned into Python numbers here, once, so the
implementations compute with the same ``float`` whatever the caller passed (a NumPy scalar, a
0-d tensor, a ``Fraction``), and messages show Python numbers, never the caller's ``repr()``.

Rules are checked in a fixed order, so an input with several mistakes reports the same one
everywhere: keywords, arrays given, ranks, dtypes, ranges in the compute dtype, sizes,
head/length/batch agreement, mask, bias.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from attention_spec.errors import make_error

__all__ = [
    "ALIGNMENTS",
    "BAND_BLOCKS",
    "BLOCK_K",
    "BLOCK_Q",
    "FINITE_MAX",
    "FLOAT_DTYPES",
    "NO_VALUE",
    "SOFTCAP_RANGE",
    "SUPPORTED_DTYPES",
    "ArraySpec",
    "AttentionDims",
    "broadcast_shapes",
    "causal_offset",
    "check_alignment",
    "check_attention",
    "check_block_sizes",
    "check_causal_mask_args",
    "check_config",
    "check_dtype",
    "check_flag",
    "check_float64",
    "check_given",
    "check_size",
    "check_window",
    "compute_dtype",
    "describe",
    "divisors",
    "dtype_name",
    "format_dims",
    "real_keyword",
    "tiled_blocks",
]

#: The dtypes query, key and value may have (NumPy spells bfloat16 through ml_dtypes).
SUPPORTED_DTYPES: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16")
#: The dtypes a bias may have.
FLOAT_DTYPES: tuple[str, ...] = SUPPORTED_DTYPES
#: The two causal alignments (see :func:`causal_offset`).
ALIGNMENTS: tuple[str, ...] = ("top_left", "bottom_right")
#: The largest finite number of each compute dtype (float32 for float32, float16, bfloat16).
FINITE_MAX: dict[str, float] = {"float64": 1.7976931348623157e308, "float32": 3.4028234663852886e38}
#: softcap's range: beyond it the cap is either no cap at all for any score a float32 holds
#: that matters, or flush-to-zero (XLA's) changes ``s / softcap`` (docs/SEMANTICS.md).
SOFTCAP_RANGE: tuple[float, float] = (2.0**-64, 2.0**64)

Shape = tuple[int, ...]


# ---------------------------------------------------------------------------------------------
# The adapter: what validation reads of an array
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# Small rules shared by the functional API and the modules
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionDims:
    """The sizes of one attention call, after validation.

    ``batch`` is the broadcast of the leading dims of query, key and value; ``scale`` is the
    resolved score scale (``1/sqrt(D)`` unless given), ``softcap`` the cap as a Python float (or
    None), ``is_causal`` the flag as a Python bool, ``window`` the pair ``(left, right)`` of
    Python ints or None: the implementations compute with these, not the caller's objects.
    """

    batch: Shape
    H: int
    K: int
    L: int
    S: int
    D: int
    E: int
    scale: float
    softcap: float | None = None
    is_causal: bool = False
    window: tuple[int | None, int | None] | None = None

    @property
    def G(self) -> int:
        """Query heads per key/value head (H // K)."""
        return self.H // self.K

    @property
    def scores_shape(self) -> Shape:
        """(..., H, L, S)."""
        return (*self.batch, self.H, self.L, self.S)

    @property
    def output_shape(self) -> Shape:
        """(..., H, L, E)."""
        return (*self.batch, self.H, self.L, self.E)


def format_dims(letters: Sequence[str], dims: Sequence[int]) -> str:
    """``format_dims("HLS", (8, 5, 7))`` -> ``"(H=8, L=5, S=7)"``."""
    return "(" + ", ".join(f"{a}={n}" for a, n in zip(letters, dims)) + ")"


def _batch_letters(n: int) -> list[str]:
    return ["B"] if n == 1 else [f"B{i + 1}" for i in range(n)]


def _fmt_target(batch: Shape, H: int, L: int, S: int) -> str:
    return format_dims([*_batch_letters(len(batch)), "H", "L", "S"], (*batch, H, L, S))


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


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _is_int(n: object) -> bool:
    return isinstance(n, numbers.Integral) and not isinstance(n, bool)


def check_size(name: str, n: object, *, minimum: int = 1) -> None:
    """``n`` is an integer >= ``minimum`` (ConfigError ``non_positive_size``).

    ``name`` says which size, with its letter: ``"n_heads (H)"``, ``"block_q"``.
    """
    if not (_is_int(n) and n >= minimum):
        raise make_error(
            "non_positive_size",
            f"{name} must be an integer >= {minimum}; got {_value_text(n)}",
            expected=f"integer >= {minimum}",
            actual=_value_text(n),
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


def _value_text(x: object) -> str:
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


def _is_numpy_bool(x: object) -> bool:
    return type(x).__module__ == "numpy" and type(x).__name__ in ("bool", "bool_")


def check_flag(name: str, x: object) -> bool:
    """``x`` as a bool: a Python or NumPy bool, else ConfigError ``not_a_bool`` (a string such as
    ``"False"`` would otherwise be true)."""
    if isinstance(x, bool) or _is_numpy_bool(x):
        return bool(x)
    raise make_error(
        "not_a_bool",
        f"{name} must be a bool (True or False); got {_value_text(x)}",
        expected="bool",
        actual=_value_text(x),
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
            f"{name} must be a real number; got {_value_text(x)}",
            expected="real number",
            actual=_value_text(x),
        )
    try:
        return float(value)
    except OverflowError:  # an int (or Fraction) beyond float64
        return math.inf if value > 0 else -math.inf


def check_alignment(alignment: object) -> None:
    """``causal_alignment`` is one of :data:`ALIGNMENTS` (ConfigError ``unknown_alignment``)."""
    if not (isinstance(alignment, str) and alignment in ALIGNMENTS):
        raise make_error(
            "unknown_alignment",
            f"causal_alignment must be one of {ALIGNMENTS}; got {_value_text(alignment)}",
            expected=" | ".join(ALIGNMENTS),
            actual=_value_text(alignment),
        )


def check_config(
    *, causal_alignment: str = "top_left", scale: object = None, softcap: object = None
) -> tuple[float | None, float | None]:
    """Validate the scalar keywords that need no array (ConfigError); return ``scale`` and
    ``softcap`` as Python floats (None stays None). An integer too large for a float is not
    finite here; :func:`check_attention` then checks them against the compute dtype."""
    check_alignment(causal_alignment)
    if scale is not None:
        exact = isinstance(scale, numbers.Rational)  # an int or Fraction: inf only by overflow
        shown = _shown(scale)
        scale = real_keyword("scale", "scale_not_finite", scale)
        if math.isnan(scale) or (math.isinf(scale) and not exact):
            raise make_error(
                "scale_not_finite",
                f"scale must be a finite real number (zero and negative are allowed); "
                f"got {shown(scale)}",
                expected="finite real number",
                actual=shown(scale),
            )
    if softcap is not None:
        exact = isinstance(softcap, numbers.Rational)
        shown = _shown(softcap)
        softcap = real_keyword("softcap", "softcap_not_positive", softcap)
        if not softcap > 0 or (math.isinf(softcap) and not exact):
            raise make_error(
                "softcap_not_positive",
                f"softcap must be a finite number > 0 (or None for no cap); got {shown(softcap)}",
                expected="finite number > 0",
                actual=shown(softcap),
            )
    return scale, softcap


def _shown(given: object) -> Callable[[float], str]:
    """How a message shows a keyword: as given when it is a Python int or float, else as the
    Python float it was converted to (``got 0.5`` for a 0-d array, in every framework)."""
    if type(given) in (int, float):  # exactly Python's: np.float64(0.5) is shown 0.5
        return lambda converted: _value_text(given)
    return _value_text


def compute_dtype(dtype: str) -> str:
    """The dtype the arithmetic runs in: float64 for float64, float32 for the other three."""
    return "float64" if dtype == "float64" else "float32"


def _check_ranges(dtype: str, scale: float | None, softcap: float | None, given: dict) -> None:
    """``scale`` finite in the compute dtype (``scale_range``), ``softcap`` in
    :data:`SOFTCAP_RANGE` (``softcap_range``)."""
    ct = compute_dtype(dtype)
    if scale is not None and not abs(scale) <= FINITE_MAX[ct]:
        raise make_error(
            "scale_range",
            f"scale must be finite in the compute dtype {ct} (|scale| <= {FINITE_MAX[ct]:.8g}, "
            f"for {dtype} inputs); got {_shown(given['scale'])(scale)}",
            expected=f"|scale| <= {FINITE_MAX[ct]:.8g}",
            actual=_shown(given["scale"])(scale),
        )
    low, high = SOFTCAP_RANGE
    if softcap is not None and not low <= softcap <= high:
        raise make_error(
            "softcap_range",
            f"softcap must be in [2**-64, 2**64] (a larger cap leaves every score a float "
            f"keeps as it is, and flush-to-zero would make s / softcap differ between backends); "
            f"got {_shown(given['softcap'])(softcap)}. Use None for no cap",
            expected="2**-64 <= softcap <= 2**64",
            actual=_shown(given["softcap"])(softcap),
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


#: The default block sizes of the tiled path, in all three implementations (docs/FLASH.md,
#: "Block sizes"): on a 2-core Xeon, L = S = 2048 and 4096, H = 8, D = 64, float32, 256 x 512 was
#: within noise of the fastest choice for NumPy, torch and JAX alike, and one block of scores is
#: then H x 256 x 512 x 4 bytes (4 MiB at H = 8). A GPU kernel wants other sizes.
BLOCK_Q: int = 256
BLOCK_K: int = 512

#: The tiled path's blocks under a narrow window, per package: ``(rows, widest)`` (docs/FLASH.md,
#: "Block sizes"). A call whose causal and window bands leave each query row at most
#: ``left + 1 + right`` keys, where ``rows + left + right <= widest``, is tiled in blocks of
#: ``rows`` query rows and ``rows + left + right`` keys, the band of one query block, so a block
#: holds one band and as little outside it as the rows allow. NumPy and torch pay per score:
#: under ``(256, 0)`` a 128-row block's band is 384 keys, two thirds of them allowed, against
#: half at 256 rows, and their window call at L = S = 8192 took 0.72x and 0.90x the time. JAX's
#: scan pays per step, and XLA's CPU matmuls are slow at some shapes: 64-row blocks took 0.3x to
#: 0.7x the time for bands of up to 256 keys (windows up to ``(192, 0)``), but under
#: ``(256, 0)`` they were faster in one run and slower in another.
BAND_BLOCKS: dict[str, tuple[int, int]] = {
    "numpy": (128, 512),
    "torch": (128, 512),
    "jax": (64, 256),
}


def check_block_sizes(block_q: int, block_k: int) -> None:
    """Block sizes of a tiled path are integers >= 1 (ConfigError ``non_positive_size``)."""
    check_size("block_q", block_q)
    check_size("block_k", block_k)


def tiled_blocks(
    package: str,
    block_q: int | None,
    block_k: int | None,
    is_causal: bool,
    window: tuple[int | None, int | None] | None,
) -> tuple[int, int]:
    """The block sizes of one tiled call of ``package`` ("numpy" | "torch" | "jax"): each size
    given as it is, each None from the default pair; then :func:`check_block_sizes`.

    The default pair is ``BLOCK_Q x BLOCK_K``, or, under a narrow band (``window`` bounded on
    the left, and on the right or by ``is_causal``, with ``rows + left + right <= widest`` for
    the package's :data:`BAND_BLOCKS`), ``rows x (rows + left + right)``.
    """
    rows, widest = BAND_BLOCKS[package]
    left, right = (None, None) if window is None else window
    if is_causal:  # the causal rule ends every row's band at the diagonal
        right = 0 if right is None else min(right, 0)
    default = (BLOCK_Q, BLOCK_K)
    if left is not None and right is not None and rows + left + right <= widest:
        default = (rows, rows + left + right)
    sizes = (default[0] if block_q is None else block_q, default[1] if block_k is None else block_k)
    check_block_sizes(*sizes)
    return sizes


# ---------------------------------------------------------------------------------------------
# One attention call
# ---------------------------------------------------------------------------------------------


def _check_rank(name: str, shape: Shape, letters: str) -> None:
    if len(shape) < 3:
        raise make_error(
            "rank",
            f"{name} must have at least 3 dims (..., {', '.join(letters)}); got shape {shape}",
            expected=f"(..., {', '.join(letters)})",
            actual=str(shape),
        )


def _check_dtypes(q_dtype: str, k_dtype: str, v_dtype: str | None) -> None:
    check_dtype("query", q_dtype)
    given = {"query": q_dtype, "key": k_dtype} | ({} if v_dtype is None else {"value": v_dtype})
    if len(set(given.values())) > 1:
        listing = ", ".join(f"{k}={v}" for k, v in given.items())
        raise make_error(
            "dtype_mismatch",
            f"query, key and value must share one dtype; got {listing}",
            expected="one dtype",
            actual=listing,
        )


def _check_additive(
    kind: str, shape: Shape, dtype: str, batch: Shape, H: int, K: int, L: int, S: int
) -> None:
    """The dtype and broadcast rules shared by ``mask`` (kind="mask") and ``bias``."""
    if kind == "mask" and dtype != "bool":
        raise make_error(
            "mask_dtype",
            f"mask must be boolean (True = may attend); got {dtype}. "
            "To add a float mask, pass it as bias= (0 keeps, -inf masks out)",
            expected="bool",
            actual=dtype,
        )
    if kind == "bias" and dtype not in FLOAT_DTYPES:
        raise make_error(
            "bias_dtype",
            f"bias must be floating point, one of {FLOAT_DTYPES}; got {dtype}. "
            "For a boolean keep/drop mask pass it as mask=",
            expected=" | ".join(FLOAT_DTYPES),
            actual=dtype,
        )
    target = (*batch, H, L, S)
    target_text = _fmt_target(batch, H, L, S)
    if len(shape) >= 3 and shape[-3] == K and K not in (1, H):
        raise make_error(
            f"{kind}_kv_heads",
            f"{kind} head axis has size {K}, the number of key/value heads (K={K}); it must be 1 "
            f"or the number of query heads (H={H}). {kind} must broadcast to {target_text}; "
            f"got {shape}",
            expected=target_text,
            actual=str(shape),
        )
    fits = len(shape) <= len(target) and all(
        a in (1, b) for a, b in zip(reversed(shape), reversed(target))
    )
    if not fits:
        raise make_error(
            f"{kind}_shape",
            f"{kind} must broadcast to {target_text}; got {shape}",
            expected=target_text,
            actual=str(shape),
        )


def check_window(window: object) -> tuple[int | None, int | None] | None:
    """``window`` as ``(left, right)`` of Python ints >= 0 or None (ConfigError
    ``window_value``): a pair (tuple or list of two), each side an integer >= 0 or None for
    unbounded. None (no window) stays None."""
    if window is None:
        return None
    pair = isinstance(window, tuple | list) and len(window) == 2
    if pair and all(side is None or (_is_int(side) and side >= 0) for side in window):
        sides = tuple(None if side is None else int(side) for side in window)
        return None if sides == (None, None) else sides  # unbounded both ways: no window
    shown = (
        f"({', '.join(_value_text(side) for side in window)})"
        if isinstance(window, tuple | list) else _value_text(window)
    )  # fmt: skip
    raise make_error(
        "window_value",
        f"window must be a pair (left, right), each side an integer >= 0 or None for "
        f"unbounded; got {shown}",
        expected="(left, right): int >= 0 or None each",
        actual=shown,
    )


def _check_segments(q_ids: ArraySpec | None, kv_ids: ArraySpec | None, batch: Shape, L: int,
                    S: int) -> None:  # fmt: skip
    """``q_segment_ids`` and ``kv_segment_ids``: both or neither, integers, broadcastable to
    ``(..., L)`` and ``(..., S)``."""
    if (q_ids is None) != (kv_ids is None):
        given, missing = ("q", "kv") if kv_ids is None else ("kv", "q")
        raise make_error(
            "segment_ids_pair",
            f"{given}_segment_ids was given without {missing}_segment_ids: give both (the "
            "segment of every query and of every key) or neither",
            expected="both or neither",
            actual=f"{given}_segment_ids only",
        )
    if q_ids is None:
        return
    for name, ids, n, letter in (("q", q_ids, L, "L"), ("kv", kv_ids, S, "S")):
        if not ids.dtype.startswith(("int", "uint")):
            raise make_error(
                "segment_ids_dtype",
                f"{name}_segment_ids must be integers (one segment id per position); got "
                f"{ids.dtype}",
                expected="integer dtype",
                actual=ids.dtype,
            )
        target = (*batch, n)
        fits = len(ids.shape) <= len(target) and all(
            a in (1, b) for a, b in zip(reversed(ids.shape), reversed(target))
        )
        if not fits:
            text = format_dims([*_batch_letters(len(batch)), letter], target)
            raise make_error(
                "segment_ids_shape",
                f"{name}_segment_ids must broadcast to {text}; got {ids.shape}",
                expected=text,
                actual=str(ids.shape),
            )


def _check_per_head(name: str, spec: ArraySpec | None, H: int) -> None:
    """``sinks`` or ``alibi_slopes``: one floating number per query head, ``(H,)``."""
    if spec is None:
        return
    short = name.split("_")[0]  # "sinks", "alibi"
    if spec.shape != (H,):
        raise make_error(
            f"{short}_shape",
            f"{name} must have one entry per query head, shape (H={H},); got {spec.shape}",
            expected=f"(H={H},)",
            actual=str(spec.shape),
        )
    if spec.dtype not in FLOAT_DTYPES:
        raise make_error(
            f"{short}_dtype",
            f"{name} must be floating, one of {FLOAT_DTYPES}; got {spec.dtype}",
            expected=" | ".join(FLOAT_DTYPES),
            actual=spec.dtype,
        )


#: ``check_attention``'s ``value`` when the call has none (``attention_weights``); an explicit
#: None is a missing array.
NO_VALUE: Any = ArraySpec((), "absent")


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


def check_attention(
    query: Any,
    key: Any,
    value: Any = NO_VALUE,
    *,
    mask: Any = None,
    bias: Any = None,
    is_causal: object = False,
    causal_alignment: str = "top_left",
    scale: object = None,
    softcap: object = None,
    window: object = None,
    q_segment_ids: Any = None,
    kv_segment_ids: Any = None,
    sinks: Any = None,
    alibi_slopes: Any = None,
) -> AttentionDims:
    """Validate one attention call and return its sizes and its keywords as Python values.

    The arrays are read through :func:`describe` (anything with ``.shape`` and ``.dtype``, or an
    :class:`ArraySpec`). Shapes: query ``(..., H, L, D)``, key ``(..., K, S, D)``, value
    ``(..., K, S, E)`` (left out for ``attention_weights``), mask and bias broadcastable to
    ``(..., H, L, S)``; segment ids (integers) to ``(..., L)`` and ``(..., S)``; ``sinks`` and
    ``alibi_slopes`` are ``(H,)`` floating. ``scale`` and ``softcap`` come back as floats
    (``scale`` resolved to ``1/sqrt(D)`` when None), ``is_causal`` as a bool, ``window`` as a
    pair of ints or None.

    Raises:
        ConfigError, DimensionMismatchError, DTypeError, MaskError: see SEMANTICS.md.
    """
    given = {"scale": scale, "softcap": softcap}
    is_causal = check_flag("is_causal", is_causal)
    scale, softcap = check_config(causal_alignment=causal_alignment, scale=scale, softcap=softcap)
    window = check_window(window)
    with_value = value is not NO_VALUE
    check_given(query=query, key=key, **({"value": value} if with_value else {}))
    q, k = describe(query), describe(key)
    v = describe(value) if with_value else None
    m, b = describe(mask), describe(bias)
    _check_rank("query", q.shape, "HLD")
    _check_rank("key", k.shape, "KSD")
    if v is not None:
        _check_rank("value", v.shape, "KSE")
    _check_dtypes(q.dtype, k.dtype, None if v is None else v.dtype)
    _check_ranges(q.dtype, scale, softcap, given)

    H, L, D = q.shape[-3:]
    K, S, Dk = k.shape[-3:]
    Kv, Sv, E = v.shape[-3:] if v is not None else (K, S, 1)
    for what, n in (
        ("query heads H", H),
        ("key heads K", K),
        ("value heads K", Kv),
        ("head dim D", D),
        ("value head dim E", E),
    ):
        if n < 1:
            raise make_error(
                "non_positive_size",
                f"{what} must be >= 1; got {n} (query {q.shape}, key {k.shape}"
                + (f", value {v.shape})" if v is not None else ")"),
                expected=">= 1",
                actual=str(n),
            )
    if Dk != D:
        raise make_error(
            "qk_head_dim_mismatch",
            f"query head dim (D={D}) must equal key head dim (D={Dk}); "
            f"got query {q.shape}, key {k.shape}",
            expected=f"key (..., K, S, D={D})",
            actual=str(k.shape),
        )
    if v is not None and Kv != K:
        raise make_error(
            "kv_heads_mismatch",
            f"key and value must have the same number of heads; got key K={K}, value K={Kv} "
            f"(key {k.shape}, value {v.shape})",
            expected=f"value (..., K={K}, S, E)",
            actual=str(v.shape),
        )
    if v is not None and Sv != S:
        raise make_error(
            "kv_length_mismatch",
            f"key length (S={S}) must equal value length (S={Sv}); "
            f"got key {k.shape}, value {v.shape}",
            expected=f"value (..., K, S={S}, E)",
            actual=str(v.shape),
        )
    if H % K:
        choices = divisors(H)
        raise make_error(
            "heads_not_divisible",
            f"key heads (K={K}) must divide query heads (H={H})",
            expected="H % K == 0" + (f" (K in {choices})" if choices else ""),
            actual=f"H={H}, K={K}",
        )
    batches = [q.shape[:-3], k.shape[:-3]]
    if v is not None:
        batches.append(v.shape[:-3])
    batch = broadcast_shapes(*batches)
    if batch is None:
        listing = ", ".join(f"{n} {b}" for n, b in zip(("query", "key", "value"), batches))
        raise make_error(
            "batch_not_broadcastable",
            f"leading batch dims must broadcast; got {listing}",
            expected="broadcastable batch dims",
            actual=listing,
        )
    if m is not None:
        _check_additive("mask", m.shape, m.dtype, batch, H, K, L, S)
    if b is not None:
        _check_additive("bias", b.shape, b.dtype, batch, H, K, L, S)
    _check_segments(describe(q_segment_ids), describe(kv_segment_ids), batch, L, S)
    _check_per_head("sinks", describe(sinks), H)
    _check_per_head("alibi_slopes", describe(alibi_slopes), H)

    resolved = 1.0 / math.sqrt(D) if scale is None else scale
    return AttentionDims(
        batch=batch, H=H, K=K, L=L, S=S, D=D, E=E, scale=resolved, softcap=softcap,
        is_causal=is_causal, window=window,
    )  # fmt: skip
