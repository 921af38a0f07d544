"""Apply the golden fixtures to any port and report, per case, pass or fail with the numbers.

A *port* is a module (or any object) exposing the public names of SEMANTICS.md. Each fixture
is run against one or more of its functions, named here by a short alias:

=========== ================================ ============================================
alias       port attribute                   checked against
=========== ================================ ============================================
sdpa        ``scaled_dot_product_attention`` the golden output
weights     ``attention_weights``            the golden weights
causal_mask ``causal_mask``                  the golden boolean (L, S) mask, exactly
flash       ``flash_attention``              the golden output (optional; called with
                                             ``block_q=2, block_k=3`` unless the case
                                             gives its own block sizes)
module      ``GroupedQueryAttention``,       the golden output (and weights) of a module
            ``MultiHeadAttention``           loaded with ``from_canonical``
decode      ``GroupedQueryAttention``,       the golden rows of one full causal forward,
            ``MultiHeadAttention``           step by step through ``init_cache``/``decode``
=========== ================================ ============================================

One fixture and one function make one *run*, with the id ``<alias>.<feature>[.<variant>].
<dtype>`` (``weights.gqa.h6_k2.float32`` runs the fixture ``sdpa.gqa.h6_k2.float32`` against
``attention_weights``). A run passes when the port's result has the golden's shape and the
input dtype, and its max error against the float64 golden is at most the manifest's bound;
an error case passes when the call raises an exception whose class (or a base class) has the
expected name and whose ``.code`` is the expected code.

A missing function (or module class, or module method) makes each of its runs fail as "not
implemented", one line each. Optional functions (``flash``) are run only when the port has them
or when they are asked for.

Modules are loaded through the one documented loading function,
``<class>.from_canonical(weights, *, n_heads, n_kv_heads, dtype)`` with the canonical weights as
NumPy arrays (plus ``device=`` when the function takes it), and called as
``module(x, context, **keywords)`` and ``module.decode(x, cache, **keywords)`` after
``cache = module.init_cache(batch_size, max_len)``. Those two calls go through the port's
``prepare`` hook like every function (aliases ``module`` and ``decode``: the JAX adapter
``nnx.jit``s them).

Known failures live in the port's xfails file (see :class:`Xfails`); a listed run that passes
is reported as XPASS and counts as a failure, so the list stays true.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import json
import math
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from conformance.fixtures import NP_DTYPES, Case, Manifest, load_manifest
from conformance.ports import BUILTIN_ADAPTERS, SHORT_NAMES

__all__ = [
    "FUNCTIONS",
    "Outcome",
    "Port",
    "QuickCheckResult",
    "Report",
    "Run",
    "Xfails",
    "check",
    "load_port",
    "quick_check",
    "run_suite",
    "runs_for",
]


@dataclass(frozen=True)
class Function:
    """A port function the suite knows: its attribute name and whether every port needs it.

    For the module aliases the attribute is the module class the port must have; the function
    run is the runner's own call (:func:`module_forward`, :func:`module_decode`).
    """

    attribute: str
    required: bool
    call: Callable[..., Any] | None = None


def module_forward(module: Any, x: Any, context: Any = None, **keywords: Any) -> Any:
    """The runner's module call: ``module(x, context, **keywords)`` (wrapped by ``prepare``)."""
    return module(x, context, **keywords)


def module_decode(module: Any, x: Any, cache: Any, **keywords: Any) -> Any:
    """The runner's decode step: ``module.decode(x, cache, **keywords)`` (wrapped by
    ``prepare``); returns ``(y, cache)`` or ``(y, weights, cache)``."""
    return module.decode(x, cache, **keywords)


#: Alias -> port function. A new op adds a row here and a checker below.
FUNCTIONS: dict[str, Function] = {
    "sdpa": Function("scaled_dot_product_attention", required=True),
    "weights": Function("attention_weights", required=True),
    "causal_mask": Function("causal_mask", required=True),
    "flash": Function("flash_attention", required=False),
    "module": Function("GroupedQueryAttention", required=True, call=module_forward),
    "decode": Function("GroupedQueryAttention", required=True, call=module_decode),
}


#: Block sizes passed to ``flash_attention``: small and dividing neither L nor S of the fixtures
#: (L, S in 0..9), so every fixture spans several query and key blocks, with ragged last blocks.
FLASH_BLOCKS: dict[str, int] = {"block_q": 2, "block_k": 3}

