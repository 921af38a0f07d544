"""The conformance suite as pytest items, one per run id: ``pytest --pyargs conformance --port M``.

For a Python porter whose CI already speaks pytest (array-api-tests' convention): each run of
``python -m conformance`` becomes one pytest item named by its run id, so ``-k``, ``-x``,
``--junitxml`` and the porter's own reporting come for free. It is the same runner underneath,
not a second one: the runs are :func:`conformance.runner.plan_runs`'s, an item's verdict is
its :class:`~conformance.runner.Outcome` from :func:`conformance.runner.run_suite` (comparison,
xfails, child processes and the crash retry included), and a failing item's message is the
runner's failure line (max error, bound, where).

Options (``pytest --help``, group "conformance"), mirroring the CLI's:

==============================  =========================================================
``--port MODULE``               an importable port (``--impl``), e.g. ``impl_numpy`` or
                                ``package.module:object``
``--port-exec "CMD ARGS"``      a port in any language over the line protocol (``--exec``)
``--port-xfails FILE``          known failures, on top of the port's own ``<module>.xfails``
                                (repeatable): a listed run is ``xfail(strict=True)`` (a pass
                                is XPASS, a failure), a ``skip:`` line a skipped item
``--port-function ALIAS``       only these function aliases (repeatable; ``--function``)
``--port-device DEVICE``        cpu | cuda | tpu (``--device``; default cpu)
``--port-shards N``             shard counts of the sharded aliases (``--shards``)
``--port-fixtures DIR``         another fixture folder (``--fixtures``)
``--port-exec-timeout SECONDS`` per run, for ``--port-exec`` (``--exec-timeout``)
``--port-in-process``           run the port in pytest's process, item by item (for a
                                debugger; a crash then ends the session)
==============================  =========================================================

By default the selected items' runs are made, in order, by one ``run_suite(..., isolate=True)``
started when the first item runs: the port runs in child processes, so a case that kills its
process is that item's ``crash`` and the rest go on; each item waits for its own outcome, so
results show as they come and ``-x`` stops the runner at the next outcome.

Installed with the package (the ``pytest11`` entry point ``conformance.pytest_plugin``), or
loaded with ``-p conformance.pytest_plugin``. Without ``--port`` or ``--port-exec`` it adds
nothing but its options and collects nothing, and it imports nothing (no NumPy, no runner)
until then; it never imports torch or JAX itself (a port that does, does).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from conformance.runner import Outcome, Port, Run

#: This file: the one path under the package that the suite's items are collected from.
_HERE = Path(__file__).resolve()
_PACKAGE = _HERE.parent
#: The suite's node id, wherever the package is installed: items are ``conformance::<run id>``
#: (JUnit XML: classname ``conformance``, name the run id).
_NODEID = "conformance"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "Rosetta Attention conformance suite (PORTING.md)")
    group.addoption("--port", metavar="MODULE", help="importable port module to check")
    group.addoption(
        "--port-exec", metavar="CMD", help="a port in any language, over the --exec protocol"
    )
    group.addoption(
        "--port-xfails", action="append", default=[], metavar="FILE",
        help="known failures (globs over run ids), on top of the port's own <module>.xfails",
    )
    group.addoption(
        "--port-function", action="append", metavar="ALIAS",
        help="run only these function aliases (repeatable; default: all required + present)",
    )
    group.addoption("--port-device", default="cpu", help="cpu | cuda | tpu (default cpu)")
    group.addoption(
        "--port-shards", action="append", type=int, metavar="N",
        help="shard counts of the sharded functions (repeatable)",
    )
    group.addoption("--port-fixtures", metavar="DIR", help="fixture folder (default: v1)")
    group.addoption(
        "--port-exec-timeout", type=float, metavar="SECONDS",
        help="seconds a --port-exec port may take per run",
    )
    group.addoption(
        "--port-in-process", action="store_true",
        help="run the port in pytest's own process (a crash then ends the session)",
    )


def _port_name(config: pytest.Config) -> str | None:
    """The runner's name of the port under test (``exec:CMD`` for ``--port-exec``), or None."""
    module, command = config.getoption("port"), config.getoption("port_exec")
    if module and command:
        raise pytest.UsageError("give --port MODULE or --port-exec CMD, not both")
    if command:
        from conformance.runner.exec_port import EXEC_PREFIX

        return EXEC_PREFIX + command
    return module or None


