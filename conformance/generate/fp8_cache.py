"""The fixtures of the modules' fp8 KV cache (conformance/cases/fp8_cache.py):
``decode.fp8_cache.<fmt>.<name>.<chunking>.float32``.

Each fixture stores the module's canonical weights and x rounded to float32, and the decode plan
with ``cache_dtype`` (the fp8 format) and, for a static case, ``k_descale``/``v_descale`` (a
number or a list of K): the runner passes them to ``init_cache``. The golden is the oracle's own
fp8 cache (:func:`conformance.oracle.fp8_cache_decode`, float64 attention over the keys and
values dequantized in float64), one per chunking (a dynamic descale is the first chunk's).

Two bounds, as the ``sdpa.fp8.*`` fixtures (SEMANTICS.md, "Tolerance, two bounds"):
``tolerance``, the strict bound, the v2 rule applied to the same fp8 cache computed in float32
(``round_to="float32"``: projections, rotation, attention), which the project's three
implementations meet; ``kernel_tolerance``, the kernels' practice, for an fp8 cache with a float
query the same computation (the weights are not rounded to fp8), so the same bound.

Checks at generation (else SystemExit): the float32 computation stores the same fp8 values as
the float64 one; every unsaturated quotient is at least ``MIN_MARGIN`` of a grid step from a
rounding boundary (so a port's own float32 rounding cannot flip an fp8 value); a case that must
saturate does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance import cases as C
from conformance.cases.fp8_cache import FORMATS, FP8_CHUNKINGS, MIN_MARGIN, Fp8CacheCall
from conformance.generate.fixtures import (
    Fixture,
    _entry,
    _module_inputs,
    _module_spec,
    _values_fields,
)
from conformance.oracle import fp8_cache_decode, tolerance_bound

__all__ = ["fp8_cache_fixtures"]


def _plan_descale(descale: Any) -> float | list[float] | None:
    """A caller's descale as the plan stores it: a number, or a list of K numbers (float32)."""
    if descale is None or isinstance(descale, float):
        return descale
    return [float(d) for d in np.asarray(descale, np.float32)]


def fp8_cache_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """One fixture per chunking of the case, each with its own golden and bounds."""
    fp8: Fp8CacheCall = case.build(np.random.default_rng(case.seed), dtype)
    c = fp8.module
    fmt = FORMATS[case.name.split(".")[1]]
    weights, inputs = _module_inputs(c, dtype)
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}
    x64 = inputs["x"].astype(np.float64)
    settings = {k: v for k, v in c.options.items() if k in ("rope_theta", "window")}
    out = []
    for chunking in fp8.chunkings:
        plan = FP8_CHUNKINGS[chunking]
        args = dict(fmt=fmt, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, k_descale=fp8.k_descale,
                    v_descale=fp8.v_descale, **settings)
        golden = fp8_cache_decode(w64, x64, plan["chunks"], **args)
        plain = fp8_cache_decode(w64, x64, plan["chunks"], **args, round_to=dtype)
        where = f"decode.{case.name}.{chunking}"
        if not (
            np.array_equal(golden.key, plain.key) and np.array_equal(golden.value, plain.value)
        ):
            raise SystemExit(f"{where}: float32 and float64 projections store other fp8 values")
        if golden.margin < MIN_MARGIN:
            raise SystemExit(f"{where}: a quotient {golden.margin:.2g} steps from a rounding "
                             f"boundary (< {MIN_MARGIN}): change the case's seed_name")
        if fp8.saturates and golden.saturated == 0:
            raise SystemExit(f"{where}: nothing saturates")
        tensors = {**weights, "x": inputs["x"], "output": golden.output}
        strict = {"output": tolerance_bound(golden.output, plain.output, dtype)}
        kernels = dict(strict)  # a float query: the kernels' practice is the strict computation
        case_id = f"decode.{case.name}.{chunking}.{dtype}"
        fields, data = _values_fields(case_id, case, {}, tensors, strict, ["x"], weights)
        doc = fields.pop("doc")
        fields |= {"kernel_tolerance": kernels, "doc": doc}
        decode: dict[str, Any] = {"max_len": plan["max_len"], "chunks": list(plan["chunks"])}
        if plan.get("rolling"):
            decode["rolling"] = True
        if plan.get("page_size"):
            decode["page_size"] = plan["page_size"]
        decode["cache_dtype"] = fmt
        for name in ("k_descale", "v_descale"):
            if getattr(fp8, name) is not None:
                decode[name] = _plan_descale(getattr(fp8, name))
        entry = _entry(case_id, case, dtype, f"{case.name}.{chunking}", **fields,
                       module=_module_spec(c), decode=decode)
        out.append(Fixture(entry, data))
    return out
