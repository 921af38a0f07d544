"""Turn a (row, workload, device) into a timed callable, and measure its peak memory.

Each framework's rules are handled here, once:

- torch on CUDA: ``torch.cuda.synchronize()`` is inside the timed callable, so the time is the
  kernel's, not the launch's; calls run under ``torch.inference_mode()``.
- JAX: every row is jitted; ``lower(...).compile()`` is timed on its own and reported as the
  compile time, and the timed callable runs the compiled executable and ends with
  ``jax.block_until_ready``, so compilation never leaks into the steady-state time.
- NumPy runs on the host.

Inputs are standard-normal, made by each framework on its own device from a fixed seed (so a
GPU run never builds gigabytes on the host first); they differ between frameworks, which does
not matter for timing. JAX draws them with the ``rbg`` key (XLA's RngBitGenerator): the default
threefry key compiles one XLA program per shape that takes seconds (13 s per shape on a busy
2-core machine), the ``rbg`` one a fraction of that.

``prepare`` looks up the row's call style in :data:`PREPARERS`, one function per style.

Errors: a kernel that has no implementation for the inputs says so in its own words (torch's
"No available kernel", cuDNN's "no execution plans support the graph", JAX's cuDNN checks'
``NotImplementedError``); only those become ``unsupported`` (:data:`UNSUPPORTED`,
:func:`classify_error`). Anything else a kernel raises, a cuDNN library failure included, is an
``error``: it may be real breakage, and hiding it as "unsupported" would make it invisible.

Decode rows time one KV-cache step at a fixed position P, every round the same work:

- the cache is made at position P directly (its P tokens' keys and values standard-normal, its
  buffers exactly S = P + 1 tokens long); a prefill would cost a full (P, P) attention and
  change nothing in the step;
- NumPy and torch: ``decode`` writes the new token's key and value into slot P of the buffers
  in place and returns a *new* cache object at P + 1; the cache object the call is given is a
  frozen dataclass whose position never changes, so the timed call drops the returned cache and
  every round rewrites slot P with the same values and reads the same S keys;
- a workload with a window W steps a module with ``window=(W, 0)`` through its rolling cache
  (``init_cache(..., rolling=True)``), made at position P the same way: a ring of ``W + 1``
  slots whose step writes slot ``P % (W + 1)`` and reads the W tokens before it, at any P;
- JAX: the step is jitted with the cache donated, as a decode loop does (its write is then in
  place, not a copy of the whole cache); each round passes the returned buffers back as the
  cache at position P (a new static-position pytree around the same arrays, a few
  microseconds of Python), so the executable compiled for position P runs every round.

Training-step rows (``train``, ``torch_sdpa_train``, ``jax_dpa_train``) time one forward and
one backward, the gradients of query, key and value for a standard-normal ``grad_output``:

- torch runs them with autograd on (not in inference mode): the project's ``*_vjp`` make their
  own leaves, and ``F.scaled_dot_product_attention`` is differentiated with
  ``torch.autograd.grad`` on fresh leaves (views of the inputs that require grad) every call;
- JAX jits the whole step, ``jax.vjp`` and its pullback, so XLA plans the forward's residuals
  and the backward together (what ``jax.grad`` inside a jitted train step does);
- their peak memory is counted beyond the inputs, the output *and* the gradients (the issue's
  "peak extra memory"): the probe's peak less :meth:`Workload.result_bytes`, the bytes of
  ``O``, ``dQ``, ``dK``, ``dV``, all of which a training step holds at its peak; the method
  reads ``... - O, grads``.

Peak memory is the extra memory one call needs beyond its inputs (the output included):

- NumPy: ``tracemalloc`` (NumPy reports its buffers to it);
- torch on CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``;
- torch on CPU: every allocation and free the allocator reports to ``torch.profiler``
  (``profile_memory=True``), summed in time order (:func:`peak_memory_torch_cpu`), the same
  probe for forward calls and training steps;
- JAX: XLA's own buffer assignment for the compiled call, ``temp + output - alias`` bytes
  (``compiled.memory_analysis()``), exact for what XLA allocates and the same on every device.
  JAX's device counter ``peak_bytes_in_use`` cannot be reset, so a per-call delta cannot be
  read from it once an earlier, larger call has set the high-water mark.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import re
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.rows import Row
from bench.workloads import Workload

__all__ = [
    "PREPARERS",
    "UNSUPPORTED",
    "Prepared",
    "UnsupportedError",
    "classify_error",
    "kernel_says_unsupported",
    "make_inputs",
    "peak_memory_numpy",
    "peak_memory_torch_cpu",
    "prepare",
    "prepare_matmul",
]


class UnsupportedError(RuntimeError):
    """The row cannot run this workload here (no kernel for the dtype/shape); not a failure."""


@dataclass
class Prepared:
    """A row ready to time on one workload.

    ``call`` runs one synchronized call; ``memory()`` measures the peak extra bytes of one call
    and returns ``(bytes or None, method)``; ``compile_s`` is JAX's lower+compile time;
    ``inputs`` and ``layout`` are what the call reads (tests check the wiring with them).
    """

    call: Callable[[], Any]
    memory: Callable[[], tuple[int | None, str]]
    compile_s: float | None = None
    inputs: list | None = None
    layout: str = "heads_first"
    module: Any = None  # the project module a decode row steps (tests prefill its cache)


#: Each kernel's own words for "no kernel for these inputs": (exception class name, regular
#: expression over its message). Nothing else is ``unsupported``.
UNSUPPORTED: dict[str, tuple[tuple[str, str], ...]] = {
    "torch_sdpa": (
        ("RuntimeError", r"No available kernel"),  # sdpa_kernel([...]) left no backend
        ("RuntimeError", r"No viable backend"),  # the same, older torch
        ("RuntimeError", r"[Nn]o (valid )?execution plans"),  # cuDNN frontend: no plan for it
    ),
    "jax_cudnn": (  # jax/_src/cudnn's applicability checks (dtype, head dim, lengths, arch)
        ("NotImplementedError", r"must be|[Uu]nsupported|requires|only support"),
    ),
}


def kernel_says_unsupported(kernel: str | None, type_name: str, message: str) -> bool:
    """Whether an exception ``type_name: message`` is ``kernel``'s own "not supported"."""
    return any(
        type_name == name and re.search(pattern, message)
        for name, pattern in UNSUPPORTED.get(kernel or "", ())
    )


