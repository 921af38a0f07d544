"""FP8 cases (Contract v3, "FP8 inputs and caches"): attention on fp8 inputs with descales
(``sdpa.fp8.*``), ``quantize_fp8`` (``quantize.*``) and every fp8 error code.

``@fp8_case`` functions build one :class:`Fp8Call`: float64 values of the query, key and value
*before* quantization and the descales (float32 arrays ``(B, H)`` / ``(B, K)`` / ``(K,)``, or
scalars, given as keywords). The generator (conformance/generate/fp8.py) quantizes each fp8
input with the oracle's own ``quantize_fp8`` at its static descale (saturating: values past the
format's max become +-max), stores the bytes, and takes the golden from the float64 oracle on
the dequantized inputs. The case's dtype is the fp8 format of the key and value; the query is
fp8 too (``all.*``: FlashAttention 3's form, output bfloat16) or in ``query_dtype``
(``kv_cache.*``: vLLM's fp8 cache with a float query, output the query's dtype). Descales run
from 1e-2 to 1e2 and differ within a GQA group (key/value), and the query's are one per group
(FlashAttention 3's ``(B, K)`` form, expanded to ``(B, H)``), so a dropped, doubled or misread
descale changes the answer.

``@quantize_case`` functions build one :class:`QuantizeCall` (``quantize.<name>.<x dtype>``):
x in float64 (stored rounded to the case's dtype) and the call's keywords; the golden is
``conformance.oracle.quantize_fp8``, compared exactly.

Sizes: B=2, H=6, K=2, L=5, S=7, D=11, E=13.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import ml_dtypes
import numpy as np

from conformance.cases.base import B, D, E, H, K, L, S, Zeros, call, case, random_mask, z

FP8 = ("float8_e4m3fn", "float8_e5m2")
E4M3, E5M2 = ("float8_e4m3fn",), ("float8_e5m2",)


@dataclass
class Fp8Call:
    """One fp8 attention call: float64 ``query (B, H, L, D)``, ``key (B, K, S, D)``, ``value
    (B, K, S, E)`` before quantization; ``descales`` name -> a float32 array or a float (a
    keyword), None for an input that is not fp8; ``query_dtype`` None (the query is fp8 too) or
    the float dtype of the query; ``mask`` and ``arrays`` (sinks, float32) and ``keywords`` as
    :class:`conformance.cases.base.Call`'s."""

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    descales: dict[str, Any]
    query_dtype: str | None = None
    mask: np.ndarray | None = None
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    keywords: dict[str, Any] = field(default_factory=dict)


@dataclass
class QuantizeCall:
    """One ``quantize_fp8(x, dtype, axes=, descale=)`` call: float64 ``x``, the keywords
    (``dtype``, ``axes``, a scalar ``descale``) and, for a static descale array, ``descale``."""

    x: np.ndarray
    keywords: dict[str, Any]
    descale: np.ndarray | None = None


fp8_case = partial(case, "sdpa", functions=("sdpa", "weights", "flash"))
quantize_case = partial(case, "quantize", functions=("quantize",))


def _f32(x: float) -> float:
    """A descale keyword: a float that float32 holds exactly (validation rounds to float32)."""
    return float(np.float32(x))


