"""Devices, the row registry and the plan (bench/devices.py, rows.py, plan.py):
what runs where, what is skipped and why. Device calls are stood in for; no GPU needed."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from bench import devices
from bench.devices import resolve_device, set_tf32, tf32_state
from bench.plan import HOST_LIMIT, build_cases, select_rows
from bench.rows import ROWS, Row, row_by_name
from bench.session import pytest_args
from bench.workloads import (
    GOAL_WORKLOAD,
    TRAIN_GOAL_WORKLOAD,
    TRAIN_MEMORY_WORKLOAD,
    Workload,
    grid,
)

from .helpers import goal_cases, machine, plan

# ----------------------------------------------------------------------------------- devices


def test_resolve_device_auto_prefers_cuda_then_tpu():
    assert resolve_device("auto", cuda=True, platforms=frozenset({"cpu", "tpu"})) == "cuda"
    assert resolve_device("auto", cuda=False, platforms=frozenset({"cpu", "tpu"})) == "tpu"
    assert resolve_device("auto", cuda=False, platforms=frozenset({"cpu"})) == "cpu"
    assert resolve_device("auto", cuda=False, platforms=frozenset({"cpu", "gpu"})) == "cuda"


def test_resolve_device_refuses_a_missing_or_unknown_device():
    with pytest.raises(RuntimeError, match="--device cuda"):
        resolve_device("cuda", cuda=False, platforms=frozenset({"cpu"}))
    with pytest.raises(ValueError, match="--device must be one of"):
        resolve_device("gpu0", cuda=False, platforms=frozenset())


def test_contention_is_other_processes_cpu_share():
    from bench.devices import cpu_snapshot, others_share

    # 2 s on 2 CPUs; the machine was busy 3 CPU-s, 1 of them ours: others took 2 of 4
    assert others_share((0.0, 100.0, 10.0), (2.0, 103.0, 11.0), 2) == pytest.approx(0.5)
    assert others_share((0.0, 100.0, 10.0), (2.0, 101.0, 11.0), 2) == 0.0
    assert others_share(None, (2.0, 103.0, 11.0), 2) is None
    if cpu_snapshot() is None:
        pytest.skip("no /proc here")
    burn = "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass"
    before = cpu_snapshot()
    subprocess.run([sys.executable, "-c", burn], check=True)
    share = others_share(before, cpu_snapshot())
    assert share is not None and share > 0.1  # a child burning one core is another process


@pytest.fixture
def torch_precision():
    """Put torch's float32 matmul settings back as they were (both of its APIs)."""
    torch = pytest.importorskip("torch")
    import jax

    saved = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.fp32_precision
    yield torch
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cuda.matmul.fp32_precision = saved[1]
    jax.config.update("jax_default_matmul_precision", None)


def test_tf32_state_is_recorded_and_settable(torch_precision):
    torch = torch_precision
    set_tf32("on")
    state = tf32_state()
    assert state["torch.backends.cuda.matmul.allow_tf32"] is True
    assert state["torch.get_float32_matmul_precision"] == "high"
    assert state["jax_default_matmul_precision"] == "tensorfloat32"
    set_tf32("off")
    assert tf32_state()["torch.backends.cuda.matmul.allow_tf32"] is False
    assert torch.backends.cuda.matmul.fp32_precision == "ieee"  # both APIs in step
    with pytest.raises(ValueError, match="--tf32"):
        set_tf32("sometimes")


def test_tf32_state_survives_torch_s_mixed_apis(torch_precision):
    """Once the new per-backend API disagrees with the legacy one, torch's legacy getters
    raise (torch 2.13); the state is still recorded, and so is the whole environment."""
    torch = torch_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # new API only: a mixed state
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        torch.get_float32_matmul_precision()
    state = tf32_state()
    assert state["torch.get_float32_matmul_precision"].startswith("error: ")
    assert state["torch.backends.cuda.matmul.fp32_precision"] == "tf32"
    env = devices.environment("cpu")
    assert env["tf32"] == state
    set_tf32("off")  # set_float32_matmul_precision puts both APIs back in step
    assert torch.get_float32_matmul_precision() == "highest"


def test_configure_environment_sets_xla_memory_and_leaves_what_the_user_set(monkeypatch):
    for v in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    got = devices.configure_environment(own_session=False)
    assert got == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                   "XLA_PYTHON_CLIENT_MEM_FRACTION": devices.JAX_MEM_FRACTION}
    assert os.environ["PYTEST_XDIST_WORKER"] == "gw0"  # plain pytest: left alone
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".5")
    devices.configure_environment()
    assert os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == ".5"
    assert "PYTEST_XDIST_WORKER" not in os.environ  # its own session: timing stays on


