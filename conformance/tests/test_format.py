"""conformance/FORMAT.md against the committed manifest: every field it documents exists, no
undocumented field does, every dtype is in its table, the comparison rule as written is the
runner's, and docs/CONFORMANCE.md's run counts are the manifest's."""

from __future__ import annotations

import fnmatch
import json
import math
import re
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conformance import FIXTURES_DIR, FUNCTIONS, load_manifest, runs_for
from conformance.runner.comparison import _compare
from conformance.runner.failures import _Failed

ROOT = Path(__file__).resolve().parents[2]
FORMAT = (ROOT / "conformance" / "FORMAT.md").read_text()
MANIFEST = load_manifest()
ENTRIES = [c.entry for c in MANIFEST.cases]


def _section(title: str, text: str = FORMAT) -> str:
    """The body of the section headed ``title`` (up to the next heading of any level)."""
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#)", text + "\n#", re.M | re.S)
    assert match, f"FORMAT.md has no section {title!r}"
    return match.group(1)


def _rows(title: str) -> list[list[str]]:
    """The body rows of the table in section ``title``, cells stripped."""
    rows = []
    for line in _section(title).splitlines():
        if line.startswith("|") and not line.startswith("| ---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[1:]  # the header row


def _names(title: str, column: int = 0) -> dict[str, list[str]]:
    """The backticked names of ``column`` of the table in ``title``, each with its row."""
    out = {}
    for row in _rows(title):
        for name in re.findall(r"`([^`]+)`", row[column]):
            out[name] = row
    return out


def test_manifest_fields_are_the_documented_ones():
    assert set(MANIFEST.data) == set(_names("Manifest fields"))
    assert set(MANIFEST.data["cross_check"]) == set(_names("`cross_check` fields"))


def _cases_column(cell: str):
    """A predicate over entries from the "cases" cell: ``all``, ``values``, ``errors``, or ops
    (backticked), optionally with a kind."""
    ops = set(re.findall(r"`(\w+)`", cell))
    kind = "values" if "values" in cell else "error" if "error" in cell else None

    def applies(entry: dict) -> bool:
        return (not ops or entry["op"] in ops) and (kind is None or entry["kind"] == kind)

    return applies


def test_case_fields_are_the_documented_ones():
    documented = _names("Case fields")
    present = set().union(*(set(e) for e in ENTRIES))
    assert present == set(documented), (
        f"undocumented: {sorted(present - set(documented))}, "
        f"documented but absent: {sorted(set(documented) - present)}"
    )
    for name, row in documented.items():
        if row[1] == "all":
            missing = [e["id"] for e in ENTRIES if name not in e]
            assert not missing, f"{name} is documented for all cases; missing in {missing[:3]}"
        else:
            applies = _cases_column(row[1])
            wrong = [e["id"] for e in ENTRIES if name in e and not applies(e)]
            assert not wrong, f"{name} is documented for {row[1]} only; found in {wrong[:3]}"


def _specs():
    for e in ENTRIES:
        for field in ("inputs", "weights"):
            yield from e.get(field, {}).values()
        yield from e.get("decode", {}).get("cache_from", {}).get("weights", {}).values()


def test_nested_fields_are_the_documented_ones():
    assert {k for s in _specs() for k in s} == set(_names("Input specs"))
    errors = [e["expected_error"] for e in ENTRIES if "expected_error" in e]
    assert {k for x in errors for k in x} == set(_names("`expected_error` fields"))
    classes = re.findall(r"`(\w+Error)`", _rows("`expected_error` fields")[0][1])
    assert {x["class"] for x in errors} == set(classes)
    modules = [e["module"] for e in ENTRIES if "module" in e]
    assert {k for m in modules for k in m} == set(_names("`module` fields"))
    decodes = [e["decode"] for e in ENTRIES if "decode" in e]
    assert {k for d in decodes for k in d} == set(_names("`decode` fields"))


def test_value_cases_list_their_inputs_and_the_rest_are_goldens():
    text = _section("Case fields")
    goldens = set(re.findall(r"`(\w+)`", text[text.index("The goldens of a value case") :]))
    for e in ENTRIES:
        if e["kind"] != "values":
            continue
        arguments = set(e["inputs"]) | set(e.get("weights", {}))
        assert arguments <= set(e["shapes"]), e["id"]
        for name in arguments:
            spec = e["inputs"].get(name) or e["weights"][name]
            assert spec == {"shape": e["shapes"][name], "dtype": e["dtypes"][name]}, e["id"]
        assert set(e["shapes"]) - arguments <= goldens, e["id"]
        assert set(e.get("tolerance", {})) <= set(e["shapes"]) - arguments, e["id"]


def _header(path: Path) -> dict:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n])


def test_every_dtype_is_in_the_table_with_its_safetensors_tag():
    table = {row[0].strip("`"): row[1].strip("`") for row in _rows("Dtypes")}
    names = {e["dtype"] for e in ENTRIES} | {s["dtype"] for s in _specs()} - {"none"}
    names |= {d for e in ENTRIES for d in e.get("dtypes", {}).values()}
    assert names <= set(table), f"not in FORMAT.md's dtype table: {sorted(names - set(table))}"
    for e in ENTRIES:
        if e["kind"] != "values":
            continue
        header = _header(FIXTURES_DIR / e["file"])
        assert header["__metadata__"] == {"case": e["id"]}
        for name, dtype in e["dtypes"].items():
            assert header[name]["dtype"] == table[dtype], (e["id"], name)
            assert header[name]["shape"] == e["shapes"][name], (e["id"], name)


