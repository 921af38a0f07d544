"""The benchmark session: the plan of cases, the gate, the records, and the pytest plugin.

``python -m bench`` builds a :class:`BenchSession` and hands it to ``pytest.main`` as a plugin;
``bench/bench_attention.py`` parametrizes one pytest-benchmark test over ``session.cases`` and
calls :meth:`BenchSession.run_case` for each, then one test over ``session.goal_cases`` that
calls :meth:`BenchSession.run_goal` (each goal's two calls timed interleaved, ``bench/goals.py``).
Running ``pytest bench/bench_attention.py`` directly builds the session from
``--bench-device`` / ``--bench-grid`` (options of ``bench/conftest.py``), so pytest-benchmark's
own options (``--benchmark-autosave``, ``--benchmark-compare``) work too.

Each case ends as one :class:`Record`. Statuses:

- ``ok``: gated and timed;
- ``failed``: the correctness gate did not pass; never timed;
- ``n/a``: the row's code does not exist (yet), or its framework cannot run on this device;
- ``skipped``: the workload does not fit (memory), or is outside what a host row runs on an
  accelerator grid;
- ``unsupported``: the framework has no kernel for it (e.g. an SDPA backend and a dtype);
- ``oom``: it ran out of memory; ``error``: anything else went wrong.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import pytest

from bench import goals, runners
from bench.devices import (
    cpu_snapshot,
    float32_precision,
    framework_device,
    memory_budgets,
    others_share,
    peak_key,
)
from bench.gate import GateCache, GateResult
from bench.report import memory_text
from bench.rows import ROWS, Goal, Row
from bench.workloads import Workload

__all__ = [
    "HOST_LIMIT",
    "IMPL_ACCEL_LIMIT",
    "SESSION_KEY",
    "BenchSession",
    "Case",
    "Record",
    "build_cases",
    "build_goal_cases",
    "estimate_bytes",
]

SESSION_KEY = pytest.StashKey["BenchSession"]()

#: On an accelerator run, host (NumPy) rows only take float32 workloads up to this L * S.
HOST_LIMIT = 4096 * 4096
#: On an accelerator run, the project's rows (Python-level tiling and plain tensor code, not
#: kernels) stop at this L * S; the frameworks' kernels go on to the longest lengths.
IMPL_ACCEL_LIMIT = 32768 * 32768
#: Matmul size for the device's peak FLOP/s, by device class.
PEAK_N = {"cpu": 2048, "cuda": 8192, "tpu": 8192}
_FRAMEWORKS = ("numpy", "torch", "jax")
_STATS = ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3", "rounds")


@dataclass
class Case:
    """One test: a row on a workload (``kind="row"``), a peak matmul (``kind="peak"``), or a
    goal whose two calls ``pair`` are timed interleaved (``kind="goal"``)."""

    id: str
    kind: str
    framework: str
    fdevice: str | None
    row: Row | None = None
    workload: Workload | None = None
    dtype: str | None = None
    n: int | None = None
    skip: tuple[str, str] | None = None  # (status, reason) decided before running
    goal: Goal | None = None
    pair: tuple[tuple[Row, Workload, str | None], ...] = ()  # (row, workload, fdevice) A, B


@dataclass
class Record:
    """The outcome of one case, as stored in results.json."""

    case_id: str
    kind: str
    row: str
    row_kind: str
    framework: str
    device: str | None
    status: str
    reason: str = ""
    workload: dict[str, Any] | None = None
    gate: dict[str, Any] | None = None
    compile_s: float | None = None
    memory_bytes: int | None = None
    memory_method: str = ""
    skips_masked: bool | None = None
    stats: dict[str, float] | None = None
    iterations: int | None = None
    matmul: dict[str, Any] | None = None
    contention: float | None = None  # share of the CPUs other processes used while timing
    goal: dict[str, Any] | None = None  # a goal case: the pair, the per-round ratios, spread
    wall_s: float | None = None  # the case's own seconds: gate (its first use), prepare, calls

    def to_dict(self) -> dict:
        return asdict(self)


def estimate_bytes(row: Row, w: Workload) -> int:
    """Rough peak bytes of ``row`` on ``w``: inputs and output (and a decode step's KV cache,
    a training step's gradients), plus three float32 score-sized temporaries for rows that
    materialize ``(B, H, L, S)`` scores (seven for a training step: what autograd saves and
    the backward's dW, dS and products; torch's plain step measured 7.2 at L = S = 1024, JAX's
    plan 6), plus projections for modules and decode steps."""
    n = w.input_bytes()
    if row.materializes:
        n += (7 if w.op == "train" else 3) * w.score_bytes()
    if w.op in ("module", "decode"):
        n += 4 * w.B * w.L * w.M * 4
    return n


def _param_id(nodeid: str) -> str:
    """The case id in a test's node id: ``test_attention[<case id>]``, ``test_goal[...]``."""
    return nodeid.partition("[")[2][:-1]


def _case_id(*parts: str) -> str:
    return "|".join(p.replace(" ", "_") for p in parts)


def _resolve_error(row: Row) -> str | None:
    try:
        row.resolve()
    except Exception as e:  # ImportError, AttributeError, or a broken module
        return f"not available: {type(e).__name__}: {e}"
    return None


def build_cases(
    device: str,
    workloads: list[Workload],
    rows: tuple[Row, ...] = ROWS,
    *,
    fdevice_of: Callable[[str, str], str | None] = framework_device,
    memory_bytes: int | dict[str, int | None] | None = None,
    resolve_error: Callable[[Row], str | None] = _resolve_error,
) -> list[Case]:
    """All cases of a run, framework by framework (numpy, torch, jax), each framework's peak
    matmuls first, then workload by workload. Cases that cannot run carry ``skip``.

    Rows not meant for ``device`` (``row.devices``) are left out; rows whose code is missing
    get one ``n/a`` case per workload so the report shows them. ``memory_bytes``: what a
    workload may use, one number or one per framework (``devices.memory_budgets``: JAX on a
    GPU is held to XLA's own limit, not to what torch sees free).
    """
    dtypes = sorted({w.dtype for w in workloads}, key=["float32", "bfloat16", "float16"].index)
    cases: list[Case] = []
    for fw in _FRAMEWORKS:
        fdev = fdevice_of(fw, device)
        budget = memory_bytes.get(fw) if isinstance(memory_bytes, dict) else memory_bytes
        fw_rows = [r for r in rows if r.framework == fw and device in r.devices]
        if fdev is not None and fw_rows:
            for dt in dtypes if fw != "numpy" else ["float32"]:
                n = PEAK_N[peak_key(fdev)]
                cid = _case_id("peak", fw, dt, str(n))
                cases.append(Case(cid, "peak", fw, fdev, dtype=dt, n=n))
        missing = {r.name: resolve_error(r) for r in fw_rows}
        for w in workloads:
            for r in fw_rows:
                if not r.applies_to(w):
                    continue
                skip = None
                if missing[r.name]:
                    skip = ("n/a", missing[r.name])
                elif fdev is None:
                    skip = ("n/a", f"{fw} cannot run on {device} here")
                elif (
                    fw == "numpy"
                    and device != "cpu"
                    and (w.dtype != "float32" or w.L * w.S > HOST_LIMIT)
                ):
                    skip = ("skipped", "host NumPy on an accelerator run: float32, L*S <= 4096^2")
                elif r.kind == "impl" and device != "cpu" and w.L * w.S > IMPL_ACCEL_LIMIT:
                    skip = ("skipped", "project rows on an accelerator: L*S <= 32768^2")
                elif budget is not None and estimate_bytes(r, w) > 0.9 * budget:
                    need, have = estimate_bytes(r, w) / 2**30, budget / 2**30
                    skip = ("skipped", f"needs ~{need:.1f} GiB, {have:.1f} GiB free for {fw}")
                cases.append(Case(_case_id(r.name, w.id), "row", fw, fdev, r, w, skip=skip))
    return cases


def build_goal_cases(
    device: str,
    workloads: list[Workload],
    rows: tuple[Row, ...] = ROWS,
    *,
    fdevice_of: Callable[[str, str], str | None] = framework_device,
    resolve_error: Callable[[Row], str | None] = _resolve_error,
) -> list[Case]:
    """One case per performance goal whose two calls this run has: both rows selected, the
    goal's workloads in the grid (``Goal.runs_in``: the L = S = 8192 window and memory goals
    are the full grid's), and a CPU run (the goals are stated for CPU float32)."""
    if device != "cpu":
        return []
    by_name = {r.name: r for r in rows}
    cases = []
    for row in rows:
        for goal in row.goals:
            w = goal.workload()
            if goal.kind in ("causal", "rolling", "window"):  # the row against itself
                pair = ((row, w), (row, goal.baseline()))
            else:  # against its reference (a memory goal: the plain path, beside it)
                pair = ((row, w), (by_name.get(goal.ref), w))
            # the grid must list its workloads (Goal.grid_workloads: the L = S = 8192 goals
            # are the full grid's), and the run must have both rows
            if not goal.runs_in(workloads) or any(r is None for r, _ in pair):
                continue
            full = tuple((r, wl, fdevice_of(r.framework, device)) for r, wl in pair)
            missing = [e for e in (resolve_error(r) for r, _ in pair) if e]
            skip = ("n/a", missing[0]) if missing else None
            cid = _case_id("goal", row.name, goal.text())
            cases.append(Case(cid, "goal", row.framework, full[0][2], row, w, skip=skip,
                              goal=goal, pair=full))  # fmt: skip
    return cases


def _summary(rec: Record) -> str:
    """One line for a finished case: ``numpy sdpa | attention.mha... | ok 12.3 ms``."""
    what = f"{rec.row} | {rec.workload['label'] if rec.workload else rec.case_id}"
    if rec.kind == "goal" and rec.status == "ok" and rec.goal and rec.goal["kind"] == "memory":
        g = rec.goal
        return f"goal {rec.row} {g['text']} | {memory_text(g)} {g['status']}"
    if rec.kind == "goal" and rec.status == "ok" and rec.goal:
        q = rec.goal["ratio"]
        return (
            f"goal {rec.row} {rec.goal['text']} | {q['median']:.2f}x "
            f"(IQR {q['q1']:.2f}-{q['q3']:.2f}, {rec.goal['rounds']} rounds) {rec.goal['status']}"
            + (
                f", peak {rec.goal['a_peak_bytes'] / 2**20:.1f} MiB"
                if rec.goal.get("a_peak_bytes") is not None
                else ""
            )
        )
    if rec.status == "ok" and rec.stats:
        return f"{what} | ok {rec.stats['median'] * 1e3:.3g} ms"
    return f"{what} | {rec.status}: {rec.reason[:100]}"


class BenchSession:
    """Plan, gate, run and record one benchmark run (a pytest plugin).

    Args:
        device: ``cpu``, ``cuda`` or ``tpu`` (already resolved).
        grid: the grid's name, for the report.
        workloads: the workloads to run.
        rows: the registry (filtered).
        gates: the gate cache (``GateCache(skip=True)`` for ``--skip-gate``).
        progress: a rich ``Progress`` to drive, or None.
        echo: called with one line per finished case (for logs, where a live display is not
            possible), or None.
        cases: a prebuilt plan (tests); built from the arguments otherwise.
        goal_cases: prebuilt goal cases (tests); built from the arguments otherwise.
        tf32: the run's ``--tf32`` (the precision of the float32 peak matmul).
        goal_rounds, goal_sample_s, goal_max_s, goal_settle_s: rounds of each goal's
            interleaved timing (at least 5), the shortest sample, the seconds after which no
            round beyond the fifth starts, and the pause before each sample of a goal whose two
            rows are different frameworks' (``goals.interleave``).
    """

    def __init__(
        self,
        device: str,
        grid: str,
        workloads: list[Workload],
        rows: tuple[Row, ...] = ROWS,
        *,
        gates: GateCache | None = None,
        progress: Any = None,
        echo: Callable[[str], None] | None = None,
        cases: list[Case] | None = None,
        goal_cases: list[Case] | None = None,
        tf32: str = "default",
        goal_rounds: int = goals.MIN_ROUNDS,
        goal_sample_s: float = 0.005,
        goal_max_s: float | None = None,
        goal_settle_s: float = 0.0,
    ) -> None:
        self.device = device
        self.grid = grid
        self.workloads = workloads
        self.rows = rows
        self.gates = gates or GateCache()
        self.progress = progress
        self.echo = echo
        self.tf32 = tf32
        self.goal_rounds = goal_rounds
        self.goal_sample_s = goal_sample_s
        self.goal_max_s = goal_max_s
        self.goal_settle_s = goal_settle_s
        self._done = 0
        self._task = None
        if cases is None:
            cases = build_cases(device, workloads, rows, memory_bytes=memory_budgets(device))
        if goal_cases is None:
            goal_cases = build_goal_cases(device, workloads, rows)
        self.cases = cases
        self.goal_cases = goal_cases
        self._total = len(cases) + len(goal_cases)  # until pytest has collected (deselected)
        self.records: dict[str, Record] = {}
        self._started: dict[str, float] = {}  # case id -> perf_counter() when it began
        self.started = time.time()
        #: ``time.monotonic()`` after which no case starts (``--budget-s``); None: no limit.
        self.deadline: float | None = None

    def _over_budget(self, case: Case) -> None:
        """Record and skip ``case`` when the run's time budget is spent."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            self._record(case, "skipped", "the run's time budget (--budget-s) was spent")
            pytest.skip("time budget spent")

    # ----------------------------------------------------------------------------- pytest hooks

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        config.stash[SESSION_KEY] = self

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        """Cases the user's own pytest arguments leave out (``-- -k test_goal``) are ``skipped``
        and say so; only a case pytest was meant to run and never reached is an ``error``."""
        by_id = {c.id: c for c in self.cases + self.goal_cases}
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
                self.echo(f"[{self._done}/{self._total}] {_summary(rec)}")

    def _phase(self, case: Case, phase: str) -> None:
        if self.progress is None or self._task is None:
            return
        what = {
            "peak": lambda: f"peak matmul {case.framework} {case.dtype} n={case.n}",
            "goal": lambda: f"goal {case.row.name} {case.goal.text()}",
        }.get(case.kind, lambda: f"{case.row.name} · {case.workload.label}")()
        from rich.markup import escape

        self.progress.update(self._task, description=f"{escape(what)} [dim]({phase})[/dim]")

    # ----------------------------------------------------------------------------- running

    def gate_for(self, case: Case) -> GateResult:
        """The gate result of a row case (run once per port/op/device/pin)."""
        return self._gate(case.row, case.fdevice)

    def _gate(self, row: Row, fdevice: str | None) -> GateResult:
        device = peak_key(fdevice or self.device)
        return self.gates.check(row.gate_port, row.gate_alias, device, row.gate_pin)

    def _matmul_precision(self, dtype: str) -> str:
        return float32_precision(self.tf32) if dtype == "float32" else "native"

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

    def run_case(self, case: Case, benchmark: Any) -> None:
        """Gate, prepare, warm up, measure memory, then time ``case`` with ``benchmark``.

        Untimed outcomes are recorded and end the test with ``pytest.skip``; an error in one
        of the project's rows is recorded and re-raised so that pytest shows the traceback.
        """
        self._started[case.id] = time.perf_counter()
        if case.skip is not None:
            self._record(case, *case.skip)
            pytest.skip(case.skip[1])
        self._over_budget(case)
        extra: dict[str, Any] = {}
        if case.kind == "row":
            self._phase(case, "gate")
            gate = self.gate_for(case)
            extra["gate"] = gate.to_dict()
            if gate.status == "unsupported":  # the pinned kernel takes none of its fixtures
                self._record(case, "unsupported", f"gate: {gate.detail}", **extra)
                pytest.skip(f"unsupported: {gate.detail}")
            if not gate.ok:
                self._record(case, "failed", f"correctness gate: {gate.detail}", **extra)
                pytest.skip(f"correctness gate did not pass: {gate.detail}")
        self._phase(case, "compile" if case.framework == "jax" else "prepare")
        prepared = None
        try:
            if case.kind == "peak":
                precision = self._matmul_precision(case.dtype)
                prepared = runners.prepare_matmul(
                    case.framework, case.dtype, case.n, case.fdevice, precision
                )
                extra["matmul"] = {"n": case.n, "dtype": case.dtype, "flops": 2 * case.n**3,
                                   "precision": precision}  # fmt: skip
            else:
                prepared = runners.prepare(case.row, case.workload, case.fdevice)
            extra["compile_s"] = prepared.compile_s
            # One untimed warm-up call keeps first-call effects out of the statistics. On the
            # host (NumPy, torch CPU) the instrumented memory call is that warm-up: a call
            # allocates the same there every time. On CUDA the first call also sets up library
            # handles and workspaces, so memory is measured after a separate warm-up; JAX's
            # memory comes from XLA without a call.
            host = case.fdevice == "cpu" and case.framework != "jax"
            t0 = time.perf_counter()
            if not (host and case.kind == "row"):
                self._phase(case, "warm-up")
                prepared.call()
            if case.kind == "row":
                self._phase(case, "memory")
                extra["memory_bytes"], extra["memory_method"] = prepared.memory()
            first_s = time.perf_counter() - t0
            self._phase(case, "timing")
            benchmark.group = case.workload.id if case.workload else "peak"
            benchmark.extra_info.update(
                {"case": case.id, "device": case.fdevice, "compile_s": prepared.compile_s}
            )
            before = cpu_snapshot()
            self._time(benchmark, prepared.call, first_s)
            extra["contention"] = others_share(before, cpu_snapshot())
        except pytest.skip.Exception:
            raise
        except Exception as e:
            status = runners.classify_error(e, case.row.kernel if case.row else None)
            self._record(case, status, f"{type(e).__name__}: {e}".splitlines()[0][:300], **extra)
            if status == "error" and (case.row is None or case.row.kind == "impl"):
                raise
            pytest.skip(f"{status}: {e}")
        finally:
            del prepared
            self._release(case)
        stats = getattr(benchmark, "stats", None)
        if not stats:  # --benchmark-disable: ran once, no statistics
            self._record(case, "ok", "not timed (benchmarks disabled)", **extra)
            return
        self._record(
            case,
            "ok",
            stats={k: float(getattr(stats.stats, k)) for k in _STATS},
            iterations=int(stats.iterations),
            **extra,
        )

    def run_goal(self, case: Case) -> None:
        """Gate both calls of a goal, then time them interleaved (``goals.interleave``) and
        record the per-round ratios. Untimed outcomes end the test with ``pytest.skip``."""
        self._started[case.id] = time.perf_counter()
        if case.skip is not None:
            self._record(case, *case.skip)
            pytest.skip(case.skip[1])
        self._over_budget(case)
        if case.goal.kind == "memory":
            return self._run_memory_goal(case)
        (row_a, w_a, dev_a), (row_b, w_b, dev_b) = case.pair
        info = self._gate_goal(case)
        self._phase(case, "interleaved timing")
        prepared = []
        try:
            prepared = [runners.prepare(row_a, w_a, dev_a), runners.prepare(row_b, w_b, dev_b)]
            before = cpu_snapshot()
            timing = goals.interleave(
                prepared[0].call, prepared[1].call,
                rounds=self.goal_rounds, min_sample_s=self.goal_sample_s, max_s=self.goal_max_s,
                settle_s=self.goal_settle_s if row_a.framework != row_b.framework else 0.0,
            )  # fmt: skip
            contention = others_share(before, cpu_snapshot())
            if case.goal.kind == "window":  # the second number: the window's memory
                info["a_peak_bytes"], info["a_memory_method"] = prepared[0].memory()
        except Exception as e:
            status = runners.classify_error(e)
            self._record(case, status, f"{type(e).__name__}: {e}".splitlines()[0][:300], goal=info)
            if status == "error":
                raise
            pytest.skip(f"{status}: {e}")
        finally:
            del prepared
            gc.collect()
        summary = timing.summary()
        q = summary["ratio"]
        info.update(summary, status=goals.decide(case.goal.kind, case.goal.limit, q["q1"], q["q3"]))
        self._record(case, "ok", contention=contention, goal=info)

    def _gate_goal(self, case: Case) -> dict[str, Any]:
        """Gate both rows of a goal on their fixtures; return the goal's record (``info``).
        A row whose gate does not pass records the goal as failed and skips the test."""
        (row_a, w_a, dev_a), (row_b, w_b, dev_b) = case.pair
        info: dict[str, Any] = {
            "kind": case.goal.kind,
            "limit": case.goal.limit,
            "ref": case.goal.ref,
            "text": case.goal.text(),
            "a": {"row": row_a.name, "workload": w_a.id},
            "b": {"row": row_b.name, "workload": w_b.id},
        }
        self._phase(case, "gate")
        for row, dev in ((row_a, dev_a), (row_b, dev_b)):
            gate = self._gate(row, dev)
            if not gate.ok:
                self._record(case, "failed", f"{row.name}: gate {gate.status}: {gate.detail}",
                             gate=gate.to_dict(), goal=info)  # fmt: skip
                pytest.skip(f"correctness gate of {row.name} did not pass")
        return info

    def _run_memory_goal(self, case: Case) -> None:
        """A memory goal (``Goal(kind="memory")``): the peak extra memory of one training step
        of the row on the goal's workload (L = S = 8192), against the limit, and the plain
        path's (``goal.ref``) beside it when it fits this machine's memory (its scores alone
        are gigabytes; JAX's is read from XLA's plan without running). One call each, untimed:
        a peak is not a distribution."""
        (row_a, w, dev_a), (row_b, _, dev_b) = case.pair
        info = self._gate_goal(case)
        self._phase(case, "memory")
        budgets = memory_budgets(self.device)
        try:
            for side, row, dev in (("a", row_a, dev_a), ("b", row_b, dev_b)):
                budget = budgets.get(row.framework)
                need = estimate_bytes(row, w)
                # a side measurement: it may not take more than half of what is free (JAX's
                # plan is read without running)
                if row.framework != "jax" and budget is not None and need > 0.5 * budget:
                    info[f"{side}_peak_bytes"] = None
                    info[f"{side}_memory_method"] = (
                        f"not run: needs ~{need / 2**30:.1f} GiB, {budget / 2**30:.1f} GiB free"
                    )
                    continue
                prepared = runners.prepare(row, w, dev)
                info[f"{side}_peak_bytes"], info[f"{side}_memory_method"] = prepared.memory()
                del prepared
                gc.collect()
        except Exception as e:
            status = runners.classify_error(e)
            self._record(case, status, f"{type(e).__name__}: {e}".splitlines()[0][:300], goal=info)
            if status == "error":
                raise
            pytest.skip(f"{status}: {e}")
        peak = info["a_peak_bytes"]
        met = peak is not None and case.goal.met(peak)
        info["status"] = "not measured" if peak is None else ("met" if met else "missed")
        self._record(case, "ok", goal=info)

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

    def _release(self, case: Case) -> None:
        """Free device memory between cases (torch's caching allocator would starve JAX)."""
        gc.collect()
        if case.framework == "torch" and case.fdevice == "cuda":
            import torch

            torch.cuda.empty_cache()

    def record_unrun(self) -> None:
        """Cases pytest was to run and never reached (an interrupted run): ``error`` records."""
        for case in self.cases + self.goal_cases:
            if case.id not in self.records:
                self._record(case, "error", "not run (pytest did not reach it)")

    def ordered_records(self) -> list[Record]:
        """Records in plan order (the goals last)."""
        return [self.records[c.id] for c in self.cases + self.goal_cases if c.id in self.records]

    def gate_results(self) -> list[dict]:
        return [g.to_dict() for g in self.gates.results.values()]
