"""The pytest plugin (conformance/pytest_plugin.py): one item per run id, the runner's verdicts.

Each test runs pytest in a subprocess (pytester) on a few runs (``--port-function causal_mask``,
``-k``), and holds its result to what the runner itself says for the same selection: the same
count, the same failing run ids, the xfails as xfail/XPASS/skip, one JUnit testcase per run id.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance.runner import load_port, plan_runs, run_suite

pytest_plugins = ["pytester"]

#: The plugin, and none of the dev environment's other plugins (a second apiece at startup).
OTHERS = ("-pno:benchmark", "-pno:xdist", "-pno:hypothesispytest", "-pno:anyio")
PLUGIN = ("-p", "conformance.pytest_plugin", "-p", "no:cacheprovider", *OTHERS)
#: The suite without the package's own tests folder (whose conftest imports torch, in a clone).
SUITE = ("--pyargs", "conformance.pytest_plugin")
EXEC_PORT = Path(__file__).with_name("exec_numpy_port.py")

BROKEN = """
from conformance.tests.broken_ports import make_port
port = make_port("causal_off_by_one")
"""

#: A plugin of the test's own: which frameworks the session imported, at its end.
IMPORTS = """
import sys
def pytest_sessionfinish(session):
    print("FRAMEWORKS IMPORTED:", sorted(m for m in ("torch", "jax") if m in sys.modules))
"""


def _ids(port, **keywords) -> list[str]:
    return [r.id for r in plan_runs(load_port(port), **keywords)]


def _failed(result: pytest.RunResult) -> set[str]:
    return set(re.findall(r"^FAILED conformance::(\S+)", result.stdout.str(), re.M))


def test_a_passing_port_passes_every_run_the_runner_plans(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(imports=IMPORTS)
    result = pytester.runpytest_subprocess(
        *PLUGIN, "-p", "imports", *SUITE, "--port", "impl_numpy", "--port-function",
        "causal_mask", "-s",
    )
    result.assert_outcomes(passed=len(_ids("impl_numpy", functions=["causal_mask"])))
    assert "FRAMEWORKS IMPORTED: []" in result.stdout.str()  # impl_numpy needs neither


def test_an_exec_port_runs_through_the_protocol(pytester: pytest.Pytester) -> None:
    command = f"{sys.executable} {EXEC_PORT}"
    result = pytester.runpytest_subprocess(
        *PLUGIN, *SUITE, "--port-exec", command, "--port-function", "causal_mask",
        "--port-exec-timeout", "60",
    )
    result.assert_outcomes(passed=len(_ids("impl_numpy", functions=["causal_mask"])))


def test_a_broken_port_fails_exactly_the_runs_the_runner_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(brokenmod=BROKEN)
    from conformance.tests.broken_ports import make_port

    report = run_suite(make_port("causal_off_by_one"), functions=["causal_mask"])
    failing = {o.run_id for o in report.failures}
    assert failing  # the bug is caught at all
    result = pytester.runpytest_subprocess(
        *PLUGIN, *SUITE, "--port", "brokenmod:port", "--port-function", "causal_mask", "-rf"
    )
    result.assert_outcomes(failed=len(failing), passed=len(report.outcomes) - len(failing))
    assert _failed(result) == failing
    # the message is the runner's line: the bound, the worst element, both values
    result.stdout.fnmatch_lines(["FAIL causal_mask.top_left.l5_s7.bool *max error 1 > bound 0*"])

    stopped = pytester.runpytest_subprocess(  # item by item in pytest's process, up to one
        *PLUGIN, *SUITE, "--port", "brokenmod:port", "--port-function", "causal_mask", "-x",
        "--port-in-process",
    )
    assert stopped.parseoutcomes()["failed"] == 1
    stopped.stdout.fnmatch_lines(["FAIL causal_mask.top_left.l5_s7.bool *max error 1 > bound 0*"])


def test_xfails_become_strict_xfail_and_skip(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(brokenmod=BROKEN)
    from conformance.tests.broken_ports import make_port

    report = run_suite(make_port("causal_off_by_one"), functions=["causal_mask"])
    failing = sorted(o.run_id for o in report.failures)
    passing = sorted(o.run_id for o in report.outcomes if o.status == "pass")
    listed = [*failing, f"{passing[0]}  # passes: XPASS", f"skip: {passing[1]}  # not run"]
    xfails = pytester.makefile(".xfails", broken="\n".join(listed))
    result = pytester.runpytest_subprocess(
        *PLUGIN, *SUITE, "--port", "brokenmod:port", "--port-function", "causal_mask",
        "--port-xfails", str(xfails), "-rfxs",
    )
    result.assert_outcomes(
        xfailed=len(failing), failed=1, skipped=1, passed=len(passing) - 2
    )  # the one failure: the listed run that passes, as XPASS(strict)
    assert _failed(result) == {passing[0]}
    result.stdout.fnmatch_lines(["*XPASS(strict)*passes: XPASS*", "SKIPPED *not run*"])


def test_pyargs_conformance_gives_one_junit_testcase_per_run(pytester: pytest.Pytester) -> None:
    want = _ids("impl_numpy", functions=["sdpa", "causal_mask"], pattern="top_left")
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        *PLUGIN, "--pyargs", "conformance", "--port", "impl_numpy", "--port-function", "sdpa",
        "--port-function", "causal_mask", "-k", "top_left", f"--junitxml={junit}",
    )
    result.assert_outcomes(passed=len(want))
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    assert sorted(c.get("name") for c in cases) == sorted(want)
    assert {c.get("classname") for c in cases} == {"conformance"}


def test_without_a_port_the_plugin_collects_nothing(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess(*PLUGIN, *SUITE)
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    pytester.makepyfile(test_own="def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    pytester.runpytest_subprocess(*PLUGIN, "test_own.py").assert_outcomes(passed=2)  # unchanged


CRASHY = """
import os
import signal

import impl_numpy


def causal_mask(q_len, kv_len, *, alignment="top_left"):
    if (q_len, kv_len, alignment) == (5, 7, "top_left"):
        os.kill(os.getpid(), signal.SIGSEGV)
    return impl_numpy.causal_mask(q_len, kv_len, alignment=alignment)
"""


@pytest.mark.slow  # four child processes, two of them crashing: about 10 s
def test_a_crash_fails_its_item_and_the_rest_still_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(crashy=CRASHY)
    pytester.syspathinsert()
    # the runner underneath, on the selected runs only: the retry after the crash keeps to them
    every = _ids("crashy", functions=["causal_mask"])
    only = [i for i in every if ".top_left." in i]
    report = run_suite("crashy", functions=["causal_mask"], isolate=True, only=only)
    assert [o.run_id for o in report.outcomes] == only
    assert [o.run_id for o in report.failures] == ["causal_mask.top_left.l5_s7.bool"]

    result = pytester.runpytest_subprocess(
        *PLUGIN, *SUITE, "--port", "crashy", "--port-function", "causal_mask", "-k", "top_left"
    )
    result.assert_outcomes(failed=1, passed=len(only) - 1, deselected=len(every) - len(only))
    result.stdout.fnmatch_lines(["CRASH causal_mask.top_left.l5_s7.bool *SIGSEGV*again on retry*"])