def _jax_key(seed: int) -> Any:
    """A JAX PRNG key of the ``rbg`` implementation (module docstring)."""
    import jax

    return jax.random.key(seed, impl="rbg")


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _shapes(w: Workload, layout: str) -> list[tuple[int, ...]]:
    """Input shapes: ``heads_first`` (B,H,L,D),(B,K,S,D),(B,K,S,E); ``heads_second``
    (B,L,H,D),(B,S,K,D),(B,S,K,E); ``module`` (B,L,M); ``decode`` the new token (B,L,M) and the
    cache buffers (B,K,S,D),(B,K,S,E); ``decode_heads_second`` (B,L,M),(B,S,K,D),(B,S,K,E);
    ``train`` / ``train_heads_second``: heads_first / heads_second and the ``grad_output``
    (B,H,L,E) / (B,L,H,E)."""
    if layout == "train":
        return [*_shapes(w, "heads_first"), (w.B, w.H, w.L, w.E)]
    if layout == "train_heads_second":
        return [*_shapes(w, "heads_second"), (w.B, w.L, w.H, w.E)]
    if layout == "module":
        return [(w.B, w.L, w.M)]
    if layout == "decode":  # the cache's T slots: S = P + 1, or a rolling cache's ring
        return [(w.B, w.L, w.M), (w.B, w.K, w.slots, w.D), (w.B, w.K, w.slots, w.E)]
    if layout == "decode_heads_second":
        return [(w.B, w.L, w.M), (w.B, w.S, w.K, w.D), (w.B, w.S, w.K, w.E)]
    if layout == "heads_second":
        return [(w.B, w.L, w.H, w.D), (w.B, w.S, w.K, w.D), (w.B, w.S, w.K, w.E)]
    return [(w.B, w.H, w.L, w.D), (w.B, w.K, w.S, w.D), (w.B, w.K, w.S, w.E)]


