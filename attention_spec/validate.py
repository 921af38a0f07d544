"""Validation of one attention call: the keywords' rules, in one table, and :func:`check_attention`.

:data:`KEYWORDS` holds one :class:`Keyword` per keyword of the contract, in the order of the
public signatures: its default and its rule, in up to three parts. :func:`check_attention`
applies them in a fixed order, so an input with several mistakes reports the same one
everywhere (SEMANTICS.md, "Errors"):

1. each keyword on its own, in table order (flags, the alignment, scale and softcap as numbers,
   the window);
2. query, key and value: given, ranks, dtypes, sizes, head dims, key/value heads and lengths,
   head divisibility, batch;
3. each keyword against those sizes, in table order (mask, bias, segment ids, sinks, ALiBi
   slopes: dtype and shape);
4. each keyword against the compute dtype (scale, softcap): last, so a range never hides a
   shape mistake.

It returns an :class:`~attention_spec.AttentionCall`. Adding a keyword is one more
:class:`Keyword` in :data:`KEYWORDS`: ``check_attention`` takes it, checks it in its place and
returns its converted value in ``call.keywords``.

This module also keeps the names it held before attention_spec was split by concern
(``from attention_spec.validate import ArraySpec, BLOCK_Q, ...``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from attention_spec.arrays import (
    FLOAT_DTYPES,
    SUPPORTED_DTYPES,
    ArraySpec,
    Shape,
    batch_letters,
    broadcast_shapes,
    check_dtype,
    check_float64,
    check_given,
    compute_dtype,
    describe,
    dtype_name,
    format_dims,
    target_text,
)
from attention_spec.call import AttentionCall, AttentionDims, Keywords
from attention_spec.deprecated import ARRAY_KEYWORDS_1_0, masks_1_0, spec_1_0, warn_1_0
from attention_spec.errors import make_error
from attention_spec.fp8 import check_descale, check_fp8_dtypes
from attention_spec.keywords import (
    ALIGNMENTS,
    FINITE_MAX,
    SOFTCAP_RANGE,
    causal_offset,
    check_alignment,
    check_causal_mask_args,
    check_config,
    check_flag,
    check_ranges,
    check_scale,
    check_size,
    check_softcap,
    check_window,
    divisors,
    real_keyword,
)
from attention_spec.rules import block_rules
from attention_spec.tiling import BLOCK_K, BLOCK_Q, check_block_sizes, tiled_blocks

__all__ = [
    "ALIGNMENTS",
    "ARRAY_KEYWORDS",
    "BLOCK_K",
    "BLOCK_Q",
    "FINITE_MAX",
    "FLOAT_DTYPES",
    "KEYWORDS",
    "NO_VALUE",
    "SOFTCAP_RANGE",
    "SUPPORTED_DTYPES",
    "ArraySpec",
    "AttentionCall",
    "AttentionDims",
    "CallSizes",
    "Keyword",
    "batch_letters",
    "broadcast_shapes",
    "call_keywords",
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
    "check_ranges",
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

#: ``check_attention``'s ``value`` when the call has none (``attention_weights``); an explicit
#: None is a missing array.
NO_VALUE: Any = ArraySpec((), "absent")


class CallSizes(NamedTuple):
    """What a keyword's rule sees of the call once query, key and value passed (steps 3, 4):
    their dtype, the broadcast ``batch`` and the sizes, and ``given``, every keyword as the
    caller passed it (for a rule on a pair, and for messages); ``k_dtype`` and ``v_dtype``,
    the key's and the value's (they differ from the query's in an fp8 KV-cache call; "" for
    attention_weights' value)."""

    dtype: str
    batch: Shape
    H: int
    K: int
    L: int
    S: int
    D: int
    E: int
    given: Mapping[str, Any]
    k_dtype: str = ""
    v_dtype: str = ""


@dataclass(frozen=True)
class Keyword:
    """One keyword of an attention call: its name, its default, and its rule in up to three
    parts (each optional; each returns the converted value, which the next part receives):

    - ``alone(value)``: the value on its own, before any array (a flag, a number, a pair);
    - ``shapes(value, sizes)``: against the call's :class:`CallSizes`, after query, key and
      value (an array keyword: read with :func:`describe`, dtype and shape);
    - ``ranges(value, sizes)``: against the compute dtype, after every ``shapes`` rule.

    ``array``: the keyword is an array (each implementation converts it, as it converts query,
    key and value, before validation reads it: :func:`call_keywords`).
    """

    name: str
    default: Any = None
    array: bool = False
    alone: Callable[[Any], Any] | None = None
    shapes: Callable[[Any, CallSizes], Any] | None = None
    ranges: Callable[[Any, CallSizes], Any] | None = None


# ---------------------------------------------------------------------------------------------
# The rules of the array keywords (step 3) and of the ranges (step 4)
# ---------------------------------------------------------------------------------------------


def _additive(kind: str) -> Callable[[Any, CallSizes], ArraySpec | None]:
    """The rule of ``mask`` (kind="mask": boolean) or ``bias`` (floating): broadcastable to
    ``(..., H, L, S)``, with a head axis of 1 or H (never K, a GQA slip)."""

    def rule(array: Any, sizes: CallSizes) -> ArraySpec | None:
        spec = describe(array)
        if spec is None:
            return None
        shape, dtype = spec.shape, spec.dtype
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
        batch, H, K, L, S = sizes.batch, sizes.H, sizes.K, sizes.L, sizes.S
        target = (*batch, H, L, S)
        text = target_text(batch, ("H", H), ("L", L), ("S", S))
        if len(shape) >= 3 and shape[-3] == K and K not in (1, H):
            raise make_error(
                f"{kind}_kv_heads",
                f"{kind} head axis has size {K}, the number of key/value heads (K={K}); it must "
                f"be 1 or the number of query heads (H={H}). {kind} must broadcast to {text}; "
                f"got {shape}",
                expected=text,
                actual=str(shape),
            )
        if not _fits(shape, target):
            raise make_error(
                f"{kind}_shape",
                f"{kind} must broadcast to {text}; got {shape}",
                expected=text,
                actual=str(shape),
            )
        return spec

    return rule


def _fits(shape: Shape, target: Shape) -> bool:
    """``shape`` broadcasts to ``target`` without growing it."""
    return len(shape) <= len(target) and all(
        a in (1, b) for a, b in zip(reversed(shape), reversed(target))
    )


def _segment_ids(side: str) -> Callable[[Any, CallSizes], ArraySpec | None]:
    """The rule of ``q_segment_ids`` (side="q", broadcastable to ``(..., L)``; it also checks
    that both or neither are given) or ``kv_segment_ids`` (``(..., S)``): integers."""

    def rule(array: Any, sizes: CallSizes) -> ArraySpec | None:
        ids = describe(array)
        if side == "q" and (ids is None) != (sizes.given["kv_segment_ids"] is None):
            given, missing = ("q", "kv") if ids is not None else ("kv", "q")
            raise make_error(
                "segment_ids_pair",
                f"{given}_segment_ids was given without {missing}_segment_ids: give both (the "
                "segment of every query and of every key) or neither",
                expected="both or neither",
                actual=f"{given}_segment_ids only",
            )
        if ids is None:
            return None
        if not ids.dtype.startswith(("int", "uint")):
            raise make_error(
                "segment_ids_dtype",
                f"{side}_segment_ids must be integers (one segment id per position); got "
                f"{ids.dtype}",
                expected="integer dtype",
                actual=ids.dtype,
            )
        letter, n = ("L", sizes.L) if side == "q" else ("S", sizes.S)
        if not _fits(ids.shape, (*sizes.batch, n)):
            text = target_text(sizes.batch, (letter, n))
            raise make_error(
                "segment_ids_shape",
                f"{side}_segment_ids must broadcast to {text}; got {ids.shape}",
                expected=text,
                actual=str(ids.shape),
            )
        return ids

    return rule


def _per_head(name: str) -> Callable[[Any, CallSizes], ArraySpec | None]:
    """The rule of ``sinks`` or ``alibi_slopes``: one floating number per query head, ``(H,)``."""
    short = name.split("_")[0]  # "sinks", "alibi": the codes' prefix

    def rule(array: Any, sizes: CallSizes) -> ArraySpec | None:
        spec = describe(array)
        if spec is None:
            return None
        H = sizes.H
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
        return spec

    return rule


def _descale_rule(name: str) -> Callable[[Any, CallSizes], float | ArraySpec | None]:
    """The rule of ``q_descale`` (broadcastable to ``(..., H)``), ``k_descale`` or
    ``v_descale`` (``(..., K)``): attention_spec.fp8.check_descale, for the input it descales."""
    side = name[0]

    def rule(x: Any, sizes: CallSizes) -> float | ArraySpec | None:
        dtype = {"q": sizes.dtype, "k": sizes.k_dtype, "v": sizes.v_dtype}[side]
        letter, n = ("H", sizes.H) if side == "q" else ("K", sizes.K)
        target = (*sizes.batch, n)
        return check_descale(name, x, dtype, target, target_text(sizes.batch, (letter, n)))

    return rule


def _scale_in_range(scale: float | None, sizes: CallSizes) -> float:
    """``scale`` finite in the compute dtype (``scale_range``), then resolved: ``1/sqrt(D)``
    when None."""
    check_ranges(sizes.dtype, scale, None, sizes.given)
    return 1.0 / math.sqrt(sizes.D) if scale is None else scale


def _softcap_in_range(softcap: float | None, sizes: CallSizes) -> float | None:
    """``softcap`` within the compute dtype's allowance (``softcap_range``)."""
    check_ranges(sizes.dtype, None, softcap, sizes.given)
    return softcap


#: The keywords of an attention call, in the order of the public signatures, each with its rule.
KEYWORDS: tuple[Keyword, ...] = (
    Keyword("mask", array=True, shapes=_additive("mask")),
    Keyword("bias", array=True, shapes=_additive("bias")),
    Keyword("is_causal", False, alone=lambda x: check_flag("is_causal", x)),
    Keyword("causal_alignment", "top_left", alone=check_alignment),
    Keyword("scale", alone=check_scale, ranges=_scale_in_range),
    Keyword("softcap", alone=check_softcap, ranges=_softcap_in_range),
    Keyword("window", alone=check_window),
    Keyword("q_segment_ids", array=True, shapes=_segment_ids("q")),
    Keyword("kv_segment_ids", array=True, shapes=_segment_ids("kv")),
    Keyword("sinks", array=True, shapes=_per_head("sinks")),
    Keyword("alibi_slopes", array=True, shapes=_per_head("alibi_slopes")),
    # FP8 inputs (Contract v3): not array keywords, since a Python or NumPy scalar is taken as
    # float32 (np.asarray would make it float64); an implementation converts a given array.
    Keyword("q_descale", shapes=_descale_rule("q_descale")),
    Keyword("k_descale", shapes=_descale_rule("k_descale")),
    Keyword("v_descale", shapes=_descale_rule("v_descale")),
)
#: The names of the array keywords of :data:`KEYWORDS`, in table order.
ARRAY_KEYWORDS: tuple[str, ...] = tuple(k.name for k in KEYWORDS if k.array)

_DEFAULTS: dict[str, Any] = {k.name: k.default for k in KEYWORDS}
_ALONE = tuple(k for k in KEYWORDS if k.alone is not None)
_SHAPES = tuple(k for k in KEYWORDS if k.shapes is not None)
_RANGES = tuple(k for k in KEYWORDS if k.ranges is not None)
_NAMES = tuple((k.name, k.array) for k in KEYWORDS)  # what call_keywords reads, in table order


def call_keywords(
    given: Mapping[str, Any], convert: Callable[[Any], Any] | None = None
) -> dict[str, Any]:
    """The keywords of :data:`KEYWORDS` among ``given``, by name in table order, each array
    keyword passed through ``convert`` (a framework's conversion; None: as given).

    What a public function hands to :func:`check_attention` without naming its keywords again:
    ``given`` is the function's ``locals()`` on entry (its parameters), so a keyword added to
    :data:`KEYWORDS` and to the signature reaches validation with no other change. A name that
    ``given`` lacks (a function without that keyword) is left to ``check_attention``'s default.
    """
    if convert is None:
        return {name: given[name] for name, _ in _NAMES if name in given}
    return {
        name: convert(given[name]) if array else given[name]
        for name, array in _NAMES
        if name in given
    }


# ---------------------------------------------------------------------------------------------
# Query, key and value (step 2)
# ---------------------------------------------------------------------------------------------


def _check_rank(name: str, shape: Shape, letters: str) -> None:
    if len(shape) < 3:
        raise make_error(
            "rank",
            f"{name} must have at least 3 dims (..., {', '.join(letters)}); got shape {shape}",
            expected=f"(..., {', '.join(letters)})",
            actual=str(shape),
        )


#: Why a function without descale keywords refuses fp8 inputs (attention_spec.fp8).
_FP8_ELSEWHERE = (
    "fp8 inputs are taken only by scaled_dot_product_attention, attention_weights, "
    "flash_attention, varlen_attention and paged_attention (with q_descale/k_descale/"
    "v_descale) and made by quantize_fp8; the *_vjp and the sharded functions refuse them"
)


def _check_dtypes(q_dtype: str, k_dtype: str, v_dtype: str | None, fp8: bool) -> None:
    """The dtypes of query, key and value (``v_dtype`` None: no value). ``fp8``: the function
    takes descales, so fp8 inputs of an allowed combination pass (attention_spec.fp8);
    otherwise an fp8 input is ``unsupported_dtype``."""
    if check_fp8_dtypes(q_dtype, k_dtype, v_dtype):
        if not fp8:
            raise make_error(
                "unsupported_dtype",
                f"{_FP8_ELSEWHERE}; got query={q_dtype}, key={k_dtype}"
                + ("" if v_dtype is None else f", value={v_dtype}"),
                expected="float64 | float32 | float16 | bfloat16",
                actual=k_dtype,
            )
        return
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


def _sizes(query: Any, key: Any, value: Any, given: Mapping[str, Any], fp8: bool) -> CallSizes:
    """Step 2: query ``(..., H, L, D)``, key ``(..., K, S, D)`` and value ``(..., K, S, E)``
    (or NO_VALUE) fit together; their dtype, broadcast batch and sizes. ``fp8``: the call may
    have fp8 inputs (the function takes descales)."""
    with_value = value is not NO_VALUE
    check_given(query=query, key=key, **({"value": value} if with_value else {}))
    q, k = describe(query), describe(key)
    v = describe(value) if with_value else None
    _check_rank("query", q.shape, "HLD")
    _check_rank("key", k.shape, "KSD")
    if v is not None:
        _check_rank("value", v.shape, "KSE")
    _check_dtypes(q.dtype, k.dtype, None if v is None else v.dtype, fp8)

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
    return CallSizes(q.dtype, batch, H, K, L, S, D, E, given, k.dtype, "" if v is None else v.dtype)


# ---------------------------------------------------------------------------------------------
# One attention call
# ---------------------------------------------------------------------------------------------

#: The keywords of API 1.0's form, ``check_attention(query_shape, query_dtype, ...)``.
_FORM_1_0 = ARRAY_KEYWORDS_1_0 | {"value_shape", "value_dtype"}


def check_attention(query: Any, key: Any, value: Any = NO_VALUE, *form_1_0: Any,
                    **keywords: Any) -> AttentionCall:
    """Validate one attention call; return it as an :class:`~attention_spec.AttentionCall`.

    ``check_attention(query, key, value=NO_VALUE, *, mask=None, bias=None, is_causal=False,
    causal_alignment="top_left", scale=None, softcap=None, window=None, q_segment_ids=None,
    kv_segment_ids=None, sinks=None, alibi_slopes=None, q_descale=None, k_descale=None,
    v_descale=None)``: the keywords of :data:`KEYWORDS`. fp8 inputs (attention_spec.fp8) pass
    only when ``k_descale`` is among the keywords (None included): a function that takes no
    descales refuses them (``unsupported_dtype``).

    The arrays are read through :func:`describe` (anything with ``.shape`` and ``.dtype``, or an
    :class:`ArraySpec`). Shapes: query ``(..., H, L, D)``, key ``(..., K, S, D)``, value
    ``(..., K, S, E)`` (``NO_VALUE`` for ``attention_weights``), mask and bias broadcastable to
    ``(..., H, L, S)``; segment ids (integers) to ``(..., L)`` and ``(..., S)``; ``sinks`` and
    ``alibi_slopes`` are ``(H,)`` floating. The call holds ``scale`` and ``softcap`` as floats
    (``scale`` resolved to ``1/sqrt(D)`` when None), ``is_causal`` as a bool, ``window`` as a
    pair of ints or None, the causal ``offset``, the ``bands`` decision and every keyword in
    ``keywords``.

    Deprecated (API 1.0, removed in 2.0): ``check_attention(query_shape, query_dtype,
    key_shape, key_dtype, value_shape=None, value_dtype=None, *, mask_shape=None,
    mask_dtype=None, bias_shape=None, bias_dtype=None, **keywords)``, shapes and dtype names;
    it warns (``DeprecationWarning``) and returns what the array form returns.

    Raises:
        ConfigError, DimensionMismatchError, DTypeError, MaskError: see SEMANTICS.md.
        TypeError: a keyword the contract does not have.
    """
    if form_1_0 or isinstance(key, str) or not _FORM_1_0.isdisjoint(keywords):
        return _check_attention_1_0(query, key, value, *form_1_0, **keywords)
    if not keywords.keys() <= _DEFAULTS.keys():
        unknown = next(name for name in keywords if name not in _DEFAULTS)
        raise TypeError(f"check_attention() got an unexpected keyword argument {unknown!r}")
    fp8 = "k_descale" in keywords  # the function takes descales: fp8 inputs may come
    given = {**_DEFAULTS, **keywords}
    values = dict(given)
    for rule in _ALONE:  # 1. each keyword on its own
        values[rule.name] = rule.alone(values[rule.name])
    sizes = _sizes(query, key, value, given, fp8)  # 2. query, key, value
    for rule in _SHAPES:  # 3. each keyword against the sizes
        values[rule.name] = rule.shapes(values[rule.name], sizes)
    for rule in _RANGES:  # 4. each keyword against the compute dtype
        values[rule.name] = rule.ranges(values[rule.name], sizes)
    return _call(sizes, values)


check_attention.__signature__ = inspect.Signature(  # what help() and inspect show
    [
        inspect.Parameter("query", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("key", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("value", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=NO_VALUE),
        *(inspect.Parameter(k.name, inspect.Parameter.KEYWORD_ONLY, default=k.default)
          for k in KEYWORDS),
    ],
    return_annotation=AttentionCall,
)


def _call(sizes: CallSizes, values: dict[str, Any]) -> AttentionCall:
    """The call object of validated ``sizes`` and converted keyword ``values``."""
    L, S = sizes.L, sizes.S
    is_causal, window = values["is_causal"], values["window"]
    offset = causal_offset(L, S, values["causal_alignment"])
    bands = False
    if is_causal or window is not None:  # do the bands leave some pair out?
        _, every = block_rules(is_causal, window, offset, 0, L, 0, S, None, None)
        bands = not every
    return AttentionCall(
        batch=sizes.batch, H=sizes.H, K=sizes.K, L=L, S=S, D=sizes.D, E=sizes.E,
        scale=values["scale"], softcap=values["softcap"], is_causal=is_causal, window=window,
        causal_alignment=values["causal_alignment"], offset=offset, bands=bands,
        keywords=Keywords(values),
    )


def _check_attention_1_0(
    query_shape: Shape,
    query_dtype: str,
    key_shape: Shape,
    key_dtype: str,
    value_shape: Shape | None = None,
    value_dtype: str | None = None,
    **keywords: Any,
) -> AttentionCall:
    """API 1.0's form of :func:`check_attention` (PORTING.md of 2026-11-30): shapes and dtype
    names, ``value_shape=None`` for ``attention_weights``, ``mask_shape=, mask_dtype=,
    bias_shape=, bias_dtype=``; the same checks, on ArraySpecs."""
    warn_1_0(
        "check_attention(query_shape, query_dtype, key_shape, key_dtype, ..., mask_shape=...)",
        "pass the arrays (or an ArraySpec(shape, dtype_name) for each): "
        "check_attention(query, key, value, mask=mask, bias=bias, ...)",
    )
    value = spec_1_0(value_shape, value_dtype)
    masks = masks_1_0(keywords)
    return check_attention(
        spec_1_0(query_shape, query_dtype), spec_1_0(key_shape, key_dtype),
        NO_VALUE if value is None else value, **masks, **keywords,
    )
