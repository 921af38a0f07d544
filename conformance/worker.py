"""The child process of ``run_suite(..., isolate=True)``: one port, some runs, one line each.

Reads one job (JSON) on stdin: the port's importable name, the device, the functions, extra
xfails, the fixture folder, a ``-k`` glob, the shard counts, a ``--part`` and, after a crash,
the run ids still to do (its environment carries ``XLA_FLAGS`` for the sharded runs' devices).
Writes JSON lines to its stdout, which only the protocol uses (the port's own prints are sent
to stderr):

- ``{"plan": [run ids], "port": name, "host_port": bool, "xfails": [...]}`` first;
- ``{"start": {"run_id", "family", "dtype"}}`` before each run, ``{"outcome": {...}}`` after it;
- ``{"error": "..."}`` when the port cannot be loaded.

When the port kills the process (a signal, ``abort()``), the parent knows from the last
``start`` which run did it; ``faulthandler`` has written the Python stack to stderr.

Every :data:`RELEASE_EVERY` runs (the job's ``release_every``, if it has one; 0: never) the
worker drops the programs JAX has compiled, so that a long run of a JAX port stays within the
kernel's limit on memory mappings (docs/CONFORMANCE.md, "One child, 1,400 runs").
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict

from conformance.runner import (
    RELEASE_EVERY,
    Xfails,
    check,
    load_port,
    plan_runs,
    release_compiled_programs,
)


def run_job(job: dict, send: Callable[[dict], None]) -> None:
    """Load the job's port, plan its runs, send the plan, then make the runs, sending a
    ``start`` and an ``outcome`` for each (the protocol of the module's docstring)."""
    try:
        port = load_port(job["port"], xfails=Xfails.from_json(job["xfails"]))
    except Exception as exc:
        send({"error": f"{type(exc).__name__}: {exc}"})
        return
    runs = plan_runs(
        port, functions=job["functions"], fixtures=job["fixtures"], pattern=job["pattern"],
        shards=job["shards"], part=None if job.get("part") is None else tuple(job["part"]),
    )
    host_port = port.numpy_native and job["device"] != "cpu"
    send({"plan": [r.id for r in runs], "port": port.name, "host_port": host_port,
          "xfails": port.xfails.to_json()})
    if job.get("list"):
        return
    only = None if job["only"] is None else set(job["only"])
    every = job.get("release_every", RELEASE_EVERY)
    made = 0
    for run in runs:
        if only is not None and run.id not in only:
            continue
        send({"start": {"run_id": run.id, "family": run.family, "dtype": run.case.dtype}})
        send({"outcome": asdict(check(port, run, job["device"]))})
        made += 1
        if every and made % every == 0:
            release_compiled_programs()


def main() -> int:
    job = json.loads(sys.stdin.read())
    protocol = os.fdopen(os.dup(1), "w", buffering=1)  # line-buffered: each line as it happens
    os.dup2(2, 1)  # anything the port prints, from Python or C, goes to stderr
    faulthandler.enable()

    def send(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")

    run_job(job, send)
    return 0


if __name__ == "__main__":
    sys.exit(main())
