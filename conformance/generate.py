"""Write the golden fixtures, or prove the committed ones are what this generator makes.

    python -m conformance.generate --out conformance/fixtures/v1      # make fixtures
    python -m conformance.generate --check conformance/fixtures/v1    # make fixtures-check

For every case of :mod:`conformance.cases` and every dtype it lists, the generator

1. builds the float64 inputs from the case's seeded generator and rounds them to the dtype
   (that rounded tensor is what is stored, in its real dtype, so loading is exact);
2. computes the golden output and weights with the float64 oracle (:mod:`conformance.oracle`);
3. computes the same case with the plain same-dtype implementation (the oracle rounding after
   every step) and sets the tolerance bound from its error (SEMANTICS.md's rule);
4. cross-checks the golden against ``torch.nn.functional.scaled_dot_product_attention`` and
   ``jax.nn.dot_product_attention`` (through :mod:`conformance.ports.torch_fused` and
   :mod:`conformance.ports.jax_fused`) on every row with at least one allowed key, wherever the
   framework can express the case, and refuses to write anything if a kernel disagrees beyond
   the bound.

``--check`` regenerates into a temporary folder and compares: the list of files, every
safetensors file byte for byte, and ``manifest.json`` with its ``cross_check`` section left
out. That section records the framework versions and what each kernel said about each case;
it depends on what is installed (torch and jax are optional for generating), so it is not part
of the comparison, and ``--check`` skips the cross-check unless ``--cross-check`` is given
(it takes half a minute, mostly JAX compiling one kernel per case). Everything else is
deterministic: seeds are hashes of the case names, sums are ``math.fsum``, and safetensors'
header order is fixed.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.metadata
import json
import math
import re
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from conformance import cases as C
from conformance.fixtures import (
    ARRAY_KEYWORDS,
    encode_keywords,
    read_tensors,
    sha256_of,
    tensor_bytes,
)
from conformance.oracle import (
    NOISE_FLOOR,
    Golden,
    GoldenGrads,
    attention,
    attention_vjp,
    causal_mask,
    module_forward,
    rotary,
    rounded,
    tolerance_bound,
)

__all__ = ["GENERATOR_VERSION", "check", "generate", "main"]

GENERATOR_VERSION = "1.0.0"
TOLERANCE_RULE = (
    "bound = 2 * max|plain - golden| + noise_floor[dtype] * max(1, max|golden|), rounded up "
    "to two significant digits; 'plain' is the same computation rounded to the case's dtype "
    "after every step; applied to output and weights (max absolute error in float64)"
)
KERNELS = {"torch": "conformance.ports.torch_fused", "jax": "conformance.ports.jax_fused"}

#: Where a kernel is known to compute differently from the contract on rows that do have an
#: allowed key: (kernel, glob over case ids, why). These are recorded, not refused.
KNOWN_DEVIATIONS: list[tuple[str, str, str]] = [
    *(
        (
            "jax",
            f"{op}.*.float64",
            "jax.nn.dot_product_attention always computes the softmax in "
            "float32 (float64 logits are cast down; a float64 bias below -3.4e38 becomes -inf)",
        )
        for op in ("sdpa", "ring")
    ),
    *(
        (kernel, "sdpa.garbage.*", "NaN or inf at keys no query attends leaks into the output "
         "(0 * NaN in weights @ value)")
        for kernel in ("torch", "jax")
    ),
    *(
        (kernel, pattern, "NaN or inf at keys no query attends leaks")
        for kernel in ("torch", "jax")
        for pattern in ("flash.tiling.garbage*", "ring.garbage.*", "grad.garbage.*")
    ),
    # The kernels' own backward (their ports' scaled_dot_product_attention_vjp): JAX's float32
    # softmax, and its rows with no allowed key (uniform weights or NaN), which dK, dV and dbias
    # sum over, so no row can be left out of the comparison as in the forward's.
    ("jax", "grad.*.float64", "jax.nn's softmax is float32, and so is its backward"),
    *(
        ("jax", pattern, "rows with no allowed key are uniform or NaN, and dK, dV sum over them")
        for pattern in ("grad.fully_masked.*", "grad.mask_broadcast.l1.*", "grad.segments.no_key.*")
    ),
]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Cross-check against the frameworks' own kernels
# ---------------------------------------------------------------------------------------------


def _load_kernels() -> tuple[dict[str, Any], dict[str, str]]:
    """The framework ports that import here, and the versions (or why not) of each."""
    from conformance.runner import load_port

    kernels, versions = {}, {"numpy": np.__version__}
    for name, module in KERNELS.items():
        try:
            kernels[name] = load_port(module)
        except ImportError as exc:
            versions[name] = f"not checked: {exc}"
            continue
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "unknown"
    return kernels, versions


def _known_deviation(kernel: str, case_id: str) -> str | None:
    for name, pattern, why in KNOWN_DEVIATIONS:
        if name == kernel and fnmatch.fnmatchcase(case_id, pattern):
            return why
    return None


def _cross_check(
    kernels: dict[str, Any],
    case_id: str,
    inputs: dict[str, np.ndarray],
    keywords: dict[str, Any],
    golden: Golden,
    bounds: dict[str, float],
) -> tuple[dict[str, str], list[str]]:
    """What each kernel says about one case (``agree``, ``n/a: why``, ``known deviation``),
    and the disagreements that must stop the generator."""
    said, disagreements = {}, []
    rows = golden.allowed.any(axis=-1)  # (..., H, L): rows with at least one allowed key
    skipped = int(rows.size - rows.sum())
    for name, port in kernels.items():
        convert = {k: port.from_numpy(v, "cpu") for k, v in inputs.items()}
        extra = {k: convert[k] for k in ARRAY_KEYWORDS if k in convert}
        try:
            out = port.function("sdpa")(
                convert["query"], convert["key"], convert["value"], **extra, **keywords
            )
            weights = port.function("weights")(
                convert["query"], convert["key"], **extra, **keywords
            )
            out, weights = port.to_numpy(out), port.to_numpy(weights)
        except Exception as exc:  # the framework cannot express this case
            first = str(exc).splitlines()[0] if str(exc) else ""
            said[name] = f"n/a: {type(exc).__name__}: {first[:120]}"
            continue
        worst = {}
        for what, got, want in (
            ("output", out, golden.output),
            ("weights", weights, golden.weights),
        ):
            sel = np.broadcast_to(rows, want.shape[:-1])
            with np.errstate(invalid="ignore"):
                diff = np.abs(got.astype(np.float64)[sel] - want[sel])
            diff[np.isnan(want[sel]) & np.isnan(got.astype(np.float64)[sel])] = 0.0  # NaN met
            err = float(np.max(diff, initial=0.0)) if not np.isnan(diff).any() else float("nan")
            worst[what] = err
        known = _known_deviation(name, case_id)
        beyond = [w for w in worst if not worst[w] <= bounds[w]]
        if beyond and known:
            said[name] = f"known deviation: {known}"
            continue
        for what in beyond:
            disagreements.append(
                f"{name} {what}: max error {worst[what]:.3g} > bound {bounds[what]:.3g}"
            )
        note = f" ({skipped} rows with no allowed key not compared)" if skipped else ""
        said[name] = "agree" + note
    return said, disagreements


# ---------------------------------------------------------------------------------------------
# One fixture per case and dtype
# ---------------------------------------------------------------------------------------------


#: Keywords of a flash case that only ``flash_attention`` takes (the oracle has no blocks).
BLOCK_KEYWORDS = ("block_q", "block_k")


def _entry(case_id: str, case: C.CaseDef, dtype: str, name: str | None = None, **fields) -> dict:
    """A manifest entry: what every case has (id, op, feature, variant, kind, functions, dtype,
    seed), then ``fields`` in the order given. ``name`` (default: the case's) is split into
    feature and variant at its first dot."""
    feature, _, variant = (name or case.name).partition(".")
    return {
        "id": case_id,
        "op": case.op,
        "feature": feature,
        "variant": variant,
        "kind": case.kind,
        "functions": list(case.functions),
        "dtype": dtype,
        "seed": case.seed if case.kind == "values" and case.op != "causal_mask" else None,
        **fields,
    }


def _values_fields(
    case_id: str, case: C.CaseDef, keywords: dict, tensors: dict[str, np.ndarray], bounds: dict
) -> tuple[dict, bytes]:
    """The fields of a value entry (keywords, shapes, dtypes, file, sha256, tolerance, doc) and
    its file's bytes."""
    data = tensor_bytes(tensors, case_id)
    fields = {
        "keywords": encode_keywords(keywords),
        "shapes": {k: list(v.shape) for k, v in tensors.items()},
        "dtypes": {k: v.dtype.name for k, v in tensors.items()},
        "file": f"{case_id}.safetensors",
        "sha256": sha256_of(data),
    }
    if bounds:
        fields["tolerance"] = bounds
    fields["doc"] = case.doc
    return fields, data


@dataclass
class Fixture:
    """What one case and dtype make: the manifest entry, the file's bytes (None for an error
    case), and, for an attention case, what the cross-check needs."""

    entry: dict
    data: bytes | None = None
    check: tuple | None = None  # (inputs, semantic keywords, golden, bounds)
    #: a gradient case's cross-check: ``verify(kernels) -> (what each said, disagreements)``
    verify: Callable[[dict[str, Any]], tuple[dict[str, str], list[str]]] | None = None


def _attention_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """One attention fixture: op ``sdpa`` (run against sdpa, weights, flash and the sharded
    functions), ``flash`` (a case with block sizes, run against flash_attention alone; no weights
    stored) or ``ring`` (long enough for several shards, run against the sharded functions; the
    output only, and the shard counts the case was written for)."""
    rng = np.random.default_rng(case.seed)
    c = case.build(rng, dtype)
    inputs = _rounded_inputs(c, dtype)
    as64 = _as64(inputs)

    semantics = {k: v for k, v in c.keywords.items() if k not in BLOCK_KEYWORDS}
    golden = attention(**as64, **semantics)
    plain = golden if dtype == "float64" else attention(**as64, **semantics, round_to=dtype)
    bounds = {
        "output": tolerance_bound(golden.output, plain.output, dtype),
        "weights": tolerance_bound(golden.weights, plain.weights, dtype),
    }
    tensors = {**inputs, "output": golden.output}
    extra = {}
    if case.op == "sdpa":
        tensors["weights"] = golden.weights
        stored = bounds
    elif case.op == "ring":  # the sharded functions return no weights
        stored = {"output": bounds["output"]}
        extra["shards"] = list(case.build.shards)
    else:  # flash: the output and the row log-sum-exp, which is in the compute dtype
        ct = "float64" if dtype == "float64" else "float32"
        plain_lse = golden if ct == "float64" else attention(**as64, **semantics, round_to=ct)
        tensors["lse"] = golden.lse
        stored = {"output": bounds["output"], "lse": tolerance_bound(golden.lse, plain_lse.lse, ct)}
    case_id = f"{case.op}.{case.name}.{dtype}"
    fields, data = _values_fields(case_id, case, c.keywords, tensors, stored)
    entry = _entry(case_id, case, dtype, **fields, **extra)
    return [Fixture(entry, data, (inputs, semantics, golden, bounds))]


def _module_inputs(c: C.base.ModuleCall, dtype: str) -> tuple[dict, dict]:
    """The canonical weights and the call's inputs, rounded to ``dtype`` (bool masks as they
    are): what is stored, and what the oracle computes from."""
    weights = {name: rounded(w, dtype) for name, w in c.weights.items()}
    inputs = {"x": rounded(c.x, dtype)}
    if c.context is not None:
        inputs["context"] = rounded(c.context, dtype)
    if c.mask is not None:
        inputs["mask"] = np.asarray(c.mask, dtype=bool)
    if c.bias is not None:
        inputs["bias"] = rounded(c.bias, dtype)
    for name in ("q_segment_ids", "kv_segment_ids"):
        if getattr(c, name) is not None:
            inputs[name] = np.asarray(getattr(c, name), np.int32)
    return weights, inputs


def _module_goldens(c: C.base.ModuleCall, weights: dict, inputs: dict, dtype: str):
    """The float64 golden of the module call and the plain same-dtype module's result."""
    as64 = {k: (v if v.dtype.kind in "bi" else v.astype(np.float64)) for k, v in inputs.items()}
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}
    semantics = {k: v for k, v in c.keywords.items() if k != "return_weights"}
    args = dict(
        n_heads=c.n_heads,
        n_kv_heads=c.n_kv_heads,
        mask=as64.get("mask"),
        bias=as64.get("bias"),
        q_segment_ids=as64.get("q_segment_ids"),
        kv_segment_ids=as64.get("kv_segment_ids"),
        **semantics,
        **c.options,
    )
    golden = module_forward(w64, as64["x"], as64.get("context"), **args)
    if dtype == "float64":  # rounding to float64 is the identity: plain *is* the golden
        return golden, golden
    plain = module_forward(w64, as64["x"], as64.get("context"), **args, round_to=dtype)
    return golden, plain


