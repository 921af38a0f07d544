"""Validation and the canonical weight format of the attention modules (SEMANTICS.md, "Modules").

Pure Python on sizes, shapes and dtype names, like :mod:`attention_spec.validate`: the NumPy,
PyTorch and JAX modules call these functions before any arithmetic, so a module built or called
wrongly raises the same class, code and message in all three frameworks.

The canonical weights, the one format every module loads and exports, are a flat dict::

    q_proj.kernel (M, H*D)   q_proj.bias (H*D,)
    k_proj.kernel (M, K*D)   k_proj.bias (K*D,)
    v_proj.kernel (M, K*E)   v_proj.bias (K*E,)
    o_proj.kernel (H*E, M)   o_proj.bias (M,)

A kernel is ``(in, out)``: ``y = x @ kernel + bias``. Head h owns features ``[h*D:(h+1)*D]`` of
the query projection (``[h*E:(h+1)*E]`` of the output projection's input); key/value head k
owns ``[k*D:(k+1)*D]`` and ``[k*E:(k+1)*E]``. The biases are all present or all absent.
A module built with ``sinks=True`` has one more weight, ``sinks (H,)``: the learned sink logit of
each query head (SEMANTICS.md v2, step 5).

Shape letters: B batch, H query heads, K key/value heads (G = H // K), L query length,
S key/value length, D query/key head dim, E value head dim, M model width (d_model).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from attention_spec.errors import AttentionError, make_error
from attention_spec.rotary import RopeConfig
from attention_spec.validate import (
    SUPPORTED_DTYPES,
    ArraySpec,
    AttentionDims,
    _check_ranges,
    broadcast_shapes,
    check_alignment,
    check_attention,
    check_config,
    check_dtype,
    check_flag,
    check_given,
    check_size,
    check_window,
    describe,
    divisors,
    dtype_name,
    format_dims,
)

__all__ = [
    "CANONICAL_FORMAT",
    "METADATA_KEY",
    "PROJECTIONS",
    "AttentionOptions",
    "ModuleDims",
    "check_attention_options",
    "check_cache_size",
    "check_canonical",
    "check_decode_inputs",
    "check_interop",
    "check_module_config",
    "check_module_inputs",
    "check_padding_mask_args",
    "heads_from_metadata",
    "module_dtype",
    "options_from_metadata",
    "weights_metadata",
]

#: The four projections, in the order of the forward pass.
PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

#: The safetensors metadata key of a weight file, and the format its JSON value names.
METADATA_KEY = "rosetta_attention"
CANONICAL_FORMAT = "canonical-v1"


def _error(code: str, message: str, *, expected: str, actual: str) -> AttentionError:
    return make_error(code, message, expected=expected, actual=actual)


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
        """The canonical weight names and shapes, in forward order (kernels ``(in, out)``)."""
        M, H, K, D, E = self.M, self.H, self.K, self.D, self.E
        kernels = {"q_proj": (M, H * D), "k_proj": (M, K * D), "v_proj": (M, K * E),
                   "o_proj": (H * E, M)}  # fmt: skip
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
) -> ModuleDims:
    """Validate the constructor arguments of a module and return its sizes.

    ``head_dim`` (D) defaults to ``d_model // n_heads``; ``value_head_dim`` (E) defaults to D.

    Raises:
        ConfigError ``non_positive_size``: a size that is not an integer >= 1.
        DimensionMismatchError ``d_model_not_divisible``: no head_dim and M % H != 0.
        DimensionMismatchError ``heads_not_divisible``: H % K != 0.
        DTypeError ``unsupported_dtype``: a dtype outside the supported four.
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
                      bias=bias, sinks=sinks)  # fmt: skip
    check_allocatable(dims, dtype)
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
                  "alibi": self.alibi, "softcap": self.softcap, "scale": self.scale}  # fmt: skip
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
    _check_ranges(dtype, scale, softcap, given)
    return AttentionOptions(check_window(window), sinks, alibi, softcap, scale)


