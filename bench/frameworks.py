"""Each framework's side of a timed call: its inputs, its timed callable and its memory probe.

A preparer (``bench/preparers.py``) says *what* a row computes, as a function of its inputs;
the row's framework (:data:`FRAMEWORKS`) says how the inputs are made, how the function is
called and timed, and how the peak memory of one call is measured:

- **NumPy** (:class:`Numpy`) runs on the host; memory: ``tracemalloc`` (NumPy reports its
  buffers to it), :func:`peak_memory_numpy`.
- **torch** (:class:`Torch`): calls run under ``torch.inference_mode()``, a training step with
  autograd on; on CUDA ``torch.cuda.synchronize()`` is inside the timed callable, so the time is
  the kernels', not the launch's. Memory: ``torch.cuda.max_memory_allocated`` after
  ``reset_peak_memory_stats`` on CUDA (:func:`peak_memory_torch_cuda`); on the CPU, which has no
  peak counter, the running sum of every allocation and free the profiler records
  (:func:`peak_memory_torch_cpu`).
- **JAX** (:class:`Jax`): every call is jitted; ``lower(...).compile()`` is timed on its own
  and reported as the compile time, and the timed callable runs the compiled executable and
  ends with ``jax.block_until_ready``, so compilation never leaks into the steady-state time.
  Memory: XLA's own buffer assignment for the compiled call, ``temp + output - alias`` bytes
  (:func:`xla_memory`), the same on every device. JAX's device counter ``peak_bytes_in_use``
  cannot be reset, so a per-call delta cannot be read from it once an earlier, larger call has
  set the high-water mark.

A call's peak memory is the extra memory it needs beyond its inputs, the output included.

Inputs are standard-normal, made by each framework on its own device from a fixed seed (so a
GPU run never builds gigabytes on the host first); they differ between frameworks, which does
not matter for timing. JAX draws them with the ``rbg`` key (XLA's RngBitGenerator), whose
programs compile in a fraction of the default threefry key's (docs/BENCH.md).
"""

from __future__ import annotations

import abc
import contextlib
import functools
import os
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.workloads import Workload

__all__ = [
    "FRAMEWORKS",
    "JAX",
    "NUMPY",
    "TORCH",
    "Framework",
    "Jax",
    "Numpy",
    "Prepared",
    "Torch",
    "module_dims",
    "peak_memory_numpy",
    "peak_memory_torch_cpu",
    "peak_memory_torch_cuda",
    "shapes",
    "xla_memory",
]

Shape = tuple[int, ...]


@dataclass
class Prepared:
    """A row ready to time on one workload.

    ``call`` runs one synchronized call; ``memory()`` measures the peak extra bytes of one call
    and returns ``(bytes or None, method)``; ``compile_s`` is JAX's lower+compile time;
    ``inputs`` and ``layout`` are what the call reads (tests check the wiring with them; a
    test may replace an entry of ``inputs``, which the call then reads); ``derived``: numbers
    of the call known without timing it, which its timed record carries (a sharded call's
    bytes sent per device, by formula).
    """

    call: Callable[[], Any]
    memory: Callable[[], tuple[int | None, str]]
    compile_s: float | None = None
    inputs: list | None = None
    layout: str = "heads_first"
    module: Any = None  # the project module a module or decode row calls (tests read it)
    derived: dict[str, Any] = field(default_factory=dict)


