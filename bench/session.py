"""Run a plan under pytest: the plugin, its live progress, and one record per case.

``python -m bench`` hands a :class:`BenchSession` (around a ``bench.plan.Plan``) to
``pytest.main`` as a plugin (:meth:`BenchSession.run`); ``bench/bench_attention.py``
parametrizes one pytest-benchmark test over ``plan.cases`` and calls
:meth:`BenchSession.run_case` for each, then one test over ``plan.goal_cases`` that calls
:meth:`BenchSession.run_goal` (each goal's two calls timed interleaved, ``bench/goals.py``).
Running ``pytest bench/bench_attention.py`` directly builds the session from
``--bench-device`` / ``--bench-grid`` (options of ``bench/conftest.py``), so pytest-benchmark's
own options (``--benchmark-autosave``, ``--benchmark-compare``) work too.

Each case ends as one ``bench.records.Record``. An outcome that is not a timing (a failed gate,
an unsupported kernel, a case that cannot run) is recorded and ends the test with
``pytest.skip``; an error in one of the project's rows (or in a goal) is recorded and re-raised,
so that pytest shows its traceback.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from bench import goals, preparers
from bench.devices import CpuSnapshot, cpu_snapshot, others_share
from bench.errors import classify_error, reason
from bench.gate import GateCache, GateResult
from bench.peak import prepare_matmul
from bench.plan import GRID_TIMING, Case, Plan
from bench.records import STATS, Record, summary
from bench.report import build_results
from bench.rows import Row

__all__ = ["BENCH_FILE", "SESSION_KEY", "BenchSession", "pytest_args"]

SESSION_KEY = pytest.StashKey["BenchSession"]()
BENCH_FILE = Path(__file__).resolve().parent / "bench_attention.py"
REPO = BENCH_FILE.parent.parent


def pytest_args(out_dir: Path, grid_name: str, extra: list[str]) -> list[str]:
    """The pytest command line for one run (the grid's ``GRID_TIMING``; ``extra``: the user's
    arguments after ``--``)."""
    timing = GRID_TIMING[grid_name]
    return [
        str(BENCH_FILE),
        f"--rootdir={REPO}",
        "-p", "no:cacheprovider",
        "--capture=sys",
        "-q",
        f"--benchmark-json={out_dir / 'pytest-benchmark.json'}",
        f"--benchmark-max-time={timing['max_time']}",
        f"--benchmark-min-rounds={timing['min_rounds']}",
        "--benchmark-warmup=off",  # each case is warmed up explicitly before calibration
        "--benchmark-disable-gc",
        "--benchmark-sort=name",
        *extra,
    ]


def _param_id(nodeid: str) -> str:
    """The case id in a test's node id: ``test_attention[<case id>]``, ``test_goal[...]``."""
    return nodeid.partition("[")[2][:-1]


