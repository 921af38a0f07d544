"""FP8 inputs (Contract v3, "FP8 inputs and caches") in all three implementations:
``quantize_fp8`` bit for bit, ``scaled_dot_product_attention`` and ``attention_weights`` with
fp8 inputs and descales against the float64 oracle on the dequantized inputs, and every fp8
error code with one class, code and message in all three.

Sizes are pairwise distinct: B=2, H=6, K=2 (G=3), L=5, S=7, D=11, E=13.
"""

from __future__ import annotations

import importlib
import math

import ml_dtypes
import numpy as np
import pytest
import torch

import impl_numpy
from attention_spec import FP8_MAX, MIN_DESCALE, ConfigError, DimensionMismatchError, DTypeError
from conformance import oracle
from tests.frameworks import FRAMEWORKS, NP_DTYPES, assert_agree, same_error

B, H, K, L, S, D, E = 2, 6, 2, 5, 7, 11, 13
FP8 = ("float8_e4m3fn", "float8_e5m2")
#: mantissa bits and the smallest normal exponent of each format
FORMAT = {"float8_e4m3fn": (3, -6), "float8_e5m2": (2, -14)}


def _bytes(x) -> np.ndarray:
    """An fp8 array of any framework as its bytes (uint8)."""
    if isinstance(x, torch.Tensor):
        return x.view(torch.uint8).numpy()
    return np.asarray(x).view(np.uint8)


def _rne(v: float, fmt: str) -> float:
    """v rounded to nearest even in ``fmt`` (saturating), written here from the format's bits
    (3 or 2 mantissa bits, subnormals below the smallest normal), independent of ml_dtypes."""
    mant, emin = FORMAT[fmt]
    v = max(-FP8_MAX[fmt], min(FP8_MAX[fmt], v))
    if v == 0.0:
        return 0.0
    _, e = math.frexp(abs(v))  # |v| = m 2**e, m in [0.5, 1)
    step = 2.0 ** (max(e - 1, emin) - mant)
    return math.copysign(round(abs(v) / step) * step, v)  # round(): half to even


def _inputs(rng: np.random.Generator) -> np.ndarray:
    """float32 values over many binades, with halfway points of e4m3 and e5m2, values past
    448 and 57344, zeros and subnormals."""
    x = (rng.standard_normal((B, H, 9, D)) * np.exp(rng.uniform(-6, 6, (B, H, 1, 1)))).astype(
        np.float32
    )
    grid = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    grid = np.sort(grid[np.isfinite(grid) & (grid >= 0)])
    mids = ((grid[:-1] + grid[1:]) / 2).astype(np.float32)  # exact ties
    x[0, 0].flat[: mids.size] = mids[: x[0, 0].size]
    x[0, 1, 0, :6] = [500.0, -1e6, 0.0, 2.0**-140, 57344.0 * 1.2, 464.0]
    x[1, 2] = 0.0  # an all-zero slice: descale 1.0
    return x


@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("how", ["dynamic", "static", "axes"])
def test_quantize_fp8_is_bit_exact_in_all_three(fmt: str, how: str) -> None:
    x = _inputs(np.random.default_rng(28))
    kw = {"dynamic": {}, "static": {"descale": np.float32(1.0)}, "axes": {"axes": (0, 2, 3)}}[how]
    results = {name: fw.module.quantize_fp8(x, fmt, **kw) for name, fw in FRAMEWORKS.items()}
    x8, d = results["numpy"]
    assert x8.dtype == np.dtype(getattr(ml_dtypes, fmt)) and d.dtype == np.float32
    assert d.shape == {"dynamic": (B, H), "static": (B, H), "axes": (H,)}[how]
    for name, (y8, dy) in results.items():
        assert np.array_equal(_bytes(y8), _bytes(x8)), name
        assert np.array_equal(np.asarray(dy.numpy() if name == "torch" else dy), d), name
    values = x8.astype(np.float32)
    assert np.isfinite(values).all()  # saturating: never NaN
    # the rounding, against this file's own rounding of the float32 quotient
    keep = d.reshape(d.shape + (1,) * (x.ndim - d.ndim)) if how != "axes" else d[:, None, None]
    quotient = x / keep  # float32
    want = np.vectorize(lambda v: _rne(float(v), fmt))(quotient)
    assert np.array_equal(values, want.astype(np.float32))
    if how == "static" and fmt == "float8_e4m3fn":
        assert values[0, 1, 0, 0] == 448.0 and values[0, 1, 0, 1] == -448.0  # 500 -> 448
    if how == "dynamic":
        assert d[1, 2] == 1.0 and d.min() >= MIN_DESCALE


