"""``python -m conformance --exec CMD``: a port outside the runner's process, over the line
protocol of PORTING.md ("Any language: --exec"), with every runner feature unchanged. The port
here is impl_numpy behind the protocol (exec_numpy_port.py), so any failure is the protocol's."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections import Counter
from pathlib import Path

from conformance import runs_for
from conformance.__main__ import main

NUMPY_PORT = f"{shlex.quote(sys.executable)} {Path(__file__).with_name('exec_numpy_port.py')}"
ALIASES = ("sdpa", "weights", "causal_mask")


def _run(tmp_path: Path, *args: str) -> tuple[int, list[dict]]:
    report = tmp_path / "report.json"
    code = main(["--exec", NUMPY_PORT, "--report", str(report), *args])
    (port,) = json.loads(report.read_text())
    return code, port["outcomes"]


def test_every_sdpa_weights_and_causal_mask_run_passes_over_the_protocol(tmp_path):
    code, outcomes = _run(tmp_path, *(f"--function={a}" for a in ALIASES))
    assert code == 0
    assert Counter(o["status"] for o in outcomes) == {"pass": len(outcomes)}
    want = Counter(r.function for r in runs_for(functions=ALIASES))
    assert Counter(o["run_id"].split(".")[0] for o in outcomes) == want
    assert want == {"sdpa": 230, "weights": 224, "causal_mask": 17}


def test_every_module_and_decode_run_passes_over_the_protocol(tmp_path):
    """Modules and caches live in the process, as handles (PORTING.md, "Modules and caches
    over --exec"): every construct, load, forward, init_cache and decode of the suite."""
    code, outcomes = _run(tmp_path, "--function=module", "--function=decode")
    assert code == 0
    assert Counter(o["status"] for o in outcomes) == {"pass": len(outcomes)}
    want = Counter(r.function for r in runs_for(functions=("module", "decode")))
    assert Counter(o["run_id"].split(".")[0] for o in outcomes) == want
    assert want["module"] > 80 and want["decode"] > 40


def test_a_decode_that_forgets_its_cache_fails_every_run_of_two_steps_or_more(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("EXEC_TEST_FORGET_CACHE", "1")
    code, outcomes = _run(tmp_path, "--function=decode")
    assert code == 1
    failed = {o["run_id"] for o in outcomes if o["status"] == "fail"}
    plans = {r.id: (r.case.kind, r.case.entry["decode"]) for r in runs_for(functions=("decode",))}
    several = {
        i for i, (kind, plan) in plans.items() if kind == "values" and len(plan["chunks"]) > 1
    }
    # and the overflow errors that only the earlier steps' tokens make (each chunk fits alone)
    overflow = {
        i
        for i, (kind, plan) in plans.items()
        if kind == "error" and max(plan["chunks"]) <= plan["max_len"] < sum(plan["chunks"])
    }
    assert "decode.gqa.h6_k2.chunks_2_1_2.float32" in several
    assert overflow == {"decode.error.cache_overflow.float32",
                        "decode.error.cache_overflow_one_token.float32"}
    assert failed == several | overflow


def test_a_crash_and_a_hang_are_one_run_each_and_the_rest_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("EXEC_TEST_CRASH", "sdpa.gqa.h6_k2.float32")
    monkeypatch.setenv("EXEC_TEST_HANG", "weights.gqa.h6_k2.float64")
    monkeypatch.delenv("ROSETTA_EXEC_TIMEOUT", raising=False)
    code, outcomes = _run(
        tmp_path, "-k", "gqa.h6", "--function=sdpa", "--function=weights", "--exec-timeout", "1.5"
    )
    assert code == 1
    by_id = {o["run_id"]: o for o in outcomes}
    crashed = by_id.pop("sdpa.gqa.h6_k2.float32")
    assert crashed["status"] == "crash" and "SIGSEGV" in crashed["message"]
    hung = by_id.pop("weights.gqa.h6_k2.float64")
    assert hung["status"] == "fail" and "timed out after 1.5 s" in hung["message"]
    assert len(by_id) == 12 and {o["status"] for o in by_id.values()} == {"pass"}
    # the 1.5 s was this call's: the next one (the next test's) waits the default again
    assert "ROSETTA_EXEC_TIMEOUT" not in os.environ


def test_xfails_skip_and_list_apply_unchanged(tmp_path, capsys):
    xfails = tmp_path / "port.xfails"
    xfails.write_text("sdpa.gqa.*.float32  # listed, but passes\nskip: weights.gqa.*\n")
    code, outcomes = _run(tmp_path, "-k", "gqa.h6_k2", "--xfails", str(xfails))
    assert code == 1  # the XPASS
    status = {o["run_id"]: o["status"] for o in outcomes}
    assert status["sdpa.gqa.h6_k2.float32"] == "xpass"
    assert status["weights.gqa.h6_k2.float32"] == "skip"
    assert status["sdpa.gqa.h6_k2.float64"] == "pass"
    capsys.readouterr()
    assert main(["--exec", NUMPY_PORT, "--list", "--function", "causal_mask", "-k", "l5_s7"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed == ["causal_mask.top_left.l5_s7.bool", "causal_mask.bottom_right.l5_s7.bool"]
