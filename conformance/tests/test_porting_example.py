"""PORTING.md's example port, extracted and run exactly as the document says: one command,
from a folder outside the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import conformance

REPO = Path(conformance.__file__).resolve().parent.parent
PORTING = REPO / "conformance" / "PORTING.md"


def test_the_example_port_passes_with_one_command(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", PORTING.read_text(), re.S)
    parts = [b for b in blocks if b.startswith(('"""myport', "# myport.py, continued"))]
    assert len(parts) == 3 and "class GroupedQueryAttention" in parts[1]
    assert "def varlen_attention" in parts[2] and "def paged_attention" in parts[2]
    example = "\n\n".join(parts)
    ports = tmp_path / "ports"
    ports.mkdir()
    (ports / "myport.py").write_text(example)
    (xfails,) = re.findall(r"```\n(# myport.xfails.*?)```", PORTING.read_text(), re.S)
    (ports / "myport.xfails").write_text(xfails)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ports), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "conformance", "--impl", "myport"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "myport on cpu" in done.stdout and "all ports pass" in done.stdout


def test_a_ports_own_xfails_file_is_found_next_to_it(tmp_path: Path) -> None:
    """``myport.xfails`` beside ``myport.py`` is read; a listed run that passes is an XPASS."""
    (tmp_path / "myport.py").write_text("from impl_numpy import *  # noqa: F403\n")
    (tmp_path / "myport.xfails").write_text("sdpa.gqa.h6_k2.float32  # believed broken\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run(
        [sys.executable, "-m", "conformance", "--impl", "myport", "-k", "sdpa.gqa.*"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 1
    assert "XPASS sdpa.gqa.h6_k2.float32 [cpu float32]" in done.stdout
    assert "believed broken" in done.stdout


def test_the_failure_line_quoted_in_porting_md_is_what_the_runner_prints() -> None:
    """PORTING.md shows the failure of a port that forgets 1/sqrt(D); the runner, applied to
    the broken port with that bug, prints exactly that line (so the document cannot drift)."""
    from conformance.runner import run_suite
    from conformance.tests.broken_ports import make_port

    (quoted,) = [
        line for line in PORTING.read_text().splitlines() if line.startswith("FAIL sdpa.saturation")
    ]
    run_id = quoted.split()[1]
    report = run_suite(make_port("scale_missing"), select=lambda r: r.id == run_id)
    assert [o.line() for o in report.outcomes] == [quoted]
