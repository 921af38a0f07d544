"""The fixtures of the paged key/value cache cases (Contract v3, conformance/cases/paged.py).

A value case stores its inputs (floats rounded to the case's dtype, NaN in the slots no sequence
holds; the integer arrays as int32) and the float64 golden of
:func:`conformance.oracle.paged_attention`, with the bound of the same loop rounded to the dtype.
Before anything is written, the golden is cross-checked against the contiguous oracle
(:func:`conformance.oracle.attention`, bottom-right) over each sequence's keys gathered here, by
NumPy indexing (:func:`contiguous_check`): two independent readings of the block table must
agree. A ``paged_write`` case stores the caches after the write (exact). Error cases give their
integer inputs with their ``values`` (the value checks need them), the others as shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from conformance import cases as C
from conformance.cases.paged import INTEGER_INPUTS, PAGED_INPUTS, PAGED_WRITE_INPUTS
from conformance.fixtures import encode_keywords
from conformance.generate.fixtures import Fixture, _entry, _expected, _values_fields
from conformance.oracle import (
    attention,
    paged_attention,
    paged_cache_write,
    rounded,
    tolerance_bound,
)

__all__ = ["PAGED_BUILDERS", "PAGED_GROUPS", "contiguous_check"]

#: How far the two readings of the block table may differ (both float64, fsum: rounding only).
AGREE = 1e-13


def _stored(array: Any, dtype: str, name: str) -> np.ndarray:
    """An input as stored: the integer inputs as int32, the floats rounded to ``dtype``."""
    if name in INTEGER_INPUTS:
        return np.asarray(array).astype(np.int32)
    return rounded(array, dtype)


def contiguous_check(inputs: dict[str, np.ndarray], keywords: dict, golden: np.ndarray) -> float:
    """The largest difference between ``golden`` ``(T, H, E)`` and the contiguous oracle run
    per sequence over its keys gathered by NumPy indexing (``key_cache[block_table[n, j //
    page_size], j % page_size]`` for ``j < seq_lens[n]``), bottom-right; raises SystemExit
    when it is more than :data:`AGREE`."""
    as64 = {k: v if v.dtype.kind in "iu" else v.astype(np.float64) for k, v in inputs.items()}
    cu, lens, table = as64["cu_seqlens_q"], as64["seq_lens"], as64["block_table"]
    page_size = as64["key_cache"].shape[1]
    arrays = {name: as64[name] for name in ("sinks", "alibi_slopes") if name in as64}
    worst = 0.0
    for n, s in enumerate(lens.tolist()):
        rows = slice(int(cu[n]), int(cu[n + 1]))
        if rows.stop == rows.start:
            continue
        j = np.arange(s)
        where = (table[n, j // page_size], j % page_size)
        key = as64["key_cache"][where].transpose(1, 0, 2)  # (K, S_n, D)
        value = as64["value_cache"][where].transpose(1, 0, 2)  # (K, S_n, E)
        query = as64["query"][rows].transpose(1, 0, 2)  # (H, L_n, D)
        out = attention(query, key, value, causal_alignment="bottom_right", **keywords,
                        **arrays).output.transpose(1, 0, 2)  # fmt: skip
        worst = max(worst, float(np.max(np.abs(out - golden[rows]), initial=0.0)))
    if not worst <= AGREE:
        raise SystemExit(f"paged golden and contiguous oracle differ by {worst:.3g}")
    return worst


def _paged_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    c = case.build(np.random.default_rng(case.seed), dtype)
    inputs = {name: _stored(getattr(c, name), dtype, name) for name in PAGED_INPUTS}
    inputs |= {name: rounded(a, dtype) for name, a in c.arrays.items()}
    as64 = {k: v if v.dtype.kind in "iu" else v.astype(np.float64) for k, v in inputs.items()}
    args = [as64[name] for name in PAGED_INPUTS]
    arrays = {name: as64[name] for name in c.arrays}
    golden = paged_attention(*args, **c.keywords, **arrays)
    plain = golden if dtype == "float64" else paged_attention(*args, **c.keywords, **arrays,
                                                              round_to=dtype)  # fmt: skip
    contiguous_check(inputs, c.keywords, golden)
    bounds = {"output": tolerance_bound(golden, plain, dtype)}
    case_id = f"paged.{case.name}.{dtype}"
    tensors = {**inputs, "output": golden}
    fields, data = _values_fields(case_id, case, c.keywords, tensors, bounds, inputs)
    return [Fixture(_v3(_entry(case_id, case, dtype, **fields)), data)]


def _paged_write_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    c = case.build(np.random.default_rng(case.seed), dtype)
    inputs = {name: _stored(getattr(c, name), dtype, name) for name in PAGED_WRITE_INPUTS}
    key_out, value_out = paged_cache_write(*(inputs[name] for name in PAGED_WRITE_INPUTS))
    tensors = {**inputs, "key_cache_out": key_out.astype(np.float64),
               "value_cache_out": value_out.astype(np.float64)}  # fmt: skip
    case_id = f"paged_write.{case.name}.{dtype}"
    fields, data = _values_fields(case_id, case, {}, tensors, {}, inputs)
    return [Fixture(_v3(_entry(case_id, case, dtype, **fields)), data)]


def _spec(x: Any) -> dict[str, Any]:
    """An error case's input spec: a :class:`Zeros`' shape and dtype, or an integer array's
    shape, dtype and ``values``."""
    if isinstance(x, C.base.Zeros):
        return {"shape": list(x.shape), "dtype": x.dtype}
    x = np.asarray(x)
    return {"shape": list(x.shape), "dtype": x.dtype.name, "values": x.reshape(-1).tolist()}


def _error_fixtures(inputs: tuple[str, ...]) -> Callable[[C.CaseDef, str], list[Fixture]]:
    def build(case: C.CaseDef, dtype: str) -> list[Fixture]:
        c = case.build()
        specs = {name: _spec(getattr(c, name)) for name in inputs}
        specs |= {name: _spec(a) for name, a in getattr(c, "arrays", {}).items()}
        keywords = getattr(c, "keywords", {})
        entry = _entry(f"{case.op}.error.{case.name}.{dtype}", case, dtype, f"error.{case.name}",
                       keywords=encode_keywords(keywords), inputs=specs,
                       expected_error=_expected(case), doc=case.doc)  # fmt: skip
        return [Fixture(_v3(entry))]

    return build


def _v3(entry: dict) -> dict:
    """The paged cases pin contract v3."""
    entry["contract"] = "v3"
    return entry


#: (op, kind) -> builder, and the manifest's groups, after every other op's.
PAGED_BUILDERS: dict[tuple[str, str], Callable[[C.CaseDef, str], list[Fixture]]] = {
    ("paged", "values"): _paged_fixtures,
    ("paged_write", "values"): _paged_write_fixtures,
    ("paged", "error"): _error_fixtures(PAGED_INPUTS),
    ("paged_write", "error"): _error_fixtures(PAGED_WRITE_INPUTS),
}
PAGED_GROUPS: list[tuple[tuple[str, str], ...]] = [
    (("paged", "values"),),
    (("paged_write", "values"),),
    (("paged", "error"), ("paged_write", "error")),
]
