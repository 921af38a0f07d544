"""Fast tests of the benchmark harness (bench/): FLOP counts, grids, device selection, the
correctness gate, the runners' wiring, the report/JSON schema, plots and compare.

Nothing here asserts a speed. Expected numbers come from hand arithmetic or a float64
reference written in this file.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bench import runners
from bench.__main__ import pytest_args, select_rows
from bench.compare import compare, env_differences
from bench.devices import resolve_device, set_tf32, tf32_state
from bench.gate import GateCache, run_gate
from bench.plots import plot_results, series_table
from bench.report import (
    SCHEMA_VERSION,
    build_results,
    device_peaks,
    evaluate_goals,
    fmt_bytes,
    fmt_seconds,
    load_results,
    render,
)
from bench.rows import ROWS, Goal, Row, row_by_name
from bench.session import HOST_LIMIT, BenchSession, Record, build_cases, gate_overlay
from bench.workloads import (
    GOAL_WORKLOAD,
    Workload,
    allowed_pairs,
    attention_flops,
    decode_flops,
    grid,
    module_flops,
)

REPO = Path(__file__).resolve().parent.parent

# pairwise-distinct sizes (SEMANTICS.md letters)
B, H, K, L, S, D, E, M = 2, 6, 2, 5, 7, 11, 13, 17


# ----------------------------------------------------------------------------------- FLOPs


def _pairs_by_mask(L: int, S: int, offset: int) -> int:
    """Count of (i, j) with j <= i + offset, by brute force over the full grid."""
    return sum(1 for i in range(L) for j in range(S) if j <= i + offset)


@pytest.mark.parametrize("L_, S_", [(5, 7), (7, 5), (1, 9), (9, 1), (6, 6), (3, 17), (17, 3)])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_allowed_pairs_matches_brute_force(L_, S_, alignment):
    offset = 0 if alignment == "top_left" else S_ - L_
    got = allowed_pairs(L_, S_, is_causal=True, alignment=alignment)
    assert got == _pairs_by_mask(L_, S_, offset)


def test_allowed_pairs_hand_values():
    assert allowed_pairs(4, 4, is_causal=True) == 10  # 1 + 2 + 3 + 4
    assert allowed_pairs(5, 7, is_causal=False) == 35
    # bottom_right with L > S: the first L - S rows see nothing
    assert allowed_pairs(4, 2, is_causal=True, alignment="bottom_right") == 0 + 0 + 1 + 2


def test_attention_flops_count_both_matmuls():
    dense, useful = attention_flops(B, H, L, S, D, E)
    assert dense == useful == 2 * B * H * L * S * D + 2 * B * H * L * S * E
    dense_c, useful_c = attention_flops(B, H, L, S, D, E, is_causal=True)
    pairs = _pairs_by_mask(L, S, 0)  # 15 of 35
    assert pairs == 15
    assert dense_c == dense
    assert useful_c == 2 * B * H * pairs * (D + E)


def test_module_flops_add_the_four_projections():
    dense, useful = module_flops(B, H, K, L, S, D, E, M, is_causal=True)
    proj = 2 * B * (L * M * H * D + S * M * K * D + S * M * K * E + L * H * E * M)
    a_dense, a_useful = attention_flops(B, H, L, S, D, E, is_causal=True)
    assert (dense, useful) == (proj + a_dense, proj + a_useful)


def test_workload_fields_and_ids():
    w = Workload("attention", B, H, K, L, S, D, E, True, "bfloat16")
    assert w.variant == "GQA 6:2"
    assert w.id == "attention.gqa.b2.h6.k2.l5.s7.d11.e13.bf16.causal"
    assert w.score_bytes() == B * H * L * S * 4
    assert w.input_bytes() == (B * H * L * D + B * K * S * (D + E) + B * H * L * E) * 2
    assert Workload.from_dict(w.to_dict()) == w
    assert Workload("attention", 1, 8, 1, 4, 4, 2, 2).variant == "MQA"


def test_decode_flops_by_hand():
    # B=2, H=6, K=3, P=7 cached tokens, D=5, E=4, M=30: one new token, S = 8 keys
    q_proj = 2 * 2 * 30 * (6 * 5)  # 3600
    k_proj = 2 * 2 * 30 * (3 * 5)  # 1800
    v_proj = 2 * 2 * 30 * (3 * 4)  # 1440
    o_proj = 2 * 2 * (6 * 4) * 30  # 2880
    attention = 2 * 2 * 6 * 8 * 5 + 2 * 2 * 6 * 8 * 4  # q.k over 8 keys, weights.v: 1728
    assert (
        decode_flops(2, 6, 3, 7, 5, 4, 30)
        == 11448
        == (q_proj + k_proj + v_proj + o_proj + attention)
    )
    w = Workload("decode", 2, 6, 3, 1, 8, 5, 5)  # M = H * D = 30, E = D = 5
    dense, useful = w.flops()
    assert dense == useful == 3600 + 1800 + 1800 + 3600 + 2 * 2 * 6 * 8 * (5 + 5)


def test_decode_workload_fields():
    w = Workload("decode", 2, 6, 3, 1, 8, 5, 5, False, "bfloat16")
    assert (w.P, w.seq, w.M) == (7, 7, 30)
    assert w.id == "decode.gqa.b2.h6.k3.p7.d5.e5.bf16"
    assert w.label == "decode GQA 6:3 B2 H6 P=7 D5 bf16"
    assert w.series == "decode GQA 6:3 B2 H6 D5 bf16"
    assert w.cache_bytes() == 2 * 3 * 8 * (5 + 5) * 2  # K heads, S = P + 1 tokens, 2 bytes
    mha = Workload("decode", 2, 6, 6, 1, 8, 5, 5, False, "bfloat16")
    assert w.cache_bytes() * 6 == mha.cache_bytes() * 3  # K/H of MHA's
    assert w.input_bytes() == 2 * 2 * 30 * 2 + w.cache_bytes()  # x, y and the cache
    d = w.to_dict()
    assert (d["seq"], d["cache_bytes"]) == (7, w.cache_bytes())
    assert Workload.from_dict(d) == w
    assert GOAL_WORKLOAD.cache_bytes() == 0 and GOAL_WORKLOAD.seq == GOAL_WORKLOAD.L


# ----------------------------------------------------------------------------------- grids


def test_quick_cpu_grid_holds_the_goal_workloads():
    ws = grid("cpu", "quick")
    assert GOAL_WORKLOAD in ws
    assert Workload(**{**GOAL_WORKLOAD.__dict__, "is_causal": True}) in ws
    lengths = {w.L for w in ws if w.op == "attention"}
    assert min(lengths) == 256 and max(lengths) == 4096
    assert {w.variant.split()[0] for w in ws} == {"MHA", "GQA", "MQA"}
    assert {w.dtype for w in ws} == {"float32"}
    assert len({w.id for w in ws}) == len(ws)


def test_decode_steps_are_in_every_grid():
    quick = [w for w in grid("cpu", "quick") if w.op == "decode"]
    assert {(w.variant, w.P) for w in quick} == {
        (v, p) for v in ("MHA", "GQA 8:2") for p in (1024, 4096)
    }
    assert all((w.L, w.H * w.D, w.dtype) == (1, 512, "float32") for w in quick)  # module M
    cuda = [w for w in grid("cuda", "quick") if w.op == "decode"]
    assert {"bfloat16", "float16", "float32"} == {w.dtype for w in cuda}
    assert {w.variant.split()[0] for w in grid("cuda", "full") if w.op == "decode"} == {
        "MHA",
        "GQA",
        "MQA",
    }
    assert [w for w in grid("tpu", "quick") if w.op == "decode"]


def test_gpu_grids_are_low_precision_and_long():
    quick, full = grid("cuda", "quick"), grid("cuda", "full")
    assert {"bfloat16", "float16", "float32"} <= {w.dtype for w in quick}
    assert max(w.L for w in full) >= 32768
    assert any(w.is_causal for w in full) and any(not w.is_causal for w in full)
    assert "float16" not in {w.dtype for w in grid("tpu", "full")}
    for ws in (quick, full):
        assert len({w.id for w in ws}) == len(ws)


def test_unknown_grid_is_an_error():
    with pytest.raises(ValueError, match="no grid 'huge'"):
        grid("cpu", "huge")


# ----------------------------------------------------------------------------------- devices


def test_resolve_device_auto_prefers_cuda_then_tpu():
    assert resolve_device("auto", cuda=True, platforms=frozenset({"cpu", "gpu"})) == "cuda"
    assert resolve_device("auto", cuda=False, platforms=frozenset({"cpu", "gpu"})) == "cuda"
    assert resolve_device("auto", cuda=False, platforms=frozenset({"cpu", "tpu"})) == "tpu"
    assert resolve_device("auto", cuda=False, platforms=frozenset({"cpu"})) == "cpu"
    assert resolve_device("cpu", cuda=True, platforms=frozenset({"cpu", "gpu"})) == "cpu"


def test_resolve_device_refuses_a_missing_or_unknown_device():
    with pytest.raises(RuntimeError, match="--device cuda"):
        resolve_device("cuda", cuda=False, platforms=frozenset({"cpu"}))
    with pytest.raises(ValueError, match="--device must be one of"):
        resolve_device("gpu", cuda=False, platforms=frozenset({"cpu"}))


def test_contention_is_other_processes_cpu_share():
    from bench.devices import cpu_snapshot, others_share

    # 2 s on 2 CPUs; the machine was busy 3 CPU-s, 1 of them ours: others took 2 of 4
    assert others_share((0.0, 100.0, 10.0), (2.0, 103.0, 11.0), 2) == pytest.approx(0.5)
    assert others_share((0.0, 100.0, 10.0), (2.0, 101.0, 11.0), 2) == 0.0
    assert others_share(None, (2.0, 103.0, 11.0), 2) is None
    snap = cpu_snapshot()
    if snap is None:
        pytest.skip("no /proc here")
    burn = "import time\nt = time.time()\nwhile time.time() - t < 0.6: pass"
    before = cpu_snapshot()
    subprocess.run([sys.executable, "-c", burn], check=True)
    share = others_share(before, cpu_snapshot())
    assert share is not None and share > 0.1  # a child burning one core is another process


def test_tf32_state_is_recorded_and_settable():
    torch = pytest.importorskip("torch")
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        set_tf32("on")
        state = tf32_state()
        assert state["torch.backends.cuda.matmul.allow_tf32"] is True
        assert state["torch.backends.cudnn.allow_tf32"] is True
        set_tf32("off")
        assert tf32_state()["torch.backends.cuda.matmul.allow_tf32"] is False
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
        import jax

        jax.config.update("jax_default_matmul_precision", None)
    with pytest.raises(ValueError, match="--tf32"):
        set_tf32("sometimes")


# ----------------------------------------------------------------------------------- the plan


def _fake_gpu(fw: str, device: str) -> str | None:
    return {"numpy": "cpu", "torch": "cuda", "jax": "gpu"}[fw] if device == "cuda" else "cpu"


def _plan(device, workloads, rows=ROWS, memory=None):
    return build_cases(
        device, workloads, rows, fdevice_of=_fake_gpu, memory_bytes=memory,
        resolve_error=lambda r: None,
    )  # fmt: skip


def test_cuda_plan_has_every_sdpa_backend_and_skips_what_cannot_fit():
    ws = grid("cuda", "full")
    cases = _plan("cuda", ws, memory=80 * 2**30)
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
    cases = _plan("cpu", grid("cpu", "quick"))
    names = [c.row.name for c in cases if c.row]
    assert "torch F.sdpa" in names and "jax.nn.dpa[xla]" in names
    assert not any("[flash]" in n or "[cudnn]" in n or "[math]" in n for n in names)
    order = [c.framework for c in cases]
    assert order == sorted(order, key=["numpy", "torch", "jax"].index)
    assert cases[0].kind == "peak"
    assert all(c.skip is None for c in cases)


def test_a_row_whose_code_is_missing_is_visible_as_na():
    ghost = Row("numpy ghost", "impl_numpy.no_such_module:flash_attention")
    cases = build_cases("cpu", [GOAL_WORKLOAD], (ghost,), fdevice_of=_fake_gpu)
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


def test_select_rows_keeps_the_reference_kernels():
    chosen = [r.name for r in select_rows("numpy sdpa")]
    assert chosen == ["numpy sdpa", "torch F.sdpa"]
    with pytest.raises(SystemExit):
        select_rows("no such row")


def test_pytest_args_carry_the_benchmark_settings(tmp_path):
    args = pytest_args(tmp_path, "quick", ["--benchmark-autosave"])
    assert args[0].endswith("bench_attention.py")
    assert f"--benchmark-json={tmp_path / 'pytest-benchmark.json'}" in args
    assert "--benchmark-min-rounds=3" in args and args[-1] == "--benchmark-autosave"


# ----------------------------------------------------------------------------------- the gate


def _stub(ok, n_run, failures=(), raises=None):
    calls = []

    def quick_check(port, *, device, op, n_cases):
        calls.append((getattr(port, "__name__", port), device, op, n_cases))
        if raises:
            raise raises
        return SimpleNamespace(ok=ok, n_run=n_run, failures=list(failures))

    return quick_check, calls


def test_gate_passes_fails_and_errors():
    qc, calls = _stub(True, 8)
    g = run_gate("impl_numpy", "sdpa", "cpu", quick_check=qc)
    assert (g.status, g.ok, g.text()) == ("passed", True, "8/8 ok")
    assert calls == [("impl_numpy", "cpu", "sdpa", 8)]

    qc, _ = _stub(False, 8, ["FAIL sdpa.gqa.h6_k2.float32 [cpu float32]: max error 0.3"])
    g = run_gate("impl_numpy", "sdpa", "cpu", quick_check=qc)
    assert (g.status, g.ok, g.n_failed) == ("failed", False, 1)
    assert "sdpa.gqa.h6_k2" in g.detail and g.text() == "FAIL 1/8"

    qc, _ = _stub(True, 0)  # a gate that checked nothing is not a pass
    assert run_gate("impl_numpy", "sdpa", "cpu", quick_check=qc).status == "error"
    qc, _ = _stub(True, 8, raises=KeyError("manifest"))
    g = run_gate("impl_numpy", "sdpa", "cpu", quick_check=qc)
    assert g.status == "error" and "KeyError" in g.detail
    g = run_gate("impl_nowhere", "sdpa", "cpu", quick_check=_stub(True, 8)[0])
    assert g.status == "error" and "impl_nowhere" in g.detail


def test_gate_cache_runs_once_per_port_op_device():
    qc, calls = _stub(True, 8)
    cache = GateCache(quick_check=qc)
    for _ in range(3):
        cache.check("impl_numpy", "sdpa", "cpu")
    cache.check("impl_numpy", "flash", "cpu")
    assert len(calls) == 2
    skip = GateCache(skip=True, quick_check=qc)
    assert skip.check("impl_numpy", "sdpa", "cpu").text() == "ungated"
    assert len(calls) == 2


def test_gate_overlay_attaches_an_unexported_function():
    row = Row("numpy fake flash", "bench.workloads:allowed_pairs", gate="impl_numpy")
    assert gate_overlay(row) is None  # an explicit gate port is used as is
    row = Row("numpy sdpa", "impl_numpy.functional:scaled_dot_product_attention")
    assert gate_overlay(row) is None  # the package exports it
    qc, calls = _stub(True, 8)
    fn = object()
    run_gate("impl_numpy", "flash", "cpu", quick_check=qc, overlay={"flash_attention": fn})
    assert calls[0][0] == "impl_numpy"  # the port keeps its name (conformance's adapters)


class FakeBenchmark:
    """Stands in for pytest-benchmark's fixture: timed rounds, real Stats."""

    def __init__(self, max_time=1.0, min_rounds=3):
        self._max_time, self._min_rounds = max_time, min_rounds
        self.calls = 0
        self.mode = None
        self.extra_info: dict = {}
        self.group = None
        self.stats = None

    def _run(self, fn, rounds):
        import time

        from pytest_benchmark.stats import Stats

        s = Stats()
        for _ in range(rounds):
            t0 = time.perf_counter()
            fn()
            s.update(time.perf_counter() - t0)
            self.calls += 1
        self.stats = SimpleNamespace(stats=s, iterations=1)

    def __call__(self, fn):
        self.mode = "calibrated"
        self._run(fn, self._min_rounds)

    def pedantic(self, fn, *, rounds, iterations, warmup_rounds):
        assert iterations == 1 and warmup_rounds == 0
        self.mode = "pedantic"
        self._run(fn, rounds)


