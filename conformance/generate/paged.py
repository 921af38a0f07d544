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
from conformance.cases.paged import (
    INTEGER_INPUTS,
    PAGED_INPUTS,
    PAGED_WRITE_INPUTS,
    PagedCall,
    slot_sequences,
)
from conformance.fixtures import encode_keywords
from conformance.generate.fixtures import Fixture, _entry, _expected, _values_fields
from conformance.generate.fp8 import _fp8, casts_agree, result_dtype
from conformance.oracle import (
    attention,
    paged_attention,
    paged_cache_write,
    quantize_fp8,
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


def contiguous_check(
    inputs: dict[str, np.ndarray], keywords: dict, golden: np.ndarray, agree: float = AGREE
) -> float:
    """The largest difference between ``golden`` ``(T, H, E)`` and the contiguous oracle run
    per sequence over its keys gathered by NumPy indexing (``key_cache[block_table[n, j //
    page_size], j % page_size]`` for ``j < seq_lens[n]``), bottom-right; raises SystemExit
    when it is more than ``agree`` (default :data:`AGREE`; an fp8 case's outputs of order 100
    pass :data:`AGREE` times their largest magnitude)."""
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
                        **arrays).output.transpose(1, 0, 2)
        worst = max(worst, float(np.max(np.abs(out - golden[rows]), initial=0.0)))
    if not worst <= agree:
        raise SystemExit(f"paged golden and contiguous oracle differ by {worst:.3g}")
    return worst


def _paged_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    c = case.build(np.random.default_rng(case.seed), dtype)
    if c.descales is not None:  # paged.fp8.*
        return [_paged_fp8_fixture(case, dtype, c)]
    inputs = {name: _stored(getattr(c, name), dtype, name) for name in PAGED_INPUTS}
    inputs |= {name: rounded(a, dtype) for name, a in c.arrays.items()}
    as64 = {k: v if v.dtype.kind in "iu" else v.astype(np.float64) for k, v in inputs.items()}
    args = [as64[name] for name in PAGED_INPUTS]
    arrays = {name: as64[name] for name in c.arrays}
    golden = paged_attention(*args, **c.keywords, **arrays)
    plain = golden if dtype == "float64" else paged_attention(*args, **c.keywords, **arrays,
                                                              round_to=dtype)
    contiguous_check(inputs, c.keywords, golden)
    bounds = {"output": tolerance_bound(golden, plain, dtype)}
    case_id = f"paged.{case.name}.{dtype}"
    tensors = {**inputs, "output": golden}
    fields, data = _values_fields(case_id, case, c.keywords, tensors, bounds, inputs)
    return [Fixture(_v3(_entry(case_id, case, dtype, **fields)), data)]


