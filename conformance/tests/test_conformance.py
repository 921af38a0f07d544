"""The golden fixtures against impl_numpy, impl_torch and impl_jax, one test per run.

Test ids read ``<impl>-<run id>``, e.g. ``numpy-sdpa.gqa.h6_k2.float32`` or
``jax-weights.fully_masked.bool_row.bfloat16``. Optional functions (``flash_attention``) are
run for an implementation as soon as it exports them. The same runs, with a table, are
``python -m conformance --impl impl_numpy --impl impl_torch --impl impl_jax``.
"""

from __future__ import annotations

import pytest

from conformance.runner import Port, Run, check, load_port, runs_for, select_functions

IMPLS = {"numpy": "impl_numpy", "torch": "impl_torch", "jax": "impl_jax"}
_PORTS: dict[str, Port] = {}


def _params():
    for short, module in IMPLS.items():
        try:
            _PORTS[short] = port = load_port(module)
        except ImportError as exc:  # a framework not installed: skip its runs, not the others
            reason = f"{module} not importable: {exc}"
            yield pytest.param(short, None, id=f"{short}-import", marks=pytest.mark.skip(reason))
            continue
        for run in runs_for(functions=select_functions(port, None)):
            yield pytest.param(short, run, id=f"{short}-{run.id}")


@pytest.mark.parametrize(("impl", "run"), list(_params()))
def test_conformance(impl: str, run: Run) -> None:
    outcome = check(_PORTS[impl], run, "cpu")
    if outcome.status == "xfail":
        pytest.xfail(outcome.message)
    assert outcome.ok, outcome.line()
