"""The runner's contract with ports: missing names, xfails, adapters, the CLI, quick_check."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

import impl_numpy
from conformance import quick_check
from conformance.__main__ import main
from conformance.runner import Xfails, load_port, run_suite
from conformance.tests.broken_ports import make_port


def test_a_missing_function_fails_its_runs_as_not_implemented_one_line_each() -> None:
    port = SimpleNamespace(
        __name__="sdpa_only", scaled_dot_product_attention=impl_numpy.scaled_dot_product_attention
    )
    report = run_suite(port)
    weights = [o for o in report.outcomes if o.run_id.startswith("weights.")]
    masks = [o for o in report.outcomes if o.run_id.startswith("causal_mask.")]
    sdpa = [o for o in report.outcomes if o.run_id.startswith("sdpa.")]
    assert weights and masks and sdpa
    assert all(o.status == "fail" for o in weights + masks)
    assert all("not implemented: port has no `attention_weights`" in o.message for o in weights)
    assert all(o.status == "pass" for o in sdpa)
    table = report.table()
    assert sum("not implemented" in line for line in table.splitlines()) == len(weights + masks)


def test_optional_functions_run_only_when_present_or_asked_for() -> None:
    report = run_suite(impl_numpy, select=lambda r: r.case.feature == "gqa")
    assert not any(o.run_id.startswith("flash.") for o in report.outcomes)
    if not hasattr(impl_numpy, "flash_attention"):
        asked = run_suite(impl_numpy, functions=["flash"], select=lambda r: r.case.feature == "gqa")
        assert asked.outcomes and all("not implemented" in o.message for o in asked.outcomes)


def test_flash_attention_is_checked_against_every_sdpa_output_golden() -> None:
    def flash_attention(query, key, value, *, block_q=3, block_k=2, **kwargs):
        return impl_numpy.scaled_dot_product_attention(query, key, value, **kwargs)

    port = SimpleNamespace(__name__="with_flash", flash_attention=flash_attention)
    report = run_suite(port, functions=["flash"])
    sdpa_values = [o for o in run_suite(impl_numpy, functions=["sdpa"]).outcomes]
    assert len(report.outcomes) == len(sdpa_values)
    assert report.ok, "\n".join(o.line() for o in report.failures)


def test_a_port_that_cannot_be_imported_is_one_error_not_a_crash(capsys) -> None:
    report = run_suite("no_such_port_module")
    assert not report.ok and "ModuleNotFoundError" in report.error
    assert main(["--impl", "no_such_port_module", "--impl", "impl_numpy", "-k", "gqa"]) == 1
    out = capsys.readouterr().out
    assert "could not load the port" in out and "impl_numpy on cpu" in out


def test_xfails_turn_failures_into_xfail_and_passes_into_xpass() -> None:
    broken = make_port("bias_ignored")
    xfails = Xfails.parse("sdpa.bias.*   # bias ignored\nweights.bias.*\nsdpa.gqa.h6_k2.float32\n")
    report = run_suite(broken, xfails=xfails, select=lambda r: r.case.feature in ("bias", "gqa"))
    status = {o.run_id: o.status for o in report.outcomes}
    assert status["sdpa.bias.full.float32"] == "xfail"
    assert status["sdpa.gqa.h6_k2.float32"] == "xpass"  # listed, but it passes: reported
    assert status["sdpa.gqa.h6_k2.float16"] == "pass"
    assert not report.ok and [o.run_id for o in report.failures] == ["sdpa.gqa.h6_k2.float32"]
    assert "remove it from the xfails" in report.failures[0].line()


def test_xfails_can_be_limited_to_a_device() -> None:
    xfails = Xfails.parse("cuda: sdpa.gqa.*  # only there\nsdpa.mask.*\n")
    assert xfails.reason("sdpa.gqa.h6_k2.float32", "cuda") == "only there"
    assert xfails.reason("sdpa.gqa.h6_k2.float32", "cuda:1") == "only there"
    assert xfails.reason("sdpa.gqa.h6_k2.float32", "cpu") is None
    assert xfails.reason("sdpa.mask.random.float32", "cpu") == "listed in xfails"


def test_builtin_adapters_keep_the_implementations_clean() -> None:
    pytest.importorskip("torch")
    import impl_torch

    assert not hasattr(impl_torch, "from_numpy")
    port = load_port("impl_torch")
    assert not port.numpy_native
    import ml_dtypes

    x = np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16)
    back = port.to_numpy(port.from_numpy(x, "cpu"))
    assert back.dtype == x.dtype and np.array_equal(back, x)


def test_cli_table_report_and_exit_code(tmp_path, capsys) -> None:
    report_file = tmp_path / "out.json"
    assert main(["--impl", "impl_numpy", "--report", str(report_file)]) == 0
    out = capsys.readouterr().out
    assert "impl_numpy on cpu" in out and "sdpa.gqa" in out and "all ports pass" in out
    data = json.loads(report_file.read_text())
    assert data[0]["ok"] and data[0]["counts"]["fail"] == 0 and len(data[0]["outcomes"]) > 200

    broken = "conformance.tests.broken_ports:scale_missing"  # module:object names a port
    assert main(["--impl", broken, "-k", "sdpa.gqa.h6_k2.float32"]) == 1
    assert "FAIL sdpa.gqa.h6_k2.float32 [cpu float32]: output max error" in capsys.readouterr().out


def test_quick_check_runs_the_smallest_cases() -> None:
    result = quick_check("impl_numpy")
    assert result.ok and result.n_run == 8 and result.failures == []
    result = quick_check(impl_numpy, op="weights", n_cases=3)
    assert result.ok and result.n_run == 3


def test_quick_check_reports_a_broken_port() -> None:
    result = quick_check(make_port("scale_missing"), n_cases=20)
    assert not result.ok and result.n_run == 20
    assert all(line.startswith("FAIL sdpa.") for line in result.failures)


def test_quick_check_honours_the_builtin_xfails() -> None:
    pytest.importorskip("torch")
    result = quick_check("torch_fused", n_cases=200)  # includes softcap and the (S,) mask
    assert result.ok, result.failures