def shapes(w: Workload, layout: str) -> list[Shape]:
    """The input shapes of ``w`` in ``layout``: ``heads_first`` (B,H,L,D),(B,K,S,D),(B,K,S,E);
    ``heads_second`` (B,L,H,D),(B,S,K,D),(B,S,K,E); ``module`` (B,L,M); ``decode`` the new token
    (B,L,M) and the cache buffers (B,K,T,D),(B,K,T,E) of its T slots (S = P + 1, or a rolling
    cache's ring); ``decode_heads_second`` (B,L,M),(B,S,K,D),(B,S,K,E); ``train`` /
    ``train_heads_second``: heads_first / heads_second and the ``grad_output`` (B,H,L,E) /
    (B,L,H,E); ``mla_latent`` / ``mla_naive``: an MLA decode step's token and cache buffers."""
    first = [(w.B, w.H, w.L, w.D), (w.B, w.K, w.S, w.D), (w.B, w.K, w.S, w.E)]
    second = [(w.B, w.L, w.H, w.D), (w.B, w.S, w.K, w.D), (w.B, w.S, w.K, w.E)]
    token = (w.B, w.L, w.M)
    return {
        "heads_first": first,
        "heads_second": second,
        "module": [token],
        "decode": [token, (w.B, w.K, w.slots, w.D), (w.B, w.K, w.slots, w.E)],
        "decode_heads_second": [token, *second[1:]],
        "train": [*first, (w.B, w.H, w.L, w.E)],
        "train_heads_second": [*second, (w.B, w.L, w.H, w.E)],
        # an MLA decode step's caches: the latent [c_kv, rotated k_pe] (B,1,S,R+Dr) and its
        # zero-width value (B,1,S,0), or the naive one's keys (B,H,S,Dn+Dr) and values (B,H,S,E)
        "mla_latent": [token, (w.B, 1, w.S, (w.R or 0) + (w.Dr or 0)), (w.B, 1, w.S, 0)],
        "mla_naive": [token, (w.B, w.H, w.S, w.D + (w.Dr or 0)), (w.B, w.H, w.S, w.E)],
    }[layout]


def module_dims(w: Workload) -> dict[str, int]:
    """The size keywords of a project module for ``w``: ``head_dim=D``, or for an MLA decode
    or prefill workload ``kv_lora_rank=R``, ``qk_nope_head_dim=D``, ``qk_rope_head_dim=Dr``,
    ``v_head_dim=E``."""
    if w.op not in ("mla_decode", "mla_prefill"):
        return {"head_dim": w.D}
    return {"kv_lora_rank": w.R, "qk_nope_head_dim": w.D, "qk_rope_head_dim": w.Dr,
            "v_head_dim": w.E}


class Framework(abc.ABC):
    """What the preparers ask of a framework. Every ``prepare*`` takes ``fn`` and the list
    ``args`` it is called on (``fn(*args)`` in each timed call) and returns a :class:`Prepared`
    whose ``inputs`` is ``args``."""

    name: str

    @abc.abstractmethod
    def arrays(self, shapes: Sequence[Shape], dtype: str, fdevice: str, seed: int = 0) -> list:
        """Standard-normal arrays of ``dtype``, one per shape, made on ``fdevice``."""

    def inputs(self, w: Workload, fdevice: str, layout: str = "heads_first") -> list:
        """``w``'s inputs in ``layout`` (:func:`shapes`), of ``w.dtype``, seed 0."""
        return self.arrays(shapes(w, layout), w.dtype, fdevice)

    @abc.abstractmethod
    def prepare(self, fn: Callable, args: list, fdevice: str, layout: str = "heads_first"
                ) -> Prepared:
        """A forward call of ``fn`` on ``args``."""

    def prepare_train(self, fn: Callable, args: list, fdevice: str, layout: str = "train"
                      ) -> Prepared:
        """A training step (a forward and its backward): as :meth:`prepare` unless the framework
        records for autograd only when asked."""
        return self.prepare(fn, args, fdevice, layout)

    def prepare_step(
        self,
        step: Callable,
        args: list,
        fdevice: str,
        carry: Callable[[list, Any], Any],
        donate: tuple[int, ...],
        layout: str,
    ) -> Prepared:
        """A decode step ``step(*args) -> (y, *cache)`` that writes the cache it is given.

        The host frameworks write the cache's buffers in place: the timed call returns ``y`` and
        drops the rest, so ``args`` keep the cache at its position. JAX overrides this (the
        cache is donated and ``carry`` puts the returned buffers back)."""
        return self.prepare(lambda *a: step(*a)[0], args, fdevice, layout)

    @abc.abstractmethod
    def module(self, cls: type, args: list, w: Workload, fdevice: str, **options: Any) -> Any:
        """The project's module ``cls(*args, head_dim=D, dtype=..., **options)`` on ``fdevice``
        with the seeded generator its framework asks for (seed 0)."""

    def bind(self, module: Any, method: str = "__call__") -> tuple[Callable, list]:
        """``(fn, state)``: ``fn(*state, *a, **kw)`` is ``module.method(*a, **kw)``, in a form
        this framework can time (JAX: a pure function of the module's state)."""
        return getattr(module, method), []

    @abc.abstractmethod
    def matmul(self, precision: str) -> Callable[[Any, Any], Any]:
        """``a @ b`` at ``precision`` (float32: ``highest``, IEEE, or ``tf32``)."""


