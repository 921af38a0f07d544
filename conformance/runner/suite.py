"""The suite: which runs a port gets (:func:`plan_runs`), one run checked (:func:`check`), all
of them (:func:`run_suite`, in this process or in child processes), and the benchmark
harness's :func:`quick_check`."""

from __future__ import annotations

import fnmatch
import math
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from conformance.fixtures import Case, Manifest, load_manifest
from conformance.runner.arguments import _module_class
from conformance.runner.comparison import _compare
from conformance.runner.failures import _Failed, _first_line, _NoDevices, _where_raised
from conformance.runner.functions import FUNCTIONS
from conformance.runner.isolation import _run_isolated
from conformance.runner.outcomes import Outcome, Report, Run
from conformance.runner.port import Port, load_port
from conformance.runner.release import RELEASE_EVERY, release_compiled_programs
from conformance.runner.xfails import Xfails

#: The shard counts the sharded aliases run with, unless told (``--shards``).
DEFAULT_SHARDS: tuple[int, ...] = (2, 4)


def runs_for(
    manifest: Manifest | None = None,
    functions: Iterable[str] | None = None,
    shards: Iterable[int] = DEFAULT_SHARDS,
) -> list[Run]:
    """Every run of the manifest (default: the committed fixtures) for the given aliases; a
    sharded alias's value case once per shard count of ``shards`` that fits it."""
    manifest = manifest or load_manifest()
    wanted = list(FUNCTIONS) if functions is None else list(functions)
    runs = []
    for f in wanted:
        fits = FUNCTIONS[f].fits
        for c in manifest.cases:
            if f not in c.functions:
                continue
            if fits is None or c.kind == "error":  # an error case gives its own n_shards
                runs.append(Run(c, f))
            else:
                runs += [Run(c, f, n) for n in shards if fits(c, n)]
    return runs


def _check(port: Port, run: Run, device: str) -> tuple[str, float | None, float | None]:
    """Run one case; returns (message, error, bound) on success, raises _Failed otherwise."""
    case, spec = run.case, FUNCTIONS[run.function]
    if run.shards is not None:
        spec = replace(spec, defaults={**spec.defaults, **spec.shard_keywords(run.shards)})
    fn = port.function(run.function)
    if fn is None:
        raise _Failed(f"not implemented: port has no `{spec.attribute}`")
    if spec.methods is not None:
        _module_class(port, case, spec)  # "not implemented" before anything runs

    if case.kind == "error":
        want = case.entry["expected_error"]
        expected = f"{want['class']}[{want['code']}]"
        try:
            spec.error(port, fn, case, device, spec)
        except _Failed:  # the runner's own checks, or an adapter: not the port's answer
            raise
        except Exception as exc:  # the port's error, whatever it is, is the thing under test
            names = [c.__name__ for c in type(exc).__mro__]
            code = getattr(exc, "code", None)
            if want["class"] in names and code == want["code"]:
                return f"raised {expected}", None, None
            raise _Failed(
                f"raised {type(exc).__name__}[{code}] {_first_line(exc, 160)!r}"
                f"{_where_raised(exc)}, expected {expected}"
            ) from None
        raise _Failed(f"no error raised, expected {expected}")

    port.check_round_trip(case.dtype, device)
    tolerance = case.tolerance  # an fp8 case's kernel bound, for a port that declares it
    if port.kernel_tolerance:
        tolerance |= case.kernel_tolerance
    errors: dict[str, float] = {}  # the largest error of each golden, over every comparison
    worst = (-1.0, 0.0, 0.0)  # (error / bound, error, bound) of the closest call
    for c in spec.values(port, fn, case, device, spec):
        bound = tolerance.get(c.name, 0.0)  # no bound: exact (causal_mask, quantize)
        try:
            err = _compare(c.got, c.want, c.dtype or case.result_dtype, bound, c.name)
        except _Failed as failed:
            raise _Failed(c.where + str(failed), failed.error, failed.bound) from None
        errors[c.name] = max(errors.get(c.name, 0.0), err)
        worst = max(worst, (err / bound if bound else 0.0, err, bound))
    _, err, bound = worst
    if not tolerance:
        return "exact", err, bound
    if run.function == "decode":
        chunks = case.entry["decode"]["chunks"]
        what = " and ".join(errors)
        return (
            f"{len(chunks)} steps {chunks}: {what} max error {err:.3g} <= bound {bound:.3g}",
            err,
            bound,
        )
    text = "; ".join(
        f"{n} max error {e:.3g} <= bound {tolerance[n]:.3g}" for n, e in errors.items()
    )
    return text, err, bound