def make_inputs(framework: str, w: Workload, fdevice: str, layout: str = "heads_first") -> list:
    """Standard-normal inputs of ``w.dtype``, made by ``framework`` on ``fdevice`` (seed 0)."""
    shapes = _shapes(w, layout)
    if framework == "numpy":
        rng = np.random.default_rng(0)
        return [rng.standard_normal(s, dtype=np.float32).astype(_np_dtype(w.dtype)) for s in shapes]
    if framework == "torch":
        import torch

        g = torch.Generator(device=fdevice).manual_seed(0)
        dt = getattr(torch, w.dtype)
        return [torch.randn(s, generator=g, device=fdevice, dtype=dt) for s in shapes]
    if framework == "jax":
        import jax

        dev = jax.devices(fdevice)[0]
        keys = jax.random.split(_jax_key(0), len(shapes))
        with jax.default_device(dev):
            return [jax.random.normal(k, s, dtype=w.dtype) for k, s in zip(keys, shapes)]
    raise ValueError(f"unknown framework {framework!r}")


# ---------------------------------------------------------------------------------------------
# peak memory


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


def peak_memory_torch_cpu(fn: Callable[[], Any]) -> tuple[int | None, str]:
    """Peak of the running sum of every CPU allocation and free torch's profiler records during
    ``fn()`` (its ``[memory]`` events, each with its own time), above what was live before.

    This follows the allocator itself, event by event. Summing each op's *net* self memory
    (allocations less frees inside the op) placed at the op's start, as this probe once did,
    under-reads: an op that allocates scratch and frees it before it ends nets zero, and an
    outer record (a ``torch.autograd.Function``'s forward, autograd's engine, a tiled loop's
    ops) whose children's temporaries it frees nets a large negative number, placed before the
    peak. Measured on torch 2.13 at B=1, H=8, L=S=1024: the tiled forward read 2.0 MiB (its
    output) against 7.6 MiB here, ``F.scaled_dot_product_attention`` 2.0 against 3.2 MiB, a
    tiled training step 0 bytes extra. A torch whose profiler does not expose its raw events
    gets ``None`` ("not measured"), never the under-reading sum."""
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


def _peak_memory_torch_cuda(fn: Callable[[], Any]) -> tuple[int, str]:
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak, "torch.cuda.max_memory_allocated"


def _xla_memory(compiled: Any) -> tuple[int | None, str]:
    try:
        m = compiled.memory_analysis()
    except Exception:  # not every backend implements it
        m = None
    if m is None:
        return None, "n/a (no XLA memory analysis on this backend)"
    return m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes, "xla"


# ---------------------------------------------------------------------------------------------
# the callables


def _torch_call(fn: Callable[[], Any], fdevice: str) -> Callable[[], Any]:
    import torch

    if fdevice == "cuda":

        def call():
            with torch.inference_mode():
                out = fn()
            torch.cuda.synchronize()  # inside the timed call: time the kernels, not the launch
            return out
    else:

        def call():
            with torch.inference_mode():
                return fn()

    return call


def _torch_prepared(fn: Callable[[], Any], fdevice: str) -> Prepared:
    call = _torch_call(fn, fdevice)
    measure = _peak_memory_torch_cuda if fdevice == "cuda" else peak_memory_torch_cpu
    return Prepared(call=call, memory=lambda: measure(call))


def _jax_prepared(jitted: Any, args: list) -> Prepared:
    import jax

    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    compile_s = time.perf_counter() - t0

    def call():
        return jax.block_until_ready(compiled(*args))

    return Prepared(call=call, memory=lambda: _xla_memory(compiled), compile_s=compile_s)


def _construct(cls: type, framework: str, w: Workload, fdevice: str, gqa: bool,
               **options: Any) -> Any:  # fmt: skip
    """Build a project module with the contract's constructor, in the workload's dtype, on the
    framework device, with whatever seeded generator its framework asks for (``options``: more
    keywords, e.g. ``window``)."""
    # __init__'s own signature: an nnx.Module class reports only (*args, **kwargs)
    params = inspect.signature(cls.__init__).parameters
    args: list[Any] = [w.M, w.H, w.K] if gqa else [w.M, w.H]
    kw: dict[str, Any] = {"head_dim": w.D} if "head_dim" in params else {}
    if "dtype" in params:
        kw["dtype"] = w.dtype
    if "device" in params:
        kw["device"] = fdevice
    if "rngs" in params:
        from flax import nnx

        kw["rngs"] = nnx.Rngs(_jax_key(0))
    if "rng" in params:
        kw["rng"] = np.random.default_rng(0)
    if "generator" in params:
        import torch

        kw["generator"] = torch.Generator(device=fdevice).manual_seed(0)
    module = cls(*args, **kw, **options)
    if framework == "torch":
        import torch

        module = module.to(device=fdevice, dtype=getattr(torch, w.dtype)).eval()
    return module