def _session(quick_check, workload):
    row = row_by_name("numpy sdpa")
    cases = build_cases("cpu", [workload], (row,), fdevice_of=_fake_gpu)
    return BenchSession(
        "cpu", "test", [workload], (row,), gates=GateCache(quick_check=quick_check), cases=cases
    )


def test_a_row_failing_its_gate_is_reported_failed_and_never_timed():
    w = Workload("attention", B, H, K, L, S, D, E)
    qc, _ = _stub(False, 8, ["FAIL sdpa.hand.two_keys.float32: wrong"])
    session = _session(qc, w)
    (case,) = [c for c in session.cases if c.kind == "row"]
    bench = FakeBenchmark()
    with pytest.raises(pytest.skip.Exception, match="correctness gate"):
        session.run_case(case, bench)
    assert bench.calls == 0
    rec = session.records[case.id]
    assert rec.status == "failed" and rec.stats is None
    assert rec.gate["status"] == "failed" and "two_keys" in rec.reason


def test_a_row_passing_its_gate_is_timed_with_memory_and_stats():
    w = Workload("attention", B, H, K, L, S, D, E)
    session = _session(_stub(True, 8)[0], w)
    (case,) = [c for c in session.cases if c.kind == "row"]
    bench = FakeBenchmark()
    session.run_case(case, bench)
    rec = session.records[case.id]
    assert bench.calls == 3 and rec.status == "ok" and bench.mode == "calibrated"
    assert rec.stats["rounds"] == 3 and rec.stats["min"] <= rec.stats["median"] <= rec.stats["max"]
    assert rec.memory_method == "tracemalloc" and rec.memory_bytes >= B * H * L * S * 4
    assert bench.extra_info["case"] == case.id and bench.group == w.id