def _group_q_descale(per_group: list[list[float]], h: int = H, k: int = K) -> np.ndarray:
    """A query descale ``(B, H)``, one value per key/value group (FlashAttention 3's ``(B, K)``)."""
    return np.repeat(np.asarray(per_group, np.float32), h // k, axis=1)


def _values(rng, h=H, k=K, l=L, s=S, spread=4.0):
    """query, key, value of order ``spread`` times the descale later applied (the generator
    quantizes ``x`` at descale d: the stored fp8 values are ``x / d``)."""
    q = rng.standard_normal((B, h, l, D)) * spread
    kk = rng.standard_normal((B, k, s, D)) * spread
    v = rng.standard_normal((B, k, s, E)) * spread + 2.0 * np.arange(k).reshape(k, 1, 1)
    return q, kk, v


def _fp8_call(q, k, v, qd, kd, vd, query_dtype=None, **keywords) -> Fp8Call:
    """An :class:`Fp8Call` whose raw values are the dequantized ones: x times its descale, so
    the stored fp8 values are of order ``spread``; sinks go among the arrays."""

    def times(x, d):
        return x if d is None else x * np.asarray(d, np.float64)[..., None, None]

    arrays = {"sinks": keywords.pop("sinks")} if "sinks" in keywords else {}
    mask = keywords.pop("mask", None)
    descales = {"q_descale": qd, "k_descale": kd, "v_descale": vd}
    return Fp8Call(times(q, qd), times(k, kd), times(v, vd), descales, query_dtype, mask, arrays,
                   keywords)


# ---------------------------------------------------------------------------------------------
# All fp8 (FlashAttention 3): query, key and value of one format, output bfloat16
# ---------------------------------------------------------------------------------------------

KD = np.array([[0.3, 0.07], [2.0, 0.9]], np.float32)  # (B, K): differs within each batch


@fp8_case("fp8.all.per_head", FP8)
def all_per_head(rng, dtype):
    """Query, key and value fp8; q_descale (B, H) one per GQA group (0.02 to 40), k_descale
    (B, K) differing within a batch, v_descale a scalar 50: each descale multiplies its input
    (a dropped or doubled one is far outside the bound). Output bfloat16."""
    return _fp8_call(*_values(rng), _group_q_descale([[0.02, 3.0], [0.5, 40.0]]), KD, _f32(50.0))


@fp8_case("fp8.all.scalar_descales", E4M3)
def all_scalar_descales(rng, dtype):
    """Every descale a scalar keyword (0.0625, 8, 0.015625): the per-tensor form."""
    return _fp8_call(*_values(rng), _f32(0.0625), _f32(8.0), _f32(0.015625))


@fp8_case("fp8.all.causal_window_softcap", FP8)
def all_causal_window_softcap(rng, dtype):
    """Causal (bottom_right) with a window (2, 0) and softcap 20 on dequantized scores."""
    return _fp8_call(*_values(rng), _group_q_descale([[0.5, 0.1], [1.5, 4.0]]), KD,
                     np.array([0.5, 80.0], np.float32), is_causal=True,
                     causal_alignment="bottom_right", window=(2, 0), softcap=20.0)


@fp8_case("fp8.all.sinks.gqa.h8_k1", E4M3)
def all_sinks_mqa(rng, dtype):
    """MQA 8:1 with sinks: the sink logit is not multiplied by any descale."""
    q, k, v = _values(rng, h=8, k=1)
    qd = _group_q_descale([[0.25], [0.01]], h=8, k=1)
    sinks = np.linspace(-1.0, 2.0, 8).astype(np.float32)
    return _fp8_call(q, k, v, qd, np.array([0.4], np.float32), _f32(20.0), sinks=sinks)


@fp8_case("fp8.all.large_logits.saturated", E4M3)
def all_large_logits(rng, dtype):
    """Scores near e4m3's range after descale and inputs quantized past 448 (they saturate to
    +-448 at the case's static descale, as ``quantize_fp8`` does): no overflow, no NaN."""
    q, k, v = _values(rng, spread=150.0)
    return _fp8_call(q, k, v, _f32(1.0), _f32(1.0), _f32(0.5))


@fp8_case("fp8.all.fully_masked_row", E5M2)
def all_fully_masked_row(rng, dtype):
    """Query row 2 has an all-False mask row: zero weights and output, fp8 or not."""
    mask = random_mask(rng, B, 1, L, S)
    mask[..., 2, :] = False
    return _fp8_call(*_values(rng), _f32(0.5), KD, _f32(2.0), mask=mask)


# ---------------------------------------------------------------------------------------------
# An fp8 key/value cache with a float query (vLLM's kv_cache_dtype="fp8")
# ---------------------------------------------------------------------------------------------


@fp8_case("fp8.kv_cache.bfloat16_query.causal_sinks", FP8)
def cache_bf16_causal_sinks(rng, dtype):
    """An fp8 key/value cache (per (batch, head) k_descale, scalar v_descale 50) with a
    bfloat16 query, causal with sinks: output bfloat16; no q_descale."""
    sinks = np.linspace(-1.0, 2.0, H).astype(np.float32)
    return _fp8_call(*_values(rng), None, KD, _f32(50.0), "bfloat16", is_causal=True,
                     sinks=sinks)


@fp8_case("fp8.kv_cache.float16_query.window", E5M2)
def cache_f16_window(rng, dtype):
    """A float16 query on an e5m2 cache with per-head descales (K,) and a window (1, 1)."""
    return _fp8_call(*_values(rng), None, np.array([0.03, 1.5], np.float32),
                     np.array([4.0, 0.25], np.float32), "float16", window=(1, 1))


@fp8_case("fp8.kv_cache.float32_query.decode", E4M3)
def cache_f32_decode(rng, dtype):
    """A decoding step: one float32 query row (L = 1) against an e4m3 cache of nine keys,
    bottom_right causal, k_descale (B, K) and v_descale (B, K)."""
    q, k, v = _values(rng, l=1, s=9)
    vd = np.array([[0.02, 60.0], [3.0, 0.5]], np.float32)
    return _fp8_call(q, k, v, None, KD, vd, "float32", is_causal=True,
                     causal_alignment="bottom_right")


# ---------------------------------------------------------------------------------------------
# quantize_fp8: exact (the stored fp8 values and the descale)
# ---------------------------------------------------------------------------------------------


def _grid_midpoints(fmt: str) -> np.ndarray:
    """Every halfway point between neighbouring non-negative finite values of ``fmt`` (exact
    in float32): ties, which round to the neighbour with an even mantissa."""
    dt = getattr(ml_dtypes, fmt)
    grid = np.arange(256, dtype=np.uint8).view(dt).astype(np.float64)
    grid = np.unique(grid[np.isfinite(grid) & (grid >= 0)])
    return (grid[:-1] + grid[1:]) / 2


@quantize_case("dynamic.e4m3", ("float32", "bfloat16", "float64"))
def quantize_dynamic_e4m3(rng, dtype):
    """Dynamic descales over the default axes (-2, -1): x (B, H, L, D) gives (B, H), each
    max|x| / 448, slices of very different magnitudes, one all-zero slice (descale 1.0)."""
    x = rng.standard_normal((B, H, L, D)) * np.exp(rng.uniform(-5, 5, (B, H, 1, 1)))
    x[1, 2] = 0.0
    return QuantizeCall(x, {"dtype": "float8_e4m3fn"})


@quantize_case("dynamic.e5m2")
def quantize_dynamic_e5m2(rng, dtype):
    """Dynamic e5m2 descales (max|x| / 57344) over (-2, -1)."""
    x = rng.standard_normal((B, H, L, D)) * np.exp(rng.uniform(-5, 5, (B, H, 1, 1)))
    return QuantizeCall(x, {"dtype": "float8_e5m2"})


@quantize_case("token_major.axes_0_2")
def quantize_token_major(rng, dtype):
    """Token-major x (T, H, D) with axes (0, 2): one descale per head, (H,)."""
    x = rng.standard_normal((9, H, D)) * np.array([0.01, 1, 5, 30, 0.2, 100])[None, :, None]
    return QuantizeCall(x, {"dtype": "float8_e4m3fn", "axes": (0, 2)})


@quantize_case("cache.axes_0_1_3")
def quantize_cache(rng, dtype):
    """A paged cache (P, page_size, K, D) with axes (0, 1, 3): one descale per key/value head."""
    x = rng.standard_normal((3, 4, K, D)) * np.array([0.5, 40.0])[None, None, :, None]
    return QuantizeCall(x, {"dtype": "float8_e4m3fn", "axes": (0, 1, 3)})


@quantize_case("static.per_head")
def quantize_static_per_head(rng, dtype):
    """A static descale array (B, H) (vLLM's calibrated scales), some too small for x: those
    quotients pass 448 and saturate."""
    x = rng.standard_normal((B, H, L, D)) * 3.0
    d = np.array([[0.01, 0.05, 0.5, 1.0, 2.0, 8.0], [0.02, 0.1, 0.3, 3.0, 20.0, 90.0]], np.float32)
    return QuantizeCall(x, {"dtype": "float8_e4m3fn"}, descale=d)


@quantize_case("saturation.e4m3")
def quantize_saturation_e4m3(rng, dtype):
    """Static descale 1: 500, -1e6, 449 and 464 (halfway past 448) become +-448, never NaN
    (an unsaturated cast gives NaN for e4m3fn)."""
    x = np.array([[500.0, -1e6, 449.0, 464.0, 448.0, -447.0, 1e30, 0.0]])
    return QuantizeCall(x, {"dtype": "float8_e4m3fn", "descale": 1.0})


@quantize_case("saturation.e5m2")
def quantize_saturation_e5m2(rng, dtype):
    """Static descale 1: beyond 57344 becomes +-57344, never inf."""
    x = np.array([[60000.0, -1e9, 61440.0, 57344.0, 1e30, -3e38]])
    return QuantizeCall(x, {"dtype": "float8_e5m2", "descale": 1.0})


@quantize_case("ties_to_even.e4m3")
def quantize_ties_e4m3(rng, dtype):
    """Every halfway point of e4m3fn, both signs, at descale 1: each rounds to the neighbour
    with an even mantissa (round toward zero or half away from zero fail here)."""
    mids = _grid_midpoints("float8_e4m3fn")
    return QuantizeCall(np.stack([mids, -mids]), {"dtype": "float8_e4m3fn", "descale": 1.0})


@quantize_case("ties_to_even.e5m2")
def quantize_ties_e5m2(rng, dtype):
    """Every halfway point of e5m2, both signs, at descale 1."""
    mids = _grid_midpoints("float8_e5m2")
    return QuantizeCall(np.stack([mids, -mids]), {"dtype": "float8_e5m2", "descale": 1.0})


@quantize_case("subnormals.e4m3")
def quantize_subnormals(rng, dtype):
    """Values among e4m3fn's subnormals (steps of 2**-9 below 2**-6) and below its smallest
    (2**-10 and less round to 0 or 2**-9), at descale 1."""
    x = np.array([[2.0**-9, 3 * 2.0**-10, 2.0**-10, 2.0**-11, 0.7 * 2.0**-9, 7 * 2.0**-9,
                   7.5 * 2.0**-9, 2.0**-6, -5 * 2.0**-9, 1e-30]])
    return QuantizeCall(x, {"dtype": "float8_e4m3fn", "descale": 1.0})


@quantize_case("double_rounding", ("float64",))
def quantize_double_rounding(rng, dtype):
    """x is taken to float32 first: float64 1.0625 + 1e-12 is float32's 1.0625, a tie that
    rounds to 1.0 (rounding the float64 quotient directly gives 1.125)."""
    return QuantizeCall(np.array([[1.0625 + 1e-12, 1.1875 - 1e-12]]),
                        {"dtype": "float8_e4m3fn", "descale": 1.0})


# ---------------------------------------------------------------------------------------------
# Errors: every fp8 code (the runner passes zeros, or an input's given values)
# ---------------------------------------------------------------------------------------------

Q8, K8, V8 = (
    z(B, H, L, D, dtype=E4M3[0]),
    z(B, K, S, D, dtype=E4M3[0]),
    z(B, K, S, E, dtype=E4M3[0]),
)
Q32, K32, V32 = z(B, H, L, D), z(B, K, S, D), z(B, K, S, E)
fp8_error = partial(case, "sdpa", functions=("sdpa", "weights", "flash"))


def _ones(*shape: int, dtype=np.float32, fill=1.0) -> np.ndarray:
    return np.full(shape, fill, dtype)


@case("sdpa", "fp8_combination.one_of_kv", functions=("sdpa", "flash"),
      error=("DTypeError", "fp8_combination"))
def err_one_of_kv():
    """Key fp8, value float32: outside the two allowed combinations (scaled_dot_product_attention
    only: attention_weights reads no value)."""
    return call(Q32, K8, V32)


@fp8_error("fp8_combination.fp8_query_float_kv", E4M3, error=("DTypeError", "fp8_combination"))
def err_fp8_query():
    """An fp8 query with float32 key and value."""
    return call(Q8, K32, V32)


@case("sdpa", "fp8_combination.formats_mixed", E4M3, functions=("sdpa", "flash"),
      error=("DTypeError", "fp8_combination"))
def err_formats_mixed():
    """Query and key e4m3fn, value e5m2: one format only (scaled_dot_product_attention only)."""
    return call(Q8, K8, z(B, K, S, E, dtype="float8_e5m2"))


@fp8_error("fp8_combination.float64_query", E4M3, error=("DTypeError", "fp8_combination"))
def err_float64_query():
    """A float64 query on an fp8 cache (only float32, float16, bfloat16 queries)."""
    return call(z(B, H, L, D, dtype="float64"), K8, V8)


@fp8_error("fp8_descale_not_fp8", error=("DTypeError", "descale_not_fp8"))
def err_descale_not_fp8():
    """q_descale=1.0 for a float32 query: a descale for an input that is not fp8."""
    return call(Q32, K8, V8, q_descale=1.0)


@fp8_error("fp8_descale_dtype.float64", E4M3, error=("DTypeError", "descale_dtype"))
def err_descale_float64():
    """A float64 k_descale array: descales are float32 (no silent narrowing)."""
    return _with(call(Q8, K8, V8), k_descale=_ones(B, K, dtype=np.float64))


@fp8_error("fp8_descale_shape.by_query_head", E4M3, error=("DimensionMismatchError",
                                                          "descale_shape"))
def err_descale_by_query_head():
    """k_descale (B, H) where (B, K) is asked: a key descale per query head."""
    return _with(call(Q8, K8, V8), k_descale=_ones(B, H))


@fp8_error("fp8_descale_value.zero", E4M3, error=("ConfigError", "descale_value"))
def err_descale_zero():
    """q_descale 0.0: a descale must be finite and > 0."""
    return call(Q8, K8, V8, q_descale=0.0)


@fp8_error("fp8_descale_value.negative_array", E4M3, error=("ConfigError", "descale_value"))
def err_descale_negative():
    """A k_descale array with a negative entry."""
    return _with(call(Q8, K8, V8), k_descale=np.array([1.0, -2.0], np.float32))


@fp8_error("fp8_descale_value.float32_overflow", E4M3, error=("ConfigError", "descale_value"))
def err_descale_overflow():
    """q_descale 1e39: infinite once rounded to float32."""
    return call(Q8, K8, V8, q_descale=1e39)


def _with(c, **descales: np.ndarray):
    """``c`` with descale arrays among its arrays (given by value, not zeros)."""
    c.arrays.update(descales)
    return c


@case("quantize", "axes_repeated", functions=("quantize",), error=("ConfigError", "axes_value"))
def err_quantize_axes_repeated():
    """axes (1, -3) of a 4-d x: the same axis twice."""
    return QuantizeCall(Zeros((B, H, L, D)), {"axes": (1, -3)})


@case("quantize", "axis_outside", functions=("quantize",), error=("ConfigError", "axes_value"))
def err_quantize_axis_outside():
    """axes 4 of a 4-d x."""
    return QuantizeCall(Zeros((B, H, L, D)), {"axes": 4})


@case("quantize", "nonfinite", ("float64",), functions=("quantize",),
      error=("ConfigError", "fp8_nonfinite"))
def err_quantize_nonfinite():
    """A float64 x of 1e39: infinite in float32, where the quotient is taken."""
    return QuantizeCall(np.full((2, 3), 1e39), {})


@case("quantize", "unknown_format", functions=("quantize",),
      error=("DTypeError", "unsupported_dtype"))
def err_quantize_unknown_format():
    """dtype "float8_e4m3" (not e4m3fn): an unknown fp8 format."""
    return QuantizeCall(Zeros((B, H, L, D)), {"dtype": "float8_e4m3"})


@case("quantize", "descale_shape", functions=("quantize",),
      error=("DimensionMismatchError", "descale_shape"))
def err_quantize_descale_shape():
    """A static descale (H, B) for x (B, H, L, D): it must broadcast to (B, H)."""
    return QuantizeCall(Zeros((B, H, L, D)), {}, descale=_ones(H, B))


@case("quantize", "descale_value", functions=("quantize",),
      error=("ConfigError", "descale_value"))
def err_quantize_descale_value():
    """A static descale of -1.0."""
    return QuantizeCall(Zeros((B, H, L, D)), {"descale": -1.0})
