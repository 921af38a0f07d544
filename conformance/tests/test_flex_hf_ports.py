"""torch FlexAttention and Hugging Face's attention functions through the suite (issue 31).

Each port's deviations are exactly its ``.xfails`` (strict: a listed run that passes fails
too). The tests run one ``sdpa`` run per family (its float32 run, else its first) plus the runs
their pins read; ``make conformance-frameworks`` runs every fixture.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

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


_FLEX_V3 = {
    "varlen.n3.causal_bottom_right.float32": "pass",  # each sequence's own S_n - L_n offset
    "varlen.n5.empty_sequences.float32": "pass",
    "varlen.n3.sink_logits.float32": "pass",
    "varlen.n3.garbage_in_unread_rows.float32": "xfail",
    "paged.page3.decode_and_prefill.causal.float32": "xfail",  # NaN in the unused slots
    "paged.error.seq_lens_negative.float32": "xfail",
}


def test_torch_flex_varlen_and_paged_deviations_are_exactly_the_xfails() -> None:
    """varlen as a document mask, paged through torch's PagedAttention: a few runs here,
    every one in ``make conformance-frameworks``."""
    pytest.importorskip("torch")
    report = run_suite(
        "torch_flex", functions=("varlen", "paged"), select=lambda r: r.id in _FLEX_V3
    )
    assert report.ok, "\n".join(o.line() for o in report.failures) or report.error
    assert {o.run_id: o.status for o in report.outcomes} == _FLEX_V3


def test_torch_flex_paged_agrees_once_the_unused_slots_are_finite() -> None:
    """The paged runs fail on the NaN the fixtures put in slots no sequence reads (eager
    FlexAttention multiplies their zero weights by them); the same call with those slots
    zeroed is the contract's answer, so the mapping onto PagedAttention is right."""
    torch = pytest.importorskip("torch")
    import numpy as np

    import impl_torch
    from conformance.ports import torch_flex
    from conformance.runner.paged import PAGED_INPUTS, _arrays

    run_id = "paged.page3.decode_and_prefill.causal.float32"
    (run,) = [r for r in runs_for(functions=["paged"]) if r.id == run_id]
    arrays = _arrays(run.case)
    assert np.isnan(arrays["key_cache"]).any()
    args = [torch.from_numpy(np.nan_to_num(np.array(arrays[name]))) for name in PAGED_INPUTS]
    keywords = dict(run.case.keywords)
    got = torch_flex.paged_attention(*args, **keywords)
    # flex's float32 kernel against ours on one call: tests.frameworks.AGREE's float32 agreement
    torch.testing.assert_close(
        got, impl_torch.paged_attention(*args, **keywords), atol=1e-5, rtol=0
    )


