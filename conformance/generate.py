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
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from conformance import cases as C
from conformance.fixtures import (
    NP_DTYPES,
    encode_keywords,
    read_tensors,
    sha256_of,
    tensor_bytes,
)
from conformance.oracle import (
    NOISE_FLOOR,
    Golden,
    attention,
    causal_mask,
    module_forward,
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
    (
        "jax",
        "sdpa.*.float64",
        "jax.nn.dot_product_attention always computes the softmax in "
        "float32 (float64 logits are cast down; a float64 bias below -3.4e38 becomes -inf)",
    ),
]


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
        extra = {k: convert[k] for k in ("mask", "bias") if k in convert}
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


def _sdpa_fixture(
    case: C.SdpaCase, dtype: str, op: str = "sdpa"
) -> tuple[dict, bytes, dict, dict, Golden, dict]:
    """One attention fixture: ``op`` is ``sdpa`` (runs against sdpa, weights and flash) or
    ``flash`` (a case with block sizes, run against flash_attention alone; no weights stored).
    Returns the entry, the file's bytes, the oracle's keywords, the inputs, the golden and the
    bounds of output and weights (the cross-check compares both)."""
    rng = np.random.default_rng(case.seed)
    c = case.build(rng, dtype)
    dt = NP_DTYPES[dtype]
    inputs = {
        "query": np.asarray(c.query, np.float64).astype(dt),
        "key": np.asarray(c.key, np.float64).astype(dt),
        "value": np.asarray(c.value, np.float64).astype(dt),
    }
    if c.mask is not None:
        inputs["mask"] = np.asarray(c.mask, dtype=bool)
    if c.bias is not None:
        inputs["bias"] = np.asarray(c.bias, np.float64).astype(dt)
    as64 = {k: (v if v.dtype == bool else v.astype(np.float64)) for k, v in inputs.items()}

    semantics = {k: v for k, v in c.keywords.items() if k not in BLOCK_KEYWORDS}
    golden = attention(**as64, **semantics)
    plain = golden if dtype == "float64" else attention(**as64, **semantics, round_to=dtype)
    bounds = {
        "output": tolerance_bound(golden.output, plain.output, dtype),
        "weights": tolerance_bound(golden.weights, plain.weights, dtype),
    }
    tensors = {**inputs, "output": golden.output}
    if op == "sdpa":
        tensors["weights"] = golden.weights
    case_id = f"{op}.{case.name}.{dtype}"
    data = tensor_bytes(tensors, case_id)
    feature, _, variant = case.name.partition(".")
    entry = {
        "id": case_id,
        "op": op,
        "feature": feature,
        "variant": variant,
        "kind": "values",
        "functions": ["sdpa", "weights", "flash"] if op == "sdpa" else ["flash"],
        "dtype": dtype,
        "seed": case.seed,
        "keywords": encode_keywords(c.keywords),
        "shapes": {k: list(v.shape) for k, v in tensors.items()},
        "dtypes": {k: v.dtype.name for k, v in tensors.items()},
        "file": f"{case_id}.safetensors",
        "sha256": sha256_of(data),
        "tolerance": bounds if op == "sdpa" else {"output": bounds["output"]},
        "doc": case.doc,
    }
    return entry, data, semantics, inputs, golden, bounds


def _module_inputs(c: C.ModuleCall, dtype: str) -> tuple[dict, dict]:
    """The canonical weights and the call's inputs, rounded to ``dtype`` (bool masks as they
    are): what is stored, and what the oracle computes from."""
    dt = NP_DTYPES[dtype]
    weights = {name: np.asarray(w, np.float64).astype(dt) for name, w in c.weights.items()}
    inputs = {"x": np.asarray(c.x, np.float64).astype(dt)}
    if c.context is not None:
        inputs["context"] = np.asarray(c.context, np.float64).astype(dt)
    if c.mask is not None:
        inputs["mask"] = np.asarray(c.mask, dtype=bool)
    if c.bias is not None:
        inputs["bias"] = np.asarray(c.bias, np.float64).astype(dt)
    return weights, inputs


def _module_goldens(c: C.ModuleCall, weights: dict, inputs: dict, dtype: str):
    """The float64 golden of the module call and the plain same-dtype module's result."""
    as64 = {k: (v if v.dtype == bool else v.astype(np.float64)) for k, v in inputs.items()}
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}
    semantics = {k: v for k, v in c.keywords.items() if k != "return_weights"}
    args = dict(
        n_heads=c.n_heads,
        n_kv_heads=c.n_kv_heads,
        mask=as64.get("mask"),
        bias=as64.get("bias"),
        **semantics,
    )
    golden = module_forward(w64, as64["x"], as64.get("context"), **args)
    if dtype == "float64":  # rounding to float64 is the identity: plain *is* the golden
        return golden, golden
    plain = module_forward(w64, as64["x"], as64.get("context"), **args, round_to=dtype)
    return golden, plain