def test_jax_on_a_gpu_is_planned_against_xla_s_own_limit(monkeypatch):
    """XLA stops at its memory fraction even without preallocation, so a JAX row is held to
    ``bytes_limit - bytes_in_use``, not to what torch sees free."""
    gib = 2**30
    stats = {"bytes_limit": int(0.9 * 80 * gib), "bytes_in_use": 2 * gib}
    fake_jax = SimpleNamespace(devices=lambda p: [SimpleNamespace(memory_stats=lambda: stats)])
    monkeypatch.setattr(devices, "_try_import", lambda name: fake_jax if name == "jax" else None)
    monkeypatch.setattr(devices, "jax_platforms", lambda: frozenset({"cpu", "gpu"}))
    monkeypatch.setattr(devices, "_torch_cuda_free", lambda: 79 * gib)
    budgets = devices.memory_budgets("cuda")
    assert budgets["torch"] == 79 * gib
    assert budgets["jax"] == int(0.9 * 80 * gib) - 2 * gib  # 70 GiB, not 79
    monkeypatch.setattr(devices, "_torch_cuda_free", lambda: 40 * gib)  # and never above free
    assert devices.memory_budgets("cuda")["jax"] == 40 * gib
    # a materializing row that fits torch's 79 GiB but not XLA's 70 GiB
    w = Workload("attention", 1, 16, 16, 19456, 19456, 128, 128, False, "bfloat16")
    need = w.peak_bytes(row_by_name("jax sdpa").materializes)
    assert 0.9 * 70 * gib < need < 0.9 * 79 * gib
    rows = (row_by_name("jax sdpa"), row_by_name("torch sdpa"))
    cases = plan("cuda", [w], rows, memory={"numpy": None, "torch": 79 * gib, "jax": 70 * gib})
    by = {c.row.name: c for c in cases if c.kind == "row"}
    assert by["torch sdpa"].skip is None
    assert by["jax sdpa"].skip[0] == "skipped" and "free for jax" in by["jax sdpa"].skip[1]


# ----------------------------------------------------------------------------------- the plan


def test_cuda_plan_has_every_sdpa_backend_and_skips_what_cannot_fit():
    ws = grid("cuda", "full")
    cases = plan("cuda", ws, memory=80 * 2**30)
    names = {c.row.name for c in cases if c.row}
    for backend in ("math", "flash", "efficient", "cudnn"):
        assert f"torch F.sdpa[{backend}]" in names
    assert "jax.nn.dpa[cudnn]" in names
    assert {c.fdevice for c in cases if c.framework == "torch"} == {"cuda"}
    assert {c.fdevice for c in cases if c.framework == "jax"} == {"gpu"}
    peaks = {(c.framework, c.dtype) for c in cases if c.kind == "peak"}
    assert {("torch", "bfloat16"), ("torch", "float16"), ("jax", "float32")} <= peaks
    assert ("numpy", "bfloat16") not in peaks
    # host NumPy: float32 and L*S <= 4096^2 only
    for c in cases:
        if c.framework == "numpy" and c.kind == "row":
            w = c.workload
            if w.dtype != "float32" or w.L * w.S > HOST_LIMIT:
                assert c.skip and c.skip[0] == "skipped" and "host NumPy" in c.skip[1]
    # a materializing row at 128k does not fit in 80 GiB; a fused kernel does
    big = [c for c in cases if c.workload and c.workload.L == 131072 and c.skip is None]
    assert big and all(not c.row.materializes for c in big)
    assert big and all(c.row.kind == "baseline" for c in big)  # project rows stop at 32k
    skipped = [c for c in cases if c.skip and "GiB free" in c.skip[1]]
    assert skipped and all(c.row.materializes for c in skipped)


def test_cpu_plan_leaves_out_cuda_only_rows_and_orders_by_framework():
    cases = plan("cpu", grid("cpu", "quick"))
    names = [c.row.name for c in cases if c.row]
    assert "torch F.sdpa" in names and "jax.nn.dpa[xla]" in names
    assert not any("[flash]" in n or "[cudnn]" in n or "[math]" in n for n in names)
    order = [c.framework for c in cases]
    assert order == sorted(order, key=["numpy", "torch", "jax"].index)
    assert cases[0].kind == "peak"
    assert all(c.skip is None for c in cases)


def test_a_row_whose_code_is_missing_is_visible_as_na():
    ghost = Row("numpy ghost", "impl_numpy.no_such_module:flash_attention")
    cases = build_cases(machine("cpu"), [GOAL_WORKLOAD], (ghost,))
    (case,) = [c for c in cases if c.kind == "row"]
    assert case.skip[0] == "n/a"
    assert "No module named 'impl_numpy.no_such_module'" in case.skip[1]


