"""A port: the module under test plus the adapters that carry NumPy arrays in and out of it.

:func:`load_port` resolves a name, a module or an object into a :class:`Port`, attaching the
port's own ``from_numpy``/``to_numpy``/``prepare``, or the built-in adapters for ``impl_torch``
and ``impl_jax`` (:data:`conformance.ports.BUILTIN_ADAPTERS`), or NumPy in and out; and its
xfails file. An exception inside an adapter is reported naming the adapter (:func:`_adapter`).
"""

from __future__ import annotations

import importlib
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from conformance.fixtures import NP_DTYPES
from conformance.ports import BUILTIN_ADAPTERS, SHORT_NAMES
from conformance.runner.exec_port import EXEC_PREFIX, ExecPort
from conformance.runner.failures import _AdapterFailed, _first_line, _frame
from conformance.runner.functions import FUNCTIONS
from conformance.runner.xfails import Xfails


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
    kernel_tolerance: bool = False  # the port's KERNEL_TOLERANCE: fp8's kernel bound (FORMAT.md)
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
            if fn is None and spec.old_submodule is not None:  # before 2026-12-03: sharded
                fn = getattr(_submodule(self.module, spec.old_submodule), spec.attribute, None)
                if fn is not None:
                    warnings.warn(
                        f"{self.name}.{spec.old_submodule}.{spec.attribute}: the runner looks for "
                        f"it in the port's {spec.submodule} submodule (or its top level) now; "
                        f"its {spec.old_submodule} submodule is read until the next minor version",
                        DeprecationWarning,
                        stacklevel=2,
                    )
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
        case with a misleading dtype message about its own output. The fp8 formats too (their
        bytes: safetensors F8_E4M3 and F8_E5M2, ``ml_dtypes`` in NumPy)."""
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
    ``package.module:object``, or ``exec:CMD ARGS``, an executable driven over the protocol of
    :mod:`conformance.runner.exec_port`) into a :class:`Port`.

    The adapters are the port's own ``from_numpy``/``to_numpy`` when it defines them, else the
    built-in ones for ``impl_torch``/``impl_jax``, else NumPy in and out. The xfails are the
    port's own file (``<module>.xfails`` next to its source, if any) plus ``xfails``.
    """
    if isinstance(port, str) and port.startswith(EXEC_PREFIX):  # --exec CMD: any language
        module, name = ExecPort(port.removeprefix(EXEC_PREFIX)), port
    elif isinstance(port, str):
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
    kernel = bool(getattr(module, "KERNEL_TOLERANCE", False))
    return Port(name, module, from_np, to_np, known, numpy_native, prepare, kernel)
