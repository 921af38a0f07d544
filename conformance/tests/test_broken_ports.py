"""Proof of power: every deliberately broken port fails the suite.

The unbroken version of the same small port passes every run, so each failure below is caused
by its bug; each bug also fails the one run named for it in ``broken_ports.BUGS``.
"""

from __future__ import annotations

import pytest

from conformance.runner import Report, run_suite
from conformance.tests.broken_ports import BUGS, make_port

_REPORTS: dict[str | None, Report] = {}


def _report(bug: str | None) -> Report:
    if bug not in _REPORTS:
        _REPORTS[bug] = run_suite(make_port(bug))
    return _REPORTS[bug]


def test_the_unbroken_port_passes_everything() -> None:
    report = _report(None)
    assert report.ok, "\n".join(o.line() for o in report.failures)
    assert report.counts()["pass"] == len(report.outcomes) > 200


@pytest.mark.parametrize("bug", list(BUGS))
def test_broken_port_is_caught(bug: str) -> None:
    what, must_fail = BUGS[bug]
    report = _report(bug)
    failed = {o.run_id: o for o in report.failures}
    assert failed, f"{bug} ({what}) passed every run"
    assert must_fail in failed, f"{bug} ({what}) passed {must_fail}"


def test_every_broken_port_is_caught_and_counted(capsys: pytest.CaptureFixture) -> None:
    caught = {bug: len(_report(bug).failures) for bug in BUGS}
    with capsys.disabled():
        print(f"\nbroken ports caught: {sum(n > 0 for n in caught.values())} of {len(BUGS)}")
        for bug, n in caught.items():
            print(f"  {bug:<24} {n:>4} failing runs  ({BUGS[bug][0]})")
    assert len(BUGS) >= 12
    assert all(n > 0 for n in caught.values())


def test_tiling_is_told_apart_from_contiguous_groups() -> None:
    """GQA 6:2 and 6:3 fail for a tiling port in every dtype; with K = 1 (MQA 8:1) tiling and
    contiguous groups are the same mapping (h % 1 == h // 8 == 0), so it passes there."""
    failed = {o.run_id for o in _report("gqa_tiling").failures}
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        assert f"sdpa.gqa.h6_k2.{dtype}" in failed
        assert f"sdpa.gqa.h8_k1.{dtype}" not in failed
    assert "sdpa.gqa.h6_k3.float32" in failed
    assert "weights.gqa.h6_k2.head_mask.float32" in failed


def test_a_failure_names_case_index_error_bound_device_and_dtype() -> None:
    (line,) = [
        o.line()
        for o in _report("scale_missing").failures
        if o.run_id == "sdpa.saturation.default_scale.bfloat16"
    ]
    assert line.startswith("FAIL sdpa.saturation.default_scale.bfloat16 [cpu bfloat16]: ")
    assert "output max error" in line and " at (" in line and "> bound" in line
