"""The frameworks' own kernels through the suite: their deviations are exactly their xfails.

``conformance/ports/torch_fused.xfails`` and ``jax_fused.xfails`` list, as globs over run ids,
where ``torch.nn.functional.scaled_dot_product_attention`` and ``jax.nn.dot_product_attention``
differ from the contract. A run that fails without being listed, or a listed run that passes,
fails these tests, so the documented table (docs/CONFORMANCE.md) cannot go stale.
"""

from __future__ import annotations

import pytest

from conformance.runner import check, load_port, run_suite, runs_for


@pytest.mark.parametrize("name", ["torch_fused", "jax_fused"])
def test_deviations_are_exactly_the_xfails(name: str) -> None:
    pytest.importorskip(name.split("_")[0])
    report = run_suite(name)
    print(report.table())
    assert report.ok, "\n".join(o.line() for o in report.failures)
    assert report.counts()["xfail"] > 0


def _outcome(name: str, run_id: str):
    port = load_port(name)
    (run,) = [r for r in runs_for() if r.id == run_id]
    return check(port, run)


def test_jax_fully_masked_rows_are_uniform_or_nan() -> None:
    """The two measured fully-masked-row behaviours of jax.nn.dot_product_attention."""
    pytest.importorskip("jax")
    uniform = _outcome("jax_fused", "weights.fully_masked.bool_row.float32")
    assert uniform.status == "xfail" and "expected 0.0, got 0.14285714" in uniform.message  # 1/S
    nan = _outcome("jax_fused", "weights.fully_masked.neg_inf_bias_row.float32")
    assert nan.status == "xfail" and "got nan" in nan.message


def test_torch_fully_masked_rows_are_zero() -> None:
    """torch's kernel agrees with the contract on fully masked rows (CPU)."""
    pytest.importorskip("torch")
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        for way in ("bool_row", "neg_inf_bias_row", "huge_negative_bias_row"):
            outcome = _outcome("torch_fused", f"sdpa.fully_masked.{way}.{dtype}")
            assert outcome.status == "pass", outcome.line()
