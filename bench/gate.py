"""The correctness gate: a row is timed only after its conformance fixtures pass on the device.

Before the first timing of a row on a device, the harness checks the row's port there:

- a row gated on its port as is (the project's packages, torch's default dispatch, JAX's XLA
  path): ``conformance.quick_check(port, device=..., op=..., n_cases=8)``, the 8 smallest
  fixtures of the op;
- a row pinned to one kernel (``Row.gate_pin``: torch's flash, efficient, cuDNN or math SDPA
  backend, JAX's cuDNN attention): the port with that kernel forced
  (``conformance.ports.torch_fused.pinned(backend)``, ``jax_fused.pinned("cudnn")``) on the
  float16/bfloat16 fixtures whose head dims the fused kernels take (D = E, a multiple of 8, at
  most 128: the ``sdpa.kernel.*`` cases). The 8 smallest fixtures (float32/float64, D = 11 or
  2) never reach those kernels. A fixture the kernel rejects in its own words
  (``errors.UNSUPPORTED``) is *unsupported*, not failed; a gate whose every fixture is
  unsupported makes the row's cases unsupported.

A row whose gate does not pass, or cannot run at all, is reported failed and never timed: a
fast wrong answer is not a result.

``python -m bench --gates-only`` is :func:`gates_only`: every distinct gate of the chosen rows
(:func:`run_gates`), one line each as it finishes, ``gates.json``, then the gates' table. How a
gate reads (:func:`gate_text`) is the same there and in the report's gate column.

Every gate runs with IEEE float32 matmuls (torch TF32 off, JAX HIGHEST) whatever ``--tf32``
says, and with ``jax_enable_x64`` on (float64 is one of the fixtures' dtypes) and put back after,
so the timed rows keep the x64 setting the run started with.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.devices import Machine
from bench.errors import UNSUPPORTED

__all__ = [
    "GATE_CASES",
    "SHARDED_OPS",
    "GateCache",
    "GateResult",
    "gate_line",
    "gate_scope",
    "gate_text",
    "gates_only",
    "kernel_case",
    "render_gates",
    "run_gate",
    "run_gates",
]

#: The sharded rows' gate aliases (bench/sharded.py), run on 4 devices in the rows' child.
SHARDED_OPS = ("ring", "ulysses", "usp")
#: How many fixtures the gate runs per (port, op, device, pin).
GATE_CASES = 8
#: The port a pinned gate's kernel belongs to (for its "not supported" messages).
_PIN_KERNEL = {"conformance.ports.torch_fused": "torch_sdpa", "conformance.ports.jax_fused":
               "jax_cudnn"}


@dataclass(frozen=True)
class GateResult:
    """What the gate said.

    ``status``: ``passed``, ``failed`` (a fixture disagreed), ``error`` (the gate could not
    run, or ran nothing), ``unsupported`` (the pinned kernel rejected every fixture) or
    ``skipped`` (``--skip-gate``: timed, marked ungated).
    """

    status: str
    port: str
    op: str
    device: str
    pin: str | None = None
    n_run: int = 0
    n_failed: int = 0
    n_unsupported: int = 0
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether the row may be timed."""
        return self.status in ("passed", "skipped")

    def to_dict(self) -> dict:
        return asdict(self)


def kernel_case(case: Any) -> bool:
    """A value fixture of ``sdpa`` the GPU fused kernels take: float16 or bfloat16 inputs and
    D = E, a multiple of 8, at most 128 (flash, memory-efficient and cuDNN SDPA alike)."""
    if case.kind != "values" or "sdpa" not in case.functions:
        return False
    if case.dtype not in ("float16", "bfloat16"):
        return False
    shapes = case.entry["shapes"]
    d, e = shapes["query"][-1], shapes["value"][-1]
    return d == e and d % 8 == 0 and 0 < d <= 128