#: Bytes per element of each supported dtype.
ITEMSIZE: dict[str, int] = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def _memory_bytes() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_allocatable(dims: ModuleDims, dtype: str) -> None:
    """``MemoryError`` when the module's weights need more bytes than this machine has.

    One behaviour in all three frameworks, at construction: without it NumPy raises
    MemoryError, torch a RuntimeError, and JAX returns a module whose first call aborts the
    process. The bound is physical memory (or 2**62 bytes where the OS does not say); a module
    below it may still not fit a smaller accelerator, and then the framework says so.
    """
    n = sum(math.prod(shape) for shape in dims.canonical_shapes().values())
    needed = n * ITEMSIZE[dtype]
    have = _memory_bytes() or 2**62
    if needed > have:
        raise MemoryError(
            f"the weights of a module {dims} in {dtype} need {needed / 2**30:.4g} GiB "
            f"({n} numbers); this machine has {have / 2**30:.4g} GiB of memory"
        )


def _check_sequence(name: str, array: ArraySpec, dims: ModuleDims, param_dtype: str) -> None:
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
        raise _error(
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
    *,
    mask: Any = None,
    bias: Any = None,
    is_causal: object = False,
    causal_alignment: str = "top_left",
    return_weights: object = False,
    q_segment_ids: Any = None,
    kv_segment_ids: Any = None,
) -> AttentionDims:
    """Validate a whole module call before any arithmetic and return its attention sizes.

    The flags must be bools and ``causal_alignment`` a known one; ``x (B, L, M)`` and the
    optional ``context (B, S, M)`` (arrays, read by :func:`~attention_spec.validate.describe`)
    must have the module's dtype ``param_dtype`` and width M, and batch dims that broadcast;
    then the attention call the module will make, ``q (B, H, L, D)``, ``k (B, K, S, D)``,
    ``v (B, K, S, E)`` with ``mask``, ``bias``, ``causal_alignment`` and the segment ids
    (``q_segment_ids (B, L)``, ``kv_segment_ids (B, S)``, broadcastable), is checked by
    :func:`check_attention` (S = L for self-attention).

    Raises:
        ConfigError ``not_a_bool``, ``unknown_alignment``;
        DimensionMismatchError ``rank``, ``model_width_mismatch``, ``batch_not_broadcastable``;
        DTypeError ``not_an_array``, ``unsupported_dtype``, ``dtype_mismatch``; and every error of
        :func:`check_attention` for mask and bias.
    """
    check_flag("return_weights", return_weights)
    is_causal = check_flag("is_causal", is_causal)
    check_alignment(causal_alignment)
    check_given(x=x)
    x, context = describe(x), describe(context)
    _check_sequence("x", x, dims, param_dtype)
    if context is not None:
        _check_sequence("context", context, dims, param_dtype)
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
    )  # fmt: skip


def _dims_from_shapes(
    shapes: Mapping[str, tuple[int, ...]], n_heads: int, n_kv_heads: int
) -> ModuleDims:
    """M, D, E and bias read from ``q_proj.kernel (M, H*D)`` and ``v_proj.kernel (M, K*E)``."""
    check_size("n_heads (H)", n_heads)
    check_size("n_kv_heads (K)", n_kv_heads)
    H, K = n_heads, n_kv_heads
    for name in ("q_proj.kernel", "v_proj.kernel"):
        if name not in shapes:
            raise _error(
                "weight_shape",
                f"canonical weights have no {name}; got keys {sorted(shapes)}",
                expected=name,
                actual=str(sorted(shapes)),
            )
    q_shape, v_shape = shapes["q_proj.kernel"], shapes["v_proj.kernel"]
    for name, shape, heads, letter in (("q_proj.kernel", q_shape, H, "H*D"),
                                       ("v_proj.kernel", v_shape, K, "K*E")):  # fmt: skip
        if len(shape) != 2 or shape[1] % heads or shape[1] == 0:
            raise _error(
                "weight_shape",
                f"{name} must be (M, {letter}) with {letter[0]}={heads}; got {shape}",
                expected=f"(M, {letter})",
                actual=str(shape),
            )
    return check_module_config(
        q_shape[0], H, K, q_shape[1] // H, v_shape[1] // K, bias="q_proj.bias" in shapes,
        sinks="sinks" in shapes,
    )  # fmt: skip


