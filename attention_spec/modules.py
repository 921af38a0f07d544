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
    broadcast_shapes,
    check_alignment,
    check_attention,
    check_dtype,
    check_flag,
    check_given,
    check_size,
    describe,
    divisors,
    dtype_name,
    format_dims,
)

__all__ = [
    "CANONICAL_FORMAT",
    "METADATA_KEY",
    "PROJECTIONS",
    "ModuleDims",
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
                      bias=bias)  # fmt: skip
    check_allocatable(dims, dtype)
    return dims


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
) -> AttentionDims:
    """Validate a whole module call before any arithmetic and return its attention sizes.

    The flags must be bools and ``causal_alignment`` a known one; ``x (B, L, M)`` and the
    optional ``context (B, S, M)`` (arrays, read by :func:`~attention_spec.validate.describe`)
    must have the module's dtype ``param_dtype`` and width M, and batch dims that broadcast;
    then the attention call the module will make, ``q (B, H, L, D)``, ``k (B, K, S, D)``,
    ``v (B, K, S, E)`` with ``mask``, ``bias`` and ``causal_alignment``, is checked by
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
        q_shape[0], H, K, q_shape[1] // H, v_shape[1] // K, bias="q_proj.bias" in shapes
    )


def check_canonical(
    weights: Mapping[str, Any],
    *,
    n_heads: int,
    n_kv_heads: int,
    expected: ModuleDims | None = None,
) -> ModuleDims:
    """Validate canonical weights (a mapping of names to arrays) and return the sizes.

    M, D and E are read from the shapes: ``q_proj.kernel (M, H*D)``, ``v_proj.kernel (M, K*E)``;
    every other weight must then have its canonical shape. All weights share one supported dtype.
    With ``expected`` (loading into an existing module), every shape must be that module's.

    Raises:
        the errors of :func:`check_module_config` for ``n_heads``/``n_kv_heads``;
        DimensionMismatchError ``weight_shape``: a missing, unexpected or misshaped weight;
        DTypeError ``dtype_mismatch``, ``unsupported_dtype``.
    """
    specs = {name: describe(w) for name, w in weights.items()}
    shapes = {name: spec.shape for name, spec in specs.items()}
    dtypes = {name: spec.dtype for name, spec in specs.items()}
    dims = expected if expected is not None else _dims_from_shapes(shapes, n_heads, n_kv_heads)
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


def weights_metadata(dims: ModuleDims, rope: RopeConfig | None = None) -> dict[str, str]:
    """The safetensors metadata of a weight file: the format, the head counts H and K, and the
    module's RoPE settings when it has them (``rope_theta``, ``rope_interleaved``,
    ``rotary_dim``: :func:`options_from_metadata` gives them back to ``load``).

    The head counts are not recoverable from the shapes (``H*D`` does not say H); M, D, E and the
    biases are. One key holding sorted JSON, because safetensors writes several metadata keys in
    a random order, and one file should have one sha256.
    """
    config = {"format": CANONICAL_FORMAT, "n_heads": dims.H, "n_kv_heads": dims.K}
    if rope is not None:
        config |= rope.module_keywords()
    return {METADATA_KEY: json.dumps(config, sort_keys=True)}


def options_from_metadata(metadata: Mapping[str, str] | None) -> dict[str, Any]:
    """The module settings a weight file written by :func:`weights_metadata` carries besides
    the head counts, as keywords of ``from_canonical`` (``{}`` for a module without RoPE)."""
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
    ),
    "flax.nnx.MultiHeadAttention": (("E == D (one head dim)", lambda d: d.E == d.D),),
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


def check_cache_size(batch_size: int, max_len: int) -> None:
    """Validate ``init_cache(batch_size, max_len)`` (ConfigError ``non_positive_size``)."""
    check_size("batch_size (B)", batch_size)
    check_size("max_len", max_len)


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
) -> AttentionDims:
    """Validate a cached forward before any projection or write: new tokens ``x (B, L, M)``
    into a KV cache whose buffers ``cache_key (B, K, T, D)`` and ``cache_value (B, K, T, E)``
    hold ``position`` of at most ``max_len`` tokens (T is the buffers' length: ``max_len`` for a
    preallocated cache, ``position`` for one that grows).

    The new queries attend to S = position + L keys with the bottom-right causal rule; mask and
    bias broadcast to ``(B, H, L, S)``. Nothing is written before this returns, so on any error
    the cache is unchanged.

    Raises:
        the errors of :func:`check_module_inputs` for x, mask and bias;
        DimensionMismatchError ``cache_mismatch``: a cache of another module (K, D, E);
        DTypeError ``dtype_mismatch``: a cache of another dtype;
        DimensionMismatchError ``batch_not_broadcastable``: x's batch is not the cache's;
        ConfigError ``cache_overflow``: ``position + L > max_len`` (never a wrap or truncation).
    """
    check_flag("return_weights", return_weights)
    check_given(x=x, cache_key=cache_key, cache_value=cache_value)
    x = describe(x)
    _check_sequence("x", x, dims, param_dtype)
    _check_cache(dims, param_dtype, describe(cache_key), describe(cache_value))
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
    )  # fmt: skip
