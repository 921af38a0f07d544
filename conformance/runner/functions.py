"""The functions the suite knows: :data:`FUNCTIONS`, one row per alias, saying which attribute
of the port is called, with what (:mod:`conformance.runner.arguments`), and against which golden.

Each row has a ``values`` function, which calls the port on a value case and yields the
:class:`Comparison` s of its results with the goldens, and an ``error`` function, which makes
the call of an error case (that call must raise). Both build their arguments with the alias's
one builder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conformance.fixtures import Case
from conformance.runner.arguments import (
    _attention_arguments,
    _case_module,
    _causal_mask_arguments,
    _decode_arguments,
    _decode_cache,
    _module_arguments,
    _module_class,
    _quantize_arguments,
    _rope_arguments,
    _takes,
)
from conformance.runner.comparison import Comparison
from conformance.runner.failures import _Failed, _raised
from conformance.runner.paged import (  # paged key/value caches (Contract v3)
    _paged_arguments,
    _paged_values,
    _paged_write_arguments,
    _paged_write_values,
)

if TYPE_CHECKING:
    from conformance.runner.port import Port

#: Block sizes passed to ``flash_attention``: small and dividing neither L nor S of the fixtures
#: (L, S in 0..9), so every fixture spans several query and key blocks, with ragged last blocks.
FLASH_BLOCKS: dict[str, int] = {"block_q": 2, "block_k": 3}

#: The gradients of a ``*_vjp`` call, in the order of ``AttentionGrads``: (golden name, the
#: input whose gradient it is, and whose dtype it must have).
GRADS: tuple[tuple[str, str], ...] = (
    ("dq", "query"),
    ("dk", "key"),
    ("dv", "value"),
    ("dbias", "bias"),
    ("dsinks", "sinks"),
)


def module_forward(module: Any, x: Any, context: Any = None, **keywords: Any) -> Any:
    """The runner's module call: ``module(x, context, **keywords)``, or ``module(x,
    **keywords)`` for self-attention (a module without cross-attention, such as
    ``MultiHeadLatentAttention``, takes no context); wrapped by ``prepare``."""
    return module(x, **keywords) if context is None else module(x, context, **keywords)


def module_decode(module: Any, x: Any, cache: Any, **keywords: Any) -> Any:
    """The runner's decode step: ``module.decode(x, cache, **keywords)`` (wrapped by
    ``prepare``); returns ``(y, cache)`` or ``(y, weights, cache)``."""
    return module.decode(x, cache, **keywords)


def _split_result(result: Any, return_weights: bool, with_cache: bool) -> tuple[Any, Any, Any]:
    """(output, weights or None, cache or None) of a module call or a decode step."""
    parts = list(result) if (return_weights or with_cache) else [result]
    cache = parts.pop() if with_cache else None
    weights = parts.pop() if return_weights else None
    (output,) = parts
    return output, weights, cache


def _call(arguments: Callable[..., tuple[list[Any], dict[str, Any]]]) -> Callable[..., Any]:
    """The ``error`` of an alias that is one call: ``fn(*args, **kwargs)`` from its builder."""

    def error(port: Port, fn: Callable, case: Case, device: str, spec: Function) -> Any:
        args, kwargs = arguments(port, fn, case, device, spec)
        return fn(*args, **kwargs)

    error.__doc__ = f"The error case's call, with the arguments of ``{arguments.__name__}``."
    return error


def _attention_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """sdpa, weights, flash and the sharded attention: one golden (and a flash case's row
    log-sum-exp, when the function can return it)."""
    args, kwargs = _attention_arguments(port, fn, case, device, spec)
    t = case.tensors()
    lse = "lse" in t and _takes(fn, "return_lse")
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


def _grad_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """grad, flash_grad: ``fn(query, key, value, grad_output, **keywords)`` returns
    ``AttentionGrads(query, key, value, bias, sinks)`` (a named tuple, or any sequence in that
    order); each gradient the case has a golden for is compared, in its input's dtype."""
    args, kwargs = _attention_arguments(port, fn, case, device, spec)
    t = case.tensors()
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


def _causal_mask_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """causal_mask: the boolean (L, S) mask, exactly."""
    args, kwargs = _causal_mask_arguments(port, fn, case, device, spec)
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:
        raise _raised(exc) from exc
    yield Comparison("mask", port.array_out(result), case.tensors()["mask"])


def _rope_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """rope: ``apply_rotary(x, positions, **keywords)`` against the golden rotated x."""
    args, kwargs = _rope_arguments(port, fn, case, device, spec)
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:
        raise _raised(exc) from exc
    yield Comparison("output", port.array_out(result), case.tensors()["output"])


def _quantize_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """quantize: ``quantize_fp8(x, ...)`` returns ``(x_fp8, descale)``; both exactly, the fp8
    values in the case's format and the descale in float32 (Contract v3, fp8)."""
    args, kwargs = _quantize_arguments(port, fn, case, device, spec)
    t = case.tensors()
    try:
        values, descale = fn(*args, **kwargs)
    except Exception as exc:
        raise _raised(exc) from exc
    fmt = kwargs.get("dtype", "float8_e4m3fn")
    yield Comparison("output", port.array_out(values), t["output"], dtype=fmt)
    yield Comparison("output_descale", port.array_out(descale), t["output_descale"],
                     dtype="float32")


