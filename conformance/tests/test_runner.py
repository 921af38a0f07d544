"""The runner's contract with ports: missing names, xfails, adapters, the CLI, quick_check."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import conformance.runner
import impl_numpy
from conformance import quick_check
from conformance.__main__ import main
from conformance.runner import FUNCTIONS, Xfails, load_port, run_suite
from conformance.tests.broken_ports import make_port

REPO = Path(__file__).resolve().parents[2]


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
    # the sdpa runs only (208): the table, report and exit code are the same for every alias,
    # and the whole of impl_numpy runs in test_conformance (and the CLI's in `make conformance`)
    assert main(["--impl", "impl_numpy", "-k", "sdpa.*", "--report", str(report_file)]) == 0
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


# ---------------------------------------------------------------------------------------------
# Porting experience: crashes, skips, --list, messages that locate the error
# ---------------------------------------------------------------------------------------------

CRASHING_PORT = """
import os
import signal
import time

import impl_numpy
from impl_numpy import attention_weights, causal_mask  # noqa: F401


def scaled_dot_product_attention(query, key, value, **keywords):
    H, K = query.shape[-3], key.shape[-3]
    if H == 8 and query.dtype.name == "float32":  # sdpa.gqa.h8_k1.float32: a SIGFPE
        os.kill(os.getpid(), signal.SIGFPE)
    if K == 3 and H == 6:  # sdpa.gqa.h6_k3.float32: a hard abort
        os.abort()
    if H == 8 and query.dtype.name == "bfloat16" and "KILL_PARENT" in os.environ:
        time.sleep(2)  # let the parent write what it has, then kill it, as a user would
        os.kill(os.getppid(), signal.SIGKILL)
    return impl_numpy.scaled_dot_product_attention(query, key, value, **keywords)
"""


def _run_cli(tmp_path: Path, *args: str, env_extra: dict | None = None):
    (tmp_path / "crashy.py").write_text(CRASHING_PORT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "conformance", "--impl", "crashy", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )


def test_a_crashing_port_is_reported_per_case_and_the_rest_still_runs(tmp_path) -> None:
    report_file = tmp_path / "report.json"
    done = _run_cli(tmp_path, "-k", "sdpa.gqa.*", "--report", str(report_file))
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "CRASH sdpa.gqa.h8_k1.float32 [cpu float32]: crashed (SIGFPE)" in out
    assert "CRASH sdpa.gqa.h6_k3.float32 [cpu float32]: crashed (SIGABRT)" in out
    assert "crashy.py" in out  # faulthandler's innermost frame: the port's line
    (report,) = json.loads(report_file.read_text())
    status = {o["run_id"]: o["status"] for o in report["outcomes"]}
    assert status["sdpa.gqa.h8_k1.float32"] == status["sdpa.gqa.h6_k3.float32"] == "crash"
    assert "crashed (SIGABRT), and again on retry" in out  # each crash retried once
    # every other gqa run still ran, after the crashes too, in the planned order
    assert len(status) == 11 and list(status.values()).count("pass") == 9
    assert report["complete"] and report["counts"]["crash"] == 2


def test_a_killed_run_leaves_the_report_it_had(tmp_path) -> None:
    """The report is written after every run: killing the whole run (here the port kills the
    CLI itself, at sdpa.gqa.h8_k1.bfloat16) leaves the runs made before, marked incomplete."""
    report_file = tmp_path / "report.json"
    done = _run_cli(tmp_path, "-k", "sdpa.gqa.h8_k1.*", "--report", str(report_file),
                    env_extra={"KILL_PARENT": "1"})
    assert done.returncode == -9
    (report,) = json.loads(report_file.read_text())
    assert not report["complete"] and not report["ok"]
    assert [o["run_id"] for o in report["outcomes"]] == [
        "sdpa.gqa.h8_k1.float64", "sdpa.gqa.h8_k1.float32", "sdpa.gqa.h8_k1.float16",
    ]
    assert report["planned"] == 4  # what it did not reach: bfloat16


FLAKY_PORT = """
import os
import signal
from pathlib import Path

import impl_numpy
from impl_numpy import attention_weights, causal_mask  # noqa: F401


