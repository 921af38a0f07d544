"""The three implementations' modules behind one small adapter each; the oracle's module.

Test inputs and canonical weights are made in NumPy; each adapter builds its framework's module
from the canonical dict and runs it on exact copies of the inputs; results come back as NumPy.

:func:`reference_forward` is the expected value of the module tests: the float64 oracle's module
(``conformance.oracle.module_forward``, the module of SEMANTICS.md written out element by element
from the canonical weights only, no implementation), on inputs and weights of any dtype.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
from flax import nnx

import impl_jax.modules
import impl_numpy.modules
import impl_torch.modules
from conformance.oracle import module_forward
from tests.frameworks import FRAMEWORKS, NP_DTYPES

# Pairwise-distinct sizes: a swapped axis is a shape error or a wrong number, never a pass.
B, H, K, L, S, D, E, M = 2, 6, 2, 5, 7, 11, 13, 17


def reference_forward(
    weights: dict[str, np.ndarray],
    x: np.ndarray,
    context: np.ndarray | None,
    *,
    n_heads: int,
    n_kv_heads: int,
    **kw: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """The oracle's module in float64: output ``(B, L, M)`` and weights ``(B, H, L, S)``, from
    canonical ``weights``, ``x (B, L, M)`` and ``context (B, S, M)`` (or None) of any dtype and
    the keywords of :func:`conformance.oracle.module_forward` (mask, bias, is_causal, ...)."""
    w64 = {name: np.asarray(a, np.float64) for name, a in weights.items()}
    context = None if context is None else np.asarray(context, np.float64)
    golden = module_forward(
        w64, np.asarray(x, np.float64), context, n_heads=n_heads, n_kv_heads=n_kv_heads, **kw
    )
    return golden.output, golden.weights


def reference_plain(
    weights: dict[str, np.ndarray],
    x: np.ndarray,
    context: np.ndarray | None,
    *,
    n_heads: int,
    n_kv_heads: int,
    **kw: Any,
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The plain same-dtype module of the tolerance rule for the same call, in x's dtype
    (``module_forward(..., round_to=dtype)``): output and weights, the ``plain`` of
    ``oracle.assert_within``; None for float64, whose plain computation is the oracle itself."""
    dtype = np.asarray(x).dtype.name
    if dtype == "float64":
        return None, None
    w64 = {name: np.asarray(a, np.float64) for name, a in weights.items()}
    context = None if context is None else np.asarray(context, np.float64)
    plain = module_forward(w64, np.asarray(x, np.float64), context, n_heads=n_heads,
                           n_kv_heads=n_kv_heads, **kw, round_to=dtype)
    return plain.output, plain.weights


@dataclass(frozen=True)
class ModuleFramework:
    name: str
    modules: ModuleType

    def asarray(self, a: Any) -> Any:
        return FRAMEWORKS[self.name].asarray(a)

    def to_numpy(self, a: Any) -> np.ndarray:
        return FRAMEWORKS[self.name].to_numpy(a)

    def build(self, weights: dict[str, np.ndarray], n_heads: int, n_kv_heads: int, **kw) -> Any:
        """``GroupedQueryAttention.from_canonical``, the documented loading function."""
        return self.modules.GroupedQueryAttention.from_canonical(
            weights, n_heads=n_heads, n_kv_heads=n_kv_heads, **kw
        )

    def forward(self, module: Any, x: np.ndarray, context: np.ndarray | None = None, **kw):
        """``module(x, context, **kw)`` on NumPy inputs; NumPy output (and weights).

        JAX runs under ``nnx.jit``: eager JAX compiles every primitive anew for each new shape,
        which costs seconds per test case; one compilation of the whole call costs a fraction.
        """
        arrays = {n: self.asarray(a) for n, a in kw.items() if isinstance(a, np.ndarray)}
        static = tuple(sorted((n, a) for n, a in kw.items() if not isinstance(a, np.ndarray)))
        ctx = None if context is None else self.asarray(context)
        call = _jitted_call(static) if self.name == "jax" else _plain_call(static)
        return self._numpy(call(module, self.asarray(x), ctx, arrays))

    def decode(self, module: Any, x: np.ndarray, cache: Any, **kw):
        """``module.decode(x, cache, **kw)`` on NumPy inputs: NumPy output(s) and the cache."""
        arrays = {n: self.asarray(a) for n, a in kw.items() if isinstance(a, np.ndarray)}
        static = tuple(sorted((n, a) for n, a in kw.items() if not isinstance(a, np.ndarray)))
        call = _jitted_decode(static) if self.name == "jax" else _plain_decode(static)
        *outputs, cache = call(module, self.asarray(x), cache, arrays)
        return (*self._numpy(tuple(outputs)), cache)

    def _numpy(self, result):
        if isinstance(result, tuple):
            return tuple(self.to_numpy(r) for r in result)
        return self.to_numpy(result)


def _plain_call(static):
    return lambda m, x, ctx, arrays: m(x, ctx, **arrays, **dict(static))


def _plain_decode(static):
    return lambda m, x, cache, arrays: m.decode(x, cache, **arrays, **dict(static))


@functools.cache
def _jitted_call(static):
    return nnx.jit(_plain_call(static))


@functools.cache
def _jitted_decode(static):
    return nnx.jit(_plain_decode(static))


MODULE_FRAMEWORKS = {
    "numpy": ModuleFramework("numpy", impl_numpy.modules),
    "torch": ModuleFramework("torch", impl_torch.modules),
    "jax": ModuleFramework("jax", impl_jax.modules),
}


def random_canonical(
    rng: np.random.Generator, *, M=M, H=H, K=K, D=D, E=E, bias=True, dtype="float64"
) -> dict[str, np.ndarray]:
    """Canonical weights with entries of order 1/sqrt(in) (so activations stay of order 1)."""
    shapes = {
        "q_proj": (M, H * D),
        "k_proj": (M, K * D),
        "v_proj": (M, K * E),
        "o_proj": (H * E, M),
    }
    weights = {}
    for name, (n_in, n_out) in shapes.items():
        weights[f"{name}.kernel"] = rng.standard_normal((n_in, n_out)) / math.sqrt(n_in)
        if bias:
            weights[f"{name}.bias"] = rng.standard_normal(n_out) * 0.5
    return {n: w.astype(NP_DTYPES[dtype]) for n, w in weights.items()}