def _module_spec(c: C.base.ModuleCall) -> dict[str, Any]:
    """How a port loads the module: class name, then the keywords of ``from_canonical``: the
    head counts and the module's settings (``rope_theta``, ...)."""
    spec: dict[str, Any] = {"class": c.cls, "n_heads": c.n_heads}
    if c.cls != "MultiHeadAttention":
        spec["n_kv_heads"] = c.n_kv_heads
    return spec | c.options


def _module_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    c = case.build(np.random.default_rng(case.seed), dtype)
    weights, inputs = _module_inputs(c, dtype)
    golden, plain = _module_goldens(c, weights, inputs, dtype)
    tensors = {**weights, **inputs, "output": golden.output}
    bounds = {"output": tolerance_bound(golden.output, plain.output, dtype)}
    if c.keywords.get("return_weights"):
        tensors["weights"] = golden.weights
        bounds["weights"] = tolerance_bound(golden.weights, plain.weights, dtype)
    case_id = f"module.{case.name}.{dtype}"
    fields, data = _values_fields(case_id, case, c.keywords, tensors, bounds)
    return [Fixture(_entry(case_id, case, dtype, **fields, module=_module_spec(c)), data)]


def _decode_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """One fixture per chunking of :data:`cases.DECODE_CHUNKINGS`, sharing one golden: the
    module's full causal forward over the whole sequence (self-attention, L = S = T)."""
    c = case.build(np.random.default_rng(case.seed), dtype)
    weights, inputs = _module_inputs(c, dtype)
    golden, plain = _module_goldens(c, weights, inputs, dtype)
    out = []
    plans = dict(C.DECODE_CHUNKINGS)
    if (c.options.get("window") or [None])[0] is not None:  # a window's left side: rolling too
        plans |= C.ROLLING_CHUNKINGS
    for chunking, plan in plans.items():
        tensors = {**weights, "x": inputs["x"], "output": golden.output}
        bounds = {"output": tolerance_bound(golden.output, plain.output, dtype)}
        keywords = {}
        if plan.get("return_weights"):
            keywords["return_weights"] = True
            tensors["weights"] = golden.weights
            bounds["weights"] = tolerance_bound(golden.weights, plain.weights, dtype)
        case_id = f"decode.{case.name}.{chunking}.{dtype}"
        fields, data = _values_fields(case_id, case, keywords, tensors, bounds)
        decode = {"max_len": plan["max_len"], "chunks": list(plan["chunks"])}
        if plan.get("rolling"):
            decode["rolling"] = True
        entry = _entry(case_id, case, dtype, f"{case.name}.{chunking}", **fields,
                       module=_module_spec(c), decode=decode)  # fmt: skip
        out.append(Fixture(entry, data))
    return out


