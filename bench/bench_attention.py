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
        from bench.devices import configure_environment, resolve
        from bench.gate import GateCache
        from bench.plan import make_plan
        from bench.workloads import grids

        configure_environment(own_session=False)
        machine = resolve(config.getoption("--bench-device"))
        grid_name = config.getoption("--bench-grid")
        plan = make_plan(machine, grid_name, grids(machine.device, grid_name),
                         rows=config.getoption("--bench-rows"))
        gates = GateCache(skip=config.getoption("--bench-skip-gate"))
        config.stash[SESSION_KEY] = BenchSession(plan, gates=gates)
    return config.stash[SESSION_KEY]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for name in ("case", "goal_case"):
        if name in metafunc.fixturenames:
            session = _session(metafunc.config)
            cases = session.plan.cases if name == "case" else session.plan.goal_cases
            metafunc.parametrize(name, cases, ids=[c.id for c in cases])


def test_attention(benchmark, case, request) -> None:
    """Gate, warm up, measure memory and time one case (see BenchSession.run_case)."""
    request.config.stash[SESSION_KEY].run_case(case, benchmark)


def test_goal(goal_case, request) -> None:
    """Gate both calls of a goal and time them interleaved (see BenchSession.run_goal)."""
    request.config.stash[SESSION_KEY].run_goal(goal_case)
