"""``make gpu-check`` (bench/gpu_check.py), the TF32 probe and the Makefile's GPU-box logic,
tried on this CPU machine: steps share one budget and survive each other, the summary names
what failed, nothing is installed, the CUDA extra follows the driver."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check
from bench.gpu_check import Step, StepResult, run_steps, summarize

REPO = Path(__file__).resolve().parents[2]


def _step(name: str, code: str, cap: float = 60, group: str | None = None) -> Step:
    return Step(name, f"step {name}", ("{py}", "-c", code), cap, group)


def test_steps_share_one_budget_and_survive_each_other(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "MIN_STEP_S", 1.0)
    steps = (
        _step("ok", "print('fine')"),
        _step("fails", "import sys; print('boom'); sys.exit(3)"),
        _step("hangs", "import time; time.sleep(60)"),  # killed when the budget ends
        _step("late", "print('never')"),
    )
    res = run_steps(steps, py=sys.executable, device="cpu", out=tmp_path, budget_s=6)
    assert [r.status for r in res] == ["passed", "failed", "timeout", "not run"]
    assert res[1].returncode == 3 and "boom" in res[1].tail
    assert (tmp_path / "ok.log").read_text().strip() == "fine"
    assert "budget" in res[3].tail
    assert res[2].seconds < 7


def test_a_group_s_steps_run_at_the_same_time(tmp_path):
    import time

    steps = tuple(_step(f"s{i}", "import time; time.sleep(1.5)", group="g") for i in range(3))
    t0 = time.monotonic()
    res = run_steps(steps, py=sys.executable, device="cpu", out=tmp_path, budget_s=60)
    assert [r.status for r in res] == ["passed"] * 3
    assert time.monotonic() - t0 < 4.0  # together, not one after the other (4.5 s)


def test_a_gpu_that_takes_one_process_runs_a_group_one_step_at_a_time(tmp_path, monkeypatch):
    """In compute mode Exclusive_Process a second process cannot open the GPU: the group's
    steps then run one after another, and the summary says so; nvidia-smi.txt holds the mode."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\n[ -n "$1" ] && echo "$MODE" || echo "NVIDIA-SMI page"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    stamp = "import time; print(time.time()); time.sleep(1); print(time.time())"
    monkeypatch.setattr(gpu_check, "STEPS", (_step("a", stamp, group="g"),
                                             _step("b", stamp, group="g")))
    for mode, apart in (("Default", False), ("Exclusive_Process", True)):
        monkeypatch.setenv("MODE", mode)
        out = tmp_path / mode
        assert gpu_check.main(["--device", "cpu", "--out", str(out)]) == 0
        (_, a1), (b0, _) = ([float(x) for x in (out / f"{n}.log").read_text().split()]
                            for n in "ab")
        assert (b0 >= a1) == apart, mode
        assert mode in (out / "nvidia-smi.txt").read_text()
        assert ("Exclusive_Process: the conformance parts ran one at a time"
                in (out / "summary.md").read_text()) == apart


def test_placeholders_are_filled_and_other_braces_left_alone():
    fill = {"py": "python3", "device": "cuda", "out": "/r", "small": "small", "budget": "90"}
    assert gpu_check._fill("{out}/tf32.json", fill) == "/r/tf32.json"
    assert gpu_check._fill("print({'a': 1})", fill) == "print({'a': 1})"
    argv = {s.name: s.argv for s in gpu_check.STEPS}
    assert argv["gates"][:4] == ("{py}", "-m", "bench", "--device")
    assert "--gates-only" in argv["gates"] and "--budget-s" in argv["bench-small"]
    assert {s.group for s in gpu_check.STEPS if s.name.startswith("conformance")} == {"conformance"}
    assert gpu_check.BUDGET_S <= 8 * 60 - 30


def test_each_port_s_conformance_runs_in_parts_that_make_the_whole_plan():
    """The conformance steps: every port once, its runs in parts 1/n .. n/n, one report each,
    all in one group (at the same time); ``--steps conformance-jax`` names all of its parts."""
    parts: dict[str, list[str]] = {}
    for s in gpu_check.STEPS:
        if s.group == "conformance":
            argv = list(s.argv)
            assert argv[argv.index("--report") + 1] == f"{{out}}/{s.name}.json"
            assert "--impl" in argv
            parts.setdefault(gpu_check._whole(s.name), []).append(argv[argv.index("--part") + 1])
    assert set(parts) == {f"conformance-{n}" for n in ("impl", "jax", "fused", "triton", "pallas")}
    for whole, got in parts.items():
        n = len(got)
        assert got == [f"{k}/{n}" for k in range(1, n + 1)], whole
    assert 8 <= sum(map(len, parts.values())) <= 16  # a GPU box's cores, not more
    assert gpu_check._whole("conformance-jax-2of4") == "conformance-jax"
    assert gpu_check._whole("bench-small") == "bench-small"


