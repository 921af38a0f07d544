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
import json
import re
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from conformance import cases as C
from conformance.fixtures import read_tensors
from conformance.generate.cross_check import KNOWN_DEVIATIONS, cross_check_case, load_kernels
from conformance.generate.fixtures import BUILDERS, GROUPS
from conformance.oracle import NOISE_FLOOR

__all__ = ["BUILDERS", "GENERATOR_VERSION", "KNOWN_DEVIATIONS", "check", "generate", "main"]

GENERATOR_VERSION = "1.1.0"  # 1.1: inputs of value cases, contract per case
TOLERANCE_RULE = (
    "bound = 2 * max|plain - golden| + noise_floor[dtype] * max(1, max|golden|), rounded up "
    "to two significant digits; 'plain' is the same computation rounded to the case's dtype "
    "after every step; applied to output and weights (max absolute error in float64)"
)
KERNELS = {"torch": "conformance.ports.torch_fused", "jax": "conformance.ports.jax_fused"}


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
    kernels, versions = load_kernels(KERNELS) if cross_check else ({}, {"numpy": np.__version__})
    entries, files, said, refused, checks, verifications = [], {}, {}, [], [], []
    for group in GROUPS:
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
        verdicts = pool.map(
            lambda args: cross_check_case(kernels, *args), checks if kernels else []
        )
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
