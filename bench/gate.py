"""The correctness gate: a row is timed only after its smallest conformance fixtures pass.

Before the first timing of a row on a device, the harness calls
``conformance.quick_check(port, device=..., op=..., n_cases=8)`` on the row's port (the
implementation package, or ``conformance.ports.torch_fused`` / ``jax_fused`` for the
frameworks' kernels). A row whose gate does not pass, or whose gate cannot run at all, is
reported as failed and never timed: a fast wrong answer is not a result.
"""

from __future__ import annotations

import importlib
import time
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["GATE_CASES", "GateCache", "GateResult", "run_gate"]

#: How many of the smallest fixtures the gate runs per (port, op, device).
GATE_CASES = 8


@dataclass(frozen=True)
class GateResult:
    """What the gate said.

    ``status``: ``passed``, ``failed`` (a fixture disagreed), ``error`` (the gate could not
    run, or ran nothing) or ``skipped`` (``--skip-gate``: timed, marked ungated).
    """

    status: str
    port: str
    op: str
    device: str
    n_run: int = 0
    n_failed: int = 0
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the row may be timed."""
        return self.status in ("passed", "skipped")

    def text(self) -> str:
        """Short form for the table: ``8/8 ok``, ``FAIL 3/8``, ``error``, ``ungated``."""
        if self.status == "passed":
            return f"{self.n_run}/{self.n_run} ok"
        if self.status == "failed":
            return f"FAIL {self.n_failed}/{self.n_run}"
        return "ungated" if self.status == "skipped" else "error"

    def to_dict(self) -> dict:
        return asdict(self)


def _describe(failure: Any) -> str:
    """One line for a failure object of any shape (str, dataclass, exception)."""
    for attr in ("case_id", "id", "case"):
        if hasattr(failure, attr):
            rest = getattr(failure, "message", None) or getattr(failure, "reason", None) or ""
            return f"{getattr(failure, attr)}: {rest}".rstrip(": ")
    return str(failure).splitlines()[0] if str(failure) else repr(failure)


def run_gate(
    port: str,
    op: str,
    device: str,
    *,
    quick_check: Callable[..., Any] | None = None,
    n_cases: int = GATE_CASES,
    overlay: dict[str, Any] | None = None,
) -> GateResult:
    """Run the conformance quick check of ``port`` (a module path) for ``op`` on ``device``.

    ``overlay`` adds attributes to the port (e.g. ``flash_attention`` from ``impl_torch.flash``
    while the package does not export it yet); the port keeps its module name, so conformance
    still finds its array adapters. ``quick_check`` defaults to ``conformance.quick_check``;
    tests pass a stand-in. Never raises: every problem becomes a non-passing result.
    """
    t0 = time.perf_counter()

    def result(status: str, **kw: Any) -> GateResult:
        return GateResult(status, port, op, device, seconds=time.perf_counter() - t0, **kw)

    try:
        if quick_check is None:
            quick_check = importlib.import_module("conformance").quick_check
        port_module: Any = importlib.import_module(port)
        if overlay:
            port_module = types.SimpleNamespace(**{**vars(port_module), **overlay})
    except (ImportError, AttributeError) as e:
        return result("error", detail=f"cannot load the gate: {type(e).__name__}: {e}")
    try:
        report = quick_check(port_module, device=device, op=op, n_cases=n_cases)
    except Exception as e:  # the gate crashed: not a pass
        return result("error", detail=f"quick_check raised {type(e).__name__}: {e}")
    failures = list(getattr(report, "failures", ()) or ())
    n_run = int(getattr(report, "n_run", 0))
    if bool(getattr(report, "ok", False)) and not failures and n_run > 0:
        return result("passed", n_run=n_run)
    if n_run == 0 and not failures:
        return result("error", detail=f"no {op} fixtures ran on {device}")
    detail = "; ".join(_describe(f) for f in failures[:3]) or "quick_check reported not ok"
    return result("failed", n_run=n_run, n_failed=len(failures) or n_run, detail=detail)


class GateCache:
    """One gate run per (port, op, device) per process; ``skip=True`` marks all ungated."""

    def __init__(self, *, skip: bool = False, quick_check: Callable[..., Any] | None = None):
        self.skip = skip
        self.quick_check = quick_check
        self.results: dict[tuple[str, str, str], GateResult] = {}

    def check(
        self, port: str, op: str, device: str, *, overlay: dict[str, Any] | None = None
    ) -> GateResult:
        key = (port, op, device)
        if key not in self.results:
            if self.skip:
                self.results[key] = GateResult("skipped", port, op, device, detail="--skip-gate")
            else:
                self.results[key] = run_gate(
                    port, op, device, quick_check=self.quick_check, overlay=overlay
                )
        return self.results[key]
