"""Apply the golden fixtures to any port and report, per case, pass or fail with the numbers.

A *port* is a module (or any object) exposing the public names of SEMANTICS.md. Each fixture
is run against one or more of its functions, named here by a short alias; :data:`FUNCTIONS` is
the table, one row per alias, saying which attribute of the port is called, how, and against
which golden:

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
grad        ``scaled_dot_product_attention_  the golden dq, dk, dv (dbias, dsinks) of
            vjp``                            ``fn(q, k, v, grad_output, **kw)`` (optional)
flash_grad  ``flash_attention_vjp``          the same, with ``block_q=2, block_k=3`` unless
                                             the case gives its own (optional)
ring        ``ring_attention``               the golden output (optional; sharded: called
                                             with ``n_shards=n, layout="contiguous"``)
ring_zigzag ``ring_attention``               the same, ``layout="zigzag"``
head_       ``head_parallel_attention``      the golden output (optional; sharded)
parallel
head_       ``head_parallel_gqa``            a module fixture's golden output (optional;
parallel_                                    sharded: ``head_parallel_gqa(module, x,
gqa                                          context, n_shards=n, **keywords)``)
rope        ``apply_rotary``                 the golden rotated x (optional)
=========== ================================ ============================================

One fixture and one function make one *run*, with the id ``<alias>.<feature>[.<variant>].
<dtype>`` (``weights.gqa.h6_k2.float32`` runs the fixture ``sdpa.gqa.h6_k2.float32`` against
``attention_weights``). A run passes when the port's result has the golden's shape and the
input dtype, and its max error against the float64 golden is at most the manifest's bound;
an error case passes when the call raises an exception whose class (or a base class) has the
expected name and whose ``.code`` is the expected code. A failure says where: the element with
the largest error, the expected and the got values to full precision, the relative error and
the error as a multiple of the bound; an exception names the line of the port that raised it,
and an exception inside the port's adapters (``from_numpy``, ``to_numpy``, ``prepare``) names
the adapter.

A missing function (or module class, or module method) makes each of its runs fail as "not
implemented", one line each. Optional functions (``flash`` and the sharded ones) are run only
when the port has them or when they are asked for.

The sharded aliases run each fixture once per shard count n of ``shards`` (``--shards``,
default :data:`DEFAULT_SHARDS`) that fits it: n divides L and S (``ring``), 2n does
(``ring_zigzag``), n divides K (``head_parallel``, ``head_parallel_gqa``); a fixture that fits
no n is not run. Their run ids carry n: ``ring.n4.causal.top_left.l64_s64.float32``. A port's
sharded functions are found at its top level or in its ``sharded`` submodule
(``impl_numpy.sharded``). A sharded run whose port says it lacks the devices (an error with
code ``shard_devices``: one JAX device where n are needed) is reported as ``skip`` with the
port's message; ``python -m conformance`` gives every port's child process
``XLA_FLAGS=--xla_force_host_platform_device_count=<largest n>`` before JAX starts, and the
torch adapter runs each sharded call on n forked gloo processes (docs/SHARDED.md).

Modules are loaded through the one documented loading function,
``<class>.from_canonical(weights, *, n_heads, n_kv_heads, dtype)`` with the canonical weights as
NumPy arrays (plus ``device=`` when the function takes it), and called as
``module(x, context, **keywords)`` and ``module.decode(x, cache, **keywords)`` after
``cache = module.init_cache(batch_size, max_len)``. Those two calls go through the port's
``prepare`` hook like every function (aliases ``module`` and ``decode``: the JAX adapter
``nnx.jit``s them).

Known failures live in the port's xfails file (see :class:`Xfails`); a listed run that passes
is reported as XPASS and counts as a failure, so the list stays true. A ``skip:`` entry is not
run at all (a case that crashes the port).

``run_suite(..., isolate=True)`` (what ``python -m conformance`` does) runs the port in a child
process (:mod:`conformance.worker`): a port that dies of a signal or an abort in one case is
reported as ``crash`` for that case, with the signal's name, and a new child carries on with the
remaining runs.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from conformance.fixtures import (
    ARRAY_KEYWORDS,
    KEYWORD_GROUPS,
    NP_DTYPES,
    Case,
    Manifest,
    load_manifest,
)
from conformance.ports import BUILTIN_ADAPTERS, SHORT_NAMES

__all__ = [
    "DEFAULT_SHARDS",
    "FLASH_BLOCKS",
    "FUNCTIONS",
    "SHARDED_ALIASES",
    "Comparison",
    "Function",
    "Outcome",
    "Port",
    "QuickCheckResult",
    "Report",
    "Run",
    "XfailEntry",
    "Xfails",
    "check",
    "load_port",
    "module_decode",
    "module_forward",
    "plan_runs",
    "quick_check",
    "run_suite",
    "runs_for",
    "select_functions",
    "write_report",
]

#: Block sizes passed to ``flash_attention``: small and dividing neither L nor S of the fixtures
#: (L, S in 0..9), so every fixture spans several query and key blocks, with ragged last blocks.
FLASH_BLOCKS: dict[str, int] = {"block_q": 2, "block_k": 3}

#: The shard counts the sharded aliases run with, unless told (``--shards``).
DEFAULT_SHARDS: tuple[int, ...] = (2, 4)


# ---------------------------------------------------------------------------------------------
# Failures and where they come from
# ---------------------------------------------------------------------------------------------


class _Failed(Exception):
    """A run's check failed; carries the numbers for the report."""

    def __init__(self, message: str, error: float | None = None, bound: float | None = None):
        super().__init__(message)
        self.error, self.bound = error, bound


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:limit]


def _frame(f: traceback.FrameSummary) -> str:
    return f"{Path(f.filename).name}:{f.lineno} in {f.name}"


