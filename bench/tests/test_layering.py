"""How bench/ is put together (issue 9, "the bench layering"): the report side never needs
pytest, importing changes no environment, each call style is one preparer, bench needs nothing
from the project's tests, and every test session runs on the CPU unless asked otherwise."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


def _python(code: str, **env: str) -> str:
    full = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    full.update(env, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_report_side_never_imports_pytest():
    """results.json can be rendered, compared and plotted where pytest is not installed."""
    code = (
        "import sys, bench.report, bench.compare, bench.plots\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest')))"
    )
    assert _python(code) == "[]"


def test_importing_the_harness_changes_no_environment_variable():
    """Environment edits happen in main() (XLA's memory settings, leaving pytest-xdist), never
    because a module was imported: a test process that imports bench keeps its own."""
    code = (
        "import json, os\n"
        "before = dict(os.environ)\n"
        "import bench.__main__, bench.session, bench.plan, bench.preparers, bench.frameworks\n"
        "import bench.errors, bench.peak, bench.records, bench.gate, bench.devices\n"
        "import bench.bench_attention, bench.gpu_check, bench.tf32_probe\n"
        "print(json.dumps({k: (before.get(k), os.environ.get(k)) for k in set(before) | "
        "set(os.environ) if before.get(k) != os.environ.get(k)}))"
    )
    assert json.loads(_python(code, PYTEST_XDIST_WORKER="gw1")) == {}


def test_bench_needs_nothing_from_the_project_tests():
    for path in BENCH.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            assert not any(n == "tests" or n.startswith("tests.") for n in names), path


def test_the_gate_overlay_is_gone_because_every_package_exports_its_functions():
    """The overlay attached ``flash_attention`` to a package that did not export it yet; every
    implementation package exports what its rows time, so the gate checks the package as is."""
    import impl_jax
    import impl_numpy
    import impl_torch
    from bench import session
    from bench.rows import ROWS

    assert not hasattr(session, "gate_overlay")
    packages = {"impl_numpy": impl_numpy, "impl_torch": impl_torch, "impl_jax": impl_jax}
    for row in ROWS:
        if row.kind == "impl" and row.call == "functional":
            assert hasattr(packages[row.package], row.target.partition(":")[2]), row.name


@pytest.mark.parametrize("folder", ["tests", "conformance/tests", "bench/tests"])
def test_every_test_session_runs_on_the_cpu_unless_asked(folder, monkeypatch):
    """Fix 10 of issue 16: each test folder's conftest sets JAX_PLATFORMS=cpu before anything
    imports a framework (two xdist workers would otherwise each start JAX on the GPU), and keeps
    a value the user exported (``JAX_PLATFORMS=cuda pytest ...`` asks for the GPU). The
    conftest's statements before its first framework import are run here on their own."""
    tree = ast.parse((REPO / folder / "conftest.py").read_text())
    prefix = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            if any(n != "os" for n in names):
                break
        prefix.append(node)
    code = compile(ast.Module(body=prefix, type_ignores=[]), "conftest-prefix", "exec")
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    exec(code, {})
    assert os.environ.get("JAX_PLATFORMS") == "cpu"
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    exec(code, {})
    assert os.environ["JAX_PLATFORMS"] == "cuda"
