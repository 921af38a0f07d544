"""The C example port (conformance/ports/c/port.c) through ``--exec``: compiled with gcc into
pytest's tmp_path, every sdpa, weights and causal_mask run passes (its xfails are the modules,
which the protocol does not carry); and broken copies of it (one line changed) fail exactly the
runs named for each bug.

Skips when gcc or libcjson's header (Debian: libcjson-dev) is missing, unless
ROSETTA_REQUIRE_C=1 (set by .ci/run, which installs both): then a missing one is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conformance import runs_for
from conformance.__main__ import main

PORT = Path(__file__).resolve().parents[1] / "ports" / "c" / "port.c"
ALIASES = ("sdpa", "weights", "causal_mask")
CJSON_HEADER = Path("/usr/include/cjson/cJSON.h")
#: The build, as port.c's first comment gives it (plus the output path).
FLAGS = ("-std=c99", "-O2", "-Wall", "-Wextra", "-pedantic", "-Werror")


@pytest.fixture(scope="module")
def gcc() -> str:
    found = shutil.which("gcc")
    why = None
    if found is None:
        why = "gcc is not installed (Debian: apt-get install gcc)"
    elif not CJSON_HEADER.is_file():
        why = f"libcjson is not installed: no {CJSON_HEADER} (Debian: apt-get install libcjson-dev)"
    if why is not None:
        if os.environ.get("ROSETTA_REQUIRE_C") == "1":
            pytest.fail(f"ROSETTA_REQUIRE_C=1 but {why}")
        pytest.skip(why)
    return found


def _build(gcc: str, source: str, folder: Path) -> Path:
    """``folder/port``, compiled from ``source`` with no warning allowed, beside port.xfails
    (the runner reads ``<binary>.xfails``)."""
    folder.mkdir(exist_ok=True)
    (folder / "port.c").write_text(source)
    binary = folder / "port"
    build = [gcc, *FLAGS, "-o", str(binary), str(folder / "port.c"), "-lcjson", "-lm"]
    done = subprocess.run(build, capture_output=True, text=True)
    assert done.returncode == 0 and not done.stderr, done.stderr
    shutil.copy(PORT.with_suffix(".xfails"), folder / "port.xfails")
    return binary


def _run(
    binary: Path, tmp_path: Path, *args: str, aliases: tuple[str, ...] = ALIASES
) -> dict[str, dict]:
    """``python -m conformance --exec BINARY --function ...``: the outcomes by run id."""
    report = tmp_path / f"{binary.parent.name}.json"
    functions = [f"--function={a}" for a in aliases]
    main(["--exec", str(binary), *functions, "--report", str(report), *args])
    (result,) = json.loads(report.read_text())
    assert result["complete"] and not result["error"]
    return {o["run_id"]: o for o in result["outcomes"]}


def _broken(gcc: str, tmp_path: Path, name: str, old: str, new: str) -> Path:
    """port.c with ``old`` (found once) replaced by ``new``, compiled into ``tmp_path/name``."""
    text = PORT.read_text()
    assert text.count(old) == 1, old
    return _build(gcc, text.replace(old, new), tmp_path / name)


def _failed(outcomes: dict[str, dict]) -> set[str]:
    return {run_id for run_id, o in outcomes.items() if o["status"] not in ("pass", "xfail")}


def test_the_c_port_passes_every_run_it_claims(gcc, tmp_path):
    outcomes = _run(_build(gcc, PORT.read_text(), tmp_path / "port"), tmp_path)
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


def test_a_fully_masked_row_of_nan_is_caught(gcc, tmp_path):
    """A row with no allowed key divided 0 / 0 (NaN weights) instead of left at zeros. Its
    output stays zeros (step 6 sums over allowed keys only, and there are none), and a sink
    makes the denominator nonzero, so exactly the weights runs whose golden has an all-zero row
    and no sink fail."""
    broken = _broken(gcc, tmp_path, "nan_rows", "if (z == 0) continue;", "")
    failed = _failed(_run(broken, tmp_path, aliases=("sdpa", "weights")))
    zero_rows = {
        r.id
        for r in runs_for(functions=["weights"])
        if r.case.kind == "values"
        and r.case.feature != "fp8"  # xfail here (port.xfails: no fp8)
        and "sinks" not in r.case.entry["inputs"]
        and r.case.entry["shapes"]["weights"][-1] > 0
        and (~np.any(r.case.tensors()["weights"] != 0, axis=-1)).any()
    }
    assert "weights.fully_masked.bool_row.float32" in zero_rows
    assert failed == zero_rows


def test_the_top_left_diagonal_for_bottom_right_is_caught(gcc, tmp_path):
    """``causal_alignment="bottom_right"`` read as top-left (offset 0, not S - L): every value
    run that asks for bottom-right with L != S and a rule that reads the diagonal (causal, a
    window, ALiBi's distance) fails; causal_mask has its own offset and passes. (weights shares
    sdpa's steps 1-5, so sdpa alone names the bug; leaving weights out keeps make test short.)"""
    old = 'call->offset = strcmp(call->alignment, "top_left") == 0 ? 0 : S - L;'
    broken = _broken(gcc, tmp_path, "top_left", old, "call->offset = 0;")
    failed = _failed(_run(broken, tmp_path, aliases=("sdpa", "causal_mask")))
    shifted = {
        r.id
        for r in runs_for(functions=["sdpa"])
        if r.case.kind == "values"
        and r.case.feature != "fp8"  # xfail here (port.xfails: no fp8)
        and r.case.keywords.get("causal_alignment") == "bottom_right"
        and r.case.entry["shapes"]["query"][-2] != r.case.entry["shapes"]["key"][-2]
        and (
            r.case.keywords.get("is_causal")
            or r.case.keywords.get("window") is not None
            or "alibi_slopes" in r.case.entry["inputs"]
        )
    }
    assert "sdpa.causal.bottom_right.l5_s7.float32" in shifted
    assert failed == shifted