def _rope_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """One ``apply_rotary`` fixture: x rounded to the dtype, positions as int64, the oracle's
    golden and the plain same-dtype computation's bound."""
    c = case.build(np.random.default_rng(case.seed), dtype)
    x = rounded(c.x, dtype)
    positions = np.asarray(c.positions).astype(np.int64)
    golden = rotary(x.astype(np.float64), positions, **c.keywords)
    plain = golden if dtype == "float64" else rotary(x, positions, **c.keywords, round_to=dtype)
    bounds = {"output": tolerance_bound(golden, plain, dtype)}
    case_id = f"rope.{case.name}.{dtype}"
    tensors = {"x": x, "positions": positions, "output": golden}
    fields, data = _values_fields(case_id, case, c.keywords, tensors, bounds)
    return [Fixture(_entry(case_id, case, dtype, **fields), data)]


def _rope_error_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """An ``apply_rotary`` error case: x and positions as shapes and dtypes."""
    c = case.build()
    entry = _entry(f"rope.error.{case.name}.{dtype}", case, dtype, f"error.{case.name}",
                   keywords=encode_keywords(c.keywords),
                   inputs={"x": _spec(c.x), "positions": _spec(c.positions)},
                   expected_error=_expected(case), doc=case.doc)  # fmt: skip
    return [Fixture(entry)]