# ---------------------------------------------------------------------------------------------
# Ports
# ---------------------------------------------------------------------------------------------


class Xfails:
    """A port's known failures: one glob over run ids per line, ``#`` starts the reason.

    ::

        # torch_fused.xfails
        causal_mask.*            # torch has no public causal-mask function
        cuda: sdpa.foo.float16   # only on that device
    """

    def __init__(self, entries: Sequence[tuple[str, str | None, str]] = ()) -> None:
        self.entries = list(entries)  # (pattern, device or None, reason)

    @classmethod
    def parse(cls, text: str) -> Xfails:
        entries = []
        for line in text.splitlines():
            body, _, reason = line.partition("#")
            body = body.strip()
            if not body:
                continue
            device = None
            if ":" in body.split()[0]:
                device, _, body = body.partition(":")
                device, body = device.strip(), body.strip()
            entries.append((body, device, reason.strip()))
        return cls(entries)

    @classmethod
    def from_file(cls, path: str | Path) -> Xfails:
        return cls.parse(Path(path).read_text())

    def __add__(self, other: Xfails) -> Xfails:
        return Xfails(self.entries + other.entries)

    def reason(self, run_id: str, device: str) -> str | None:
        """The reason a run is expected to fail on ``device``, or None."""
        for pattern, dev, reason in self.entries:
            if (dev is None or device.split(":")[0] == dev) and fnmatch.fnmatchcase(
                run_id, pattern
            ):
                return reason or "listed in xfails"
        return None


@dataclass
class Port:
    """A module plus the adapters that carry NumPy arrays in and out of it.

    ``prepare(alias, function)``, when the port or its adapter defines it, wraps each function
    once before use (the JAX adapter jits it).
    """

    name: str
    module: Any
    from_numpy: Callable[[np.ndarray, str], Any]
    to_numpy: Callable[[Any], np.ndarray]
    xfails: Xfails = field(default_factory=Xfails)
    numpy_native: bool = True
    prepare: Callable[[str, Callable[..., Any]], Callable[..., Any]] | None = None
    _prepared: dict[str, Any] = field(default_factory=dict, repr=False)

    def function(self, alias: str) -> Callable[..., Any] | None:
        """The port's function for ``alias``, or None when the port does not have it.

        For ``module`` and ``decode``: the runner's call of the module (prepared once), or None
        when the port has no ``GroupedQueryAttention``.
        """
        if alias not in self._prepared:
            spec = FUNCTIONS[alias]
            fn = getattr(self.module, spec.attribute, None)
            if fn is not None and spec.call is not None:
                fn = spec.call
            if fn is not None and self.prepare is not None:
                fn = self.prepare(alias, fn)
            self._prepared[alias] = fn
        return self._prepared[alias]


def _numpy_in(array: np.ndarray, device: str) -> np.ndarray:
    return np.array(array)  # a writable copy; NumPy ports compute on the host


def _xfails_file_of(module: Any) -> Path | None:
    """``<module>.xfails`` next to the port's source file, if there is one."""
    source = getattr(module, "__file__", None)
    if not source:
        return None
    path = Path(source).with_suffix(".xfails")
    return path if path.is_file() else None


def load_port(port: str | ModuleType | Any, *, xfails: str | Path | Xfails | None = None) -> Port:
    """Resolve ``port`` (a module, an object, or an importable name such as ``impl_numpy`` or
    ``package.module:object``) into a :class:`Port`.

    The adapters are the port's own ``from_numpy``/``to_numpy`` when it defines them, else the
    built-in ones for ``impl_torch``/``impl_jax``, else NumPy in and out. The xfails are the
    port's own file (``<module>.xfails`` next to its source, if any) plus ``xfails``.
    """
    if isinstance(port, str):
        name = SHORT_NAMES.get(port, port)
        module_name, _, attribute = name.partition(":")  # "package.module:object" also works
        module = importlib.import_module(module_name)
        if attribute:
            module = getattr(module, attribute)
    else:
        module = port
        name = getattr(module, "__name__", type(module).__name__)
    from_np = getattr(module, "from_numpy", None)
    to_np = getattr(module, "to_numpy", None)
    prepare = getattr(module, "prepare", None)
    if (from_np is None or to_np is None) and name in BUILTIN_ADAPTERS:
        adapter = importlib.import_module(BUILTIN_ADAPTERS[name])
        from_np, to_np = adapter.from_numpy, adapter.to_numpy
        prepare = getattr(adapter, "prepare", None)
    numpy_native = from_np is None or to_np is None
    if numpy_native:
        from_np, to_np = _numpy_in, np.asarray
    known = Xfails()
    own = _xfails_file_of(module)
    if own is not None:
        known = Xfails.from_file(own)
    if isinstance(xfails, Xfails):
        known = known + xfails
    elif xfails is not None:
        known = known + Xfails.from_file(xfails)
    return Port(name, module, from_np, to_np, known, numpy_native, prepare)