def _paged_fp8_fixture(case: C.CaseDef, fmt: str, c: PagedCall) -> Fixture:
    """One ``paged.fp8.*`` fixture of format ``fmt``, as ``varlen.fp8.*``'s
    (conformance/generate/varlen.py): each query token and each cache slot quantized by the
    oracle's ``quantize_fp8`` at its own sequence's static descale (``axes=(-1,)``), the
    values of every slot a sequence holds cross-checked against ml_dtypes' and torch's casts;
    the slots no sequence holds stay NaN (stored as the format's NaN bytes). Descale arrays are
    stored as float32 inputs, numbers as keywords; sinks float32.

    Golden: ``oracle.paged_attention`` on the stored fp8 arrays with the descales (its gather
    loop dequantizes each row as it reads it, in float64, with its sequence's descale row),
    cross-checked by :func:`contiguous_check` on the caches dequantized here, slot by slot.
    Bounds: ``tolerance`` the strict one (the same loop in float32, rounded once to the result
    dtype); ``kernel_tolerance`` with an all-fp8 call's weights rounded to ``fmt`` before the
    value product (``oracle.attention(..., weights_to=fmt)`` per sequence on the gathered
    keys), never below the strict bound."""
    N = len(c.seq_lens)
    owner = slot_sequences(c)  # (P, page_size): each slot's sequence, -1 for none
    held = owner >= 0
    token_seq = np.repeat(np.arange(N), np.diff(c.cu_seqlens_q))  # (T,): each token's sequence
    inputs: dict[str, np.ndarray] = {}
    deq64: dict[str, np.ndarray] = {}  # the dequantized inputs, for the cross-check
    descales: dict[str, Any] = {}
    for name, dname, rows_of in (("query", "q_descale", token_seq),
                                 ("key_cache", "k_descale", owner),
                                 ("value_cache", "v_descale", owner)):
        raw, d = getattr(c, name), c.descales[dname]
        if name == "query" and c.query_dtype is not None:
            inputs[name] = rounded(raw, c.query_dtype)
            deq64[name] = inputs[name].astype(np.float64)
            continue
        d32 = np.float32(1.0) if d is None else np.asarray(d, np.float32)
        per_sequence = np.broadcast_to(d32, (N, raw.shape[-2]))  # (N, H|K)
        rows = np.where((rows_of >= 0)[..., None], per_sequence[np.maximum(rows_of, 0)],
                        np.float32(1.0))  # (T, H) or (P, page_size, K)
        values, _ = quantize_fp8(raw, fmt, axes=(-1,), descale=rows)
        keep = slice(None) if name == "query" else held  # the NaN slots: no cast to compare
        casts_agree(raw[keep], fmt, rows[keep][..., None], values[keep], case.name)
        if name != "query" and not np.isnan(values[~held]).all():
            raise SystemExit(f"{case.name}: a slot no sequence holds is not NaN in {name}")
        inputs[name] = _fp8(values, fmt)
        deq64[name] = values * rows.astype(np.float64)[..., None]
        descales[dname] = d
    for name in INTEGER_INPUTS:
        if hasattr(c, name) and name != "slot_mapping":
            inputs[name] = np.asarray(getattr(c, name)).astype(np.int32)
    inputs |= {name: np.asarray(a, np.float32) for name, a in c.arrays.items()}
    keywords = dict(c.keywords)
    descale_kw: dict[str, Any] = {}
    for dname, d in descales.items():
        if isinstance(d, np.ndarray):
            inputs[dname] = d.astype(np.float32)
        elif d is not None:
            keywords[dname] = float(d)
        descale_kw[dname] = None if d is None else np.asarray(d, np.float64)
    args = [inputs[name] for name in PAGED_INPUTS]
    arrays = {name: inputs[name].astype(np.float64) for name in c.arrays}
    golden = paged_attention(*args, **c.keywords, **arrays, **descale_kw)
    plain = paged_attention(*args, **c.keywords, **arrays, **descale_kw, round_to="float32")
    checked = {**{n: inputs[n] for n in PAGED_INPUTS}, **deq64, **arrays}
    contiguous_check(checked, c.keywords, golden, AGREE * max(1.0, float(np.abs(golden).max())))
    kernel = plain if c.query_dtype is not None else _weights_in_fp8(checked, c.keywords, fmt)
    out = result_dtype(inputs["query"].dtype.name)

    def bound(want: np.ndarray, got: np.ndarray) -> float:
        return tolerance_bound(want, rounded(got, out).astype(np.float64), out)

    strict = {"output": bound(golden, plain)}
    kernels = {"output": max(strict["output"], bound(golden, kernel))}
    case_id = f"paged.{case.name}.{fmt}"
    tensors = {**inputs, "output": golden}
    fields, data = _values_fields(case_id, case, keywords, tensors, strict, inputs)
    doc = fields.pop("doc")
    fields |= {"kernel_tolerance": kernels, "result_dtype": out, "doc": doc}
    return Fixture(_v3(_entry(case_id, case, fmt, **fields)), data)


def _weights_in_fp8(as64: dict[str, np.ndarray], keywords: dict, fmt: str) -> np.ndarray:
    """The kernels' all-fp8 computation ``(T, H, E)``: per sequence, the contiguous oracle in
    float32 on its dequantized keys gathered by NumPy indexing, the weights rounded to ``fmt``
    before the value product (FlashAttention 3 keeps P in the value's format)."""
    cu, lens, table = as64["cu_seqlens_q"], as64["seq_lens"], as64["block_table"]
    page_size = as64["key_cache"].shape[1]
    arrays = {name: as64[name] for name in ("sinks", "alibi_slopes") if name in as64}
    out = np.zeros((*as64["query"].shape[:2], as64["value_cache"].shape[-1]))
    for n, s in enumerate(lens.tolist()):
        rows = slice(int(cu[n]), int(cu[n + 1]))
        if rows.stop == rows.start:
            continue
        j = np.arange(s)
        where = (table[n, j // page_size], j % page_size)
        one = attention(as64["query"][rows].transpose(1, 0, 2),
                        as64["key_cache"][where].transpose(1, 0, 2),
                        as64["value_cache"][where].transpose(1, 0, 2),
                        causal_alignment="bottom_right", **keywords, **arrays,
                        round_to="float32", weights_to=fmt)
        out[rows] = one.output.transpose(1, 0, 2)
    return out


def _paged_write_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    c = case.build(np.random.default_rng(case.seed), dtype)
    inputs = {name: _stored(getattr(c, name), dtype, name) for name in PAGED_WRITE_INPUTS}
    key_out, value_out = paged_cache_write(*(inputs[name] for name in PAGED_WRITE_INPUTS))
    tensors = {**inputs, "key_cache_out": key_out.astype(np.float64),
               "value_cache_out": value_out.astype(np.float64)}
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
                       expected_error=_expected(case), doc=case.doc)
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