def check_canonical(
    weights: Mapping[str, Any],
    *,
    n_heads: int,
    n_kv_heads: int,
    expected: ModuleDims | None = None,
    sinks: object = None,
) -> ModuleDims:
    """Validate canonical weights (a mapping of names to arrays) and return the sizes.

    M, D and E are read from the shapes: ``q_proj.kernel (M, H*D)``, ``v_proj.kernel (M, K*E)``;
    whether the module has sinks from the presence of ``sinks (H,)``; every other weight must then
    have its canonical shape. All weights share one supported dtype. With ``expected`` (loading
    into an existing module), every shape must be that module's. ``sinks`` (``from_canonical``'s
    keyword; None: whatever the weights say) True or False must agree with the weights.

    Raises:
        the errors of :func:`check_module_config` for ``n_heads``/``n_kv_heads``;
        DimensionMismatchError ``weight_shape``: a missing, unexpected or misshaped weight;
        DTypeError ``dtype_mismatch``, ``unsupported_dtype``.
    """
    specs = {name: describe(w) for name, w in weights.items()}
    shapes = {name: spec.shape for name, spec in specs.items()}
    dtypes = {name: spec.dtype for name, spec in specs.items()}
    dims = expected if expected is not None else _dims_from_shapes(shapes, n_heads, n_kv_heads)
    if sinks is not None and check_flag("sinks", sinks) != dims.sinks:
        raise _error(
            "weight_shape",
            f"sinks={sinks} was asked, but the canonical weights "
            f"{'hold' if dims.sinks else 'have no'} a sinks (H,) weight; a module's sinks are "
            "learned weights: give them (a module made with sinks=True exports them) or leave "
            "sinks=None to follow the weights",
            expected=f"sinks ({dims.H},)" if sinks else "no sinks weight",
            actual=f"sinks {shapes['sinks']}" if dims.sinks else "no sinks weight",
        )
    canonical = dims.canonical_shapes()
    for name in [*canonical, *(n for n in shapes if n not in canonical)]:
        if shapes.get(name) != canonical.get(name):
            got = "missing" if name not in shapes else shapes[name]
            want = "absent" if name not in canonical else canonical[name]
            raise _error(
                "weight_shape",
                f"canonical weight {name} must be {want} for {dims} "
                f"({'with' if dims.bias else 'without'} biases); got {got}",
                expected=str(want),
                actual=str(got),
            )
    names = list(canonical)
    check_dtype(names[0], str(dtypes[names[0]]))
    if len({str(dtypes[n]) for n in names}) > 1:
        listing = ", ".join(f"{n}={dtypes[n]}" for n in names)
        raise make_error(
            "dtype_mismatch",
            f"canonical weights must share one dtype; got {listing}",
            expected="one dtype",
            actual=listing,
        )
    return dims


def weights_metadata(
    dims: ModuleDims, rope: RopeConfig | None = None, options: AttentionOptions | None = None
) -> dict[str, str]:
    """The safetensors metadata of a weight file: the format, the head counts H and K, and the
    module's RoPE settings when it has them (``rope_theta``, ``rope_interleaved``,
    ``rotary_dim``) and its v2 settings that are not at their default (``window``, ``alibi``,
    ``softcap``, ``scale``): :func:`options_from_metadata` gives them back to ``load``. The
    sinks are a weight of the file.

    The head counts are not recoverable from the shapes (``H*D`` does not say H); M, D, E and the
    biases are. One key holding sorted JSON, because safetensors writes several metadata keys in
    a random order, and one file should have one sha256.
    """
    config = {"format": CANONICAL_FORMAT, "n_heads": dims.H, "n_kv_heads": dims.K}
    if rope is not None:
        config |= rope.module_keywords()
    if options is not None:
        config |= options.module_keywords()
    return {METADATA_KEY: json.dumps(config, sort_keys=True)}


def options_from_metadata(metadata: Mapping[str, str] | None) -> dict[str, Any]:
    """The module settings a weight file written by :func:`weights_metadata` carries besides
    the head counts, as keywords of ``from_canonical`` (``{}`` for a v1 module without RoPE)."""
    config = json.loads(dict(metadata or {}).get(METADATA_KEY, "{}"))
    return {k: v for k, v in config.items() if k not in ("format", "n_heads", "n_kv_heads")}


def heads_from_metadata(metadata: Mapping[str, str] | None) -> tuple[int, int]:
    """``(H, K)`` from a weight file's metadata written by :func:`weights_metadata`."""
    try:
        config = json.loads((metadata or {})[METADATA_KEY])
        if config["format"] != CANONICAL_FORMAT:
            raise ValueError(config["format"])
        return int(config["n_heads"]), int(config["n_kv_heads"])
    except (KeyError, TypeError, ValueError):
        raise _error(
            "weight_shape",
            f"a weight file needs the metadata {METADATA_KEY!r} (format {CANONICAL_FORMAT!r}, "
            f"n_heads, n_kv_heads); got {dict(metadata or {})}. Load the tensors yourself and "
            "call from_canonical(weights, n_heads=..., n_kv_heads=...)",
            expected=f"{METADATA_KEY}: format={CANONICAL_FORMAT}, n_heads, n_kv_heads",
            actual=str(dict(metadata or {})),
        ) from None


