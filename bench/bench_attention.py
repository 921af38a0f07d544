"""The pytest-benchmark tests behind ``python -m bench``: one test per case of the plan, then
one per performance goal (its two calls timed interleaved).

Not collected by ``make test`` (the file name does not match ``test_*.py``). Run it through
``python -m bench``, or directly for pytest-benchmark's own workflow, e.g.::

    pytest bench/bench_attention.py --bench-device cpu --bench-grid quick --benchmark-autosave
    pytest bench/bench_attention.py --bench-rows "torch" --benchmark-compare
"""

from __future__ import annotations

import pytest

from bench.session import SESSION_KEY, BenchSession


def _session(config: pytest.Config) -> BenchSession:
    """``python -m bench``'s session, or (plain pytest) one built from the ``--bench-*``
    options of ``bench/conftest.py``, with the environment JAX needs set first."""
    if SESSION_KEY not in config.stash:
        from bench.__main__ import make_session
        from bench.devices import configure_environment

        configure_environment(own_session=False)
        config.stash[SESSION_KEY] = make_session(
            config.getoption("--bench-device"),
            config.getoption("--bench-grid"),
            rows=config.getoption("--bench-rows"),
            skip_gate=config.getoption("--bench-skip-gate"),
        )
    return config.stash[SESSION_KEY]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for name in ("case", "goal_case"):
        if name in metafunc.fixturenames:
            session = _session(metafunc.config)
            cases = session.cases if name == "case" else session.goal_cases
            metafunc.parametrize(name, cases, ids=[c.id for c in cases])


def test_attention(benchmark, case, request) -> None:
    """Gate, warm up, measure memory and time one case (see BenchSession.run_case)."""
    request.config.stash[SESSION_KEY].run_case(case, benchmark)


def test_goal(goal_case, request) -> None:
    """Gate both calls of a goal and time them interleaved (see BenchSession.run_goal)."""
    request.config.stash[SESSION_KEY].run_goal(goal_case)
