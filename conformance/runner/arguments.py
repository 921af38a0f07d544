"""What the port is called with: one argument builder per function alias, for value and error
cases alike.

A value case's inputs are its tensors; an error case's are zeros of the shapes and dtypes its
manifest entry gives (dtype ``"none"``: the argument is None). :func:`_case_arrays` gives
either as NumPy, and each builder turns them, through the port's ``from_numpy``, into the
arguments of the alias's call. The value path (:mod:`conformance.runner.functions`) then
compares the results with the goldens; the error path makes the same call and expects it to
raise. So a value case and an error case of one alias differ only in their numbers.

========================================== ==================================================
builder                                    aliases
========================================== ==================================================
:func:`_attention_arguments`               sdpa, weights, flash, grad, flash_grad, ring,
                                           ring_zigzag, head_parallel, ulysses, usp
:func:`_causal_mask_arguments`             causal_mask
:func:`_rope_arguments`                    rope
:func:`_quantize_arguments`                quantize (contract v3's quantize_fp8)
:func:`_module_arguments`                  module, head_parallel_gqa (and :func:`_case_module`)
:func:`_decode_arguments`                  decode (and :func:`_case_module`,
                                           :func:`_decode_cache`)
========================================== ==================================================
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from conformance.fixtures import ARRAY_KEYWORDS, KEYWORD_GROUPS, NP_DTYPES, Case
from conformance.runner.failures import _Failed

if TYPE_CHECKING:
    from conformance.runner.functions import Function
    from conformance.runner.port import Port

#: The array keywords of a module call and of a decode step (a module's ``sinks`` are weights).
MODULE_ARRAYS: tuple[str, ...] = ("mask", "bias", "q_segment_ids", "kv_segment_ids")

Arguments = tuple[list[Any], dict[str, Any]]


def _zeros(spec: dict[str, Any]) -> np.ndarray | None:
    """Zeros of one input spec of an error case (``{"shape", "dtype"}``; dtype "none": None),
    or its ``values`` when it gives them (an fp8 case's descales: zeros are an error of their
    own), row-major."""
    if spec["dtype"] == "none":
        return None
    dtype = NP_DTYPES[spec["dtype"]]
    if "values" in spec:
        return np.asarray(spec["values"], np.float64).astype(dtype).reshape(spec["shape"])
    return np.zeros(spec["shape"], dtype=dtype)


def _case_arrays(case: Case) -> dict[str, np.ndarray | None]:
    """The case's arrays by name, as NumPy: a value case's tensors (its goldens among them), or
    zeros of an error case's inputs."""
    if case.kind == "error":
        return {name: _zeros(spec) for name, spec in case.entry.get("inputs", {}).items()}
    return case.tensors()


def _in(port: Port, array: np.ndarray | None, device: str) -> Any:
    """``array`` through the port's ``from_numpy`` (None stays None)."""
    return None if array is None else port.array_in(array, device)


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


def _attention_arguments(
    port: Port, fn: Callable, case: Case, device: str, spec: Function
) -> Arguments:
    """``fn(*positional, **keywords)`` of the attention functions and their ``*_vjp``: the
    alias's positional arrays (``spec.inputs``: query, key and, but for weights, value; the
    gradients' grad_output), the array keywords the case has (mask, bias, ...), then the
    alias's defaults and the case's keywords. A keyword the port's signature lacks fails here,
    saying what to do."""
    arrays = _case_arrays(case)
    kwargs = dict(spec.defaults) | dict(case.keywords)
    for name in ARRAY_KEYWORDS:
        if name in arrays:
            kwargs[name] = _in(port, arrays[name], device)
    if "value" not in spec.inputs:  # attention_weights reads no value: no v_descale either
        kwargs.pop("v_descale", None)
    args = [_in(port, arrays[name], device) for name in spec.inputs]
    _require_keywords(fn, kwargs)
    return args, kwargs


def _causal_mask_arguments(
    port: Port, fn: Callable, case: Case, device: str, spec: Function
) -> Arguments:
    """``causal_mask(q_len, kv_len, alignment=...)``: plain numbers, from the case's keywords."""
    kwargs = dict(case.keywords)
    return [kwargs.pop("q_len"), kwargs.pop("kv_len")], kwargs


def _rope_arguments(port: Port, fn: Callable, case: Case, device: str, spec: Function) -> Arguments:
    """``apply_rotary(x, positions, **keywords)``, with ``inv_freq=`` when the case has it."""
    arrays = _case_arrays(case)
    x, positions = _in(port, arrays["x"], device), _in(port, arrays["positions"], device)
    scaled = {"inv_freq": _in(port, arrays["inv_freq"], device)} if "inv_freq" in arrays else {}
    return [x, positions], dict(case.keywords) | scaled


