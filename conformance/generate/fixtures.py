"""One fixture per case and dtype: the manifest entry, the file's bytes and what the cross-check
needs, built by one builder per (op, kind) in :data:`BUILDERS`, in the manifest's order
(:data:`GROUPS`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from conformance import cases as C
from conformance.fixtures import encode_keywords, sha256_of, tensor_bytes
from conformance.generate.cross_check import GRAD_NAMES, grad_cross_check, hf_rope_cross_check
from conformance.oracle import (
    attention,
    attention_vjp,
    causal_mask,
    mla_forward,
    module_forward,
    rotary,
    rounded,
    tolerance_bound,
)

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
        "contract": "v3" if case.op in V3_OPS or _fp8(fields) else _contract(fields),
        "seed": case.seed if case.kind == "values" and case.op != "causal_mask" else None,
        **fields,
    }


#: The names that make a case contract v2: the functional keywords and array arguments of v2
#: (SEMANTICS.md), wherever a case gives them (keywords, inputs, canonical weights, a module's
#: settings or constructor arguments), and the module settings v2 added (and its rolling cache).
V2_NAMES = frozenset(("window", "q_segment_ids", "kv_segment_ids", "sinks", "alibi_slopes"))
V2_MODULE_SETTINGS = frozenset(("window", "sinks", "alibi", "softcap", "scale"))
#: The ops of contract v3: every case of theirs pins "v3".
V3_OPS = frozenset(("varlen", "varlen_grad", "quantize"))
#: Contract v3's names (scaled rotary frequencies), and its module class (latent attention).
V3_NAMES = frozenset(("inv_freq", "attention_factor", "rope_inv_freq", "rope_attention_factor"))
V3_MODULES = frozenset(("MultiHeadLatentAttention",))


def _fp8(fields: dict[str, Any]) -> bool:
    """The case is an fp8 case of contract v3: a descale keyword or input, or an fp8 input."""
    inputs = fields.get("inputs", {})
    names = set(fields.get("keywords", {})) | set(inputs)
    fp8 = any(spec.get("dtype", "").startswith("float8") for spec in inputs.values())
    return fp8 or bool(names & {"q_descale", "k_descale", "v_descale"})


def _contract(fields: dict[str, Any]) -> str:
    """The contract version a case pins, ``"v1"``, ``"v2"`` or ``"v3"`` (FORMAT.md,
    "contract"): v3 when it uses any of :data:`V3_NAMES` or a module of :data:`V3_MODULES`; else
    v2 when it uses any of :data:`V2_NAMES` or a module setting of :data:`V2_MODULE_SETTINGS`."""
    module = fields.get("module") or {}
    settings = set(module) | set(module.get("arguments", {}))
    names = set(fields.get("keywords", {})) | set(fields.get("shapes", {}))
    names |= set(fields.get("inputs", {})) | set(fields.get("weights", {})) | settings
    paged = "page_size" in fields.get("decode", {})  # the modules' paged KV cache is v3's
    fp8_cache = {"cache_dtype", "k_descale", "v_descale"} & set(fields.get("decode", {}))
    paged |= bool(fp8_cache)  # and their fp8 KV cache
    if names & V3_NAMES or module.get("class") in V3_MODULES or paged:
        return "v3"
    rolling = bool(fields.get("decode", {}).get("rolling"))  # the rolling KV cache is v2's
    return "v2" if names & V2_NAMES or settings & V2_MODULE_SETTINGS or rolling else "v1"


def _values_fields(
    case_id: str,
    case: C.CaseDef,
    keywords: dict,
    tensors: dict[str, np.ndarray],
    bounds: dict,
    inputs: Iterable[str],
    weights: Iterable[str] = (),
) -> tuple[dict, bytes]:
    """The fields of a value entry (keywords, inputs, weights, shapes, dtypes, file, sha256,
    tolerance, doc) and its file's bytes. ``inputs`` names the stored tensors that are the
    call's array arguments and ``weights`` a module's canonical weights: each listed with its
    shape and dtype, as an error case lists its inputs; the other tensors are the goldens."""
    data = tensor_bytes(tensors, case_id)
    fields: dict[str, Any] = {
        "keywords": encode_keywords(keywords),
        "inputs": {name: _stored(tensors[name]) for name in inputs},
    }
    if weights:
        fields["weights"] = {name: _stored(tensors[name]) for name in weights}
    fields |= {
        "shapes": {k: list(v.shape) for k, v in tensors.items()},
        "dtypes": {k: v.dtype.name for k, v in tensors.items()},
        "file": f"{case_id}.safetensors",
        "sha256": sha256_of(data),
    }
    if bounds:
        fields["tolerance"] = bounds
    fields["doc"] = case.doc
    return fields, data


def _stored(array: np.ndarray) -> dict[str, Any]:
    """A stored tensor's ``{"shape", "dtype"}``, the form of an error case's input spec."""
    return {"shape": list(array.shape), "dtype": array.dtype.name}


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
    if isinstance(c, C.fp8.Fp8Call):  # sdpa.fp8.*: conformance/generate/fp8.py
        from conformance.generate.fp8 import fp8_attention_fixture

        return [fp8_attention_fixture(case, dtype, c)]
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
    fields, data = _values_fields(case_id, case, c.keywords, tensors, stored, inputs)
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
    if c.cls == "MultiHeadLatentAttention":  # the oracle's own MLA (self-attention)
        args = dict(n_heads=c.n_heads, mask=as64.get("mask"), bias=as64.get("bias"),
                    **semantics, **c.options)
        golden = mla_forward(w64, as64["x"], **args)
        plain = golden if dtype == "float64" else mla_forward(w64, as64["x"], **args,
                                                              round_to=dtype)
        return golden, plain
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
    if c.cls not in ("MultiHeadAttention", "MultiHeadLatentAttention"):  # MLA: no K
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
    fields, data = _values_fields(case_id, case, c.keywords, tensors, bounds, inputs, weights)
    return [Fixture(_entry(case_id, case, dtype, **fields, module=_module_spec(c)), data)]


def _decode_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """One fixture per chunking of :data:`cases.DECODE_CHUNKINGS`, sharing one golden: the
    module's full causal forward over the whole sequence (self-attention, L = S = T)."""
    if case.name.startswith("fp8_cache."):  # the modules' fp8 KV cache: goldens of its own
        return fp8_cache_fixtures(case, dtype)
    c = case.build(np.random.default_rng(case.seed), dtype)
    weights, inputs = _module_inputs(c, dtype)
    golden, plain = _module_goldens(c, weights, inputs, dtype)
    out = []
    plans = dict(C.DECODE_CHUNKINGS)
    if (c.options.get("window") or [None])[0] is not None:  # a window's left side: rolling too
        plans |= C.ROLLING_CHUNKINGS
    if case.name in C.PAGED_DECODE_CASES and dtype == C.PAGED_DTYPE:  # a paged cache too (v3)
        plans |= C.PAGED_CHUNKINGS
    for chunking, plan in plans.items():
        tensors = {**weights, "x": inputs["x"], "output": golden.output}
        bounds = {"output": tolerance_bound(golden.output, plain.output, dtype)}
        keywords = {}
        if plan.get("return_weights"):
            keywords["return_weights"] = True
            tensors["weights"] = golden.weights
            bounds["weights"] = tolerance_bound(golden.weights, plain.weights, dtype)
        case_id = f"decode.{case.name}.{chunking}.{dtype}"
        fields, data = _values_fields(case_id, case, keywords, tensors, bounds, ["x"], weights)
        decode = {"max_len": plan["max_len"], "chunks": list(plan["chunks"])}
        if plan.get("rolling"):
            decode["rolling"] = True
        if plan.get("page_size"):
            decode["page_size"] = plan["page_size"]
        entry = _entry(case_id, case, dtype, f"{case.name}.{chunking}", **fields,
                       module=_module_spec(c), decode=decode)
        out.append(Fixture(entry, data))
    return out