def check(port: Port, run: Run, device: str = "cpu") -> Outcome:
    """Run one case against a port, apply its xfails, return the outcome."""
    listed = port.xfails.lookup(run.id, device)
    reason = "" if listed is None else listed.reason or "listed in xfails"
    base = dict(run_id=run.id, family=run.family, dtype=run.case.dtype, device=device)
    if listed is not None and listed.skip:
        return Outcome(**base, status="skip", message=f"skipped: {reason}", xfail_reason=reason)
    begin_run = getattr(port.module, "begin_run", None)  # an --exec port sends the run id
    if callable(begin_run):
        begin_run(run.id)
    try:
        message, error, bound = _check(port, run, device)
    except _NoDevices as skipped:
        return Outcome(**base, status="skip", message=str(skipped), xfail_reason=reason)
    except _Failed as failed:
        return Outcome(
            **base,
            status="xfail" if listed else "fail",
            message=str(failed),
            error=failed.error,
            bound=failed.bound,
            xfail_reason=reason,
        )
    except Exception as exc:  # a bug in the port that escaped its own call
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return Outcome(
            **base,
            status="xfail" if listed else "fail",
            message=f"raised outside the port's call: {detail}{_where_raised(exc)}",
            xfail_reason=reason,
        )
    status = "xpass" if listed else "pass"
    return Outcome(
        **base, status=status, message=message, error=error, bound=bound, xfail_reason=reason
    )


def select_functions(port: Port, functions: Iterable[str] | None) -> list[str]:
    """The aliases to run: as asked, or every required one plus the optional ones present."""
    if functions is not None:
        return list(functions)
    return [a for a, f in FUNCTIONS.items() if f.required or port.function(a) is not None]


def _matcher(pattern: str | None) -> Callable[[Run], bool] | None:
    """``-k``: a glob over run ids; a plain word matches anywhere in the id."""
    if not pattern:
        return None
    glob = pattern if any(ch in pattern for ch in "*?[") else f"*{pattern}*"
    return lambda run: fnmatch.fnmatchcase(run.id, glob)


def plan_runs(
    port: Port,
    *,
    functions: Iterable[str] | None = None,
    fixtures: str | Path | None = None,
    select: Callable[[Run], bool] | None = None,
    pattern: str | None = None,
    shards: Iterable[int] = DEFAULT_SHARDS,
    part: tuple[int, int] | None = None,
) -> list[Run]:
    """The runs :func:`run_suite` makes, in order (``--list`` prints their ids). ``part=(k,
    n)`` keeps every n-th of them from the k-th on (1 <= k <= n): the n parts of a plan are
    disjoint, make the whole plan together, and each holds a share of every family, so n
    processes given one part each finish at about the same time."""
    runs = runs_for(load_manifest(fixtures), select_functions(port, functions), shards)
    for keep in (select, _matcher(pattern)):
        if keep is not None:
            runs = [r for r in runs if keep(r)]
    if part is not None:
        k, n = check_part(part)
        runs = runs[k - 1 :: n]
    return runs


def check_part(part: tuple[int, int]) -> tuple[int, int]:
    """``part`` as ``(k, n)`` when ``1 <= k <= n``; ValueError otherwise."""
    k, n = part
    if not 1 <= k <= n:
        raise ValueError(f"part {k}/{n}: want 1 <= k <= n")
    return k, n