def _module_spec(c: C.ModuleCall) -> dict[str, Any]:
    """How a port loads the module: class name and the head counts for ``from_canonical``."""
    spec: dict[str, Any] = {"class": c.cls, "n_heads": c.n_heads}
    if c.cls != "MultiHeadAttention":
        spec["n_kv_heads"] = c.n_kv_heads
    return spec


def _module_fixture(case: C.ModuleCase, dtype: str) -> tuple[dict, bytes]:
    c = case.build(np.random.default_rng(case.seed), dtype)
    weights, inputs = _module_inputs(c, dtype)
    golden, plain = _module_goldens(c, weights, inputs, dtype)
    tensors = {**weights, **inputs, "output": golden.output}
    bounds = {"output": tolerance_bound(golden.output, plain.output, dtype)}
    if c.keywords.get("return_weights"):
        tensors["weights"] = golden.weights
        bounds["weights"] = tolerance_bound(golden.weights, plain.weights, dtype)
    case_id = f"module.{case.name}.{dtype}"
    data = tensor_bytes(tensors, case_id)
    entry = _values_entry(case_id, "module", case, dtype, c.keywords, tensors, bounds, data)
    entry["module"] = _module_spec(c)
    return entry, data


def _decode_fixtures(case: C.DecodeCase, dtype: str) -> list[tuple[dict, bytes]]:
    """One fixture per chunking of :data:`cases.DECODE_CHUNKINGS`, sharing one golden: the
    module's full causal forward over the whole sequence (self-attention, L = S = T)."""
    c = case.build(np.random.default_rng(case.seed), dtype)
    weights, inputs = _module_inputs(c, dtype)
    golden, plain = _module_goldens(c, weights, inputs, dtype)
    out = []
    for chunking, plan in C.DECODE_CHUNKINGS.items():
        tensors = {**weights, "x": inputs["x"], "output": golden.output}
        bounds = {"output": tolerance_bound(golden.output, plain.output, dtype)}
        keywords = {}
        if plan.get("return_weights"):
            keywords["return_weights"] = True
            tensors["weights"] = golden.weights
            bounds["weights"] = tolerance_bound(golden.weights, plain.weights, dtype)
        case_id = f"decode.{case.name}.{chunking}.{dtype}"
        data = tensor_bytes(tensors, case_id)
        entry = _values_entry(case_id, "decode", case, dtype, keywords, tensors, bounds, data)
        entry["variant"] = f"{entry['variant']}.{chunking}"
        entry["module"] = _module_spec(c)
        entry["decode"] = {"max_len": plan["max_len"], "chunks": list(plan["chunks"])}
        out.append((entry, data))
    return out


def _values_entry(
    case_id: str,
    op: str,
    case: Any,
    dtype: str,
    keywords: dict,
    tensors: dict[str, np.ndarray],
    bounds: dict[str, float],
    data: bytes,
) -> dict:
    """The manifest entry of a module or decode fixture (``data``: its file's bytes)."""
    feature, _, variant = case.name.partition(".")
    return {
        "id": case_id,
        "op": op,
        "feature": feature,
        "variant": variant,
        "kind": "values",
        "functions": [op],
        "dtype": dtype,
        "seed": case.seed,
        "keywords": encode_keywords(keywords),
        "shapes": {k: list(v.shape) for k, v in tensors.items()},
        "dtypes": {k: v.dtype.name for k, v in tensors.items()},
        "file": f"{case_id}.safetensors",
        "sha256": sha256_of(data),
        "tolerance": bounds,
        "doc": case.doc,
    }


def _causal_mask_fixture(alignment: str, q_len: int, kv_len: int) -> tuple[dict, bytes]:
    case_id = f"causal_mask.{alignment}.l{q_len}_s{kv_len}.bool"
    mask = causal_mask(q_len, kv_len, alignment)
    data = tensor_bytes({"mask": mask}, case_id)
    entry = {
        "id": case_id,
        "op": "causal_mask",
        "feature": alignment,
        "variant": f"l{q_len}_s{kv_len}",
        "kind": "values",
        "functions": ["causal_mask"],
        "dtype": "bool",
        "seed": None,
        "keywords": {"q_len": q_len, "kv_len": kv_len, "alignment": alignment},
        "shapes": {"mask": list(mask.shape)},
        "dtypes": {"mask": "bool"},
        "file": f"{case_id}.safetensors",
        "sha256": sha256_of(data),
        "doc": f"causal_mask({q_len}, {kv_len}, alignment={alignment!r}): j <= i + offset.",
    }
    return entry, data