def _rope_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """One ``apply_rotary`` fixture: x rounded to the dtype, positions as int64, the oracle's
    golden and the plain same-dtype computation's bound."""
    c = case.build(np.random.default_rng(case.seed), dtype)
    x = rounded(c.x, dtype)
    positions = np.asarray(c.positions).astype(np.int64)
    scaled = {} if c.inv_freq is None else {"inv_freq": np.asarray(c.inv_freq, np.float64)}
    golden = rotary(x.astype(np.float64), positions, **c.keywords, **scaled)
    plain = golden if dtype == "float64" else rotary(x, positions, **c.keywords, **scaled,
                                                     round_to=dtype)
    bounds = {"output": tolerance_bound(golden, plain, dtype)}
    case_id = f"rope.{case.name}.{dtype}"
    tensors = {"x": x, "positions": positions, **scaled, "output": golden}
    inputs = ["x", "positions", *scaled]
    fields, data = _values_fields(case_id, case, c.keywords, tensors, bounds, inputs)
    if c.hf_rope_parameters is None:
        return [Fixture(_entry(case_id, case, dtype, **fields), data)]

    def verify(kernels: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
        rotary_dim = c.keywords.get("rotary_dim", x.shape[-1])
        factor = c.keywords.get("attention_factor", 1.0)
        return hf_rope_cross_check(c.hf_rope_parameters, rotary_dim, scaled["inv_freq"], factor)

    return [Fixture(_entry(case_id, case, dtype, **fields), data, verify=verify)]


def _rope_error_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """An ``apply_rotary`` error case: x and positions as shapes and dtypes."""
    c = case.build()
    entry = _entry(f"rope.error.{case.name}.{dtype}", case, dtype, f"error.{case.name}",
                   keywords=encode_keywords(c.keywords),
                   inputs={"x": _spec(c.x), "positions": _spec(c.positions),
                           **({} if c.inv_freq is None else {"inv_freq": _spec(c.inv_freq)})},
                   expected_error=_expected(case), doc=case.doc)
    return [Fixture(entry)]


def _causal_mask_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    keywords = case.build()
    mask = causal_mask(keywords["q_len"], keywords["kv_len"], keywords["alignment"])
    case_id = f"causal_mask.{case.name}.bool"
    fields, data = _values_fields(case_id, case, keywords, {"mask": mask}, {}, [])
    return [Fixture(_entry(case_id, case, dtype, **fields), data)]


def _spec(zeros: C.base.Zeros | np.ndarray) -> dict[str, Any]:
    """An error case's input spec: a :class:`Zeros`' shape and dtype, or an array given by its
    ``values`` (an fp8 case's descales: zeros would be a ``descale_value`` error of their own)."""
    if isinstance(zeros, np.ndarray):
        return {"shape": list(zeros.shape), "dtype": zeros.dtype.name,
                "values": zeros.reshape(-1).tolist()}
    return {"shape": list(zeros.shape), "dtype": zeros.dtype}


def _expected(case: C.CaseDef) -> dict[str, str]:
    error_class, code = case.error
    return {"class": error_class, "code": code}


def _error_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """A functional (or sharded) error case: its inputs as shapes and dtypes (the runner passes
    zeros)."""
    c = case.build()
    inputs = {"query": c.query, "key": c.key, "value": c.value, "mask": c.mask, "bias": c.bias,
              **c.arrays}
    inputs = {name: _spec(spec) for name, spec in inputs.items() if spec is not None}
    entry = _entry(f"{case.op}.error.{case.name}.{dtype}", case, dtype, f"error.{case.name}",
                   keywords=encode_keywords(c.keywords), inputs=inputs,
                   expected_error=_expected(case), doc=case.doc)
    return [Fixture(entry)]


def _causal_mask_error_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    entry = _entry(f"causal_mask.error.{case.name}.bool", case, dtype, f"error.{case.name}",
                   keywords=encode_keywords(case.build()), inputs={},
                   expected_error=_expected(case), doc=case.doc)
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
        module |= dict(c.arguments)  # a load's other keywords (MLA's qk_rope_head_dim)
    fields: dict[str, Any] = {"call": c.call, "module": module,
                              "keywords": encode_keywords(c.keywords)}
    if c.weights:
        fields["weights"] = {name: _spec(w) for name, w in c.weights.items()}
    fields["inputs"] = {name: _spec(a) for name, a in c.inputs.items()}  # {} for construct, load
    if c.decode:
        fields["decode"] = dict(c.decode)
    fields["expected_error"] = _expected(case)
    fields["doc"] = case.doc
    return [Fixture(_entry(f"{case.op}.error.{case.name}.{dtype}", case, dtype,
                           f"error.{case.name}", **fields))]


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
    fields, data = _values_fields(case_id, case, c.keywords, tensors, bounds, inputs)

    def verify(kernels: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
        return grad_cross_check(kernels, case_id, case.seed, as64, semantics, golden, bounds)

    return [Fixture(_entry(case_id, case, dtype, **fields), data, verify=verify)]


def _grad_error_fixtures(case: C.CaseDef, dtype: str) -> list[Fixture]:
    """A gradient error case: the forward call's inputs and ``grad_output``, as shapes."""
    c, grad_output = case.build()
    inputs = {"query": c.query, "key": c.key, "value": c.value, "mask": c.mask, "bias": c.bias,
              **c.arrays, "grad_output": grad_output}
    inputs = {name: _spec(spec) for name, spec in inputs.items() if spec is not None}
    entry = _entry(f"grad.error.{case.name}.{dtype}", case, dtype, f"error.{case.name}",
                   keywords=encode_keywords(c.keywords), inputs=inputs,
                   expected_error=_expected(case), doc=case.doc)
    return [Fixture(entry)]


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
GROUPS: list[tuple[tuple[str, str], ...]] = [
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

# Variable-length batches (contract v3): their builders live in conformance/generate/varlen.py.
from conformance.generate.varlen import VARLEN_BUILDERS, VARLEN_GROUPS  # noqa: E402

BUILDERS |= VARLEN_BUILDERS
GROUPS += VARLEN_GROUPS

# Paged key/value caches (contract v3): their builders live in conformance/generate/paged.py.
from conformance.generate.paged import PAGED_BUILDERS, PAGED_GROUPS  # noqa: E402

BUILDERS |= PAGED_BUILDERS
GROUPS += PAGED_GROUPS

# FP8 (contract v3): sdpa.fp8.* values and quantize.*, in conformance/generate/fp8.py.
from conformance.generate.fp8 import FP8_GROUPS, QUANTIZE_BUILDERS  # noqa: E402

BUILDERS |= QUANTIZE_BUILDERS
GROUPS += FP8_GROUPS

# The modules' fp8 KV cache (contract v3): decode fixtures with goldens of their own.
from conformance.generate.fp8_cache import fp8_cache_fixtures  # noqa: E402
