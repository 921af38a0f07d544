"""tinygrad's ``Tensor.scaled_dot_product_attention`` through the suite: its deviations are
exactly ``conformance/ports/tinygrad_sdpa.xfails``.

The port runs on tinygrad's interpreted PYTHON device (its CPU device needs clang), about a
second per run on two busy cores: the fast test runs the five pinned runs below and asserts their
numbers; the slow one runs one ``sdpa`` and one ``weights`` run per family strictly, and
``make conformance-frameworks`` every fixture (567 runs, about 5 minutes).
"""

from __future__ import annotations

import functools

import pytest

from conformance.runner import Report, run_suite, runs_for

_PORT = "conformance.ports.tinygrad_sdpa"

_PINNED = (
    "sdpa.basic.mha.float64",  # float64 throughout
    "sdpa.scale.custom.float32",  # the query carries the scale
    "weights.causal.bottom_right.l5_s7.float32",
    "weights.fully_masked.bool_row.float32",
    "sdpa.mask.with_causal.float32",
)


def _check(report: Report) -> dict[str, object]:
    print(report.table())
    assert report.ok, "\n".join(o.line() for o in report.failures) or report.error
    return {o.run_id: o for o in report.outcomes}


@functools.cache
def _pinned() -> dict[str, object]:
    pytest.importorskip("tinygrad")
    return _check(run_suite(_PORT, select=lambda run: run.id in _PINNED))


def test_tinygrad_pinned_runs_are_exactly_the_xfails() -> None:
    outcomes = _pinned()
    assert set(outcomes) == set(_PINNED)
    for run_id in _PINNED[:2]:
        assert outcomes[run_id].status == "pass", outcomes[run_id].line()


def test_tinygrad_causal_is_top_left_only() -> None:
    """is_causal is a tril of the (L, S) scores: row 0 of a bottom-right call with L < S sees
    key 0 alone (weight 1.0) where the contract's row sees S - L + 1 keys."""
    outcome = _pinned()["weights.causal.bottom_right.l5_s7.float32"]
    assert outcome.status == "xfail" and outcome.message.split("got ")[1].startswith("1.0")


def test_tinygrad_fully_masked_rows_are_nan_and_causal_refuses_a_mask() -> None:
    nan = _pinned()["weights.fully_masked.bool_row.float32"]
    assert nan.status == "xfail" and "got nan" in nan.message
    both = _pinned()["sdpa.mask.with_causal.float32"]
    assert both.status == "xfail" and "cannot set attn_mask when is_causal=True" in both.message


def _one_per_family() -> set[str]:
    chosen: dict[str, str] = {}
    for run in runs_for(functions=["sdpa", "weights"]):
        if run.family not in chosen or (
            run.case.dtype == "float32" and not chosen[run.family].endswith(".float32")
        ):
            chosen[run.family] = run.id
    return set(chosen.values())


@pytest.mark.slow  # about a second a run on the PYTHON device: a minute or two
def test_tinygrad_one_run_per_family_is_exactly_the_xfails() -> None:
    pytest.importorskip("tinygrad")
    subset = _one_per_family()
    outcomes = _check(run_suite(_PORT, select=lambda run: run.id in subset))
    assert len(outcomes) == len(subset)
