"""One process, many runs: the JAX programs a long run compiles are dropped every
:data:`RELEASE_EVERY` runs (docs/CONFORMANCE.md, "One child, 1,400 runs"), by the child
process of ``python -m conformance`` (``conformance/worker.py``), by ``run_suite`` in-process
and by the pytest suite alike."""

from __future__ import annotations

import gc
import sys

#: Runs between two calls of :func:`release_compiled_programs`. XLA's CPU backend keeps each
#: program it compiles in memory mappings of its own (code, read-only data, data) for as long as
#: JAX caches the program, and JAX caches every operation it dispatches, per shape, dtype and
#: sharding: impl_jax adds from 2 mappings per run (``causal_mask``) to 185 (``flash_grad``).
#: Linux gives a process at most ``vm.max_map_count`` (65,530 by default); once they are used
#: up XLA's compiler gets ENOMEM from mmap and dies of SIGSEGV, as it did at run 1,106 of 1,410.
#: 100 runs add at most some 19,000.
RELEASE_EVERY = 100
#: Free mappings below which a release drops the programs: with more than this left, the next
#: RELEASE_EVERY runs fit (19,000 at most), and keeping the programs saves their recompilation
#: (a test process that runs NumPy's and JAX's suites in turn lost every JAX program each time).
RESERVE = 32_768


def free_mappings() -> int | None:
    """How many more memory mappings this process may make (``vm.max_map_count`` less those in
    ``/proc/self/maps``), or None where Linux does not say (then every release drops)."""
    try:
        with open("/proc/sys/vm/max_map_count") as limit, open("/proc/self/maps", "rb") as maps:
            return int(limit.read()) - sum(1 for _ in maps)
    except (OSError, ValueError):
        return None


def release_compiled_programs(reserve: int = RESERVE) -> bool:
    """Drop JAX's caches of compiled programs (``jax.clear_caches``), and with them XLA's
    memory mappings of the programs, if this process has imported JAX and has fewer than
    ``reserve`` mappings left (:func:`free_mappings`; always where that is unknown); a port
    that never imported JAX is left alone. Returns whether the caches were dropped."""
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    free = free_mappings()
    if free is not None and free >= reserve:
        return False
    jax.clear_caches()
    gc.collect()  # programs held only by reference cycles go now, not at some later collection
    return True
