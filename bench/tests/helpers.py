"""Shared stand-ins for the benchmark harness's tests (no timing asserted), and the comparison
of a row's numbers with the float64 oracle (``conformance/oracle.py``) under its tolerance rule."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np

from bench.devices import FRAMEWORKS, Machine
from bench.gate import GateCache
from bench.plan import Case, Plan, PlannedGoal, build_cases, build_goals
from bench.records import Record
from bench.report import build_results
from bench.rows import ROWS, Row, row_by_name
from bench.session import BenchSession
from bench.workloads import GOAL_WORKLOAD, Workload, grids
from conformance.oracle import assert_within

# pairwise-distinct sizes (SEMANTICS.md letters)
B, H, K, L, S, D, E, M = 2, 6, 2, 5, 7, 11, 13, 17


def fake_gpu(fw: str, device: str) -> str | None:
    """Framework devices of a GPU box (numpy on the host, torch cuda, JAX gpu)."""
    return {"numpy": "cpu", "torch": "cuda", "jax": "gpu"}[fw] if device == "cuda" else "cpu"


def machine(device: str = "cpu", memory=None, tf32: str = "default") -> Machine:
    """A machine of ``device`` with :func:`fake_gpu`'s framework devices, nothing measured;
    ``memory``: every framework's budget, or one per framework."""
    budgets = memory if isinstance(memory, dict) else dict.fromkeys(FRAMEWORKS, memory)
    return Machine(device, {fw: fake_gpu(fw, device) for fw in FRAMEWORKS}, budgets, tf32)


def plan(device, workloads, rows=ROWS, memory=None):
    return build_cases(machine(device, memory), workloads, rows, resolve_error=lambda r: None)


def planned_goals(device: str, grid_name: str, rows: tuple[Row, ...] = ROWS,
                  **kw) -> list[PlannedGoal]:
    """Every goal of ``rows`` as a run of the device's grid ``grid_name`` plans it."""
    kw.setdefault("resolve_error", lambda r: None)
    return build_goals(machine(device), grid_name, grids(device, grid_name), rows, **kw)


def goal_cases(device: str, workloads: list[Workload], rows: tuple[Row, ...] = ROWS,
               **kw) -> list[Case]:
    """The goal cases of a run whose grid is ``workloads``."""
    goals = build_goals(machine(device), "test", {"test": workloads}, rows, **kw)
    return [g.case for g in goals if g.case is not None]


def stub(ok, n_run, failures=(), raises=None, seen=None):
    """A stand-in for conformance.quick_check; ``seen(port)`` is called inside it."""
    calls = []

    def quick_check(port, *, device, op, n_cases):
        calls.append((getattr(port, "__name__", port), device, op, n_cases))
        if seen is not None:
            seen(port)
        if raises:
            raise raises
        return SimpleNamespace(ok=ok, n_run=n_run, failures=list(failures))

    return quick_check, calls


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


def session_of(quick_check, workload, name="numpy sdpa", **plan_options):
    """A session of one row's cases on ``workload`` (no goals), gated by ``quick_check``."""
    row = row_by_name(name)
    cases = build_cases(machine("cpu"), [workload], (row,))
    plan = Plan(machine("cpu"), "test", [workload], (row,), cases, **plan_options)
    return BenchSession(plan, gates=GateCache(quick_check=quick_check))


def to_np(x) -> np.ndarray:
    """An array of any framework as a float64 NumPy array."""
    if hasattr(x, "detach"):
        return x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def assert_within_bound(got, golden: np.ndarray, plain: np.ndarray, dtype: str) -> None:
    """``got`` (any framework's array, on any device) against the float64 oracle's ``golden``
    within the manifest's tolerance rule, ``oracle.assert_within``: twice the plain same-dtype
    computation's error ``plain``, plus the dtype's noise floor (``plain=golden``: the floor
    alone), as conformance checks a port."""
    assert_within(to_np(got), golden, dtype, plain)


def rec(row, w, median, *, status="ok", kind="row", device="cpu", matmul=None, skips=False):
    """A stored record with pytest-benchmark-like stats around ``median``."""
    stats = None
    if status == "ok":
        stats = {"min": median * 0.9, "max": median * 1.2, "mean": median, "stddev": 0.0,
                 "median": median, "iqr": median * 0.1, "q1": median, "q3": median * 1.1,
                 "rounds": 5.0}
    return Record(
        case_id=f"{row}|{w.id if w else 'peak'}", kind=kind, row=row,
        row_kind="peak" if kind == "peak" else row_by_name(row).kind, framework="torch",
        device=device, status=status, reason="" if status == "ok" else "because",
        workload=w.to_dict() if w else None, stats=stats, memory_bytes=1234,
        memory_method="tracemalloc", matmul=matmul, skips_masked=skips,
    ).to_dict()


def goal_rec(row, text, ratios, status, kind="ratio", limit=2.5, ref="torch F.sdpa"):
    """A stored goal record (interleaved timing) with these per-round ratios."""
    from bench.goals import spread

    goal = {"kind": kind, "limit": limit, "ref": ref, "text": text, "ratio": spread(ratios),
            "rounds": len(ratios), "inner": 1, "order": "ABBA", "ratios": ratios,
            "a_median_s": 0.2, "b_median_s": 0.1, "status": status}
    return Record(
        case_id=f"goal|{row}|{text}", kind="goal", row=row, row_kind=row_by_name(row).kind,
        framework="numpy", device="cpu", status="ok", workload=GOAL_WORKLOAD.to_dict(), goal=goal,
    ).to_dict()


def results_of(numpy_med=0.25, torch_med=0.1, device="cpu", goals=()):
    """A small results.json document: a peak, numpy sdpa and torch F.sdpa on the goal workload
    and its causal twin, a failed and an absent row, and the given goal records."""
    w = GOAL_WORKLOAD
    wc = Workload(**{**w.__dict__, "is_causal": True})
    n = 2048
    matmul = {"n": n, "dtype": "float32", "flops": 2 * n**3, "precision": "highest"}
    records = [
        rec("matmul torch", None, 0.05, kind="peak", matmul=matmul),
        rec("numpy sdpa", w, numpy_med),
        rec("torch F.sdpa", w, torch_med, skips=True),
        rec("numpy sdpa", wc, numpy_med * 0.9),
        rec("torch F.sdpa", wc, torch_med / 2, skips=True),
        rec("jax sdpa", w, 0.3, status="failed"),
        rec("numpy flash", w, 0.0, status="n/a"),
        *goals,
    ]
    env = {"device_name": "test cpu", "timestamp": "2026-11-29T12:00:00", "versions": {"t": 1}}
    return build_results(
        device=device, grid="quick", environment=env, records=records, gates=[], wall_s=1.0,
        goals=planned_goals(device, "quick"),
    )
