"""The fixtures of variable-length batches (``varlen``, ``varlen_grad``; Contract v3), and
their cross-checks at generation:

- every forward golden (``oracle.varlen_attention``, its own per-sequence loop) equals the
  contiguous oracle (``oracle.attention``) on each sequence's own rows, heads-first, within the
  case's bound;
- every float64 gradient golden equals central finite differences of the oracle's varlen
  forward on sampled entries of query, key, value and sinks.

A disagreement stops the generator (SystemExit), writing nothing. The registered builders are
:data:`VARLEN_BUILDERS`, in the manifest's order :data:`VARLEN_GROUPS`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from conformance import cases as C
from conformance.cases.varlen import VARLEN_ARRAYS, Packed
from conformance.fixtures import encode_keywords
from conformance.generate.fixtures import Fixture, _entry, _expected, _spec, _values_fields
from conformance.oracle import (
    attention,
    rounded,
    tolerance_bound,
    varlen_attention,
    varlen_attention_vjp,
)

#: The positional arrays of a varlen call, in order.
POSITIONAL = ("query", "key", "value", "cu_seqlens_q", "cu_seqlens_k")
#: (golden name, field of GoldenGrads) of a varlen gradient fixture (no bias).
VARLEN_GRADS = (("dq", "query"), ("dk", "key"), ("dv", "value"), ("dsinks", "sinks"))
#: Finite differences check this many entries of each differentiated input.
FD_SAMPLES, FD_STEP = 6, 1e-6


def _inputs(c: Packed, dtype: str) -> dict[str, np.ndarray]:
    """The call's arrays as stored: query, key, value, sinks and slopes rounded to ``dtype``,
    the boundaries as int32."""
    inputs = {name: rounded(getattr(c, name), dtype) for name in ("query", "key", "value")}
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        inputs[name] = np.asarray(getattr(c, name)).astype(np.int32)
    for name in VARLEN_ARRAYS:
        if name in c.arrays:
            inputs[name] = rounded(c.arrays[name], dtype)
    return inputs


def _as64(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: (v if v.dtype.kind in "iu" else v.astype(np.float64)) for k, v in inputs.items()}


def _refuse(case_id: str, what: str) -> None:
    raise SystemExit(f"refusing to write fixtures: {case_id}: {what}")


def _check_per_sequence(case_id: str, as64: dict, keywords: dict, golden: np.ndarray, bound):
    """The golden against ``oracle.attention`` on each sequence's rows (heads-first)."""
    cu_q, cu_k = as64["cu_seqlens_q"].tolist(), as64["cu_seqlens_k"].tolist()
    arrays = {name: as64[name] for name in VARLEN_ARRAYS if name in as64}
    for n in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[n], cu_q[n + 1]), slice(cu_k[n], cu_k[n + 1])
        heads_first = [as64[x][s].transpose(1, 0, 2) for x, s in
                       (("query", rows), ("key", keys), ("value", keys))]  # fmt: skip
        want = attention(*heads_first, **keywords, **arrays).output.transpose(1, 0, 2)
        err = float(np.max(np.abs(golden[rows] - want), initial=0.0))
        if not err <= bound:
            _refuse(case_id, f"sequence {n} differs from the contiguous oracle by {err:.3g}")


def _varlen_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """One ``varlen_attention`` fixture: the inputs, the golden output and its bound."""
    c = case.build(np.random.default_rng(case.seed), dtype)
    inputs = _inputs(c, dtype)
    as64 = _as64(inputs)
    golden = varlen_attention(**as64, **c.keywords)
    plain = golden if dtype == "float64" else varlen_attention(**as64, **c.keywords,
                                                                round_to=dtype)  # fmt: skip
    bounds = {"output": tolerance_bound(golden, plain, dtype)}
    case_id = f"varlen.{case.name}.{dtype}"
    _check_per_sequence(case_id, as64, c.keywords, golden, bounds["output"])
    tensors = {**inputs, "output": golden}
    fields, data = _values_fields(case_id, case, c.keywords, tensors, bounds, inputs)
    return [Fixture(_entry(case_id, case, dtype, **fields), data)]


