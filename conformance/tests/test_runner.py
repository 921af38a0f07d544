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
    modules = [o for o in report.outcomes if o.run_id.startswith(("module.", "decode."))]
    sdpa = [o for o in report.outcomes if o.run_id.startswith("sdpa.")]
    assert weights and masks and modules and sdpa
    assert all(o.status == "fail" for o in weights + masks + modules)
    assert all("not implemented: port has no `attention_weights`" in o.message for o in weights)
    assert all(o.message == "not implemented: port has no `GroupedQueryAttention`" for o in modules)
    assert all(o.status == "pass" for o in sdpa)
    table = report.table()
    missing = weights + masks + modules
    assert sum("not implemented" in line for line in table.splitlines()) == len(missing)


def _modules_only(**names) -> SimpleNamespace:
    return SimpleNamespace(__name__="modules_only", **names)


def test_module_runs_name_the_missing_class_or_method() -> None:
    """A port with GroupedQueryAttention but no MultiHeadAttention passes the GQA cases and fails
    the MHA cases as not implemented; a class without decode fails the decode runs so."""

    class NoDecode:  # loads and calls like impl_numpy's, but the class has no init_cache/decode
        from_canonical = impl_numpy.GroupedQueryAttention.from_canonical

    report = run_suite(_modules_only(GroupedQueryAttention=NoDecode))
    status = {o.run_id: o for o in report.outcomes}
    assert status["module.gqa.h6_k2.float32"].status == "pass"
    assert status["module.error.weights_transposed.float32"].status == "pass"
    mha = status["module.mha.self.float32"]
    assert mha.message == "not implemented: port has no `MultiHeadAttention`"
    decode = status["decode.gqa.h6_k2.tokens.float32"]
    assert decode.message == "not implemented: `GroupedQueryAttention` has no `init_cache`"
    assert status["decode.error.cache_overflow.float32"].message.startswith("not implemented")


def test_modules_are_loaded_with_the_documented_function_and_decoded_in_the_cases_chunks():
    """from_canonical(weights, n_heads=, n_kv_heads=, dtype=) with NumPy weights (device= only
    when it takes it); init_cache(B, max_len); decode on the case's chunks, each step checked."""
    calls = []

    class Spy(impl_numpy.GroupedQueryAttention):
        @classmethod
        def from_canonical(cls, weights, *, n_heads, n_kv_heads, dtype=None, device=None):
            assert all(isinstance(w, np.ndarray) for w in weights.values())
            calls.append(("load", n_heads, n_kv_heads, dtype, device))
            return super().from_canonical(weights, n_heads=n_heads, n_kv_heads=n_kv_heads)

        def init_cache(self, batch_size, max_len):
            calls.append(("init_cache", batch_size, max_len))
            return super().init_cache(batch_size, max_len)

        def decode(self, x, cache, **keywords):
            calls.append(("decode", x.shape[1], tuple(keywords)))
            return super().decode(x, cache, **keywords)

    port = _modules_only(GroupedQueryAttention=Spy)
    report = run_suite(port, select=lambda r: r.id == "decode.gqa.h6_k2.chunks_2_1_2.bfloat16")
    assert report.ok, report.table()
    assert "3 steps [2, 1, 2]: output and weights max error" in report.outcomes[0].message
    assert calls == [
        ("load", 6, 2, "bfloat16", "cpu"),
        ("init_cache", 2, 8),
        ("decode", 2, ("return_weights",)),
        ("decode", 1, ("return_weights",)),
        ("decode", 2, ("return_weights",)),
    ]


def test_a_decode_step_that_goes_wrong_is_named() -> None:
    class WrongThirdStep(impl_numpy.GroupedQueryAttention):
        def decode(self, x, cache, **keywords):
            y, *rest = super().decode(x, cache, **keywords)
            return (y * 2 if cache.position == 2 else y, *rest)

    report = run_suite(
        _modules_only(GroupedQueryAttention=WrongThirdStep),
        select=lambda r: r.id == "decode.gqa.h6_k2.tokens.float32",
    )
    (failure,) = report.failures
    assert failure.message.startswith("decode step 3 of 5 (tokens 2..2): output max error")


def test_optional_functions_run_only_when_present_or_asked_for() -> None:
    functional = SimpleNamespace(
        __name__="functional",
        scaled_dot_product_attention=impl_numpy.scaled_dot_product_attention,
        attention_weights=impl_numpy.attention_weights,
        causal_mask=impl_numpy.causal_mask,
    )
    gqa = lambda r: r.case.feature == "gqa"  # noqa: E731
    report = run_suite(functional, select=gqa)
    assert report.outcomes and not any(o.run_id.startswith("flash.") for o in report.outcomes)
    asked = run_suite(functional, functions=["flash"], select=gqa)
    assert asked.outcomes and all("not implemented" in o.message for o in asked.outcomes)
    present = run_suite(impl_numpy, select=gqa)
    assert any(o.run_id.startswith("flash.") for o in present.outcomes) and present.ok


def test_flash_cases_pass_their_own_block_sizes() -> None:
    """The runner's blocks (2, 3) for SDPA fixtures; the case's own for flash.tiling cases."""
    seen = {}

    def flash_attention(query, key, value, *, block_q, block_k, **kwargs):
        seen[(query.shape[-2], key.shape[-2])] = (block_q, block_k)
        return impl_numpy.flash_attention(
            query, key, value, block_q=block_q, block_k=block_k, **kwargs
        )

    port = SimpleNamespace(__name__="spy", flash_attention=flash_attention)
    tiling = {"flash.tiling.ragged.l113_s203.float32", "flash.tiling.block_one.l5_s7.float32"}
    report = run_suite(port, functions=["flash"], select=lambda r: r.id in tiling)
    assert report.ok and len(report.outcomes) == 2
    assert seen == {(113, 203): (16, 32), (5, 7): (1, 1)}
    run_suite(port, functions=["flash"], select=lambda r: r.id == "flash.gqa.h6_k2.float32")
    assert seen[(5, 7)] == (2, 3)


def test_flash_attention_is_checked_against_every_sdpa_output_golden() -> None:
    def flash_attention(query, key, value, *, block_q=3, block_k=2, **kwargs):
        return impl_numpy.scaled_dot_product_attention(query, key, value, **kwargs)

    port = SimpleNamespace(__name__="with_flash", flash_attention=flash_attention)
    report = run_suite(port, functions=["flash"])
    sdpa_values = [o for o in run_suite(impl_numpy, functions=["sdpa"]).outcomes]
    tiling = [o for o in report.outcomes if o.run_id.startswith("flash.tiling.")]
    assert len(report.outcomes) == len(sdpa_values) + len(tiling) and len(tiling) > 10
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
    report = run_suite(
        broken,
        xfails=xfails,
        select=lambda r: r.case.op == "sdpa" and r.case.feature in ("bias", "gqa"),
    )
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


def test_the_kernel_ports_list_their_missing_modules_as_known_failures() -> None:
    """torch's and JAX's kernels have no module: every module and decode run is an xfail whose
    message says so, and the port's run still passes."""
    pytest.importorskip("torch")
    report = run_suite("torch_fused", functions=["module", "decode"])
    assert report.ok and report.outcomes
    assert {o.status for o in report.outcomes} == {"xfail"}
    assert {o.message for o in report.outcomes} == {
        "not implemented: port has no `GroupedQueryAttention`"
    }


def test_quick_check_honours_the_builtin_xfails() -> None:
    pytest.importorskip("torch")
    result = quick_check("torch_fused", n_cases=200)  # includes softcap and the (S,) mask
    assert result.ok, result.failures