#: What each framework's own attention module can hold, as (rule, test on ModuleDims).
_INTEROP_RULES = {
    "torch.nn.MultiheadAttention": (
        ("K == H (no grouped-query attention)", lambda d: d.K == d.H),
        ("E == D (one head dim)", lambda d: d.E == d.D),
        ("H*D == M (embed_dim = num_heads * head_dim)", lambda d: d.H * d.D == d.M),
        ("no sinks (it has no sink logits)", lambda d: not d.sinks),
    ),
    "flax.nnx.MultiHeadAttention": (
        ("E == D (one head dim)", lambda d: d.E == d.D),
        ("no sinks (it has no sink logits)", lambda d: not d.sinks),
    ),
}


def check_interop(dims: ModuleDims, target: str) -> None:
    """Raise ``weight_shape`` when ``target``'s own module cannot hold weights of ``dims``."""
    broken = [rule for rule, holds in _INTEROP_RULES[target] if not holds(dims)]
    if broken:
        raise _error(
            "weight_shape",
            f"{target} can only hold weights with {'; '.join(r for r, _ in _INTEROP_RULES[target])}"
            f"; these weights have {dims}, breaking {'; '.join(broken)}",
            expected="; ".join(r for r, _ in _INTEROP_RULES[target]),
            actual=str(dims),
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


def check_cache_size(
    batch_size: int, max_len: int, *, rolling: object = False, left: int | None = None
) -> int:
    """Validate ``init_cache(batch_size, max_len, rolling=)`` and return the buffers' length T:
    ``max_len`` for a plain cache, ``min(left + 1, max_len)`` slots for a rolling one (the
    window of one decoded token: itself and the ``left`` before it).

    Raises:
        ConfigError ``non_positive_size``; ``not_a_bool`` (rolling);
        ConfigError ``rolling_cache``: ``rolling=True`` for a module without a window's left side.
    """
    check_size("batch_size (B)", batch_size)
    check_size("max_len", max_len)
    if not check_flag("rolling", rolling):
        return int(max_len)
    if left is None:
        raise make_error(
            "rolling_cache",
            "a rolling KV cache keeps the last left + 1 tokens of a sliding window; this module "
            "has no window with a bounded left side. Build it with window=(left, 0) (left an "
            "int >= 0), or use rolling=False",
            expected="a module with window=(left, ...), left an int >= 0",
            actual="window left side unbounded (None)",
        )
    return min(left + 1, int(max_len))


def _check_cache(dims: ModuleDims, param_dtype: str, key: ArraySpec, value: ArraySpec) -> None:
    """A KV cache's buffers ``key (B, K, T, D)``, ``value (B, K, T, E)`` are this module's."""
    for name, spec, last in (("key", key, dims.D), ("value", value, dims.E)):
        want = f"(B, K={dims.K}, T, {'D' if name == 'key' else 'E'}={last})"
        if len(spec.shape) != 4 or spec.shape[1] != dims.K or spec.shape[3] != last:
            raise _error(
                "cache_mismatch",
                f"the KV cache's {name} must be {want} for this module {dims}; got "
                f"{spec.shape}. A cache belongs to the module that made it (init_cache)",
                expected=want,
                actual=str(spec.shape),
            )
        if spec.dtype != param_dtype:
            raise make_error(
                "dtype_mismatch",
                f"the KV cache's {name} dtype must be the module's ({param_dtype}); got "
                f"{spec.dtype}",
                expected=param_dtype,
                actual=spec.dtype,
            )
    if key.shape[:3] != value.shape[:3]:
        raise _error(
            "cache_mismatch",
            f"the KV cache's key and value must share (B, K, T); got key {key.shape}, value "
            f"{value.shape}",
            expected=f"value (B={key.shape[0]}, K={key.shape[1]}, T={key.shape[2]}, E)",
            actual=str(value.shape),
        )


def check_decode_inputs(
    dims: ModuleDims,
    param_dtype: str,
    x: Any,
    *,
    cache_key: Any,
    cache_value: Any,
    position: int,
    max_len: int,
    mask: Any = None,
    bias: Any = None,
    return_weights: object = False,
    q_segment_ids: Any = None,
    kv_segment_ids: Any = None,
    rolling: bool = False,
    left: int | None = None,
) -> AttentionDims:
    """Validate a cached forward before any projection or write: new tokens ``x (B, L, M)``
    into a KV cache whose buffers ``cache_key (B, K, T, D)`` and ``cache_value (B, K, T, E)``
    hold ``position`` of at most ``max_len`` tokens (T is the buffers' length: ``max_len`` for a
    preallocated cache, ``position`` for one that grows).

    The new queries attend to S = position + L keys with the bottom-right causal rule; mask and
    bias broadcast to ``(B, H, L, S)``, ``q_segment_ids`` to ``(B, L)`` and ``kv_segment_ids``
    to ``(B, S)`` (the segments of every token written so far, then of the new ones).

    ``rolling``: the cache is a rolling one (``init_cache(..., rolling=True)``) for a module
    whose window has left side ``left``: its buffers must have ``min(left + 1, max_len)`` slots
    (T), and it takes
    no mask, bias or segment ids (the keys it attends are not the whole sequence: SEMANTICS.md of
    the project, "Rolling KV cache"). Nothing is written before this returns, so on any error
    the cache is unchanged.

    Raises:
        the errors of :func:`check_module_inputs` for x, mask and bias;
        DimensionMismatchError ``cache_mismatch``: a cache of another module (K, D, E);
        DTypeError ``dtype_mismatch``: a cache of another dtype;
        DimensionMismatchError ``batch_not_broadcastable``: x's batch is not the cache's;
        ConfigError ``cache_overflow``: ``position + L > max_len`` (never a wrap or truncation);
        ConfigError ``rolling_cache``: a rolling cache with mask, bias or segment ids.
    """
    check_flag("return_weights", return_weights)
    check_given(x=x, cache_key=cache_key, cache_value=cache_value)
    x = describe(x)
    _check_sequence("x", x, dims, param_dtype)
    _check_cache(dims, param_dtype, describe(cache_key), describe(cache_value))
    if rolling:
        slots = check_cache_size(1, max_len, rolling=True, left=left)
        _check_rolling(describe(cache_key).shape[2], slots, mask=mask, bias=bias,
                       q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)  # fmt: skip
    x_shape = x.shape
    n_batch, new_len, _ = x_shape
    cache_batch = describe(cache_key).shape[0]
    if n_batch != cache_batch:
        raise make_error(
            "batch_not_broadcastable",
            f"x batch (B={n_batch}) must be the KV cache's (B={cache_batch}); got x {x_shape}",
            expected=f"B={cache_batch}",
            actual=f"B={n_batch}",
        )
    if position + new_len > max_len:
        raise _error(
            "cache_overflow",
            f"the KV cache holds {position} of at most {max_len} tokens; writing {new_len} more "
            f"would need {position + new_len}. Create the cache with a larger max_len",
            expected=f"position + L <= max_len={max_len}",
            actual=f"{position} + {new_len} = {position + new_len}",
        )
    S = position + new_len
    return check_attention(
        ArraySpec((n_batch, dims.H, new_len, dims.D), param_dtype),  # q of the new tokens
        ArraySpec((n_batch, dims.K, S, dims.D), param_dtype),  # k: cached and new
        ArraySpec((n_batch, dims.K, S, dims.E), param_dtype),  # v
        mask=mask, bias=bias, causal_alignment="bottom_right",
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
    )  # fmt: skip


def _check_rolling(length: int, slots: int, **refused: Any) -> None:
    """A rolling cache has ``slots`` slots and takes none of ``refused`` (mask, bias, ids)."""
    if length != slots:
        raise _error(
            "cache_mismatch",
            f"this rolling KV cache has {length} slots; this module's window needs {slots} "
            "(min(left + 1, max_len)). A cache belongs to the module that made it (init_cache)",
            expected=f"T={slots}",
            actual=f"T={length}",
        )
    given = [name for name, value in refused.items() if value is not None]
    if given:
        raise make_error(
            "rolling_cache",
            f"a rolling KV cache takes no {', '.join(given)}: it attends only the last window of "
            "the sequence, so a mask or ids over all its positions cannot be lined up with the "
            "keys it keeps. Use a plain cache (rolling=False) for padded or packed decoding",
            expected="no mask, bias or segment ids with a rolling cache",
            actual=", ".join(given) + " given",
        )
