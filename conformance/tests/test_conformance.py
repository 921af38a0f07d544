"""The golden fixtures against impl_numpy, impl_torch and impl_jax, one test per run.

Test ids read ``<impl>-<run id>``, e.g. ``numpy-sdpa.gqa.h6_k2.float32`` or
``jax-decode.gqa.h6_k2.tokens.bfloat16``. Optional functions (``flash_attention``) are run for an
implementation as soon as it exports them. The same runs, with a table, are
``python -m conformance --impl impl_numpy --impl impl_torch --impl impl_jax``.

Three subsets are left to that command:

- JAX's token-by-token decode runs in float64, float16 and bfloat16. The JAX KV cache's position
  is static, so every decode step compiles once (about 0.3 s on a loaded 2-core machine; 60
  compilations for those 12 runs); here JAX decodes token by token in float32, and in uneven
  chunks (which also decode single tokens at a cached position) in every dtype.
- The sharded runs of torch and JAX (``ring``, ``ring_zigzag``, ``head_parallel``,
  ``head_parallel_gqa``). torch's need n processes per call and JAX's n devices, which JAX sees
  only if told before it starts; tests/test_sharded.py runs the same checks of the runner in a
  gloo group of 2 and of 4 processes (every torch run) and on 8 simulated JAX devices (a chosen
  list: one compilation each).
- JAX's tiled backward (``flash_grad``) in float64, float16 and bfloat16 (42 runs), and its plain
  ``grad`` in float16 and bfloat16 (32 runs): each run compiles a forward and a backward (the
  ``custom_vjp``'s two scans: several seconds); here every ``flash_grad`` case runs in float32
  and every ``grad`` case in float32 and float64.

NumPy runs everything. JAX's runs in float64, float16 and bfloat16 (the rest of them) are marked
``slow``: ``make test-slow`` runs them (:data:`IN_TEST_SLOW`).
"""

from __future__ import annotations

import fnmatch

import pytest

from conformance.runner import (
    RELEASE_EVERY,
    SHARDED_ALIASES,
    Port,
    Run,
    check,
    load_port,
    release_compiled_programs,
    runs_for,
    select_functions,
)

IMPLS = {"numpy": "impl_numpy", "torch": "impl_torch", "jax": "impl_jax"}
#: (implementation, glob over run ids): runs left to ``make conformance`` (see the docstring).
LEFT_TO_THE_CLI = [("jax", f"decode.*.tokens.{d}") for d in ("float64", "float16", "bfloat16")]
LEFT_TO_THE_CLI += [(fw, f"{alias}.*") for fw in ("torch", "jax") for alias in SHARDED_ALIASES]
LEFT_TO_THE_CLI += [("jax", f"flash_grad.*.{d}") for d in ("float64", "float16", "bfloat16")]
LEFT_TO_THE_CLI += [("jax", f"grad.*.{d}") for d in ("float16", "bfloat16")]
_PORTS: dict[str, Port] = {}


#: JAX's runs in the dtypes other than float32 (and causal_mask's bool): each compiles its own
#: program, about 430 runs and 75 s of a fresh clone's `make test` on 2 cores (a warm one reads
#: them from the persistent compilation cache); they run in `make test-slow`, which CI runs too.
IN_TEST_SLOW = ("jax", ("float64", "float16", "bfloat16"))


def _in_test_slow(short: str, run_id: str) -> bool:
    return short == IN_TEST_SLOW[0] and run_id.rsplit(".", 1)[-1] in IN_TEST_SLOW[1]


def _left_out(short: str, run_id: str) -> bool:
    return any(short == s and fnmatch.fnmatchcase(run_id, g) for s, g in LEFT_TO_THE_CLI)


def _params():
    for short, module in IMPLS.items():
        try:
            _PORTS[short] = port = load_port(module)
        except ImportError as exc:  # a framework not installed: skip its runs, not the others
            reason = f"{module} not importable: {exc}"
            yield pytest.param(short, None, id=f"{short}-import", marks=pytest.mark.skip(reason))
            continue
        for run in runs_for(functions=select_functions(port, None)):
            if _left_out(short, run.id):
                continue
            slow = [pytest.mark.slow] if _in_test_slow(short, run.id) else []
            yield pytest.param(short, run, id=f"{short}-{run.id}", marks=slow)


#: Runs made in this process: the JAX programs they compiled are dropped every RELEASE_EVERY
#: (conformance/runner/release.py), as the command line's child process does.
_MADE = [0]


@pytest.mark.parametrize(("impl", "run"), list(_params()))
def test_conformance(impl: str, run: Run) -> None:
    outcome = check(_PORTS[impl], run, "cpu")
    _MADE[0] += 1
    if _MADE[0] % RELEASE_EVERY == 0:
        release_compiled_programs()
    if outcome.status == "xfail":
        pytest.xfail(outcome.message)
    if outcome.status == "skip":
        pytest.skip(outcome.message)
    assert outcome.ok, outcome.line()