# ---------------------------------------------------------------------------------------------
# Runs and outcomes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One fixture against one port function."""

    case: Case
    function: str  # alias, a key of FUNCTIONS

    @property
    def id(self) -> str:
        return self.function + self.case.id[len(self.case.op) :]

    @property
    def family(self) -> str:
        return f"{self.function}.{self.case.feature}"


def runs_for(
    manifest: Manifest | None = None,
    functions: Iterable[str] | None = None,
) -> list[Run]:
    """Every run of the manifest (default: the committed fixtures) for the given aliases."""
    manifest = manifest or load_manifest()
    wanted = list(FUNCTIONS) if functions is None else list(functions)
    return [Run(c, f) for f in wanted for c in manifest.cases if f in c.functions]


@dataclass
class Outcome:
    """The result of one run. ``status``: pass, fail, xfail (failed as listed) or xpass
    (listed in the xfails, but passed: a failure, so the list stays true)."""

    run_id: str
    family: str
    dtype: str
    device: str
    status: str
    message: str = ""
    error: float | None = None
    bound: float | None = None
    xfail_reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "xfail")

    @property
    def ratio(self) -> float | None:
        if self.error is None or not self.bound:
            return None
        return self.error / self.bound

    def line(self) -> str:
        tag = {"fail": "FAIL", "xpass": "XPASS", "xfail": "xfail", "pass": "pass"}[self.status]
        text = f"{tag} {self.run_id} [{self.device} {self.dtype}]: {self.message}"
        if self.status == "xpass":
            text += f" (listed as known failure: {self.xfail_reason}; remove it from the xfails)"
        return text


class _Failed(Exception):
    """A run's check failed; carries the numbers for the report."""

    def __init__(self, message: str, error: float | None = None, bound: float | None = None):
        super().__init__(message)
        self.error, self.bound = error, bound


def _fmt_index(index: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(int(i)) for i in index) + ")"


def _compare(got: Any, golden: np.ndarray, dtype: str, bound: float, what: str) -> float:
    """Max |got - golden| (NaN counts as inf); raises _Failed on shape, dtype or bound."""
    got = np.asarray(got)
    if got.shape != golden.shape:
        raise _Failed(f"{what} shape {got.shape}, expected {golden.shape}")
    if got.dtype.name != dtype:
        raise _Failed(
            f"{what} dtype {got.dtype.name}, expected {dtype} (the result must be cast back "
            "to the input dtype)"
        )
    if golden.size == 0:
        return 0.0
    with np.errstate(all="ignore"):
        values = got.astype(np.float64)
        diff = np.abs(values - golden)
        diff[~np.isfinite(values)] = math.inf
    flat = int(np.argmax(diff))
    err = float(diff.flat[flat])
    if not err <= bound:
        index = np.unravel_index(flat, golden.shape)
        raise _Failed(
            f"{what} max error {err:.3g} at {_fmt_index(index)} > bound {bound:.3g} "
            f"(expected {golden[index]:.6g}, got {values[index]:.6g})",
            err,
            bound,
        )
    return err


def _call_values(port: Port, fn: Callable, case: Case, function: str, device: str) -> Any:
    t = case.tensors()
    if function == "causal_mask":
        kw = case.keywords
        return fn(kw["q_len"], kw["kv_len"], alignment=kw["alignment"])
    kwargs = (FLASH_BLOCKS if function == "flash" else {}) | dict(case.keywords)
    for name in ("mask", "bias"):
        if name in t:
            kwargs[name] = port.from_numpy(t[name], device)
    q, k = port.from_numpy(t["query"], device), port.from_numpy(t["key"], device)
    if function == "weights":
        return fn(q, k, **kwargs)
    return fn(q, k, port.from_numpy(t["value"], device), **kwargs)


