"""The runner's paged key/value cache functions (Contract v3): the calls of ``paged``
(``paged_attention``) and ``paged_write`` (``paged_cache_write``), for value and error cases.

An error case of these gives its integer inputs (block table, sequence lengths, offsets, slots)
with their ``values`` in the input spec (the value checks need them); the floating ones are
zeros, as in every error case.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from conformance.fixtures import NP_DTYPES, Case
from conformance.runner.arguments import Arguments, _in, _require_keywords
from conformance.runner.comparison import Comparison
from conformance.runner.failures import _raised

if TYPE_CHECKING:
    from conformance.runner.functions import Function
    from conformance.runner.port import Port

#: The positional inputs of each alias, in order; the array keywords of ``paged`` (an fp8 case's
#: descale arrays among them: ``paged.fp8.*`` stores them as float32 inputs, numbers as keywords).
PAGED_INPUTS = ("query", "key_cache", "value_cache", "block_table", "seq_lens", "cu_seqlens_q")
PAGED_WRITE_INPUTS = ("key_cache", "value_cache", "key", "value", "slot_mapping")
PAGED_ARRAYS = ("sinks", "alibi_slopes", "q_descale", "k_descale", "v_descale")


def _spec_array(spec: dict[str, Any]) -> np.ndarray | None:
    """An error case's input: its ``values`` when given (integer inputs), else zeros."""
    if spec["dtype"] == "none":
        return None
    if "values" in spec:
        return np.asarray(spec["values"], NP_DTYPES[spec["dtype"]]).reshape(spec["shape"])
    return np.zeros(spec["shape"], dtype=NP_DTYPES[spec["dtype"]])


def _arrays(case: Case) -> dict[str, np.ndarray | None]:
    if case.kind == "error":
        return {name: _spec_array(spec) for name, spec in case.entry["inputs"].items()}
    return case.tensors()


def _paged_arguments(
    port: Port, fn: Callable, case: Case, device: str, spec: Function
) -> Arguments:
    """``paged_attention(query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q,
    **arrays, **keywords)``."""
    arrays = _arrays(case)
    kwargs = dict(spec.defaults) | dict(case.keywords)
    for name in PAGED_ARRAYS:
        if name in arrays:
            kwargs[name] = _in(port, arrays[name], device)
    _require_keywords(fn, kwargs)
    return [_in(port, arrays[name], device) for name in PAGED_INPUTS], kwargs


def _paged_write_arguments(
    port: Port, fn: Callable, case: Case, device: str, spec: Function
) -> Arguments:
    """``paged_cache_write(key_cache, value_cache, key, value, slot_mapping)``."""
    arrays = _arrays(case)
    return [_in(port, arrays[name], device) for name in PAGED_WRITE_INPUTS], {}


def _paged_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """paged: the output ``(T, H, E)`` against the golden."""
    args, kwargs = _paged_arguments(port, fn, case, device, spec)
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:
        raise _raised(exc) from exc
    yield Comparison("output", port.array_out(result), case.tensors()["output"])


def _paged_write_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """paged_write: the two caches it returns against the golden caches, exactly (a port that
    writes in place returns the arrays it was given)."""
    args, kwargs = _paged_write_arguments(port, fn, case, device, spec)
    t = case.tensors()
    try:
        key_cache, value_cache = fn(*args, **kwargs)
    except Exception as exc:
        raise _raised(exc) from exc
    yield Comparison("key_cache_out", port.array_out(key_cache), t["key_cache_out"])
    yield Comparison("value_cache_out", port.array_out(value_cache), t["value_cache_out"])
