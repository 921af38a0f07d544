"""``python -m bench`` for real (pytest + pytest-benchmark + the real gates) on the smoke grid,
its ``--gates-only`` and ``--budget-s`` modes, and the budget inside a session."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.gate import GateCache, run_gates
from bench.report import load_results
from bench.rows import row_by_name
from bench.workloads import Workload, grid

from .helpers import B, D, E, FakeBenchmark, H, K, L, S, machine, session_of, stub

REPO = Path(__file__).resolve().parents[2]


def test_gates_only_runs_each_distinct_gate_once():
    rows = tuple(row_by_name(n) for n in ("numpy sdpa", "numpy flash", "torch F.sdpa",
                                          "torch nn.MHA", "torch F.sdpa[flash]"))
    qc, calls = stub(True, 8)
    seen = []
    got = run_gates(machine("cpu"), rows, GateCache(quick_check=qc), on_result=seen.append)
    keys = [(g["port"], g["op"], g["pin"]) for g in got]
    assert keys == [("impl_numpy", "sdpa", None), ("impl_numpy", "flash", None),
                    ("conformance.ports.torch_fused", "sdpa", None)]
    assert got[2]["rows"] == ["torch F.sdpa", "torch nn.MHA"]  # one gate, both rows
    assert seen == got and len(calls) == 3  # the CUDA-only pinned row is not a CPU gate
    late = run_gates(machine("cpu"), rows, GateCache(quick_check=qc),
                     deadline=time.monotonic() - 1)
    assert {g["status"] for g in late} == {"not run"}


def test_gates_on_a_gpu_box_check_the_kernel_rows_on_their_own_ports():
    """``--gates-only`` on CUDA (faked: the framework devices of a GPU box) gates ``triton
    flash`` and ``pallas flash`` on their ports' flash fixtures, next to a pinned torch
    backend's gate; on the CPU there is no such gate (the rows are CUDA-only)."""
    rows = tuple(row_by_name(n) for n in ("torch F.sdpa[flash]", "triton flash", "pallas flash"))
    qc, calls = stub(True, 8)
    got = run_gates(machine("cuda"), rows, GateCache(quick_check=qc))
    assert [(g["port"], g["op"], g["pin"], g["rows"]) for g in got] == [
        ("conformance.ports.torch_fused", "sdpa", "flash", ["torch F.sdpa[flash]"]),
        ("conformance.ports.triton_flash", "flash", None, ["triton flash"]),
        ("conformance.ports.pallas_flash", "flash", None, ["pallas flash"]),
    ]
    assert [c[:3] for c in calls if "_flash" in c[0]] == [
        ("conformance.ports.triton_flash", "cuda", "flash"),
        ("conformance.ports.pallas_flash", "cuda", "flash"),
    ]
    assert run_gates(machine("cpu"), rows, GateCache(quick_check=qc)) == []


def test_no_case_starts_once_the_budget_is_spent():
    w = Workload("attention", B, H, K, L, S, D, E)
    session = session_of(stub(True, 8)[0], w)
    session.deadline = time.monotonic() - 1
    (case,) = [c for c in session.plan.cases if c.kind == "row"]
    bench = FakeBenchmark()
    with pytest.raises(pytest.skip.Exception, match="budget"):
        session.run_case(case, bench)
    assert bench.calls == 0
    rec = session.records[case.id]
    assert rec.status == "skipped" and "--budget-s" in rec.reason


@pytest.mark.slow
def test_python_m_bench_smoke_run_end_to_end(tmp_path):
    """The real pipeline on a seconds-long grid: every row gated and timed; the run's x64 and
    XLA memory settings recorded as the rows had them."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "bench", "--device", "cpu", "--grid", "smoke",
           "--rows", "numpy sdpa", "--out", str(out), "--no-plots"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    res = load_results(out)
    rows = [r for r in res["records"] if r["kind"] == "row"]
    # "numpy sdpa" names its training step too: each pair on its own op's smoke workloads
    names = {"numpy sdpa", "torch F.sdpa", "numpy sdpa train", "torch F.sdpa train"}
    assert {r["row"] for r in rows} == names
    smoke = grid("cpu", "smoke")
    assert len(rows) == 2 * len(smoke) and {w.op for w in smoke} == {"attention", "train"}
    for r in rows:
        assert r["gate"] is not None
        assert (r["status"] == "ok") == (r["gate"]["status"] == "passed")
        assert (r["stats"] is not None) == (r["status"] == "ok")
    raw = json.loads((out / "pytest-benchmark.json").read_text())
    timed = {b["extra_info"]["case"] for b in raw["benchmarks"]}
    assert timed == {r["case_id"] for r in res["records"] if r["status"] == "ok"}
    assert (out / "report.txt").read_text().count("numpy sdpa") >= 3
    env = res["environment"]
    assert "torch" in env["versions"] and "tf32" in env
    assert env["env"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.90"
    assert env["jax_enable_x64"] is False  # the gates turned it on and put it back
    assert res["peaks"]["cpu/float32"]["precision"] == "highest"
    # not the goals' grid: each names the grid that runs it (these rows' goals: quick's)
    assert {g["status"] for g in res["goals"]} == {"not run (quick grid)"}


@pytest.mark.slow
def test_cases_the_users_k_leaves_out_are_skipped_not_errors(tmp_path):
    """``python -m bench ... -- -k train`` (BENCH.md measures goals with ``-- -k test_goal``):
    the cases the user's own ``-k`` deselects are ``skipped`` and say why, the run exits 0,
    and the progress lines count only the selected cases."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "bench", "--device", "cpu", "--grid", "smoke", "--rows",
           "numpy sdpa", "--skip-gate", "--out", str(out), "--no-plots",
           "--", "-k", "train"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [r for r in load_results(out)["records"] if r["kind"] == "row"]
    by_status = {}
    for r in rows:
        by_status.setdefault(r["status"], set()).add(r["row"])
    assert by_status == {"ok": {"numpy sdpa train", "torch F.sdpa train"},
                         "skipped": {"numpy sdpa", "torch F.sdpa"}}
    assert {r["reason"] for r in rows if r["status"] == "skipped"} == {
        "deselected by the pytest arguments after --"
    }
    ran = sum(r["status"] == "ok" for r in rows)
    assert f"[{ran}/{ran}]" in proc.stdout