def _zeros(port: Port, spec: dict[str, Any], device: str) -> Any:
    return port.from_numpy(np.zeros(spec["shape"], dtype=NP_DTYPES[spec["dtype"]]), device)


def _call_error(port: Port, fn: Callable, case: Case, function: str, device: str) -> Any:
    if case.op in ("module", "decode"):
        return _call_module_error(port, fn, case, device)
    kwargs = (FLASH_BLOCKS if function == "flash" else {}) | dict(case.keywords)
    if function == "causal_mask":
        return fn(kwargs.pop("q_len"), kwargs.pop("kv_len"), **kwargs)
    inputs = case.entry["inputs"]
    for name in ("mask", "bias"):
        if name in inputs:
            kwargs[name] = _zeros(port, inputs[name], device)
    q, k = _zeros(port, inputs["query"], device), _zeros(port, inputs["key"], device)
    if function == "weights":
        return fn(q, k, **kwargs)
    return fn(q, k, _zeros(port, inputs["value"], device), **kwargs)


# ---------------------------------------------------------------------------------------------
# Modules and KV-cache decoding
# ---------------------------------------------------------------------------------------------

#: The module methods each module alias needs, besides the class's ``from_canonical``.
_MODULE_METHODS = {"module": (), "decode": ("init_cache", "decode")}


def _module_class(port: Port, case: Case, function: str) -> Any:
    """The case's module class of the port; raises "not implemented" for a missing class or
    a missing method, before anything runs."""
    name = case.entry["module"]["class"]
    cls = getattr(port.module, name, None)
    if cls is None:
        raise _Failed(f"not implemented: port has no `{name}`")
    needed = _MODULE_METHODS[function]
    if case.entry.get("call", "load") != "construct":
        needed = ("from_canonical", *needed)
    for method in needed:
        if not hasattr(cls, method):
            raise _Failed(f"not implemented: `{name}` has no `{method}`")
    return cls


def _load_module(
    cls: Any, spec: dict[str, Any], weights: dict[str, np.ndarray], dtype: str | None, device: str
) -> Any:
    """The documented loading function: ``cls.from_canonical(weights, n_heads=, n_kv_heads=,
    dtype=)`` with NumPy weights, plus ``device=`` when it takes one (torch)."""
    load = cls.from_canonical
    kwargs = {k: v for k, v in spec.items() if k != "class"}
    if dtype is not None:
        kwargs["dtype"] = dtype
    try:
        takes_device = "device" in inspect.signature(load).parameters
    except (TypeError, ValueError):  # a builtin or extension without a signature
        takes_device = False
    if takes_device:
        kwargs["device"] = device
    return load(weights, **kwargs)


