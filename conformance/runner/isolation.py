"""Running a port in child processes (:mod:`conformance.worker` is the child), so that a port
that kills its process (a signal, an abort) fails one run, not the whole suite.

The parent sends the child its job, reads one JSON line per event, and when the child dies in a
run, blames that run and starts a fresh child on the runs left, that run first: a crash that
comes again there is a ``crash``; one that does not (state the earlier runs left behind, a
flaky library) is reported as ``retried``, with the signal, counted apart and not a failure.
A run its xfails list is ``xfail`` at the first crash, and not retried.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from conformance.runner.functions import SHARDED_ALIASES
from conformance.runner.outcomes import Outcome, Report
from conformance.runner.xfails import Xfails


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def _crash_site(stderr_text: str) -> str:
    """The innermost Python frame of faulthandler's dump in the child's stderr, if any."""
    for line in stderr_text.splitlines():
        line = line.strip()
        if line.startswith("File "):
            return line
    return ""


#: The XLA flag that makes JAX's CPU backend show n devices; read once, when JAX starts.
_HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def _child_env(devices: int = 1) -> dict[str, str]:
    """The environment of a worker: this process's, with everything on ``sys.path`` that can
    be imported from, so the child finds the port exactly as the parent would; and, when the
    sharded runs need ``devices`` > 1, ``XLA_FLAGS`` asking for that many CPU devices (a JAX
    port's mesh; unless the flags already say how many: then they are the user's)."""
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), *paths])
    flags = env.get("XLA_FLAGS", "")
    if devices > 1 and _HOST_DEVICES_FLAG not in flags:
        env["XLA_FLAGS"] = f"{flags} {_HOST_DEVICES_FLAG}={devices}".strip()
    return env


def _crash_message(died: str, site: str, first: str | None = None) -> str:
    """``crashed (SIGFPE): File ...``; after a retry that crashed too, ``crashed (SIGFPE), and
    again on retry`` (with the retry's signal, when it differs)."""
    text = f"crashed ({died})"
    if first is not None:
        text = f"crashed ({first}), and again on retry" + ("" if died == first else f" ({died})")
    return text + (f": {site}" if site else "")


def _after_retry(outcome: Outcome, died: str, site: str) -> Outcome:
    """The outcome of a run that crashed once (``died``), as its retry in a fresh child gave it:
    a pass is ``retried``; anything else keeps its status, the crash said first."""
    if outcome.status == "pass":
        outcome.status = "retried"
        where = f" (the crash: {site})" if site else ""
        outcome.message = f"crashed once ({died}), passed on retry{where}"
    else:
        outcome.message = f"crashed once ({died}), then on retry: {outcome.message}"
    return outcome


def _run_isolated(
    port: str,
    device: str,
    functions: Iterable[str] | None,
    xfails: Xfails,
    fixtures: str | Path | None,
    pattern: str | None,
    on_outcome: Callable[[Report, Outcome], None] | None,
    start: float,
    shards: tuple[int, ...],
    only: Iterable[str] | None = None,
    part: tuple[int, int] | None = None,
) -> Report:
    only = None if only is None else list(only)  # the run ids to make (None: the whole plan)
    job = {
        "port": port,
        "device": device,
        "functions": None if functions is None else list(functions),
        "xfails": xfails.to_json(),
        "fixtures": None if fixtures is None else str(fixtures),
        "pattern": pattern,
        "shards": list(shards),
        "only": only,
        "part": None if part is None else list(part),
    }
    sharded = functions is None or any(f in SHARDED_ALIASES for f in functions)
    env = _child_env(max(shards, default=1) if sharded else 1)
    report = Report(port, device, [], complete=False)
    order: list[str] = []
    done: set[str] = set()
    known = Xfails()
    retrying: dict[str, tuple[dict[str, Any], str, str]] = {}  # run id: (start, signal, site)

    def add(outcome: Outcome) -> None:
        report.outcomes.append(outcome)
        done.add(outcome.run_id)
        report.seconds = time.perf_counter() - start
        if on_outcome is not None:
            on_outcome(report, outcome)

    while True:
        current, error = None, None
        with tempfile.TemporaryFile("w+") as err:
            child = subprocess.Popen(
                [sys.executable, "-m", "conformance.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                text=True,
            )
            try:
                child.stdin.write(json.dumps(job))
                child.stdin.close()
                for line in child.stdout:
                    message = json.loads(line)
                    if "error" in message:
                        error = message["error"]
                    elif "plan" in message:
                        wanted = message["plan"] if only is None else set(only)
                        order = order or [i for i in message["plan"] if i in wanted]
                        report.planned = len(order)
                        report.port, report.host_port = message["port"], message["host_port"]
                        known = Xfails.from_json(message["xfails"])
                    elif "start" in message:
                        current = message["start"]
                    elif "outcome" in message:
                        outcome = Outcome(**message["outcome"])
                        if outcome.run_id in retrying:
                            _, died, site = retrying.pop(outcome.run_id)
                            outcome = _after_retry(outcome, died, site)
                        add(outcome)
                        current = None
                returncode = child.wait()
            except BaseException:  # KeyboardInterrupt: stop the child, keep what it gave
                child.kill()
                child.wait()
                raise
            err.seek(0)
            stderr_text = err.read()
        if error is not None:
            report.error = error
            break
        if returncode == 0 and current is None:
            report.complete = True
            break
        if current is None:  # died between runs (or before the first): nothing to blame
            report.error = (
                f"the worker process died ({_signal_name(returncode)}) outside any run; "
                f"its last words: {stderr_text.strip()[-300:]!r}"
            )
            break
        run_id = current["run_id"]
        listed = known.lookup(run_id, device)
        died, site = _signal_name(returncode), _crash_site(stderr_text)
        first = retrying.pop(run_id, None)
        if listed is None and first is None:  # once more, first thing in a fresh child
            retrying[run_id] = (current, died, site)
        else:
            add(Outcome(
                **current,
                device=device,
                status="xfail" if listed is not None else "crash",
                message=_crash_message(died, site, None if first is None else first[1]),
                xfail_reason="" if listed is None else listed.reason or "listed in xfails",
            ))
        job["only"] = [run_id for run_id in order if run_id not in done]
        if not job["only"]:
            report.complete = True
            break
    for current, died, site in retrying.values():  # the fresh child never came to the retry
        add(Outcome(**current, device=device, status="crash", message=_crash_message(died, site)))
    report.seconds = time.perf_counter() - start
    return report