@contextlib.contextmanager
def gate_scope() -> Iterator[None]:
    """IEEE float32 matmuls and ``jax_enable_x64`` inside the block; both put back after.

    The JAX adapter of conformance turns x64 on when it is first imported (inside a gate);
    restoring it here keeps the rows in the x64 state the run started with.
    """
    from conformance.ports.precision import ieee_float32

    with contextlib.ExitStack() as stack:
        try:
            import jax
        except Exception:  # no JAX here: nothing to scope
            jax = None
        if jax is not None:
            saved = bool(jax.config.jax_enable_x64)
            jax.config.update("jax_enable_x64", True)
            stack.callback(jax.config.update, "jax_enable_x64", saved)
        stack.enter_context(ieee_float32())
        yield


def _describe(failure: Any) -> str:
    """One line for a failure object of any shape (str, dataclass, exception)."""
    for attr in ("run_id", "case_id", "id", "case"):
        if hasattr(failure, attr):
            rest = getattr(failure, "message", None) or getattr(failure, "reason", None) or ""
            return f"{getattr(failure, attr)}: {rest}".rstrip(": ")
    return str(failure).splitlines()[0] if str(failure) else repr(failure)


def _unsupported(kernel: str | None, outcome: Any) -> bool:
    """Whether a failed outcome's message carries the kernel's own "not supported" (the
    exception's class name and its words, wherever conformance puts them in the message)."""
    message = getattr(outcome, "message", "") or ""
    return any(
        re.search(rf"\b{name}\b", message) and re.search(pattern, message)
        for name, pattern in UNSUPPORTED.get(kernel or "", ())
    )


def _sharded_report(port: str, op: str, device: str, n_cases: int) -> Any:
    """A sharded alias (``ring``, ``ulysses``, ``usp``: the sharded rows, bench/sharded.py) on
    its ``n_cases`` smallest fixtures at n = 4 devices, run where the row is timed: in the
    bench's child with 4 JAX host devices, or on its 4 gloo ranks (this process's JAX has one
    device; the timed rows and their check share one group of ranks, where conformance's
    torch adapter would fork ranks per call). The report reads as ``quick_check``'s."""
    from bench.sharded import run_fixtures
    from bench.workloads import SHARDS
    from conformance import QuickCheckResult, load_port, plan_runs

    runs = [r for r in plan_runs(load_port(port), functions=[op], shards=(SHARDS,))
            if r.case.kind == "values"]
    runs.sort(key=lambda r: (r.case.n_elements, r.id))
    n_run, failures = run_fixtures(port, op, [r.id for r in runs[:n_cases]])
    return QuickCheckResult(not failures, n_run, failures, port, device)


def _pinned_report(
    port: str, pin: str, op: str, device: str, run_suite: Callable[..., Any], n_cases: int
) -> GateResult:
    """The pinned kernel on the kernel fixtures; ``unsupported`` outcomes counted apart."""
    t0 = time.perf_counter()
    module = importlib.import_module(port).pinned(pin)
    chosen: list[str] = []

    def select(run: Any) -> bool:  # the first n_cases kernel fixtures (manifest order)
        if run.function == op and kernel_case(run.case) and len(chosen) < n_cases:
            chosen.append(run.id)
            return True
        return False

    report = run_suite(module, device=device, functions=[op], select=select)
    if getattr(report, "error", ""):
        raise RuntimeError(f"the pinned port did not load: {report.error}")
    kernel = _PIN_KERNEL.get(port)
    outcomes = list(report.outcomes)
    bad = [o for o in outcomes if o.status == "fail" and not _unsupported(kernel, o)]
    unsupported = [o for o in outcomes if o.status == "fail" and _unsupported(kernel, o)]
    n_run = len(outcomes)
    seconds = time.perf_counter() - t0
    kw = dict(port=port, op=op, device=device, pin=pin, n_run=n_run, seconds=seconds)
    if n_run == 0:
        return GateResult("error", detail=f"no {op} kernel fixtures ran on {device}", **kw)
    if bad:
        detail = "; ".join(_describe(o) for o in bad[:3])
        return GateResult("failed", n_failed=len(bad), n_unsupported=len(unsupported),
                          detail=detail, **kw)
    if len(unsupported) == n_run:
        detail = f"{pin} has no kernel for any gate fixture: {_describe(unsupported[0])}"
        return GateResult("unsupported", n_unsupported=n_run, detail=detail, **kw)
    detail = "; ".join(f"unsupported {_describe(o)}" for o in unsupported[:2])
    return GateResult("passed", n_unsupported=len(unsupported), detail=detail, **kw)


