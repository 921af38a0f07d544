"""``python -m conformance --impl MODULE [--impl ...]``: run the golden fixtures against ports.

Each port runs in a child process, so a port that crashes (a signal, an abort) in one case is
reported as ``crash`` for that case and the others still run; the case is retried once, first in
the new child, and one that passes there is reported as ``retried``. Failures are printed as
they happen; at the end, a compact table per port and family (runs passed, worst error as a
fraction of its bound). ``--report FILE`` is rewritten after every run, so an interrupted run
leaves what it had. Exits non-zero when any port has an unexpected failure, a crash, an XPASS,
or cannot be imported (a retried run does not). ``--list`` prints the run ids that would run,
and runs nothing. ``--exec "CMD ARGS"`` checks a port in any language, an executable driven over
the line protocol of conformance/PORTING.md ("Any language: --exec").
"""

from __future__ import annotations

import argparse
import os
import sys

from conformance.runner import (
    DEFAULT_SHARDS,
    FUNCTIONS,
    Outcome,
    Report,
    Xfails,
    check_part,
    load_port,
    plan_runs,
    run_suite,
    write_report,
)
from conformance.runner.exec_port import DEFAULT_TIMEOUT, EXEC_PREFIX


def _xfails_for(impl: str, items: list[str]) -> Xfails:
    """The ``--xfails [MODULE=]FILE`` that apply to ``impl``."""
    extra = Xfails()
    for item in items:
        target, sep, path = item.rpartition("=")
        if not sep or target == impl:
            extra = extra + Xfails.from_file(path)
    return extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance", description=__doc__)
    parser.add_argument(
        "--impl",
        action="append",
        default=[],
        metavar="MODULE",
        help="importable port module (repeatable), e.g. impl_numpy, torch_fused",
    )
    parser.add_argument(
        "--exec",
        action="append",
        default=[],
        dest="commands",
        metavar="CMD",
        help="a port in any language: an executable driven over the line protocol of "
        "conformance/PORTING.md (repeatable), e.g. --exec 'node conformance/ports/js/port.js'",
    )
    parser.add_argument(
        "--exec-timeout",
        type=float,
        metavar="SECONDS",
        help=f"seconds an --exec port may take per run (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument("--device", default="cpu", help="cpu | cuda | tpu (default cpu)")
    parser.add_argument("--report", metavar="FILE", help="write every outcome as JSON")
    parser.add_argument(
        "--xfails",
        action="append",
        default=[],
        metavar="[MODULE=]FILE",
        help="known failures (globs over run ids); MODULE= limits it to one port",
    )
    parser.add_argument(
        "--function",
        action="append",
        choices=sorted(FUNCTIONS),
        help="run only these functions (default: all required + those present)",
    )
    parser.add_argument("-k", dest="pattern", help="only runs whose id matches this glob")
    parser.add_argument(
        "--part",
        type=_part,
        metavar="K/N",
        help="only the K-th of N interleaved parts of the runs (every N-th, from the K-th): N "
        "processes given 1/N .. N/N make every run once, each with a share of every family",
    )
    parser.add_argument(
        "--shards",
        action="append",
        type=int,
        metavar="N",
        help="shard counts of the sharded functions (repeatable; default: "
        f"{' and '.join(map(str, DEFAULT_SHARDS))}, wherever they divide L and S, or K)",
    )
    parser.add_argument("--fixtures", help="fixture folder (default: the committed v1)")
    parser.add_argument("--show-xfails", action="store_true", help="list xfails and skips too")
    parser.add_argument("--list", action="store_true", help="print the run ids; run nothing")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the ports in this process (a crashing port then ends the run; for debuggers)",
    )
    args = parser.parse_args(argv)
    args.shards = tuple(args.shards or DEFAULT_SHARDS)
    args.impl = args.impl + [EXEC_PREFIX + command for command in args.commands]
    if not args.impl:
        parser.error("give a port: --impl MODULE or --exec CMD")
    if args.exec_timeout is None:
        return _run(args)
    #  --exec-timeout is read by each --exec port, in the workers too: in this process's
    #  environment for this call only (a caller's next call, a test's, does not inherit it).
    before = os.environ.get("ROSETTA_EXEC_TIMEOUT")
    os.environ["ROSETTA_EXEC_TIMEOUT"] = str(args.exec_timeout)
    try:
        return _run(args)
    finally:
        if before is None:
            del os.environ["ROSETTA_EXEC_TIMEOUT"]
        else:
            os.environ["ROSETTA_EXEC_TIMEOUT"] = before


def _part(text: str) -> tuple[int, int]:
    """``--part K/N`` as ``(K, N)``, 1 <= K <= N."""
    try:
        k, n = (int(x) for x in text.split("/"))
        return check_part((k, n))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want K/N with 1 <= K <= N") from None


def _run(args: argparse.Namespace) -> int:
    """Every port of ``args`` through the suite, printed as it goes; 0 when all pass."""
    if args.list:
        return _list(args)

    reports: list[Report] = []

    def progress(report: Report, outcome: Outcome) -> None:
        if outcome.shown(args.show_xfails):
            print("  " + outcome.line(), flush=True)
        if args.report:
            write_report([*reports, report], args.report)

    for impl in args.impl:
        print(f"{impl} on {args.device}:", flush=True)
        try:
            report = run_suite(
                impl,
                device=args.device,
                functions=args.function,
                xfails=_xfails_for(impl, args.xfails),
                fixtures=args.fixtures,
                pattern=args.pattern,
                isolate=not args.in_process,
                on_outcome=progress,
                shards=args.shards,
                part=args.part,
            )
        except KeyboardInterrupt:
            print("interrupted: the report holds the runs made so far")
            return 130
        print(report.table(failures=False))
        print()
        reports.append(report)
        if args.report:
            write_report(reports, args.report)
    bad = [r.port for r in reports if not r.ok]
    print("conformance: " + (f"FAILED for {', '.join(bad)}" if bad else "all ports pass"))
    return 1 if bad else 0


def _list(args: argparse.Namespace) -> int:
    """``--list``: the run ids each port would run (its optional functions included)."""
    for impl in args.impl:
        try:
            port = load_port(impl, xfails=_xfails_for(impl, args.xfails))
        except Exception as exc:
            print(f"{impl}: could not load the port: {type(exc).__name__}: {exc}")
            return 1
        runs = plan_runs(
            port, functions=args.function, fixtures=args.fixtures, pattern=args.pattern,
            shards=args.shards, part=args.part,
        )
        for run in runs:
            entry = port.xfails.lookup(run.id, args.device)
            tag = "" if entry is None else ("  # skip" if entry.skip else "  # xfail")
            print(run.id + tag)
        print(f"# {impl}: {len(runs)} runs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
