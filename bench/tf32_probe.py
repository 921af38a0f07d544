"""The TF32 probe: what precision float32 matmuls and attention actually run at on a device.

``python -m bench.tf32_probe --device cuda [--out tf32.json]``

On NVIDIA GPUs since Ampere a float32 matmul may run in TF32 (a 10-bit mantissa); whether it
does depends on the framework, its version and global settings. Reading settings is not proof,
so the probe measures: each probe computes a float32 result from standard-normal inputs and
compares it with the float64 result of the same inputs. The relative error (max |error| / max
|exact|) of IEEE float32 is ~1e-6 at these sizes, TF32's ~1e-3; above :data:`TF32_ABOVE` the
probe reads ``tf32``, else ``ieee``.

Probed, each in torch and JAX where it exists:

- a matmul and the framework's fused attention (``F.scaled_dot_product_attention``,
  ``jax.nn.dot_product_attention``) with the framework's defaults;
- the same with TF32 allowed (``--tf32 on``: ``set_float32_matmul_precision("high")``,
  ``jax_default_matmul_precision="tensorfloat32"``);
- the same with TF32 allowed but inside the correctness gate's scope (``bench.gate.gate_scope``),
  which must read ``ieee``;
- the conformance ports ``torch_fused`` and ``jax_fused`` with TF32 allowed, which must read
  ``ieee`` (they pin IEEE float32 themselves).

On a CPU everything reads ``ieee`` (there is no TF32 there); on a GPU the first rows show what
the frameworks do by default (JAX: ``tf32``), the others prove the gates do not see it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["TF32_ABOVE", "main", "must_be_ieee", "probe", "reads_as", "relative_error"]

#: A relative error above this reads as TF32 (IEEE float32: ~1e-6; TF32: ~1e-3).
TF32_ABOVE = 1e-4


def relative_error(got: np.ndarray, exact: np.ndarray) -> float:
    """max |got - exact| / max |exact| (inf when not finite)."""
    got = np.asarray(got, dtype=np.float64)
    err = float(np.max(np.abs(got - exact))) / max(float(np.max(np.abs(exact))), 1e-300)
    return err if math.isfinite(err) else math.inf


def must_be_ieee(entry: dict[str, Any]) -> bool:
    """The probes that must read ``ieee`` on any device: inside the gate, and the ports."""
    return "gate" in entry["setting"] or entry["what"].startswith("port")


def reads_as(err: float) -> str:
    """``tf32`` or ``ieee`` for a probe's relative error."""
    return "tf32" if err > TF32_ABOVE else "ieee"


