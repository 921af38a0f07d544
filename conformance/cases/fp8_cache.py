"""The modules' fp8 KV cache (Contract v3's "fp8 cache with a float query", in the modules:
``init_cache(..., dtype="float8_e4m3fn" | "float8_e5m2", k_descale=, v_descale=)``).

``@fp8_cache_case`` functions build a float32 GQA module and a sequence of T = 5 tokens, decoded
through an fp8 cache of each format (``decode.fp8_cache.<fmt>.<name>.<chunking>.float32``). The
golden is the oracle's own fp8 cache (:func:`conformance.oracle.fp8_cache_decode`): the keys
(rotated first) and values quantized with one descale per key/value head for the cache's life,
the caller's or the first write's dynamic one, later tokens saturating past it. A dynamic
descale depends on the first chunk, so each chunking has its own golden.

Every case is checked at generation (conformance/generate/fp8_cache.py): every unsaturated
quotient is at least :data:`MIN_MARGIN` of a grid step from a rounding boundary of its format,
so a port's float32 projections (which differ from the oracle's in the last bits) store the same
fp8 bytes; a seed that fails is changed (``seed_name``), never the bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from conformance.cases.base import (
    MB,
    MM,
    H,
    K,
    ModuleCall,
    ModuleErrorCall,
    canonical,
    case,
    normal,
    z,
)
from conformance.cases.decode import DECODE_T
from conformance.cases.errors import decode, module_error_case, other_module
from conformance.cases.mla import MLA, Dr, _zeros, mla_weights
from conformance.cases.mla import H as MLA_H

#: The fp8 formats of the cache, by the short name in a case id.
FORMATS: dict[str, str] = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2"}
#: The module's dtype of every fp8 cache case.
FP8_CACHE_DTYPE = "float32"
#: The least distance of a stored quotient to a rounding boundary, in grid steps.
MIN_MARGIN = 1e-3

#: The chunkings: token by token and in uneven chunks (2, 1, 2), into a plain, a rolling and a
#: paged cache (pages of 2, the last one partial; pages of 3 that the chunks straddle).
FP8_CHUNKINGS: dict[str, dict[str, Any]] = {
    "tokens": {"chunks": [1, 1, 1, 1, 1], "max_len": 5},
    "chunks_2_1_2": {"chunks": [2, 1, 2], "max_len": 8},
    "rolling.tokens": {"chunks": [1, 1, 1, 1, 1], "max_len": 5, "rolling": True},
    "rolling.chunks_2_1_2": {"chunks": [2, 1, 2], "max_len": 8, "rolling": True},
    "paged.tokens": {"chunks": [1, 1, 1, 1, 1], "max_len": 5, "page_size": 2},
    "paged.chunks_2_1_2": {"chunks": [2, 1, 2], "max_len": 8, "page_size": 3},
}


@dataclass
class Fp8CacheCall:
    """One fp8 cache case: the module and its sequence, the chunkings it is decoded in (names
    of :data:`FP8_CHUNKINGS`), and the caller's descales (None: the first write's dynamic ones;
    a number or a ``(K,)`` array)."""

    module: ModuleCall
    chunkings: tuple[str, ...]
    k_descale: float | np.ndarray | None = None
    v_descale: float | np.ndarray | None = None
    saturates: bool = False  # the case must saturate some later token (checked at generation)


def fp8_cache_case(name: str, seed_name: str | None = None) -> Callable:
    """Register ``fn(rng, dtype) -> Fp8CacheCall`` as ``decode.fp8_cache.<fmt>.<name>`` for
    each format, in float32."""

    def register(fn: Callable) -> Callable:
        for short in FORMATS:
            seed = None if seed_name is None else f"{seed_name}.{short}"
            case("decode", f"fp8_cache.{short}.{name}", (FP8_CACHE_DTYPE,),
                 seed_name=seed)(fn)
        return fn

    return register


def _gqa(rng, **options: Any) -> ModuleCall:
    """GroupedQueryAttention 6:2 on a sequence of T = 5 tokens, causal."""
    return ModuleCall(canonical(rng), normal(rng, MB, DECODE_T, MM), n_heads=H, n_kv_heads=K,
                      keywords={"is_causal": True}, options=options)


@fp8_cache_case("rope.gqa.dynamic", seed_name="fp8_cache.rope.gqa.dynamic.s2")
def fp8_cache_rope_dynamic(rng, dtype):
    """GQA 6:2 with RoPE (theta 100): the cache holds the rotated keys in fp8, one descale per
    key/value head computed from the first write (one token, or the first chunk of 2) and
    fixed; plain and paged caches."""
    chunkings = ("tokens", "chunks_2_1_2", "paged.tokens", "paged.chunks_2_1_2")
    return Fp8CacheCall(_gqa(rng, rope_theta=100.0), chunkings)


@fp8_cache_case("gqa.static", seed_name="fp8_cache.gqa.static.s2")
def fp8_cache_static(rng, dtype):
    """GQA 6:2 with the caller's descales (vLLM's calibrated k_scale/v_scale): k_descale per
    key/value head (0.01, 0.02), v_descale one number (0.05); plain and paged caches."""
    return Fp8CacheCall(_gqa(rng), ("tokens", "chunks_2_1_2", "paged.chunks_2_1_2"),
                        k_descale=np.array([0.01, 0.02]), v_descale=0.05)


@fp8_cache_case("window.gqa.dynamic")
def fp8_cache_window(rng, dtype):
    """GQA 6:2 with window=(1, 0): a plain cache and a rolling one of 2 slots, both fp8 with the
    first write's descales (the rolling cache's ring overwrites tokens, never its descales)."""
    chunkings = ("tokens", "chunks_2_1_2", "rolling.tokens", "rolling.chunks_2_1_2")
    return Fp8CacheCall(_gqa(rng, window=[1, 0]), chunkings)


@fp8_cache_case("gqa.saturate")
def fp8_cache_saturate(rng, dtype):
    """GQA 6:2 whose tokens after the first two are 8 times larger: their keys and values
    exceed the first write's range and saturate at the format's max (never NaN); a port that
    recomputes the descale at each write, or does not clip, fails."""
    call = _gqa(rng)
    call.x[:, 2:] *= 8.0
    return Fp8CacheCall(call, ("tokens", "chunks_2_1_2"), saturates=True)


# -- errors (decode.error.fp8_cache_*: init_cache refuses before any arithmetic) -------------


def _fp8_cache(**plan: Any) -> ModuleErrorCall:
    """One decoded token into a cache of max_len 6 made with ``init_cache(..., **plan)`` (the
    plan's ``cache_dtype`` is init_cache's ``dtype``)."""
    call = decode([1], max_len=6)
    call.decode |= plan
    return call


@module_error_case("fp8_cache_descale_without_dtype", "DTypeError", "descale_not_fp8")
def err_fp8_cache_descale_without_dtype() -> ModuleErrorCall:
    """init_cache(..., k_descale=0.5) without an fp8 dtype: a descale is only for an fp8 cache
    (never silently ignored)."""
    return _fp8_cache(k_descale=0.5)


@module_error_case("fp8_cache_dtype_unknown", "DTypeError", "unsupported_dtype")
def err_fp8_cache_dtype_unknown() -> ModuleErrorCall:
    """init_cache(..., dtype="int8"): a KV cache is the module's dtype or an fp8 format."""
    return _fp8_cache(cache_dtype="int8")


