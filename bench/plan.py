"""The plan of a run: which cases it has, in which order, and which of them cannot run.

:func:`make_plan` takes the run's machine (``bench/devices.py``, resolved), the grids of its
device (``bench/workloads.py``) and the ``--rows`` it was given; it chooses the rows
(``bench/rows.py``, :func:`select_rows`) and crosses them with its grid's workloads into cases
(:func:`build_cases`): each framework's peak matmuls first, then workload by workload. Then it
resolves each goal of those rows once (:func:`build_goals`): its two calls' workloads, how it
reads, which other grid runs it when this one does not, and its case when the run has both of
its calls. A case that cannot run carries its ``skip`` (status, reason), decided here before
anything is run: a row whose code does not exist yet (``n/a``), a framework that cannot run on
the device (``n/a``), a workload that does not fit in memory or that a host row does not run on
an accelerator (``skipped``).

Nothing here imports pytest or runs a row: ``python -m bench --list`` prints a plan,
``bench/session.py`` runs one under pytest, and ``bench/report.py`` states its goals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.devices import FRAMEWORKS, Machine
from bench.goals import MIN_ROUNDS, SETTLE_S
from bench.peak import PEAK_N
from bench.rows import ROWS, Goal, Row
from bench.workloads import Workload

__all__ = [
    "GRID_TIMING",
    "HOST_LIMIT",
    "IMPL_ACCEL_LIMIT",
    "Case",
    "Plan",
    "PlannedGoal",
    "build_cases",
    "build_goals",
    "make_plan",
    "select_rows",
]

#: Timing settings per grid: pytest-benchmark's time budget per case and minimum rounds, and
#: each goal's interleaved rounds, shortest sample, time budget and the pause before each sample
#: of a goal across two frameworks (``bench/goals.py``; the small grids skip the pause).
GRID_TIMING = {
    "quick": {"max_time": 0.25, "min_rounds": 3, "goal_rounds": 9, "goal_sample_s": 0.005,
              "goal_max_s": 10.0, "goal_settle_s": SETTLE_S},
    "full": {"max_time": 1.0, "min_rounds": 5, "goal_rounds": 21, "goal_sample_s": 0.02,
             "goal_max_s": 60.0, "goal_settle_s": SETTLE_S},
    "small": {"max_time": 0.05, "min_rounds": 3, "goal_rounds": 5, "goal_sample_s": 0.005,
              "goal_max_s": 5.0},
    "smoke": {"max_time": 0.01, "min_rounds": 2, "goal_rounds": 5, "goal_sample_s": 0.001,
              "goal_max_s": 2.0},
}

#: On an accelerator run, host (NumPy) rows only take float32 workloads up to this L * S.
HOST_LIMIT = 4096 * 4096
#: On an accelerator run, the project's rows (Python-level tiling and plain tensor code, not
#: kernels) stop at this L * S; the frameworks' kernels go on to the longest lengths.
IMPL_ACCEL_LIMIT = 32768 * 32768


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


@dataclass(frozen=True)
class PlannedGoal:
    """One performance goal of the run's rows, resolved once: what the session times and the
    report states.

    ``workload`` is its first call's, ``baseline`` its second call's (``Goal.baseline``: the
    non-causal twin, the causal run without the window, the rolling step at P = 1024, else the
    goal's own workload, run by ``goal.ref``); ``elsewhere``: the device's other grids that run
    it when this run's grid does not (``Goal.runs_in``); ``case``: its case when this run times
    it (a CPU run whose grid holds its workloads and which has both of its rows).
    """

    row: Row
    goal: Goal
    text: str
    workload: Workload
    baseline: Workload
    elsewhere: tuple[str, ...] = ()
    case: Case | None = None


@dataclass
class Plan:
    """What one run does: its cases and goal cases on ``machine`` (``devices.resolve``), every
    goal of its rows (:class:`PlannedGoal`), and how the goals are timed
    (``goals.interleave``: at least 5 rounds, the shortest sample, the seconds after which no
    round beyond the fifth starts, the pause before each sample of a goal whose two rows are
    different frameworks')."""

    machine: Machine
    grid: str
    workloads: list[Workload]
    rows: tuple[Row, ...]
    cases: list[Case] = field(default_factory=list)
    goal_cases: list[Case] = field(default_factory=list)
    goals: list[PlannedGoal] = field(default_factory=list)
    goal_rounds: int = MIN_ROUNDS
    goal_sample_s: float = 0.005
    goal_max_s: float | None = None
    goal_settle_s: float = 0.0

    @property
    def all_cases(self) -> list[Case]:
        """The cases in the order they run: the grid's, then the goals."""
        return self.cases + self.goal_cases


def make_plan(
    machine: Machine, grid_name: str, grids: dict[str, list[Workload]], *, rows: str = ""
) -> Plan:
    """The plan of ``python -m bench --grid grid_name --rows rows`` on ``machine``;
    ``grids``: every grid of its device (``workloads.grids``), ``grid_name`` among them."""
    chosen = select_rows(rows)
    workloads = grids[grid_name]
    cases = build_cases(machine, workloads, chosen)
    planned = build_goals(machine, grid_name, grids, chosen)
    timing: dict[str, Any] = GRID_TIMING.get(grid_name, {})
    return Plan(
        machine,
        grid_name,
        workloads,
        chosen,
        cases,
        [g.case for g in planned if g.case is not None],
        planned,
        goal_rounds=timing.get("goal_rounds", MIN_ROUNDS),
        goal_sample_s=timing.get("goal_sample_s", 0.005),
        goal_max_s=timing.get("goal_max_s"),
        goal_settle_s=timing.get("goal_settle_s", 0.0),
    )


def select_rows(spec: str, rows: tuple[Row, ...] = ROWS) -> tuple[Row, ...]:
    """Rows whose name contains any of the comma-separated substrings (all when empty)."""
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    if not wanted:
        return rows
    chosen = tuple(r for r in rows if any(s in r.name for s in wanted))
    if not chosen:
        raise SystemExit(f"--rows {spec!r} matches no row; rows: {[r.name for r in rows]}")
    # a ratio needs its reference: keep the fused kernels the chosen rows divide by
    refs = {r.ref for r in chosen} | {g.ref for r in chosen for g in r.goals}
    return tuple(r for r in rows if r in chosen or r.name in refs)


def _case_id(*parts: str) -> str:
    return "|".join(p.replace(" ", "_") for p in parts)


def _resolve_error(row: Row) -> str | None:
    try:
        row.resolve()
    except Exception as e:  # ImportError, AttributeError, or a broken module
        return f"not available: {type(e).__name__}: {e}"
    return None


def build_cases(
    machine: Machine,
    workloads: list[Workload],
    rows: tuple[Row, ...] = ROWS,
    *,
    resolve_error: Callable[[Row], str | None] = _resolve_error,
) -> list[Case]:
    """All cases of a run, framework by framework (numpy, torch, jax), each framework's peak
    matmuls first, then workload by workload. Cases that cannot run carry ``skip``.

    Rows not meant for the machine's device (``row.devices``) are left out; rows whose code is
    missing get one ``n/a`` case per workload so the report shows them. A workload may use what
    its framework may (``machine.memory``: JAX on a GPU is held to XLA's own limit, not to what
    torch sees free).
    """
    device = machine.device
    dtypes = sorted({w.dtype for w in workloads}, key=["float32", "bfloat16", "float16"].index)
    cases: list[Case] = []
    for fw in FRAMEWORKS:
        fdev = machine.fdevices.get(fw)
        budget = machine.memory.get(fw)
        fw_rows = [r for r in rows if r.framework == fw and device in r.devices]
        if fdev is not None and fw_rows:
            for dt in dtypes if fw != "numpy" else ["float32"]:
                n = PEAK_N[machine.classes[fw]]
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
                elif budget is not None and w.peak_bytes(r.materializes) > 0.9 * budget:
                    need, have = w.peak_bytes(r.materializes) / 2**30, budget / 2**30
                    skip = ("skipped", f"needs ~{need:.1f} GiB, {have:.1f} GiB free for {fw}")
                cases.append(Case(_case_id(r.name, w.id), "row", fw, fdev, r, w, skip=skip))
    return cases


def build_goals(
    machine: Machine,
    grid_name: str,
    grids: dict[str, list[Workload]],
    rows: tuple[Row, ...] = ROWS,
    *,
    resolve_error: Callable[[Row], str | None] = _resolve_error,
) -> list[PlannedGoal]:
    """Every goal of ``rows``, resolved (:class:`PlannedGoal`), with its case where this run
    times it: a CPU run (the goals are stated for CPU float32) whose grid ``grid_name`` holds
    the goal's workloads (``Goal.runs_in``: the L = S = 8192 window and memory goals are the
    full grid's) and which has both of its rows."""
    by_name = {r.name: r for r in rows}
    here = grids[grid_name]
    planned = []
    for row in rows:
        for goal in row.goals:
            text, w, baseline = goal.text(), goal.workload(), goal.baseline()
            runs_here = goal.runs_in(here)
            elsewhere = () if runs_here else tuple(
                name for name, ws in grids.items() if name != grid_name and goal.runs_in(ws)
            )
            # the row against itself (a causal, rolling or window goal), else against its
            # reference (a memory goal: the plain path, beside it)
            other = row if goal.kind in ("causal", "rolling", "window") else by_name.get(goal.ref)
            case = None
            if machine.device == "cpu" and runs_here and other is not None:
                pair = tuple((r, wl, machine.fdevices.get(r.framework))
                             for r, wl in ((row, w), (other, baseline)))
                missing = [e for e in (resolve_error(r) for r in (row, other)) if e]
                skip = ("n/a", missing[0]) if missing else None
                case = Case(_case_id("goal", row.name, text), "goal", row.framework, pair[0][2],
                            row, w, skip=skip, goal=goal, pair=pair)
            planned.append(PlannedGoal(row, goal, text, w, baseline, elsewhere, case))
    return planned