def _module_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """A module fixture: one forward call against the golden output (and weights)."""
    cls = _module_class(port, case, spec)
    (x, context), kwargs = _module_arguments(port, fn, case, device, spec)
    t = case.tensors()
    try:
        module = _case_module(cls, case, device)
        result = fn(module, x, context, **kwargs)
        output, weights, _ = _split_result(result, bool(kwargs.get("return_weights")), False)
    except Exception as exc:
        raise _raised(exc) from exc
    yield Comparison("output", port.array_out(output), t["output"])
    if weights is not None:
        yield Comparison("weights", port.array_out(weights), t["weights"])


def _module_sharded_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """A module fixture through ``head_parallel_gqa(module, x, context, n_shards=n, ...)``:
    the module loaded as for ``module``, its output against the golden (no weights)."""
    cls = _module_class(port, case, spec)
    (x, context), kwargs = _module_arguments(port, fn, case, device, spec)
    kwargs.pop("return_weights", None)  # head_parallel_gqa returns the output alone
    try:
        module = _case_module(cls, case, device)
        output = fn(module, x, context, **kwargs)
    except Exception as exc:
        raise _raised(exc) from exc
    yield Comparison("output", port.array_out(output), case.tensors()["output"])


def _decode_values(port: Port, fn: Callable, case: Case, device: str, spec: Function):
    """A decode fixture: the sequence fed in the case's chunks through ``init_cache`` and
    ``decode``; every step's rows against the same rows of the full causal forward."""
    cls = _module_class(port, case, spec)
    steps, kwargs = _decode_arguments(port, fn, case, device, spec)
    return_weights = bool(kwargs.get("return_weights"))
    t = case.tensors()
    try:
        module = _case_module(cls, case, device)
        cache = _decode_cache(cls, module, case, device, port)
    except Exception as exc:
        raise _raised(exc, "before decoding: ") from exc
    for step, (start, stop, new) in enumerate(steps):
        where = f"decode step {step + 1} of {len(steps)} (tokens {start}..{stop - 1}): "
        try:
            result = fn(module, new, cache, **kwargs)
            output, weights, cache = _split_result(result, return_weights, True)
        except Exception as exc:
            raise _raised(exc, where) from exc
        yield Comparison("output", port.array_out(output), t["output"][:, start:stop], where)
        if weights is not None:  # (B, H, n, S): these rows against the keys written so far
            want = t["weights"][:, :, start:stop, :stop]
            yield Comparison("weights", port.array_out(weights), want, where)


def _module_error(port: Port, fn: Callable, case: Case, device: str, spec: Function) -> Any:
    """Construct, load, call or decode as the error case says; the expected error must come."""
    entry = case.entry
    cls = _module_class(port, case, spec)
    if entry["call"] == "construct":
        return cls(**entry["module"]["arguments"])
    module = _case_module(cls, case, device)
    if entry["call"] == "load":
        return module
    if entry["call"] == "forward":
        (x, context), kwargs = _module_arguments(port, fn, case, device, spec)
        return fn(module, x, context, **kwargs)
    steps, kwargs = _decode_arguments(port, fn, case, device, spec)
    cache = _decode_cache(cls, module, case, device, port)
    for _, _, new in steps:
        *_, cache = fn(module, new, cache, **kwargs)
    return cache


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


def _ulysses_fits(case: Case, n: int) -> bool:
    """Ulysses over n devices: n divides H, L and S, and K % n == 0 or n % K == 0."""
    L, S, K = _sizes(case)
    H = case.entry["shapes"]["query"][-3]
    return H % n == 0 and L % n == 0 and S % n == 0 and (K % n == 0 or n % K == 0)


def _usp_fits(case: Case, n: int) -> bool:
    """USP over n = 2 r devices, u = 2 (:func:`_usp_sizes`), zigzag: n >= 4, 2 divides H,
    K % 2 == 0 or K == 1, and 2 u r = 2n divides L and S."""
    K, H = _sizes(case)[2], case.entry["shapes"]["query"][-3]
    heads_fit = H % 2 == 0 and (K % 2 == 0 or K == 1)
    return n >= 4 and n % 2 == 0 and heads_fit and _ring_fits(case, 2 * n)