def test_a_call_slower_than_the_budget_gets_exactly_min_rounds():
    w = Workload("attention", B, H, K, L, S, D, E)
    session = _session(_stub(True, 8)[0], w)
    (case,) = [c for c in session.cases if c.kind == "row"]
    bench = FakeBenchmark(max_time=1e-9, min_rounds=4)  # any call outlasts max_time / 4
    session.run_case(case, bench)
    assert bench.mode == "pedantic" and bench.calls == 4
    assert session.records[case.id].stats["rounds"] == 4


def test_classify_error():
    assert runners.classify_error(runners.UnsupportedError("no kernel")) == "unsupported"
    assert runners.classify_error(MemoryError()) == "oom"
    assert runners.classify_error(RuntimeError("CUDA out of memory. Tried to")) == "oom"
    assert runners.classify_error(RuntimeError("RESOURCE_EXHAUSTED: while")) == "oom"
    assert runners.classify_error(ValueError("bad")) == "error"


# ----------------------------------------------------------------------------------- runners


def _to_np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def reference_sdpa(q, k, v, *, causal: bool) -> np.ndarray:
    """float64 heads-first SDPA; query head h reads key/value head h // (H // K)."""
    q, k, v = _to_np(q), _to_np(k), _to_np(v)
    G = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, G, axis=-3), np.repeat(v, G, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        Lq, Sk = s.shape[-2:]
        s = np.where(np.arange(Sk)[None, :] <= np.arange(Lq)[:, None], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    w = np.exp(s)
    return (w / w.sum(axis=-1, keepdims=True)) @ v


# the CPU rows, and torch's math and flash SDPA backends, which torch also has on CPU
_FUNCTIONAL = [
    r.name
    for r in ROWS
    if r.workloads == "attention"
    and ("cpu" in r.devices or (r.call == "torch_sdpa" and r.backend in ("math", "flash")))
]


@pytest.mark.parametrize("name", _FUNCTIONAL)
def test_runner_wiring_matches_a_float64_reference(name):
    row = row_by_name(name)
    if row.framework in ("torch", "jax"):
        pytest.importorskip(row.framework)
    try:
        row.resolve()
    except (ImportError, AttributeError):
        pytest.skip(f"{name} not available")
    # jax.nn.dot_product_attention and torch's pinned CPU flash kernel need E == D
    e = D if row.call == "jax_dpa" or row.backend else E
    w = Workload("attention", B, H, K, L, S, D, e, True, "float32")
    p = runners.prepare(row, w, "cpu")
    out = _to_np(p.call())
    q, k, v = p.inputs
    if p.layout == "heads_second":  # (B, L, H, D) -> (B, H, L, D)
        q, k, v = (np.swapaxes(_to_np(x), 1, 2) for x in (q, k, v))
        out = np.swapaxes(out, 1, 2)
    assert out.shape == (B, H, L, e)
    np.testing.assert_allclose(out, reference_sdpa(q, k, v, causal=True), rtol=2e-5, atol=2e-5)


_MODULES = [r.name for r in ROWS if r.workloads == "module" and "cpu" in r.devices]


@pytest.mark.parametrize("name", _MODULES)
def test_module_rows_are_causal_when_asked(name):
    """Changing the last position's input changes no earlier output under is_causal."""
    row = row_by_name(name)
    pytest.importorskip(row.framework)
    try:
        row.resolve()
    except (ImportError, AttributeError):
        pytest.skip(f"{name} not available")
    w = Workload("module", 2, 6, 3 if "GQA" in row.variants else 6, 5, 5, 7, 7, True)
    p = runners.prepare(row, w, "cpu")
    before = _to_np(p.call())
    assert before.shape == (w.B, w.L, w.M) and np.isfinite(before).all()
    x = p.inputs[-1]
    if hasattr(x, "at"):  # jax: replace the array the compiled call reads
        p.inputs[-1] = x.at[:, -1].add(1.0)
    else:
        x[:, -1] += 1.0
    after = _to_np(p.call())
    np.testing.assert_allclose(after[:, :-1], before[:, :-1], rtol=1e-5, atol=1e-6)
    assert np.abs(after[:, -1] - before[:, -1]).max() > 1e-4


def _numpy_of(x) -> np.ndarray:
    return np.array(_to_np(x))  # a copy: the JAX step donates (deletes) the arrays it is given


def reference_module(weights: dict, x: np.ndarray, H: int, K: int, D: int) -> np.ndarray:
    """float64 causal self-attention module from canonical weights: x (B, T, M) -> (B, T, M)."""
    w = {name: _to_np(a) for name, a in weights.items()}
    B_, T, _ = x.shape

    def heads(name, n):  # (B, T, n*D) -> (B, n, T, D)
        y = x @ w[f"{name}.kernel"] + w[f"{name}.bias"]
        return y.reshape(B_, T, n, D).transpose(0, 2, 1, 3)

    out = reference_sdpa(heads("q_proj", H), heads("k_proj", K), heads("v_proj", K), causal=True)
    merged = out.transpose(0, 2, 1, 3).reshape(B_, T, H * D)  # (B, T, H*E)
    return merged @ w["o_proj.kernel"] + w["o_proj.bias"]


_DECODE_ROWS = [r.name for r in ROWS if r.workloads == "decode"]
_DECODE_IMPL = [n for n in _DECODE_ROWS if row_by_name(n).kind == "impl"]
# decode sizes, pairwise distinct: B=2, H=6, K=3, P=7 cached tokens (S=8), D=E=5, M=30
_DB, _DH, _DK, _DP, _DD = 2, 6, 3, 7, 5


def _decode_row(name: str, dtype: str = "float32") -> tuple[Row, Workload]:
    row = row_by_name(name)
    pytest.importorskip(row.framework)
    try:
        row.resolve()
    except (ImportError, AttributeError):
        pytest.skip(f"{name} not available")
    return row, Workload("decode", _DB, _DH, _DK, 1, _DP + 1, _DD, _DD, False, dtype)


@pytest.mark.parametrize("name", _DECODE_IMPL)
def test_decode_row_is_the_last_row_of_the_causal_forward(name):
    """The timed decode step, from a cache prefilled with P tokens, gives the last row of a
    float64 causal forward over the P + 1 tokens (reference written here, from the module's
    canonical weights); repeated rounds are the same step at the same position."""
    row, w = _decode_row(name, "float64")
    p = runners.prepare(row, w, "cpu")
    m, x_new = p.module, p.inputs[-2]
    prefix = np.random.default_rng(3).standard_normal((_DB, _DP, w.M))  # (B, P, M) float64
    if row.framework == "torch":
        import torch

        with torch.no_grad():
            _, cache = m.decode(torch.from_numpy(prefix), m.init_cache(_DB, _DP + 1))
    else:
        to = np.asarray if row.framework == "numpy" else __import__("jax.numpy").numpy.asarray
        _, cache = m.decode(to(prefix), m.init_cache(_DB, _DP + 1))
    assert cache.position == _DP
    p.inputs[-1] = cache  # the call reads its cache from its inputs
    cached = _numpy_of(cache.key)[:, :, :_DP]
    expected = reference_module(
        m.to_canonical(), np.concatenate([prefix, _to_np(x_new)], axis=1), _DH, _DK, _DD
    )[:, -1:]  # (B, 1, M)
    outs = [_numpy_of(p.call()) for _ in range(3)]
    assert outs[0].shape == (_DB, 1, w.M)
    np.testing.assert_allclose(outs[0], expected, rtol=1e-10, atol=1e-12)
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])  # the same step, bit for bit
    after = p.inputs[-1]
    assert after.position == _DP  # never advanced by the timed calls
    np.testing.assert_array_equal(_numpy_of(after.key)[:, :, :_DP], cached)


