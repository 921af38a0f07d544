"""The fixtures of the FP8 cases (Contract v3, conformance/cases/fp8.py).

An ``sdpa.fp8.*`` value case stores its fp8 inputs as their bytes (safetensors ``F8_E4M3`` /
``F8_E5M2``): each quantized by :func:`conformance.oracle.quantize_fp8` at its static descale
over its length and head-dim axes (saturating), a float query rounded to its dtype, the descale
arrays as float32 inputs (scalars are keywords), sinks float32. The golden is
:func:`conformance.oracle.attention` in float64 on the inputs dequantized in float64
(:func:`conformance.oracle.dequantized`). Two bounds (SEMANTICS.md, "Tolerance, two bounds"):

- ``tolerance`` (what the runner uses by default): the strict bound, the v2 rule applied to a
  correct float32 dequantized computation (``round_to="float32"``) rounded once to the result
  dtype; impl_numpy, impl_torch and impl_jax meet it;
- ``kernel_tolerance`` (output only; a port opts in, conformance/FORMAT.md): the kernels'
  practice, for an all-fp8 call the weights rounded to the value's fp8 format before the value
  product (FlashAttention 3), for a float query the same as the strict computation; never below
  the strict bound.

Cross-checks at generation: every stored fp8 value (the oracle's own rounding,
:func:`conformance.oracle.fp8_rounded`) must equal ``ml_dtypes``' cast and torch's cast of the
same saturated float32 quotient (:func:`casts_agree`, else the generator stops); the golden of
an ``sdpa.fp8.*`` case goes to the frameworks' kernels on the dequantized inputs in float64, as
every sdpa golden does (conformance/generate/cross_check.py).

``result_dtype`` is bfloat16 for an fp8 query, else the query's dtype. A ``quantize.*`` case
stores x in its dtype (and a static descale array); its goldens, ``output`` (the fp8 values)
and ``output_descale``, are the oracle's ``quantize_fp8``, in float64 like every golden, and
compared exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from conformance import cases as C
from conformance.cases.fp8 import Fp8Call, QuantizeCall
from conformance.fixtures import encode_keywords
from conformance.generate.fixtures import Fixture, _entry, _expected, _spec, _values_fields
from conformance.oracle import attention, dequantized, quantize_fp8, rounded, tolerance_bound

__all__ = ["FP8_GROUPS", "QUANTIZE_BUILDERS", "fp8_attention_fixture", "result_dtype"]

NAMES = (("query", "q_descale"), ("key", "k_descale"), ("value", "v_descale"))


def result_dtype(query_dtype: str) -> str:
    """The dtype of the output and the weights: bfloat16 for an fp8 query (FlashAttention 3)."""
    return "bfloat16" if query_dtype.startswith("float8") else query_dtype


def _fp8(values: np.ndarray, fmt: str) -> np.ndarray:
    """float64 values exactly representable in ``fmt`` as an array of that dtype."""
    return values.astype(np.float32).astype(getattr(ml_dtypes, fmt))


def casts_agree(
    x: np.ndarray, fmt: str, descale: np.ndarray, values: np.ndarray, where: str
) -> None:
    """The oracle's fp8 values of ``x`` at ``descale`` (broadcast to x) against ``ml_dtypes``'
    cast and torch's (when torch imports) of the saturated float32 quotient; SystemExit when
    either differs by a single value."""
    bound = float(ml_dtypes.finfo(getattr(ml_dtypes, fmt)).max)
    quotient = np.clip(np.asarray(x).astype(np.float32) / descale, -bound, bound)
    casts = {"ml_dtypes": quotient.astype(getattr(ml_dtypes, fmt)).astype(np.float64)}
    try:
        import torch
    except ImportError:  # the ml_dtypes check alone
        torch = None
    if torch is not None:
        cast = torch.from_numpy(np.ascontiguousarray(quotient)).to(getattr(torch, fmt))
        casts["torch"] = cast.to(torch.float64).numpy()
    for name, got in casts.items():
        if not np.array_equal(got, values):
            bad = int(np.sum(got != values))
            raise SystemExit(
                f"{where}: {name}'s {fmt} cast differs from the oracle's in {bad} values"
            )


def fp8_attention_fixture(case: C.CaseDef, fmt: str, c: Fp8Call) -> Fixture:
    """One ``sdpa.fp8.*`` fixture of format ``fmt`` (its key and value; the query's too unless
    ``c.query_dtype``)."""
    inputs: dict[str, np.ndarray] = {}
    keywords = dict(c.keywords)
    descales: dict[str, Any] = {}
    for name, dname in NAMES:
        raw, d = getattr(c, name), c.descales[dname]
        if name == "query" and c.query_dtype is not None:
            inputs[name] = rounded(raw, c.query_dtype)
            continue
        d32 = np.float32(1.0) if d is None else np.asarray(d, np.float32)
        batch = raw.shape[:-2]
        values, _ = quantize_fp8(raw, fmt, axes=(-2, -1), descale=np.broadcast_to(d32, batch))
        casts_agree(raw, fmt, np.broadcast_to(d32, batch)[..., None, None], values, case.name)
        inputs[name] = _fp8(values, fmt)
        descales[dname] = d
    if c.mask is not None:
        inputs["mask"] = np.asarray(c.mask, bool)
    inputs |= {name: np.asarray(a, np.float32) for name, a in c.arrays.items()}
    for dname, d in descales.items():
        if isinstance(d, np.ndarray):
            inputs[dname] = d.astype(np.float32)
        elif d is not None:
            keywords[dname] = float(d)
    q64, k64, v64 = (dequantized(inputs[n], descales.get(d)) for n, d in NAMES)
    extra = {"mask": inputs.get("mask"), **{n: inputs[n].astype(np.float64) for n in c.arrays}}
    golden = attention(q64, k64, v64, **extra, **c.keywords)
    plain = attention(q64, k64, v64, **extra, **c.keywords, round_to="float32")
    all_fp8 = c.query_dtype is None
    kernel = attention(q64, k64, v64, **extra, **c.keywords, round_to="float32",
                       weights_to=fmt if all_fp8 else None)
    out = result_dtype(inputs["query"].dtype.name)

    def bound(want: np.ndarray, got: np.ndarray) -> float:
        return tolerance_bound(want, rounded(got, out).astype(np.float64), out)

    strict = {"output": bound(golden.output, plain.output),
              "weights": bound(golden.weights, plain.weights)}
    kernels = {"output": max(strict["output"], bound(golden.output, kernel.output))}
    tensors = {**inputs, "output": golden.output, "weights": golden.weights}
    case_id = f"sdpa.{case.name}.{fmt}"
    fields, data = _values_fields(case_id, case, keywords, tensors, strict, inputs)
    doc = fields.pop("doc")
    fields |= {"kernel_tolerance": kernels, "result_dtype": out, "doc": doc}
    checked = {"query": q64, "key": k64, "value": v64}  # the kernels' float64 cross-check
    checked |= {k: v for k, v in extra.items() if v is not None}
    check = (checked, c.keywords, golden, strict)
    return Fixture(_entry(case_id, case, fmt, **fields), data, check)


def _quantize_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """A ``quantize.*`` value case: x rounded to ``dtype`` and the oracle's exact answer."""
    c: QuantizeCall = case.build(np.random.default_rng(case.seed), dtype)
    x = rounded(c.x, dtype)
    inputs = {"x": x}
    if c.descale is not None:
        inputs["descale"] = np.asarray(c.descale, np.float32)
    keywords = dict(c.keywords)
    fmt = keywords.get("dtype", "float8_e4m3fn")
    axes = keywords.get("axes", (-2, -1))
    axes = (axes,) if isinstance(axes, int) else tuple(axes)
    given = inputs.get("descale", keywords.get("descale"))
    values, d = quantize_fp8(x.astype(np.float64) if dtype == "float64" else x, fmt, axes, given)
    keep = tuple(
        1 if a % x.ndim in {b % x.ndim for b in axes} else n for a, n in enumerate(x.shape)
    )
    casts_agree(x, fmt, d.reshape(keep), values, case.name)
    tensors = {**inputs, "output": values, "output_descale": d.astype(np.float64)}
    case_id = f"quantize.{case.name}.{dtype}"
    fields, data = _values_fields(case_id, case, keywords, tensors, {}, inputs)
    return [Fixture(_entry(case_id, case, dtype, **fields), data)]


def _quantize_error_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """A ``quantize.error.*`` case: x (zeros, or its values) and a static descale array."""
    c: QuantizeCall = case.build()
    specs = {"x": _spec(c.x)}
    if c.descale is not None:
        specs["descale"] = _spec(c.descale)
    if isinstance(c.x, np.ndarray):
        specs["x"]["dtype"] = dtype
    entry = _entry(f"quantize.error.{case.name}.{dtype}", case, dtype, f"error.{case.name}",
                   keywords=encode_keywords(c.keywords), inputs=specs,
                   expected_error=_expected(case), doc=case.doc)
    return [Fixture(entry)]


#: (op, kind) -> builder of the quantize cases (the sdpa.fp8.* values go through the sdpa
#: builder, which hands an :class:`Fp8Call` to :func:`fp8_attention_fixture`), and their groups.
QUANTIZE_BUILDERS: dict[tuple[str, str], Callable[[C.CaseDef, str], list[Fixture]]] = {
    ("quantize", "values"): _quantize_fixtures,
    ("quantize", "error"): _quantize_error_fixtures,
}
FP8_GROUPS: list[tuple[tuple[str, str], ...]] = [
    (("quantize", "values"),),
    (("quantize", "error"),),
]