def _finite_differences(case_id: str, seed: int, as64: dict, keywords: dict, grads) -> None:
    """Sampled entries of the golden gradients against central differences of the forward."""
    rng = np.random.default_rng(seed)
    do = as64["grad_output"]
    args = {name: as64[name] for name in (*POSITIONAL, *VARLEN_ARRAYS) if name in as64}

    def loss(name: str, x: np.ndarray) -> float:
        return float((varlen_attention(**(args | {name: x}), **keywords) * do).sum())

    for _, field in VARLEN_GRADS:
        if field not in args or args[field].size == 0:
            continue
        x, want = args[field], getattr(grads, field)
        for flat in rng.choice(x.size, size=min(FD_SAMPLES, x.size), replace=False):
            index = np.unravel_index(flat, x.shape)
            up, down = x.copy(), x.copy()
            up[index] += FD_STEP
            down[index] -= FD_STEP
            numeric = (loss(field, up) - loss(field, down)) / (2 * FD_STEP)
            if abs(numeric - want[index]) > 1e-6 * max(1.0, abs(numeric)):
                _refuse(case_id, f"d{field}{tuple(map(int, index))} = {want[index]:.9g}, finite "
                                 f"differences {numeric:.9g}")  # fmt: skip


def _varlen_grad_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """One ``varlen_attention_vjp`` fixture: the inputs, ``grad_output`` (standard normal, drawn
    after the inputs, rounded to the dtype), the golden gradients and a bound per gradient."""
    rng = np.random.default_rng(case.seed)
    c = case.build(rng, dtype)
    inputs = _inputs(c, dtype)
    Tq, H = inputs["query"].shape[:2]
    inputs["grad_output"] = rounded(rng.standard_normal((Tq, H, inputs["value"].shape[2])), dtype)
    as64 = _as64(inputs)
    golden = varlen_attention_vjp(**as64, **c.keywords)
    plain = golden if dtype == "float64" else varlen_attention_vjp(**as64, **c.keywords,
                                                                    round_to=dtype)  # fmt: skip
    case_id = f"varlen_grad.{case.name}.{dtype}"
    if dtype == "float64":
        _finite_differences(case_id, case.seed, as64, c.keywords, golden)
    tensors, bounds = dict(inputs), {}
    for name, field in VARLEN_GRADS:
        want = getattr(golden, field)
        if want is not None:
            tensors[name] = want
            bounds[name] = tolerance_bound(want, getattr(plain, field), dtype)
    fields, data = _values_fields(case_id, case, c.keywords, tensors, bounds, inputs)
    return [Fixture(_entry(case_id, case, dtype, **fields), data)]


def _varlen_error_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """A varlen (or varlen gradient) error case: its inputs as shapes and dtypes (zeros)."""
    c = case.build()
    specs: dict[str, Any] = {name: getattr(c, name) for name in POSITIONAL}
    specs |= dict(c.arrays)
    if case.op == "varlen_grad":
        specs["grad_output"] = c.grad_output
    inputs = {name: _spec(s) for name, s in specs.items() if s is not None}
    entry = _entry(f"{case.op}.error.{case.name}.{dtype}", case, dtype, f"error.{case.name}",
                   keywords=encode_keywords(c.keywords), inputs=inputs,
                   expected_error=_expected(case), doc=case.doc)  # fmt: skip
    return [Fixture(entry)]


#: (op, kind) -> builder, as ``conformance.generate.fixtures.BUILDERS``.
VARLEN_BUILDERS: dict[tuple[str, str], Callable[[C.CaseDef, str], list[Fixture]]] = {
    ("varlen", "values"): _varlen_fixtures,
    ("varlen", "error"): _varlen_error_fixtures,
    ("varlen_grad", "values"): _varlen_grad_fixtures,
    ("varlen_grad", "error"): _varlen_error_fixtures,
}
#: Their groups, after every other in the manifest.
VARLEN_GROUPS: list[tuple[tuple[str, str], ...]] = [
    (("varlen", "values"),),
    (("varlen", "error"),),
    (("varlen_grad", "values"),),
    (("varlen_grad", "error"),),
]