def scaled_dot_product_attention(query, key, value, **keywords):
    H, K = query.shape[-3], key.shape[-3]
    if H == 8 and query.dtype.name == "float32":  # sdpa.gqa.h8_k1.float32: every time
        os.kill(os.getpid(), signal.SIGSEGV)
    marker = Path(os.environ["FLAKY_MARKER"])
    if K == 3 and H == 6 and not marker.exists():  # sdpa.gqa.h6_k3.float32: the first time only
        marker.write_text("crashed once")
        os.kill(os.getpid(), signal.SIGSEGV)
    return impl_numpy.scaled_dot_product_attention(query, key, value, **keywords)
"""


def _run_flaky(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """The CLI on the flaky port (a fresh marker: its h6_k3 case crashes once); the report."""
    (tmp_path / "flaky.py").write_text(FLAKY_PORT)
    marker, report_file = tmp_path / "crashed.marker", tmp_path / "report.json"
    marker.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
           "FLAKY_MARKER": str(marker)}
    done = subprocess.run(
        [sys.executable, "-m", "conformance", "--impl", "flaky", "--report", str(report_file),
         *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert marker.exists(), done.stdout + done.stderr  # the flaky case did crash, once
    (report,) = json.loads(report_file.read_text())
    return done, report


def test_a_run_that_crashes_once_is_retried_and_reported_apart(tmp_path) -> None:
    """The crashed run runs again, first in a fresh child; it passes there: status 'retried',
    counted in the summary, the table and the report, printed, and the command still passes."""
    done, report = _run_flaky(tmp_path, "-k", "sdpa.gqa.h6_k*")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    line = "RETRIED sdpa.gqa.h6_k3.float32 [cpu float32]: crashed once (SIGSEGV), passed on retry"
    assert line in out and "flaky.py" in out  # with the crash's innermost frame
    assert "7 runs: 6 passed, 0 failed, 0 xfail, 0 xpass, 1 retried (" in out
    header = next(row for row in out.splitlines() if row.lstrip().startswith("family"))
    assert header.split() == ["family", "passed", "xfail", "skip", "failed", "retried", "worst",
                              "err/bound"]
    gqa = next(row for row in out.splitlines() if row.lstrip().startswith("sdpa.gqa"))
    assert gqa.split()[:3] == ["sdpa.gqa", "6/7", "1"]  # 6 passed of 7, 1 retried
    assert report["ok"] and report["complete"]
    assert report["counts"]["retried"] == 1 and report["counts"]["pass"] == 6
    assert report["counts"]["crash"] == report["counts"]["fail"] == 0
    (retried,) = [o for o in report["outcomes"] if o["status"] == "retried"]
    assert retried["run_id"] == "sdpa.gqa.h6_k3.float32"
    assert retried["message"].startswith("crashed once (SIGSEGV), passed on retry")
    assert retried["error"] is not None and retried["error"] <= retried["bound"]


def test_a_crash_that_comes_again_on_the_retry_is_a_crash(tmp_path) -> None:
    """h8_k1.float32 crashes in every process: a crash, said so; the flaky one beside it is
    retried; every other run still runs, in the planned order."""
    done, report = _run_flaky(tmp_path, "-k", "sdpa.gqa.*")
    assert done.returncode == 1, done.stdout + done.stderr
    status = {o["run_id"]: o for o in report["outcomes"]}
    crash = status["sdpa.gqa.h8_k1.float32"]
    assert crash["status"] == "crash"
    assert crash["message"].startswith("crashed (SIGSEGV), and again on retry: File ")
    assert status["sdpa.gqa.h6_k3.float32"]["status"] == "retried"
    assert report["counts"] == {"pass": 9, "fail": 0, "xfail": 0, "xpass": 0, "skip": 0,
                                "crash": 1, "retried": 1}
    assert report["complete"] and not report["ok"]
    assert "11 runs: 9 passed, 0 failed, 0 xfail, 0 xpass, 1 crashed, 1 retried (" in done.stdout
    listed = subprocess.run(
        [sys.executable, "-m", "conformance", "--impl", "flaky", "--list", "-k", "sdpa.gqa.*"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])},
    )
    assert list(status) == listed.stdout.split()


def test_a_listed_crash_is_an_xfail_and_not_retried(tmp_path, monkeypatch) -> None:
    (tmp_path / "flaky.py").write_text(FLAKY_PORT)
    marker = tmp_path / "crashed.marker"
    monkeypatch.syspath_prepend(str(tmp_path))  # the child imports the port as the parent would
    monkeypatch.setenv("FLAKY_MARKER", str(marker))
    xfails = Xfails.parse("sdpa.gqa.h6_k3.float32  # crashes\n")
    report = run_suite("flaky", isolate=True, pattern="sdpa.gqa.h6_k*", xfails=xfails)
    status = {o.run_id: o for o in report.outcomes}
    listed = status["sdpa.gqa.h6_k3.float32"]
    assert marker.exists() and listed.status == "xfail" and listed.xfail_reason == "crashes"
    assert listed.message.startswith("crashed (SIGSEGV)") and "retry" not in listed.message
    assert report.ok and report.counts()["pass"] == 6 and report.counts()["retried"] == 0


def test_skip_entries_do_not_run_and_bang_lines_exclude(tmp_path) -> None:
    """'every gqa float32 case except h6_k3' is two lines; skip: keeps the crash from running."""
    xfails = tmp_path / "crashy.xfails"
    xfails.write_text(
        "skip: sdpa.gqa.*.float32   # crashes\n"
        "!sdpa.gqa.h6_k2.float32     # this one runs\n"
        "skip: sdpa.gqa.h6_k3.float32   # aborts\n"
    )
    done = _run_cli(tmp_path, "-k", "sdpa.gqa.*", "--show-xfails")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skip sdpa.gqa.h8_k1.float32 [cpu float32]: skipped: crashes" in done.stdout
    assert "skip sdpa.gqa.h6_k3.float32 [cpu float32]: skipped: aborts" in done.stdout
    assert "sdpa.gqa.h6_k2.float32" not in done.stdout  # ran and passed: not listed
    assert "CRASH" not in done.stdout and "3 skipped" in done.stdout


def test_the_runner_docstring_names_the_optional_functions() -> None:
    """The package's docstring lists exactly the rows of FUNCTIONS that are not required."""
    doc = " ".join((conformance.runner.__doc__ or "").split())
    optional = doc.split("The optional functions (", 1)[1].split(": the rows of", 1)[0]
    named = {alias for alias in FUNCTIONS if f"``{alias}``" in optional}
    assert named == {alias for alias, f in FUNCTIONS.items() if not f.required}


