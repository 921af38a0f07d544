"""Rosetta Attention's benchmark harness (``python -m bench``, ``make bench``).

Times the project's NumPy, PyTorch and JAX attention next to the frameworks' own fused kernels
(named baseline rows), on the best device found, after each row passes a correctness gate
(its smallest conformance fixtures on that device). Built on pytest-benchmark.

Modules, in the order a run uses them: ``__main__`` (the command line), ``devices`` (the
machine, resolved once: device, each framework's device, memory, TF32, environment),
``workloads`` (grids, FLOP counts, bytes), ``plan`` (the cases of a run: grid x rows, what
cannot run and why, each goal resolved), ``rows`` (the registry: one line per row), ``gate``
(conformance quick check, ``--gates-only``), ``session`` (the pytest plugin that runs a plan),
``bench_attention`` (its pytest-benchmark tests), ``preparers`` (one per call style: what a row
computes), ``frameworks`` (each framework's inputs, timed call and memory probe), ``peak`` (the
peak matmul), ``goals`` (interleaved timing), ``errors`` (unsupported, oom or error),
``records`` (what a case ends as), ``report`` (derived numbers, goals, the table), ``plots``
(PNG), ``compare`` (two saved runs). See docs/BENCH.md.
"""
