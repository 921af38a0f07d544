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

:func:`main` is the pipeline, one file after the other: the machine (``devices.resolve``), the
grids of its device (``workloads.grids``), the plan (``plan.make_plan``); then ``--gates-only``
(``gate.gates_only``), ``--list``, or the run (``session.BenchSession``), the report
(``report.write_report``) and the plots (``plots.plot_results``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

from bench.devices import configure_environment, cpu_snapshot, resolve
from bench.gate import GateCache, gates_only
from bench.plan import GRID_TIMING, make_plan
from bench.report import REPORT_WIDTH, write_report
from bench.workloads import grids

__all__ = ["main"]

REPO = Path(__file__).resolve().parent.parent


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


def main(argv: list[str] | None = None) -> int:
    args, extra = _parse(sys.argv[1:] if argv is None else argv)
    configure_environment()  # before JAX starts: XLA's memory settings; out of xdist
    from rich.console import Console
    from rich.markup import escape

    # a terminal gets its own width; a log or pipe gets one wide enough for the table
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else REPORT_WIDTH)
    t0, cpu0 = time.perf_counter(), cpu_snapshot()
    try:  # the machine, the grids of its device, then the plan of this run
        machine = resolve(args.device, tf32=args.tf32)
        workloads = grids(machine.device, args.grid)
        plan = make_plan(machine, args.grid, workloads, rows=args.rows)
    except (RuntimeError, ValueError) as e:  # no such device here, no such grid
        console.print(f"[red]{escape(str(e))}[/red]")
        return 2
    if args.gates_only:
        return gates_only(machine, plan.rows, args.out, args.budget_s, console)
    if args.list:  # every case of the plan, and why it will not run where it will not
        for c in plan.all_cases:
            note = f"{c.skip[0]}: {c.skip[1]}" if c.skip else ""
            console.print(escape(c.id), f"[dim]{escape(note)}[/dim]")
        return 0
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = args.out or REPO / "results" / f"bench-{stamp}-{machine.device}-{args.grid}"
    out_dir.mkdir(parents=True, exist_ok=True)
    n_run = sum(c.skip is None for c in plan.cases)
    n_goals = sum(c.skip is None for c in plan.goal_cases)
    console.print(
        f"[bold]Rosetta Attention bench[/bold]: device {machine.device}, grid {args.grid}, "
        f"{len(plan.cases)} cases ({n_run} to run), {n_goals} goals timed interleaved, "
        f"results in {out_dir}"
    )

    from bench.session import BenchSession  # the pytest plugin: imported only to run

    session = BenchSession(plan, gates=GateCache(skip=args.skip_gate))
    if args.budget_s is not None:  # a few seconds stay for the report and the plots
        session.deadline = time.monotonic() + max(args.budget_s - (time.perf_counter() - t0) - 5, 0)
    code = session.run(out_dir, extra, console)
    options = {**GRID_TIMING[args.grid], "pytest_exit_code": code, "extra": extra}
    results = session.results(t0, cpu0, {**options, "tf32": args.tf32})
    write_report(results, out_dir, console)
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