def _canonical_weights(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The canonical weights stored in a module fixture (names ending in .kernel or .bias)."""
    return {n: np.array(a) for n, a in tensors.items() if n.endswith((".kernel", ".bias"))}


def _split_result(result: Any, return_weights: bool, with_cache: bool) -> tuple[Any, Any, Any]:
    """(output, weights or None, cache or None) of a module call or a decode step."""
    parts = list(result) if (return_weights or with_cache) else [result]
    cache = parts.pop() if with_cache else None
    weights = parts.pop() if return_weights else None
    (output,) = parts
    return output, weights, cache


def _check_module(
    port: Port, fn: Callable, run: Run, device: str
) -> tuple[str, float | None, float | None]:
    """A module fixture: one forward call against the golden output (and weights)."""
    case = run.case
    cls = _module_class(port, case, run.function)
    t = case.tensors()
    kwargs = dict(case.keywords)
    for name in ("mask", "bias"):
        if name in t:
            kwargs[name] = port.from_numpy(t[name], device)
    try:
        module = _load_module(cls, case.entry["module"], _canonical_weights(t), case.dtype, device)
        context = port.from_numpy(t["context"], device) if "context" in t else None
        result = fn(module, port.from_numpy(t["x"], device), context, **kwargs)
        output, weights, _ = _split_result(result, bool(kwargs.get("return_weights")), False)
        got = {"output": port.to_numpy(output)}
        if weights is not None:
            got["weights"] = port.to_numpy(weights)
    except Exception as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise _Failed(f"raised {type(exc).__name__}: {first}") from exc
    messages, worst, worst_bound = [], 0.0, None
    for name, value in got.items():
        bound = case.tolerance[name]
        err = _compare(value, t[name], case.dtype, bound, name)
        messages.append(f"{name} max error {err:.3g} <= bound {bound:.3g}")
        if worst_bound is None or err / bound > worst / worst_bound:
            worst, worst_bound = err, bound
    return "; ".join(messages), worst, worst_bound


def _check_decode(
    port: Port, fn: Callable, run: Run, device: str
) -> tuple[str, float | None, float | None]:
    """A decode fixture: the sequence fed in the case's chunks through ``init_cache`` and
    ``decode``; every step's rows against the same rows of the full causal forward."""
    case = run.case
    cls = _module_class(port, case, run.function)
    t = case.tensors()
    plan = case.entry["decode"]
    kwargs = dict(case.keywords)
    return_weights = bool(kwargs.get("return_weights"))
    x, golden = t["x"], t["output"]  # (B, T, M), (B, T, M)
    try:
        module = _load_module(cls, case.entry["module"], _canonical_weights(t), case.dtype, device)
        cache = module.init_cache(x.shape[0], plan["max_len"])
    except Exception as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise _Failed(f"raised {type(exc).__name__} before decoding: {first}") from exc
    ratio, worst, worst_bound, start = -1.0, 0.0, None, 0
    chunks = plan["chunks"]
    for step, n in enumerate(chunks):
        stop = start + n
        where = f"decode step {step + 1} of {len(chunks)} (tokens {start}..{stop - 1})"
        try:
            result = fn(module, port.from_numpy(x[:, start:stop], device), cache, **kwargs)
            output, weights, cache = _split_result(result, return_weights, True)
            got = {"output": port.to_numpy(output)}
            if weights is not None:
                got["weights"] = port.to_numpy(weights)
        except Exception as exc:
            first = str(exc).splitlines()[0][:200] if str(exc) else ""
            raise _Failed(f"{where}: raised {type(exc).__name__}: {first}") from exc
        want = {"output": golden[:, start:stop]}  # (B, n, M)
        if return_weights:  # (B, H, n, S): these rows against the keys written so far
            want["weights"] = t["weights"][:, :, start:stop, :stop]
        for name, value in got.items():
            bound = case.tolerance[name]
            try:
                err = _compare(value, want[name], case.dtype, bound, name)
            except _Failed as failed:
                raise _Failed(f"{where}: {failed}", failed.error, failed.bound) from None
            if err / bound > ratio:
                ratio, worst, worst_bound = err / bound, err, bound
        start = stop
    what = "output and weights" if return_weights else "output"
    message = (
        f"{len(chunks)} steps {chunks}: {what} max error {worst:.3g} <= bound {worst_bound:.3g}"
    )
    return message, worst, worst_bound


def _call_module_error(port: Port, fn: Callable, case: Case, device: str) -> Any:
    """Construct, load, call or decode as the error case says; the expected error must come."""
    entry = case.entry
    cls = getattr(port.module, entry["module"]["class"])
    if entry["call"] == "construct":
        return cls(**entry["module"]["arguments"])
    weights = {
        name: np.zeros(s["shape"], NP_DTYPES[s["dtype"]]) for name, s in entry["weights"].items()
    }
    module = _load_module(cls, entry["module"], weights, None, device)
    if entry["call"] == "load":
        return module
    inputs = {name: _zeros(port, spec, device) for name, spec in entry["inputs"].items()}
    if entry["call"] == "forward":
        kwargs = dict(case.keywords)
        for name in ("mask", "bias"):
            if name in inputs:
                kwargs[name] = inputs[name]
        return fn(module, inputs["x"], inputs.get("context"), **kwargs)
    plan = entry["decode"]
    x = np.zeros(entry["inputs"]["x"]["shape"], NP_DTYPES[entry["inputs"]["x"]["dtype"]])
    cache = module.init_cache(plan["batch_size"], plan["max_len"])
    start = 0
    for n in plan["chunks"]:
        *_, cache = fn(module, port.from_numpy(x[:, start : start + n], device), cache)
        start += n
    return cache


def _check(port: Port, run: Run, device: str) -> tuple[str, float | None, float | None]:
    """Run one case; returns (message, error, bound) on success, raises _Failed otherwise."""
    case, function = run.case, run.function
    fn = port.function(function)
    if fn is None:
        raise _Failed(f"not implemented: port has no `{FUNCTIONS[function].attribute}`")
    if function in _MODULE_METHODS:
        _module_class(port, case, function)  # "not implemented" before anything runs
        if case.kind == "values":
            check_values = _check_module if function == "module" else _check_decode
            return check_values(port, fn, run, device)

    if case.kind == "error":
        want = case.entry["expected_error"]
        expected = f"{want['class']}[{want['code']}]"
        try:
            _call_error(port, fn, case, function, device)
        except Exception as exc:  # the port's error, whatever it is, is the thing under test
            names = [c.__name__ for c in type(exc).__mro__]
            code = getattr(exc, "code", None)
            if want["class"] in names and code == want["code"]:
                return f"raised {expected}", None, None
            first = str(exc).splitlines()[0][:160] if str(exc) else ""
            raise _Failed(
                f"raised {type(exc).__name__}[{code}] {first!r}, expected {expected}"
            ) from None
        raise _Failed(f"no error raised, expected {expected}")

    try:
        result = _call_values(port, fn, case, function, device)
        got = port.to_numpy(result)
    except Exception as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise _Failed(f"raised {type(exc).__name__}: {first}") from exc
    golden = case.tensors()
    if function == "causal_mask":
        got = np.asarray(got)
        want = golden["mask"]
        if got.shape != want.shape or got.dtype != np.bool_:
            raise _Failed(f"causal_mask {got.dtype.name}{got.shape}, expected bool{want.shape}")
        if not np.array_equal(got, want):
            bad = _fmt_index(np.argwhere(got != want)[0])
            raise _Failed(f"causal_mask differs from the golden at {bad}")
        return "exact", 0.0, 0.0
    name = "weights" if function == "weights" else "output"
    bound = case.tolerance[name]
    err = _compare(got, golden[name], case.dtype, bound, name)
    return f"{name} max error {err:.3g} <= bound {bound:.3g}", err, bound


def check(port: Port, run: Run, device: str = "cpu") -> Outcome:
    """Run one case against a port, apply its xfails, return the outcome."""
    reason = port.xfails.reason(run.id, device)
    base = dict(run_id=run.id, family=run.family, dtype=run.case.dtype, device=device)
    try:
        message, error, bound = _check(port, run, device)
    except _Failed as failed:
        status = "xfail" if reason else "fail"
        return Outcome(
            **base,
            status=status,
            message=str(failed),
            error=failed.error,
            bound=failed.bound,
            xfail_reason=reason or "",
        )
    except Exception as exc:  # a bug in the port that escaped its own call
        status = "xfail" if reason else "fail"
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return Outcome(
            **base, status=status, message=f"crashed: {detail}", xfail_reason=reason or ""
        )
    status = "xpass" if reason else "pass"
    return Outcome(
        **base, status=status, message=message, error=error, bound=bound, xfail_reason=reason or ""
    )


# ---------------------------------------------------------------------------------------------
# The suite
# ---------------------------------------------------------------------------------------------


@dataclass
class Report:
    """All outcomes of one port on one device."""

    port: str
    device: str
    outcomes: list[Outcome]
    seconds: float = 0.0
    error: str = ""  # set when the port could not be loaded at all
    host_port: bool = False  # a NumPy port asked for another device: it ran on the host

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    @property
    def ok(self) -> bool:
        return not self.error and not self.failures

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "xfail": 0, "xpass": 0}
        for o in self.outcomes:
            out[o.status] += 1
        return out

    def families(self) -> dict[str, list[Outcome]]:
        groups: dict[str, list[Outcome]] = {}
        for o in self.outcomes:
            groups.setdefault(o.family, []).append(o)
        return groups

    def table(self, *, show_xfails: bool = False) -> str:
        """A compact table per family, then one line per failure."""
        if self.error:
            return f"{self.port} [{self.device}]: could not load the port: {self.error}"
        c = self.counts()
        where = self.device + (" (NumPy port, computes on the host)" if self.host_port else "")
        lines = [
            f"{self.port} on {where}: {len(self.outcomes)} runs: {c['pass']} passed, "
            f"{c['fail']} failed, {c['xfail']} xfail, {c['xpass']} xpass ({self.seconds:.1f} s)",
            f"  {'family':<30} {'passed':>8} {'xfail':>6} {'failed':>7}  worst err/bound",
        ]
        for family, outs in sorted(self.families().items()):
            n_pass = sum(o.status == "pass" for o in outs)
            n_xfail = sum(o.status == "xfail" for o in outs)
            n_fail = sum(o.status in ("fail", "xpass") for o in outs)
            ratios = [o.ratio for o in outs if o.status == "pass" and o.ratio is not None]
            worst = f"{max(ratios):.2f}" if ratios else "-"
            lines.append(
                f"  {family:<30} {f'{n_pass}/{len(outs)}':>8} {n_xfail or '':>6} "
                f"{n_fail or '':>7}  {worst}"
            )
        for o in self.outcomes:
            if not o.ok or (show_xfails and o.status == "xfail"):
                lines.append("  " + o.line())
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "device": self.device,
            "ok": self.ok,
            "error": self.error,
            "seconds": round(self.seconds, 3),
            "counts": self.counts(),
            "outcomes": [asdict(o) for o in self.outcomes],
        }