@pytest.mark.parametrize("name", [n for n in _DECODE_ROWS if n not in _DECODE_IMPL])
def test_decode_baselines_match_a_float64_step(name):
    """The framework decode step (projections, cache write at P, fused attention of one query
    over the S = P + 1 keys, output projection) against float64 arithmetic written here."""
    row, w = _decode_row(name)
    p = runners.prepare(row, w, "cpu")
    params, x, ck, cv = p.inputs
    x, ck, cv = _numpy_of(x), _numpy_of(ck), _numpy_of(cv)
    wq, bq, wk, bk, wv, bv, wo, bo = (_to_np(a) for a in params)
    if p.layout == "decode_heads_second":  # (B, S, K, D) -> (B, K, S, D)
        ck, cv = np.swapaxes(ck, 1, 2), np.swapaxes(cv, 1, 2)

    def heads(y, n):  # (B, 1, n*D) -> (B, n, 1, D)
        return y.reshape(_DB, 1, n, _DD).transpose(0, 2, 1, 3)

    k = np.concatenate([ck[:, :, :_DP], heads(x @ wk + bk, _DK)], axis=2)  # (B, K, S, D)
    v = np.concatenate([cv[:, :, :_DP], heads(x @ wv + bv, _DK)], axis=2)
    out = reference_sdpa(heads(x @ wq + bq, _DH), k, v, causal=False)  # (B, H, 1, D)
    expected = out.transpose(0, 2, 1, 3).reshape(_DB, 1, _DH * _DD) @ wo + bo
    outs = [_numpy_of(p.call()) for _ in range(3)]
    np.testing.assert_allclose(outs[0], expected, rtol=2e-5, atol=2e-5)
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])


