"""The suite installed alone: the wheel with the ``conformance`` extra, in a fresh virtual
environment outside the repository, with NumPy and no torch or JAX (conformance/PORTING.md,
"Installing the suite alone").

Builds the wheel from this checkout, installs it (and pytest) from the machine's package index
into a plain ``python -m venv`` (no system site-packages: torch must be truly absent), then, from
a folder outside the clone: the fixtures, the runner, ``--exec`` and the pytest plugin.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXEC_PORT = Path(__file__).with_name("exec_numpy_port.py")


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_wheel_installs_the_suite_without_torch_or_jax(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    wheels = tmp_path / "wheels"
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
         str(wheels), str(ROOT)],
        tmp_path, env,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert "is absent from the `packages` configuration" not in built.stdout + built.stderr
    (wheel,) = wheels.glob("rosetta_attention-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    installed = _run(
        [python, "-m", "pip", "install", "--quiet", f"{wheel}[conformance]", "pytest"],
        tmp_path, env,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr

    outside = tmp_path / "porter"  # a porter's folder: no clone, no PYTHONPATH
    outside.mkdir()
    for framework in ("torch", "jax"):
        absent = _run([python, "-c", f"import {framework}"], outside, env)
        assert absent.returncode != 0 and "No module named" in absent.stderr

    listed = _run([python, "-m", "conformance", "--impl", "impl_numpy", "--list"], outside, env)
    assert listed.returncode == 0, listed.stderr
    assert "sdpa.gqa.h6_k2.float32" in listed.stdout.split()  # the fixtures came along

    port = outside / "exec_numpy_port.py"  # an --exec port that needs only NumPy
    shutil.copy(EXEC_PORT, port)
    through = _run(
        [python, "-m", "conformance", "--exec", f"{python} {port}", "-k", "*gqa*float32"],
        outside, env,
    )
    assert through.returncode == 0, through.stdout + through.stderr
    assert "all ports pass" in through.stdout

    junit = outside / "junit.xml"
    plugin = _run(
        [python, "-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "conformance",
         "--port", "impl_numpy", "-k", "gqa and float32", f"--junitxml={junit}"],
        outside, env,
    )
    assert plugin.returncode == 0, plugin.stdout + plugin.stderr
    passed = re.search(r"(\d+) passed", plugin.stdout)
    assert passed and "failed" not in plugin.stdout, plugin.stdout
    assert junit.read_text().count("<testcase") == int(passed.group(1)) > 0  # one per run id