def _where_raised(exc: BaseException) -> str:
    """`` (file.py:12 in function)``: the innermost frame that raised ``exc``."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {_frame(frames[-1])})" if frames else ""


def _raised(exc: BaseException, prefix: str = "") -> _Failed:
    """The failure of a port function that raised ``exc``: its class, message and line (a
    sharded function's ``shard_devices``: the machine lacks the devices, and the run is
    skipped)."""
    if getattr(exc, "code", None) == "shard_devices":
        return _NoDevices(f"skipped: too few devices here: {_first_line(exc, 400)}")
    return _Failed(f"{prefix}raised {type(exc).__name__}: {_first_line(exc)}{_where_raised(exc)}")


class _NoDevices(_Failed):
    """A sharded value run that the port cannot place on this machine: reported as skip."""


class _AdapterFailed(_Failed):
    """One of the port's adapters (``from_numpy``, ``to_numpy``, ``prepare``) raised."""


def _adapter(port_name: str, which: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call the adapter ``which``; an exception becomes a failure naming it, with the tail of
    its traceback (innermost frame first)."""
    try:
        return fn(*args)
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)[1:][-4:]
        tail = " <- ".join(_frame(f) for f in reversed(frames)) or "no frames"
        raise _AdapterFailed(
            f"the adapter `{which}` of {port_name} raised {type(exc).__name__}: "
            f"{_first_line(exc)} [traceback tail: {tail}]"
        ) from exc


# ---------------------------------------------------------------------------------------------
# Ports
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class XfailEntry:
    """One line of an xfails file (see :class:`Xfails`)."""

    pattern: str
    device: str | None = None
    reason: str = ""
    skip: bool = False
    negate: bool = False

    def matches(self, run_id: str, device: str) -> bool:
        on_device = self.device is None or device.split(":")[0] == self.device
        return on_device and fnmatch.fnmatchcase(run_id, self.pattern)


class Xfails:
    """A port's known failures: one glob over run ids per line, ``#`` starts the reason.

    ::

        # torch_fused.xfails
        causal_mask.*            # torch has no public causal-mask function
        cuda: sdpa.foo.float16   # only on that device
        skip: decode.error.*     # crashes the port: not run, reported as skipped
        *.float64                # no float64 at all ...
        !*.scale.zero.float64    # ... but scale zero passes: not listed after all

    Prefixes ending in ``:`` may come in any order before the glob: ``skip:`` and a device
    (``cuda:``, ``cpu:``, ``tpu:``). A glob starting with ``!`` excludes what it matches from
    the lines above it. The last line that matches a run decides, as in ``.gitignore``.
    """

    def __init__(self, entries: Iterable[XfailEntry] = ()) -> None:
        self.entries = list(entries)

    @classmethod
    def parse(cls, text: str) -> Xfails:
        entries = []
        for line in text.splitlines():
            body, _, reason = line.partition("#")
            tokens = body.split()
            if not tokens:
                continue
            device, skip = None, False
            while tokens and tokens[0].endswith(":"):
                prefix = tokens.pop(0)[:-1]
                if prefix == "skip":
                    skip = True
                else:
                    device = prefix
            if len(tokens) != 1:
                raise ValueError(f"xfails line {line.strip()!r}: expected [device:] [skip:] glob")
            pattern = tokens[0]
            negate = pattern.startswith("!")
            entries.append(
                XfailEntry(pattern.removeprefix("!"), device, reason.strip(), skip, negate)
            )
        return cls(entries)

    @classmethod
    def from_file(cls, path: str | Path) -> Xfails:
        return cls.parse(Path(path).read_text())

    def __add__(self, other: Xfails) -> Xfails:
        return Xfails(self.entries + other.entries)

    def lookup(self, run_id: str, device: str) -> XfailEntry | None:
        """The entry that decides ``run_id`` on ``device`` (the last that matches), or None when
        it is not listed (or excluded by a ``!`` line)."""
        for entry in reversed(self.entries):
            if entry.matches(run_id, device):
                return None if entry.negate else entry
        return None

    def reason(self, run_id: str, device: str) -> str | None:
        """The reason a run is expected to fail (or skipped) on ``device``, or None."""
        entry = self.lookup(run_id, device)
        return None if entry is None else entry.reason or "listed in xfails"

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(e) for e in self.entries]

    @classmethod
    def from_json(cls, data: Sequence[dict[str, Any]]) -> Xfails:
        return cls(XfailEntry(**d) for d in data)


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
    _round_trips: dict[tuple[str, str], str | None] = field(default_factory=dict, repr=False)

    def function(self, alias: str) -> Callable[..., Any] | None:
        """The port's function for ``alias``, or None when the port does not have it.

        For ``module`` and ``decode``: the runner's call of the module (prepared once), or None
        when the port has no ``GroupedQueryAttention``.
        """
        if alias not in self._prepared:
            spec = FUNCTIONS[alias]
            fn = getattr(self.module, spec.attribute, None)
            if fn is None and spec.submodule is not None:  # impl_numpy.sharded.ring_attention
                fn = getattr(_submodule(self.module, spec.submodule), spec.attribute, None)
            if fn is not None and spec.call is not None:
                fn = spec.call
            if fn is not None and self.prepare is not None:
                fn = _adapter(self.name, "prepare", self.prepare, alias, fn)
            self._prepared[alias] = fn
        return self._prepared[alias]

    def array_in(self, array: np.ndarray, device: str) -> Any:
        """``from_numpy(array, device)``; an exception names the adapter."""
        return _adapter(self.name, "from_numpy", self.from_numpy, array, device)

    def array_out(self, array: Any) -> np.ndarray:
        """``to_numpy(array)`` as a NumPy array; an exception names the adapter."""
        return np.asarray(_adapter(self.name, "to_numpy", self.to_numpy, array))

    def check_round_trip(self, dtype: str, device: str) -> None:
        """Fail when ``to_numpy(from_numpy(x))`` does not keep ``dtype`` (checked once per dtype
        and device): a port that silently turns float64 into float32 would otherwise fail every
        case with a misleading dtype message about its own output."""
        if self.numpy_native or dtype not in NP_DTYPES:
            return
        if (dtype, device) not in self._round_trips:
            sample = np.zeros((2,), NP_DTYPES[dtype])
            got = self.array_out(self.array_in(sample, device)).dtype.name
            self._round_trips[dtype, device] = None if got == dtype else got
        changed = self._round_trips[dtype, device]
        if changed is not None:
            raise _AdapterFailed(
                f"the adapters of {self.name} turn {dtype} into {changed} "
                f"(to_numpy(from_numpy(x)).dtype): from_numpy must keep the dtype exactly "
                "(conformance/PORTING.md, 'Framework traps')"
            )


def _submodule(module: Any, name: str) -> Any:
    """``module.name``, imported if ``module`` is a package that has it; None if it has not."""
    found = getattr(module, name, None)
    package = getattr(module, "__name__", None)
    if found is not None or not hasattr(module, "__path__") or package is None:
        return found
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.{name}":  # the submodule exists but imports something missing
            raise
        return None


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
    shards: int | None = None  # n, for a sharded alias's value run

    @property
    def id(self) -> str:
        n = "" if self.shards is None else f".n{self.shards}"
        return self.function + n + self.case.id[len(self.case.op) :]

    @property
    def family(self) -> str:
        return f"{self.function}.{self.case.feature}"


def runs_for(
    manifest: Manifest | None = None,
    functions: Iterable[str] | None = None,
    shards: Iterable[int] = DEFAULT_SHARDS,
) -> list[Run]:
    """Every run of the manifest (default: the committed fixtures) for the given aliases; a
    sharded alias's value case once per shard count of ``shards`` that fits it."""
    manifest = manifest or load_manifest()
    wanted = list(FUNCTIONS) if functions is None else list(functions)
    runs = []
    for f in wanted:
        fits = FUNCTIONS[f].fits
        for c in manifest.cases:
            if f not in c.functions:
                continue
            if fits is None or c.kind == "error":  # an error case gives its own n_shards
                runs.append(Run(c, f))
            else:
                runs += [Run(c, f, n) for n in shards if fits(c, n)]
    return runs


#: The statuses of a run. ``ok``: pass, xfail (failed as listed) and skip (listed ``skip:``,
#: not run); a failure: fail, xpass (listed, but passed: so the list stays true) and crash (the
#: port killed its process: a signal or an abort).
STATUSES = ("pass", "fail", "xfail", "xpass", "skip", "crash")


@dataclass
class Outcome:
    """The result of one run (``status``: one of :data:`STATUSES`)."""

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
        return self.status in ("pass", "xfail", "skip")

    @property
    def ratio(self) -> float | None:
        if self.error is None or not self.bound:
            return None
        return self.error / self.bound

    def line(self) -> str:
        tag = {"fail": "FAIL", "xpass": "XPASS", "crash": "CRASH"}.get(self.status, self.status)
        text = f"{tag} {self.run_id} [{self.device} {self.dtype}]: {self.message}"
        if self.status == "xpass":
            text += f" (listed as known failure: {self.xfail_reason}; remove it from the xfails)"
        return text


def _fmt_index(index: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(int(i)) for i in index) + ")"


def _compare(got: Any, golden: np.ndarray, dtype: str, bound: float, what: str) -> float:
    """Max |got - golden| (NaN counts as inf, but where the golden is NaN, anything else does);
    raises _Failed on shape, dtype or bound.

    The failure locates the error: the index of the worst element, expected and got to full
    precision (Python's shortest round-trip repr), the relative error there and the error as a
    multiple of the bound."""
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
        want = golden.astype(np.float64)
        diff = np.abs(values - want)
        exact = np.isinf(want) & (values == want)  # a golden -inf (an empty row's lse) is met
        exact |= np.isnan(want) & np.isnan(values)  # so is a golden NaN (+inf bias allowed)
        diff[~np.isfinite(values) & ~exact] = math.inf
        diff[np.isnan(want) & ~exact] = math.inf  # a number where the golden is NaN is wrong
        diff[exact] = 0.0
    flat = int(np.argmax(diff))
    err = float(diff.flat[flat])
    if not err <= bound:
        index = np.unravel_index(flat, golden.shape)
        expected, actual = float(want[index]), float(values[index])
        relative = err / abs(expected) if expected != 0 else math.inf
        times = err / bound if bound > 0 else math.inf
        raise _Failed(
            f"{what} max error {err:.3g} > bound {bound:.3g} ({times:.3g}x the bound; relative "
            f"error {relative:.3g}) at {_fmt_index(index)}: expected {expected!r}, "
            f"got {actual!r}",
            err,
            bound,
        )
    return err


@dataclass
class Comparison:
    """One result of a port against its golden: ``got`` (NumPy) against ``want``, under the
    case's bound for ``name`` (0 when the case has none: exact). ``where`` prefixes messages."""

    name: str
    got: Any
    want: np.ndarray
    where: str = ""
    dtype: str | None = None  # the result's dtype when it is not the case's (lse: compute dtype)


# ---------------------------------------------------------------------------------------------
# The functions: how each alias is called, and what it is compared with
# ---------------------------------------------------------------------------------------------


def _zeros(port: Port, spec: dict[str, Any], device: str) -> Any:
    """Zeros of an error case's input spec, through the port's adapter (``"none"``: None)."""
    if spec["dtype"] == "none":
        return None
    return port.array_in(np.zeros(spec["shape"], dtype=NP_DTYPES[spec["dtype"]]), device)


def _attention_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """sdpa, weights, flash: the case's tensors through the port, one golden."""
    t = case.tensors()
    kwargs = dict(spec.defaults) | dict(case.keywords)
    for name in ARRAY_KEYWORDS:
        if name in t:
            kwargs[name] = port.array_in(t[name], device)
    args = [port.array_in(t["query"], device), port.array_in(t["key"], device)]
    if spec.golden == "output":
        args.append(port.array_in(t["value"], device))
    _require_keywords(fn, kwargs)
    lse = "lse" in t and _takes(fn, "return_lse")  # a flash case's row log-sum-exp, if it can
    if lse:
        kwargs["return_lse"] = True
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:
        raise _raised(exc) from exc
    if lse:
        result, row_lse = result
        compute = "float64" if case.dtype == "float64" else "float32"
        yield Comparison("lse", port.array_out(row_lse), t["lse"], dtype=compute)
    yield Comparison(spec.golden, port.array_out(result), t[spec.golden])


def _require_keywords(fn: Callable, kwargs: dict[str, Any]) -> None:
    """A port written before a keyword joined the contract fails with what to do, not with a
    TypeError from deep in the call (a signature with ``**kwargs`` takes everything)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [name for name in kwargs if name not in params]
    if missing:
        name = missing[0]
        group = KEYWORD_GROUPS.get(name, name)
        raise _Failed(
            f"the port's {getattr(fn, '__name__', 'function')} has no keyword {name!r} "
            f"(contract v2, docs/SEMANTICS.md): implement it, or list '*.{group}.*' in the "
            "port's xfails"
        )


def _takes(fn: Callable, keyword: str) -> bool:
    """Whether ``fn`` has the parameter ``keyword`` (through jit wrappers)."""
    try:
        return keyword in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or extension without a signature
        return False


def _attention_error(port: Port, fn: Callable, case: Case, device: str, spec: Function) -> Any:
    kwargs = dict(spec.defaults) | dict(case.keywords)
    inputs = case.entry["inputs"]
    for name in ARRAY_KEYWORDS:
        if name in inputs:
            kwargs[name] = _zeros(port, inputs[name], device)
    args = [_zeros(port, inputs["query"], device), _zeros(port, inputs["key"], device)]
    if spec.golden == "output":
        args.append(_zeros(port, inputs["value"], device))
    _require_keywords(fn, kwargs)
    return fn(*args, **kwargs)


def _causal_mask_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    kw = case.keywords
    try:
        result = fn(kw["q_len"], kw["kv_len"], alignment=kw["alignment"])
    except Exception as exc:
        raise _raised(exc) from exc
    yield Comparison("mask", port.array_out(result), case.tensors()["mask"])


def _causal_mask_error(port: Port, fn: Callable, case: Case, device: str, spec: Function) -> Any:
    kwargs = dict(case.keywords)
    return fn(kwargs.pop("q_len"), kwargs.pop("kv_len"), **kwargs)


def module_forward(module: Any, x: Any, context: Any = None, **keywords: Any) -> Any:
    """The runner's module call: ``module(x, context, **keywords)`` (wrapped by ``prepare``)."""
    return module(x, context, **keywords)


def module_decode(module: Any, x: Any, cache: Any, **keywords: Any) -> Any:
    """The runner's decode step: ``module.decode(x, cache, **keywords)`` (wrapped by
    ``prepare``); returns ``(y, cache)`` or ``(y, weights, cache)``."""
    return module.decode(x, cache, **keywords)


def _module_class(port: Port, case: Case, spec: Function) -> Any:
    """The case's module class of the port; raises "not implemented" for a missing class or
    a missing method, before anything runs."""
    name = case.entry["module"]["class"]
    cls = getattr(port.module, name, None)
    if cls is None:
        raise _Failed(f"not implemented: port has no `{name}`")
    needed = spec.methods
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
    if _takes(load, "device"):
        kwargs["device"] = device
    return load(weights, **kwargs)


def _canonical_weights(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The canonical weights stored in a module fixture (names ending in .kernel or .bias, and
    a module's ``sinks``)."""
    names = [n for n in tensors if n.endswith((".kernel", ".bias")) or n == "sinks"]
    return {n: np.array(tensors[n]) for n in names}


def _split_result(result: Any, return_weights: bool, with_cache: bool) -> tuple[Any, Any, Any]:
    """(output, weights or None, cache or None) of a module call or a decode step."""
    parts = list(result) if (return_weights or with_cache) else [result]
    cache = parts.pop() if with_cache else None
    weights = parts.pop() if return_weights else None
    (output,) = parts
    return output, weights, cache


def _module_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """A module fixture: one forward call against the golden output (and weights)."""
    cls = _module_class(port, case, spec)
    t = case.tensors()
    kwargs = dict(case.keywords)
    for name in ("mask", "bias", "q_segment_ids", "kv_segment_ids"):
        if name in t:
            kwargs[name] = port.array_in(t[name], device)
    context = port.array_in(t["context"], device) if "context" in t else None
    x = port.array_in(t["x"], device)
    try:
        module = _load_module(cls, case.entry["module"], _canonical_weights(t), case.dtype, device)
        result = fn(module, x, context, **kwargs)
        output, weights, _ = _split_result(result, bool(kwargs.get("return_weights")), False)
    except Exception as exc:
        raise _raised(exc) from exc
    yield Comparison("output", port.array_out(output), t["output"])
    if weights is not None:
        yield Comparison("weights", port.array_out(weights), t["weights"])


def _decode_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """A decode fixture: the sequence fed in the case's chunks through ``init_cache`` and
    ``decode``; every step's rows against the same rows of the full causal forward."""
    cls = _module_class(port, case, spec)
    t = case.tensors()
    plan = case.entry["decode"]
    kwargs = dict(case.keywords)
    return_weights = bool(kwargs.get("return_weights"))
    x, golden = t["x"], t["output"]  # (B, T, M), (B, T, M)
    try:
        module = _load_module(cls, case.entry["module"], _canonical_weights(t), case.dtype, device)
        cache = module.init_cache(x.shape[0], plan["max_len"], **_rolling(plan))
    except Exception as exc:
        raise _raised(exc, "before decoding: ") from exc
    start, chunks = 0, plan["chunks"]
    for step, n in enumerate(chunks):
        stop = start + n
        where = f"decode step {step + 1} of {len(chunks)} (tokens {start}..{stop - 1}): "
        new = port.array_in(x[:, start:stop], device)
        try:
            result = fn(module, new, cache, **kwargs)
            output, weights, cache = _split_result(result, return_weights, True)
        except Exception as exc:
            raise _raised(exc, where) from exc
        yield Comparison("output", port.array_out(output), golden[:, start:stop], where)
        if weights is not None:  # (B, H, n, S): these rows against the keys written so far
            want = t["weights"][:, :, start:stop, :stop]
            yield Comparison("weights", port.array_out(weights), want, where)
        start = stop


def _module_error(port: Port, fn: Callable, case: Case, device: str, spec: Function) -> Any:
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
    inputs = {name: _zeros(port, spec_, device) for name, spec_ in entry["inputs"].items()}
    if entry["call"] == "forward":
        kwargs = dict(case.keywords)
        for name in ("mask", "bias"):
            if name in inputs:
                kwargs[name] = inputs[name]
        return fn(module, inputs["x"], inputs.get("context"), **kwargs)
    plan = entry["decode"]
    x = np.zeros(entry["inputs"]["x"]["shape"], NP_DTYPES[entry["inputs"]["x"]["dtype"]])
    maker = module
    if "cache_from" in plan:  # a cache made by another module (other sizes, another dtype)
        other = plan["cache_from"]
        spec_ = {"class": entry["module"]["class"], "n_heads": other["n_heads"],
                 "n_kv_heads": other["n_kv_heads"]}  # fmt: skip
        zeros = {
            n: np.zeros(w["shape"], NP_DTYPES[w["dtype"]]) for n, w in other["weights"].items()
        }
        maker = _load_module(cls, spec_, zeros, None, device)
    cache = maker.init_cache(plan["batch_size"], plan["max_len"], **_rolling(plan))
    arrays = ("mask", "bias", "q_segment_ids", "kv_segment_ids")
    kwargs = {n: inputs[n] for n in arrays if n in inputs}
    start = 0
    for n in plan["chunks"]:
        *_, cache = fn(module, port.array_in(x[:, start : start + n], device), cache, **kwargs)
        start += n
    return cache


def _rolling(plan: dict[str, Any]) -> dict[str, Any]:
    """``init_cache``'s keywords of a decode plan: ``rolling=True`` for a rolling cache (only
    then, so a port without rolling caches still runs every plain decode case)."""
    return {"rolling": True} if plan.get("rolling") else {}


#: The gradients of a ``*_vjp`` call, in the order of ``AttentionGrads``: (golden name, the
#: input whose gradient it is, and whose dtype it must have).
GRADS: tuple[tuple[str, str], ...] = (
    ("dq", "query"),
    ("dk", "key"),
    ("dv", "value"),
    ("dbias", "bias"),
    ("dsinks", "sinks"),
)


def _grad_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """grad, flash_grad: ``fn(query, key, value, grad_output, **keywords)`` returns
    ``AttentionGrads(query, key, value, bias, sinks)`` (a named tuple, or any sequence in that
    order); each gradient the case has a golden for is compared, in its input's dtype."""
    t = case.tensors()
    kwargs = dict(spec.defaults) | dict(case.keywords)
    for name in ARRAY_KEYWORDS:
        if name in t:
            kwargs[name] = port.array_in(t[name], device)
    args = [port.array_in(t[name], device) for name in ("query", "key", "value", "grad_output")]
    _require_keywords(fn, kwargs)
    try:
        grads = fn(*args, **kwargs)
    except Exception as exc:
        raise _raised(exc) from exc
    for index, (name, given) in enumerate(GRADS):
        if name not in t:
            continue
        got = grads[index] if index < len(grads) else None
        if got is None:
            raise _Failed(f"returned None for the gradient of {given} ({name}), which was given")
        yield Comparison(name, port.array_out(got), t[name], dtype=t[given].dtype.name)


def _grad_error(port: Port, fn: Callable, case: Case, device: str, spec: Function) -> Any:
    kwargs = dict(spec.defaults) | dict(case.keywords)
    inputs = case.entry["inputs"]
    for name in ARRAY_KEYWORDS:
        if name in inputs:
            kwargs[name] = _zeros(port, inputs[name], device)
    names = ("query", "key", "value", "grad_output")
    args = [_zeros(port, inputs[name], device) for name in names]
    _require_keywords(fn, kwargs)
    return fn(*args, **kwargs)


def _module_sharded_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """A module fixture through ``head_parallel_gqa(module, x, context, n_shards=n, ...)``:
    the module loaded as for ``module``, its output against the golden (no weights)."""
    cls = _module_class(port, case, spec)
    t = case.tensors()
    kwargs = dict(spec.defaults) | {k: v for k, v in case.keywords.items() if k != "return_weights"}
    for name in ("mask", "bias", "q_segment_ids", "kv_segment_ids"):
        if name in t:
            kwargs[name] = port.array_in(t[name], device)
    context = port.array_in(t["context"], device) if "context" in t else None
    x = port.array_in(t["x"], device)
    try:
        module = _load_module(cls, case.entry["module"], _canonical_weights(t), case.dtype, device)
        output = fn(module, x, context, **kwargs)
    except Exception as exc:
        raise _raised(exc) from exc
    yield Comparison("output", port.array_out(output), t["output"])


def _sizes(case: Case) -> tuple[int, int, int]:
    """(L, S, K) of an attention value fixture."""
    query, key = case.entry["shapes"]["query"], case.entry["shapes"]["key"]
    return query[-2], key[-2], key[-3]


def _ring_fits(case: Case, n: int) -> bool:
    """n contiguous shards cut L and S."""
    L, S, _ = _sizes(case)
    return L % n == 0 and S % n == 0


def _zigzag_fits(case: Case, n: int) -> bool:
    """2n zigzag chunks cut L and S."""
    return _ring_fits(case, 2 * n)


def _heads_fit(case: Case, n: int) -> bool:
    """n devices share the K key/value heads (of the call, or of the module)."""
    module = case.entry.get("module")
    K = _sizes(case)[2] if module is None else module.get("n_kv_heads", module["n_heads"])
    return K % n == 0


def _rope_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """rope: ``apply_rotary(x, positions, **keywords)`` against the golden rotated x."""
    t = case.tensors()
    args = [port.array_in(t["x"], device), port.array_in(t["positions"], device)]
    try:
        result = fn(*args, **case.keywords)
    except Exception as exc:
        raise _raised(exc) from exc
    yield Comparison("output", port.array_out(result), t["output"])


def _rope_error(port: Port, fn: Callable, case: Case, device: str, spec: Function) -> Any:
    inputs = case.entry["inputs"]
    x, positions = _zeros(port, inputs["x"], device), _zeros(port, inputs["positions"], device)
    return fn(x, positions, **case.keywords)


@dataclass(frozen=True)
class Function:
    """One row of the table: a port function the suite knows.

    ``attribute``: the port's function (for the module aliases, the class the port must have;
    the function run is then the runner's own ``call``, with the class ``methods`` it needs);
    looked for in the port's ``submodule`` too, when it has that. ``required``: every port is
    checked on it (optional ones run when present or asked for). ``values(port, fn, case,
    device, spec)`` yields :class:`Comparison` s of a value case; ``error(...)`` makes the call
    of an error case, which must raise. ``golden``: the golden the attention aliases compare;
    ``defaults``: keywords added to every call (flash's blocks, the ring's layout; a sharded run
    adds its ``n_shards``). ``fits(case, n)``: a sharded alias, run with each n of ``--shards``
    for which it says True.
    """

    attribute: str
    required: bool
    values: Callable[..., Iterator[Comparison]]
    error: Callable[..., Any]
    golden: str = "output"
    defaults: dict[str, Any] = field(default_factory=dict)
    call: Callable[..., Any] | None = None
    methods: tuple[str, ...] | None = None
    submodule: str | None = None
    fits: Callable[[Case, int], bool] | None = None


#: Alias -> port function. A new op adds a row here (and its case file and fixture builder).
FUNCTIONS: dict[str, Function] = {
    "sdpa": Function("scaled_dot_product_attention", True, _attention_values, _attention_error),
    "weights": Function(
        "attention_weights", True, _attention_values, _attention_error, golden="weights"
    ),
    "causal_mask": Function("causal_mask", True, _causal_mask_values, _causal_mask_error),
    "flash": Function(
        "flash_attention", False, _attention_values, _attention_error, defaults=FLASH_BLOCKS
    ),
    "module": Function(
        "GroupedQueryAttention",
        True,
        _module_values,
        _module_error,
        call=module_forward,
        methods=(),
    ),
    "decode": Function(
        "GroupedQueryAttention",
        True,
        _decode_values,
        _module_error,
        call=module_decode,
        methods=("init_cache", "decode"),
    ),
    "grad": Function("scaled_dot_product_attention_vjp", False, _grad_values, _grad_error),
    "flash_grad": Function(
        "flash_attention_vjp", False, _grad_values, _grad_error, defaults=FLASH_BLOCKS
    ),
    "ring": Function(
        "ring_attention",
        False,
        _attention_values,
        _attention_error,
        defaults={"layout": "contiguous"},
        submodule="sharded",
        fits=_ring_fits,
    ),
    "ring_zigzag": Function(
        "ring_attention",
        False,
        _attention_values,
        _attention_error,
        defaults={"layout": "zigzag"},
        submodule="sharded",
        fits=_zigzag_fits,
    ),
    "head_parallel": Function(
        "head_parallel_attention",
        False,
        _attention_values,
        _attention_error,
        submodule="sharded",
        fits=_heads_fit,
    ),
    "head_parallel_gqa": Function(
        "head_parallel_gqa",
        False,
        _module_sharded_values,
        _module_error,
        methods=(),
        submodule="sharded",
        fits=_heads_fit,
    ),
    "rope": Function("apply_rotary", False, _rope_values, _rope_error),
}

#: The aliases run once per shard count.
SHARDED_ALIASES: tuple[str, ...] = tuple(a for a, f in FUNCTIONS.items() if f.fits is not None)


def _check(port: Port, run: Run, device: str) -> tuple[str, float | None, float | None]:
    """Run one case; returns (message, error, bound) on success, raises _Failed otherwise."""
    case, spec = run.case, FUNCTIONS[run.function]
    if run.shards is not None:
        spec = replace(spec, defaults={**spec.defaults, "n_shards": run.shards})
    fn = port.function(run.function)
    if fn is None:
        raise _Failed(f"not implemented: port has no `{spec.attribute}`")
    if spec.methods is not None:
        _module_class(port, case, spec)  # "not implemented" before anything runs

    if case.kind == "error":
        want = case.entry["expected_error"]
        expected = f"{want['class']}[{want['code']}]"
        try:
            spec.error(port, fn, case, device, spec)
        except _Failed:  # the runner's own checks, or an adapter: not the port's answer
            raise
        except Exception as exc:  # the port's error, whatever it is, is the thing under test
            names = [c.__name__ for c in type(exc).__mro__]
            code = getattr(exc, "code", None)
            if want["class"] in names and code == want["code"]:
                return f"raised {expected}", None, None
            raise _Failed(
                f"raised {type(exc).__name__}[{code}] {_first_line(exc, 160)!r}"
                f"{_where_raised(exc)}, expected {expected}"
            ) from None
        raise _Failed(f"no error raised, expected {expected}")

    port.check_round_trip(case.dtype, device)
    errors: dict[str, float] = {}  # the largest error of each golden, over every comparison
    worst = (-1.0, 0.0, 0.0)  # (error / bound, error, bound) of the closest call
    for c in spec.values(port, fn, case, device, spec):
        bound = case.tolerance.get(c.name, 0.0)  # no bound: exact (causal_mask)
        try:
            err = _compare(c.got, c.want, c.dtype or case.dtype, bound, c.name)
        except _Failed as failed:
            raise _Failed(c.where + str(failed), failed.error, failed.bound) from None
        errors[c.name] = max(errors.get(c.name, 0.0), err)
        worst = max(worst, (err / bound if bound else 0.0, err, bound))
    _, err, bound = worst
    if not case.tolerance:
        return "exact", err, bound
    if run.function == "decode":
        chunks = case.entry["decode"]["chunks"]
        what = " and ".join(errors)
        return (
            f"{len(chunks)} steps {chunks}: {what} max error {err:.3g} <= bound {bound:.3g}",
            err,
            bound,
        )
    text = "; ".join(
        f"{n} max error {e:.3g} <= bound {case.tolerance[n]:.3g}" for n, e in errors.items()
    )
    return text, err, bound


def check(port: Port, run: Run, device: str = "cpu") -> Outcome:
    """Run one case against a port, apply its xfails, return the outcome."""
    listed = port.xfails.lookup(run.id, device)
    reason = "" if listed is None else listed.reason or "listed in xfails"
    base = dict(run_id=run.id, family=run.family, dtype=run.case.dtype, device=device)
    if listed is not None and listed.skip:
        return Outcome(**base, status="skip", message=f"skipped: {reason}", xfail_reason=reason)
    try:
        message, error, bound = _check(port, run, device)
    except _NoDevices as skipped:
        return Outcome(**base, status="skip", message=str(skipped), xfail_reason=reason)
    except _Failed as failed:
        return Outcome(
            **base,
            status="xfail" if listed else "fail",
            message=str(failed),
            error=failed.error,
            bound=failed.bound,
            xfail_reason=reason,
        )
    except Exception as exc:  # a bug in the port that escaped its own call
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return Outcome(
            **base,
            status="xfail" if listed else "fail",
            message=f"raised outside the port's call: {detail}{_where_raised(exc)}",
            xfail_reason=reason,
        )
    status = "xpass" if listed else "pass"
    return Outcome(
        **base, status=status, message=message, error=error, bound=bound, xfail_reason=reason
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
    complete: bool = True  # False while the run is going on, or when it was interrupted

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    @property
    def ok(self) -> bool:
        return not self.error and not self.failures and self.complete

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for o in self.outcomes:
            out[o.status] += 1
        return out

    def families(self) -> dict[str, list[Outcome]]:
        groups: dict[str, list[Outcome]] = {}
        for o in self.outcomes:
            groups.setdefault(o.family, []).append(o)
        return groups

    def summary(self) -> str:
        """``impl_numpy on cpu: 503 runs: 500 passed, 1 failed, ...``."""
        if self.error:
            return f"{self.port} [{self.device}]: could not load the port: {self.error}"
        c = self.counts()
        where = self.device + (" (NumPy port, computes on the host)" if self.host_port else "")
        parts = [f"{c[s]} {s}" for s in ("pass", "fail", "xfail", "xpass")]
        parts[:2] = [f"{c['pass']} passed", f"{c['fail']} failed"]
        parts += [f"{c['crash']} crashed"] * bool(c["crash"]) + [f"{c['skip']} skipped"] * bool(
            c["skip"]
        )
        note = "" if self.complete else " INCOMPLETE (interrupted)"
        return (
            f"{self.port} on {where}: {len(self.outcomes)} runs: {', '.join(parts)} "
            f"({self.seconds:.1f} s){note}"
        )

    def table(self, *, show_xfails: bool = False, failures: bool = True) -> str:
        """A compact table per family, then (``failures``) one line per failure."""
        if self.error:
            return self.summary()
        lines = [
            self.summary(),
            f"  {'family':<30} {'passed':>8} {'xfail':>6} {'skip':>5} {'failed':>7}  "
            "worst err/bound",
        ]
        for family, outs in sorted(self.families().items()):
            n_pass = sum(o.status == "pass" for o in outs)
            n_xfail = sum(o.status == "xfail" for o in outs)
            n_skip = sum(o.status == "skip" for o in outs)
            n_fail = sum(not o.ok for o in outs)
            ratios = [o.ratio for o in outs if o.status == "pass" and o.ratio is not None]
            worst = f"{max(ratios):.2f}" if ratios else "-"
            lines.append(
                f"  {family:<30} {f'{n_pass}/{len(outs)}':>8} {n_xfail or '':>6} "
                f"{n_skip or '':>5} {n_fail or '':>7}  {worst}"
            )
        if failures:
            for o in self.outcomes:
                if not o.ok or (show_xfails and o.status in ("xfail", "skip")):
                    lines.append("  " + o.line())
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "device": self.device,
            "ok": self.ok,
            "complete": self.complete,
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


def _matcher(pattern: str | None) -> Callable[[Run], bool] | None:
    """``-k``: a glob over run ids; a plain word matches anywhere in the id."""
    if not pattern:
        return None
    glob = pattern if any(ch in pattern for ch in "*?[") else f"*{pattern}*"
    return lambda run: fnmatch.fnmatchcase(run.id, glob)


def plan_runs(
    port: Port,
    *,
    functions: Iterable[str] | None = None,
    fixtures: str | Path | None = None,
    select: Callable[[Run], bool] | None = None,
    pattern: str | None = None,
    shards: Iterable[int] = DEFAULT_SHARDS,
) -> list[Run]:
    """The runs :func:`run_suite` makes, in order (``--list`` prints their ids)."""
    runs = runs_for(load_manifest(fixtures), select_functions(port, functions), shards)
    for keep in (select, _matcher(pattern)):
        if keep is not None:
            runs = [r for r in runs if keep(r)]
    return runs


def run_suite(
    port: str | ModuleType | Any,
    *,
    device: str = "cpu",
    functions: Iterable[str] | None = None,
    xfails: str | Path | Xfails | None = None,
    fixtures: str | Path | None = None,
    select: Callable[[Run], bool] | None = None,
    pattern: str | None = None,
    isolate: bool = False,
    on_outcome: Callable[[Report, Outcome], None] | None = None,
    shards: Iterable[int] = DEFAULT_SHARDS,
) -> Report:
    """Run every fixture against ``port`` on ``device`` and return the report.

    ``functions`` restricts (or, for optional ones such as ``flash``, demands) the aliases;
    ``select`` (a predicate) and ``pattern`` (a glob over run ids) filter the runs; ``shards``
    are the shard counts of the sharded aliases. A port that cannot be imported gives a report
    with ``error``. ``on_outcome(report, outcome)`` is called after every run, with the report
    so far (the CLI prints and saves it as it goes).

    ``isolate=True`` runs the port in child processes (``port`` must then be an importable
    name, and ``select`` is not available: use ``pattern``): a run that kills its process is
    reported as ``crash`` and the rest go on in a new child, which JAX finds with as many host
    devices as the largest shard count (:func:`_child_env`).
    """
    shards = tuple(shards)
    start = time.perf_counter()
    if isolate:
        if not isinstance(port, str) or select is not None:
            raise ValueError("isolate=True needs an importable port name and no select=")
        extra = xfails if isinstance(xfails, Xfails) else Xfails()
        if xfails is not None and not isinstance(xfails, Xfails):
            extra = Xfails.from_file(xfails)
        return _run_isolated(
            port, device, functions, extra, fixtures, pattern, on_outcome, start, shards
        )
    try:
        loaded = port if isinstance(port, Port) else load_port(port, xfails=xfails)
    except Exception as exc:
        name = port if isinstance(port, str) else getattr(port, "__name__", repr(port))
        return Report(str(name), device, [], error=f"{type(exc).__name__}: {exc}")
    runs = plan_runs(
        loaded, functions=functions, fixtures=fixtures, select=select, pattern=pattern,
        shards=shards,
    )  # fmt: skip
    host_port = loaded.numpy_native and device != "cpu"
    report = Report(loaded.name, device, [], host_port=host_port, complete=False)
    for run in runs:
        report.outcomes.append(check(loaded, run, device))
        report.seconds = time.perf_counter() - start
        if on_outcome is not None:
            on_outcome(report, report.outcomes[-1])
    report.complete = True
    report.seconds = time.perf_counter() - start
    return report


# ---------------------------------------------------------------------------------------------
# Running a port in child processes (conformance/worker.py is the child)
# ---------------------------------------------------------------------------------------------


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def _crash_site(stderr_text: str) -> str:
    """The innermost Python frame of faulthandler's dump in the child's stderr, if any."""
    for line in stderr_text.splitlines():
        line = line.strip()
        if line.startswith("File "):
            return line
    return ""


#: The XLA flag that makes JAX's CPU backend show n devices; read once, when JAX starts.
_HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def _child_env(devices: int = 1) -> dict[str, str]:
    """The environment of a worker: this process's, with everything on ``sys.path`` that can
    be imported from, so the child finds the port exactly as the parent would; and, when the
    sharded runs need ``devices`` > 1, ``XLA_FLAGS`` asking for that many CPU devices (a JAX
    port's mesh; unless the flags already say how many: then they are the user's)."""
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path.cwd()), *paths])
    flags = env.get("XLA_FLAGS", "")
    if devices > 1 and _HOST_DEVICES_FLAG not in flags:
        env["XLA_FLAGS"] = f"{flags} {_HOST_DEVICES_FLAG}={devices}".strip()
    return env


def _run_isolated(
    port: str,
    device: str,
    functions: Iterable[str] | None,
    xfails: Xfails,
    fixtures: str | Path | None,
    pattern: str | None,
    on_outcome: Callable[[Report, Outcome], None] | None,
    start: float,
    shards: tuple[int, ...],
) -> Report:
    job = {
        "port": port,
        "device": device,
        "functions": None if functions is None else list(functions),
        "xfails": xfails.to_json(),
        "fixtures": None if fixtures is None else str(fixtures),
        "pattern": pattern,
        "shards": list(shards),
        "only": None,
    }
    sharded = functions is None or any(f in SHARDED_ALIASES for f in functions)
    env = _child_env(max(shards, default=1) if sharded else 1)
    report = Report(port, device, [], complete=False)
    order: list[str] = []
    done: set[str] = set()
    known = Xfails()
    while True:
        current, error = None, None
        with tempfile.TemporaryFile("w+") as err:
            child = subprocess.Popen(
                [sys.executable, "-m", "conformance.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                text=True,
            )
            try:
                child.stdin.write(json.dumps(job))
                child.stdin.close()
                for line in child.stdout:
                    message = json.loads(line)
                    if "error" in message:
                        error = message["error"]
                    elif "plan" in message:
                        order = order or message["plan"]
                        report.port, report.host_port = message["port"], message["host_port"]
                        known = Xfails.from_json(message["xfails"])
                    elif "start" in message:
                        current = message["start"]
                    elif "outcome" in message:
                        outcome = Outcome(**message["outcome"])
                        report.outcomes.append(outcome)
                        done.add(outcome.run_id)
                        current = None
                        report.seconds = time.perf_counter() - start
                        if on_outcome is not None:
                            on_outcome(report, outcome)
                returncode = child.wait()
            except BaseException:  # KeyboardInterrupt: stop the child, keep what it gave
                child.kill()
                child.wait()
                raise
            err.seek(0)
            stderr_text = err.read()
        if error is not None:
            report.error = error
            break
        if returncode == 0 and current is None:
            report.complete = True
            break
        if current is None:  # died between runs (or before the first): nothing to blame
            report.error = (
                f"the worker process died ({_signal_name(returncode)}) outside any run; "
                f"its last words: {stderr_text.strip()[-300:]!r}"
            )
            break
        listed = known.lookup(current["run_id"], device)
        site = _crash_site(stderr_text)
        outcome = Outcome(
            **current,
            device=device,
            status="xfail" if listed is not None else "crash",
            message=f"crashed ({_signal_name(returncode)})" + (f": {site}" if site else ""),
            xfail_reason="" if listed is None else listed.reason or "listed in xfails",
        )
        report.outcomes.append(outcome)
        done.add(outcome.run_id)
        report.seconds = time.perf_counter() - start
        if on_outcome is not None:
            on_outcome(report, outcome)
        job["only"] = [run_id for run_id in order if run_id not in done]
        if not job["only"]:
            report.complete = True
            break
    report.seconds = time.perf_counter() - start
    return report


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
    failures = [o.line() for o in outcomes if o.status in ("fail", "crash")]
    return QuickCheckResult(not failures, len(outcomes), failures, loaded.name, device)


def _result_size(case: Case, op: str) -> int:
    shapes = case.entry["shapes"]
    name = {"weights": "weights", "causal_mask": "mask", "grad": "dq", "flash_grad": "dq"}.get(
        op, "output"
    )
    return math.prod(shapes[name])


def write_report(reports: Sequence[Report], path: str | Path) -> None:
    """Write the reports as JSON, atomically (a run killed while writing leaves the last one)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps([r.to_json() for r in reports], indent=1) + "\n")
    os.replace(tmp, path)