def test_timed_decode_rounds_leave_the_cache_at_its_position(monkeypatch):
    """Through the session (warm-up, memory, pytest-benchmark rounds): every round decodes
    at position P, and the cache the call holds is still at P afterwards."""
    row, w = _decode_row("numpy decode")
    prepared = []
    real = runners.prepare
    monkeypatch.setattr(runners, "prepare", lambda *a: prepared.append(real(*a)) or prepared[-1])
    cases = build_cases("cpu", [w], (row,), fdevice_of=_fake_gpu)
    session = BenchSession(
        "cpu", "test", [w], (row,), gates=GateCache(quick_check=_stub(True, 8)[0]), cases=cases
    )
    (case,) = [c for c in cases if c.kind == "row"]
    p_seen = []
    decode = row.resolve().decode
    monkeypatch.setattr(
        row.resolve(), "decode", lambda self, x, cache: p_seen.append(cache.position)
        or decode(self, x, cache)
    )  # fmt: skip
    bench = FakeBenchmark(min_rounds=4)
    session.run_case(case, bench)
    assert session.records[case.id].status == "ok" and bench.calls == 4
    assert p_seen == [_DP] * (1 + 4)  # the memory call (the host warm-up) and four rounds
    assert prepared[0].inputs[-1].position == _DP