def _write_fake_run(out: Path) -> list[StepResult]:
    """The files the steps write, with one of every kind of failure in them."""
    (out / "versions.json").write_text(json.dumps({
        "device_name": "NVIDIA H200", "versions": {"torch": "2.11.0", "jax": "0.11.0"},
        "cuda": {"torch.version.cuda": "13.0", "cudnn": 91000}, "git": {"commit": "abc1234567"},
    }))
    (out / "tf32.json").write_text(json.dumps({"device": "cuda", "probes": [
        {"framework": "jax", "what": "jax.nn.dpa", "setting": "default", "rel_error": 1e-3,
         "reads_as": "tf32"},
        {"framework": "jax", "what": "port jax_fused", "setting": "tf32 on", "rel_error": 1e-6,
         "reads_as": "ieee"},
    ]}))
    (out / "gates").mkdir()
    (out / "gates" / "gates.json").write_text(json.dumps([
        {"status": "passed", "port": "impl_torch", "op": "sdpa", "pin": None, "device": "cuda",
         "detail": "", "rows": ["torch sdpa"]},
        {"status": "failed", "port": "conformance.ports.torch_fused", "op": "sdpa",
         "pin": "cudnn", "device": "cuda", "detail": "sdpa.kernel.d16.gqa.float16: max error 1",
         "rows": ["torch F.sdpa[cudnn]"]},
    ]))
    outcome = {"run_id": "sdpa.fully_masked.bool_row.float32", "status": "fail",
               "message": "output max error nan > bound 1e-06"}
    (out / "conformance-fused-1of2.json").write_text(json.dumps([
        {"port": "conformance.ports.torch_fused", "counts": {"pass": 9, "fail": 1, "xfail": 2,
         "xpass": 0}, "outcomes": [outcome], "error": "", "complete": True, "planned": 12},
    ]))
    passed = {"run_id": "sdpa.gqa.h6_k2.float32", "status": "pass", "message": ""}
    (out / "conformance-jax-1of4.json").write_text(json.dumps([
        {"port": "impl_jax", "counts": {"pass": 2, "fail": 0, "xfail": 0, "xpass": 0},
         "outcomes": [passed, passed], "error": "", "complete": False, "planned": 480},
    ]))
    (out / "bench-small").mkdir()
    (out / "bench-small" / "results.json").write_text(json.dumps({"records": [
        {"row": "jax.nn.dpa[cudnn]", "status": "error", "reason": "XlaRuntimeError: CUDNN_STATUS"},
        {"row": "torch sdpa", "status": "ok", "reason": ""},
    ]}))
    return [
        StepResult("versions", "versions", "passed", 3.0),
        StepResult("tf32", "TF32 probe", "passed", 9.0),
        StepResult("gates", "every gate", "failed", 50.0, 1),
        StepResult("conformance-fused-1of2", "fused ports", "failed", 80.0, 1),
        StepResult("conformance-jax-1of4", "impl_jax", "timeout", 150.0, None),
        StepResult("bench-smoke", "smoke", "timeout", 90.0, None, tail="Traceback: stuck"),
        StepResult("bench-small", "small grid", "failed", 200.0, 1),
    ]


def test_the_summary_is_one_page_of_what_failed(tmp_path):
    from conformance.runner import Xfails

    text = summarize(tmp_path, _write_fake_run(tmp_path), device="cuda")
    assert (tmp_path / "summary.md").read_text() == text
    assert text.startswith("# GPU check, ") and "NVIDIA H200" in text and "abc1234567" in text
    assert "TF32 where allowed: jax jax.nn.dpa (default)" in text
    assert "1/2 passed" in text and "torch F.sdpa[cudnn]" in text and "max error 1" in text
    assert "`sdpa.fully_masked.bool_row.float32`" in text
    assert "impl_jax 2 pass, 0 fail, 0 xfail, 0 xpass (cut short: 2 of 480 runs made)" in text
    assert "Traceback: stuck" in text  # a step without files of its own shows its log's end
    assert "error: jax.nn.dpa[cudnn]: XlaRuntimeError" in text
    assert len(text.splitlines()) < 70
    # the candidate xfail lines are device-specific entries the runner's format reads
    lines = [ln for ln in text.splitlines() if ln.startswith("cuda: ")]
    xf = Xfails.parse("\n".join(lines))
    assert xf.reason("sdpa.fully_masked.bool_row.float32", "cuda")
    assert xf.reason("sdpa.fully_masked.bool_row.float32", "cpu") is None


