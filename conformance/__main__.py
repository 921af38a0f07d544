"""``python -m conformance --impl MODULE [--impl ...]``: run the golden fixtures against ports.

Prints a compact table per port and family (runs passed, worst error as a fraction of its
bound) and one line per failure; exits non-zero when any port has an unexpected failure, an
XPASS, or cannot be imported.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys

from conformance.runner import FUNCTIONS, Report, Xfails, load_port, run_suite, write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance", description=__doc__)
    parser.add_argument(
        "--impl",
        action="append",
        required=True,
        metavar="MODULE",
        help="importable port module (repeatable), e.g. impl_numpy, torch_fused",
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
    parser.add_argument("--fixtures", help="fixture folder (default: the committed v1)")
    parser.add_argument("--show-xfails", action="store_true", help="list xfails too")
    args = parser.parse_args(argv)

    select = None
    if args.pattern:
        pattern = args.pattern if any(ch in args.pattern for ch in "*?[") else f"*{args.pattern}*"
        select = lambda run: fnmatch.fnmatchcase(run.id, pattern)  # noqa: E731

    reports = []
    for impl in args.impl:
        extra = Xfails()
        for item in args.xfails:
            target, sep, path = item.rpartition("=")
            if not sep or target == impl:
                extra = extra + Xfails.from_file(path)
        try:
            port = load_port(impl, xfails=extra)
        except Exception as exc:  # one broken port never stops the others
            report = Report(impl, args.device, [], error=f"{type(exc).__name__}: {exc}")
        else:
            report = run_suite(
                port,
                device=args.device,
                functions=args.function,
                fixtures=args.fixtures,
                select=select,
            )
        print(report.table(show_xfails=args.show_xfails))
        print()
        reports.append(report)
    if args.report:
        write_report(reports, args.report)
    bad = [r.port for r in reports if not r.ok]
    print("conformance: " + (f"FAILED for {', '.join(bad)}" if bad else "all ports pass"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
