"""The worker's release of JAX's compiled programs (docs/CONFORMANCE.md, "One child, 1,400 runs").

XLA's CPU backend holds three memory mappings per compiled program for as long as JAX caches
it; a worker that never let go of them reached Linux's ``vm.max_map_count`` at run 1,106 of
``python -m conformance --impl impl_jax`` and died of SIGSEGV in XLA's compiler. The slow test
makes the same crash in a minute by using up the mapping table first, and shows the release
prevents it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import worker

REPO = Path(__file__).resolve().parents[2]


def _job(port: str, pattern: str, **extra) -> dict:
    job = {"port": port, "device": "cpu", "functions": None, "xfails": [], "fixtures": None,
           "pattern": pattern, "shards": [2, 4], "only": None}
    return {**job, **extra}


def test_the_worker_releases_compiled_programs_every_release_every_runs(monkeypatch) -> None:
    made: list[str] = []  # run ids with an outcome, when each release came
    releases: list[int] = []
    monkeypatch.setattr(worker, "release_compiled_programs", lambda: releases.append(len(made)))

    def send(message: dict) -> None:
        if "outcome" in message:
            made.append(message["outcome"]["run_id"])

    worker.run_job(_job("impl_numpy", "sdpa.gqa.*", release_every=4), send)
    assert len(made) == 11 and releases == [4, 8]
    made.clear()
    releases.clear()
    worker.run_job(_job("impl_numpy", "sdpa.gqa.*", release_every=0), send)
    assert len(made) == 11 and releases == []
    assert 0 < worker.RELEASE_EVERY <= 100  # the default: see its comment for the arithmetic


def test_run_suite_in_process_releases_every_release_every_runs(monkeypatch) -> None:
    """``run_suite`` without a child (``--in-process``) releases on the same schedule."""
    from conformance.runner import run_suite, suite

    releases: list[int] = []
    made: list[str] = []
    monkeypatch.setattr(suite, "RELEASE_EVERY", 4)
    monkeypatch.setattr(suite, "release_compiled_programs", lambda: releases.append(len(made)))
    report = run_suite(
        "impl_numpy", pattern="sdpa.gqa.*", on_outcome=lambda _, o: made.append(o.run_id)
    )
    assert len(report.outcomes) == 11 and report.ok
    assert releases == [3, 7]  # the release comes after the 4th and 8th run, before its report


def test_a_release_drops_the_programs_only_when_the_mappings_run_short(monkeypatch) -> None:
    """With ``RESERVE`` or more free mappings JAX keeps its programs; with fewer, or where
    ``/proc`` says nothing, they are dropped."""
    import jax
    import jax.numpy as jnp

    from conformance.runner import release

    cleared: list[int] = []
    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(1))
    jnp.tanh(jnp.ones(3)).block_until_ready()
    free = release.free_mappings()
    assert free is not None and 0 < free < 10**9  # this suite runs on Linux
    assert not release.release_compiled_programs(reserve=free // 2) and not cleared
    assert release.release_compiled_programs(reserve=free + 10**6) and cleared == [1]
    monkeypatch.setattr(release, "free_mappings", lambda: None)
    assert release.release_compiled_programs(reserve=0) and cleared == [1, 1]


#: The child of the slow test: JAX started (its threads made), then all but HEADROOM of the
#: kernel's memory mappings taken (every other page of one block made read-only: one mapping
#: per page), then the worker.
_CROWDED_WORKER = """
import ctypes, mmap, sys
import jax.numpy as jnp
jnp.tanh(jnp.ones(3)).block_until_ready()
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
limit = int(open("/proc/sys/vm/max_map_count").read())
used = sum(1 for _ in open("/proc/self/maps"))
n, page = (limit - used - int(sys.argv[1])) // 2, mmap.PAGESIZE
block = libc.mmap(None, 2 * n * page, mmap.PROT_READ | mmap.PROT_WRITE,
                  mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
for i in range(n):
    libc.mprotect(block + 2 * i * page, page, mmap.PROT_READ)
from conformance.worker import main
sys.exit(main())
"""
#: Mappings left to the worker: what 5 runs need, several times over; not what 60 runs need.
HEADROOM = 1000


def _crowded_worker(release_every: int) -> tuple[int, list[dict]]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    job = _job("impl_jax", "sdpa.*.float32", release_every=release_every)
    done = subprocess.run(
        [sys.executable, "-c", _CROWDED_WORKER, str(HEADROOM)], input=json.dumps(job),
        capture_output=True, text=True, env=env, cwd=REPO, timeout=900,
    )
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/sys/vm/max_map_count").exists(), reason="Linux only")
def test_without_the_release_xla_dies_when_the_mappings_run_out_and_with_it_every_run_passes():
    returncode, messages = _crowded_worker(release_every=0)
    outcomes = [m["outcome"] for m in messages if "outcome" in m]
    assert returncode != 0 and len(outcomes) < 117, (returncode, len(outcomes))
    assert "start" in messages[-1]  # died inside a run: the crash the parent reports

    returncode, messages = _crowded_worker(release_every=5)
    outcomes = [m["outcome"] for m in messages if "outcome" in m]
    assert returncode == 0 and len(outcomes) == 117  # with the two float32 fp8 error cases
    assert all(o["status"] in ("pass", "xfail", "skip") for o in outcomes)