@pytest.mark.parametrize("name", ["torch F.sdpa[efficient]", "torch F.sdpa[cudnn]"])
def test_a_backend_without_a_kernel_is_unsupported_not_failed(name):
    pytest.importorskip("torch")
    w = Workload("attention", B, H, K, L, S, D, E, True)
    with pytest.raises(runners.UnsupportedError):  # torch has no such kernel on CPU
        runners.prepare(row_by_name(name), w, "cpu")


def test_cuda_timing_synchronizes_inside_the_call(monkeypatch):
    torch = pytest.importorskip("torch")
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: events.append("sync"))
    call = runners._torch_call(lambda: events.append("kernel") or torch.is_inference_mode_enabled(),
                               "cuda")  # fmt: skip
    assert call() is True  # ran under inference_mode
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
    assert runners._peak_memory_torch_cuda(fn) == (4096 + 512, "torch.cuda.max_memory_allocated")


def test_peak_memory_numpy_sees_the_buffers():
    n = 1_000_003

    def fn():
        a = np.ones(n)
        return a, a * 2.0  # two float64 buffers alive at once

    got, method = runners.peak_memory_numpy(fn)
    assert method == "tracemalloc"
    assert 2 * 8 * n <= got < 2 * 8 * n + 64 * 1024


def test_peak_memory_torch_cpu_follows_allocations_in_order():
    torch = pytest.importorskip("torch")

    def fn():
        a = torch.ones(512, 1024)  # 2 MiB
        b = a[:256].clone()  # + 1 MiB while a is alive: the peak
        del a
        return b

    got, method = runners.peak_memory_torch_cpu(fn)
    assert method == "torch.profiler"
    assert got == 3 * 2**20


def test_jax_memory_comes_from_xla_and_covers_the_scores():
    pytest.importorskip("jax")
    w = Workload("attention", 1, 4, 4, 64, 96, 8, 8)
    p = runners.prepare(row_by_name("jax sdpa"), w, "cpu")
    got, method = p.memory()
    assert method == "xla" and p.compile_s > 0
    assert got >= w.score_bytes()


