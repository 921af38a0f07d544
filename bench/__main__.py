"""``python -m bench``: gate, time and report every row on the best device found.

    python -m bench --device auto|cpu|cuda|tpu --grid quick|full [--rows SUBSTR,...]
                    [--tf32 default|on|off] [--skip-gate] [--out DIR] [-- PYTEST_ARGS...]

Runs ``bench/bench_attention.py`` under pytest with pytest-benchmark (its calibration,
statistics and JSON), shows live progress, prints the table, and writes
``results/bench-<timestamp>-<device>-<grid>/`` with ``results.json`` (records, environment,
gates, goals), ``pytest-benchmark.json`` (every round), ``report.txt``, ``pytest.log`` and the
PNG plots. Exit status: 0, or 1 when a row failed its correctness gate or one of the project's
rows raised.
"""

from __future__ import annotations

import os

# Before JAX is imported anywhere: do not let JAX take 75% of a GPU that torch shares.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# The benchmark is its own pytest session. Started from inside a pytest-xdist worker (the
# project's end-to-end test is), it inherits PYTEST_XDIST_WORKER, and pytest-benchmark then
# silently disables timing: every row would come back "ok" with no statistics.
os.environ.pop("PYTEST_XDIST_WORKER", None)
os.environ.pop("PYTEST_XDIST_WORKER_COUNT", None)

import argparse
import contextlib
import datetime as dt
import io
import json
import sys
import time
from pathlib import Path

from bench.devices import cpu_snapshot, environment, others_share, resolve_device, set_tf32
from bench.gate import GateCache
from bench.rows import ROWS, Row
from bench.session import BenchSession
from bench.workloads import grid as make_grid

__all__ = ["GRID_TIMING", "main", "make_session", "pytest_args", "select_rows"]

REPO = Path(__file__).resolve().parent.parent
REPORT_WIDTH = 170
BENCH_FILE = Path(__file__).resolve().parent / "bench_attention.py"

#: pytest-benchmark settings per grid: the time budget per case and the minimum rounds.
GRID_TIMING = {
    "quick": {"max_time": 0.25, "min_rounds": 3},
    "full": {"max_time": 1.0, "min_rounds": 5},
    "smoke": {"max_time": 0.01, "min_rounds": 2},
}


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
) -> BenchSession:
    """Resolve the device, build the grid and the plan."""
    resolved = resolve_device(device)
    return BenchSession(
        resolved,
        grid_name,
        make_grid(resolved, grid_name),
        select_rows(rows),
        gates=GateCache(skip=skip_gate),
        progress=progress,
    )


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
    return p.parse_args(argv), extra


def main(argv: list[str] | None = None) -> int:
    args, extra = _parse(sys.argv[1:] if argv is None else argv)
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
        session = make_session(args.device, args.grid, rows=args.rows, skip_gate=args.skip_gate)
    except (RuntimeError, ValueError) as e:  # no such device here, no such grid
        console.print(f"[red]{escape(str(e))}[/red]")
        return 2
    if args.list:
        for c in session.cases:
            note = f"{c.skip[0]}: {c.skip[1]}" if c.skip else ""
            console.print(escape(c.id), f"[dim]{escape(note)}[/dim]")
        return 0
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = args.out or REPO / "results" / f"bench-{stamp}-{session.device}-{args.grid}"
    out_dir.mkdir(parents=True, exist_ok=True)
    n_run = sum(c.skip is None for c in session.cases)
    console.print(
        f"[bold]Rosetta Attention bench[/bold]: device {session.device}, grid {args.grid}, "
        f"{len(session.cases)} cases ({n_run} to run), results in {out_dir}"
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
        pytest_options={**GRID_TIMING[args.grid], "pytest_exit_code": int(code), "extra": extra},
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