class BenchSession:
    """Gate, run and record the cases of one plan (a pytest plugin).

    Args:
        plan: what to run (``bench.plan.make_plan``, or cases built by a test).
        gates: the gate cache (``GateCache(skip=True)`` for ``--skip-gate``).
        progress: a rich ``Progress`` to drive, or None.
        echo: called with one line per finished case (for logs, where a live display is not
            possible), or None.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        gates: GateCache | None = None,
        progress: Any = None,
        echo: Callable[[str], None] | None = None,
    ) -> None:
        self.plan = plan
        self.gates = gates or GateCache()
        self.progress = progress
        self.echo = echo
        self._done = 0
        self._task = None
        self._total = len(plan.all_cases)  # until pytest has collected (deselected left out)
        self.records: dict[str, Record] = {}
        self._started: dict[str, float] = {}  # case id -> perf_counter() when it began
        #: ``time.monotonic()`` after which no case starts (``--budget-s``); None: no limit.
        self.deadline: float | None = None

    def run(self, out_dir: Path, extra: list[str], console: Any) -> int:
        """Run the plan with pytest (``pytest_args``), its own output into ``pytest.log``: a
        live progress bar on a terminal, one line per finished case on a log or a pipe. Cases
        pytest never reached are recorded as errors. Returns pytest's exit code."""
        from rich.markup import escape
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        display: Any = contextlib.nullcontext()
        if console.is_terminal:
            display = self.progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                redirect_stdout=False, redirect_stderr=False, transient=False,
            )
        else:  # a log or a pipe: one line per case instead of a live display
            self.echo = lambda line: console.print(escape(line), highlight=False)
        with open(out_dir / "pytest.log", "w") as log, display:
            # pytest's own terminal output (and pytest-benchmark's table) goes to pytest.log
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                code = pytest.main(pytest_args(out_dir, self.plan.grid, extra), plugins=[self])
        self.record_unrun()
        return int(code)

    # ----------------------------------------------------------------------------- pytest hooks

    def results(self, started: float, cpu_before: CpuSnapshot | None, pytest_options: dict
                ) -> dict:
        """The run's results.json document (``report.build_results``): the records in plan
        order, the gates, the plan's goals, the machine's environment, the run's wall time since
        ``started`` (``time.perf_counter()``) and the share of the CPUs other processes used
        since ``cpu_before``."""
        records = [r.to_dict() for r in self.ordered_records()]
        wall_s = time.perf_counter() - started
        contention = others_share(cpu_before, cpu_snapshot())
        machine = self.plan.machine
        return build_results(
            device=machine.device, grid=self.plan.grid, environment=dict(machine.environment),
            records=records, gates=self.gate_results(), wall_s=wall_s, rows=self.plan.rows,
            goals=self.plan.goals, pytest_options=pytest_options, contention=contention,
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        """The run starts: the tests find this session (its float32 matmul precision, ``--tf32``,
        was set when the machine was resolved, ``devices.resolve``)."""
        config.stash[SESSION_KEY] = self

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        """Cases the user's own pytest arguments leave out (``-- -k test_goal``) are ``skipped``
        and say so; only a case pytest was meant to run and never reached is an ``error``."""
        by_id = {c.id: c for c in self.plan.all_cases}
        for item in items:
            case = by_id.get(_param_id(item.nodeid))
            if case is not None and case.id not in self.records:
                self._record(case, "skipped", "deselected by the pytest arguments after --")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._total = len(session.items)  # what this run will report on, deselected left out
        if self.progress is not None:
            self._task = self.progress.add_task("benchmark", total=len(session.items))

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        self._done += 1
        if self.progress is not None and self._task is not None:
            self.progress.advance(self._task)
        if self.echo is not None:
            rec = self.records.get(_param_id(nodeid))
            if rec is not None:
                self.echo(f"[{self._done}/{self._total}] {summary(rec)}")

    def _phase(self, case: Case, phase: str) -> None:
        if self.progress is None or self._task is None:
            return
        what = {
            "peak": lambda: f"peak matmul {case.framework} {case.dtype} n={case.n}",
            "goal": lambda: f"goal {case.row.name} {case.goal.text()}",
        }.get(case.kind, lambda: f"{case.row.name} · {case.workload.label}")()
        from rich.markup import escape

        self.progress.update(self._task, description=f"{escape(what)} [dim]({phase})[/dim]")

    # ----------------------------------------------------------------------------- a row or peak

    def run_case(self, case: Case, benchmark: Any) -> None:
        """Gate, prepare, warm up, measure memory, then time ``case`` with ``benchmark``."""
        self._start(case)
        fields: dict[str, Any] = {}
        if case.kind == "row":
            fields["gate"] = self._gate_row(case)
        self._phase(case, "compile" if case.framework == "jax" else "prepare")
        row = case.row
        prepared = None
        derived = None  # what the prepared call knows without timing (Prepared.derived)
        try:
            with self._outcome(case, fields, row.kernel if row else None,
                               reraise=row is None or row.kind == "impl"):
                if case.kind == "peak":
                    prepared, fields["matmul"] = prepare_matmul(
                        case.framework, case.dtype, case.n, case.fdevice, self.plan.machine.tf32
                    )
                else:
                    prepared = preparers.prepare(row, case.workload, case.fdevice)
                fields["compile_s"] = prepared.compile_s
                derived = prepared.derived or None
                # One untimed warm-up call keeps first-call effects out of the statistics. On
                # the host (NumPy, torch CPU) the instrumented memory call is that warm-up: a
                # call allocates the same there every time. On CUDA the first call also sets up
                # library handles and workspaces, so memory is measured after a separate
                # warm-up; JAX's memory comes from XLA without a call.
                host = case.fdevice == "cpu" and case.framework != "jax"
                t0 = time.perf_counter()
                if not (host and case.kind == "row"):
                    self._phase(case, "warm-up")
                    prepared.call()
                if case.kind == "row":
                    self._phase(case, "memory")
                    fields["memory_bytes"], fields["memory_method"] = prepared.memory()
                first_s = time.perf_counter() - t0
                self._phase(case, "timing")
                benchmark.group = case.workload.id if case.workload else "peak"
                benchmark.extra_info.update(
                    {"case": case.id, "device": case.fdevice, "compile_s": prepared.compile_s}
                )
                before = cpu_snapshot()
                self._time(benchmark, prepared.call, first_s)
                fields["contention"] = others_share(before, cpu_snapshot())
        finally:
            del prepared
            self._release(case)
        stats = getattr(benchmark, "stats", None)
        if not stats:  # --benchmark-disable: ran once, no statistics
            self._record(case, "ok", "not timed (benchmarks disabled)", **fields)
            return
        self._record(
            case,
            "ok",
            stats={k: float(getattr(stats.stats, k)) for k in STATS},
            iterations=int(stats.iterations),
            derived=derived,
            **fields,
        )

    def _gate_row(self, case: Case) -> dict[str, Any]:
        """The gate of a row case, as its record's ``gate``; a gate that does not pass records
        the case and ends the test."""
        gate = self._gate(case.row)
        if gate.status == "unsupported":  # the pinned kernel takes none of its fixtures
            self._end(case, "unsupported", f"gate: {gate.detail}",
                      f"unsupported: {gate.detail}", gate=gate.to_dict())
        if not gate.ok:
            self._end(case, "failed", f"correctness gate: {gate.detail}",
                      f"correctness gate did not pass: {gate.detail}",
                      gate=gate.to_dict())
        return gate.to_dict()

    @staticmethod
    def _time(benchmark: Any, call: Callable[[], Any], first_s: float) -> None:
        """Time ``call`` with pytest-benchmark.

        Normally ``benchmark(call)``: its calibration picks iterations per round and the
        number of rounds (at least ``min_rounds``, filling ``max_time``). For a call so slow
        that one already outlasts ``max_time / min_rounds`` that calibration can only pick one
        iteration and ``min_rounds`` rounds, so the harness asks for exactly that through
        ``benchmark.pedantic``, which saves the calibration call and the extra result call
        pytest-benchmark makes after the rounds (a third of a slow case's time).
        """
        max_time = float(getattr(benchmark, "_max_time", 1.0))
        min_rounds = int(getattr(benchmark, "_min_rounds", 5))
        if first_s * min_rounds >= max_time:
            benchmark.pedantic(call, rounds=min_rounds, iterations=1, warmup_rounds=0)
        else:
            benchmark(call)

    # ----------------------------------------------------------------------------- a goal

    def run_goal(self, case: Case) -> None:
        """Gate both calls of a goal, then time them interleaved (``goals.interleave``) and
        record the per-round ratios, or measure a memory goal's peaks."""
        self._start(case)
        info = self._gate_goal(case)
        if case.goal.kind == "memory":
            return self._measure_memory_goal(case, info)
        (row_a, w_a, dev_a), (row_b, w_b, dev_b) = case.pair
        self._phase(case, "interleaved timing")
        plan = self.plan
        prepared = []
        try:
            with self._outcome(case, {"goal": info}):
                prepared = [preparers.prepare(row_a, w_a, dev_a),
                            preparers.prepare(row_b, w_b, dev_b)]
                before = cpu_snapshot()
                timing = goals.interleave(
                    prepared[0].call, prepared[1].call,
                    rounds=plan.goal_rounds, min_sample_s=plan.goal_sample_s,
                    max_s=plan.goal_max_s,
                    settle_s=plan.goal_settle_s if row_a.framework != row_b.framework else 0.0,
                )
                contention = others_share(before, cpu_snapshot())
                if case.goal.kind == "window":  # the second number: the window's memory
                    info["a_peak_bytes"], info["a_memory_method"] = prepared[0].memory()
        finally:
            del prepared
            self._release(case)
        result = timing.summary()
        q = result["ratio"]
        info.update(result, status=goals.decide(case.goal.kind, case.goal.limit, q["q1"], q["q3"]))
        self._record(case, "ok", contention=contention, goal=info)

    def _gate_goal(self, case: Case) -> dict[str, Any]:
        """Gate both rows of a goal on their fixtures; return the goal's record (``info``).
        A row whose gate does not pass records the goal as failed and ends the test."""
        (row_a, w_a, _), (row_b, w_b, _) = case.pair
        info: dict[str, Any] = {
            "kind": case.goal.kind,
            "limit": case.goal.limit,
            "ref": case.goal.ref,
            "text": case.goal.text(),
            "a": {"row": row_a.name, "workload": w_a.id},
            "b": {"row": row_b.name, "workload": w_b.id},
        }
        self._phase(case, "gate")
        for row in (row_a, row_b):
            gate = self._gate(row)
            if not gate.ok:
                self._end(case, "failed", f"{row.name}: gate {gate.status}: {gate.detail}",
                          f"correctness gate of {row.name} did not pass",
                          gate=gate.to_dict(), goal=info)
        return info

    def _measure_memory_goal(self, case: Case, info: dict[str, Any]) -> None:
        """A memory goal (``Goal(kind="memory")``): the peak extra memory of one training step
        of the row on the goal's workload (L = S = 8192), against the limit, and the plain
        path's (``goal.ref``) beside it when it fits this machine's memory (``Machine.memory``,
        as the plan had it; its scores alone are gigabytes; JAX's is read from XLA's plan
        without running). One call each, untimed: a peak is not a distribution."""
        (row_a, w, dev_a), (row_b, _, dev_b) = case.pair
        self._phase(case, "memory")
        budgets = self.plan.machine.memory
        with self._outcome(case, {"goal": info}):
            for side, row, dev in (("a", row_a, dev_a), ("b", row_b, dev_b)):
                budget = budgets.get(row.framework)
                need = w.peak_bytes(row.materializes)
                # a side measurement: it may not take more than half of what is free (JAX's
                # plan is read without running)
                if row.framework != "jax" and budget is not None and need > 0.5 * budget:
                    info[f"{side}_peak_bytes"] = None
                    info[f"{side}_memory_method"] = (
                        f"not run: needs ~{need / 2**30:.1f} GiB, {budget / 2**30:.1f} GiB free"
                    )
                    continue
                prepared = preparers.prepare(row, w, dev)
                info[f"{side}_peak_bytes"], info[f"{side}_memory_method"] = prepared.memory()
                del prepared
                gc.collect()
        peak = info["a_peak_bytes"]
        met = peak is not None and case.goal.met(peak)
        info["status"] = "not measured" if peak is None else ("met" if met else "missed")
        self._record(case, "ok", goal=info)

    # ----------------------------------------------------------------------------- outcomes

    def _start(self, case: Case) -> None:
        """Start ``case``'s clock; end it at once when the plan decided it cannot run, or when
        the run's time budget is spent."""
        self._started[case.id] = time.perf_counter()
        if case.skip is not None:
            self._end(case, *case.skip, case.skip[1])
        if self.deadline is not None and time.monotonic() > self.deadline:
            self._end(case, "skipped", "the run's time budget (--budget-s) was spent",
                      "time budget spent")

    def _end(self, case: Case, status: str, reason: str, message: str, **fields: Any
             ) -> NoReturn:
        """Record an untimed outcome and end the test with ``pytest.skip(message)``."""
        self._record(case, status, reason, **fields)
        pytest.skip(message)

    @contextlib.contextmanager
    def _outcome(self, case: Case, fields: dict[str, Any], kernel: str | None = None, *,
                 reraise: bool = True) -> Iterator[None]:
        """An exception in the block is classified (``errors.classify_error``, ``kernel``: the
        row's own "not supported" words), recorded with ``fields`` as they are then, and ends
        the test: re-raised when it is an ``error`` and ``reraise``, else ``pytest.skip``."""
        try:
            yield
        except Exception as e:
            status = classify_error(e, kernel)
            self._record(case, status, reason(e), **fields)
            if status == "error" and reraise:
                raise
            pytest.skip(f"{status}: {e}")

    def _gate(self, row: Row) -> GateResult:
        """The gate of ``row`` on its framework's device class (run once per
        port/op/device/pin)."""
        machine = self.plan.machine
        device = machine.classes.get(row.framework) or machine.device
        return self.gates.check(row.gate_port, row.gate_alias, device, row.gate_pin)

    def _record(self, case: Case, status: str, reason: str = "", **kw: Any) -> Record:
        row = case.row
        started = self._started.get(case.id)
        if started is not None:
            kw.setdefault("wall_s", time.perf_counter() - started)
        rec = Record(
            case_id=case.id,
            kind=case.kind,
            row=row.name if row else f"matmul {case.framework}",
            row_kind=row.kind if row else "peak",
            framework=case.framework,
            device=case.fdevice,
            status=status,
            reason=reason,
            workload=case.workload.to_dict() if case.workload else None,
            skips_masked=row.skips_masked if row else None,
            **kw,
        )
        self.records[case.id] = rec
        return rec

    def _release(self, case: Case) -> None:
        """Free device memory between cases (torch's caching allocator would starve JAX)."""
        gc.collect()
        if case.framework == "torch" and case.fdevice == "cuda":
            import torch

            torch.cuda.empty_cache()

    def record_unrun(self) -> None:
        """Cases pytest was to run and never reached (an interrupted run): ``error`` records."""
        for case in self.plan.all_cases:
            if case.id not in self.records:
                self._record(case, "error", "not run (pytest did not reach it)")

    def ordered_records(self) -> list[Record]:
        """Records in plan order (the goals last)."""
        return [self.records[c.id] for c in self.plan.all_cases if c.id in self.records]

    def gate_results(self) -> list[dict]:
        return [g.to_dict() for g in self.gates.results.values()]
