"""The conformance suite of Rosetta Attention: golden fixtures and a runner for any port.

- :mod:`conformance.oracle`: the float64 oracle the goldens come from (and the plain same-dtype
  computation that sets each case's tolerance);
- :mod:`conformance.cases`: the case list, readable code, one registry split by op;
- :mod:`conformance.generate`: ``python -m conformance.generate --out|--check DIR``;
- :mod:`conformance.runner`: applies the fixtures to a port; ``python -m conformance --impl M``
  (each port in a child process, :mod:`conformance.worker`, so a crash is one failed case);
  ``python -m conformance --exec CMD`` checks an executable in any language the same way;
- :mod:`conformance.pytest_plugin`: the same runs as pytest items,
  ``pytest --pyargs conformance --port M`` (a ``pytest11`` entry point; it imports nothing
  until given a port);
- :mod:`conformance.ports`: adapters for non-NumPy ports and the frameworks' own kernels, and
  ``conformance/ports/js/``, an example port in JavaScript for ``--exec``.

See conformance/PORTING.md to check a port of your own, conformance/FORMAT.md for the fixture
format, and docs/CONFORMANCE.md.
"""

from conformance.fixtures import FIXTURES_DIR, load_manifest
from conformance.runner import (
    FUNCTIONS,
    Outcome,
    Port,
    QuickCheckResult,
    Report,
    Xfails,
    load_port,
    plan_runs,
    quick_check,
    run_suite,
    runs_for,
)

__all__ = [
    "FIXTURES_DIR",
    "FUNCTIONS",
    "Outcome",
    "Port",
    "QuickCheckResult",
    "Report",
    "Xfails",
    "load_manifest",
    "load_port",
    "plan_runs",
    "quick_check",
    "run_suite",
    "runs_for",
]
