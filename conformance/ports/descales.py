"""Contract v3's fp8 descales for the framework ports, whose kernels take no descale argument.

An fp8 input stands for ``float(x) * descale`` (SEMANTICS.md, "FP8 inputs and caches"). No
framework kernel measured here has ``q_descale``/``k_descale``/``v_descale`` arguments, so a
user of one hands it the fp8 tensors as they are and folds the descales into the arguments it
has. :func:`takes_descales` does that, and no more: it never dequantizes an input, so what is
measured is whether the framework's kernel takes fp8.

- ``q_descale * k_descale`` multiplies every score, so it joins ``scale`` (the contract's
  default 1/sqrt(D) when none is given) where each is one number: a Python number or an array
  of one element. A kernel's ``scale`` is one number, so a query or key descale that differs
  per head (or per batch row, or per sequence) cannot be folded into it: NotImplementedError,
  before the kernel runs;
- ``v_descale`` multiplies every value row of a key/value head, so it multiplies the output
  rows of the query heads of that group (contiguous groups): exact for any heads-first descale
  shape ``(..., K)``, and for ``()`` or ``(K,)`` token-major; the product is taken in float32
  on the kernel's output. A per-sequence ``(N, K)`` token-major one needs the sequences' rows:
  NotImplementedError;
- the result is then the contract's dtype: bfloat16 for an fp8 query, else the query's dtype.

Each framework casts and multiplies its own arrays: the ``*_output`` functions below.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "DESCALES",
    "folded_scale",
    "is_fp8",
    "jax_output",
    "numpy_output",
    "takes_descales",
    "torch_output",
    "value_factor",
    "without_descales",
]

#: The descale keywords of the attention functions (contract v3).
DESCALES = ("q_descale", "k_descale", "v_descale")

#: An output function: (kernel output, the query, the float32 v_descale factor shaped to
#: broadcast against the output, or None) -> the result in the contract's dtype.
Output = Callable[[Any, Any, "np.ndarray | None"], Any]


def is_fp8(dtype: Any) -> bool:
    """Whether ``dtype`` (NumPy's, torch's, JAX's, or its name) is one of the fp8 formats."""
    return any(name in str(dtype) for name in ("float8_e4m3fn", "float8_e5m2"))


def _number(descale: Any) -> float | None:
    """A descale as one float32 number (a number, or an array of one element), else None."""
    if isinstance(descale, (int, float, np.number)):
        return float(np.float32(descale))
    if math.prod(tuple(getattr(descale, "shape", ()))) == 1:
        return float(np.asarray(descale, np.float32).reshape(()))
    return None


def folded_scale(
    scale: float | None, head_dim: int, q_descale: Any, k_descale: Any, kernel: str
) -> float | None:
    """``scale`` (None: 1/sqrt(``head_dim``)) times the query and key descales, one number;
    ``scale`` itself when neither descale is given. A descale that is not one number raises
    NotImplementedError naming ``kernel``, whose scale is a number."""
    if q_descale is None and k_descale is None:
        return scale
    factor = 1.0
    for name, descale in (("q_descale", q_descale), ("k_descale", k_descale)):
        if descale is None:
            continue
        number = _number(descale)
        if number is None:
            raise NotImplementedError(
                f"{kernel} takes one number as its scale and no descales: the {name} of shape "
                f"{tuple(descale.shape)} (one per head, batch row or sequence) cannot be folded "
                "into it"
            )
        factor *= number
    return (1.0 / math.sqrt(head_dim) if scale is None else float(scale)) * factor


def value_factor(
    v_descale: Any, heads: int, kv_heads: int, *, token_major: bool = False
) -> np.ndarray | None:
    """``v_descale`` as float32 factors of the output's rows: heads-first (..., H, 1, 1) of an
    output (..., H, L, E), token-major (H, 1) of (T, H, E); each key/value head's descale
    repeated over the query heads of its group. None when not given."""
    if v_descale is None:
        return None
    factor = np.asarray(v_descale, np.float32)
    if token_major and factor.ndim > 1:
        raise NotImplementedError(
            f"a per-sequence v_descale {factor.shape} multiplies each sequence's output rows: "
            "this wrapper folds only a number or one descale per head"
        )
    if factor.ndim and factor.shape[-1] == kv_heads and kv_heads != heads:
        factor = np.repeat(factor, heads // kv_heads, axis=-1)  # contiguous groups
    return factor[..., None] if token_major else factor[..., None, None]


def takes_descales(
    kernel: str, output: Output, *, token_major: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a port function ``f(query, key, [value,] *, scale=None, ...)`` the keywords
    ``q_descale``, ``k_descale`` and ``v_descale``: the first two folded into ``scale``
    (:func:`folded_scale`, ``kernel`` naming the framework's kernel in its error), ``f`` called
    on the inputs as they are, its output multiplied by ``v_descale`` (:func:`value_factor`)
    and put in the contract's dtype by ``output``. A call with neither a descale nor an fp8
    query is ``f``'s own. The signature the runner reads is ``f``'s with the three keywords."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        head_axis = -2 if token_major else -3

        def call(
            query: Any,
            key: Any,
            *args: Any,
            q_descale: Any = None,
            k_descale: Any = None,
            v_descale: Any = None,
            **keywords: Any,
        ) -> Any:
            if q_descale is None and k_descale is None and v_descale is None:
                if not is_fp8(query.dtype):
                    return function(query, key, *args, **keywords)
            scale = folded_scale(
                keywords.pop("scale", None), query.shape[-1], q_descale, k_descale, kernel
            )
            factor = value_factor(
                v_descale, query.shape[head_axis], key.shape[head_axis], token_major=token_major
            )
            out = function(query, key, *args, scale=scale, **keywords)
            return output(out, query, factor)

        functools.update_wrapper(call, function)
        del call.__wrapped__  # the signature is f's plus the descales, not f's alone
        signature = inspect.signature(function)
        params = list(signature.parameters.values())
        at = next(
            (i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD),
            len(params),
        )
        added = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Any)
            for name in DESCALES
            if name not in signature.parameters
        ]
        call.__signature__ = signature.replace(parameters=params[:at] + added + params[at:])
        return call

    return decorate


def without_descales(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` under the signature of the function it decorates (its parameters without
    the descales), for a jit that must not see them (:mod:`conformance.ports.jax_fused`)."""

    def call(*args: Any, **keywords: Any) -> Any:
        return function(*args, **keywords)

    signature = inspect.signature(function)
    call.__signature__ = signature.replace(
        parameters=[p for n, p in signature.parameters.items() if n not in DESCALES]
    )
    call.__name__ = getattr(function, "__name__", "call")
    return call


def _result_dtype_name(query: Any) -> str | None:
    """``"bfloat16"`` for an fp8 query, else None (the query's own dtype)."""
    return "bfloat16" if is_fp8(query.dtype) else None


def numpy_output(out: Any, query: Any, factor: np.ndarray | None) -> np.ndarray:
    """A NumPy output times ``factor`` (in float32), in the contract's dtype."""
    out = np.asarray(out)
    target = ml_dtypes.bfloat16 if _result_dtype_name(query) else np.asarray(query).dtype
    if factor is not None:
        out = out.astype(np.float32) * factor
    return out.astype(target)


def torch_output(out: Any, query: Any, factor: np.ndarray | None) -> Any:
    """A torch output times ``factor`` (in float32), in the contract's dtype."""
    import torch

    target = torch.bfloat16 if _result_dtype_name(query) else query.dtype
    if factor is not None:
        out = out.to(torch.float32) * torch.from_numpy(factor).to(out.device)
    return out.to(target)


def jax_output(out: Any, query: Any, factor: np.ndarray | None) -> Any:
    """A JAX output times ``factor`` (in float32), in the contract's dtype."""
    import jax.numpy as jnp

    target = jnp.bfloat16 if _result_dtype_name(query) else query.dtype
    if factor is not None:
        out = out.astype(jnp.float32) * jnp.asarray(factor)
    return out.astype(target)