@pytest.mark.parametrize("fmt", FP8)
def test_quantize_fp8_equals_the_oracle(fmt: str) -> None:
    x = _inputs(np.random.default_rng(11)).astype(np.float64) * 3
    values, d = oracle.quantize_fp8(x, fmt, axes=(1, 3))
    for name, fw in FRAMEWORKS.items():
        y, dy = fw.module.quantize_fp8(x, fmt, axes=(1, 3))
        y = y.float().numpy() if name == "torch" else np.asarray(y.astype(np.float32))
        assert np.array_equal(y.astype(np.float64), values), name
        assert np.array_equal(np.asarray(dy), d), name


def test_quantize_fp8_takes_x_to_float32_first() -> None:
    x = np.array([1.0625 + 1e-12], np.float64)  # float32 1.0625 is a tie: rounds to 1.0
    for fw in FRAMEWORKS.values():
        y, _ = fw.module.quantize_fp8(x, axes=0, descale=1.0)
        assert (
            float(np.asarray(y.float() if isinstance(y, torch.Tensor) else y, np.float32)[0]) == 1.0
        )


def _fp8_call(rng, fmt: str, q_dtype: str | None):
    """query, key, value (fp8, or query in ``q_dtype``) and descales from 1e-2 to 1e2: per head
    of key and value differing within a GQA group? (K is the group axis), and a query descale
    given per key/value head (FlashAttention 3's (B, K)) expanded to (B, H)."""
    qf = rng.standard_normal((B, H, L, D)) * 4
    kf = rng.standard_normal((B, K, S, D)) * 4
    vf = rng.standard_normal((B, K, S, E)) * 4
    qd = np.repeat(np.array([[0.02, 3.0], [0.5, 40.0]], np.float32), H // K, axis=1)  # (B, H)
    kd = np.array([[0.3, 1e-2 * 7], [2.0, 0.9]], np.float32)  # (B, K)
    vd = np.float32(1e2 * 0.5)
    dt = getattr(ml_dtypes, fmt)
    key, value = kf.astype(dt), vf.astype(dt)
    if q_dtype is None:
        query, q_descale = qf.astype(dt), qd
    else:
        query, q_descale = qf.astype({"bfloat16": ml_dtypes.bfloat16}.get(q_dtype, q_dtype)), None
    return query, key, value, {"q_descale": q_descale, "k_descale": kd, "v_descale": vd}


def _dequantized64(query, key, value, kw):
    def deq(x, d):
        x = x.astype(np.float64)
        return x if d is None else x * np.asarray(d, np.float64)[..., None, None]

    return (deq(query, kw["q_descale"]), deq(key, kw["k_descale"]), deq(value, kw["v_descale"]))


OPTIONS = {
    "plain": {},
    "causal_sinks": {"is_causal": True, "sinks": np.linspace(-1, 2, H).astype(np.float32)},
    "window_softcap": {"window": (2, 1), "softcap": 20.0},
    "masked_row": {"mask": np.arange(S)[None, :] > np.arange(L)[:, None] + 10},
}


def _strict_bound(golden: np.ndarray, plain32: np.ndarray, out: str) -> float:
    """The contract's strict bound: the v2 rule on a correct float32 computation of the
    dequantized inputs (``plain32``), its result rounded once to the output dtype."""
    return oracle.tolerance_bound(golden, oracle.rounded(plain32, out).astype(np.float64), out)


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize(
    ("fmt", "q_dtype"),
    [("float8_e4m3fn", None), ("float8_e5m2", None), ("float8_e4m3fn", "bfloat16"),
     ("float8_e5m2", "float16"), ("float8_e4m3fn", "float32")],
)
def test_fp8_attention_matches_the_oracle_on_dequantized_inputs(fmt, q_dtype, option) -> None:
    rng = np.random.default_rng(len(option) * 7 + len(fmt))
    query, key, value, kw = _fp8_call(rng, fmt, q_dtype)
    if q_dtype is not None:
        kw = {"k_descale": kw["k_descale"], "v_descale": kw["v_descale"]}
    kw64 = {"q_descale": None, **kw}
    opts = OPTIONS[option]
    q64, k64, v64 = _dequantized64(query, key, value, kw64)
    out = "bfloat16" if q_dtype is None else q_dtype
    golden = oracle.attention(q64, k64, v64, **opts)
    plain = oracle.attention(q64, k64, v64, **opts, round_to="float32")
    bound_out = _strict_bound(golden.output, plain.output, out)
    bound_w = _strict_bound(golden.weights, plain.weights, out)
    wkw = {n: x for n, x in kw.items() if n != "v_descale"}
    for name, fw in FRAMEWORKS.items():
        got = fw.module.scaled_dot_product_attention(query, key, value, **kw, **opts)
        w = fw.module.attention_weights(query, key, **wkw, **opts)
        got, w = fw.to_numpy(got), fw.to_numpy(w)
        assert got.dtype.name == out and w.dtype.name == out, name
        err = np.abs(got.astype(np.float64) - golden.output).max()
        assert err <= bound_out, (name, err, bound_out)
        assert np.abs(w.astype(np.float64) - golden.weights).max() <= bound_w, name
    if option == "masked_row":
        assert np.all(golden.output == 0.0) and np.all(got == 0.0)  # every row masked: zeros
    # the bound tells a descale dropped (each one) or a 10% error in the softmax scale
    wrong = {n: {**kw, n: None} for n in kw} | {"scale*1.1": kw}
    for what, call in wrong.items():
        scale = {"scale": 1.1 / math.sqrt(D)} if what == "scale*1.1" else {}
        if option == "masked_row":
            continue  # every row masked: nothing to tell
        bad = FRAMEWORKS["numpy"].module.scaled_dot_product_attention(
            query, key, value, **call, **opts, **scale
        )
        assert np.abs(bad.astype(np.float64) - golden.output).max() > bound_out, what


def _q8(shape=(B, H, L, D), fmt="float8_e4m3fn"):
    return np.random.default_rng(3).standard_normal(shape).astype(getattr(ml_dtypes, fmt))


Q8, K8, V8 = _q8(), _q8((B, K, S, D)), _q8((B, K, S, E))
Q32 = np.ones((B, H, L, D), np.float32)
K32, V32 = np.ones((B, K, S, D), np.float32), np.ones((B, K, S, E), np.float32)

ERRORS = {
    "one_of_kv": (lambda fw: fw.module.scaled_dot_product_attention(Q32, K8, V32),
                  DTypeError, "fp8_combination", "value=float32"),
    "formats_mixed": (lambda fw: fw.module.scaled_dot_product_attention(
        Q8, K8, V8.astype(np.float32).astype(ml_dtypes.float8_e5m2)),
        DTypeError, "fp8_combination", "float8_e5m2"),
    "fp8_query_float_kv": (lambda fw: fw.module.scaled_dot_product_attention(Q8, K32, V32),
                           DTypeError, "fp8_combination", "query=float8_e4m3fn"),
    "float64_query": (lambda fw: fw.module.scaled_dot_product_attention(
        Q32.astype(np.float64), K8, V8), DTypeError, "fp8_combination", "query=float64"),
    "weights_mixed": (lambda fw: fw.module.attention_weights(Q8, K32),
                      DTypeError, "fp8_combination", "key=float32"),
    "descale_not_fp8": (lambda fw: fw.module.scaled_dot_product_attention(
        Q32, K8, V8, q_descale=1.0), DTypeError, "descale_not_fp8", "float32"),
    "descale_float64": (lambda fw: fw.module.scaled_dot_product_attention(
        Q8, K8, V8, k_descale=np.ones((B, K))), DTypeError, "descale_dtype", "float64"),
    "descale_by_query_head": (lambda fw: fw.module.scaled_dot_product_attention(
        Q8, K8, V8, k_descale=np.ones((B, H), np.float32)),
        DimensionMismatchError, "descale_shape", "(B=2, K=2)"),
    "q_descale_shape": (lambda fw: fw.module.attention_weights(
        Q8, K8, q_descale=np.ones((3,), np.float32)),
        DimensionMismatchError, "descale_shape", "(B=2, H=6)"),
    "descale_zero": (lambda fw: fw.module.scaled_dot_product_attention(
        Q8, K8, V8, v_descale=0.0), ConfigError, "descale_value", "got 0.0"),
    "descale_nan": (lambda fw: fw.module.scaled_dot_product_attention(
        Q8, K8, V8, k_descale=np.array([1.0, np.nan], np.float32)),
        ConfigError, "descale_value", "nan"),
    "descale_overflow": (lambda fw: fw.module.scaled_dot_product_attention(
        Q8, K8, V8, q_descale=1e39), ConfigError, "descale_value", "inf"),
    "vjp_refuses": (lambda fw: fw.module.scaled_dot_product_attention_vjp(
        Q32, K8, V8, np.ones((B, H, L, E), np.float32)),
        DTypeError, "unsupported_dtype", "*_vjp"),
    "flash_vjp_refuses": (lambda fw: fw.module.flash_attention_vjp(
        Q8, K8, V8, np.ones((B, H, L, E), np.float32)),
        DTypeError, "unsupported_dtype", "sharded functions"),
    "ring_refuses": (lambda fw: importlib.import_module(f"{fw.module.__name__}.sharded")
                     .ring_attention(Q8, K8, V8, n_shards=1),
                     DTypeError, "unsupported_dtype", "sharded functions"),
    "head_parallel_refuses": (lambda fw: importlib.import_module(f"{fw.module.__name__}.sharded")
                              .head_parallel_attention(Q8, K8, V8, n_shards=1),
                              DTypeError, "unsupported_dtype", "sharded functions"),
    "quantize_axes": (lambda fw: fw.module.quantize_fp8(Q32, axes=(1, -3)),
                      ConfigError, "axes_value", "(1, -3)"),
    "quantize_axis_rank": (lambda fw: fw.module.quantize_fp8(Q32, axes=4),
                           ConfigError, "axes_value", "[-4, 4)"),
    "quantize_dtype": (lambda fw: fw.module.quantize_fp8(Q32, "float8_e4m3"),
                       DTypeError, "unsupported_dtype", "float8_e4m3"),
    "quantize_x": (lambda fw: fw.module.quantize_fp8(Q8),
                   DTypeError, "unsupported_dtype", "float8_e4m3fn"),
    "quantize_none": (lambda fw: fw.module.quantize_fp8(None),
                      DTypeError, "not_an_array", "None"),
    "quantize_descale_shape": (lambda fw: fw.module.quantize_fp8(
        Q32, descale=np.ones((H, B), np.float32)),
        DimensionMismatchError, "descale_shape", "(2, 6)"),
    "quantize_descale_value": (lambda fw: fw.module.quantize_fp8(Q32, descale=-1.0),
                               ConfigError, "descale_value", "-1.0"),
    "quantize_nonfinite": (lambda fw: fw.module.quantize_fp8(
        np.full((2, 3), 1e39, np.float64)), ConfigError, "fp8_nonfinite", "float32"),
    "varlen_vjp_refuses_fp8": (lambda fw: fw.module.varlen_attention_vjp(
        *_varlen_fp8("float8_e4m3fn", None)[:3], CU_Q, CU_K,
        np.ones((7, H, E), ml_dtypes.bfloat16)),
        DTypeError, "unsupported_dtype", "varlen_attention"),
    "varlen_descale_shape": (lambda fw: fw.module.varlen_attention(
        *_varlen_fp8("float8_e4m3fn", None)[:3], CU_Q, CU_K,
        k_descale=np.ones((3, H), np.float32)),
        DimensionMismatchError, "descale_shape", "(N=3, K=2)"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_fp8_errors_are_the_same_in_all_three(case: str) -> None:
    call, cls, code, fragment = ERRORS[case]
    same_error(call, cls, code, fragment)


def test_every_fp8_code_has_a_case() -> None:
    from attention_spec import FP8_ERROR_CODES

    assert {code for _, _, code, _ in ERRORS.values()} >= FP8_ERROR_CODES


# -- broken ports: each fp8 bug, and the named run that catches it -----------------------------

#: The runs the broken ports are tried on: (format, query dtype or None for all-fp8, option).
RUNS = {
    "e4m3.plain": ("float8_e4m3fn", None, "plain"),
    "e5m2.window_softcap": ("float8_e5m2", None, "window_softcap"),
    "e4m3.bf16_query.causal_sinks": ("float8_e4m3fn", "bfloat16", "causal_sinks"),
}


def _run(name: str):
    """One named run: its inputs, keywords, options, golden, output dtype and two bounds
    (``bound``: the kernels' practice, the weights of an all-fp8 call rounded to the value's
    format before the value product; ``strict``: a correct float32 dequantized computation)."""
    fmt, q_dtype, option = RUNS[name]
    query, key, value, kw = _fp8_call(np.random.default_rng(len(name)), fmt, q_dtype)
    if q_dtype is not None:
        kw = {"k_descale": kw["k_descale"], "v_descale": kw["v_descale"]}
    opts = OPTIONS[option]
    q64, k64, v64 = _dequantized64(query, key, value, {"q_descale": None, **kw})
    out = "bfloat16" if q_dtype is None else q_dtype
    golden = oracle.attention(q64, k64, v64, **opts)
    plain = oracle.attention(q64, k64, v64, **opts, round_to="float32")
    # FlashAttention 3 keeps P in the value's fp8 format (an all-fp8 call); a float query not
    kernel = oracle.attention(
        q64, k64, v64, **opts, round_to="float32", weights_to=fmt if q_dtype is None else None
    ).output
    bound = oracle.tolerance_bound(golden.output, oracle.rounded(kernel, out).astype(float), out)
    strict = _strict_bound(golden.output, plain.output, out)
    return query, key, value, kw, opts, golden.output, out, bound, strict


def _as_e5m2(x):
    return x.astype(np.float32).astype(ml_dtypes.float8_e5m2).astype(np.float32)


def _k_by_query_head(query, key, value, kw, opts):
    """k_descale read at the query head's index (h % K) instead of its key/value head's."""
    kd = np.broadcast_to(np.asarray(kw["k_descale"], np.float32), (B, K))
    key_h = np.repeat(key.astype(np.float32), H // K, axis=-3)  # (B, H, S, D)
    key_h = key_h * kd[:, np.arange(H) % K][..., None, None]
    value_h = np.repeat(value.astype(np.float32) * kw["v_descale"], H // K, axis=-3)
    q = query.astype(np.float32)
    if kw.get("q_descale") is not None:
        q = q * kw["q_descale"][..., None, None]
    out = FRAMEWORKS["numpy"].module.scaled_dot_product_attention(q, key_h, value_h, **opts)
    return out.astype(ml_dtypes.bfloat16 if query.dtype.name.startswith("float8") else query.dtype)


def _sdpa(query, key, value, kw, opts):
    return FRAMEWORKS["numpy"].module.scaled_dot_product_attention(query, key, value, **kw, **opts)


#: Each broken port as a function of one run's (query, key, value, keywords, options).
BROKEN = {
    "drop_q_descale": lambda q, k, v, kw, o: _sdpa(q, k, v, {**kw, "q_descale": None}, o),
    "drop_k_descale": lambda q, k, v, kw, o: _sdpa(q, k, v, {**kw, "k_descale": None}, o),
    "drop_v_descale": lambda q, k, v, kw, o: _sdpa(q, k, v, {**kw, "v_descale": None}, o),
    "k_descale_twice": lambda q, k, v, kw, o: _sdpa(
        q, k, v, {**kw, "k_descale": kw["k_descale"] ** 2}, o
    ),
    "k_descale_by_query_head": _k_by_query_head,
    "e5m2_for_e4m3": lambda q, k, v, kw, o: _sdpa_e5m2(q, k, v, kw, o),
    "output_in_fp8": lambda q, k, v, kw, o: _sdpa(q, k, v, kw, o).astype(ml_dtypes.float8_e4m3fn),
    "sink_times_k_descale": lambda q, k, v, kw, o: _sdpa(
        q, k, v, kw, {**o, "sinks": o["sinks"] * np.float32(kw["k_descale"][0, 0])}
    ),
}


def _sdpa_e5m2(query, key, value, kw, opts):
    """The fp8 inputs' values taken through e5m2 (its rounding), then the correct call."""
    deq = [_as_e5m2(x) if x.dtype.name == "float8_e4m3fn" else x for x in (query, key, value)]
    q64, k64, v64 = _dequantized64(*deq, {"q_descale": None, **kw})
    out = "bfloat16" if query.dtype.name.startswith("float8") else query.dtype.name
    got = FRAMEWORKS["numpy"].module.scaled_dot_product_attention(
        q64.astype(np.float32), k64.astype(np.float32), v64.astype(np.float32), **opts
    )
    return oracle.rounded(got, out)


#: The run that catches each broken port (a run where the bug changes the answer).
CAUGHT_BY = {
    "drop_q_descale": "e4m3.plain",
    "drop_k_descale": "e4m3.plain",
    "drop_v_descale": "e4m3.bf16_query.causal_sinks",
    "k_descale_twice": "e5m2.window_softcap",
    "k_descale_by_query_head": "e4m3.plain",
    "e5m2_for_e4m3": "e4m3.bf16_query.causal_sinks",
    "output_in_fp8": "e4m3.plain",
    "sink_times_k_descale": "e4m3.bf16_query.causal_sinks",
}


def _caught(got: np.ndarray, golden: np.ndarray, out: str, strict: float) -> bool:
    return got.dtype.name != out or not np.abs(got.astype(np.float64) - golden).max() <= strict


@pytest.mark.parametrize("broken", list(BROKEN))
def test_every_fp8_broken_port_is_caught_by_its_named_run(broken: str) -> None:
    query, key, value, kw, opts, golden, out, bound, strict = _run(CAUGHT_BY[broken])
    assert bound >= strict  # the kernels' practice is the looser one
    got = BROKEN[broken](query, key, value, kw, opts)
    assert _caught(np.asarray(got), golden, out, strict), broken
    right = _sdpa(query, key, value, kw, opts)
    assert not _caught(right, golden, out, strict)


@pytest.mark.parametrize("broken", ["no_saturation", "toward_zero", "e5m2_rounding"])
def test_every_quantize_broken_port_is_caught(broken: str) -> None:
    x = _inputs(np.random.default_rng(5))
    want, _ = FRAMEWORKS["numpy"].module.quantize_fp8(x, descale=1.0)
    quotient = x / np.float32(1.0)
    fake = {
        "no_saturation": lambda: quotient.astype(ml_dtypes.float8_e4m3fn),  # 500 -> NaN
        "toward_zero": lambda: (
            np.vectorize(lambda v: _toward_zero(float(v)))(quotient)
            .astype(np.float32)
            .astype(ml_dtypes.float8_e4m3fn)
        ),
        "e5m2_rounding": lambda: np.clip(_as_e5m2(quotient), -448, 448).astype(
            ml_dtypes.float8_e4m3fn
        ),
    }[broken]()
    assert not np.array_equal(_bytes(fake), _bytes(want))


def _toward_zero(v: float) -> float:
    """v truncated (toward zero) to e4m3fn, saturating."""
    mant, emin = FORMAT["float8_e4m3fn"]
    v = max(-448.0, min(448.0, v))
    if v == 0.0:
        return 0.0
    _, e = math.frexp(abs(v))
    step = 2.0 ** (max(e - 1, emin) - mant)
    return math.copysign(math.floor(abs(v) / step) * step, v)


def test_fp8_bounds_table() -> None:
    """The figures of docs/SEMANTICS.md's fp8 table: both bounds and four broken ports' errors
    on three runs (printed with -s); the strict bound catches each of the four on every run."""
    for name in RUNS:
        query, key, value, kw, opts, golden, _, bound, strict = _run(name)
        errors = {}
        for broken in ("drop_v_descale", "k_descale_twice", "e5m2_for_e4m3",
                       "k_descale_by_query_head"):
            got = np.asarray(BROKEN[broken](query, key, value, kw, opts), np.float64)
            errors[broken] = float(np.abs(got - golden).max())
            if broken != "e5m2_for_e4m3" or RUNS[name][0] == "float8_e4m3fn":
                assert errors[broken] > strict, (name, broken)
        print(
            name,
            f"bound={bound:.3g} strict={strict:.3g}",
            {k: f"{v:.3g}" for k, v in errors.items()},
        )


#: A packed call of three sequences (the second empty) for varlen_attention's fp8 descales.
CU_Q, CU_K = np.array([0, 3, 3, 7], np.int32), np.array([0, 5, 5, 11], np.int32)


def _varlen_fp8(fmt: str, q_dtype: str | None):
    """Packed (T, H|K, D|E) inputs in fp8 (the query in ``q_dtype`` when given) and per-sequence
    descales ``(N, H|K)`` that differ between sequences and within a GQA group."""
    rng = np.random.default_rng(5)
    dt = getattr(ml_dtypes, fmt)
    qf, kf = rng.standard_normal((7, H, D)) * 4, rng.standard_normal((11, K, D)) * 4
    vf = rng.standard_normal((11, K, E)) * 4
    kw = {
        "k_descale": np.array([[0.3, 0.07], [5.0, 5.0], [2.0, 90.0]], np.float32),
        "v_descale": np.array([[1e-2, 3.0], [1.0, 1.0], [40.0, 0.5]], np.float32),
    }
    if q_dtype is None:
        kw["q_descale"] = np.linspace(0.02, 60.0, 3 * H).astype(np.float32).reshape(3, H)
        return qf.astype(dt), kf.astype(dt), vf.astype(dt), kw
    return qf.astype(NP_DTYPES[q_dtype]), kf.astype(dt), vf.astype(dt), kw


@pytest.mark.parametrize(("fmt", "q_dtype"), [("float8_e4m3fn", None), ("float8_e5m2", "bfloat16")])
def test_varlen_fp8_is_each_sequence_with_its_own_descales(fmt: str, q_dtype) -> None:
    """varlen_attention with (N, H|K) descales equals, sequence by sequence, NumPy's
    scaled_dot_product_attention of that sequence's rows with that sequence's descales."""
    query, key, value, kw = _varlen_fp8(fmt, q_dtype)
    out_dtype = "bfloat16" if q_dtype is None else q_dtype
    expected = np.zeros((7, H, E), np.float32)
    for n in range(3):
        rows, keys = slice(CU_Q[n], CU_Q[n + 1]), slice(CU_K[n], CU_K[n + 1])
        if CU_Q[n] == CU_Q[n + 1]:
            continue
        one = {name: d[n] for name, d in kw.items()}
        out = impl_numpy.scaled_dot_product_attention(
            *(np.swapaxes(x, 0, 1) for x in (query[rows], key[keys], value[keys])),
            is_causal=True, **one,
        )
        expected[rows] = np.swapaxes(out, 0, 1).astype(np.float32)
    for fw in FRAMEWORKS.values():
        got = fw.to_numpy(
            fw.module.varlen_attention(query, key, value, CU_Q, CU_K, is_causal=True, **kw)
        )
        assert str(got.dtype) == out_dtype
        assert_agree(got, expected, out_dtype, what=f"{fw.name}: ")
