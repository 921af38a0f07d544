"""IEEE float32 matmuls for the framework ports and the benchmark's correctness gate.

On NVIDIA GPUs since Ampere a float32 matmul may run in TF32 (a 10-bit mantissa): JAX's
``DEFAULT`` precision does so on GPU, and torch does once TF32 is allowed. The fixtures' float32
bounds (around 1e-6) sit far below TF32's errors (1e-4 to 1e-3), so a port checked in TF32
fails every float32 case for a reason that is not its own. These scopes pin IEEE float32 for
the block they guard, whatever the process's global setting (``--tf32 on`` included), and put
the setting back afterwards:

- :func:`torch_ieee_float32`: ``torch.set_float32_matmul_precision("highest")``. torch has two
  APIs for this, the legacy ``allow_tf32`` / ``set_float32_matmul_precision`` and the newer
  per-backend ``fp32_precision`` (torch >= 2.9); once the two disagree, the legacy getters
  raise. ``set_float32_matmul_precision`` updates both, so it never creates that state;
  on exit the saved values are put back through the same two APIs.
- :func:`jax_highest`: ``jax.default_matmul_precision("highest")``; under ``jax.jit`` it must
  be in force while the function is traced, which it is when entered inside the function.
- :func:`ieee_float32`: both, for the frameworks that are installed.

:func:`torch_float32_state` reads torch's settings defensively (a getter that raises is
recorded as its error), so recording the state can never crash a run.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

__all__ = [
    "ieee_float32",
    "jax_highest",
    "set_float32_matmul",
    "torch_float32_state",
    "torch_ieee_float32",
]

#: torch's per-backend precision settings (torch >= 2.9) that set_float32_matmul_precision moves.
_TORCH_NEW_API = (("cuda", "matmul"), ("mkldnn", "matmul"))


def _installed(name: str) -> bool:
    """Whether ``name`` imports (a broken install counts as absent)."""
    try:
        importlib.import_module(name)
    except Exception:
        return False
    return True


def _backend(torch: Any, where: str, op: str) -> Any:
    return getattr(getattr(torch.backends, where, None), op, None)


def _read(getter: Any) -> Any:
    """The getter's value, or ``"error: ..."`` when it raises (mixed legacy/new TF32 APIs)."""
    try:
        return getter()
    except Exception as e:  # any getter failure is a recorded state, never a crash
        return f"error: {str(e).splitlines()[0][:160]}"


def torch_float32_state(torch: Any) -> dict[str, Any]:
    """torch's float32 matmul/cuDNN precision settings, each read defensively."""
    state: dict[str, Any] = {
        "torch.get_float32_matmul_precision": _read(torch.get_float32_matmul_precision),
        "torch.backends.cuda.matmul.allow_tf32": _read(
            lambda: torch.backends.cuda.matmul.allow_tf32
        ),
        "torch.backends.cudnn.allow_tf32": _read(lambda: torch.backends.cudnn.allow_tf32),
    }
    for where, op in (*_TORCH_NEW_API, ("cudnn", "conv")):
        backend = _backend(torch, where, op)
        if backend is not None and hasattr(backend, "fp32_precision"):
            state[f"torch.backends.{where}.{op}.fp32_precision"] = _read(
                lambda b=backend: b.fp32_precision
            )
    return state


@contextlib.contextmanager
def torch_ieee_float32() -> Iterator[None]:
    """torch's float32 matmuls in IEEE float32 (TF32 off) inside the block; restored after."""
    import torch

    legacy = _read(torch.get_float32_matmul_precision)
    new = {}
    for where, op in _TORCH_NEW_API:
        backend = _backend(torch, where, op)
        if backend is not None and hasattr(backend, "fp32_precision"):
            new[(where, op)] = _read(lambda b=backend: b.fp32_precision)
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        if not str(legacy).startswith("error"):
            torch.set_float32_matmul_precision(legacy)
        for (where, op), value in new.items():  # exactly as found, even a mixed state
            backend = _backend(torch, where, op)
            if not str(value).startswith("error") and backend.fp32_precision != value:
                backend.fp32_precision = value


@contextlib.contextmanager
def jax_highest() -> Iterator[None]:
    """JAX's default matmul precision HIGHEST inside the block (enter it where JAX traces)."""
    import jax

    with jax.default_matmul_precision("highest"):
        yield


@contextlib.contextmanager
def ieee_float32() -> Iterator[None]:
    """:func:`torch_ieee_float32` and :func:`jax_highest` for whichever is installed."""
    with contextlib.ExitStack() as stack:
        if _installed("torch"):
            stack.enter_context(torch_ieee_float32())
        if _installed("jax"):
            stack.enter_context(jax_highest())
        yield


def set_float32_matmul(mode: str) -> None:
    """Set the process's float32 matmul precision in torch and JAX alike: ``on`` allows TF32,
    ``off`` pins IEEE float32, ``default`` leaves each framework's own default."""
    if mode == "default":
        return
    if mode not in ("on", "off"):
        raise ValueError(f"--tf32 must be default, on or off; got {mode!r}")
    if _installed("torch"):
        import torch

        torch.set_float32_matmul_precision("high" if mode == "on" else "highest")
    if _installed("jax"):
        import jax

        precision = "tensorfloat32" if mode == "on" else "highest"
        jax.config.update("jax_default_matmul_precision", precision)