def _quantize_arguments(
    port: Port, fn: Callable, case: Case, device: str, spec: Function
) -> Arguments:
    """``quantize_fp8(x, **keywords)`` (Contract v3, fp8): x, the case's keywords (``dtype``,
    ``axes``, a scalar ``descale``) and ``descale=`` when the case stores a static array."""
    arrays = _case_arrays(case)
    kwargs = dict(case.keywords)
    if "descale" in arrays:
        kwargs["descale"] = _in(port, arrays["descale"], device)
    _require_keywords(fn, kwargs)
    return [_in(port, arrays["x"], device)], kwargs


def _module_keywords(port: Port, case: Case, device: str, spec: Function) -> dict[str, Any]:
    """The keywords of a module call or a decode step: the alias's defaults, the case's
    keywords, and the array keywords the case has (:data:`MODULE_ARRAYS`)."""
    arrays = _case_arrays(case)
    kwargs = dict(spec.defaults) | dict(case.keywords)
    for name in MODULE_ARRAYS:
        if name in arrays:
            kwargs[name] = _in(port, arrays[name], device)
    return kwargs


def _module_arguments(
    port: Port, fn: Callable, case: Case, device: str, spec: Function
) -> Arguments:
    """``fn(module, x, context, **keywords)`` but the module (:func:`_case_module`): x, the
    context (None for self-attention) and :func:`_module_keywords`."""
    arrays = _case_arrays(case)
    x, context = _in(port, arrays["x"], device), _in(port, arrays.get("context"), device)
    return [x, context], _module_keywords(port, case, device, spec)


def _decode_arguments(
    port: Port, fn: Callable, case: Case, device: str, spec: Function
) -> tuple[list[tuple[int, int, Any]], dict[str, Any]]:
    """``fn(module, x[:, start:stop], cache, **keywords)`` of each step of the case's chunks:
    the steps ``(start, stop, x[:, start:stop])`` and :func:`_module_keywords`."""
    x = _case_arrays(case)["x"]  # (B, T, M)
    steps, start = [], 0
    for n in case.entry["decode"]["chunks"]:
        steps.append((start, start + n, _in(port, x[:, start : start + n], device)))
        start += n
    return steps, _module_keywords(port, case, device, spec)


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


def _zero_weights(specs: dict[str, dict[str, Any]]) -> dict[str, np.ndarray]:
    """Zeros of an error case's weight specs, by name."""
    return {name: np.zeros(s["shape"], NP_DTYPES[s["dtype"]]) for name, s in specs.items()}


def _case_module(cls: Any, case: Case, device: str) -> Any:
    """The case's module, loaded with :func:`_load_module`: a value case's canonical weights
    (names ending in .kernel, .bias or .weight (MLA's norms), and ``sinks``) in the case's
    dtype; an error case's zero weights in their own dtypes (the error may be theirs)."""
    if case.kind == "error":
        return _load_module(cls, case.entry["module"], _zero_weights(case.entry["weights"]),
                            None, device)
    tensors = case.tensors()
    names = [n for n in tensors if n.endswith((".kernel", ".bias", ".weight")) or n == "sinks"]
    weights = {n: np.array(tensors[n]) for n in names}
    return _load_module(cls, case.entry["module"], weights, case.dtype, device)


def _decode_cache(cls: Any, module: Any, case: Case, device: str, port: Port | None = None) -> Any:
    """``init_cache(batch_size, max_len)`` of the case's decode plan (``rolling=True`` only for
    a rolling cache, ``page_size=`` only for a paged one, ``dtype=`` and ``k_descale=``/
    ``v_descale=`` only for an fp8 one, so a port without them still runs every plain decode
    case); an error
    case's plan may give the batch size, and a ``cache_from``: another module (other sizes,
    another dtype) makes the cache. A descale list becomes a float32 array of the port
    (``port`` None: a NumPy array)."""
    plan = case.entry["decode"]
    maker = module
    if "cache_from" in plan:
        other = plan["cache_from"]
        spec = {"class": case.entry["module"]["class"], "n_heads": other["n_heads"],
                "n_kv_heads": other["n_kv_heads"]}
        maker = _load_module(cls, spec, _zero_weights(other["weights"]), None, device)
    x = _case_arrays(case)["x"]  # (B, T, M)
    batch_size = plan.get("batch_size", x.shape[0])
    rolling = {"rolling": True} if plan.get("rolling") else {}
    paged = {"page_size": plan["page_size"]} if "page_size" in plan else {}  # paged (v3)
    fp8 = {"dtype": plan["cache_dtype"]} if "cache_dtype" in plan else {}  # an fp8 cache (v3)
    for name in ("k_descale", "v_descale"):
        if name in plan:
            given = plan[name]
            if isinstance(given, list):
                given = np.asarray(given, np.float32)
                given = given if port is None else _in(port, given, device)
            fp8[name] = given
    return maker.init_cache(batch_size, plan["max_len"], **rolling, **paged, **fp8)