def test_xfails_grammar() -> None:
    x = Xfails.parse(
        "*.float64            # no float64\n"
        "!*.scale.zero.float64\n"
        "cuda: skip: decode.* # crashes on cuda\n"
    )
    assert x.reason("sdpa.gqa.h6_k2.float64", "cpu") == "no float64"
    assert x.lookup("sdpa.scale.zero.float64", "cpu") is None
    assert x.lookup("decode.gqa.h6_k2.tokens.float32", "cpu") is None
    entry = x.lookup("decode.gqa.h6_k2.tokens.float32", "cuda:0")
    assert entry.skip and entry.reason == "crashes on cuda"
    with pytest.raises(ValueError, match="expected"):
        Xfails.parse("sdpa.a sdpa.b  # two globs on one line")


def test_list_prints_the_run_ids_and_runs_nothing(capsys) -> None:
    assert main(["--impl", "impl_numpy", "--list", "--function", "sdpa", "-k", "gqa.h6"]) == 0
    ids = capsys.readouterr().out.split()
    assert ids == [
        "sdpa.gqa.h6_k2.float64", "sdpa.gqa.h6_k2.float32", "sdpa.gqa.h6_k2.float16",
        "sdpa.gqa.h6_k2.bfloat16", "sdpa.gqa.h6_k3.float32", "sdpa.gqa.h6_k2.head_mask.float32",
        "sdpa.gqa.h6_k2.head_mask.bfloat16",
    ]
    assert main(["--impl", "torch_fused", "--list", "-k", "*softcap.cap2*float32"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert "sdpa.softcap.cap2_neg_inf_bias.float32  # xfail" in listed


def test_the_parts_of_a_plan_make_every_run_once_each_with_every_family(capsys) -> None:
    """``--part K/N``: N processes, one part each, make the whole plan (the GPU check's
    conformance runs in parallel); every family of N runs or more is in every part, so the
    parts take about the same time."""
    assert main(["--impl", "impl_torch", "--list"]) == 0
    whole = capsys.readouterr().out.split()
    parts = []
    for k in (1, 2, 3):
        assert main(["--impl", "impl_torch", "--list", "--part", f"{k}/3"]) == 0
        parts.append(capsys.readouterr().out.split())
    assert sorted(i for part in parts for i in part) == sorted(whole)
    assert len(set(whole)) == len(whole) and max(map(len, parts)) - min(map(len, parts)) <= 1
    families = collections.Counter(".".join(i.split(".")[:2]) for i in whole)  # op.feature
    big = {f for f, n in families.items() if n >= 9}
    for part in parts:
        assert big <= {".".join(i.split(".")[:2]) for i in part}
    with pytest.raises(SystemExit):
        main(["--impl", "impl_torch", "--list", "--part", "4/3"])
    assert "want K/N with 1 <= K <= N" in capsys.readouterr().err


def test_a_part_s_report_counts_its_plan(tmp_path) -> None:
    """The report of a part says how many runs its plan had (``planned``), in the child
    process and in this one."""
    report_file = tmp_path / "report.json"
    args = ["--impl", "impl_numpy", "-k", "sdpa.gqa.*", "--part", "2/2", "--report"]
    assert main([*args, str(report_file)]) == 0
    (report,) = json.loads(report_file.read_text())
    assert report["planned"] == 5 == len(report["outcomes"]) and report["complete"]
    assert main([*args, str(report_file), "--in-process"]) == 0
    (report,) = json.loads(report_file.read_text())
    assert report["planned"] == 5 == len(report["outcomes"])


def test_a_failure_locates_the_worst_element_to_full_precision() -> None:
    def off_by_a_bit(query, key, value, **keywords):
        out = impl_numpy.scaled_dot_product_attention(query, key, value, **keywords)
        out[1, 4, 3, 2] += np.float32(0.001)
        return out

    port = SimpleNamespace(__name__="bit", scaled_dot_product_attention=off_by_a_bit)
    report = run_suite(port, functions=["sdpa"], select=lambda r: r.id == "sdpa.gqa.h6_k2.float32")
    (failure,) = report.failures
    expected = float(_golden("sdpa.gqa.h6_k2.float32")["output"][1, 4, 3, 2])
    assert f"at (1, 4, 3, 2): expected {expected!r}, got " in failure.message
    assert "x the bound; relative error " in failure.message
    got = float(failure.message.rsplit("got ", 1)[1])
    assert abs(got - expected - 0.001) < 1e-6 and repr(got) != f"{got:.6g}"  # all the digits


def _golden(case_id: str) -> dict:
    from conformance import load_manifest

    return load_manifest().by_id()[case_id].tensors()


def test_an_exception_names_the_line_of_the_port_that_raised_it() -> None:
    def broken(query, key, value, **keywords):
        raise RuntimeError("shapes do not fit")

    port = SimpleNamespace(__name__="raiser", scaled_dot_product_attention=broken)
    report = run_suite(port, functions=["sdpa"], select=lambda r: r.id == "sdpa.gqa.h6_k2.float32")
    message = report.failures[0].message
    assert message.startswith("raised RuntimeError: shapes do not fit (at test_runner.py:")
    assert "in broken)" in message


def test_an_adapter_that_raises_is_named_with_its_traceback_tail() -> None:
    def from_numpy(array, device):
        return _convert(array)

    def _convert(array):
        raise TypeError("no bfloat16 here")

    port = SimpleNamespace(
        __name__="adapted", scaled_dot_product_attention=impl_numpy.scaled_dot_product_attention,
        from_numpy=from_numpy, to_numpy=np.asarray,
    )
    report = run_suite(port, functions=["sdpa"], select=lambda r: r.id == "sdpa.basic.mha.float32")
    message = report.failures[0].message
    assert message.startswith("the adapter `from_numpy` of adapted raised TypeError: no bfloat16")
    assert "traceback tail: test_runner.py:" in message and "in _convert" in message


def test_an_adapter_that_downcasts_float64_is_told_so() -> None:
    """MLX's from_numpy silently turns float64 into float32; the suite says that, not 'output
    dtype float32, expected float64'."""
    port = SimpleNamespace(
        __name__="downcaster", scaled_dot_product_attention=impl_numpy.scaled_dot_product_attention,
        from_numpy=lambda a, device: a.astype(np.float32) if a.dtype == np.float64 else a,
        to_numpy=np.asarray,
    )
    report = run_suite(port, functions=["sdpa"], select=lambda r: r.case.feature == "basic")
    status = {o.run_id: o for o in report.outcomes}
    assert status["sdpa.basic.mha.float32"].status == "pass"
    message = status["sdpa.basic.mha.float64"].message
    assert "turn float64 into float32" in message and "from_numpy must keep the dtype" in message


def test_the_kernel_bound_of_an_fp8_case_is_opt_in() -> None:
    """An all-fp8 case's output error between its strict bound (``tolerance``) and the kernels'
    (``kernel_tolerance``) fails a port, and passes one that declares ``KERNEL_TOLERANCE``; the
    weights stay under the strict bound either way (FORMAT.md, "Bounds")."""
    from conformance.fixtures import load_manifest

    case = load_manifest().by_id()["sdpa.fp8.all.per_head.float8_e4m3fn"]
    strict, kernel = case.tolerance["output"], case.kernel_tolerance["output"]
    assert kernel > 2 * strict
    shift = (strict + kernel) / 2

    def scaled_dot_product_attention(*args, **kwargs):
        out = impl_numpy.scaled_dot_product_attention(*args, **kwargs)
        return (out.astype(np.float64) + shift).astype(out.dtype)  # bfloat16

    def select(run) -> bool:
        return run.id == case.id

    plain = SimpleNamespace(
        __name__="shifted", scaled_dot_product_attention=scaled_dot_product_attention
    )
    report = run_suite(plain, functions=["sdpa"], select=select)
    assert [o.status for o in report.outcomes] == ["fail"]
    assert f"bound {strict:.3g}" in report.outcomes[0].message
    declared = SimpleNamespace(**vars(plain), KERNEL_TOLERANCE=True)
    report = run_suite(declared, functions=["sdpa"], select=select)
    assert [o.status for o in report.outcomes] == ["pass"], report.outcomes[0].message
    assert f"bound {kernel:.3g}" in report.outcomes[0].message


@pytest.mark.parametrize("port_name", ["impl_torch", "impl_jax"])
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
def test_the_builtin_adapters_carry_fp8_bytes_exactly(port_name: str, fmt: str) -> None:
    """Every byte of an fp8 format (NaN patterns aside) through from_numpy and back: the
    dtype kept, the bits equal (torch.from_numpy takes no fp8: the adapter views uint8)."""
    import ml_dtypes

    port = load_port(port_name)
    bits = np.arange(256, dtype=np.uint8)
    x = bits.view(getattr(ml_dtypes, fmt))
    x = x[~np.isnan(x.astype(np.float32))]
    back = port.to_numpy(port.from_numpy(x, "cpu"))
    assert back.dtype == x.dtype and np.array_equal(back.view(np.uint8), x.view(np.uint8))
    port.check_round_trip(fmt, "cpu")  # the runner's own check passes too


def test_a_port_with_ulysses_in_its_sharded_submodule_still_runs_with_a_warning(
    tmp_path, monkeypatch
) -> None:
    """Until 2026-12-03 the runner found ``ulysses_attention`` in a port's ``sharded``
    submodule; it reads it there still (a DeprecationWarning), and finds it in ``ulysses``."""
    package = tmp_path / "oldport"
    package.mkdir()
    (package / "__init__.py").write_text("from impl_numpy import *  # noqa: F403\n")
    (package / "sharded.py").write_text("from impl_numpy.ulysses import ulysses_attention\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    port = load_port("oldport")
    with pytest.warns(DeprecationWarning, match="ulysses submodule"):
        fn = port.function("ulysses")
    import impl_numpy.ulysses

    assert fn is impl_numpy.ulysses.ulysses_attention
    assert load_port("impl_numpy").function("ulysses") is impl_numpy.ulysses.ulysses_attention