def run_gate(
    port: str,
    op: str,
    device: str,
    *,
    pin: str | None = None,
    quick_check: Callable[..., Any] | None = None,
    run_suite: Callable[..., Any] | None = None,
    n_cases: int = GATE_CASES,
) -> GateResult:
    """Check ``port`` (a module path) for ``op`` on ``device``, ``pin`` forced if given.

    ``quick_check`` / ``run_suite`` default to conformance's; tests pass stand-ins. Runs in
    :func:`gate_scope`. Never raises: every problem becomes a non-passing result.
    """
    t0 = time.perf_counter()

    def result(status: str, **kw: Any) -> GateResult:
        return GateResult(status, port, op, device, pin, seconds=time.perf_counter() - t0, **kw)

    try:
        conformance = importlib.import_module("conformance")
        quick_check = quick_check or conformance.quick_check
        run_suite = run_suite or conformance.run_suite
    except (ImportError, AttributeError) as e:
        return result("error", detail=f"cannot load the gate: {type(e).__name__}: {e}")
    try:
        with gate_scope():
            if pin is not None:
                return _pinned_report(port, pin, op, device, run_suite, n_cases)
            if op in SHARDED_OPS:  # needs 4 devices: conformance's isolated child
                report = _sharded_report(port, op, device, n_cases)
            else:
                port_module = importlib.import_module(port)
                report = quick_check(port_module, device=device, op=op, n_cases=n_cases)
    except (ImportError, AttributeError) as e:
        return result("error", detail=f"cannot load the gate: {type(e).__name__}: {e}")
    except Exception as e:  # the gate crashed: not a pass
        return result("error", detail=f"the gate raised {type(e).__name__}: {e}")
    failures = list(getattr(report, "failures", ()) or ())
    n_run = int(getattr(report, "n_run", 0))
    if bool(getattr(report, "ok", False)) and not failures and n_run > 0:
        return result("passed", n_run=n_run)
    if n_run == 0 and not failures:
        return result("error", detail=f"no {op} fixtures ran on {device}")
    detail = "; ".join(_describe(f) for f in failures[:3]) or "quick_check reported not ok"
    return result("failed", n_run=n_run, n_failed=len(failures) or n_run, detail=detail)


class GateCache:
    """One gate run per (port, op, device, pin) per process; ``skip=True`` marks all ungated."""

    def __init__(
        self,
        *,
        skip: bool = False,
        quick_check: Callable[..., Any] | None = None,
        run_suite: Callable[..., Any] | None = None,
    ) -> None:
        self.skip = skip
        self.quick_check = quick_check
        self.run_suite = run_suite
        self.results: dict[tuple[str, str, str, str | None], GateResult] = {}

    def check(self, port: str, op: str, device: str, pin: str | None = None) -> GateResult:
        key = (port, op, device, pin)
        if key not in self.results:
            if self.skip:
                self.results[key] = GateResult(
                    "skipped", port, op, device, pin, detail="--skip-gate"
                )
            else:
                self.results[key] = run_gate(
                    port, op, device, pin=pin, quick_check=self.quick_check,
                    run_suite=self.run_suite,
                )
        return self.results[key]


