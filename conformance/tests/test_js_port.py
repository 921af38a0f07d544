"""The JavaScript example port (conformance/ports/js/port.js) through ``--exec``: every sdpa,
weights and causal_mask run passes (its xfails are the modules, which the protocol does not
carry); and broken copies of it (one line changed) fail exactly the runs named for each bug.

Skips when ``node`` is missing, unless ROSETTA_REQUIRE_NODE=1 (set by .ci/run, which installs
node): then a missing node is a failure, not a skip. The two tests that run every sdpa run
through node (about 40 s and 17 s) are marked ``slow``: ``make test-slow``, which CI also runs.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest

from conformance import runs_for
from conformance.__main__ import main

PORT = Path(__file__).resolve().parents[1] / "ports" / "js" / "port.js"
ALIASES = ("sdpa", "weights", "causal_mask")


@pytest.fixture(scope="module")
def node() -> str:
    found = shutil.which("node")
    if found is None:
        why = "node is not installed (Debian: apt-get install nodejs)"
        if os.environ.get("ROSETTA_REQUIRE_NODE") == "1":
            pytest.fail(f"ROSETTA_REQUIRE_NODE=1 but {why}")
        pytest.skip(why)
    return found


def _run(
    node: str, port: Path, tmp_path: Path, *args: str, aliases: tuple[str, ...] = ALIASES
) -> dict[str, dict]:
    """``python -m conformance --exec "node PORT" --function ...`` (sdpa, weights, causal_mask):
    the outcomes by run id."""
    report = tmp_path / f"{port.stem}.json"
    functions = [f"--function={a}" for a in aliases]
    main(["--exec", f"{node} {port}", *functions, "--report", str(report), *args])
    (result,) = json.loads(report.read_text())
    assert result["complete"] and not result["error"]
    return {o["run_id"]: o for o in result["outcomes"]}


def _broken(tmp_path: Path, old: str, new: str, count: int = 1) -> Path:
    """A copy of port.js with ``old`` replaced by ``new`` (found ``count`` times), beside its
    xfails."""
    text = PORT.read_text()
    assert text.count(old) == count, old
    folder = tmp_path / "broken"
    folder.mkdir(exist_ok=True)
    copy = folder / "port.js"
    copy.write_text(text.replace(old, new))
    shutil.copy(PORT.with_suffix(".xfails"), copy.with_suffix(".xfails"))
    return copy


def _failed(outcomes: dict[str, dict]) -> set[str]:
    return {run_id for run_id, o in outcomes.items() if o["status"] not in ("pass", "xfail")}


@pytest.mark.slow
def test_the_js_port_passes_every_run_it_claims(node, tmp_path):
    outcomes = _run(node, PORT, tmp_path)
    want = {r.id for r in runs_for(functions=ALIASES)}
    assert set(outcomes) == want
    assert Counter(o["status"] for o in outcomes.values()) == {
        "pass": 429,
        "xfail": 42,
    }  # xfail: sdpa.fp8.*, the fp8 errors
    by_alias = Counter(run_id.split(".")[0] for run_id in outcomes)
    assert by_alias == {"sdpa": 230, "weights": 224, "causal_mask": 17}
    assert Counter(o["dtype"] for o in outcomes.values())["bfloat16"] == 70
    v2 = [r.id for r in runs_for(functions=ALIASES) if r.case.contract == "v2"]
    assert Counter(i.split(".")[0] for i in v2) == {"sdpa": 55, "weights": 55}  # all passed


@pytest.mark.slow
def test_a_nan_leaking_from_an_unattended_key_is_caught(node, tmp_path):
    """Output summed over every key, 0 * NaN included, instead of over the allowed ones."""
    broken = _broken(tmp_path, "if (!allowed[row * S + j]) continue;", "")
    failed = _failed(_run(node, broken, tmp_path, aliases=("sdpa",)))  # weights read no values
    garbage = {r.id for r in runs_for(functions=["sdpa"]) if r.case.feature == "garbage"}
    assert len(garbage) == 6 and failed == garbage


def test_a_wrong_error_code_is_caught(node, tmp_path):
    """A mask or bias with K heads reported as a shape error, not ``*_kv_heads``."""
    broken = _broken(tmp_path, "fail(`${kind}_kv_heads`", "fail(`${kind}_shape`")
    failed = _failed(_run(node, broken, tmp_path, "-k", "error"))
    assert failed == {
        f"{alias}.error.{kind}_kv_heads.float32"
        for alias in ("sdpa", "weights")
        for kind in ("mask", "bias")
    }


def test_gqa_tiled_h_mod_k_is_caught(node, tmp_path):
    """Query head h reading key/value head ``h % K`` instead of ``h // G``."""
    broken = _broken(tmp_path, "Math.floor(h / G)", "(h % call.K)", count=2)
    outcomes = _run(node, broken, tmp_path, "-k", "gqa")
    grouped = {  # the runs where h % K and h // G differ: 1 < K < H
        r.id
        for r in runs_for(functions=ALIASES)
        if "gqa" in r.id
        and 1 < r.case.entry["shapes"]["key"][-3] < r.case.entry["shapes"]["query"][-3]
    }
    assert "sdpa.gqa.h6_k2.float32" in grouped and "sdpa.gqa.h8_k1.float32" not in grouped
    assert _failed(outcomes) == grouped