_SUITE = pytest.StashKey["_Suite"]()


def pytest_configure(config: pytest.Config) -> None:
    name = _port_name(config)
    if name is not None:
        config.stash[_SUITE] = _Suite(config, name)


def pytest_unconfigure(config: pytest.Config) -> None:
    suite = config.stash.get(_SUITE, None)
    if suite is not None:
        suite.close()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With a port: nothing else under the package is collected (its own tests, in a clone)."""
    if _SUITE not in config.stash:
        return None
    path = collection_path.resolve()
    if path != _PACKAGE and path != _HERE and _PACKAGE in path.parents:
        return True
    return None


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    """This file, met walking the package (``--pyargs conformance``), holds the suite."""
    if _SUITE in parent.config.stash and not parent.session.isinitpath(file_path):
        if file_path.resolve() == _HERE:
            return SuiteFile.from_parent(parent, path=file_path, nodeid=_NODEID)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> Any:
    """This file named on the command line (``--pyargs conformance.pytest_plugin``)."""
    if _SUITE in parent.config.stash and module_path.resolve() == _HERE:
        return SuiteFile.from_parent(parent, path=module_path, nodeid=_NODEID)
    return None


def pytest_sessionfinish(session: pytest.Session) -> None:
    suite = session.config.stash.get(_SUITE, None)
    if suite is not None:
        suite.close()


class RunFailed(Exception):
    """A run's unexpected result: its message is the runner's line for the run."""


class _Stopped(Exception):
    """Raised into the runner's loop to end it early (the session is over)."""


class _Suite:
    """The port under test: its plan, and the outcomes of the selected runs as they come."""

    def __init__(self, config: pytest.Config, name: str) -> None:
        self.config, self.name = config, name
        self.device: str = config.getoption("port_device")
        self.functions: list[str] | None = config.getoption("port_function")
        self.fixtures: str | None = config.getoption("port_fixtures")
        self.in_process: bool = config.getoption("port_in_process")
        self.port: Port | None = None
        self.runs: dict[str, Run] = {}
        self._timeout_before: str | None = os.environ.get("ROSETTA_EXEC_TIMEOUT")
        self._timeout_set = config.getoption("port_exec_timeout") is not None
        if self._timeout_set:  # read by each --exec port, in the runner's children too
            os.environ["ROSETTA_EXEC_TIMEOUT"] = str(config.getoption("port_exec_timeout"))
        self._cond = threading.Condition()
        self._outcomes: dict[str, Outcome] = {}
        self._thread: threading.Thread | None = None
        self._finished = False
        self._stop = False
        self._error = ""

    def plan(self) -> list[Run]:
        """Load the port here (as ``--list`` does) and plan its runs; an ``--exec`` port's
        process is stopped again unless the runs are made in this process."""
        from conformance.runner import DEFAULT_SHARDS, FUNCTIONS, Xfails, load_port, plan_runs

        unknown = sorted(set(self.functions or ()) - set(FUNCTIONS))
        if unknown:
            raise pytest.UsageError(
                f"--port-function {unknown[0]!r}: not an alias (one of {', '.join(FUNCTIONS)})"
            )
        self.xfails = Xfails()
        for path in self.config.getoption("port_xfails"):
            self.xfails = self.xfails + Xfails.from_file(path)
        self.shards = tuple(self.config.getoption("port_shards") or DEFAULT_SHARDS)
        self.port = load_port(self.name, xfails=self.xfails)
        runs = plan_runs(
            self.port, functions=self.functions, fixtures=self.fixtures, shards=self.shards
        )
        self.runs = {r.id: r for r in runs}
        close = getattr(self.port.module, "close", None)
        if not self.in_process and callable(close):
            close()
        return runs

    def outcome(self, item: RunItem) -> Outcome | None:
        """The outcome of ``item``'s run: made here (``--port-in-process``), or by the runner
        started on the session's selected items at the first call, waited for."""
        if self.in_process:
            from conformance.runner import check

            return check(self.port, self.runs[item.run_id], self.device)
        with self._cond:
            if self._thread is None:
                selected = [i.run_id for i in item.session.items if isinstance(i, RunItem)]
                self._thread = threading.Thread(
                    target=self._work, args=(selected,), name="conformance-runner", daemon=True
                )
                self._thread.start()
            self._cond.wait_for(lambda: item.run_id in self._outcomes or self._finished)
            return self._outcomes.get(item.run_id)

    @property
    def error(self) -> str:
        return self._error

    def _work(self, selected: list[str]) -> None:
        from conformance.runner import run_suite

        error = ""
        try:
            report = run_suite(
                self.name, device=self.device, functions=self.functions, xfails=self.xfails,
                fixtures=self.fixtures, isolate=True, on_outcome=self._got, shards=self.shards,
                only=selected,
            )
            error = report.error
        except _Stopped:
            pass
        except BaseException as exc:  # the runner itself failed: every waiting item says so
            error = f"{type(exc).__name__}: {exc}"
        with self._cond:
            self._finished, self._error = True, error
            self._cond.notify_all()

    def _got(self, report: Any, outcome: Outcome) -> None:
        with self._cond:
            if self._stop:
                raise _Stopped
            self._outcomes[outcome.run_id] = outcome
            self._cond.notify_all()

    def close(self) -> None:
        """End the runner (at its next outcome) and the in-process port; restore the timeout."""
        with self._cond:
            self._stop = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        close = getattr(getattr(self.port, "module", None), "close", None)
        if callable(close):
            close()
        if self._timeout_set:
            if self._timeout_before is None:
                os.environ.pop("ROSETTA_EXEC_TIMEOUT", None)
            else:
                os.environ["ROSETTA_EXEC_TIMEOUT"] = self._timeout_before
            self._timeout_set = False