def test_torch_flex_has_no_backward_on_cpu() -> None:
    """Why the port has no ``scaled_dot_product_attention_vjp``: torch refuses it on CPU."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.zeros(1, 1, 2, 4, requires_grad=True)
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        flex_attention(q, q, q)  # refused at the forward, as soon as an input requires grad


# ---------------------------------------------------------------------------------------------
# Hugging Face: Llama's and gpt-oss's eager functions and the sdpa integration (transformers)
# ---------------------------------------------------------------------------------------------

_HF_PINNED = (
    "sdpa.sinks.basic.float32",  # sdpa: s_aux silently dropped; gpt-oss eager: agrees
    "weights.fully_masked.bool_row.float32",  # eager: finfo.min rows are uniform; sdpa: zeros
    "sdpa.causal.top_left.l1_s9.float32",  # sdpa: one query skips the mask
    "sdpa.causal.bottom_right.l5_s7.float32",  # q_offset = S - L: the KV-cache diagonal
    "sdpa.window.causal.bottom_right.float32",  # sliding_window = W + 1
    "sdpa.basic.mha.float64",  # Llama eager: float32 softmax
    "sdpa.garbage.causal_tail.float32",
)


@functools.cache
def _hf_report(port: str) -> Report:
    pytest.importorskip("transformers")
    runs = _one_per_family(_HF_PINNED)
    return run_suite(
        f"conformance.ports.{port}", functions=_FUNCTIONS, select=lambda run: run.id in runs
    )


@pytest.mark.parametrize("port", ["hf_eager", "hf_sdpa", "hf_gpt_oss_eager"])
def test_hf_deviations_are_exactly_the_xfails(port: str) -> None:
    status = _strict(_hf_report(port))
    for run_id in (
        "sdpa.causal.bottom_right.l5_s7.float32",
        "sdpa.window.causal.bottom_right.float32",
    ):
        assert status[run_id] == "pass", run_id


def _hf_outcome(port: str, run_id: str):
    (outcome,) = [o for o in _hf_report(port).outcomes if o.run_id == run_id]
    return outcome


def test_hf_sdpa_silently_drops_the_sinks_that_gpt_oss_eager_applies() -> None:
    """gpt-oss passes ``s_aux=self.sinks`` to whatever attention function it is given: eager
    applies it, sdpa takes it and returns the rows without a sink (no error, no warning)."""
    assert _hf_outcome("hf_gpt_oss_eager", "sdpa.sinks.basic.float32").status == "pass"
    dropped = _hf_outcome("hf_sdpa", "sdpa.sinks.basic.float32")
    assert dropped.status == "xfail" and dropped.message.startswith("output max error")


def test_hf_eager_rows_with_no_key_are_uniform_and_sdpa_ones_zero() -> None:
    uniform = _hf_outcome("hf_eager", "weights.fully_masked.bool_row.float32")
    assert uniform.status == "xfail" and "expected 0.0, got 0.14285714" in uniform.message  # 1/S
    assert _hf_outcome("hf_sdpa", "weights.fully_masked.bool_row.float32").status == "pass"
    f64 = _hf_outcome("hf_eager", "sdpa.basic.mha.float64")  # the float32 softmax
    assert f64.status == "xfail" and 1e-9 < f64.error < 1e-5  # measured: float32's size
    assert _hf_outcome("hf_gpt_oss_eager", "sdpa.basic.mha.float64").status == "pass"


def test_hf_sdpa_skips_the_mask_of_a_single_query() -> None:
    """One query with top_left causal (q_offset = 0): sdpa_mask returns None (is_causal is
    then off), so the query attends all S keys, as a decode step would."""
    one = _hf_outcome("hf_sdpa", "sdpa.causal.top_left.l1_s9.float32")
    assert one.status == "xfail" and one.message.startswith("output max error")
    assert _hf_outcome("hf_eager", "sdpa.causal.top_left.l1_s9.float32").status == "pass"


_PEERS = Path(__file__).resolve().parents[2] / "docs" / "peers"


@pytest.mark.slow  # a fresh interpreter importing torch and transformers: ~10 s each
@pytest.mark.parametrize("script", ["hf_sdpa_drops_s_aux.py", "hf_sliding_window_ignored.py"])
def test_peer_reproductions_still_reproduce(script: str) -> None:
    """The standalone scripts in docs/peers exit 0 while the deviation is there: a fix
    upstream fails this test, and its xfails lines are then XPASSes to drop."""
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, str(_PEERS / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------
# hf_flex: Hugging Face's flex_attention_forward, compiled by Hugging Face (torch.compile)
# ---------------------------------------------------------------------------------------------

#: Runs that compile nothing or fail before the kernel builds: make test.
_HF_FLEX_CHEAP = {
    "sdpa.sinks.basic.float32": "xfail",  # refused on CPU before any compile
    "sdpa.gqa.h6_k2.head_mask.float32": "xfail",  # a per-head mask: no masking_utils form
    "sdpa.window.left_only.float32": "xfail",  # no Hugging Face window (2, None)
}

#: Each compiles (seconds from inductor's cache, tens cold): make test-slow.
_HF_FLEX_PINNED = {
    "sdpa.causal.bottom_right.l5_s7.float32": "pass",  # q_offset = S - L
    "sdpa.window.causal.bottom_right.float32": "pass",  # sliding_window = W + 1, in the mask
    "weights.fully_masked.bool_row.float32": "pass",  # zeros (hf_eager: uniform)
    "sdpa.alibi.bottom_right.causal.float32": "pass",  # ALiBi as position_bias
    "sdpa.basic.mha.float64": "xfail",  # refused at lowering
    "sdpa.garbage.padding.float32": "xfail",  # 0 * NaN inside a partly masked block
}


def _hf_flex(runs: dict[str, str]) -> Report:
    pytest.importorskip("transformers")
    report = run_suite(
        "conformance.ports.hf_flex", functions=_FUNCTIONS, select=lambda run: run.id in runs
    )
    print(report.table())
    assert report.ok, "\n".join(o.line() for o in report.failures) or report.error
    assert {o.run_id: o.status for o in report.outcomes} == runs
    return report


def test_hf_flex_refuses_sinks_on_cpu_and_per_head_masks() -> None:
    """gpt-oss on flex attention cannot run on CPU: its s_aux is refused, not dropped (hf_sdpa
    drops it silently)."""
    report = _hf_flex(_HF_FLEX_CHEAP)
    (sinks,) = [o for o in report.outcomes if o.run_id == "sdpa.sinks.basic.float32"]
    assert "Attention sinks cannot be run on CPU" in sinks.message


@pytest.mark.slow
def test_hf_flex_deviations_are_exactly_the_xfails() -> None:
    """A few compiled runs: the KV-cache diagonal, the window in the mask, ALiBi, zeros for a
    fully masked row; float64 refused; NaN garbage leaks. Every run in conformance-frameworks."""
    report = _hf_flex(_HF_FLEX_PINNED)
    (f64,) = [o for o in report.outcomes if o.run_id == "sdpa.basic.mha.float64"]
    assert "supported in FlexAttention for CPU" in f64.message