@module_error_case("fp8_cache_float64_module", "DTypeError", "fp8_combination")
def err_fp8_cache_float64_module() -> ModuleErrorCall:
    """An fp8 cache of a float64 module: the contract's fp8 key/value with a float64 query."""
    call = decode([1], max_len=6, cache_from=other_module(dtype="float64"))
    call.decode["cache_dtype"] = "float8_e4m3fn"
    return call


@module_error_case("fp8_cache_descale_shape", "DimensionMismatchError", "descale_shape")
def err_fp8_cache_descale_shape() -> ModuleErrorCall:
    """init_cache(..., dtype="float8_e4m3fn", k_descale=(3,)) for K = 2: one descale per
    key/value head, () or (K,); a per-query-head (H,) descale is refused too."""
    return _fp8_cache(cache_dtype="float8_e4m3fn", k_descale=[0.5, 0.5, 0.5])


@module_error_case("fp8_cache_descale_value", "ConfigError", "descale_value")
def err_fp8_cache_descale_value() -> ModuleErrorCall:
    """init_cache(..., dtype="float8_e5m2", v_descale=[0.5, 0.0]): a descale is finite and > 0."""
    return _fp8_cache(cache_dtype="float8_e5m2", v_descale=[0.5, 0.0])


@module_error_case("fp8_cache_mla", "ConfigError", "fp8_cache")
def err_fp8_cache_mla() -> ModuleErrorCall:
    """MultiHeadLatentAttention.init_cache(..., dtype="float8_e4m3fn"): the latent cache has no
    fp8 form here (never a silent cache of the module's dtype)."""
    weights = _zeros(mla_weights(np.random.default_rng(0)))
    plan = {"batch_size": MB, "max_len": 6, "chunks": [1], "cache_dtype": "float8_e4m3fn"}
    return ModuleErrorCall("decode", MLA, arguments={"qk_rope_head_dim": Dr}, weights=weights,
                           n_heads=MLA_H, n_kv_heads=None, inputs={"x": z(MB, 1, MM)},
                           decode=plan)
