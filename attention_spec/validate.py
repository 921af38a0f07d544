"""Shape, dtype and keyword validation: the one place where bad input is caught.

Pure Python on shapes (tuples of ints) and dtype *names* (``"float32"``, ``"bfloat16"``,
``"bool"``, ...). The checks take the arrays themselves (NumPy, torch, JAX, or anything with a
``.shape`` and a ``.dtype``) and read them through one adapter, :func:`describe`, so each
implementation hands its arrays over as they are and the three frameworks raise the same error
class, code and message for the same mistake. Where there is no array yet (the query a module is
about to project), an :class:`ArraySpec` stands in for it.

Rules are checked in a fixed order, so an input with several mistakes reports the same one
everywhere: keywords, ranks, dtypes, sizes, head/length/batch agreement, mask, bias.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attention_spec.errors import make_error

__all__ = [
    "ALIGNMENTS",
    "FLOAT_DTYPES",
    "SUPPORTED_DTYPES",
    "ArraySpec",
    "AttentionDims",
    "broadcast_shapes",
    "causal_offset",
    "check_attention",
    "check_block_sizes",
    "check_causal_mask_args",
    "check_config",
    "check_dtype",
    "check_size",
    "describe",
    "dtype_name",
    "format_dims",
]

#: The dtypes query, key and value may have (NumPy spells bfloat16 through ml_dtypes).
SUPPORTED_DTYPES: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16")
#: The dtypes a bias may have.
FLOAT_DTYPES: tuple[str, ...] = SUPPORTED_DTYPES
#: The two causal alignments (see :func:`causal_offset`).
ALIGNMENTS: tuple[str, ...] = ("top_left", "bottom_right")

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


def dtype_name(dtype: Any) -> str:
    """The contract's name of a framework's dtype: ``"float32"``, ``"bfloat16"``, ``"bool"``.

    NumPy and JAX dtypes carry it as ``.name``; torch spells it ``torch.bfloat16`` (and MLX
    ``mlx.core.bfloat16``), from which the last dotted part is taken.
    """
    name = getattr(dtype, "name", None)
    if isinstance(name, str):
        return name
    return str(dtype).rsplit(".", 1)[-1]


def describe(array: Any) -> ArraySpec | None:
    """The :class:`ArraySpec` of ``array`` (anything with ``.shape`` and ``.dtype``); None stays
    None (an argument that was not given)."""
    if array is None or isinstance(array, ArraySpec):
        return array
    return ArraySpec(tuple(int(n) for n in array.shape), dtype_name(array.dtype))


# ---------------------------------------------------------------------------------------------
# Small rules shared by the functional API and the modules
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionDims:
    """The sizes of one attention call, after validation.

    ``batch`` is the broadcast of the leading dims of query, key and value; ``scale`` is the
    resolved score scale (``1/sqrt(D)`` unless given).
    """

    batch: Shape
    H: int
    K: int
    L: int
    S: int
    D: int
    E: int
    scale: float

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
            f"{name} must be an integer >= {minimum}; got {n!r}",
            expected=f"integer >= {minimum}",
            actual=repr(n),
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


def check_config(
    *, causal_alignment: str = "top_left", scale: float | None = None, softcap: float | None = None
) -> None:
    """Validate the scalar keywords (ConfigError)."""
    if causal_alignment not in ALIGNMENTS:
        raise make_error(
            "unknown_alignment",
            f"causal_alignment must be one of {ALIGNMENTS}; got {causal_alignment!r}",
            expected=" | ".join(ALIGNMENTS),
            actual=repr(causal_alignment),
        )
    if scale is not None and not (_is_real(scale) and math.isfinite(float(scale))):
        raise make_error(
            "scale_not_finite",
            f"scale must be a finite real number (zero and negative are allowed); got {scale!r}",
            expected="finite real number",
            actual=repr(scale),
        )
    if softcap is not None and not (_is_real(softcap) and math.isfinite(softcap) and softcap > 0):
        raise make_error(
            "softcap_not_positive",
            f"softcap must be a finite number > 0 (or None for no cap); got {softcap!r}",
            expected="finite number > 0",
            actual=repr(softcap),
        )


def causal_offset(q_len: int, kv_len: int, alignment: str = "top_left") -> int:
    """The diagonal of the causal rule: query i may attend key j iff ``j <= i + offset``.

    ``top_left`` (torch ``is_causal``, jax, flax, keras, onnx): offset 0.
    ``bottom_right`` (flash-attn >= 2.1, torch ``causal_lower_right``, every KV cache): the last
    query row lines up with the last key, offset ``S - L``. With L > S the first ``L - S`` rows
    are then fully masked.
    """
    check_config(causal_alignment=alignment)
    return 0 if alignment == "top_left" else kv_len - q_len


def check_causal_mask_args(q_len: int, kv_len: int, alignment: str) -> None:
    """Validate the arguments of ``causal_mask`` (ConfigError)."""
    check_config(causal_alignment=alignment)
    check_size("q_len (L)", q_len, minimum=0)
    check_size("kv_len (S)", kv_len, minimum=0)


def check_block_sizes(block_q: int, block_k: int) -> None:
    """Block sizes of the tiled path are integers >= 1 (ConfigError ``non_positive_size``)."""
    check_size("block_q", block_q)
    check_size("block_k", block_k)


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


def check_attention(
    query: Any,
    key: Any,
    value: Any = None,
    *,
    mask: Any = None,
    bias: Any = None,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
) -> AttentionDims:
    """Validate one attention call and return its sizes.

    The arrays are read through :func:`describe` (anything with ``.shape`` and ``.dtype``, or an
    :class:`ArraySpec`). Shapes: query ``(..., H, L, D)``, key ``(..., K, S, D)``, value
    ``(..., K, S, E)`` (None for ``attention_weights``), mask and bias broadcastable to
    ``(..., H, L, S)``.

    Raises:
        ConfigError, DimensionMismatchError, DTypeError, MaskError: see SEMANTICS.md.
    """
    check_config(causal_alignment=causal_alignment, scale=scale, softcap=softcap)
    q, k, v = describe(query), describe(key), describe(value)
    m, b = describe(mask), describe(bias)
    _check_rank("query", q.shape, "HLD")
    _check_rank("key", k.shape, "KSD")
    if v is not None:
        _check_rank("value", v.shape, "KSE")
    _check_dtypes(q.dtype, k.dtype, None if v is None else v.dtype)

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
        raise make_error(
            "heads_not_divisible",
            f"key heads (K={K}) must divide query heads (H={H})",
            expected=f"H % K == 0 (K in {[k for k in range(1, H + 1) if H % k == 0]})",
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

    resolved = 1.0 / math.sqrt(D) if scale is None else float(scale)
    return AttentionDims(batch=batch, H=H, K=K, L=L, S=S, D=D, E=E, scale=resolved)