def test_rows_are_derived_from_their_targets():
    assert row_by_name("numpy sdpa").kind == "impl"
    assert row_by_name("numpy sdpa").gate_port == "impl_numpy"
    assert row_by_name("torch F.sdpa").gate_port == "conformance.ports.torch_fused"
    assert row_by_name("flax nnx.MHA").framework == "jax"
    assert row_by_name("flax nnx.MHA").gate_port == "conformance.ports.jax_fused"
    assert row_by_name("torch flash").gate_alias == "flash"
    assert row_by_name("jax sdpa").gate_alias == "sdpa"
    assert row_by_name("torch GQA module").gate_alias == "module"
    assert row_by_name("torch nn.MHA").gate_alias == "sdpa"  # gated through torch_fused
    for fw in ("numpy", "torch", "jax"):  # training steps: on the gradient fixtures
        assert row_by_name(f"{fw} sdpa train").gate_alias == "grad"
        assert row_by_name(f"{fw} flash train").gate_alias == "flash_grad"
    assert (row_by_name("torch F.sdpa train").gate_port, row_by_name("torch F.sdpa train")
            .gate_alias) == ("conformance.ports.torch_fused", "grad")
    for fw in ("numpy", "torch", "jax"):  # stepped through init_cache/decode on the fixtures
        row = row_by_name(f"{fw} decode")
        assert (row.gate_port, row.gate_alias) == (f"impl_{fw}", "decode")
        assert row.applies_to(grid("cpu", "quick")[-1]) and not row.applies_to(GOAL_WORKLOAD)
    assert row_by_name("torch F.sdpa decode").gate_port == "conformance.ports.torch_fused"
    assert row_by_name("jax.nn.dpa decode").gate_alias == "sdpa"
    names = [r.name for r in ROWS]
    assert len(set(names)) == len(names)
    for r in ROWS:  # every ratio reference is a registered row
        assert r.ref is None or r.ref in names
        assert all(g.ref is None or g.ref in names for g in r.goals)
    with pytest.raises(KeyError, match="no row"):
        row_by_name("numpy nope")


def test_pinned_rows_are_gated_on_their_own_kernel():
    pins = {r.name: (r.gate_pin, r.kernel) for r in ROWS if r.gate_pin is not None}
    assert pins == {
        "torch F.sdpa[math]": ("math", "torch_sdpa"),
        "torch F.sdpa[flash]": ("flash", "torch_sdpa"),
        "torch F.sdpa[efficient]": ("efficient", "torch_sdpa"),
        "torch F.sdpa[cudnn]": ("cudnn", "torch_sdpa"),
        "jax.nn.dpa[cudnn]": ("cudnn", "jax_cudnn"),
    }
    for name in ("torch F.sdpa", "jax.nn.dpa[xla]", "torch nn.MHA", "numpy sdpa"):
        assert row_by_name(name).gate_pin is None and row_by_name(name).kernel is None


def test_select_rows_keeps_the_reference_kernels():
    chosen = [r.name for r in select_rows("numpy sdpa")]  # a substring: its training step too
    assert chosen == ["numpy sdpa", "torch F.sdpa", "numpy sdpa train", "torch F.sdpa train"]
    chosen = [r.name for r in select_rows("jax flash train")]  # the memory goal's plain path too
    assert chosen == ["jax sdpa train", "jax flash train", "jax.nn.dpa[xla] train"]
    with pytest.raises(SystemExit):
        select_rows("no such row")


def test_pytest_args_carry_the_benchmark_settings(tmp_path):
    args = pytest_args(tmp_path, "quick", ["--benchmark-autosave"])
    assert args[0].endswith("bench_attention.py")
    assert f"--benchmark-json={tmp_path / 'pytest-benchmark.json'}" in args
    assert "--benchmark-min-rounds=3" in args and args[-1] == "--benchmark-autosave"