def _causal_mask_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    keywords = case.build()
    mask = causal_mask(keywords["q_len"], keywords["kv_len"], keywords["alignment"])
    case_id = f"causal_mask.{case.name}.bool"
    fields, data = _values_fields(case_id, case, keywords, {"mask": mask}, {})
    return [Fixture(_entry(case_id, case, dtype, **fields), data)]


def _spec(zeros: C.base.Zeros) -> dict[str, Any]:
    return {"shape": list(zeros.shape), "dtype": zeros.dtype}


def _expected(case: C.CaseDef) -> dict[str, str]:
    error_class, code = case.error
    return {"class": error_class, "code": code}


def _error_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """A functional (or sharded) error case: its inputs as shapes and dtypes (the runner passes
    zeros)."""
    c = case.build()
    inputs = {"query": c.query, "key": c.key, "value": c.value, "mask": c.mask, "bias": c.bias,
              **c.arrays}  # fmt: skip
    inputs = {name: _spec(spec) for name, spec in inputs.items() if spec is not None}
    entry = _entry(f"{case.op}.error.{case.name}.{dtype}", case, dtype, f"error.{case.name}",
                   keywords=encode_keywords(c.keywords), inputs=inputs,
                   expected_error=_expected(case), doc=case.doc)  # fmt: skip
    return [Fixture(entry)]