# ---------------------------------------------------------------------------------- NumPy


class Numpy(Framework):
    """NumPy on the host."""

    name = "numpy"

    def arrays(self, shapes: Sequence[Shape], dtype: str, fdevice: str, seed: int = 0) -> list:
        rng = np.random.default_rng(seed)
        dt = _np_dtype(dtype)
        return [rng.standard_normal(s, dtype=np.float32).astype(dt) for s in shapes]

    def prepare(self, fn: Callable, args: list, fdevice: str, layout: str = "heads_first"
                ) -> Prepared:
        def call():
            return fn(*args)

        return Prepared(call, lambda: peak_memory_numpy(call), inputs=args, layout=layout)

    def module(self, cls: type, args: list, w: Workload, fdevice: str, **options: Any) -> Any:
        rng = np.random.default_rng(0)
        return cls(*args, **module_dims(w), dtype=w.dtype, rng=rng, **options)

    def matmul(self, precision: str) -> Callable[[Any, Any], Any]:
        return np.matmul


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def peak_memory_numpy(fn: Callable[[], Any]) -> tuple[int, str]:
    """Peak bytes ``tracemalloc`` sees during ``fn()`` above what was live before it."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        out = fn()
        _, peak = tracemalloc.get_traced_memory()
        del out
    finally:
        if started:
            tracemalloc.stop()
    return peak - before, "tracemalloc"


# ---------------------------------------------------------------------------------- torch


class Torch(Framework):
    """torch on ``cpu`` or ``cuda``."""

    name = "torch"

    def arrays(self, shapes: Sequence[Shape], dtype: str, fdevice: str, seed: int = 0) -> list:
        import torch

        g = torch.Generator(device=fdevice).manual_seed(seed)
        dt = getattr(torch, dtype)
        return [torch.randn(s, generator=g, device=fdevice, dtype=dt) for s in shapes]

    def prepare(self, fn: Callable, args: list, fdevice: str, layout: str = "heads_first"
                ) -> Prepared:
        import torch

        return self._timed(torch.inference_mode, fn, args, fdevice, layout)

    def prepare_train(self, fn: Callable, args: list, fdevice: str, layout: str = "train"
                      ) -> Prepared:
        import torch

        return self._timed(torch.enable_grad, fn, args, fdevice, layout)

    @staticmethod
    def _timed(mode: Callable, fn: Callable, args: list, fdevice: str, layout: str) -> Prepared:
        """``fn(*args)`` under ``mode()`` (inference mode, or autograd on), synchronized."""
        import torch

        cuda = fdevice == "cuda"

        def call():
            with mode():
                out = fn(*args)
            if cuda:
                torch.cuda.synchronize()  # inside the timed call: the kernels, not the launch
            return out

        measure = peak_memory_torch_cuda if cuda else peak_memory_torch_cpu
        return Prepared(call, lambda: measure(call), inputs=args, layout=layout)

    def module(self, cls: type, args: list, w: Workload, fdevice: str, **options: Any) -> Any:
        import torch

        g = torch.Generator(device=fdevice).manual_seed(0)
        m = cls(*args, **module_dims(w), dtype=w.dtype, device=fdevice, generator=g, **options)
        return m.to(device=fdevice, dtype=getattr(torch, w.dtype)).eval()

    def matmul(self, precision: str) -> Callable[[Any, Any], Any]:
        import torch

        from conformance.ports.precision import torch_ieee_float32

        scope = torch_ieee_float32 if precision == "highest" else contextlib.nullcontext

        def mm(a, b):
            with scope():
                return torch.matmul(a, b)

        return mm


def peak_memory_torch_cuda(fn: Callable[[], Any]) -> tuple[int, str]:
    """Peak bytes torch's CUDA allocator reports during ``fn()`` above what was allocated."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak, "torch.cuda.max_memory_allocated"


