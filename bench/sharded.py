"""The sharded rows: ring, Ulysses and USP attention on :data:`~bench.workloads.SHARDS` devices.

JAX runs them on 4 simulated CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=4``,
which must be set before JAX starts), torch on 4 gloo processes. Neither fits in the harness's
own process (its JAX has one device), so a sharded row's timed call drives a child:

- JAX: one child process with 4 host devices, the row's function jitted there;
- torch: one child that is rank 0 of a gloo group and starts ranks 1-3; for each call rank 0
  broadcasts "go" to the others, every rank calls the function on the same whole inputs (each
  takes its shard, every rank gets the whole output), and a barrier ends the call.

The harness times ``call()``, which sends one line to the child and waits for its answer: the
time of one sharded call plus a pipe round trip (tens of microseconds; a call at L = S = 1024 is
tens of milliseconds). The children's memory is not measured. Next to the time the report puts
the bytes one device sends per call by the formulas of docs/SHARDED.md (:func:`sent_bytes`),
which the prepared call carries into its record.

``python -m bench.sharded jax|torch METHOD WORKLOAD_JSON`` is the child (the protocol: it
prints ``bench-sharded ready <compile seconds>``, then answers each ``call`` line on stdin with
``bench-sharded done``, and ends at ``stop`` or at the end of its input). The rows' gate runs
there too (``METHOD`` ``gate``: :func:`run_fixtures`), since their fixtures need the 4 devices.
"""

from __future__ import annotations

import importlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.frameworks import Prepared
from bench.workloads import SHARDS, Workload

__all__ = ["METHODS", "MODULES", "USP_SIZES", "keywords", "prepare_sharded", "sent_bytes"]

REPO = Path(__file__).resolve().parent.parent
#: USP's mesh on the 4 devices: Ulysses groups of 2, 2 of them in the ring (the conformance
#: runner's ``usp`` alias uses the same split).
USP_SIZES = {"ulysses_shards": 2, "ring_shards": SHARDS // 2}
#: The sharded functions the rows time, by the conformance alias each is gated on.
METHODS = {"ring": "ring_attention", "ulysses": "ulysses_attention", "usp": "usp_attention"}
#: The module of each framework that holds it: the ring in ``sharded``, the all-to-alls in
#: ``ulysses`` (``impl_jax.ulysses.usp_attention``).
MODULES = {"ring": "sharded", "ulysses": "ulysses", "usp": "ulysses"}
_TAG = "bench-sharded"


def keywords(method: str, w: Workload) -> dict[str, Any]:
    """The keywords of ``method`` on ``w``: its devices (``n_shards``, USP's two sizes), the ring
    layout (``zigzag`` for a causal workload, which balances the causal work, else
    ``contiguous``), ``is_causal``."""
    layout = {"layout": "zigzag" if w.is_causal else "contiguous"}
    devices = {"ring": {"n_shards": SHARDS, **layout}, "ulysses": {"n_shards": SHARDS},
               "usp": {**USP_SIZES, **layout}}[method]
    return {**devices, "is_causal": w.is_causal}


def sent_bytes(method: str, w: Workload) -> int:
    """Bytes one device sends in one call of ``method`` on ``w`` (docs/SHARDED.md,
    "Communication"): the ring's n - 1 key/value shards, Ulysses' four all-to-alls, USP's four
    inside its group plus its ring across the groups."""
    from attention_spec.sharded import (
        ring_bytes_per_step,
        ulysses_bytes_per_exchange,
        usp_bytes_per_device,
    )
    from bench.workloads import DTYPE_BYTES

    n = DTYPE_BYTES[w.dtype]
    q, k, v = (w.B, w.H, w.L, w.D), (w.B, w.K, w.S, w.D), (w.B, w.K, w.S, w.E)
    o = (w.B, w.H, w.L, w.E)
    if method == "ring":
        return sum(ring_bytes_per_step(k, v, SHARDS, n))
    if method == "ulysses":
        return sum(ulysses_bytes_per_exchange(q, k, v, o, SHARDS, n).values())
    if method == "usp":
        return sum(usp_bytes_per_device(q, k, v, o, *USP_SIZES.values(), n).values())
    raise ValueError(f"no sharded method {method!r}; {sorted(METHODS)}")


# ------------------------------------------------------------------------------ the parent side


class _Child:
    """A running child (:func:`worker_main`): ``call()`` runs one sharded call there; ``spec``
    is the workload's dict, or the gate's (:func:`run_fixtures`)."""

    def __init__(self, framework: str, method: str, spec: dict[str, Any]) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get(
            "PYTHONPATH", "")]), "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
                         f"--xla_force_host_platform_device_count={SHARDS}".strip()}
        self._log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.sharded", framework, method, json.dumps(spec)],
            cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, text=True, bufsize=1,
        )
        self.compile_s = None if method == "gate" else float(self._answer("ready"))

    def _answer(self, word: str) -> str:
        """The rest of the child's next ``bench-sharded <word> ...`` line (other output is
        skipped); RuntimeError with the child's stderr when it ended instead."""
        for line in self.proc.stdout:
            if line.startswith(f"{_TAG} {word}"):
                return line[len(_TAG) + len(word) + 2 :].strip() or "0"
        self.proc.wait()
        self._log.seek(0)
        raise RuntimeError(f"the sharded child ended (exit {self.proc.returncode}): "
                           f"{self._log.read()[-2000:]}")

    def call(self) -> None:
        self.proc.stdin.write("call\n")
        self._answer("done")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __del__(self) -> None:  # the session drops a case's Prepared after timing it
        self.close()