def _nnx_jit(module: Any, is_causal: bool, causal_kw: str) -> Any:
    """A jitted pure function of (state, x) for an nnx module (split once, merge inside)."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(module)

    def apply(state, x):
        return nnx.merge(graphdef, state)(x, **{causal_kw: is_causal})

    return jax.jit(apply), state


def _prepare_functional(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The project's heads-first function: ``fn(q, k, v, is_causal=..., [window=(W, 0)])`` (JAX
    jitted)."""
    fw = row.framework
    kw = {"is_causal": w.is_causal} | ({} if w.window is None else {"window": (w.window, 0)})
    if fw == "jax":
        import jax

        args = make_inputs("jax", w, fdevice)
        jitted = jax.jit(functools.partial(target, **kw))
        return _with_inputs(_jax_prepared(jitted, args), args)
    q, k, v = args = make_inputs(fw, w, fdevice)
    fn = functools.partial(target, q, k, v, **kw)
    if fw == "numpy":
        return Prepared(call=fn, memory=lambda: peak_memory_numpy(fn), inputs=args)
    return _with_inputs(_torch_prepared(fn, fdevice), args)


def _prepare_kernel(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """A kernel port's heads-first ``flash_attention(q, k, v, is_causal=...)`` with its own
    default blocks: torch tensors on ``fdevice`` for the Triton kernel (``torch_kernel``), JAX
    arrays and ``jax.jit`` with the keywords bound for the Pallas one (``jax_kernel``); the
    framework is the row's, read off its call style, and the wiring ``functional``'s."""
    return _prepare_functional(row, target, w, fdevice)


def _prepare_torch_sdpa(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """``F.scaled_dot_product_attention``, torch's dispatch or one backend forced."""
    from conformance.ports.torch_fused import backend

    q, k, v = args = make_inputs("torch", w, fdevice)
    kw = {"is_causal": w.is_causal, "enable_gqa": w.K != w.H}

    def fn():
        with backend(row.backend):
            return target(q, k, v, **kw)

    prepared = _with_inputs(_torch_prepared(fn, fdevice), args)
    return _unsupported_on_probe(prepared, row.kernel)


def _prepare_jax_dpa(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """``jax.nn.dot_product_attention(implementation=row.backend)`` on heads-second inputs."""
    import jax

    args = make_inputs("jax", w, fdevice, layout="heads_second")
    impl = row.backend
    jitted = jax.jit(functools.partial(target, is_causal=w.is_causal, implementation=impl))
    try:
        return _with_inputs(_jax_prepared(jitted, args), args, "heads_second")
    except Exception as e:  # only the kernel's own "not supported" is unsupported
        if kernel_says_unsupported(row.kernel, type(e).__name__, str(e)):
            raise UnsupportedError(f"{type(e).__name__}: {e}".splitlines()[0]) from e
        raise


def _prepare_module(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The project's ``MultiHeadAttention`` / ``GroupedQueryAttention`` on ``x (B, L, M)``."""
    fw, c = row.framework, w.is_causal
    gqa = row.target.endswith("GroupedQueryAttention")
    module = _construct(target, fw, w, fdevice, gqa)
    (x,) = make_inputs(fw, w, fdevice, layout="module")
    if fw == "jax":
        import jax
        from flax import nnx

        if isinstance(module, nnx.Module):
            jitted, state = _nnx_jit(module, c, "is_causal")
            args = [state, x]
        else:
            jitted, args = jax.jit(lambda x: module(x, is_causal=c)), [x]
        return _with_inputs(_jax_prepared(jitted, args), args, "module")
    fn = functools.partial(module, x, is_causal=c)
    if fw == "numpy":
        return Prepared(fn, lambda: peak_memory_numpy(fn), inputs=[x], layout="module")
    return _with_inputs(_torch_prepared(fn, fdevice), [x], "module")


def _prepare_torch_mha(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """``torch.nn.MultiheadAttention`` with its fast path off, so that its attention is
    ``F.scaled_dot_product_attention`` (with ``is_causal`` for causal workloads).

    In inference mode the module's fast path (``torch._native_multi_head_attention``) takes a
    causal mask to ``_masked_softmax``, which builds the full ``(B, H, L, S)`` scores; on the
    slow path, with ``need_weights=False``, the mask becomes SDPA's ``is_causal=True`` (the
    mask is then a hint only), a fused kernel that skips masked blocks, as the row says.
    """
    import torch
    from torch.backends import mha

    c = w.is_causal
    m = target(w.M, w.H, batch_first=True, device=fdevice, dtype=getattr(torch, w.dtype))
    m = m.eval()
    (x,) = make_inputs("torch", w, fdevice, layout="module")
    # nn.MultiheadAttention's bool mask is True = masked out; is_causal is a hint that needs it
    mask = torch.ones(w.L, w.S, dtype=torch.bool, device=fdevice).triu(1) if c else None

    def fn():  # (output, None) without weights
        enabled = mha.get_fastpath_enabled()
        mha.set_fastpath_enabled(False)
        try:
            return m(x, x, x, need_weights=False, attn_mask=mask, is_causal=c)[0]
        finally:
            mha.set_fastpath_enabled(enabled)

    return _with_inputs(_torch_prepared(fn, fdevice), [x], "module")


def _prepare_nnx_mha(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """``flax.nnx.MultiHeadAttention`` (GQA through ``num_kv_heads``), jitted split/merge."""
    from flax import nnx

    module = target(
        num_heads=w.H, in_features=w.M, qkv_features=w.H * w.D, out_features=w.M,
        dtype=w.dtype, param_dtype=w.dtype, decode=False, rngs=nnx.Rngs(_jax_key(0)),
        **({"num_kv_heads": w.K} if w.K != w.H else {}),
    )  # fmt: skip
    (x,) = make_inputs("jax", w, fdevice, layout="module")
    jitted, state = _nnx_jit(module, w.is_causal, "is_causal")
    args = [state, x]
    return _with_inputs(_jax_prepared(jitted, args), args, "module")


# ---------------------------------------------------------------------------------------------
# decode steps (module docstring: one step at a fixed position P, the same work every round)


def _prepare_decode(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """One KV-cache step of the project's ``GroupedQueryAttention.decode``: a token
    ``x (B, 1, M)`` after P cached tokens, in a cache of the module's own type (a workload with
    a window W: a module with ``window=(W, 0)`` and its rolling cache, ``W + 1`` ring slots)."""
    fw, P = row.framework, w.P
    rolling = w.window is not None
    options = {"window": (w.window, 0)} if rolling else {}
    module = _construct(target, fw, w, fdevice, gqa=True, **options)
    x, key, value = make_inputs(fw, w, fdevice, layout="decode")
    # a cache at position P: the module's own KVCache type, buffers of S = P + 1 tokens (a
    # rolling cache: its T = W + 1 slots, for sequences of up to S tokens)
    empty = module.init_cache(w.B, w.S if rolling else 1, rolling=rolling)
    cache = dataclasses.replace(empty, key=key, value=value, position=P)
    if fw == "jax":
        from flax import nnx

        graphdef, state = nnx.split(module)

        def step(state, x, cache):  # -> (y (B, 1, M), the cache at P + 1)
            return nnx.merge(graphdef, state).decode(x, cache)

        def carry(args: list, out: Any) -> Any:  # the written buffers, back at P
            args[2] = dataclasses.replace(out[1], position=P)
            return out[0]

        args = [state, x, cache]
        prepared = _jax_donating(step, args, carry, donate=(2,))
    else:
        args = [x, cache]

        def fn():  # the cache at P + 1 that decode returns is dropped: args[1] stays at P
            return module.decode(args[0], args[1])[0]

        prepared = _host_or_torch(fn, fw, fdevice)
    prepared.module = module
    return _with_inputs(prepared, args, "decode")


def _prepare_torch_decode(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The same step with torch ops around ``F.scaled_dot_product_attention``."""
    B, H, K, D, E, P = w.B, w.H, w.K, w.D, w.E, w.P
    x, ck, cv = make_inputs("torch", w, fdevice, layout="decode")
    params = _projection_weights("torch", w, fdevice)

    def fn():
        wq, bq, wk, bk, wv, bv, wo, bo = params
        q = (x @ wq + bq).view(B, 1, H, D).transpose(1, 2)  # (B, H, 1, D)
        k = (x @ wk + bk).view(B, 1, K, D).transpose(1, 2)  # (B, K, 1, D)
        v = (x @ wv + bv).view(B, 1, K, E).transpose(1, 2)  # (B, K, 1, E)
        ck[:, :, P : P + 1] = k  # the cache write at position P, in place
        cv[:, :, P : P + 1] = v
        # one query: bottom-right causal allows all S = P + 1 keys, so no mask
        out = target(q, ck[:, :, : P + 1], cv[:, :, : P + 1], enable_gqa=K != H)
        return out.transpose(1, 2).reshape(B, 1, H * E) @ wo + bo  # (B, 1, M)

    prepared = _torch_prepared(fn, fdevice)
    return _with_inputs(prepared, [params, x, ck, cv], "decode")


def _prepare_jax_decode(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The same step with jnp ops around ``jax.nn.dot_product_attention`` (heads second)."""
    B, H, K, D, E, P = w.B, w.H, w.K, w.D, w.E, w.P
    x, ck, cv = make_inputs("jax", w, fdevice, layout="decode_heads_second")
    params = _projection_weights("jax", w, fdevice)

    def jstep(params, x, ck, cv):
        wq, bq, wk, bk, wv, bv, wo, bo = params
        q = (x @ wq + bq).reshape(B, 1, H, D)  # (B, 1, H, D)
        k = (x @ wk + bk).reshape(B, 1, K, D)  # (B, 1, K, D)
        v = (x @ wv + bv).reshape(B, 1, K, E)  # (B, 1, K, E)
        ck = ck.at[:, P : P + 1].set(k)  # the cache write at position P (donated: in place)
        cv = cv.at[:, P : P + 1].set(v)
        out = target(q, ck[:, : P + 1], cv[:, : P + 1], implementation=row.backend)
        return out.reshape(B, 1, H * E) @ wo + bo, ck, cv  # (B, 1, M) and the cache

    def jcarry(args: list, out: Any) -> Any:
        args[2], args[3] = out[1], out[2]
        return out[0]

    args = [params, x, ck, cv]
    prepared = _jax_donating(jstep, args, jcarry, donate=(2, 3))
    return _with_inputs(prepared, args, "decode_heads_second")


# ---------------------------------------------------------------------------------------------
# training steps (module docstring: forward + backward, memory beyond output and gradients)


def _beyond_results(
    memory: Callable[[], tuple[int | None, str]], w: Workload
) -> Callable[[], tuple[int | None, str]]:
    """``memory`` less the bytes of the output and the gradients (``w.result_bytes()``)."""

    def measure() -> tuple[int | None, str]:
        n, method = memory()
        return (None if n is None else n - w.result_bytes()), f"{method} - O, grads"

    return measure


def _torch_train_prepared(fn: Callable[[], Any], fdevice: str) -> Prepared:
    """A torch training step: autograd on (``_torch_call`` would run in inference mode)."""
    import torch

    def call():
        with torch.enable_grad():
            out = fn()
        if fdevice == "cuda":
            torch.cuda.synchronize()  # inside the timed call: the kernels, not the launch
        return out

    measure = _peak_memory_torch_cuda if fdevice == "cuda" else peak_memory_torch_cpu
    return Prepared(call=call, memory=lambda: measure(call))


def _prepare_train(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The project's ``*_vjp``: ``fn(q, k, v, grad_output, is_causal=...)`` -> the gradients
    (JAX: jitted whole)."""
    fw = row.framework
    args = make_inputs(fw, w, fdevice, layout="train")
    fn = functools.partial(target, is_causal=w.is_causal)
    if fw == "jax":
        import jax

        prepared = _jax_prepared(jax.jit(fn), args)
    elif fw == "numpy":
        call = functools.partial(fn, *args)
        prepared = Prepared(call=call, memory=lambda: peak_memory_numpy(call))
    else:
        prepared = _torch_train_prepared(functools.partial(fn, *args), fdevice)
    prepared.memory = _beyond_results(prepared.memory, w)
    return _with_inputs(prepared, args, "train")


def _prepare_torch_sdpa_train(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """``F.scaled_dot_product_attention`` and its autograd backward: ``torch.autograd.grad``
    of the output against fresh leaves, with ``grad_output``."""
    import torch

    from conformance.ports.torch_fused import backend

    q, k, v, do = args = make_inputs("torch", w, fdevice, layout="train")
    kw = {"is_causal": w.is_causal, "enable_gqa": w.K != w.H}

    def fn():  # -> (dQ, dK, dV)
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        with backend(row.backend):
            out = target(*leaves, **kw)
        return torch.autograd.grad(out, leaves, do)

    prepared = _torch_train_prepared(fn, fdevice)
    prepared.memory = _beyond_results(prepared.memory, w)
    return _unsupported_on_probe(_with_inputs(prepared, args, "train"), row.kernel)


def _prepare_jax_dpa_train(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """``jax.vjp`` of ``jax.nn.dot_product_attention(implementation=row.backend)`` and its
    pullback of ``grad_output``, jitted together, on heads-second inputs."""
    import jax

    args = make_inputs("jax", w, fdevice, layout="train_heads_second")
    attend = functools.partial(target, is_causal=w.is_causal, implementation=row.backend)

    def step(q, k, v, do):  # -> (dQ, dK, dV), heads second
        _, pullback = jax.vjp(attend, q, k, v)
        return pullback(do)

    try:
        prepared = _jax_prepared(jax.jit(step), args)
    except Exception as e:  # only the kernel's own "not supported" is unsupported
        if kernel_says_unsupported(row.kernel, type(e).__name__, str(e)):
            raise UnsupportedError(f"{type(e).__name__}: {e}".splitlines()[0]) from e
        raise
    prepared.memory = _beyond_results(prepared.memory, w)
    return _with_inputs(prepared, args, "train_heads_second")


#: Row.call -> the function that builds its inputs and timed callable (rows.py's docstring).
PREPARERS: dict[str, Callable[[Row, Any, Workload, str], Prepared]] = {
    "functional": _prepare_functional,
    "torch_sdpa": _prepare_torch_sdpa,
    "jax_dpa": _prepare_jax_dpa,
    "module": _prepare_module,
    "torch_mha": _prepare_torch_mha,
    "nnx_mha": _prepare_nnx_mha,
    "decode": _prepare_decode,
    "torch_decode": _prepare_torch_decode,
    "jax_decode": _prepare_jax_decode,
    "torch_kernel": _prepare_kernel,
    "jax_kernel": _prepare_kernel,
    "train": _prepare_train,
    "torch_sdpa_train": _prepare_torch_sdpa_train,
    "jax_dpa_train": _prepare_jax_dpa_train,
}


def prepare(row: Row, w: Workload, fdevice: str) -> Prepared:
    """Build the inputs and the timed callable of ``row`` on ``w`` (framework device ``fdevice``).

    Raises UnsupportedError when a framework kernel has no implementation for the case (in its
    own words, :data:`UNSUPPORTED`); any other exception is the row's own error.
    """
    preparer = PREPARERS.get(row.call)
    if preparer is None:
        raise ValueError(f"row {row.name!r}: unknown call style {row.call!r}; {sorted(PREPARERS)}")
    return preparer(row, row.resolve(), w, fdevice)


def _projection_weights(framework: str, w: Workload, fdevice: str) -> list:
    """``wq (M, H*D), bq, wk (M, K*D), bk, wv (M, K*E), bv, wo (H*E, M), bo``: normal / sqrt(M)
    kernels and biases in the canonical ``x @ W + b`` layout (seed 1)."""
    shapes = [(w.M, w.H * w.D), (w.M, w.K * w.D), (w.M, w.K * w.E), (w.H * w.E, w.M)]
    shapes = [s for kernel in shapes for s in (kernel, kernel[1:])]  # each kernel, its bias
    scale = w.M**-0.5
    if framework == "torch":
        import torch

        g = torch.Generator(device=fdevice).manual_seed(1)
        dt = getattr(torch, w.dtype)
        return [torch.randn(s, generator=g, device=fdevice, dtype=dt) * scale for s in shapes]
    import jax

    keys = jax.random.split(_jax_key(1), len(shapes))
    with jax.default_device(jax.devices(fdevice)[0]):
        return [jax.random.normal(k, s, dtype=w.dtype) * scale for k, s in zip(keys, shapes)]


def _host_or_torch(fn: Callable[[], Any], framework: str, fdevice: str) -> Prepared:
    if framework == "numpy":
        return Prepared(call=fn, memory=lambda: peak_memory_numpy(fn))
    return _torch_prepared(fn, fdevice)


def _jax_donating(
    step: Callable[..., Any],
    args: list,
    carry: Callable[[list, Any], Any],
    donate: tuple[int, ...],
) -> Prepared:
    """Jit ``step`` with the cache arguments ``donate`` donated; compile it on its own (timed);
    each call runs the executable, waits for every output, and ``carry(args, out)`` puts the
    returned cache back into ``args`` (at the same position) and returns the step's output."""
    import jax

    t0 = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=donate).lower(*args).compile()
    compile_s = time.perf_counter() - t0

    def call():
        out = jax.block_until_ready(compiled(*args))
        return carry(args, out)

    return Prepared(call=call, memory=lambda: _xla_memory(compiled), compile_s=compile_s)


def _with_inputs(prepared: Prepared, inputs: list, layout: str = "heads_first") -> Prepared:
    prepared.inputs, prepared.layout = inputs, layout
    return prepared


def _unsupported_on_probe(prepared: Prepared, kernel: str | None) -> Prepared:
    """Run one call now, turning the kernel's own "no kernel for this" into UnsupportedError."""
    try:
        prepared.call()
    except Exception as e:
        if kernel_says_unsupported(kernel, type(e).__name__, str(e)):
            raise UnsupportedError(str(e).strip().splitlines()[0]) from e
        raise
    return prepared


def jax_matmul(precision: str) -> Callable[[Any, Any], Any]:
    """``jnp.matmul`` at ``precision``: ``highest`` (IEEE float32) or ``tf32``."""
    import jax
    import jax.numpy as jnp

    p = jax.lax.Precision.HIGHEST if precision == "highest" else "tensorfloat32"
    return functools.partial(jnp.matmul, precision=p)


def prepare_matmul(
    framework: str, dtype: str, n: int, fdevice: str, precision: str = "highest"
) -> Prepared:
    """An ``(n, n) @ (n, n)`` matmul in ``framework`` (2 n^3 FLOPs): the device's peak.

    ``precision`` matters for float32 only: ``highest`` runs IEEE float32 (torch with TF32 off,
    JAX at HIGHEST), the precision the project's rows use; ``tf32`` allows TF32 (``--tf32 on``).
    """
    w = Workload("attention", 1, 1, 1, n, n, n, n, False, dtype)
    if framework == "jax":
        import jax

        a, b, _ = make_inputs("jax", w, fdevice)
        return _jax_prepared(jax.jit(jax_matmul(precision)), [a[0, 0], b[0, 0]])
    a, b, _ = make_inputs(framework, w, fdevice)
    a, b = a[0, 0], b[0, 0]
    if framework == "numpy":
        fn = functools.partial(np.matmul, a, b)
        return Prepared(call=fn, memory=lambda: peak_memory_numpy(fn))
    import torch

    from conformance.ports.precision import torch_ieee_float32

    scope = torch_ieee_float32 if precision == "highest" else contextlib.nullcontext

    def fn():
        with scope():
            return torch.matmul(a, b)

    return _torch_prepared(fn, fdevice)


def classify_error(e: BaseException, kernel: str | None = None) -> str:
    """``unsupported``, ``oom`` or ``error`` for an exception raised while preparing or timing
    a row whose kernel (``Row.kernel``) is ``kernel``: unsupported only in the kernel's own
    words (:data:`UNSUPPORTED`)."""
    if isinstance(e, UnsupportedError):
        return "unsupported"
    if isinstance(e, MemoryError):
        return "oom"
    text = f"{type(e).__name__}: {e}"
    if "OutOfMemoryError" in text or "RESOURCE_EXHAUSTED" in text or "out of memory" in text:
        return "oom"
    if kernel_says_unsupported(kernel, type(e).__name__, str(e)):
        return "unsupported"
    return "error"