def test_goal_cases_are_planned_for_the_cpu_goals_of_the_grid():
    """One interleaved case per goal when its two calls are in the run: a CPU run whose grid
    has the goal workload (and its causal twin) and whose rows include both."""
    quick, full = grid("cpu", "quick"), grid("cpu", "full")
    everything = goal_cases("cpu", full, ROWS, resolve_error=lambda r: None)
    assert len(everything) == sum(len(r.goals) for r in ROWS) == 35  # the full grid: every goal
    cases = goal_cases("cpu", quick, ROWS, resolve_error=lambda r: None)
    heavy = {(c.row.name, c.goal.kind) for c in everything if c.goal.kind in ("window", "memory")}
    assert len(heavy) == 6  # three flash rows' window goals, three training steps' memory goals
    mla = {(c.row.name, c.goal.kind) for c in everything if c.workload.op == "mla_decode"}
    assert mla == {(f"{fw} MLA decode", "ratio") for fw in ("numpy", "torch", "jax")}
    # the paged decode (P = 4096) and varlen (8192 tokens) goals: the full grid's
    mla |= {(c.row.name, c.goal.kind) for c in everything
            if c.workload.op in ("paged_decode", "varlen")}
    assert {(c.row.name, c.goal.kind) for c in cases} == {
        (c.row.name, c.goal.kind) for c in everything
    } - heavy - mla  # quick: all but the L = S = 8192 goals, MLA's, paged's and varlen's
    decode = [c for c in cases if c.row.name == "torch decode"]  # 2 steps vs fused, 1 rolling
    assert [c.goal.kind for c in decode] == ["ratio", "ratio", "rolling"]
    (a, wa, _), (b, wb, _) = decode[1].pair
    assert (a.name, b.name, wa.variant, wa.P) == ("torch decode", "torch F.sdpa decode", "GQA 8:2",
                                                  4096) and wa == wb
    (a, wa, _), (b, wb, _) = decode[2].pair  # the rolling step against itself at a shorter P
    assert a is b and (wa.window, wb.window, wa.P, wb.P) == (256, 256, 4096, 1024)
    assert wa.slots == wb.slots == 257 and wa in quick and wb in quick
    by = {(c.row.name, c.goal.kind): c for c in everything}
    (a, wa, _), (b, wb, _) = by[("torch flash", "window")].pair
    assert a is b and (wa.window, wb.window) == (256, None) and wa.is_causal and wb.is_causal
    assert wa.L == wb.L == 8192 and wa not in full and wb in full and wb not in quick
    (a, wa, _), (b, wb, _) = by[("numpy sdpa", "ratio")].pair
    assert (a.name, b.name, wa, wb) == ("numpy sdpa", "torch F.sdpa", GOAL_WORKLOAD, GOAL_WORKLOAD)
    (a, wa, _), (b, wb, _) = by[("jax flash", "causal")].pair
    assert a is b and wa.is_causal and not wb.is_causal and wa.L == wb.L == 2048
    (a, wa, _), (b, wb, _) = by[("torch flash train", "ratio")].pair
    assert (a.name, b.name, wa, wb) == ("torch flash train", "torch F.sdpa train",
                                        TRAIN_GOAL_WORKLOAD, TRAIN_GOAL_WORKLOAD)
    (a, wa, _), (b, wb, _) = by[("jax flash train", "memory")].pair
    assert (a.name, b.name) == ("jax flash train", "jax sdpa train")  # the plain path beside it
    assert wa == wb == TRAIN_MEMORY_WORKLOAD and wa not in quick and wa in full and wa.L == 8192
    no_train = [w for w in quick if w.op != "train"]  # no training steps: no training goals
    assert not [
        c for c in goal_cases("cpu", no_train, ROWS, resolve_error=lambda r: None)
        if c.goal.op == "train"
    ]
    assert goal_cases("cpu", grid("cpu", "smoke"), ROWS) == []
    assert goal_cases("cuda", grid("cuda", "quick"), ROWS) == []
    some = goal_cases("cpu", quick, select_rows("numpy sdpa"), resolve_error=lambda r: None)
    assert [c.id for c in some] == ["goal|numpy_sdpa|<=_2.5x_torch_F.sdpa"]


def test_kernel_port_rows_are_planned_for_cuda_only_next_to_the_fused_backends():
    """issue 15: ``triton flash`` (torch tensors) and ``pallas flash`` (JAX arrays) are rows of a
    GPU box's plan, beside torch's flash/efficient/cudnn backends and ``jax.nn.dpa[cudnn]``,
    each gated on its own port's ``flash`` fixtures; a CPU plan has neither (there they would
    only run in an interpreter)."""
    kernels = {
        "triton flash": ("torch", "conformance.ports.triton_flash", "torch F.sdpa"),
        "pallas flash": ("jax", "conformance.ports.pallas_flash", "jax.nn.dpa[xla]"),
    }
    for name, (fw, port, ref) in kernels.items():
        row = row_by_name(name)
        assert (row.framework, row.gate_port, row.gate_alias) == (fw, port, "flash")
        assert (row.devices, row.kind, row.gate_pin, row.ref) == (("cuda",), "baseline", None, ref)
    cases = [c for c in plan("cuda", grid("cuda", "full"), memory=80 * 2**30) if c.row]
    mine = {(c.row.name, c.fdevice) for c in cases if c.row.name in kernels}
    assert mine == {("triton flash", "cuda"), ("pallas flash", "gpu")}
    fused = {c.row.name for c in cases}
    assert {"torch F.sdpa[flash]", "torch F.sdpa[cudnn]", "jax.nn.dpa[cudnn]"} <= fused
    assert not [c for c in cases if c.row.name in kernels and c.workload.window is not None]
    cpu = {c.row.name for c in plan("cpu", grid("cpu", "quick")) if c.row}
    assert not cpu & set(kernels)