def _error_entry(case: C.ErrorCase) -> dict:
    c = case.build()
    inputs = {"query": c.query, "key": c.key, "value": c.value, "mask": c.mask, "bias": c.bias}
    inputs = {
        name: {"shape": list(spec.shape), "dtype": spec.dtype}
        for name, spec in inputs.items()
        if spec is not None
    }
    return {
        "id": f"sdpa.error.{case.name}.{c.query.dtype}",
        "op": "sdpa",
        "feature": "error",
        "variant": case.name,
        "kind": "error",
        "functions": list(case.functions),
        "dtype": c.query.dtype,
        "seed": None,
        "keywords": encode_keywords(c.keywords),
        "inputs": inputs,
        "expected_error": {"class": case.error_class, "code": case.code},
        "doc": case.doc,
    }


def _spec(zeros: C.Zeros) -> dict[str, Any]:
    return {"shape": list(zeros.shape), "dtype": zeros.dtype}


def _module_error_entry(case: C.ModuleErrorCase) -> dict:
    c = case.build()
    op = case.op
    if c.call == "construct":
        module = {"class": c.cls, "arguments": dict(c.arguments)}
    else:
        module = {"class": c.cls, "n_heads": c.n_heads}
        if c.n_kv_heads is not None:
            module["n_kv_heads"] = c.n_kv_heads
    entry = {
        "id": f"{op}.error.{case.name}.float32",
        "op": op,
        "feature": "error",
        "variant": case.name,
        "kind": "error",
        "functions": [op],
        "dtype": "float32",
        "seed": None,
        "call": c.call,
        "module": module,
        "keywords": encode_keywords(c.keywords),
    }
    if c.weights:
        entry["weights"] = {name: _spec(w) for name, w in c.weights.items()}
    if c.inputs:
        entry["inputs"] = {name: _spec(a) for name, a in c.inputs.items()}
    if c.decode:
        entry["decode"] = dict(c.decode)
    entry["expected_error"] = {"class": case.error_class, "code": case.code}
    entry["doc"] = case.doc
    return entry


def _causal_mask_error_entry(name: str, keywords: dict, error_class: str, code: str) -> dict:
    return {
        "id": f"causal_mask.error.{name}.bool",
        "op": "causal_mask",
        "feature": "error",
        "variant": name,
        "kind": "error",
        "functions": ["causal_mask"],
        "dtype": "bool",
        "seed": None,
        "keywords": encode_keywords(keywords),
        "inputs": {},
        "expected_error": {"class": error_class, "code": code},
        "doc": f"causal_mask({', '.join(f'{k}={v!r}' for k, v in keywords.items())}) raises.",
    }


# ---------------------------------------------------------------------------------------------
# The whole folder
# ---------------------------------------------------------------------------------------------


def generate(out: str | Path, *, cross_check: bool = True, verbose: bool = False) -> dict:
    """Write every fixture and the manifest into ``out``; return the manifest.

    Raises SystemExit, writing nothing, when a framework kernel disagrees with a golden.
    """
    out = Path(out)
    kernels, versions = _load_kernels() if cross_check else ({}, {"numpy": np.__version__})
    entries, files, said, refused = [], {}, {}, []

    checks = []
    attention_cases = [("sdpa", c) for c in C.SDPA_CASES] + [("flash", c) for c in C.FLASH_CASES]
    for op, case in attention_cases:
        for dtype in case.dtypes:
            entry, data, semantics, inputs, golden, bounds = _sdpa_fixture(case, dtype, op)
            entries.append(entry)
            files[entry["file"]] = data
            said[entry["id"]] = {name: "not checked" for name in KERNELS}
            checks.append((entry["id"], inputs, semantics, golden, bounds))
    # Two threads: JAX spends the time compiling one kernel per case, outside the GIL.
    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts = pool.map(lambda args: _cross_check(kernels, *args), checks if kernels else [])
        for (case_id, *_), (verdict, bad) in zip(checks, verdicts):
            said[case_id] = verdict
            refused += [f"{case_id}: {b}" for b in bad]
    for alignment, q_len, kv_len in C.CAUSAL_MASK_CASES:
        entry, data = _causal_mask_fixture(alignment, q_len, kv_len)
        entries.append(entry)
        files[entry["file"]] = data
    for case in C.MODULE_CASES:
        for dtype in case.dtypes:
            entry, data = _module_fixture(case, dtype)
            entries.append(entry)
            files[entry["file"]] = data
    for case in C.DECODE_CASES:
        for dtype in case.dtypes:
            for entry, data in _decode_fixtures(case, dtype):
                entries.append(entry)
                files[entry["file"]] = data
    entries += [_error_entry(case) for case in C.ERROR_CASES]
    entries += [_causal_mask_error_entry(*row) for row in C.CAUSAL_MASK_ERROR_CASES]
    entries += [_module_error_entry(case) for case in C.MODULE_ERROR_CASES]

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