def prepare_sharded(row: Any, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The ``sharded`` call style: ``row.gate_op`` (ring, ulysses or usp) of ``row.framework``
    on ``w`` in a child (module docstring); ``compile_s``: the child's setup and first call
    (JAX: the compile); ``derived``: the bytes one device sends per call (:func:`sent_bytes`)."""
    child = _Child(row.framework, row.gate_op, w.to_dict())
    return Prepared(
        call=child.call,
        memory=lambda: (None, f"not measured ({SHARDS} child devices)"),
        compile_s=child.compile_s,
        layout="sharded",
        derived={"sent_bytes": sent_bytes(row.gate_op, w)},
    )


def run_fixtures(port: str, op: str, run_ids: list[str]) -> tuple[int, list[str]]:
    """The gate of a sharded row (bench/gate.py): conformance's runs ``run_ids`` of alias
    ``op`` against ``port`` (``impl_jax``, ``impl_torch``) in the rows' child, on its 4 devices;
    returns (runs made, one line per failure). Runs skipped there are not counted."""
    framework = port.removeprefix("impl_")
    child = _Child(framework, "gate", {"port": port, "op": op, "only": run_ids})
    try:
        result = json.loads(child._answer("gate"))
    finally:
        child.close()
    return result["n_run"], result["failures"]


# ------------------------------------------------------------------------------- the child side


def _inputs(w: Workload) -> list:
    """Standard-normal query (B,H,L,D), key (B,K,S,D), value (B,K,S,E), as NumPy (seed 0): the
    same on every rank."""
    import numpy as np

    rng = np.random.default_rng(0)
    shapes = [(w.B, w.H, w.L, w.D), (w.B, w.K, w.S, w.D), (w.B, w.K, w.S, w.E)]
    return [rng.standard_normal(s, dtype=np.float32).astype(w.dtype) for s in shapes]


def _serve(run: Any, after: Any = None, signal: Any = None) -> None:
    """One warm-up call, ``ready``, then one call per ``call`` line; ``after()`` ends each call
    (torch: the barrier), ``signal(flag)`` tells the other ranks to call (True) or stop."""

    def once() -> None:
        run()
        if after is not None:
            after()

    t0 = time.perf_counter()
    once()
    print(f"{_TAG} ready {time.perf_counter() - t0:.6f}", flush=True)
    for line in sys.stdin:
        if line.strip() != "call":
            break
        if signal is not None:
            signal(True)
        once()
        print(f"{_TAG} done", flush=True)
    if signal is not None:
        signal(False)


def _gate(spec: dict[str, Any]) -> Any:
    """The fixtures of :func:`run_fixtures`, run here (every torch rank runs them, in the same
    order: the collectives meet); prints the result line."""

    def run() -> None:
        from conformance import run_suite

        report = run_suite(spec["port"], functions=[spec["op"]], shards=(SHARDS,),
                           only=spec["only"])
        outcomes = [o for o in report.outcomes if o.status != "skip"]
        failures = [o.line() for o in outcomes if not o.ok or o.status == "xpass"]
        failures += [f"crash {spec['port']}: {report.error}"] if report.error else []
        result = {"n_run": len(outcomes), "failures": failures}
        print(f"{_TAG} gate {json.dumps(result)}", flush=True)

    return run


def _function(package: str, method: str) -> Any:
    """The function ``method`` times in ``package`` (``impl_jax`` or ``impl_torch``)."""
    return getattr(importlib.import_module(f"{package}.{MODULES[method]}"), METHODS[method])


def _jax_main(method: str, spec: dict[str, Any]) -> None:
    import functools

    import jax
    import jax.numpy as jnp

    if method == "gate":  # float64 is one of the fixtures' dtypes; IEEE float32 matmuls
        jax.config.update("jax_enable_x64", True)
        jax.config.update("jax_default_matmul_precision", "highest")
        return _gate(spec)()
    w = Workload.from_dict(spec)
    fn = jax.jit(functools.partial(_function("impl_jax", method), **keywords(method, w)))
    q, k, v = (jnp.asarray(x) for x in _inputs(w))
    _serve(lambda: fn(q, k, v).block_until_ready())


def _torch_rank(method: str, spec: dict[str, Any], rank: int, port: int) -> None:
    """One rank of the gloo group; rank 0 talks to the parent and starts the others."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // SHARDS))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=SHARDS)
    if method == "gate":
        torch.backends.cuda.matmul.allow_tf32 = False
        _gate(spec)()  # ranks 1-3 print to nothing
        dist.destroy_process_group()
        return
    w = Workload.from_dict(spec)
    fn = _function("impl_torch", method)
    q, k, v = (torch.from_numpy(x) for x in _inputs(w))
    kw = keywords(method, w)
    go = torch.zeros(1, dtype=torch.int32)

    def run() -> None:
        fn(q, k, v, **kw)

    def signal(flag: bool = True) -> bool:  # rank 0's flag: call (1) or stop (0)
        go.fill_(int(flag))
        dist.broadcast(go, 0)
        return bool(go.item())

    if rank == 0:
        _serve(run, dist.barrier, signal)
    else:
        run()
        dist.barrier()
        while signal():
            run()
            dist.barrier()
    dist.destroy_process_group()


def _torch_main(method: str, spec: str) -> None:
    with socket.socket() as s:  # a free port for the group's store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    others = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.sharded", "torch", method, spec, str(rank), str(port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        for rank in range(1, SHARDS)
    ]
    try:
        _torch_rank(method, json.loads(spec), 0, port)
    finally:
        for p in others:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def worker_main(argv: list[str]) -> None:
    """``jax|torch METHOD WORKLOAD_JSON [RANK PORT]`` (module docstring)."""
    framework, method, spec, *rank = argv
    if framework == "jax":
        _jax_main(method, json.loads(spec))
    elif rank:
        _torch_rank(method, json.loads(spec), int(rank[0]), int(rank[1]))
    else:
        _torch_main(method, spec)


if __name__ == "__main__":
    worker_main(sys.argv[1:])
