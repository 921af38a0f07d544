"""The pytest-benchmark test behind ``python -m bench``: one test, parametrized over the plan.

Not collected by ``make test`` (the file name does not match ``test_*.py`` and ``bench/`` is
not in testpaths). Run it through ``python -m bench``, or directly for pytest-benchmark's own
workflow, e.g.::

    pytest bench/bench_attention.py --bench-device cpu --bench-grid quick --benchmark-autosave
    pytest bench/bench_attention.py --bench-rows "torch" --benchmark-compare
"""

from __future__ import annotations

import pytest

from bench.session import SESSION_KEY


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "case" in metafunc.fixturenames:
        cases = metafunc.config.stash[SESSION_KEY].cases
        metafunc.parametrize("case", cases, ids=[c.id for c in cases])


def test_attention(benchmark, case, request) -> None:
    """Gate, warm up, measure memory and time one case (see BenchSession.run_case)."""
    request.config.stash[SESSION_KEY].run_case(case, benchmark)
