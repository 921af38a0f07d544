"""Error cases: every rule of the taxonomy, as a call that must raise it.

``@error_case`` functions give the shapes, dtypes and keywords of a functional call that must
raise (``sdpa.error.<name>.<dtype>``, run against ``scaled_dot_product_attention``,
``attention_weights`` and ``flash_attention``), and the error class and code SEMANTICS.md's
taxonomy prescribes. ``@module_error_case`` functions describe a construction, a weight load, a
forward call or a decode that must raise (``module.error.<name>.float32``, or
``decode.error.<name>.float32`` for a decode). The ``causal_mask`` cases give its keywords.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from conformance.cases.base import (
    MB,
    ML,
    MS,
    B,
    Call,
    D,
    E,
    H,
    K,
    L,
    ModuleErrorCall,
    S,
    Zeros,
    call,
    case,
    kernel_shapes,
    z,
)

#: Error cases that involve the value (the weights function takes none).
WITH_VALUE = ("sdpa", "flash")
ALL_FUNCTIONS = ("sdpa", "weights", "flash")


def error_case(name: str, error_class: str, code: str, functions=ALL_FUNCTIONS):
    """Register ``fn() -> Call`` (of :class:`Zeros`) as ``sdpa.error.<name>.<query dtype>``."""

    def register(fn: Callable[[], Call]) -> Callable[[], Call]:
        dtype = fn().query.dtype
        return case("sdpa", name, (dtype,), functions=functions, error=(error_class, code))(fn)

    return register


def module_error_case(name: str, error_class: str, code: str):
    """Register ``fn() -> ModuleErrorCall`` as ``module.error.<name>.float32`` (or
    ``decode.error.<name>.float32`` for a decode)."""

    def register(fn: Callable[[], ModuleErrorCall]) -> Callable[[], ModuleErrorCall]:
        op = "decode" if fn().call == "decode" else "module"
        return case(op, name, ("float32",), functions=(op,), error=(error_class, code))(fn)

    return register


# ---------------------------------------------------------------------------------------------
# The functional API
# ---------------------------------------------------------------------------------------------

QKV = (z(B, H, L, D), z(B, K, S, D), z(B, K, S, E))


@error_case("rank", "DimensionMismatchError", "rank")
def err_rank():
    """query of rank 2 (L, D): the heads axis is missing."""
    return call(z(L, D), z(B, K, S, D), z(B, K, S, E))


@error_case("heads_not_divisible", "DimensionMismatchError", "heads_not_divisible")
def err_heads_not_divisible():
    """H=6 query heads cannot be shared by K=4 key/value heads."""
    return call(z(B, H, L, D), z(B, 4, S, D), z(B, 4, S, E))


@error_case("kv_heads_mismatch", "DimensionMismatchError", "kv_heads_mismatch", WITH_VALUE)
def err_kv_heads_mismatch():
    """key has K=2 heads, value has 3."""
    return call(z(B, H, L, D), z(B, K, S, D), z(B, 3, S, E))


@error_case("kv_length_mismatch", "DimensionMismatchError", "kv_length_mismatch", WITH_VALUE)
def err_kv_length_mismatch():
    """key has S=7 positions, value has 6 (torch's fused CPU path silently accepts this)."""
    return call(z(B, H, L, D), z(B, K, S, D), z(B, K, S - 1, E))


@error_case("qk_head_dim_mismatch", "DimensionMismatchError", "qk_head_dim_mismatch")
def err_qk_head_dim_mismatch():
    """query head dim D=11, key head dim 12."""
    return call(z(B, H, L, D), z(B, K, S, D + 1), z(B, K, S, E))


@error_case("batch_not_broadcastable", "DimensionMismatchError", "batch_not_broadcastable")
def err_batch_not_broadcastable():
    """query batch 2, key and value batch 3."""
    return call(z(2, H, L, D), z(3, K, S, D), z(3, K, S, E))


@error_case("mask_dtype_int", "MaskError", "mask_dtype")
def err_mask_dtype_int():
    """An integer mask (0/1): must be bool; an additive float goes in bias=."""
    return call(*QKV, mask=z(L, S, dtype="int32"))


@error_case("mask_dtype_float", "MaskError", "mask_dtype")
def err_mask_dtype_float():
    """A float mask: must be bool (onnx adds it as a bias; this contract refuses)."""
    return call(*QKV, mask=z(L, S, dtype="float32"))


@error_case("mask_shape", "MaskError", "mask_shape")
def err_mask_shape():
    """A (4, S) mask cannot broadcast to L=5 rows."""
    return call(*QKV, mask=z(4, S, dtype="bool"))


@error_case("mask_kv_heads", "MaskError", "mask_kv_heads")
def err_mask_kv_heads():
    """A mask with a head axis of size K=2 (neither 1 nor H=6)."""
    return call(*QKV, mask=z(K, L, S, dtype="bool"))


@error_case("bias_dtype_int", "MaskError", "bias_dtype")
def err_bias_dtype_int():
    """An integer bias: must be floating."""
    return call(*QKV, bias=z(L, S, dtype="int32"))


@error_case("bias_dtype_bool", "MaskError", "bias_dtype")
def err_bias_dtype_bool():
    """A boolean bias: a keep/drop mask goes in mask=."""
    return call(*QKV, bias=z(L, S, dtype="bool"))


@error_case("bias_shape", "MaskError", "bias_shape")
def err_bias_shape():
    """A (L, S + 1) bias does not broadcast to S=7 keys."""
    return call(*QKV, bias=z(L, S + 1))


@error_case("bias_kv_heads", "MaskError", "bias_kv_heads")
def err_bias_kv_heads():
    """A bias with a head axis of size K=2."""
    return call(*QKV, bias=z(B, K, L, S))


@error_case("dtype_mismatch", "DTypeError", "dtype_mismatch")
def err_dtype_mismatch():
    """query float32, key float64."""
    return call(z(B, H, L, D), z(B, K, S, D, dtype="float64"), z(B, K, S, E))


@error_case("dtype_mismatch_value", "DTypeError", "dtype_mismatch", WITH_VALUE)
def err_dtype_mismatch_value():
    """query and key float32, value float16."""
    return call(z(B, H, L, D), z(B, K, S, D), z(B, K, S, E, dtype="float16"))


@error_case("unsupported_dtype", "DTypeError", "unsupported_dtype")
def err_unsupported_dtype():
    """int32 query, key and value."""
    return call(
        z(B, H, L, D, dtype="int32"), z(B, K, S, D, dtype="int32"), z(B, K, S, E, dtype="int32")
    )


@error_case("scale_inf", "ConfigError", "scale_not_finite")
def err_scale_inf():
    """scale=inf."""
    return call(*QKV, scale=math.inf)


@error_case("scale_nan", "ConfigError", "scale_not_finite")
def err_scale_nan():
    """scale=nan."""
    return call(*QKV, scale=math.nan)


@error_case("softcap_zero", "ConfigError", "softcap_not_positive")
def err_softcap_zero():
    """softcap=0 (None means no cap)."""
    return call(*QKV, softcap=0.0)


@error_case("softcap_negative", "ConfigError", "softcap_not_positive")
def err_softcap_negative():
    """softcap=-5."""
    return call(*QKV, softcap=-5.0)


@error_case("unknown_alignment", "ConfigError", "unknown_alignment")
def err_unknown_alignment():
    """causal_alignment="bottom-right" (hyphen) is not one of the two names."""
    return call(*QKV, is_causal=True, causal_alignment="bottom-right")


@error_case("zero_heads", "ConfigError", "non_positive_size")
def err_zero_heads():
    """H = K = 0 heads."""
    return call(z(B, 0, L, D), z(B, 0, S, D), z(B, 0, S, E))


@error_case("zero_head_dim", "ConfigError", "non_positive_size")
def err_zero_head_dim():
    """D = 0 (L = 0 and S = 0 are legal; a zero head dim is not)."""
    return call(z(B, H, L, 0), z(B, K, S, 0), z(B, K, S, E))


@error_case("mask_rank", "MaskError", "mask_shape")
def err_mask_rank():
    """A mask with more dims than the scores: (3, B, H, L, S) against (B, H, L, S). (Dropping
    this rule once let JAX's attention_weights silently return a (3, ...) array.)"""
    return call(*QKV, mask=z(3, B, H, L, S, dtype="bool"))


@error_case("bias_rank", "MaskError", "bias_shape")
def err_bias_rank():
    """A bias with more dims than the scores: (2, B, H, L, S)."""
    return call(*QKV, bias=z(2, B, H, L, S))


@error_case("scale_range", "ConfigError", "scale_range")
def err_scale_range():
    """scale=1e39 with float32 inputs: finite in Python, but not in the float32 compute dtype
    (it would make every score inf, and the weights NaN)."""
    return call(*QKV, scale=1e39)


@error_case("softcap_range", "ConfigError", "softcap_range")
def err_softcap_range():
    """softcap=1e35 with float32 inputs, above 2**102: XLA flushes s / softcap to zero wherever
    it is subnormal (every |s| < 1e35 * 2**-126, about 1e-3), and JAX's weights differ from
    NumPy's and torch's by 85 times the bound; the range is refused for all alike."""
    return call(*QKV, softcap=1e35)


@error_case("is_causal_string", "ConfigError", "not_a_bool")
def err_is_causal_string():
    """is_causal="False": a string is true in Python, so a port that tests its truth applies the
    causal rule the caller meant to turn off. Flags must be bools."""
    return call(*QKV, is_causal="False")


@error_case("window_negative", "ConfigError", "window_value")
def err_window_negative():
    """window=(-1, 0): a side is an integer >= 0 or None."""
    return call(*QKV, window=(-1, 0))


@error_case("window_not_a_pair", "ConfigError", "window_value")
def err_window_not_a_pair():
    """window=(2, 0, 1): a window is a pair (left, right)."""
    return call(*QKV, window=(2, 0, 1))


@error_case("segment_ids_one_side", "ConfigError", "segment_ids_pair")
def err_segment_ids_one_side():
    """q_segment_ids without kv_segment_ids: both or neither."""
    return call(*QKV, q_segment_ids=z(L, dtype="int32"))


@error_case("segment_ids_float", "MaskError", "segment_ids_dtype")
def err_segment_ids_float():
    """Float segment ids: ids are integers."""
    return call(*QKV, q_segment_ids=z(L), kv_segment_ids=z(S))


@error_case("segment_ids_length", "MaskError", "segment_ids_shape")
def err_segment_ids_length():
    """kv_segment_ids of length S + 1 = 8 for S = 7 keys."""
    return call(*QKV, q_segment_ids=z(L, dtype="int32"), kv_segment_ids=z(S + 1, dtype="int32"))


@error_case("sinks_per_kv_head", "DimensionMismatchError", "sinks_shape")
def err_sinks_shape():
    """sinks of shape (K,) = (2,): one sink per query head, (H,) = (6,)."""
    return call(*QKV, sinks=z(K))


@error_case("sinks_int", "DTypeError", "sinks_dtype")
def err_sinks_dtype():
    """Integer sinks: a sink is a logit, floating."""
    return call(*QKV, sinks=z(H, dtype="int32"))


@error_case("alibi_per_batch", "DimensionMismatchError", "alibi_shape")
def err_alibi_shape():
    """alibi_slopes of shape (B, H): one slope per query head, (H,)."""
    return call(*QKV, alibi_slopes=z(B, H))


@error_case("alibi_int", "DTypeError", "alibi_dtype")
def err_alibi_dtype():
    """Integer slopes."""
    return call(*QKV, alibi_slopes=z(H, dtype="int32"))


@error_case("value_none", "DTypeError", "not_an_array", WITH_VALUE)
def err_value_none():
    """value=None: a missing array is DTypeError not_an_array, not an AttributeError from deep
    inside (nor a weights-only call)."""
    return call(z(B, H, L, D), z(B, K, S, D), z(dtype="none"))


# ---------------------------------------------------------------------------------------------
# causal_mask
# ---------------------------------------------------------------------------------------------


def _causal_mask_error(name: str, keywords: dict[str, Any], error_class: str, code: str) -> None:
    def build() -> dict[str, Any]:
        return dict(keywords)

    build.__doc__ = f"causal_mask({', '.join(f'{k}={v!r}' for k, v in keywords.items())}) raises."
    case("causal_mask", name, ("bool",), error=(error_class, code))(build)


_causal_mask_error(
    "unknown_alignment",
    {"q_len": 5, "kv_len": 7, "alignment": "diagonal"},
    "ConfigError",
    "unknown_alignment",
)
_causal_mask_error(
    "negative_length",
    {"q_len": -1, "kv_len": 7, "alignment": "top_left"},
    "ConfigError",
    "non_positive_size",
)
_causal_mask_error(
    "fractional_length",
    {"q_len": 5, "kv_len": 2.5, "alignment": "bottom_right"},
    "ConfigError",
    "non_positive_size",
)


# ---------------------------------------------------------------------------------------------
# Module error cases: construction, weight loading, forward, decoding
# ---------------------------------------------------------------------------------------------

# A valid module for the load/forward/decode error cases: M=20, H=6, K=2, D=4, E=3 (zeros).
EM, EH, EK, ED, EE = 20, H, K, 4, 3


def error_weights(*, m=EM, h=EH, k=EK, d=ED, e=EE, dtype="float32") -> dict[str, Zeros]:
    """The canonical weights of a module of these sizes, as shapes and a dtype."""
    weights = {}
    for name, (n_in, n_out) in kernel_shapes(m, h, k, d, e).items():
        weights[f"{name}.kernel"] = z(n_in, n_out, dtype=dtype)
        weights[f"{name}.bias"] = z(n_out, dtype=dtype)
    return weights


def construct(cls: str, **arguments: Any) -> ModuleErrorCall:
    return ModuleErrorCall("construct", cls, arguments=arguments)


def load(weights: dict[str, Zeros], *, cls="GroupedQueryAttention", n_heads=EH, n_kv_heads=EK):
    return ModuleErrorCall("load", cls, weights=weights, n_heads=n_heads, n_kv_heads=n_kv_heads)


def forward(x=None, context=None, *, mask=None, bias=None, **keywords) -> ModuleErrorCall:
    x = z(MB, ML, EM) if x is None else x
    inputs = {"x": x, "context": context, "mask": mask, "bias": bias}
    return ModuleErrorCall("forward", weights=error_weights(),
                           inputs={n: a for n, a in inputs.items() if a is not None},
                           keywords=keywords)


def decode(
    chunks: list[int], *, max_len: int, batch_size=MB, x=None, cache_from=None
) -> ModuleErrorCall:
    """Decode ``chunks`` of zeros into a cache of ``max_len``; ``cache_from`` (a module's
    ``{"n_heads", "n_kv_heads", "weights", "dtype"}``) makes the cache with another module."""
    x = z(MB, sum(chunks), EM) if x is None else x
    plan = {"batch_size": batch_size, "max_len": max_len, "chunks": list(chunks)}
    if cache_from is not None:
        plan["cache_from"] = cache_from
    return ModuleErrorCall("decode", weights=error_weights(), inputs={"x": x}, decode=plan)


def other_module(*, k=EK, d=ED, e=EE, dtype="float32") -> dict[str, Any]:
    """A module of other sizes or dtype (zeros), whose cache is given to the error module."""
    weights = {n: {"shape": list(w.shape), "dtype": w.dtype}
               for n, w in error_weights(k=k, d=d, e=e, dtype=dtype).items()}
    return {"n_heads": EH, "n_kv_heads": k, "weights": weights, "dtype": dtype}


@module_error_case("d_model_not_divisible", "DimensionMismatchError", "d_model_not_divisible")
def err_d_model_not_divisible():
    """MultiHeadAttention(d_model=16, n_heads=5) without head_dim: 16 is not divisible by 5."""
    return construct("MultiHeadAttention", d_model=16, n_heads=5)


@module_error_case("construct_heads_not_divisible", "DimensionMismatchError",
                   "heads_not_divisible")
def err_construct_heads_not_divisible():
    """GroupedQueryAttention(d_model=24, n_heads=6, n_kv_heads=4): 4 does not divide 6."""
    return construct("GroupedQueryAttention", d_model=24, n_heads=6, n_kv_heads=4)


@module_error_case("construct_zero_d_model", "ConfigError", "non_positive_size")
def err_construct_zero_d_model():
    """GroupedQueryAttention(d_model=0, n_heads=6, n_kv_heads=2)."""
    return construct("GroupedQueryAttention", d_model=0, n_heads=6, n_kv_heads=2)


@module_error_case("construct_zero_heads", "ConfigError", "non_positive_size")
def err_construct_zero_heads():
    """MultiHeadAttention(d_model=24, n_heads=0) (not a ZeroDivisionError)."""
    return construct("MultiHeadAttention", d_model=24, n_heads=0)


@module_error_case("construct_zero_head_dim", "ConfigError", "non_positive_size")
def err_construct_zero_head_dim():
    """GroupedQueryAttention(d_model=24, n_heads=6, n_kv_heads=2, head_dim=0)."""
    return construct("GroupedQueryAttention", d_model=24, n_heads=6, n_kv_heads=2, head_dim=0)


@module_error_case("weights_missing", "DimensionMismatchError", "weight_shape")
def err_weights_missing():
    """Canonical weights without o_proj.kernel."""
    weights = error_weights()
    del weights["o_proj.kernel"]
    return load(weights)


@module_error_case("weights_transposed", "DimensionMismatchError", "weight_shape")
def err_weights_transposed():
    """o_proj.kernel given as (M, H*E) = (20, 18), torch's (out, in) layout, not (H*E, M)."""
    weights = error_weights()
    weights["o_proj.kernel"] = z(EM, EH * EE)
    return load(weights)


@module_error_case("weights_torch_names", "DimensionMismatchError", "weight_shape")
def err_weights_torch_names():
    """An extra entry q_proj.weight (a torch state-dict name) next to the canonical ones."""
    return load(error_weights() | {"q_proj.weight": z(EH * ED, EM)})


@module_error_case("weights_some_biases", "DimensionMismatchError", "weight_shape")
def err_weights_some_biases():
    """Biases must be all present or all absent: only q_proj.bias is missing."""
    weights = error_weights()
    del weights["q_proj.bias"]
    return load(weights)


@module_error_case("weights_gqa_into_mha", "DimensionMismatchError", "weight_shape")
def err_weights_gqa_into_mha():
    """GQA 6:2 weights loaded with MultiHeadAttention.from_canonical(n_heads=6): K = H = 6
    cannot split v_proj's 2 * 3 features."""
    return load(error_weights(), cls="MultiHeadAttention", n_heads=EH, n_kv_heads=None)


@module_error_case("weights_mixed_dtypes", "DTypeError", "dtype_mismatch")
def err_weights_mixed_dtypes():
    """Every weight float32 but v_proj.kernel float16."""
    weights = error_weights()
    weights["v_proj.kernel"] = z(EM, EK * EE, dtype="float16")
    return load(weights)


@module_error_case("weights_int", "DTypeError", "unsupported_dtype")
def err_weights_int():
    """Integer weights."""
    return load(error_weights(dtype="int32"))


@module_error_case("x_width", "DimensionMismatchError", "model_width_mismatch")
def err_x_width():
    """x (B, L, 21) into a module of d_model M = 20."""
    return forward(z(MB, ML, EM + 1))


@module_error_case("context_width", "DimensionMismatchError", "model_width_mismatch")
def err_context_width():
    """context (B, S, 19) into a module of d_model M = 20."""
    return forward(z(MB, ML, EM), z(MB, MS, EM - 1))


@module_error_case("x_rank", "DimensionMismatchError", "rank")
def err_x_rank():
    """x of rank 2 (L, M): the batch axis is missing."""
    return forward(z(ML, EM))


@module_error_case("x_dtype", "DTypeError", "dtype_mismatch")
def err_x_dtype():
    """float64 x into a float32 module."""
    return forward(z(MB, ML, EM, dtype="float64"))


@module_error_case("context_batch", "DimensionMismatchError", "batch_not_broadcastable")
def err_context_batch():
    """x batch 2, context batch 3."""
    return forward(z(2, ML, EM), z(3, MS, EM))


@module_error_case("mask_kv_heads", "MaskError", "mask_kv_heads")
def err_module_mask_kv_heads():
    """A mask with a head axis of size K = 2 (neither 1 nor H = 6)."""
    return forward(z(MB, ML, EM), z(MB, MS, EM), mask=z(MB, EK, ML, MS, dtype="bool"))


@module_error_case("mask_dtype", "MaskError", "mask_dtype")
def err_module_mask_dtype():
    """An integer padding mask (0/1)."""
    return forward(z(MB, ML, EM), z(MB, MS, EM), mask=z(MB, 1, 1, MS, dtype="int32"))


@module_error_case("padding_mask_of_x", "MaskError", "mask_shape")
def err_module_mask_shape():
    """A (B, 1, 1, L) padding mask for cross-attention, where the keys are the S = 7 context
    tokens."""
    return forward(z(MB, ML, EM), z(MB, MS, EM), mask=z(MB, 1, 1, ML, dtype="bool"))


@module_error_case("unknown_alignment", "ConfigError", "unknown_alignment")
def err_module_alignment():
    """causal_alignment="lower_right" (torch's name for the bias object, not an alignment)."""
    return forward(is_causal=True, causal_alignment="lower_right")


@module_error_case("cache_overflow", "ConfigError", "cache_overflow")
def err_cache_overflow():
    """A cache of max_len 6: a prefill of 4 tokens fits, 3 more would need 7. Never a wrap or a
    silent truncation."""
    return decode([4, 3], max_len=6)


@module_error_case("cache_overflow_one_token", "ConfigError", "cache_overflow")
def err_cache_overflow_one_token():
    """A cache of max_len 3 filled token by token: the fourth token overflows."""
    return decode([1, 1, 1, 1], max_len=3)


@module_error_case("cache_zero_max_len", "ConfigError", "non_positive_size")
def err_cache_zero_max_len():
    """init_cache(batch_size=2, max_len=0)."""
    return decode([1], max_len=0)


@module_error_case("cache_batch", "DimensionMismatchError", "batch_not_broadcastable")
def err_cache_batch():
    """A cache made for 3 sequences fed a batch of 2."""
    return decode([2], max_len=6, batch_size=3)


@module_error_case("decode_width", "DimensionMismatchError", "model_width_mismatch")
def err_decode_width():
    """New tokens of width 21 into a module of d_model M = 20."""
    return decode([2], max_len=6, x=z(MB, 2, EM + 1))


@module_error_case("cache_of_other_heads", "DimensionMismatchError", "cache_mismatch")
def err_cache_of_other_heads():
    """A cache made by a module with K = 3 key/value heads given to one with K = 2: refused
    before any projection or write (NumPy and torch used to half-write it, then fail)."""
    return decode([2], max_len=6, cache_from=other_module(k=3))


@module_error_case("cache_of_other_head_dim", "DimensionMismatchError", "cache_mismatch")
def err_cache_of_other_head_dim():
    """A cache whose value head dim is E = 5, given to a module with E = 3."""
    return decode([2], max_len=6, cache_from=other_module(e=5))


@module_error_case("cache_of_other_dtype", "DTypeError", "dtype_mismatch")
def err_cache_of_other_dtype():
    """A float16 cache given to a float32 module: refused before the new keys are written."""
    return decode([2], max_len=6, cache_from=other_module(dtype="float16"))


@module_error_case("construct_dtype_name", "DTypeError", "unsupported_dtype")
def err_construct_dtype_name():
    """dtype="f4": a NumPy shorthand, not one of the four canonical names (which every
    framework accepts, with its own dtype objects)."""
    return construct("GroupedQueryAttention", d_model=24, n_heads=6, n_kv_heads=2, dtype="f4")


@module_error_case("construct_bias_flag", "ConfigError", "not_a_bool")
def err_construct_bias_flag():
    """bias="no": a flag must be a bool (the string is true)."""
    return construct("GroupedQueryAttention", d_model=24, n_heads=6, n_kv_heads=2, bias="no")


@module_error_case("return_weights_flag", "ConfigError", "not_a_bool")
def err_return_weights_flag():
    """return_weights="yes" in a forward call."""
    return forward(return_weights="yes")