def test_the_tf32_probe_reads_ieee_on_a_cpu_and_would_flag_tf32():
    from bench.tf32_probe import must_be_ieee, probe, reads_as

    assert reads_as(1e-3) == "tf32" and reads_as(1e-6) == "ieee"
    results = probe("cpu", n=64, length=32)
    kinds = {(r["framework"], r["what"], r["setting"]) for r in results}
    assert ("jax", "jax.nn.dpa", "tf32 on, gate") in kinds
    assert ("torch", "port torch_fused", "tf32 on") in kinds
    assert ("jax", "port jax_fused", "tf32 on") in kinds
    assert all(r.get("reads_as") == "ieee" for r in results), results  # no TF32 on a CPU
    assert sum(must_be_ieee(r) for r in results) == 6


@pytest.mark.slow
def test_gpu_check_runs_end_to_end_on_this_cpu(tmp_path):
    """The real command, steps limited to the quick ones: a folder with nvidia-smi's answer,
    the versions, the summary, and exit 0."""
    out = tmp_path / "check"
    cmd = [sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--steps", "versions",
           "--out", str(out), "--budget-s", "120"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    versions = json.loads((out / "versions.json").read_text())
    assert versions["versions"]["torch"] and "tf32" in versions
    assert (out / "nvidia-smi.txt").read_text()
    assert "| versions and nvidia-smi | passed |" in (out / "summary.md").read_text()


# ----------------------------------------------------------------------------------- Makefile


#: What an outer ``make test PY=...`` hands its recipe's environment: the inner make must see
#: the Makefile's own defaults, not the knobs the suite itself was started with.
_OUTER_MAKE = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "PY", "PYTHON", "VENV", "ACCEL",
               "DEVICE", "BENCH", "WORKERS", "GPU_PY", "TORCH_SPEC", "JAX_SPEC"}


def _make(*args: str, path_prefix: str | None = None, **env: str) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("no make here")
    full = {name: value for name, value in os.environ.items() if name not in _OUTER_MAKE}
    full.update(env)
    if path_prefix:
        full["PATH"] = f"{path_prefix}{os.pathsep}{full['PATH']}"
    return subprocess.run(["make", "-C", str(REPO), "--no-print-directory", *args], env=full,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def fake_nvidia_smi(tmp_path):
    """An nvidia-smi that reports the CUDA version in $FAKE_CUDA, first on PATH."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text('#!/bin/sh\necho "| NVIDIA-SMI 580.65  Driver Version: 580.65  '
                   'CUDA Version: ${FAKE_CUDA}  |"\n')
    exe.chmod(0o755)
    return str(tmp_path)


def test_the_jax_cuda_extra_follows_the_driver_s_cuda(fake_nvidia_smi):
    """Fix 9: jax[cuda12] no longer matches current JAX's CUDA 13 plugin; the extra comes
    from the CUDA version the driver reports."""
    out = _make("help", path_prefix=fake_nvidia_smi, FAKE_CUDA="13.0").stdout
    assert "ACCEL=cuda" in out and "JAX_SPEC='jax[cuda13]>=0.4.35'" in out
    out = _make("help", path_prefix=fake_nvidia_smi, FAKE_CUDA="12.4").stdout
    assert "JAX_SPEC='jax[cuda12]>=0.4.35'" in out


def test_gpu_check_installs_nothing_and_uses_python3(fake_nvidia_smi):
    dry = _make("-n", "gpu-check", path_prefix=fake_nvidia_smi, FAKE_CUDA="13.0").stdout
    assert dry.strip() == "python3 -m bench.gpu_check --device cuda"
    assert "pip" not in dry and "venv" not in dry
    assert _make("-n", "gpu-check", "PY=/opt/py").stdout.startswith("/opt/py -m bench.gpu_check")


def test_conformance_honours_device():
    dry = _make("-n", "conformance", "PY=/x/python", "DEVICE=cuda").stdout
    assert dry.strip().endswith("--impl impl_jax --device cuda")
    assert (
        _make("-n", "conformance-frameworks", "PY=/x/python")
        .stdout.strip()
        .endswith("--device cpu")
    )


def test_an_offline_box_is_told_to_use_its_own_python(tmp_path):
    """A venv whose pip cannot reach the index: one clear line, no minutes of retries."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text("#!/bin/sh\nexit 1\n")  # every pip call fails, as offline
    fake.chmod(0o755)
    proc = _make("bench", f"VENV={venv}")
    assert proc.returncode != 0
    assert "the package index cannot be reached" in proc.stderr
    assert "make bench PY=python3" in proc.stderr
    assert not (venv / ".installed").exists()
