"""Run the sharded functions of JAX or torch on several devices and hand back what they gave.

``python -m tests.sharded_worker jax OUT`` runs :func:`tests.sharded_runs.jax_runs` on 8
simulated CPU devices through the conformance runner's own ``check`` (``jax_grads`` instead of
``jax``: the gradient checks, :data:`~tests.sharded_runs.JAX_GRAD_RUNS`). It must be started
with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` in its environment, which JAX reads
once, when it starts (tests/test_sharded.py does this). Meshes of 2, 3, 4 and 8 of them run the
runs of that many shards. Each ring program is also lowered and compiled again (from JAX's
compilation cache: the same program) to read the bytes its collective-permutes move and XLA's
memory analysis of it.

``python -m tests.sharded_worker torch OUT`` forks 2, then 4, processes, joined in a gloo
process group through a file in OUT, as ``torchrun`` would start them; each rank runs the
runner's checks of :func:`tests.sharded_runs.torch_runs` (the torch adapter calls the sharded
function directly inside a process group) and, for the ring runs of the ``ring.*`` fixtures, the
function once more with ``stats=[]``. The processes are forked from a parent that has imported
torch but run nothing, so they start in milliseconds instead of importing torch again each.

Nothing is judged here beyond the runner's verdicts: outcomes, the bytes the ring sent and the
compiler's memory figures go to ``OUT/<name>.json`` (and gradients to ``.npz``), and the tests
read them. A run that raises outside the runner's check is recorded with its error, not fatal.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from tests.sharded_runs import (
    JAX_GRAD_RUNS,
    MEMORY_PROBE,
    TORCH_WORLDS,
    call,
    jax_runs,
    run_inputs,
    runs_by_id,
    torch_runs,
)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:400]


def _save(out: Path, name: str, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    np.savez(out / f"{name}.npz", **arrays)
    (out / f"{name}.json").write_text(json.dumps(meta, indent=1, sort_keys=True))


# ---------------------------------------------------------------------------------------------
# JAX
# ---------------------------------------------------------------------------------------------

#: ``f32[2,4,16,5]{3,2,1,0}``: a shape in compiled HLO text.
_HLO_SHAPE = re.compile(r"\b(pred|s32|u32|s64|f16|bf16|f32|f64)\[([0-9,]*)\]")
#: ``tensor<1x2x16x5xbf16>``: a shape in StableHLO text.
_MLIR_SHAPE = re.compile(r"tensor<([0-9x]*)x(i1|i32|i64|f16|bf16|f32|f64)>")
_BYTES = {"pred": 1, "i1": 1, "s32": 4, "i32": 4, "u32": 4, "s64": 8, "i64": 8, "f16": 2,
          "bf16": 2, "f32": 4, "f64": 8}


def _nbytes(dtype: str, dims: str, sep: str) -> int:
    return _BYTES[dtype] * int(np.prod([int(d) for d in dims.split(sep) if d]))


def compiled_permutes(hlo: str) -> list[int]:
    """The bytes each collective-permute of a compiled HLO module moves (its result's size):
    what the backend sends."""
    sizes = []
    for line in hlo.splitlines():
        if "collective-permute(" not in line and "collective-permute-start(" not in line:
            continue
        result = line.split("=", 1)[1].split("collective-permute", 1)[0]
        nbytes = sum(_nbytes(t, d, ",") for t, d in _HLO_SHAPE.findall(result))
        if "collective-permute-start(" in line:  # (operand, result[, contexts]): count the result
            nbytes //= 2
        sizes.append(nbytes)
    return sizes


def lowered_permutes(stablehlo: str) -> list[int]:
    """The bytes of each ``stablehlo.collective_permute`` JAX emits: what the program asks to
    send, before the backend's own passes."""
    sizes = []
    for line in stablehlo.splitlines():
        if "stablehlo.collective_permute" in line:
            result = line.rsplit("->", 1)[1]
            sizes += [_nbytes(t, d, "x") for d, t in _MLIR_SHAPE.findall(result)]
    return sizes


def _jax_measure(run, sharded, jax) -> dict[str, Any]:
    """A ring run's program, lowered and compiled again (a cache hit: the runner's check
    compiled it): the bytes of its collective-permutes and XLA's memory analysis of it."""
    arrays, keywords = run_inputs(run)
    given = {n: a for n, a in arrays.items() if n in ("query", "key", "value", "mask", "bias")}
    layout = "zigzag" if run.function == "ring_zigzag" else "contiguous"
    kw = dict(keywords, n_shards=run.shards, layout=layout)
    ring = jax.jit(sharded.ring_attention, static_argnames=[s for s in sharded.STATIC_ARGNAMES
                                                            if s in kw])
    lowered = ring.lower(**given, **kw)
    compiled = lowered.compile()
    memory = compiled.memory_analysis()
    return {
        "permute_bytes_lowered": lowered_permutes(lowered.as_text()),
        "permute_bytes_compiled": compiled_permutes(compiled.as_text()),
        "memory": {
            "argument": memory.argument_size_in_bytes,
            "output": memory.output_size_in_bytes,
            "temp": memory.temp_size_in_bytes,
        },
    }


def grad_output(shape: tuple[int, ...]) -> np.ndarray:
    """The cotangent of a gradient run's output (float64; cast to the run's dtype)."""
    return np.random.default_rng(0).standard_normal(shape)


def _jax_gradients(run, wrt, sharded, impl_jax, jax, jnp) -> dict[str, np.ndarray]:
    """Gradients of ``sum(output * cotangent)`` through the ring and through the unsharded
    implementation, with respect to ``wrt``."""
    arrays, keywords = run_inputs(run)
    given = {n: jnp.asarray(a) for n, a in arrays.items()
             if n in ("query", "key", "value", "mask", "bias")}
    out = impl_jax.scaled_dot_product_attention(**given, **keywords)
    cotangent = jnp.asarray(grad_output(out.shape), out.dtype)  # in the run's dtype
    layout = "zigzag" if run.function == "ring_zigzag" else "contiguous"

    def ring_loss(diff):
        out = sharded.ring_attention(
            **(given | diff), n_shards=run.shards, layout=layout, **keywords
        )
        return jnp.sum(out * cotangent)

    def sdpa_loss(diff):
        return jnp.sum(impl_jax.scaled_dot_product_attention(**(given | diff), **keywords) * (
            cotangent))

    diff = {n: given[n] for n in wrt}
    got, want = jax.jit(jax.grad(ring_loss))(diff), jax.jit(jax.grad(sdpa_loss))(diff)
    out = {}
    for name in wrt:
        out[f"grad.ring.{name}.{run.id}"] = np.asarray(got[name])
        out[f"grad.sdpa.{name}.{run.id}"] = np.asarray(want[name])
    return out


def jax_main(out: Path, *, gradients: bool) -> None:
    """The runner's checks and measurements (``jax.json``), or the gradients
    (``jax_grads.npz``)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import impl_jax
    from conformance.runner import check, load_port
    from impl_jax import sharded

    assert len(jax.devices()) >= 8, "start with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    arrays_out: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"devices": len(jax.devices()), "runs": {}}
    port = load_port("impl_jax")
    if gradients:
        todo = [(runs_by_id()[run_id], wrt) for run_id, wrt in JAX_GRAD_RUNS]
    else:
        todo = [(run, ()) for run in jax_runs()]
    for run, wrt in todo:
        record: dict[str, Any] = {}
        start = time.process_time()
        try:
            if gradients:
                arrays_out |= _jax_gradients(run, wrt, sharded, impl_jax, jax, jnp)
            else:
                record["outcome"] = asdict(check(port, run))
                if run.function.startswith("ring"):
                    record |= _jax_measure(run, sharded, jax)
        except Exception as exc:
            record["error"] = _error(exc)
            traceback.print_exc()
        record["cpu_seconds"] = round(time.process_time() - start, 2)
        meta["runs"][run.id] = record
    if not gradients:
        meta["memory_probe"] = _jax_memory_probe(sharded, jax, jnp)
    _save(out, "jax_grads" if gradients else "jax", arrays_out, meta)


def _jax_memory_probe(sharded, jax, jnp) -> dict[str, Any]:
    """XLA's per-device memory of the compiled ring (contiguous, causal, float32) at a size
    where the formula's terms are large: :data:`tests.sharded_runs.MEMORY_PROBE`."""
    p = MEMORY_PROBE
    q = jax.ShapeDtypeStruct((p["B"], p["H"], p["L"], p["D"]), jnp.float32)
    k = jax.ShapeDtypeStruct((p["B"], p["K"], p["L"], p["D"]), jnp.float32)
    v = jax.ShapeDtypeStruct((p["B"], p["K"], p["L"], p["E"]), jnp.float32)
    ring = jax.jit(sharded.ring_attention, static_argnames=sharded.STATIC_ARGNAMES)
    probe = {}
    for n in p["shards"]:
        memory = ring.lower(q, k, v, n_shards=n, is_causal=True).compile().memory_analysis()
        probe[str(n)] = {
            "argument": memory.argument_size_in_bytes,
            "output": memory.output_size_in_bytes,
            "temp": memory.temp_size_in_bytes,
        }
    return probe


# ---------------------------------------------------------------------------------------------
# torch
# ---------------------------------------------------------------------------------------------


def _torch_rank(rank: int, world: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    from conformance.runner import check, load_port
    from impl_torch import sharded
    from impl_torch.modules import tensor_from_numpy

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{out / f'rendezvous_{world}'}", rank=rank,
        world_size=world, timeout=timedelta(seconds=120),
    )
    port = load_port("impl_torch")
    meta: dict[str, Any] = {"runs": {}}
    for run in torch_runs(world):
        record: dict[str, Any] = {}
        try:
            record["outcome"] = asdict(check(port, run))
            if run.function.startswith("ring") and run.case.op == "ring" and run.shards:
                arrays, keywords = run_inputs(run)
                given = {n: tensor_from_numpy(a) for n, a in arrays.items()
                         if n in ("query", "key", "value", "mask", "bias")}
                stats: list = []
                call(sharded, run, given, keywords, stats=stats)
                record["bytes_sent"] = [s.bytes_sent for s in stats]
                record["blocks"] = [[list(b) for b in s.blocks] for s in stats]
        except Exception as exc:
            record["error"] = _error(exc)
            traceback.print_exc()
        meta["runs"][run.id] = record
    _save(out, f"torch_w{world}_r{rank}", {}, meta)
    dist.destroy_process_group()


def torch_main(out: Path) -> None:
    import torch.multiprocessing as mp

    for world in TORCH_WORLDS:
        mp.start_processes(_torch_rank, args=(world, out), nprocs=world, start_method="fork")


def main(argv: list[str]) -> int:
    which, out = argv[0], Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if which in ("jax", "jax_grads"):
        jax_main(out, gradients=which == "jax_grads")
    elif which == "torch":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch_main(out)
    else:
        raise SystemExit(
            f"usage: python -m tests.sharded_worker jax|jax_grads|torch OUT; {which!r}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