def _causal_mask_error_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    entry = _entry(f"causal_mask.error.{case.name}.bool", case, dtype, f"error.{case.name}",
                   keywords=encode_keywords(case.build()), inputs={},
                   expected_error=_expected(case), doc=case.doc)  # fmt: skip
    return [Fixture(entry)]


def _module_error_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """A module or decode error case: the call to make and the expected error."""
    c = case.build()
    if c.call == "construct":
        module = {"class": c.cls, "arguments": dict(c.arguments)}
    else:
        module = {"class": c.cls, "n_heads": c.n_heads}
        if c.n_kv_heads is not None:
            module["n_kv_heads"] = c.n_kv_heads
    fields: dict[str, Any] = {"call": c.call, "module": module,
                              "keywords": encode_keywords(c.keywords)}  # fmt: skip
    if c.weights:
        fields["weights"] = {name: _spec(w) for name, w in c.weights.items()}
    if c.inputs:
        fields["inputs"] = {name: _spec(a) for name, a in c.inputs.items()}
    if c.decode:
        fields["decode"] = dict(c.decode)
    fields["expected_error"] = _expected(case)
    fields["doc"] = case.doc
    return [Fixture(_entry(f"{case.op}.error.{case.name}.{dtype}", case, dtype,
                           f"error.{case.name}", **fields))]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Gradient fixtures: the oracle's own backward, cross-checked against the frameworks' autograd
# and against central finite differences of the oracle's forward
# ---------------------------------------------------------------------------------------------

#: (golden name in the fixture, field of AttentionGrads / GoldenGrads, the input it belongs to)
GRAD_NAMES: tuple[tuple[str, str], ...] = (
    ("dq", "query"),
    ("dk", "key"),
    ("dv", "value"),
    ("dbias", "bias"),
    ("dsinks", "sinks"),
)
#: Finite differences check this many entries of each differentiated input, of a case whose
#: scores have at most :data:`FD_MAX_SCORES` entries (the oracle's forward is a Python loop).
FD_SAMPLES, FD_MAX_SCORES = 4, 2000


def _rounded_inputs(c: C.base.Call, dtype: str) -> dict[str, np.ndarray]:
    """A call's arrays as stored: rounded to ``dtype`` (bias to its own dtype, segment ids as
    int32, masks as bool)."""
    inputs = {name: rounded(getattr(c, name), dtype) for name in ("query", "key", "value")}
    if c.mask is not None:
        inputs["mask"] = np.asarray(c.mask, dtype=bool)
    if c.bias is not None:
        inputs["bias"] = rounded(c.bias, c.bias_dtype or dtype)
    for name, array in c.arrays.items():  # segment ids as int32, sinks and slopes in the dtype
        ids = name.endswith("segment_ids")
        inputs[name] = np.asarray(array).astype(np.int32) if ids else rounded(array, dtype)
    return inputs


def _as64(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: (v if v.dtype.kind in "biu" else v.astype(np.float64)) for k, v in inputs.items()}