def select_functions(port: Port, functions: Iterable[str] | None) -> list[str]:
    """The aliases to run: as asked, or every required one plus the optional ones present."""
    if functions is not None:
        return list(functions)
    return [a for a, f in FUNCTIONS.items() if f.required or port.function(a) is not None]


def run_suite(
    port: str | ModuleType | Any,
    *,
    device: str = "cpu",
    functions: Iterable[str] | None = None,
    xfails: str | Path | Xfails | None = None,
    fixtures: str | Path | None = None,
    select: Callable[[Run], bool] | None = None,
) -> Report:
    """Run every fixture against ``port`` on ``device`` and return the report.

    ``functions`` restricts (or, for optional ones such as ``flash``, demands) the aliases;
    ``select`` filters the runs. A port that cannot be imported gives a report with ``error``.
    """
    start = time.perf_counter()
    try:
        loaded = port if isinstance(port, Port) else load_port(port, xfails=xfails)
    except Exception as exc:
        name = port if isinstance(port, str) else getattr(port, "__name__", repr(port))
        return Report(str(name), device, [], error=f"{type(exc).__name__}: {exc}")
    manifest = load_manifest(fixtures)
    runs = runs_for(manifest, select_functions(loaded, functions))
    if select is not None:
        runs = [r for r in runs if select(r)]
    outcomes = [check(loaded, r, device) for r in runs]
    host_port = loaded.numpy_native and device != "cpu"
    return Report(loaded.name, device, outcomes, time.perf_counter() - start, host_port=host_port)


