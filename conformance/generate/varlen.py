"""The fixtures of variable-length batches (``varlen``, ``varlen_grad``; Contract v3), and
their cross-checks at generation:

- every forward golden (``oracle.varlen_attention``, its own per-sequence loop) equals the
  contiguous oracle (``oracle.attention``) on each sequence's own rows, heads-first, within the
  case's bound;
- every float64 gradient golden equals central finite differences of the oracle's varlen
  forward on sampled entries of query, key, value and sinks;
- with the cross-check on and torch installed, every forward golden without sinks (which
  FlexAttention has no form for) and without NaN inputs equals torch's FlexAttention on CPU in
  float64 with a document ``mask_mod`` at each sequence's positions and diagonal (ALiBi and
  softcap as a ``score_mod``), within the case's bound; recorded as the ``torch`` verdict.

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
from conformance.generate.fp8 import NAMES, _fp8, casts_agree, result_dtype
from conformance.oracle import (
    attention,
    quantize_fp8,
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
                       (("query", rows), ("key", keys), ("value", keys))]
        want = attention(*heads_first, **keywords, **arrays).output.transpose(1, 0, 2)
        err = float(np.max(np.abs(golden[rows] - want), initial=0.0))
        if not err <= bound:
            _refuse(case_id, f"sequence {n} differs from the contiguous oracle by {err:.3g}")


def _flex_attention(as64: dict, keywords: dict) -> np.ndarray:
    """torch FlexAttention of the packed call, float64, ``(Tq, H, E)``: one ``(1, H, T, D)``
    batch whose ``mask_mod`` allows key kj for query qi when both are of one sequence and the
    causal and window rules hold at the positions within it, with its diagonal S_n - L_n
    (bottom-right) or 0."""
    import warnings

    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    cu_q, cu_k = (torch.tensor(np.array(as64[n])).long() for n in ("cu_seqlens_q", "cu_seqlens_k"))
    q, k, v = (torch.tensor(np.array(as64[n])) for n in ("query", "key", "value"))
    Tq, Tk = q.shape[0], k.shape[0]
    seq_q = torch.searchsorted(cu_q, torch.arange(Tq), right=True) - 1
    seq_k = torch.searchsorted(cu_k, torch.arange(Tk), right=True) - 1
    bottom_right = keywords.get("causal_alignment") == "bottom_right"
    offset = (cu_k.diff() - cu_q.diff())[seq_q] if bottom_right else 0 * seq_q
    at_q = torch.arange(Tq) - cu_q[seq_q] + offset  # each query's diagonal key position
    pos_k = torch.arange(Tk) - cu_k[seq_k]
    left, right = keywords.get("window") or (None, None)

    def mask_mod(b, h, qi, kj):
        i, j = at_q[qi], pos_k[kj]
        ok = seq_q[qi] == seq_k[kj]
        if keywords.get("is_causal"):
            ok = ok & (j <= i)
        if left is not None:
            ok = ok & (j >= i - left)
        if right is not None:
            ok = ok & (j <= i + right)
        return ok

    softcap, slopes = keywords.get("softcap"), as64.get("alibi_slopes")
    slopes = None if slopes is None else torch.as_tensor(slopes)

    def score_mod(score, b, h, qi, kj):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if slopes is not None:
            score = score - slopes[h] * (at_q[qi] - pos_k[kj]).abs()
        return score

    with warnings.catch_warnings():  # flex_attention without torch.compile: its reference path
        warnings.simplefilter("ignore")
        block_mask = create_block_mask(mask_mod, None, None, Tq, Tk, device="cpu")
        out = flex_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            score_mod=score_mod, block_mask=block_mask, scale=keywords.get("scale"),
            enable_gqa=True,
        )
    return out[0].transpose(0, 1).numpy()


def _flex_verify(as64: dict, keywords: dict, golden: np.ndarray, bound: float):
    """The ``verify`` of a varlen fixture: FlexAttention's verdict (``torch``) on the golden."""

    def verify(kernels: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
        said = {"torch": "not checked", "jax": "n/a: no varlen form checked"}
        if "torch" not in kernels:
            return said, []
        if "sinks" in as64:
            return said | {"torch": "n/a: FlexAttention has no sink logit"}, []
        if not all(np.isfinite(as64[n]).all() for n in ("query", "key", "value")):
            return said | {"torch": "n/a: NaN inputs (0 * NaN in its weights @ value)"}, []
        err = float(np.max(np.abs(_flex_attention(as64, keywords) - golden), initial=0.0))
        if not err <= bound:
            return said | {"torch": f"disagrees by {err:.3g}"}, [
                f"FlexAttention (document mask_mod) differs by {err:.3g} > {bound:.3g}"
            ]
        return said | {"torch": "agree (FlexAttention, document mask_mod, float64)"}, []

    return verify


def _row_descales(d: Any, cu: np.ndarray, heads: int) -> np.ndarray:
    """A token-major descale (None: 1.0, a number, ``(H|K,)`` or ``(N, H|K)``) as one row per
    packed token, ``(T, H|K)`` float32: each token takes its own sequence's."""
    d32 = np.float32(1.0) if d is None else np.asarray(d, np.float32)
    per_sequence = np.broadcast_to(d32, (len(cu) - 1, heads))
    return np.repeat(per_sequence, np.diff(cu), axis=0)


def _varlen_fp8_fixture(case: C.CaseDef, fmt: str, c: Packed) -> Fixture:
    """One ``varlen.fp8.*`` fixture of format ``fmt``, as ``sdpa.fp8.*``'s
    (conformance/generate/fp8.py): each fp8 input quantized by the oracle's ``quantize_fp8`` at
    its static descale, each token at its own sequence's (``axes=(-1,)``), and cross-checked
    against ml_dtypes' and torch's casts; descale arrays stored as float32 inputs, scalars as
    keywords. Golden: ``oracle.varlen_attention`` with the descales (it dequantizes each
    sequence itself, in float64). Bounds: ``tolerance`` the strict one (a float32 dequantized
    computation rounded once to the result dtype), ``kernel_tolerance`` with the weights of an
    all-fp8 call rounded to ``fmt`` before the value product (``oracle.attention(...,
    weights_to=fmt)`` sequence by sequence), never below the strict bound."""
    cu = {"query": np.asarray(c.cu_seqlens_q), "key": np.asarray(c.cu_seqlens_k)}
    cu["value"] = cu["key"]
    inputs: dict[str, np.ndarray] = {}
    keywords = dict(c.keywords)
    descales: dict[str, Any] = {}
    deq64: dict[str, np.ndarray] = {}  # the dequantized inputs, for the cross-checks
    for name, dname in NAMES:
        raw, d = getattr(c, name), c.descales[dname]
        if name == "query" and c.query_dtype is not None:
            inputs[name] = rounded(raw, c.query_dtype)
            deq64[name] = inputs[name].astype(np.float64)
            continue
        rows = _row_descales(d, cu[name], raw.shape[1])  # (T, H|K)
        values, _ = quantize_fp8(raw, fmt, axes=(-1,), descale=rows)
        casts_agree(raw, fmt, rows[..., None], values, case.name)
        inputs[name] = _fp8(values, fmt)
        deq64[name] = values * rows.astype(np.float64)[..., None]
        descales[dname] = d
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        inputs[name] = np.asarray(getattr(c, name)).astype(np.int32)
    inputs |= {name: np.asarray(a, np.float32) for name, a in c.arrays.items()}
    descale_kw: dict[str, Any] = {}
    for dname, d in descales.items():
        if isinstance(d, np.ndarray):
            inputs[dname] = d.astype(np.float32)
        elif d is not None:
            keywords[dname] = float(d)
        descale_kw[dname] = None if d is None else np.asarray(d, np.float64)
    given = {n: inputs[n] for n in (*POSITIONAL, *VARLEN_ARRAYS) if n in inputs}
    given |= {n: inputs[n].astype(np.float64) for n in VARLEN_ARRAYS if n in inputs}
    golden = varlen_attention(**given, **c.keywords, **descale_kw)
    plain = varlen_attention(**given, **c.keywords, **descale_kw, round_to="float32")
    as64 = {**_as64({n: given[n] for n in given if n not in ("query", "key", "value")}), **deq64}
    kernel = plain
    if c.query_dtype is None:  # all fp8: P rounded to the value's format, sequence by sequence
        kernel = np.zeros_like(plain)
        arrays = {name: as64[name] for name in VARLEN_ARRAYS if name in as64}
        cu_q, cu_k = cu["query"].tolist(), cu["key"].tolist()
        for n in range(len(cu_q) - 1):
            rows_n, keys_n = slice(cu_q[n], cu_q[n + 1]), slice(cu_k[n], cu_k[n + 1])
            heads_first = [as64[x][s].transpose(1, 0, 2) for x, s in
                           (("query", rows_n), ("key", keys_n), ("value", keys_n))]
            one = attention(*heads_first, **c.keywords, **arrays, round_to="float32",
                            weights_to=fmt)
            kernel[rows_n] = one.output.transpose(1, 0, 2)
    out = result_dtype(inputs["query"].dtype.name)

    def bound(want: np.ndarray, got: np.ndarray) -> float:
        return tolerance_bound(want, rounded(got, out).astype(np.float64), out)

    strict = {"output": bound(golden, plain)}
    kernels = {"output": max(strict["output"], bound(golden, kernel))}
    case_id = f"varlen.{case.name}.{fmt}"
    _check_per_sequence(case_id, as64, c.keywords, golden, strict["output"])
    tensors = {**inputs, "output": golden}
    fields, data = _values_fields(case_id, case, keywords, tensors, strict, inputs)
    doc = fields.pop("doc")
    fields |= {"kernel_tolerance": kernels, "result_dtype": out, "doc": doc}
    verify = _flex_verify(as64, c.keywords, golden, strict["output"])
    return Fixture(_entry(case_id, case, fmt, **fields), data, verify=verify)


def _varlen_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """One ``varlen_attention`` fixture: the inputs, the golden output and its bound."""
    c = case.build(np.random.default_rng(case.seed), dtype)
    if c.descales is not None:  # varlen.fp8.*
        return [_varlen_fp8_fixture(case, dtype, c)]
    inputs = _inputs(c, dtype)
    as64 = _as64(inputs)
    golden = varlen_attention(**as64, **c.keywords)
    plain = golden if dtype == "float64" else varlen_attention(**as64, **c.keywords,
                                                                round_to=dtype)
    bounds = {"output": tolerance_bound(golden, plain, dtype)}
    case_id = f"varlen.{case.name}.{dtype}"
    _check_per_sequence(case_id, as64, c.keywords, golden, bounds["output"])
    tensors = {**inputs, "output": golden}
    fields, data = _values_fields(case_id, case, c.keywords, tensors, bounds, inputs)
    verify = _flex_verify(as64, c.keywords, golden, bounds["output"])
    return [Fixture(_entry(case_id, case, dtype, **fields), data, verify=verify)]


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
                                 f"differences {numeric:.9g}")


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
                                                                    round_to=dtype)
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
                   expected_error=_expected(case), doc=case.doc)
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
