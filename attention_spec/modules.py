"""The attention modules' own checks: their sizes, their settings, and each call's inputs.

Pure Python on sizes, shapes and dtype names, like :mod:`attention_spec.validate`: the NumPy,
PyTorch and JAX modules call these functions before any arithmetic, so a module built or called
wrongly raises the same class, code and message in all three frameworks (SEMANTICS.md,
"Modules"). The canonical weights are :mod:`attention_spec.weights`'s, the KV cache's checks
:mod:`attention_spec.cache`'s; both are found here too (``from attention_spec.modules import
check_canonical, check_decode_inputs``), as before they had modules of their own.

Shape letters: B batch, H query heads, K key/value heads (G = H // K), L query length,
S key/value length, D query/key head dim, E value head dim, M model width (d_model).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any

from attention_spec.arrays import (
    SUPPORTED_DTYPES,
    ArraySpec,
    broadcast_shapes,
    check_dtype,
    check_given,
    describe,
    dtype_name,
    format_dims,
)
from attention_spec.call import AttentionCall
from attention_spec.deprecated import ARRAY_KEYWORDS_1_0, masks_1_0, spec_1_0, warn_1_0
from attention_spec.errors import make_error
from attention_spec.keywords import (
    check_alignment,
    check_config,
    check_flag,
    check_ranges,
    check_size,
    check_window,
    divisors,
)
from attention_spec.validate import check_attention

__all__ = [
    "ITEMSIZE",
    "AttentionOptions",
    "ModuleDims",
    "check_allocatable",
    "check_attention_options",
    "check_module_config",
    "check_module_inputs",
    "check_padding_mask_args",
    "check_sequence",
    "module_dtype",
]

#: Where the names that moved out of this module live now; ``attention_spec.modules.X`` still
#: finds each of them (PORTING.md imports the module checks from here).
_MOVED: dict[str, str] = {
    **dict.fromkeys(
        ("CANONICAL_FORMAT", "METADATA_KEY", "PROJECTIONS", "check_canonical", "check_interop",
         "heads_from_metadata", "options_from_metadata", "weights_metadata"),
        "attention_spec.weights",
    ),
    **dict.fromkeys(("check_cache_size", "check_decode_inputs"), "attention_spec.cache"),
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class ModuleDims:
    """The sizes of one attention module: ``M, H, K, D, E`` and whether it has biases."""

    M: int
    H: int
    K: int
    D: int
    E: int
    bias: bool = True
    sinks: bool = False

    @property
    def G(self) -> int:
        """Query heads per key/value head (H // K)."""
        return self.H // self.K

    def canonical_shapes(self) -> dict[str, tuple[int, ...]]:
        """The canonical weight names and shapes, in forward order (kernels ``(in, out)``; the
        format: :mod:`attention_spec.weights`)."""
        M, H, K, D, E = self.M, self.H, self.K, self.D, self.E
        kernels = {"q_proj": (M, H * D), "k_proj": (M, K * D), "v_proj": (M, K * E),
                   "o_proj": (H * E, M)}
        shapes: dict[str, tuple[int, ...]] = {}
        for name, (n_in, n_out) in kernels.items():
            shapes[f"{name}.kernel"] = (n_in, n_out)
            if self.bias:
                shapes[f"{name}.bias"] = (n_out,)
        if self.sinks:
            shapes["sinks"] = (H,)  # one learned sink logit per query head
        return shapes

    def __str__(self) -> str:
        return format_dims("MHKDE", (self.M, self.H, self.K, self.D, self.E))


def module_dtype(dtype: object) -> str:
    """The canonical name of a module's ``dtype`` argument, the same in all three frameworks.

    None is float32. A name must be one of the four canonical ones (``"float32"``, not ``"f4"``);
    a framework's dtype object (``np.float16``, ``np.dtype("float64")``, ``torch.bfloat16``,
    ``jnp.float32``, ``ml_dtypes.bfloat16``) must name one of them. Anything else is DTypeError
    ``unsupported_dtype``.
    """
    if dtype is None:
        return "float32"
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(dtype, type):  # np.float32, jnp.bfloat16, ml_dtypes.bfloat16: classes
        name = dtype.__name__
    else:  # np.dtype(...), torch.float16
        name = dtype_name(dtype)
    if name not in SUPPORTED_DTYPES:
        shown = repr(dtype) if isinstance(dtype, str) else name
        raise make_error(
            "unsupported_dtype",
            f"module dtype must be one of {SUPPORTED_DTYPES} (a name, or the framework's dtype "
            f"for one of them); got {shown}",
            expected=" | ".join(SUPPORTED_DTYPES),
            actual=shown,
        )
    return name


def check_module_config(
    d_model: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int | None = None,
    value_head_dim: int | None = None,
    *,
    bias: bool = True,
    dtype: str = "float32",
    sinks: bool = False,
    memory_bytes: int | None = None,
) -> ModuleDims:
    """Validate the constructor arguments of a module and return its sizes.

    ``head_dim`` (D) defaults to ``d_model // n_heads``; ``value_head_dim`` (E) defaults to D.
    ``memory_bytes``: the bytes the caller's machine holds, or None where it cannot say (see
    :func:`check_allocatable`; attention_spec reads nothing of the machine itself).

    Raises:
        ConfigError ``non_positive_size``: a size that is not an integer >= 1.
        DimensionMismatchError ``d_model_not_divisible``: no head_dim and M % H != 0.
        DimensionMismatchError ``heads_not_divisible``: H % K != 0.
        DTypeError ``unsupported_dtype``: a dtype outside the supported four.
        MemoryError: weights that need more than ``memory_bytes``.
    """
    check_size("d_model (M)", d_model)
    check_size("n_heads (H)", n_heads)
    check_size("n_kv_heads (K)", n_kv_heads)
    if head_dim is not None:
        check_size("head_dim (D)", head_dim)
    if value_head_dim is not None:
        check_size("value_head_dim (E)", value_head_dim)
    bias = check_flag("bias", bias)
    sinks = check_flag("sinks", sinks)
    check_dtype("module", dtype)
    if head_dim is None and d_model % n_heads:
        choices = divisors(d_model)
        raise make_error(
            "d_model_not_divisible",
            f"d_model (M={d_model}) must be divisible by n_heads (H={n_heads}) when head_dim is "
            "not given; pass head_dim=" + (f" or use n_heads in {choices}" if choices else ""),
            expected="M % H == 0"
            + (f" (H in {choices})" if choices else "")
            + " or head_dim given",
            actual=f"M={d_model}, H={n_heads}",
        )
    if n_heads % n_kv_heads:
        choices = divisors(n_heads)
        raise make_error(
            "heads_not_divisible",
            f"n_kv_heads (K={n_kv_heads}) must divide n_heads (H={n_heads})",
            expected="H % K == 0" + (f" (K in {choices})" if choices else ""),
            actual=f"H={n_heads}, K={n_kv_heads}",
        )
    D = d_model // n_heads if head_dim is None else head_dim
    E = D if value_head_dim is None else value_head_dim
    dims = ModuleDims(M=int(d_model), H=int(n_heads), K=int(n_kv_heads), D=int(D), E=int(E),
                      bias=bias, sinks=sinks)
    check_allocatable(dims, dtype, memory_bytes)
    return dims


@dataclass(frozen=True)
class AttentionOptions:
    """A module's contract-v2 settings (SEMANTICS.md v2), validated, passed to every attention
    call it makes: ``window`` (a pair of ints or None), ``softcap`` and ``scale`` (Python floats
    or None), ``alibi`` (the slopes ``alibi_slopes(H)``, or none) and ``sinks`` (a learned
    ``sinks (H,)`` weight, or none)."""

    window: tuple[int | None, int | None] | None = None
    sinks: bool = False
    alibi: bool = False
    softcap: float | None = None
    scale: float | None = None

    @property
    def left(self) -> int | None:
        """The window's left side (None: no window, or unbounded to the left)."""
        return None if self.window is None else self.window[0]

    def module_keywords(self) -> dict[str, Any]:
        """The constructor's keywords that rebuild these settings, only those not at their
        default (a weight file of a v1 module keeps its v1 metadata). ``sinks`` is left out: it
        travels as a weight, and ``from_canonical`` reads it from there."""
        config = {"window": None if self.window is None else list(self.window),
                  "alibi": self.alibi, "softcap": self.softcap, "scale": self.scale}
        return {k: v for k, v in config.items() if v not in (None, False)}


def check_attention_options(
    dtype: str,
    *,
    window: object = None,
    sinks: object = False,
    alibi: object = False,
    softcap: object = None,
    scale: object = None,
) -> AttentionOptions:
    """Validate a module's v2 keywords, with the errors of the functional API for the same
    values (``window_value``, ``softcap_not_positive``, ``scale_range``, ...; ``not_a_bool``
    for the flags), before any weight is made."""
    sinks, alibi = check_flag("sinks", sinks), check_flag("alibi", alibi)
    given = {"scale": scale, "softcap": softcap}
    scale, softcap = check_config(scale=scale, softcap=softcap)
    check_ranges(dtype, scale, softcap, given)
    return AttentionOptions(check_window(window), sinks, alibi, softcap, scale)


#: Bytes per element of each supported dtype.
ITEMSIZE: dict[str, int] = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def check_allocatable(dims: ModuleDims, dtype: str, memory_bytes: int | None = None) -> None:
    """``MemoryError`` when the module's weights need more than ``memory_bytes`` bytes.

    One behaviour in all three frameworks, at construction: without it NumPy raises
    MemoryError, torch a RuntimeError, and JAX returns a module whose first call aborts the
    process. The caller says how much its machine holds (``impl_*/modules.py`` pass the physical
    memory); None, where it cannot say, bounds at 2**62 bytes, more than any machine has. A
    module below the bound may still not fit a smaller accelerator, and then the framework says
    so.
    """
    n = sum(math.prod(shape) for shape in dims.canonical_shapes().values())
    needed = n * ITEMSIZE[dtype]
    have = 2**62 if memory_bytes is None else memory_bytes
    if needed > have:
        raise MemoryError(
            f"the weights of a module {dims} in {dtype} need {needed / 2**30:.4g} GiB "
            f"({n} numbers); this machine has {have / 2**30:.4g} GiB of memory"
        )


def check_sequence(name: str, array: ArraySpec, dims: ModuleDims, param_dtype: str) -> None:
    """A module's input sequence ``x (B, L, M)`` or ``context (B, S, M)`` (name "x" or
    "context"): rank 3, the module's dtype ``param_dtype`` and width M."""
    shape, dtype = array.shape, array.dtype
    letters = "(B, L, M)" if name == "x" else "(B, S, M)"
    if len(shape) != 3:
        raise make_error(
            "rank",
            f"{name} must have 3 dims {letters} with M={dims.M}; got shape {shape}",
            expected=letters,
            actual=str(shape),
        )
    check_dtype(name, dtype)
    if dtype != param_dtype:
        raise make_error(
            "dtype_mismatch",
            f"{name} dtype must match the module's weights ({param_dtype}); got {dtype}. "
            "Convert the input, or load the module with dtype=",
            expected=param_dtype,
            actual=dtype,
        )
    if shape[-1] != dims.M:
        raise make_error(
            "model_width_mismatch",
            f"{name} last dim must be the module's d_model (M={dims.M}); got shape {shape}",
            expected=f"{letters[:-2]}={dims.M})",
            actual=str(shape),
        )


def check_module_inputs(
    dims: ModuleDims,
    param_dtype: str,
    x: Any,
    context: Any = None,
    *context_1_0: Any,
    mask: Any = None,
    bias: Any = None,
    is_causal: object = False,
    causal_alignment: str = "top_left",
    return_weights: object = False,
    q_segment_ids: Any = None,
    kv_segment_ids: Any = None,
    **keywords_1_0: Any,
) -> AttentionCall:
    """Validate a whole module call before any arithmetic and return its attention sizes.

    The flags must be bools and ``causal_alignment`` a known one; ``x (B, L, M)`` and the
    optional ``context (B, S, M)`` (arrays, read by :func:`~attention_spec.validate.describe`)
    must have the module's dtype ``param_dtype`` and width M, and batch dims that broadcast;
    then the attention call the module will make, ``q (B, H, L, D)``, ``k (B, K, S, D)``,
    ``v (B, K, S, E)`` with ``mask``, ``bias``, ``causal_alignment`` and the segment ids
    (``q_segment_ids (B, L)``, ``kv_segment_ids (B, S)``, broadcastable), is checked by
    :func:`check_attention` (S = L for self-attention).

    Deprecated (API 1.0, removed in 2.0 at the earliest): ``check_module_inputs(dims,
    param_dtype, x_shape, x_dtype, context_shape=None, context_dtype=None, *, mask_shape=None,
    mask_dtype=None, bias_shape=None, bias_dtype=None, causal_alignment="top_left")``; it warns
    (``DeprecationWarning``) and returns what the 1.1 form returns.

    Raises:
        ConfigError ``not_a_bool``, ``unknown_alignment``;
        DimensionMismatchError ``rank``, ``model_width_mismatch``, ``batch_not_broadcastable``;
        DTypeError ``not_an_array``, ``unsupported_dtype``, ``dtype_mismatch``; and every error of
        :func:`check_attention` for mask and bias.
    """
    if context_1_0 or isinstance(context, str) or keywords_1_0:
        return _check_module_inputs_1_0(
            dims, param_dtype, x, context, *context_1_0, is_causal=is_causal,
            causal_alignment=causal_alignment, return_weights=return_weights,
            q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, **keywords_1_0,
        )
    check_flag("return_weights", return_weights)
    is_causal = check_flag("is_causal", is_causal)
    check_alignment(causal_alignment)
    check_given(x=x)
    x, context = describe(x), describe(context)
    check_sequence("x", x, dims, param_dtype)
    if context is not None:
        check_sequence("context", context, dims, param_dtype)
    x_shape, context_shape = x.shape, (x if context is None else context).shape
    if broadcast_shapes(x_shape[:1], context_shape[:1]) is None:
        raise make_error(
            "batch_not_broadcastable",
            f"x and context batch dims must broadcast; got x {x_shape}, context {context_shape}",
            expected="broadcastable batch dims",
            actual=f"x {x_shape[:1]}, context {context_shape[:1]}",
        )
    (Bx, L, _), (Bc, S, _) = x_shape, context_shape
    return check_attention(
        ArraySpec((Bx, dims.H, L, dims.D), param_dtype),  # q: the projections to come
        ArraySpec((Bc, dims.K, S, dims.D), param_dtype),  # k
        ArraySpec((Bc, dims.K, S, dims.E), param_dtype),  # v
        mask=mask, bias=bias, is_causal=is_causal, causal_alignment=causal_alignment,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
    )


def _check_module_inputs_1_0(
    dims: ModuleDims,
    param_dtype: str,
    x_shape: tuple[int, ...],
    x_dtype: str,
    context_shape: tuple[int, ...] | None = None,
    context_dtype: str | None = None,
    **keywords: Any,
) -> AttentionCall:
    """API 1.0's form of :func:`check_module_inputs`: shapes and dtype names."""
    unknown = sorted(keywords.keys() - ARRAY_KEYWORDS_1_0 - _MODULE_KEYWORDS)
    if unknown:
        raise TypeError(f"check_module_inputs() got an unexpected keyword argument {unknown[0]!r}")
    warn_1_0("check_module_inputs(dims, param_dtype, x_shape, x_dtype, ..., mask_shape=...)",
             "pass the arrays: check_module_inputs(dims, param_dtype, x, context, mask=mask, "
             "bias=bias, ...)")
    masks = masks_1_0(keywords)
    return check_module_inputs(
        dims, param_dtype, spec_1_0(x_shape, x_dtype), spec_1_0(context_shape, context_dtype),
        **masks, **keywords,
    )


#: The keywords of :func:`check_module_inputs` besides its arrays, which its 1.0 form passes on.
_MODULE_KEYWORDS = frozenset(
    {"is_causal", "causal_alignment", "return_weights", "q_segment_ids", "kv_segment_ids"}
)


def check_padding_mask_args(lengths: Any, kv_len: int) -> None:
    """Validate ``padding_mask(lengths, kv_len)``: lengths 1-D ``(B,)`` integers, kv_len >= 0."""
    lengths = describe(lengths)
    lengths_shape, lengths_dtype = lengths.shape, lengths.dtype
    if len(lengths_shape) != 1:
        raise make_error(
            "mask_shape",
            f"lengths must be 1-D (B,), one key length per example; got shape {lengths_shape}",
            expected="(B,)",
            actual=str(lengths_shape),
        )
    if not lengths_dtype.startswith(("int", "uint")):
        raise make_error(
            "mask_dtype",
            f"lengths must be integers; got {lengths_dtype}",
            expected="integer dtype",
            actual=lengths_dtype,
        )
    check_size("kv_len (S)", kv_len, minimum=0)
