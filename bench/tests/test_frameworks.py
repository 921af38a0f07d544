"""Each framework's side of a timed call (bench/frameworks.py): the synchronized CUDA call and
its memory (device calls stood in for), the memory probes on the CPU, and the peak matmul's
precision (bench/peak.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bench import frameworks, preparers
from bench.peak import prepare_matmul
from bench.plan import Case, Plan
from bench.rows import row_by_name
from bench.session import BenchSession
from bench.workloads import Workload

from .helpers import FakeBenchmark, machine

# ----------------------------------------------------------------------------------- CUDA, memory


def test_cuda_timing_synchronizes_inside_the_call(monkeypatch):
    torch = pytest.importorskip("torch")
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))
    p = frameworks.TORCH.prepare(
        lambda: events.append("kernel") or torch.is_inference_mode_enabled(), [], "cuda"
    )
    assert p.call() is True  # ran under inference_mode
    assert events == ["kernel", "sync"]


def test_cuda_peak_memory_is_the_peak_above_what_was_allocated(monkeypatch):
    torch = pytest.importorskip("torch")
    state = {"allocated": 1000, "peak": 1000}

    def fn():
        state["peak"] = 1000 + 4096 + 512  # a temporary and the output
        state["allocated"] = 1000 + 512
        return "out"

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: state.update(peak=1000))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: state["peak"])
    assert frameworks.peak_memory_torch_cuda(fn) == (4096 + 512, "torch.cuda.max_memory_allocated")


def test_peak_memory_numpy_sees_the_buffers():
    n = 1_000_003

    def fn():
        a = np.ones(n)
        return a, a * 2.0  # two float64 buffers alive at once

    got, method = frameworks.peak_memory_numpy(fn)
    assert method == "tracemalloc"
    assert 2 * 8 * n <= got < 2 * 8 * n + 64 * 1024


def test_peak_memory_torch_cpu_follows_allocations_in_order():
    torch = pytest.importorskip("torch")

    def fn():
        a = torch.ones(512, 1024)  # 2 MiB
        b = a[:256].clone()  # + 1 MiB while a is alive: the peak
        del a
        return b

    got, method = frameworks.peak_memory_torch_cpu(fn)
    assert method == "torch.profiler allocations"
    assert got == 3 * 2**20


def test_torch_forward_rows_see_the_scores_they_build():
    """The forward rows' probe on torch CPU sees what a call holds at its peak: the plain path
    its whole float32 (B, H, L, S) scores, the tiled path its output plus one (B, H, bq, bk)
    block of scores. The per-op probe the forward rows used before (each op's net self memory
    at its start) read the tiled call as its output alone (2.0 MiB against 7.6 at B=1, H=8,
    L=S=1024; here 64 KiB against 1.1 MiB)."""
    pytest.importorskip("torch")
    from attention_spec.validate import BLOCK_K, BLOCK_Q

    w = Workload("attention", 1, 2, 2, 512, 512, 16, 16)
    out_bytes = w.B * w.H * w.L * w.E * 4
    plain = preparers.prepare(row_by_name("torch sdpa"), w, "cpu")
    got, method = plain.memory()
    assert method == "torch.profiler allocations"
    assert got >= w.score_bytes() + out_bytes
    tiled = preparers.prepare(row_by_name("torch flash"), w, "cpu")
    block = w.B * w.H * min(BLOCK_Q, w.L) * min(BLOCK_K, w.S) * 4
    got, _ = tiled.memory()
    assert block + out_bytes <= got < w.score_bytes()  # a block, never the whole scores


def test_jax_memory_comes_from_xla_and_covers_the_scores():
    pytest.importorskip("jax")
    w = Workload("attention", 1, 4, 4, 64, 96, 8, 8)
    p = preparers.prepare(row_by_name("jax sdpa"), w, "cpu")
    got, method = p.memory()
    assert method == "xla" and p.compile_s > 0
    assert got >= w.score_bytes()


# ----------------------------------------------------------------------------------- peak matmul


def test_the_float32_peak_matmul_runs_at_the_rows_precision(monkeypatch):
    """Fix 7 of issue 16: % of peak for float32 is measured against an IEEE float32 matmul
    (JAX at HIGHEST, torch with TF32 off), the precision the project's rows pin, unless the
    run asked for TF32."""
    jax = pytest.importorskip("jax")
    torch = pytest.importorskip("torch")
    a = jax.numpy.ones((8, 8), jax.numpy.float32)
    assert "HIGHEST" in str(jax.make_jaxpr(frameworks.JAX.matmul("highest"))(a, a))
    assert "HIGHEST" not in str(jax.make_jaxpr(frameworks.JAX.matmul("tf32"))(a, a))
    seen = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda x, y: seen.append(
        torch.backends.cuda.matmul.fp32_precision) or real(x, y))
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # --tf32 on
    try:
        prepare_matmul("torch", "float32", 16, "cpu", "default")[0].call()
        prepare_matmul("torch", "float32", 16, "cpu", "on")[0].call()
    finally:
        torch.set_float32_matmul_precision(saved)
    assert seen == ["ieee", "tf32"]


def test_a_peak_case_records_its_precision():
    session = BenchSession(Plan(machine("cpu", tf32="default"), "test", [], ()))
    case = Case("peak|numpy|float32|64", "peak", "numpy", "cpu", dtype="float32", n=64)
    session.run_case(case, FakeBenchmark())
    assert session.records[case.id].matmul["precision"] == "highest"
    session.plan.machine = machine("cpu", tf32="on")
    session.run_case(case, FakeBenchmark())
    assert session.records[case.id].matmul["precision"] == "tf32"


def test_torch_probe_sees_the_peak_inside_an_autograd_function():
    """A training step runs inside outer records whose net self memory is negative (they free
    what their children allocated); the per-op probe places that at their start and misses the
    peak, the allocator trace does not."""
    torch = pytest.importorskip("torch")

    class Scratch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            tmp = torch.ones(1024, 1024)  # 4 MiB alive inside the node, freed before it ends
            y = x * tmp.sum()
            del tmp
            return y

        @staticmethod
        def backward(ctx, g):
            return g

    x = torch.ones(4)

    def fn():
        return Scratch.apply(x)

    got, method = frameworks.peak_memory_torch_cpu(fn)
    assert method == "torch.profiler allocations"
    assert 4 * 2**20 <= got < 4 * 2**20 + 64 * 1024