def _usp_sizes(n: int) -> dict[str, int]:
    """USP's group sizes for n devices: Ulysses groups of 2, n / 2 of them in the ring."""
    return {"ulysses_shards": 2, "ring_shards": n // 2}


def _n_shards(n: int) -> dict[str, int]:
    """The keyword a sharded run adds: ``n_shards=n``."""
    return {"n_shards": n}


@dataclass(frozen=True)
class Function:
    """One row of the table: a port function the suite knows.

    ``attribute``: the port's function (for the module aliases, the class the port must have;
    the function run is then the runner's own ``call``, with the class ``methods`` it needs);
    looked for in the port's ``submodule`` too, when it has that. ``required``: every port is
    checked on it (optional ones run when present or asked for). ``values(port, fn, case,
    device, spec)`` yields :class:`Comparison` s of a value case; ``error(...)`` makes the call
    of an error case, which must raise. ``inputs``: the positional arrays of the attention
    aliases; ``golden``: the golden they compare; ``defaults``: keywords added to every call
    (flash's blocks, the ring's layout; a sharded run adds its ``n_shards``). ``fits(case,
    n)``: a sharded alias, run with each n of ``--shards`` for which it says True;
    ``shard_keywords(n)``: the keywords that give the call its n devices (``n_shards=n``; USP:
    its two group sizes).
    """

    attribute: str
    required: bool
    values: Callable[..., Iterator[Comparison]]
    error: Callable[..., Any]
    inputs: tuple[str, ...] = ("query", "key", "value")
    golden: str = "output"
    defaults: dict[str, Any] = field(default_factory=dict)
    call: Callable[..., Any] | None = None
    methods: tuple[str, ...] | None = None
    submodule: str | None = None
    #: Where ``submodule``'s functions were looked for before (kept with a DeprecationWarning).
    old_submodule: str | None = None
    fits: Callable[[Case, int], bool] | None = None
    shard_keywords: Callable[[int], dict[str, int]] = _n_shards


#: The error case of the attention aliases and their ``*_vjp``: the value case's call, on zeros.
_attention_error = _call(_attention_arguments)
_GRAD_INPUTS = ("query", "key", "value", "grad_output")
#: varlen_attention's positional arrays (contract v3).
_VARLEN_INPUTS = ("query", "key", "value", "cu_seqlens_q", "cu_seqlens_k")

#: Alias -> port function. A new op adds a row here (and its case file and fixture builder).
FUNCTIONS: dict[str, Function] = {
    "sdpa": Function("scaled_dot_product_attention", True, _attention_values, _attention_error),
    "weights": Function(
        "attention_weights",
        True,
        _attention_values,
        _attention_error,
        inputs=("query", "key"),
        golden="weights",
    ),
    "causal_mask": Function(
        "causal_mask", True, _causal_mask_values, _call(_causal_mask_arguments)
    ),
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
    "grad": Function(
        "scaled_dot_product_attention_vjp",
        False,
        _grad_values,
        _attention_error,
        inputs=_GRAD_INPUTS,
    ),
    "flash_grad": Function(
        "flash_attention_vjp",
        False,
        _grad_values,
        _attention_error,
        inputs=_GRAD_INPUTS,
        defaults=FLASH_BLOCKS,
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
    "ulysses": Function(
        "ulysses_attention",
        False,
        _attention_values,
        _attention_error,
        submodule="ulysses",
        old_submodule="sharded",
        fits=_ulysses_fits,
    ),
    "usp": Function(
        "usp_attention",
        False,
        _attention_values,
        _attention_error,
        defaults={"layout": "zigzag"},
        submodule="ulysses",
        old_submodule="sharded",
        fits=_usp_fits,
        shard_keywords=_usp_sizes,
    ),
    "rope": Function("apply_rotary", False, _rope_values, _call(_rope_arguments)),
    # -- variable-length batches (contract v3): token-major arrays and the boundaries --------
    "varlen": Function(
        "varlen_attention", False, _attention_values, _attention_error, inputs=_VARLEN_INPUTS
    ),
    "varlen_grad": Function(
        "varlen_attention_vjp",
        False,
        _grad_values,
        _attention_error,
        inputs=(*_VARLEN_INPUTS, "grad_output"),
    ),
    "varlen_flash": Function(
        "varlen_flash_attention",
        False,
        _attention_values,
        _attention_error,
        inputs=_VARLEN_INPUTS,
        defaults=FLASH_BLOCKS,
    ),
    "varlen_flash_grad": Function(
        "varlen_flash_attention_vjp",
        False,
        _grad_values,
        _attention_error,
        inputs=(*_VARLEN_INPUTS, "grad_output"),
        defaults=FLASH_BLOCKS,
    ),
    # -- paged key/value caches (Contract v3): conformance/runner/paged.py --------------------
    "paged": Function("paged_attention", False, _paged_values, _call(_paged_arguments)),
    "paged_flash": Function("paged_flash_attention", False, _paged_values, _call(_paged_arguments)),
    "paged_write": Function(
        "paged_cache_write", False, _paged_write_values, _call(_paged_write_arguments)
    ),
    # -- fp8 (Contract v3): quantize_fp8, exact ----------------------------------------------
    "quantize": Function("quantize_fp8", False, _quantize_values, _call(_quantize_arguments)),
}

#: The aliases run once per shard count.
SHARDED_ALIASES: tuple[str, ...] = tuple(a for a, f in FUNCTIONS.items() if f.fits is not None)
