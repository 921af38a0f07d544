"""onnxruntime's kernels through the suite: their deviations are exactly their xfails.

``conformance/ports/onnxruntime_attention*.xfails`` list where the ONNX ``Attention`` operator at
opsets 23, 24 and 25, run by onnxruntime's CPU provider, differs from the contract, and
``onnxruntime_gqa.xfails`` where ``com.microsoft.GroupQueryAttention`` does (its ``do_rotary``
as ``apply_rotary`` too: every ``rope`` run). Every ``sdpa`` and
``weights`` run of each port runs here, and the Attention ports' ``varlen`` and ``paged`` runs (a
session per run, seconds in all); the measured
differences between the opsets, and GroupQueryAttention's window, are pinned by their numbers,
and the reproductions in docs/peers/ are run as a user would run them.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.runner import Outcome, Report, run_suite

_PORTS = (
    "onnxruntime_attention_23",
    "onnxruntime_attention_24",
    "onnxruntime_attention",
    "onnxruntime_gqa",
)


@functools.cache
def _report(port: str) -> Report:
    pytest.importorskip("onnxruntime")
    packed = ["varlen", "paged"] if port != "onnxruntime_gqa" else []  # the Attention ports'
    return run_suite(f"conformance.ports.{port}", functions=["sdpa", "weights", *packed])


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


@pytest.mark.parametrize("port", _PORTS[:3])
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


# com.microsoft.GroupQueryAttention


def test_gqa_causal_is_the_past_caches_bottom_right() -> None:
    """With S > L the first S - L keys are the past cache: causal is bottom-right (passes) and
    top-left cannot be asked for; L > S is refused."""
    port = "onnxruntime_gqa"
    assert _outcome(port, "sdpa.causal.bottom_right.l5_s7.float32").status == "pass"
    assert _outcome(port, "sdpa.causal.top_left.l5_s7.float32").status == "xfail"
    longer = _outcome(port, "sdpa.causal.top_left.l7_s5.float32")
    assert longer.status == "xfail" and "same sequence length" in longer.message


def test_gqa_sinks_and_softcap_follow_the_contract() -> None:
    port = "onnxruntime_gqa"
    for run_id in (
        "sdpa.sinks.basic.float32",
        "weights.sinks.basic.float16",
        "sdpa.sinks.with_mask_and_softcap.float32",
        "sdpa.softcap.cap2_neg_inf_bias.float32",
    ):
        assert _outcome(port, run_id).status == "pass", run_id


def test_gqa_rows_with_no_allowed_key_are_nan_and_scale_zero_is_the_default() -> None:
    port = "onnxruntime_gqa"
    nan = _outcome(port, "weights.fully_masked.bool_row.float32")
    assert nan.status == "xfail" and "got nan" in nan.message
    zero = _outcome(port, "weights.scale.zero.float32")  # 1/S expected, a real softmax got
    assert zero.status == "xfail" and "expected 0.14285714285714285" in zero.message


def test_gqa_window_keeps_one_key_fewer_than_opset_25() -> None:
    """local_window_size=2 with bottom-right causal: the key two places left of the diagonal
    (weight 0.83 in the contract's row) gets 0; opset 25's left_window_size=2 keeps it."""
    outcome = _outcome("onnxruntime_gqa", "weights.window.causal.bottom_right.float32")
    assert outcome.status == "xfail" and "expected 0.83" in outcome.message
    assert outcome.message.split("got ")[1].startswith("0.0")
    opset_25 = _outcome("onnxruntime_attention", "weights.window.left_only.float32")
    assert opset_25.status == "pass"


def test_the_gqa_window_reproduction_still_shows_one_key_fewer() -> None:
    pytest.importorskip("onnxruntime")
    script = _PEERS / "onnxruntime_gqa_window_off_by_one.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "W = 2: GroupQueryAttention keys [4, 5], Attention (opset 25) keys [3, 4, 5]" in (
        done.stdout
    )


def test_gqa_do_rotary_is_the_contracts_rope_at_non_negative_positions() -> None:
    """``apply_rotary`` through ``do_rotary=1`` (cos/sin caches, ``position_ids`` behind a one-key
    past cache, the rotated keys read from ``present_key``): every rope run is exactly the
    xfails, float16 at 1e5 positions passes, a negative position is refused."""
    pytest.importorskip("onnxruntime")
    report = run_suite("conformance.ports.onnxruntime_gqa", functions=["rope"])
    assert report.ok, "\n".join(o.line() for o in report.failures) or report.error
    status = {o.run_id: o for o in report.outcomes}
    for run_id in (
        "rope.half.d12.float32",
        "rope.interleaved.d12.float16",
        "rope.partial.interleaved.r6_d12.float32",
        "rope.positions.per_example.float32",
        "rope.positions.large_1e5.float16",
        "rope.inv_freq.yarn.interleaved.r8_d12.float32",
    ):
        assert status[run_id].status == "pass", run_id
    negative = status["rope.positions.negative.float32"]
    assert negative.status == "xfail" and "out of range" in negative.message
