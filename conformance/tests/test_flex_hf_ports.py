"""torch FlexAttention and Hugging Face's attention functions through the suite (issue 31).

Each port's deviations are exactly its ``.xfails`` (strict: a listed run that passes fails
too). The tests run one ``sdpa`` run per family (its float32 run, else its first) plus the runs
their pins read; ``make conformance-frameworks`` runs every fixture.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import pytest

from conformance.runner import Report, run_suite, runs_for

#: What these ports are run on: they are kernels (no module, no causal-mask function).
_FUNCTIONS = ("sdpa", "weights")


def _one_per_family(pinned: Iterable[str] = ()) -> set[str]:
    """Per ``sdpa`` family its float32 run (else its first), and the ``pinned`` runs."""
    chosen: dict[str, str] = {}
    for run in runs_for(functions=["sdpa"]):
        if run.family not in chosen or (
            run.case.dtype == "float32" and not chosen[run.family].endswith(".float32")
        ):
            chosen[run.family] = run.id
    return set(chosen.values()) | set(pinned)


def _strict(report: Report) -> dict[str, str]:
    """The report must be exactly its xfails; returns each run's status by id."""
    print(report.table())
    assert report.ok, "\n".join(o.line() for o in report.failures) or report.error
    counts = report.counts()
    assert counts["pass"] > 0 and counts["xfail"] > 0
    return {o.run_id: o.status for o in report.outcomes}


# ---------------------------------------------------------------------------------------------
# torch_flex: torch.nn.attention.flex_attention, eager on CPU
# ---------------------------------------------------------------------------------------------

_FLEX_PINNED = (
    "sdpa.causal.bottom_right.l9_s5.float32",  # mask_mod on the bottom-right diagonal
    "sdpa.window.both.bottom_right.float32",
    "sdpa.segments.two_docs.float32",
    "sdpa.alibi.bottom_right.causal.float32",
    "sdpa.softcap.cap2_neg_inf_bias.float32",
    "sdpa.sinks.basic.float32",  # from the lse
    "weights.sinks.basic.float32",
    "weights.fully_masked.bool_row.float32",
    "weights.fully_masked.neg_inf_bias_row.float32",
    "weights.garbage.padding.float32",  # a mask_mod excludes the NaN key
    "weights.garbage.neg_inf_bias_column.float32",  # a -inf score_mod does not
    "sdpa.garbage.padding.float32",
    "sdpa.shapes.s0.float32",
)


@functools.cache
def _flex_report() -> Report:
    pytest.importorskip("torch")
    runs = _one_per_family(_FLEX_PINNED)
    return run_suite("torch_flex", functions=_FUNCTIONS, select=lambda run: run.id in runs)


def test_torch_flex_deviations_are_exactly_the_xfails() -> None:
    status = _strict(_flex_report())
    for run_id in _FLEX_PINNED[:9]:
        assert status[run_id] == "pass", run_id
    assert status["weights.garbage.padding.float32"] == "pass"
    for run_id in _FLEX_PINNED[10:]:
        assert status[run_id] == "xfail", run_id


def test_torch_flex_leaks_nan_from_unattended_keys_and_refuses_no_keys() -> None:
    """The reference path multiplies every weight by every value row (0 * NaN = NaN) and adds
    the score_mod's -inf to a NaN score (NaN); with S = 0 its max has no axis to reduce."""
    outcome = {o.run_id: o for o in _flex_report().outcomes}
    assert "got nan" in outcome["sdpa.garbage.padding.float32"].message
    assert "got nan" in outcome["weights.garbage.neg_inf_bias_column.float32"].message
    assert "raised IndexError" in outcome["sdpa.shapes.s0.float32"].message


def test_torch_flex_has_no_backward_on_cpu() -> None:
    """Why the port has no ``scaled_dot_product_attention_vjp``: torch refuses it on CPU."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.zeros(1, 1, 2, 4, requires_grad=True)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, q, q)  # refused at the forward, as soon as an input requires grad
