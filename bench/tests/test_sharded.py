"""The sharded rows (issue 30): ring, Ulysses and USP on 4 devices, JAX's simulated CPU devices
and torch's gloo processes, each timed in a child process (bench/sharded.py), the ratio against
the same framework's ring, the formula's bytes per device beside it. No timing is asserted."""

from __future__ import annotations

import pytest

from bench.devices import resolve
from bench.gate import GateCache, run_gate
from bench.plan import Plan, build_cases, make_plan
from bench.report import derive
from bench.rows import ROWS, row_by_name
from bench.session import BenchSession
from bench.sharded import sent_bytes
from bench.tests.helpers import FakeBenchmark, machine, rec
from bench.workloads import SHARDS, Workload, grid, grids

NAMES = [f"{fw} {m}" for fw in ("torch", "jax") for m in ("ring", "ulysses", "usp")]


def _cpu_plan(grid_name: str, rows: str = "") -> Plan:
    """The plan of ``python -m bench --device cpu --grid grid_name --rows rows``."""
    return make_plan(resolve("cpu"), grid_name, grids("cpu", grid_name), rows=rows)


def _sharded_cases(plan: Plan) -> dict[str, set[int]]:
    """row -> the lengths L (= S) of its cases."""
    out: dict[str, set[int]] = {}
    for c in plan.cases:
        if c.kind == "row" and c.workload.op == "sharded":
            out.setdefault(c.row.name, set()).add(c.workload.L)
    return out


def test_the_six_rows_are_in_the_cpu_plans_quick_at_1024_full_at_4096_too():
    assert _sharded_cases(_cpu_plan("quick")) == {n: {1024} for n in NAMES}
    assert _sharded_cases(_cpu_plan("full")) == {n: {1024, 4096} for n in NAMES}
    assert all(c.skip is None for c in _cpu_plan("full").cases if c.row
               and c.row.name in NAMES)
    for name in NAMES:
        row = row_by_name(name)
        assert row.ref == f"{row.framework} ring" and row.devices == ("cpu",)
        assert row.gate_alias == name.split()[1]  # gated on its own alias, at n = 4
    # the smoke grid (the end-to-end tests) and the accelerators' grids have none
    assert not [w for w in grid("cpu", "smoke") if w.op == "sharded"]
    assert not [w for w in grid("cuda", "quick") if w.op == "sharded"]


def test_select_rows_keeps_the_ring_each_ratio_divides_by():
    plan = _cpu_plan("quick", rows="jax usp")
    assert {r.name for r in plan.rows} == {"jax usp", "jax ring"}


@pytest.mark.parametrize(("H", "K", "L"), [(8, 8, 4096), (8, 2, 1024), (32, 8, 2048)])
def test_the_bytes_column_is_docs_sharded_formula(H, K, L):
    """docs/SHARDED.md, "Communication", written out here for n = 4, USP u = 2, r = 2."""
    B, D, n, size = 1, 64, SHARDS, 4  # float32
    w = Workload("sharded", B, H, K, L, L, D, D, False)
    ring = (n - 1) * B * K * L * 2 * D * size // n
    ulysses = (n - 1) * B * (2 * H * L * D + 2 * max(K, n) * L * D) * size // n**2
    u, r = 2, 2
    inner = (u - 1) * B * (2 * H * L // r * D + 2 * max(K, u) * L // r * D) * size // u**2
    usp = inner + (r - 1) * B * max(K // u, 1) * L // r * 2 * D * size
    expected = {"ring": ring, "ulysses": ulysses, "usp": usp}
    assert {m: sent_bytes(m, w) for m in expected} == expected
    records = [rec(name, w, 0.1 + i) for i, name in enumerate(NAMES)]
    for r in records:  # what the sharded preparer's call leaves on its record (Prepared.derived)
        r["derived"] = {"sent_bytes": sent_bytes(r["row"].split()[1], w)}
    derive(records, ROWS)
    for r in records:  # kept beside the timed numbers
        d = r["derived"]
        assert d["sent_bytes"] == expected[r["row"].split()[1]] and "median_s" in d
        assert d["ref"] == f"{r['row'].split()[0]} ring" and d["ratio"] is not None


def test_only_the_sharded_rows_get_a_bytes_column():
    w = Workload("attention", 1, 2, 2, 64, 64, 16, 16, False)
    records = [rec("torch F.sdpa", w, 0.1)]
    derive(records, ROWS)
    assert "sent_bytes" not in records[0]["derived"]


def test_a_sharded_gate_runs_in_the_child_and_never_asks_quick_check(monkeypatch):
    """conformance's quick_check has one device here: the sharded aliases go to the child."""
    seen = []

    def fake(port, op, run_ids):
        seen.append((port, op, len(run_ids)))
        return len(run_ids), []

    def no_quick_check(*a, **k):
        raise AssertionError("quick_check called for a sharded alias")

    monkeypatch.setattr("bench.sharded.run_fixtures", fake)
    g = run_gate("impl_jax", "usp", "cpu", quick_check=no_quick_check)
    assert (g.status, g.n_run) == ("passed", 8) and seen == [("impl_jax", "usp", 8)]


@pytest.mark.slow
def test_a_tiny_run_of_the_six_rows_gives_records_with_their_fields(tmp_path):
    """Each row's child starts, answers its calls and ends; the records carry a time, the
    child's setup as compile_s, no memory; derive adds the ratio and the bytes (~60 s)."""
    w = Workload("sharded", 1, 8, 8, 64, 64, 16, 16, False)
    rows = tuple(row_by_name(n) for n in NAMES)
    plan = Plan(machine("cpu"), "test", [w], rows, build_cases(machine("cpu"), [w], rows))
    session = BenchSession(plan, gates=GateCache(skip=True))
    for case in plan.cases:
        if case.kind == "row":
            session.run_case(case, FakeBenchmark(min_rounds=2))
    records = [r.to_dict() for r in session.ordered_records() if r.kind == "row"]
    assert [r["row"] for r in records] == NAMES
    derive(records, ROWS)
    for r in records:
        assert r["status"] == "ok", r["reason"]
        assert r["stats"]["rounds"] == 2 and r["compile_s"] is not None
        assert r["memory_bytes"] is None and "not measured" in r["memory_method"]
        d = r["derived"]
        assert d["sent_bytes"] == sent_bytes(r["row"].split()[1], w) and d["ratio"] > 0


@pytest.mark.slow
def test_the_gate_of_torch_usp_runs_its_fixtures_on_four_gloo_ranks():
    """The bench's child is a group of 4 gloo ranks, and USP's fixtures run there, in the
    group its rows are timed in (~25 s)."""
    g = run_gate("impl_torch", "usp", "cpu")
    assert (g.status, g.n_run, g.n_failed) == ("passed", 8, 0), g.detail
