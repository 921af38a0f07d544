"""onnxruntime's kernels through the suite: their deviations are exactly their xfails.

``conformance/ports/onnxruntime_attention*.xfails`` list where the ONNX ``Attention`` operator at
opsets 23, 24 and 25, run by onnxruntime's CPU provider, differs from the contract. Every
``sdpa`` and ``weights`` run of each opset runs here (a session per run, seconds in all), and
the measured differences between the opsets are pinned by id and by their numbers.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.runner import Outcome, Report, run_suite

_PORTS = ("onnxruntime_attention_23", "onnxruntime_attention_24", "onnxruntime_attention")


@functools.cache
def _report(port: str) -> Report:
    pytest.importorskip("onnxruntime")
    return run_suite(f"conformance.ports.{port}", functions=["sdpa", "weights"])


def _outcome(port: str, run_id: str) -> Outcome:
    (outcome,) = [o for o in _report(port).outcomes if o.run_id == run_id]
    return outcome


@pytest.mark.parametrize("port", _PORTS)
def test_onnxruntime_deviations_are_exactly_the_xfails(port: str) -> None:
    report = _report(port)
    print(report.table())
    assert report.ok, "\n".join(o.line() for o in report.failures) or report.error
    counts = report.counts()
    assert counts["pass"] > 0 and counts["xfail"] > 0


@pytest.mark.parametrize("port", _PORTS[:2])
def test_a_finfo_min_row_is_zeros_at_opsets_23_and_24(port: str) -> None:
    """The float32/float16 kernel of opsets 23 and 24 gives a row whose bias is finfo.min at
    every key zeros; the contract (and opset 25's function body) gives its equal scores
    uniform weights 1/S."""
    for dtype in ("float32", "float16"):
        run_id = f"weights.fully_masked.huge_negative_bias_row.{dtype}"
        outcome = _outcome(port, run_id)
        assert outcome.status == "xfail" and "expected 0.14285714285714285, got 0.0" in (
            outcome.message
        ), outcome.line()
        assert _outcome("onnxruntime_attention", run_id).status == "pass"


@pytest.mark.parametrize("port", _PORTS)
def test_boolean_fully_masked_rows_are_zeros_at_every_opset(port: str) -> None:
    assert _outcome(port, "weights.fully_masked.bool_row.float32").status == "pass"
    assert _outcome(port, "weights.fully_masked.neg_inf_bias_row.float32").status == "pass"


def test_the_window_attributes_are_top_left_at_opset_25() -> None:
    port = "onnxruntime_attention"
    assert _outcome(port, "sdpa.window.left_only.float32").status == "pass"
    assert _outcome(port, "sdpa.window.both.bottom_right.float32").status == "xfail"
    early = _outcome("onnxruntime_attention_24", "sdpa.window.left_only.float32")
    assert early.status == "xfail" and "no window attributes at opset 24" in early.message


def test_the_opset_23_kernel_refuses_scale_zero() -> None:
    """ "scale must be greater than 0 if specified", when the session builds the kernel."""
    outcome = _outcome("onnxruntime_attention_23", "sdpa.scale.zero.float32")
    assert outcome.status == "xfail", outcome.line()
    assert "Exception during initialization" in outcome.message
    assert "::Attention(" in outcome.message  # the CPU kernel's constructor
    assert _outcome("onnxruntime_attention", "sdpa.scale.zero.float32").status == "pass"


_PEERS = Path(__file__).resolve().parents[2] / "docs" / "peers"


def test_the_finfo_min_reproduction_still_shows_the_opsets_disagreeing() -> None:
    """docs/peers/onnxruntime_finfo_min_rows.py, run as a user would: it exits 1 while the
    opset-23/24 kernel's rows are zeros (a fix upstream makes this test fail: update the
    xfails, the table and the script's docstring)."""
    pytest.importorskip("onnxruntime")
    script = _PEERS / "onnxruntime_finfo_min_rows.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last == "not uniform: onnxruntime, opset 23, onnxruntime, opset 24", done.stdout