def run_suite(
    port: str | ModuleType | Any,
    *,
    device: str = "cpu",
    functions: Iterable[str] | None = None,
    xfails: str | Path | Xfails | None = None,
    fixtures: str | Path | None = None,
    select: Callable[[Run], bool] | None = None,
    pattern: str | None = None,
    isolate: bool = False,
    on_outcome: Callable[[Report, Outcome], None] | None = None,
    shards: Iterable[int] = DEFAULT_SHARDS,
    only: Iterable[str] | None = None,
    part: tuple[int, int] | None = None,
) -> Report:
    """Run every fixture against ``port`` on ``device`` and return the report.

    ``functions`` restricts (or, for optional ones such as ``flash``, demands) the aliases;
    ``select`` (a predicate) and ``pattern`` (a glob over run ids) filter the runs, ``part``
    keeps one of n interleaved parts of them (:func:`plan_runs`); ``shards``
    are the shard counts of the sharded aliases; ``only`` (run ids) keeps just those runs, in
    the plan's order (the pytest plugin's selected items). A port that cannot be imported gives
    a report with ``error``. ``on_outcome(report, outcome)`` is called after every run, with the
    report so far (the CLI prints and saves it as it goes).

    ``isolate=True`` runs the port in child processes (``port`` must then be an importable
    name, and ``select`` is not available: use ``pattern``): a run that kills its process is
    reported as ``crash`` and the rest go on in a new child, which JAX finds with as many host
    devices as the largest shard count (:func:`_child_env`).
    """
    shards = tuple(shards)
    start = time.perf_counter()
    if isolate:
        if not isinstance(port, str) or select is not None:
            raise ValueError("isolate=True needs an importable port name and no select=")
        extra = xfails if isinstance(xfails, Xfails) else Xfails()
        if xfails is not None and not isinstance(xfails, Xfails):
            extra = Xfails.from_file(xfails)
        return _run_isolated(
            port, device, functions, extra, fixtures, pattern, on_outcome, start, shards, only,
            part,
        )
    try:
        loaded = port if isinstance(port, Port) else load_port(port, xfails=xfails)
    except Exception as exc:
        name = port if isinstance(port, str) else getattr(port, "__name__", repr(port))
        return Report(str(name), device, [], error=f"{type(exc).__name__}: {exc}")
    runs = plan_runs(
        loaded, functions=functions, fixtures=fixtures, select=select, pattern=pattern,
        shards=shards, part=part,
    )
    if only is not None:
        wanted = set(only)
        runs = [r for r in runs if r.id in wanted]
    host_port = loaded.numpy_native and device != "cpu"
    report = Report(loaded.name, device, [], host_port=host_port, complete=False,
                    planned=len(runs))
    for made, run in enumerate(runs, 1):
        report.outcomes.append(check(loaded, run, device))
        if made % RELEASE_EVERY == 0:
            release_compiled_programs()
        report.seconds = time.perf_counter() - start
        if on_outcome is not None:
            on_outcome(report, report.outcomes[-1])
    report.complete = True
    report.seconds = time.perf_counter() - start
    return report


@dataclass
class QuickCheckResult:
    """``ok``: no unexpected failure; ``n_run``: runs made; ``failures``: one line each."""

    ok: bool
    n_run: int
    failures: list[str]
    port: str = ""
    device: str = "cpu"


def quick_check(
    port: str | ModuleType | Any,
    *,
    device: str = "cpu",
    op: str = "sdpa",
    n_cases: int = 8,
) -> QuickCheckResult:
    """Run the ``n_cases`` smallest value fixtures (by element count) of ``op`` on ``device``.

    ``op`` is a function alias (``sdpa``, ``weights``, ``flash``, ``causal_mask``). Cases
    with an empty result (L = 0) are skipped: they prove nothing about the arithmetic. The
    built-in ports' xfails are honoured; an XPASS is not counted as a failure here.
    """
    try:
        loaded = load_port(port)
    except Exception as exc:
        return QuickCheckResult(False, 0, [f"could not load port {port!r}: {exc}"], str(port))
    manifest = load_manifest()
    candidates = [
        Run(c, op)
        for c in manifest.cases
        if c.kind == "values" and op in c.functions and _result_size(c, op) > 0
    ]
    candidates.sort(key=lambda r: (r.case.n_elements, r.id))
    outcomes = [check(loaded, r, device) for r in candidates[:n_cases]]
    failures = [o.line() for o in outcomes if o.status in ("fail", "crash")]
    return QuickCheckResult(not failures, len(outcomes), failures, loaded.name, device)


def _result_size(case: Case, op: str) -> int:
    shapes = case.entry["shapes"]
    name = {"weights": "weights", "causal_mask": "mask", "grad": "dq", "flash_grad": "dq"}.get(
        op, "output"
    )
    return math.prod(shapes[name])