def run_gates(
    machine: Machine,
    rows: tuple[Any, ...],
    gates: GateCache | None = None,
    *,
    on_result: Callable[[dict], None] | None = None,
    deadline: float | None = None,
) -> list[dict]:
    """Every distinct gate of ``rows`` (``bench.rows.Row``) on ``machine`` (rows meant for its
    device, whose framework runs there and whose code exists), each once; returns the gate
    dicts with the rows they cover. ``on_result`` sees each as it finishes; past ``deadline``
    (``time.monotonic()``) the rest are ``not run``."""
    gates = gates or GateCache()
    covered: dict[tuple, list[str]] = {}
    for row in rows:
        if machine.device not in row.devices or machine.fdevices.get(row.framework) is None:
            continue
        try:
            row.resolve()
        except Exception:  # a missing row has no gate to run
            continue
        key = (row.gate_port, row.gate_alias, machine.classes[row.framework], row.gate_pin)
        covered.setdefault(key, []).append(row.name)
    out = []
    for key, names in covered.items():
        if deadline is not None and time.monotonic() > deadline:
            port, op, dev, pin = key
            g = {"status": "not run", "port": port, "op": op, "device": dev, "pin": pin,
                 "n_run": 0, "n_failed": 0, "n_unsupported": 0, "seconds": 0.0,
                 "detail": "the time budget (--budget-s) was spent"}
        else:
            g = gates.check(*key).to_dict()
        out.append({**g, "rows": names})
        if on_result is not None:
            on_result(out[-1])
    return out


def gates_only(
    machine: Machine,
    rows: tuple[Any, ...],
    out: Path | None,
    budget_s: float | None,
    console: Any,
) -> int:
    """``python -m bench --gates-only``: every gate of ``rows`` on ``machine``, one line per
    gate as it finishes (``out/gates.json`` rewritten each time, so a killed run leaves what it
    had), then the table (:func:`render_gates`). No gate starts after ``budget_s`` seconds.
    Returns the exit status: 1 when a gate failed, raised or was not run, else 0."""
    from rich.markup import escape

    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    done: list[dict] = []

    def on_result(g: dict) -> None:
        done.append(g)
        console.print(escape(gate_line(g)))
        if out is not None:
            (out / "gates.json").write_text(json.dumps(done, indent=1))

    deadline = time.monotonic() + budget_s if budget_s is not None else None
    results = run_gates(machine, rows, on_result=on_result, deadline=deadline)
    render_gates(results, machine.device, console)
    if out is not None:
        console.print(f"gates: {out / 'gates.json'}")
    return 1 if any(g["status"] in ("failed", "error", "not run") for g in results) else 0


def gate_text(gate: dict) -> str:
    """A gate dict in a few words (the report's gate column, the gates' table): ``8/8 ok``
    (``4/6 ok`` when 2 were unsupported), ``FAIL 3/8``, ``unsupported``, ``error``,
    ``ungated``."""
    status = gate["status"]
    if status == "passed":
        n_ok = gate["n_run"] - gate.get("n_unsupported", 0)
        return f"{n_ok}/{gate['n_run']} ok"
    if status == "failed":
        return f"FAIL {gate['n_failed']}/{gate['n_run']}"
    return {"skipped": "ungated", "unsupported": "unsupported", "not run": "not run"}.get(
        status, "error"
    )


def gate_line(gate: dict) -> str:
    """``--gates-only``'s line for a finished gate: ``  8/8 ok  impl_numpy sdpa  (1.2 s)``."""
    pin = gate["pin"] or ""
    return f"{gate_text(gate):>12}  {gate['port']} {gate['op']} {pin} ({gate['seconds']:.1f} s)"


def render_gates(gates: list[dict], device: str, console: Any) -> None:
    """Print ``--gates-only``'s table: one line per gate (:func:`run_gates`) to ``console``."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"correctness gates on {device} (IEEE float32 matmuls)", title_justify="left")
    for col in ("port", "op", "pin", "device", "gate", "s", "rows", "detail"):
        t.add_column(col)
    for g in gates:
        style = {"passed": "green", "unsupported": "dim"}.get(g["status"], "red")
        cell = gate_text(g)
        t.add_row(
            escape(g["port"]), g["op"], g["pin"] or "", g["device"],
            f"[{style}]{escape(cell)}[/]", f"{g['seconds']:.1f}",
            escape(", ".join(g["rows"])), escape(g["detail"][:200]),
        )
    console.print(t)