# ---------------------------------------------------------------------------------------------
# A quick check for the benchmark harness
# ---------------------------------------------------------------------------------------------


@dataclass
class QuickCheckResult:
    """``ok``: no unexpected failure; ``n_run``: runs made; ``failures``: one line each."""

    ok: bool
    n_run: int
    failures: list[str]
    port: str = ""
    device: str = "cpu"


def quick_check(
    port: str | ModuleType | Any,
    *,
    device: str = "cpu",
    op: str = "sdpa",
    n_cases: int = 8,
) -> QuickCheckResult:
    """Run the ``n_cases`` smallest value fixtures (by element count) of ``op`` on ``device``.

    ``op`` is a function alias (``sdpa``, ``weights``, ``flash``, ``causal_mask``). Cases
    with an empty result (L = 0) are skipped: they prove nothing about the arithmetic. The
    built-in ports' xfails are honoured; an XPASS is not counted as a failure here.
    """
    try:
        loaded = load_port(port)
    except Exception as exc:
        return QuickCheckResult(False, 0, [f"could not load port {port!r}: {exc}"], str(port))
    manifest = load_manifest()
    candidates = [
        Run(c, op)
        for c in manifest.cases
        if c.kind == "values" and op in c.functions and _result_size(c, op) > 0
    ]
    candidates.sort(key=lambda r: (r.case.n_elements, r.id))
    outcomes = [check(loaded, r, device) for r in candidates[:n_cases]]
    failures = [o.line() for o in outcomes if o.status == "fail"]
    return QuickCheckResult(not failures, len(outcomes), failures, loaded.name, device)


def _result_size(case: Case, op: str) -> int:
    shapes = case.entry["shapes"]
    name = {"weights": "weights", "causal_mask": "mask"}.get(op, "output")
    return math.prod(shapes[name])


def write_report(reports: Sequence[Report], path: str | Path) -> None:
    Path(path).write_text(json.dumps([r.to_json() for r in reports], indent=1) + "\n")