# ----------------------------------------------------------------------------------- report


def _rec(row, w, median, *, status="ok", kind="row", device="cpu", matmul=None, skips=False):
    stats = None
    if status == "ok":
        stats = {"min": median * 0.9, "max": median * 1.2, "mean": median, "stddev": 0.0,
                 "median": median, "iqr": median * 0.1, "q1": median, "q3": median * 1.1,
                 "rounds": 5.0}  # fmt: skip
    return Record(
        case_id=f"{row}|{w.id if w else 'peak'}", kind=kind, row=row,
        row_kind="peak" if kind == "peak" else row_by_name(row).kind, framework="torch",
        device=device, status=status, reason="" if status == "ok" else "because",
        workload=w.to_dict() if w else None, stats=stats, memory_bytes=1234,
        memory_method="tracemalloc", matmul=matmul, skips_masked=skips,
    ).to_dict()  # fmt: skip


def _results(numpy_med=0.25, torch_med=0.1, device="cpu"):
    w = GOAL_WORKLOAD
    wc = Workload(**{**w.__dict__, "is_causal": True})
    n = 2048
    matmul = {"n": n, "dtype": "float32", "flops": 2 * n**3}
    records = [
        _rec("matmul torch", None, 0.05, kind="peak", matmul=matmul),
        _rec("numpy sdpa", w, numpy_med),
        _rec("torch F.sdpa", w, torch_med, skips=True),
        _rec("numpy sdpa", wc, numpy_med * 0.9),
        _rec("torch F.sdpa", wc, torch_med / 2, skips=True),
        _rec("jax sdpa", w, 0.3, status="failed"),
        _rec("numpy flash", w, 0.0, status="n/a"),
    ]
    env = {"device_name": "test cpu", "timestamp": "2026-11-29T12:00:00", "versions": {"t": 1}}
    return build_results(
        device=device, grid="quick", environment=env, records=records, gates=[], wall_s=1.0
    )


def test_derived_numbers_are_flops_over_the_median():
    res = _results()
    by = {(r["row"], r["workload"]["is_causal"]): r for r in res["records"] if r["workload"]}
    d = by[("numpy sdpa", False)]["derived"]
    dense, useful = GOAL_WORKLOAD.flops()
    assert dense == useful == 4 * 8 * 2048 * 2048 * 64
    assert d["tflops"] == pytest.approx(useful / 0.25 / 1e12)
    assert d["ratio"] == pytest.approx(2.5)
    peak = 2 * 2048**3 / (0.05 * 0.9)  # FLOPs over the fastest round
    assert res["peaks"]["cpu/float32"]["flops"] == pytest.approx(peak)
    assert d["frac_peak"] == pytest.approx(useful / 0.25 / peak)
    c = by[("torch F.sdpa", True)]["derived"]
    assert c["tflops"] < c["tflops_dense"]  # causal: useful counts about half
    assert "derived" not in by[("jax sdpa", False)]  # failed rows have no numbers


def test_goals_are_evaluated_not_asserted():
    goals = {(g["row"], g["kind"]): g for g in _results(numpy_med=0.25)["goals"]}
    assert goals[("numpy sdpa", "ratio")]["status"] == "met"  # 2.5x <= 2.5x
    assert goals[("numpy sdpa", "ratio")]["ratio"] == pytest.approx(2.5)
    goals = {(g["row"], g["kind"]): g for g in _results(numpy_med=0.26)["goals"]}
    assert goals[("numpy sdpa", "ratio")]["status"] == "missed"
    assert goals[("jax sdpa", "faster")]["status"] == "not measured"
    assert "jax sdpa: failed" in goals[("jax sdpa", "faster")]["detail"]
    assert Goal("faster", 1.0, "x").met(1.0) is False
    gpu = _results(device="cuda")["goals"]
    assert {g["status"] for g in gpu} == {"not evaluated"}
    records = _results()["records"]
    assert evaluate_goals(records, "cpu", ())[:1] == []


def test_results_json_schema_round_trips(tmp_path):
    res = _results()
    for key in ("schema", "device", "grid", "environment", "peaks", "gates", "goals", "records"):
        assert key in res
    assert res["schema"] == SCHEMA_VERSION
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(res))
    assert load_results(run) == json.loads(json.dumps(res))
    (run / "results.json").write_text(json.dumps({**res, "schema": 0}))
    with pytest.raises(ValueError, match="schema"):
        load_results(run)


def test_render_prints_rows_status_goals_and_absent_rows():
    from rich.console import Console

    console = Console(record=True, width=200, file=io.StringIO())
    res = _results()
    res["records"][1]["contention"] = 0.4  # numpy sdpa timed on a busy machine
    render(res, console)
    text = console.export_text()
    assert "numpy sdpa" in text and "torch F.sdpa" in text
    assert "failed (1)" in text and "(1) because" in text
    assert "not available" in text and "numpy flash" in text
    assert "met" in text and "2.50x" in text
    assert "cpu/float32" in text
    assert "250 ms *" in text and "other processes used more than 10%" in text
    assert "100 ms *" not in text


