"""Peak extra memory of the tiled path against the plain one, measured by each framework's tools.

- NumPy: ``tracemalloc`` (NumPy reports its array buffers to it): the peak of traced memory
  during the call, above what was traced before it.
- PyTorch on CPU: ``torch.profiler`` with ``profile_memory=True`` records every allocation and
  free of the CPU allocator with the running total it had allocated since the profiler started
  (``total_allocated`` of the allocation events); the largest total is the peak. Under
  ``torch.no_grad()``: with autograd on, both paths keep what the backward pass needs.
- JAX: XLA's compiled memory analysis, ``jax.jit(f).lower(...).compile().memory_analysis()``:
  ``temp_size_in_bytes`` is the scratch memory the compiled program needs besides its arguments
  and outputs. It is computed from the program, not by running it, so it is deterministic, and
  the L = S = 8192 figure costs no run at all.

Run as a script to print the table of docs/FLASH.md (``python tests/test_flash_memory.py 8192 8
64``: L = S, H, D; float32, B = 1). The test below uses L = S = 1024, H = 2, D = 32, where the
plain path's scores are 8 MiB, and asserts that the tiled path needs less than a quarter of the
plain path's memory and that its memory does not grow with S (the plain one's doubles).
"""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

MiB = 2**20


def _inputs(L: int, S: int, H: int, D: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, H, L, D), dtype=np.float32)  # (B, H, L, D)
    k = rng.standard_normal((1, H, S, D), dtype=np.float32)  # (B, K, S, D), K = H
    v = rng.standard_normal((1, H, S, D), dtype=np.float32)  # (B, K, S, E), E = D
    return q, k, v


def numpy_peak(fn: Callable, q, k, v, **kw) -> int:
    """Bytes NumPy allocated at the peak of ``fn(q, k, v, **kw)``, above what was live before."""
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        out = fn(q, k, v, **kw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del out
    return peak - before


def torch_peak(fn: Callable, q, k, v, **kw) -> int:
    """Bytes torch's CPU allocator held at the peak of ``fn(q, k, v, **kw)`` (profiler events)."""
    import torch
    from torch._C._profiler import _EventType

    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.no_grad(), torch.profiler.profile(activities=activities, profile_memory=True) as p:
        out = fn(tq, tk, tv, **kw)
    del out
    peak, stack = 0, list(p.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation:
            peak = max(peak, event.extra_fields.total_allocated)
    return peak


def jax_temp(fn: Callable, q, k, v, **kw) -> int:
    """Scratch bytes of the compiled ``fn`` (XLA memory analysis; nothing is run)."""
    import jax

    compiled = jax.jit(lambda a, b, c: fn(a, b, c, **kw)).lower(q, k, v).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def _measure(framework: str, L: int, S: int, H: int, D: int, **kw) -> tuple[int, int]:
    """(plain, tiled) peak extra bytes of one framework at one size."""
    q, k, v = _inputs(L, S, H, D)
    if framework == "numpy":
        from impl_numpy.flash import flash_attention
        from impl_numpy.functional import scaled_dot_product_attention

        measure = numpy_peak
    elif framework == "torch":
        from impl_torch.flash import flash_attention
        from impl_torch.functional import scaled_dot_product_attention

        measure = torch_peak
    else:
        from impl_jax.flash import flash_attention
        from impl_jax.functional import scaled_dot_product_attention

        measure = jax_temp
    plain = measure(scaled_dot_product_attention, q, k, v, **kw)
    tiled = measure(flash_attention, q, k, v, **kw)
    return plain, tiled


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_tiled_memory_is_a_fraction_of_plain(framework: str, is_causal: bool) -> None:
    L, H, D = 1024, 2, 32
    scores = H * L * L * 4  # the plain path's (B=1, H, L, S) float32 scores: 8 MiB
    plain, tiled = _measure(framework, L, L, H, D, is_causal=is_causal)
    assert plain >= scores  # the measurement sees the scores the plain path materializes
    assert tiled < plain / 4, f"{framework}: tiled {tiled / MiB:.2f} MiB, plain {plain / MiB:.2f}"


@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
def test_tiled_memory_does_not_grow_with_S(framework: str) -> None:
    L, H, D = 512, 2, 32
    plain_1, tiled_1 = _measure(framework, L, 1024, H, D)
    plain_2, tiled_2 = _measure(framework, L, 2048, H, D)
    assert plain_2 > 1.8 * plain_1  # the plain path's (H, L, S) scores double with S
    assert tiled_2 < 1.1 * tiled_1 + 64 * 1024, (tiled_1, tiled_2)


def main(argv: list[str]) -> None:
    """Print plain and tiled peak extra memory, MiB, at L = S, H, D given on the command line."""
    L, H, D = (int(a) for a in argv[:3]) if argv else (1024, 2, 32)
    frameworks = argv[3:] or ["numpy", "torch", "jax"]
    print(f"L = S = {L}, H = {H}, D = {D}, float32; scores: {H * L * L * 4 / MiB:.0f} MiB")
    for framework in frameworks:
        for is_causal in (False, True):
            plain, tiled = _measure(framework, L, L, H, D, is_causal=is_causal)
            print(
                f"{framework:6} causal={is_causal!s:5} plain {plain / MiB:9.1f} MiB  "
                f"tiled {tiled / MiB:7.2f} MiB  ratio {tiled / plain:.4f}",
                flush=True,
            )


if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    main(sys.argv[1:])
