"""Rosetta Attention's benchmark harness (``python -m bench``, ``make bench``).

Times the project's NumPy, PyTorch and JAX attention next to the frameworks' own fused kernels
(named baseline rows), on the best device found, after each row passes a correctness gate
(its smallest conformance fixtures on that device). Built on pytest-benchmark.

Modules: ``workloads`` (grids, FLOP counts), ``rows`` (the registry: one line per row),
``runners`` (timed callables, synchronization, peak memory), ``gate`` (conformance quick
check), ``session`` (the plan and the pytest plugin), ``report`` (derived numbers, goals, the
table), ``plots`` (PNG), ``compare`` (two saved runs), ``devices`` (device and environment).
See docs/BENCH.md.
"""
