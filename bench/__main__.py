"""``python -m bench``: gate, time and report every row on the best device found.

    python -m bench --device auto|cpu|cuda|tpu --grid quick|full|small|smoke
                    [--rows SUBSTR,...] [--tf32 default|on|off] [--skip-gate] [--out DIR]
                    [--gates-only] [--list] [-- PYTEST_ARGS...]

Runs ``bench/bench_attention.py`` under pytest with pytest-benchmark (its calibration,
statistics and JSON), shows live progress, prints the table, and writes
``results/bench-<timestamp>-<device>-<grid>/`` with ``results.json`` (records, environment,
gates, goals), ``pytest-benchmark.json`` (every round), ``report.txt``, ``pytest.log`` and the
PNG plots. Exit status: 0, or 1 when a row failed its correctness gate or one of the project's
rows raised. ``--gates-only`` runs every gate of the chosen rows on the device, times nothing,
and writes ``gates.json`` (exit 1 when one fails or cannot run).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.devices import (
    configure_environment,
    cpu_snapshot,
    environment,
    framework_device,
    others_share,
    peak_key,
    resolve_device,
    set_tf32,
)
from bench.gate import GateCache, gate_text
from bench.goals import SETTLE_S
from bench.rows import ROWS, Row
from bench.workloads import grid as make_grid

__all__ = ["GRID_TIMING", "main", "make_session", "pytest_args", "run_gates", "select_rows"]

REPO = Path(__file__).resolve().parent.parent
REPORT_WIDTH = 170
BENCH_FILE = Path(__file__).resolve().parent / "bench_attention.py"

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
}  # fmt: skip


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


def make_session(
    device: str,
    grid_name: str,
    *,
    rows: str = "",
    skip_gate: bool = False,
    progress: object = None,
    tf32: str = "default",
):
    """Resolve the device, build the grid and the plan (a ``BenchSession``)."""
    from bench.session import BenchSession  # the pytest plugin: imported only to run

    resolved = resolve_device(device)
    timing = GRID_TIMING[grid_name] if grid_name in GRID_TIMING else {}
    return BenchSession(
        resolved,
        grid_name,
        make_grid(resolved, grid_name),
        select_rows(rows),
        gates=GateCache(skip=skip_gate),
        progress=progress,
        tf32=tf32,
        goal_rounds=timing.get("goal_rounds", 5),
        goal_sample_s=timing.get("goal_sample_s", 0.005),
        goal_max_s=timing.get("goal_max_s"),
        goal_settle_s=timing.get("goal_settle_s", 0.0),
    )


def run_gates(
    device: str,
    rows: tuple[Row, ...],
    gates: GateCache | None = None,
    *,
    on_result: Callable[[dict], None] | None = None,
    deadline: float | None = None,
) -> list[dict]:
    """Every distinct gate of ``rows`` on ``device`` (rows meant for it, whose framework runs
    there and whose code exists), each once; returns the gate dicts with the rows they cover.
    ``on_result`` sees each as it finishes; past ``deadline`` (``time.monotonic()``) the rest
    are ``not run``."""
    gates = gates or GateCache()
    covered: dict[tuple, list[str]] = {}
    for row in rows:
        fdev = framework_device(row.framework, device)
        if device not in row.devices or fdev is None:
            continue
        try:
            row.resolve()
        except Exception:  # a missing row has no gate to run
            continue
        key = (row.gate_port, row.gate_alias, peak_key(fdev), row.gate_pin)
        covered.setdefault(key, []).append(row.name)
    out = []
    for key, names in covered.items():
        if deadline is not None and time.monotonic() > deadline:
            port, op, dev, pin = key
            g = {"status": "not run", "port": port, "op": op, "device": dev, "pin": pin,
                 "n_run": 0, "n_failed": 0, "n_unsupported": 0, "seconds": 0.0,
                 "detail": "the time budget (--budget-s) was spent"}  # fmt: skip
        else:
            g = gates.check(*key).to_dict()
        out.append({**g, "rows": names})
        if on_result is not None:
            on_result(out[-1])
    return out


def pytest_args(out_dir: Path, grid_name: str, extra: list[str]) -> list[str]:
    """The pytest command line for one run."""
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
    ]  # fmt: skip


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | tpu (default auto)")
    p.add_argument("--grid", default="quick", choices=sorted(GRID_TIMING), help="default quick")
    p.add_argument("--rows", default="", help="only rows whose name contains one of these")
    p.add_argument("--tf32", default="default", choices=("default", "on", "off"))
    p.add_argument("--skip-gate", action="store_true", help="time rows without the gate")
    p.add_argument("--out", type=Path, default=None, help="run folder (default results/...)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--list", action="store_true", help="print the plan and exit")
    p.add_argument("--gates-only", action="store_true", help="run every gate, time nothing")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop starting cases after this many seconds (the rest: skipped), still report",
    )
    return p.parse_args(argv), extra


def _gates_only(args: argparse.Namespace, console: Any) -> int:
    """``--gates-only``: one line per gate as it finishes (``gates.json`` rewritten each time,
    so a killed run leaves what it had), then the table."""
    from rich.markup import escape
    from rich.table import Table

    device = resolve_device(args.device)
    out = args.out
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    done: list[dict] = []

    def on_result(g: dict) -> None:
        done.append(g)
        line = f"{gate_text(g):>12}  {g['port']} {g['op']} {g['pin'] or ''} ({g['seconds']:.1f} s)"
        console.print(escape(line))
        if out is not None:
            (out / "gates.json").write_text(json.dumps(done, indent=1))

    deadline = time.monotonic() + args.budget_s if args.budget_s is not None else None
    results = run_gates(device, select_rows(args.rows), on_result=on_result, deadline=deadline)
    t = Table(title=f"correctness gates on {device} (IEEE float32 matmuls)", title_justify="left")
    for col in ("port", "op", "pin", "device", "gate", "s", "rows", "detail"):
        t.add_column(col)
    for g in results:
        style = {"passed": "green", "unsupported": "dim"}.get(g["status"], "red")
        cell = gate_text(g)
        t.add_row(
            escape(g["port"]), g["op"], g["pin"] or "", g["device"],
            f"[{style}]{escape(cell)}[/]", f"{g['seconds']:.1f}",
            escape(", ".join(g["rows"])), escape(g["detail"][:200]),
        )  # fmt: skip
    console.print(t)
    if out is not None:
        console.print(f"gates: {out / 'gates.json'}")
    return 1 if any(g["status"] in ("failed", "error", "not run") for g in results) else 0


def main(argv: list[str] | None = None) -> int:
    args, extra = _parse(sys.argv[1:] if argv is None else argv)
    configure_environment()  # before JAX starts: XLA's memory settings; out of xdist
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    # a terminal gets its own width; a log or pipe gets one wide enough for the table
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else REPORT_WIDTH)
    t0, cpu0 = time.perf_counter(), cpu_snapshot()
    try:
        set_tf32(args.tf32)
        if args.gates_only:
            return _gates_only(args, console)
        session = make_session(
            args.device, args.grid, rows=args.rows, skip_gate=args.skip_gate, tf32=args.tf32
        )
    except (RuntimeError, ValueError) as e:  # no such device here, no such grid
        console.print(f"[red]{escape(str(e))}[/red]")
        return 2
    if args.list:
        for c in session.cases + session.goal_cases:
            note = f"{c.skip[0]}: {c.skip[1]}" if c.skip else ""
            console.print(escape(c.id), f"[dim]{escape(note)}[/dim]")
        return 0
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = args.out or REPO / "results" / f"bench-{stamp}-{session.device}-{args.grid}"
    out_dir.mkdir(parents=True, exist_ok=True)
    n_run = sum(c.skip is None for c in session.cases)
    n_goals = sum(c.skip is None for c in session.goal_cases)
    console.print(
        f"[bold]Rosetta Attention bench[/bold]: device {session.device}, grid {args.grid}, "
        f"{len(session.cases)} cases ({n_run} to run), {n_goals} goals timed interleaved, "
        f"results in {out_dir}"
    )

    import pytest

    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        redirect_stdout=False,
        redirect_stderr=False,
        transient=False,
    )
    if console.is_terminal:
        session.progress = progress
    else:  # a log or a pipe: one line per case instead of a live display
        session.echo = lambda line: console.print(escape(line), highlight=False)
        progress = contextlib.nullcontext()
    if args.budget_s is not None:  # a few seconds stay for the report and the plots
        session.deadline = time.monotonic() + max(args.budget_s - (time.perf_counter() - t0) - 5, 0)
    log_path = out_dir / "pytest.log"
    with open(log_path, "w") as log, progress:
        # pytest's own terminal output (and pytest-benchmark's table) goes to pytest.log
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            code = pytest.main(pytest_args(out_dir, args.grid, extra), plugins=[session])
    session.record_unrun()

    from bench.report import build_results, render

    results = build_results(
        device=session.device,
        grid=args.grid,
        environment=environment(session.device),
        records=[r.to_dict() for r in session.ordered_records()],
        gates=session.gate_results(),
        wall_s=time.perf_counter() - t0,
        rows=session.rows,
        pytest_options={
            **GRID_TIMING[args.grid],
            "pytest_exit_code": int(code),
            "extra": extra,
            "tf32": args.tf32,
        },
        contention=others_share(cpu0, cpu_snapshot()),
    )
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    record_console = Console(record=True, width=REPORT_WIDTH, file=io.StringIO())
    render(results, record_console)
    (out_dir / "report.txt").write_text(record_console.export_text())
    render(results, console)
    if not args.no_plots:
        try:
            from bench.plots import plot_results

            for path in plot_results(results, out_dir):
                console.print(f"plot: {path}")
        except ImportError as e:  # a machine without matplotlib still gets the report
            console.print(f"[yellow]no plots: {escape(str(e))}[/yellow]")
    wall = time.perf_counter() - t0
    console.print(f"results: {out_dir / 'results.json'}  (wall time {wall:.0f} s)")
    bad: dict[str, list[dict]] = {}
    for r in results["records"]:
        if r["status"] == "failed" or (r["status"] == "error" and r["row_kind"] == "impl"):
            bad.setdefault(r["row"], []).append(r)
    for row, rs in bad.items():
        line = f"{rs[0]['status']}: {row} ({len(rs)} cases): {rs[0]['reason']}"
        console.print(f"[red]{escape(line)}[/red]")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