class SuiteFile(pytest.File):
    """The suite for the port of ``--port``/``--port-exec``: one :class:`RunItem` per run id,
    with its xfails as markers (a listed run: ``xfail(strict=True)``; ``skip:``: ``skip``)."""

    def collect(self) -> Iterator[RunItem]:
        suite = self.config.stash[_SUITE]
        try:
            runs = suite.plan()
        except pytest.UsageError:
            raise
        except Exception as exc:
            raise self.CollectError(
                f"could not load the port {suite.name}: {type(exc).__name__}: {exc}"
            ) from exc
        for run in runs:
            item = RunItem.from_parent(self, name=run.id, run_id=run.id)
            entry = suite.port.xfails.lookup(run.id, suite.device)
            if entry is not None:
                reason = entry.reason or "listed in xfails"
                if entry.skip:
                    item.add_marker(pytest.mark.skip(reason=reason))
                else:
                    item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
            yield item


class RunItem(pytest.Item):
    """One run of the suite (``sdpa.gqa.h6_k2.float32``); its verdict is the runner's."""

    def __init__(self, *, run_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id = run_id

    def runtest(self) -> None:
        suite = self.config.stash[_SUITE]
        outcome = suite.outcome(self)
        if outcome is None:
            raise RunFailed(f"{self.run_id}: no outcome from the runner: {suite.error or '?'}")
        self.user_properties.append(("conformance", outcome.line()))
        listed = self.get_closest_marker("xfail") is not None
        if outcome.status == "skip":
            pytest.skip(outcome.message)
        if outcome.status in ("pass", "retried"):
            return
        if outcome.status == "xpass":
            if listed:
                return  # xfail(strict=True): pytest reports XPASS(strict), a failure
            raise RunFailed(outcome.line())
        if outcome.status == "xfail" and not listed:  # listed only for this device, say
            pytest.xfail(outcome.line())
        raise RunFailed(outcome.line())  # fail, crash; or xfail, under its xfail marker

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None):
        if isinstance(excinfo.value, RunFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"conformance run {self.run_id}"