def _sdpa64(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """float64 attention of (B, H, L, D) inputs, default scale."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v


@contextmanager
def _tf32_allowed() -> Iterator[None]:
    """``--tf32 on`` for the block, every setting put back after."""
    from conformance.ports.precision import set_float32_matmul

    saved: dict[str, Any] = {}
    try:
        import torch

        saved["torch"] = torch.get_float32_matmul_precision()
    except Exception:
        pass
    try:
        import jax

        saved["jax"] = jax.config.jax_default_matmul_precision
    except Exception:
        pass
    set_float32_matmul("on")
    try:
        yield
    finally:
        if "torch" in saved:
            import torch

            torch.set_float32_matmul_precision(saved["torch"])
        if "jax" in saved:
            import jax

            jax.config.update("jax_default_matmul_precision", saved["jax"])


def _settings() -> list[tuple[str, Callable[[], Any]]]:
    from bench.gate import gate_scope

    @contextmanager
    def allowed_in_gate() -> Iterator[None]:
        with _tf32_allowed(), gate_scope():
            yield

    @contextmanager
    def default() -> Iterator[None]:
        yield

    return [("default", default), ("tf32 on", _tf32_allowed), ("tf32 on, gate", allowed_in_gate)]


def probe(
    device: str = "cpu", *, n: int = 512, length: int = 256, seed: int = 0
) -> list[dict[str, Any]]:
    """Every probe (module docstring) on ``device`` (``cpu`` or ``cuda``): a list of
    ``{framework, what, setting, rel_error, reads_as}``; a probe that cannot run has ``error``.
    Matmuls are ``(n, n) @ (n, n)``; attention is B=1, H=4, L=S=``length``, D=64."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((n, n)), rng.standard_normal((n, n))
    q, k, v = (rng.standard_normal((1, 4, length, 64)) for _ in range(3))
    mm64, att64 = a @ b, _sdpa64(q, k, v)
    out: list[dict[str, Any]] = []

    def record(framework: str, what: str, setting: str, run: Callable[[], Any], exact) -> None:
        entry = {"framework": framework, "what": what, "setting": setting}
        try:
            err = relative_error(run(), exact)
            entry.update(rel_error=err, reads_as=reads_as(err))
        except Exception as e:  # a framework or kernel that cannot run here: recorded
            entry["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        out.append(entry)

    _torch_probes(device, (a, b, q, k, v), (mm64, att64), record)
    _jax_probes(device, (a, b, q, k, v), (mm64, att64), record)
    return out


def _torch_probes(device: str, inputs: tuple, exact: tuple, record: Callable) -> None:
    try:
        import torch
        import torch.nn.functional as F
    except Exception:  # no torch here: nothing to probe
        return
    mm64, att64 = exact
    dev = "cuda" if device == "cuda" else "cpu"

    def t(x):
        return torch.from_numpy(x.astype(np.float32)).to(dev)

    ta, tb, tq, tk, tv = map(t, inputs)

    def host(x):
        return x.detach().cpu().double().numpy()

    def sdpa():
        return host(F.scaled_dot_product_attention(tq, tk, tv))

    for setting, scope in _settings():
        with scope():
            record("torch", "matmul", setting, lambda: host(ta @ tb), mm64)
            record("torch", "F.sdpa", setting, sdpa, att64)
    from conformance.ports import torch_fused

    with _tf32_allowed():
        fn = torch_fused.scaled_dot_product_attention
        record("torch", "port torch_fused", "tf32 on", lambda: host(fn(tq, tk, tv)), att64)


def _jax_probes(device: str, inputs: tuple, exact: tuple, record: Callable) -> None:
    try:
        import jax
    except Exception:  # no JAX here: nothing to probe
        return
    a, b, q, k, v = inputs
    mm64, att64 = exact
    platform = "gpu" if device == "cuda" else device
    target = jax.devices(platform)[0]

    def j(x):
        return jax.device_put(x.astype(np.float32), target)

    ja, jb = j(a), j(b)
    jq, jk, jv = (j(np.swapaxes(x, 1, 2)) for x in (q, k, v))  # heads second

    def host(x, heads_second=False):
        x = np.asarray(x, dtype=np.float64)
        return np.swapaxes(x, 1, 2) if heads_second else x

    for setting, scope in _settings():
        with scope():  # a fresh jit per setting: the precision is read while tracing
            mm = jax.jit(lambda x, y: x @ y)
            record("jax", "matmul", setting, lambda mm=mm: host(mm(ja, jb)), mm64)
            dpa = jax.jit(lambda x, y, z: jax.nn.dot_product_attention(x, y, z))
            record("jax", "jax.nn.dpa", setting, lambda f=dpa: host(f(jq, jk, jv), True), att64)
    from conformance.ports import jax_fused

    with _tf32_allowed():
        fn = jax.jit(jax_fused.scaled_dot_product_attention)
        hq, hk, hv = (j(x) for x in (q, k, v))
        record("jax", "port jax_fused", "tf32 on", lambda: host(fn(hq, hk, hv)), att64)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.tf32_probe", description=__doc__.split("\n")[0]
    )
    p.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    p.add_argument("--out", type=Path, help="write the probes as JSON")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    results = probe(args.device)
    for r in results:
        got = r.get("reads_as") or r.get("error")
        err = f"{r['rel_error']:.1e}" if "rel_error" in r else ""
        print(f"{r['framework']:6} {r['what']:18} {r['setting']:14} {err:>8}  {got}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"device": args.device, "probes": results}, indent=1))
    # the gate and the ports must never see TF32
    leaks = [r for r in results if must_be_ieee(r) and r.get("reads_as") != "ieee"]
    return 1 if leaks else 0


if __name__ == "__main__":
    raise SystemExit(main())