def _grad_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """One gradient fixture: the call's inputs, ``grad_output`` (standard normal, drawn after
    the inputs from the case's generator, rounded to the dtype) and the golden gradients of
    the oracle's backward, with a bound per gradient from the plain same-dtype backward."""
    rng = np.random.default_rng(case.seed)
    c = case.build(rng, dtype)
    inputs = _rounded_inputs(c, dtype)
    as64 = _as64(inputs)
    semantics = {k: v for k, v in c.keywords.items() if k not in BLOCK_KEYWORDS}
    out = attention(**as64, **semantics).output  # (..., H, L, E): the cotangent's shape
    inputs["grad_output"] = rounded(rng.standard_normal(out.shape), dtype)
    as64["grad_output"] = inputs["grad_output"].astype(np.float64)
    golden = attention_vjp(**as64, **semantics)
    plain = golden if dtype == "float64" else attention_vjp(**as64, **semantics, round_to=dtype)
    tensors, bounds = dict(inputs), {}
    for name, field in GRAD_NAMES:
        want = getattr(golden, field)
        if want is not None:
            tensors[name] = want
            bounds[name] = tolerance_bound(want, getattr(plain, field), dtype)
    case_id = f"{case.op}.{case.name}.{dtype}"
    fields, data = _values_fields(case_id, case, c.keywords, tensors, bounds)

    def verify(kernels: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
        return _grad_cross_check(kernels, case_id, case.seed, as64, semantics, golden, bounds)

    return [Fixture(_entry(case_id, case, dtype, **fields), data, verify=verify)]


def _grad_error_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """A gradient error case: the forward call's inputs and ``grad_output``, as shapes."""
    c, grad_output = case.build()
    inputs = {"query": c.query, "key": c.key, "value": c.value, "mask": c.mask, "bias": c.bias,
              **c.arrays, "grad_output": grad_output}  # fmt: skip
    inputs = {name: _spec(spec) for name, spec in inputs.items() if spec is not None}
    entry = _entry(f"grad.error.{case.name}.{dtype}", case, dtype, f"error.{case.name}",
                   keywords=encode_keywords(c.keywords), inputs=inputs,
                   expected_error=_expected(case), doc=case.doc)  # fmt: skip
    return [Fixture(entry)]


def _grad_errors(got: dict[str, np.ndarray], golden: GoldenGrads) -> dict[str, float]:
    """Max |got - golden| per gradient (NaN counts as NaN)."""
    worst = {}
    for name, field in GRAD_NAMES:
        want = getattr(golden, field)
        if want is None or want.size == 0:
            continue
        with np.errstate(invalid="ignore"):
            diff = np.abs(np.asarray(got[name], np.float64) - want)
        worst[name] = float(np.max(diff)) if not np.isnan(diff).any() else float("nan")
    return worst


def _finite_differences(case_seed: int, as64: dict[str, np.ndarray], semantics: dict,
                        golden: GoldenGrads) -> list[str]:  # fmt: skip
    """Central differences of ``sum(attention(...).output * grad_output)`` (the oracle's
    forward, float64) at :data:`FD_SAMPLES` finite entries of each differentiated input,
    against the oracle's backward: they must agree to 1e-6 of the gradient's scale."""
    rng = np.random.default_rng(case_seed)
    forward = {k: v for k, v in as64.items() if k != "grad_output"}
    do = as64["grad_output"]

    def loss(**changed: np.ndarray) -> float:
        out = attention(**{**forward, **changed}, **semantics).output
        return math.fsum((out * do).ravel().tolist())

    problems = []
    for name, field in GRAD_NAMES:
        want = getattr(golden, field)
        if want is None or want.size == 0:
            continue
        x = forward[field]
        finite = np.flatnonzero(np.isfinite(x))
        scale = max(1.0, float(np.max(np.abs(want))))
        for flat in rng.choice(finite, size=min(FD_SAMPLES, finite.size), replace=False):
            index = np.unravel_index(flat, x.shape)
            eps = 1e-6 * max(1.0, abs(float(x[index])))
            up, down = x.copy(), x.copy()
            up[index] += eps
            down[index] -= eps
            fd = (loss(**{field: up}) - loss(**{field: down})) / (2 * eps)
            if not abs(fd - want[index]) <= 1e-6 * scale:
                problems.append(
                    f"finite differences {name}{tuple(int(i) for i in index)}: {fd!r} against "
                    f"the oracle's {float(want[index])!r}"
                )
    return problems


def _grad_cross_check(kernels: dict[str, Any], case_id: str, seed: int,
                      as64: dict[str, np.ndarray], semantics: dict, golden: GoldenGrads,
                      bounds: dict[str, float]) -> tuple[dict[str, str], list[str]]:  # fmt: skip
    """What each kernel's autograd says about one gradient case, computed in float64 from the
    case's (rounded) inputs, within the case's bounds; and, on small cases, central finite
    differences of the oracle's own forward (recorded as ``finite_differences``)."""
    said, disagreements = {}, []
    n_scores = golden.query.size // max(1, golden.query.shape[-1]) * as64["key"].shape[-2]
    if n_scores <= FD_MAX_SCORES:
        bad = _finite_differences(seed, as64, semantics, golden)
        said["finite_differences"] = "agree" if not bad else "disagree"
        disagreements += bad
    else:
        said["finite_differences"] = f"not run: more than {FD_MAX_SCORES} scores"
    for name, port in kernels.items():
        vjp = getattr(port.module, "scaled_dot_product_attention_vjp", None)
        if vjp is None:
            said[name] = "n/a: the port has no scaled_dot_product_attention_vjp"
            continue
        convert = {k: port.from_numpy(v, "cpu") for k, v in as64.items()}
        extra = {k: convert[k] for k in ARRAY_KEYWORDS if k in convert}
        try:
            grads = vjp(convert["query"], convert["key"], convert["value"],
                        convert["grad_output"], **extra, **semantics)  # fmt: skip
            got = {n: port.to_numpy(grads[i]) for i, (n, f) in enumerate(GRAD_NAMES)
                   if getattr(golden, f) is not None}  # fmt: skip
        except Exception as exc:  # the framework cannot express this case
            first = str(exc).splitlines()[0] if str(exc) else ""
            said[name] = f"n/a: {type(exc).__name__}: {first[:120]}"
            continue
        worst = _grad_errors(got, golden)
        beyond = [w for w in worst if not worst[w] <= bounds[w]]
        known = _known_deviation(name, case_id)
        if beyond and known:
            said[name] = f"known deviation: {known}"
            continue
        disagreements += [f"{name} {w}: max error {worst[w]:.3g} > bound {bounds[w]:.3g}"
                          for w in beyond]  # fmt: skip
        said[name] = "agree"
    return said, disagreements


#: (op, kind) -> the builder of its fixtures, in the order the manifest lists them.
BUILDERS: dict[tuple[str, str], Callable[[C.CaseDef, str], list[Fixture]]] = {
    ("sdpa", "values"): _attention_fixtures,
    ("flash", "values"): _attention_fixtures,
    ("causal_mask", "values"): _causal_mask_fixtures,
    ("module", "values"): _module_fixtures,
    ("decode", "values"): _decode_fixtures,
    ("ring", "values"): _attention_fixtures,
    ("sdpa", "error"): _error_fixtures,
    ("causal_mask", "error"): _causal_mask_error_fixtures,
    ("module", "error"): _module_error_fixtures,
    ("decode", "error"): _module_error_fixtures,
    ("grad", "values"): _grad_fixtures,
    ("flash_grad", "values"): _grad_fixtures,
    ("grad", "error"): _grad_error_fixtures,
    ("ring", "error"): _error_fixtures,
    ("rope", "values"): _rope_fixtures,
    ("rope", "error"): _rope_error_fixtures,
}
#: The groups of the manifest, in order; module and decode errors share one, as registered.
_GROUPS: list[tuple[tuple[str, str], ...]] = [
    (("sdpa", "values"),),
    (("flash", "values"),),
    (("causal_mask", "values"),),
    (("module", "values"),),
    (("decode", "values"),),
    (("sdpa", "error"),),
    (("causal_mask", "error"),),
    (("module", "error"), ("decode", "error")),
    (("grad", "values"),),
    (("flash_grad", "values"),),
    (("grad", "error"),),
    (("ring", "values"),),
    (("ring", "error"),),
    (("rope", "values"),),
    (("rope", "error"),),
]


# ---------------------------------------------------------------------------------------------
# The whole folder
# ---------------------------------------------------------------------------------------------


def generate(
    out: str | Path,
    *,
    cross_check: bool = True,
    verbose: bool = False,
    select: Callable[[C.CaseDef], bool] | None = None,
) -> dict:
    """Write every fixture (of the registered cases ``select`` keeps) and the manifest into
    ``out``; return the manifest.

    Raises SystemExit, writing nothing, when a framework kernel disagrees with a golden.
    """
    out = Path(out)
    kernels, versions = _load_kernels() if cross_check else ({}, {"numpy": np.__version__})
    entries, files, said, refused, checks, verifications = [], {}, {}, [], [], []
    for group in _GROUPS:
        for case in C.REGISTRY:
            if (case.op, case.kind) not in group or (select is not None and not select(case)):
                continue
            for dtype in case.dtypes:
                for fixture in BUILDERS[case.op, case.kind](case, dtype):
                    entries.append(fixture.entry)
                    if fixture.data is not None:
                        files[fixture.entry["file"]] = fixture.data
                    if fixture.check is not None:
                        said[fixture.entry["id"]] = {name: "not checked" for name in KERNELS}
                        checks.append((fixture.entry["id"], *fixture.check))
                    if fixture.verify is not None:
                        said[fixture.entry["id"]] = {name: "not checked" for name in KERNELS}
                        verifications.append((fixture.entry["id"], fixture.verify))
    # Two threads: JAX spends the time compiling one kernel per case, outside the GIL.
    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts = pool.map(lambda args: _cross_check(kernels, *args), checks if kernels else [])
        for (case_id, *_), (verdict, bad) in zip(checks, verdicts):
            said[case_id] = verdict
            refused += [f"{case_id}: {b}" for b in bad]
        # gradient cases: the frameworks' autograd and finite differences (no kernel needed)
        runs = verifications if cross_check else []
        for (case_id, _), (verdict, bad) in zip(runs, pool.map(lambda v: v[1](kernels), runs)):
            said[case_id] = verdict
            refused += [f"{case_id}: {b}" for b in bad]

    ids = [e["id"] for e in entries]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"duplicate case ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    if refused:
        raise SystemExit(
            "refusing to write fixtures: a framework kernel disagrees with the golden\n  "
            + "\n  ".join(refused)
        )

    manifest = {
        "format": "rosetta-attention conformance fixtures",
        "version": "v1",
        "generator_version": GENERATOR_VERSION,
        "contract": "SEMANTICS.md",
        "tolerance_rule": TOLERANCE_RULE,
        "noise_floor": NOISE_FLOOR,
        "cases": entries,
        "cross_check": {
            "versions": versions,
            "rule": "rows with at least one allowed key, output and weights, within the bound",
            "cases": said,
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.safetensors"):
        if stale.name not in files:
            stale.unlink()
    for name, data in files.items():
        (out / name).write_bytes(data)
    (out / "manifest.json").write_text(_dumps(manifest))
    if verbose:
        total = sum(len(d) for d in files.values())
        print(f"wrote {len(entries)} cases, {len(files)} files, {total / 1e6:.2f} MB to {out}")
    return manifest


def _dumps(manifest: dict) -> str:
    """Strict JSON, one key per line, but short lists of numbers or strings on one line."""
    text = json.dumps(manifest, indent=1, allow_nan=False)
    flat = r"\[\s*((?:-?[\d.e+-]+|\"[^\"\n]*\")(?:,\s*(?:-?[\d.e+-]+|\"[^\"\n]*\"))*)\s*\]"
    return re.sub(flat, lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text) + "\n"


def _without_cross_check(text: str) -> dict:
    data = json.loads(text)
    data.pop("cross_check", None)
    return data


def check(folder: str | Path, *, cross_check: bool = False) -> list[str]:
    """Regenerate into a temporary folder; return the differences with ``folder`` (none: ok)."""
    folder = Path(folder)
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(tmp, cross_check=cross_check)
        tmp = Path(tmp)
        have = {p.name for p in folder.iterdir() if p.is_file()}
        want = {p.name for p in tmp.iterdir() if p.is_file()}
        problems += [f"missing: {n}" for n in sorted(want - have)]
        problems += [f"unexpected file: {n}" for n in sorted(have - want)]
        for name in sorted(want & have):
            if name == "manifest.json":
                continue
            if (folder / name).read_bytes() != (tmp / name).read_bytes():
                detail = _tensor_diff(folder / name, tmp / name)
                problems.append(f"differs: {name} ({detail})")
        if "manifest.json" in have:
            old_text = (folder / "manifest.json").read_text()
            if _without_cross_check(old_text) != _without_cross_check(_dumps(fresh)):
                problems.append("differs: manifest.json (outside its cross_check record)")
            elif cross_check and json.loads(old_text).get("cross_check") != fresh["cross_check"]:
                print(
                    "note: manifest.json's cross_check record differs (framework versions or "
                    "their verdicts); not drift. Run `make fixtures` to refresh it."
                )
    return problems


def _tensor_diff(a: Path, b: Path) -> str:
    try:
        ta, tb = read_tensors(a.read_bytes()), read_tensors(b.read_bytes())
    except Exception as exc:
        return f"unreadable: {exc}"
    names = sorted(set(ta) | set(tb))
    diffs = []
    for n in names:
        if n not in ta or n not in tb:
            diffs.append(f"{n} only in one")
        elif ta[n].shape != tb[n].shape or ta[n].dtype != tb[n].dtype:
            diffs.append(f"{n} {ta[n].dtype}{ta[n].shape} vs {tb[n].dtype}{tb[n].shape}")
        elif not np.array_equal(ta[n], tb[n], equal_nan=True):
            err = np.max(np.abs(ta[n].astype(np.float64) - tb[n].astype(np.float64)))
            diffs.append(f"{n} max diff {err:.3g}")
    return ", ".join(diffs) or "header bytes only"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", help="write the fixtures into this folder")
    group.add_argument("--check", help="regenerate and compare with this folder")
    parser.add_argument(
        "--no-cross-check",
        action="store_true",
        help="--out without the torch/jax cross-check (records 'not checked')",
    )
    parser.add_argument(
        "--cross-check",
        action="store_true",
        help="--check with the cross-check too (slower; it is not compared)",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.out:
        generate(args.out, cross_check=not args.no_cross_check, verbose=True)
        print(f"done in {time.perf_counter() - start:.1f} s")
        return 0
    problems = check(args.check, cross_check=args.cross_check)
    for p in problems:
        print(p)
    verdict = "DRIFT: regenerate with `make fixtures` and commit" if problems else "no drift"
    print(f"fixtures-check: {verdict} ({time.perf_counter() - start:.1f} s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