def peak_memory_torch_cpu(fn: Callable[[], Any]) -> tuple[int | None, str]:
    """Peak of the running sum of every CPU allocation and free torch's profiler records during
    ``fn()`` (its ``[memory]`` events, each with its own time), above what was live before.

    This follows the allocator itself, event by event; summing each op's *net* self memory at
    the op's start under-reads (docs/BENCH.md, "Peak memory, per framework"). A torch whose
    profiler does not expose its raw events gets ``None`` ("not measured"), never that sum."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
        del out  # the output's free is part of the timeline, after the peak
    try:
        raw = prof.profiler.kineto_results.events()
    except AttributeError:
        return None, "n/a (this torch's profiler does not expose its allocation events)"
    memory = sorted((e for e in raw if e.name() == "[memory]"), key=lambda e: e.start_ns())
    running = peak = 0
    for e in memory:
        running += int(e.nbytes())
        peak = max(peak, running)
    return peak, "torch.profiler allocations"


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler's C++ side logs a line per start and stop)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


# ---------------------------------------------------------------------------------- JAX


class Jax(Framework):
    """JAX on ``cpu``, ``gpu`` or ``tpu``: every call jitted and compiled before timing."""

    name = "jax"

    @staticmethod
    def key(seed: int) -> Any:
        """A PRNG key of the ``rbg`` implementation (module docstring)."""
        import jax

        return jax.random.key(seed, impl="rbg")

    def arrays(self, shapes: Sequence[Shape], dtype: str, fdevice: str, seed: int = 0) -> list:
        import jax

        keys = jax.random.split(self.key(seed), len(shapes))
        with jax.default_device(jax.devices(fdevice)[0]):
            return [jax.random.normal(k, s, dtype=dtype) for k, s in zip(keys, shapes)]

    def prepare(self, fn: Callable, args: list, fdevice: str, layout: str = "heads_first"
                ) -> Prepared:
        return self.prepare_step(fn, args, fdevice, _output, (), layout)

    def prepare_step(
        self,
        step: Callable,
        args: list,
        fdevice: str,
        carry: Callable[[list, Any], Any],
        donate: tuple[int, ...],
        layout: str,
    ) -> Prepared:
        """Jit ``step`` with the arguments ``donate`` donated (a decode loop's cache: its write
        is then in place, not a copy) and compile it on its own (timed); each call runs the
        executable, waits for every output, and ``carry(args, out)`` puts the returned cache
        back into ``args`` and returns the call's output."""
        import jax

        t0 = time.perf_counter()
        compiled = jax.jit(step, donate_argnums=donate).lower(*args).compile()
        compile_s = time.perf_counter() - t0

        def call():
            return carry(args, jax.block_until_ready(compiled(*args)))

        return Prepared(call, lambda: xla_memory(compiled), compile_s, args, layout)

    def module(self, cls: type, args: list, w: Workload, fdevice: str, **options: Any) -> Any:
        from flax import nnx

        rngs = nnx.Rngs(self.key(0))
        return cls(*args, **module_dims(w), dtype=w.dtype, rngs=rngs, **options)

    def bind(self, module: Any, method: str = "__call__") -> tuple[Callable, list]:
        """An ``nnx.Module`` is split once into its graph and state; ``fn`` merges them inside
        the jitted call."""
        from flax import nnx

        if not isinstance(module, nnx.Module):
            return getattr(module, method), []
        graphdef, state = nnx.split(module)

        def fn(state, *args, **kw):
            return getattr(nnx.merge(graphdef, state), method)(*args, **kw)

        return fn, [state]

    def matmul(self, precision: str) -> Callable[[Any, Any], Any]:
        import jax
        import jax.numpy as jnp

        p = jax.lax.Precision.HIGHEST if precision == "highest" else "tensorfloat32"
        return functools.partial(jnp.matmul, precision=p)


def _output(args: list, out: Any) -> Any:
    """A forward call's carry: nothing to put back."""
    return out


def xla_memory(compiled: Any) -> tuple[int | None, str]:
    """``temp + output - alias`` bytes of XLA's buffer assignment for a compiled call."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # not every backend implements it
        m = None
    if m is None:
        return None, "n/a (no XLA memory analysis on this backend)"
    return m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes, "xla"


NUMPY, TORCH, JAX = Numpy(), Torch(), Jax()
#: ``Row.framework`` -> the framework.
FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (NUMPY, TORCH, JAX)}