def test_formatting():
    assert fmt_seconds(0.0123) == "12.3 ms"
    assert fmt_seconds(2.5) == "2.5 s"
    assert fmt_seconds(4.2e-6) == "4.2 µs"
    assert fmt_bytes(3 * 2**20) == "3 MiB"
    assert fmt_bytes(None) == "n/a"
    assert device_peaks([]) == {}


# ----------------------------------------------------------------------------------- compare, plots


def test_compare_matches_cases_and_flags_changes():
    a, b = _results(numpy_med=0.25), _results(numpy_med=0.125)
    b["records"][5]["status"] = "ok"  # jax sdpa failed in A
    b["environment"]["versions"]["t"] = 2
    res = compare(a, b)
    pair = {p["case_id"]: p for p in res["pairs"]}
    numpy_full = f"numpy sdpa|{GOAL_WORKLOAD.id}"
    assert pair[numpy_full]["ratio"] == pytest.approx(0.5)
    assert pair[numpy_full]["change"] == "faster"
    torch_full = f"torch F.sdpa|{GOAL_WORKLOAD.id}"
    assert pair[torch_full]["change"] == "same"
    assert res["per_row"]["numpy sdpa"] == pytest.approx(0.5)
    assert [(s["a"], s["b"]) for s in res["status_changes"]] == [("failed", "ok")]
    assert env_differences(a, b) == [("versions.t", 1, 2)]


def test_plot_colours_follow_the_framework():
    from bench.plots import colour

    assert colour("numpy sdpa") // 2 == colour("numpy flash") // 2  # one hue, dark and light
    assert colour("numpy sdpa") != colour("numpy flash")
    assert len({colour(n) // 2 for n in ("numpy sdpa", "torch sdpa", "jax sdpa")}) == 3
    torch_panel = [r.name for r in ROWS if r.call == "torch_sdpa"] + ["torch sdpa", "torch flash"]
    assert len({colour(n) for n in torch_panel}) == len(torch_panel)


def test_plots_are_written_per_series(tmp_path):
    res = _results()
    w2 = Workload(**{**GOAL_WORKLOAD.__dict__, "L": 4096, "S": 4096})
    res["records"].append(_rec("numpy sdpa", w2, 1.0))
    build = build_results(device="cpu", grid="quick", environment=res["environment"],
                          records=res["records"], gates=[], wall_s=1.0)  # fmt: skip
    table = series_table(build, "time")
    assert list(table) == [GOAL_WORKLOAD.series]  # causal series has one length: no panel
    assert table[GOAL_WORKLOAD.series]["numpy sdpa"] == [(2048, 0.25), (4096, 1.0)]
    paths = plot_results(build, tmp_path)
    assert [p.name for p in paths] == ["time_vs_seq.png", "memory_vs_seq.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_decode_rows_are_reported_with_their_cache_and_plotted_against_p(tmp_path):
    from rich.console import Console

    ws = [Workload("decode", 1, 8, k, 1, p + 1, 64, 64) for k in (8, 2) for p in (1024, 4096)]
    rows = (("numpy decode", 2e-6), ("torch F.sdpa decode", 1e-6))  # seconds per cached token
    records = [_rec(name, w, per_token * w.P) for w in ws for name, per_token in rows]
    res = build_results(device="cpu", grid="quick", environment={}, records=records, gates=[],
                        wall_s=1.0)  # fmt: skip
    ratios = [r["derived"]["ratio"] for r in res["records"] if r["row"] == "numpy decode"]
    assert ratios == [pytest.approx(2.0)] * 4  # against the same step around torch's F.sdpa
    table = series_table(res, "time")
    assert table["decode MHA B1 H8 D64 f32"]["numpy decode"] == [(1024, 2048e-6), (4096, 8192e-6)]
    console = Console(record=True, width=200, file=io.StringIO())
    render(res, console)
    text = console.export_text()
    assert "decode GQA 8:2 B1 H8 P=4096 D64 f32" in text
    assert "KV cache 16 MiB" in text  # MHA at P=4096: 8 heads x 4097 tokens x 128 x 4 bytes
    assert "KV cache 4 MiB (K/H = 2/8 of MHA's)" in text
    assert [p.name for p in plot_results(res, tmp_path)] == ["time_vs_seq.png", "memory_vs_seq.png"]


# ----------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_python_m_bench_smoke_run_end_to_end(tmp_path):
    """The real pipeline (pytest + pytest-benchmark + the real gate) on a seconds-long grid."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "bench", "--device", "cpu", "--grid", "smoke",
           "--rows", "numpy sdpa", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    res = load_results(out)
    rows = [r for r in res["records"] if r["kind"] == "row"]
    assert {r["row"] for r in rows} == {"numpy sdpa", "torch F.sdpa"}
    assert len(rows) == 2 * len(grid("cpu", "smoke"))
    for r in rows:
        assert r["gate"] is not None
        assert (r["status"] == "ok") == (r["gate"]["status"] == "passed")
        assert (r["stats"] is not None) == (r["status"] == "ok")
    raw = json.loads((out / "pytest-benchmark.json").read_text())
    timed = {b["extra_info"]["case"] for b in raw["benchmarks"]}
    assert timed == {r["case_id"] for r in res["records"] if r["status"] == "ok"}
    assert (out / "report.txt").read_text().count("numpy sdpa") >= 3
    assert "torch" in res["environment"]["versions"] and "tf32" in res["environment"]