def test_keywords_are_typed_json_as_documented():
    non_finite = set(re.findall(r'\{"float": "([^"]+)"\}', _section("The keyword encoding")))
    assert non_finite == {"inf", "-inf", "nan"}

    def check(value, where):
        if isinstance(value, dict):
            assert set(value) == {"float"} and value["float"] in non_finite, where
        elif isinstance(value, list):
            for item in value:
                check(item, where)
        else:
            assert value is None or isinstance(value, bool | int | float | str), where

    for e in ENTRIES:
        for name, value in e["keywords"].items():
            check(value, (e["id"], name))
        for name, value in e.get("module", {}).get("arguments", {}).items():
            check(value, (e["id"], name))


def test_contract_versions_as_documented():
    """The globs FORMAT.md gives select exactly the v2 and v3 cases (a v1 port's xfails), the
    v3 globs exactly the v3 cases (a v2 port's); 55 of the 230 sdpa runs are v2, 22 v3 (fp8)."""
    globs = re.findall(r"`([\w.]*\*[\w.*]*)`", _section("Contract versions"))
    v3_globs = ["*inv_freq*", "*attention_factor*", "*.mla.*", "*.error.mla_*"]
    v3_globs += ["*.rope_scaled.*"]  # the modules' rope_inv_freq / rope_attention_factor
    v3_globs += ["*.fp8.*", "*.error.fp8_*"]  # fp8 inputs and descales (quantize: its own op)
    v3_globs += ["*.paged.*", "*.error.paged_cache_*"]  # the modules' paged KV cache
    v3_globs += ["*.fp8_cache.*"]  # the modules' fp8 KV cache (its errors: *.error.fp8_*)
    assert len(globs) >= 9 and set(v3_globs) <= set(globs), globs
    assert {e["contract"] for e in ENTRIES} == {"v1", "v2", "v3"}
    v3_ops = {"varlen", "varlen_grad", "paged", "paged_write", "quantize"}
    assert all(e["contract"] == "v3" for e in ENTRIES if e["op"] in v3_ops)
    for run in runs_for(MANIFEST):
        if run.case.op in v3_ops:  # contract v3's own ops (FORMAT.md): no v1 or v2 port has them
            continue
        listed = any(fnmatch.fnmatchcase(run.id, g) for g in globs)
        assert listed == (run.case.contract != "v1"), run.id
        in_v3 = any(fnmatch.fnmatchcase(run.id, g) for g in v3_globs)
        assert in_v3 == (run.case.contract == "v3"), run.id
    sdpa = runs_for(MANIFEST, ["sdpa"])
    assert Counter(r.case.contract for r in sdpa) == {"v1": 153, "v2": 55, "v3": 22}


def _documented_compare(got: np.ndarray, golden: np.ndarray, bound: float) -> bool:
    """FORMAT.md's comparison rule, steps 3-5, written from the document alone."""
    if golden.size == 0:
        return True
    worst = 0.0
    for r, g in zip(got.astype(np.float64).flat, golden.astype(np.float64).flat):
        if math.isinf(g):
            err = 0.0 if r == g else math.inf
        elif math.isnan(g):
            err = 0.0 if math.isnan(r) else math.inf
        else:
            err = math.inf if not math.isfinite(r) else abs(r - g)
        worst = max(worst, err)
    return worst <= bound


VALUES = [0.0, -0.0, 1.0, 1.0 + 1e-7, 1.0 + 1e-5, math.inf, -math.inf, math.nan, -2.5]


@pytest.mark.parametrize("bound", [0.0, 1e-6])
def test_the_comparison_rule_as_written_is_the_runners(bound):
    for g in VALUES:
        for r in VALUES:
            got, golden = np.array([r], np.float32), np.array([g])
            try:
                _compare(got, golden, "float32", bound, "output")
                passed = True
            except _Failed:
                passed = False
            assert passed == _documented_compare(got, golden, bound), (r, g, bound)


def test_conformance_md_run_counts_are_the_manifests():
    """docs/CONFORMANCE.md's counts of runs per alias, and its totals, from runs_for."""
    text = (ROOT / "docs" / "CONFORMANCE.md").read_text()
    start = text.index("runs per implementation")
    paragraph = text[text.rindex("\n\n", 0, start) : text.index("\n\n", start)]
    counts = Counter(r.function for r in runs_for(MANIFEST))
    said = {alias: int(n) for n, alias in re.findall(r"(\d+)\s+`(\w+)`", paragraph)}
    assert set(said) == set(FUNCTIONS), f"aliases without a count: {set(FUNCTIONS) - set(said)}"
    assert said == {alias: counts[alias] for alias in said}
    every = ("sdpa", "weights", "causal_mask", "flash", "module", "decode", "rope")
    total = sum(counts[a] for a in every)
    assert f"That is {total} runs per implementation" in paragraph
    assert f"`apply_rotary` has\n{total - counts['flash'] - counts['rope']}." in paragraph
    sharded = sum(
        counts[a]
        for a in ("ring", "ring_zigzag", "head_parallel", "head_parallel_gqa", "ulysses", "usp")
    )
    assert f"adds {sharded} sharded runs" in paragraph
    assert f"adds {counts['grad'] + counts['flash_grad']} gradient runs" in paragraph
