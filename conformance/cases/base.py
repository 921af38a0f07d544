"""The vocabulary the cases are written in: one registry, one decorator, and the inputs.

Every case, whatever its op, is one :class:`CaseDef` in :data:`REGISTRY`, registered by
:func:`case` (or one of its named forms: ``sdpa_case``, ``flash_case``, ``module_case``, ...). A
case is a short named function that builds its float64 inputs from its own seeded generator
(value cases: ``fn(rng, dtype)``) or describes a call that must raise (error cases: ``fn()``,
with ``error=(class, code)``); its docstring says what it pins down and which mistake it catches.
``conformance/generate/`` turns each into fixtures, one per dtype it lists.

Default sizes are pairwise distinct where it matters (B=2, H=6, K=2, L=5, S=7, D=11, E=13) so
a swapped axis is a shape error or a wrong number, never a silent pass.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "ALL_DTYPES",
    "F32",
    "REGISTRY",
    "Call",
    "CaseDef",
    "ModuleCall",
    "ModuleErrorCall",
    "Zeros",
    "call",
    "canonical",
    "case",
    "cases",
    "kernel_shapes",
    "most_negative",
    "normal",
    "padding",
    "qkv",
    "random_mask",
    "seed_of",
    "z",
]

ALL_DTYPES = ("float64", "float32", "float16", "bfloat16")
F32 = ("float32",)
B, H, K, L, S, D, E = 2, 6, 2, 5, 7, 11, 13
# Module sizes: M = H * D = H * E as in most models (so a transposed square projection is a
# wrong number, not a shape error), L != S for cross-attention.
MB, ML, MS, MM, MD = 2, 5, 7, 24, 4

#: The sharded aliases an attention case is run against (with n shards wherever n fits).
SHARDED = ("ring", "ring_zigzag", "head_parallel", "ulysses", "usp")
#: The port functions (runner aliases) a case of each op is run against, unless it says so.
OP_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "sdpa": ("sdpa", "weights", "flash", *SHARDED),
    "flash": ("flash",),
    "causal_mask": ("causal_mask",),
    "module": ("module", "head_parallel_gqa"),
    "decode": ("decode",),
    "grad": ("grad", "flash_grad"),
    "flash_grad": ("flash_grad",),
    "ring": SHARDED,
}


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseDef:
    """One registered case.

    ``op`` decides how the generator makes its fixtures and how the id starts
    (``<op>.<name>.<dtype>``; error cases ``<op>.error.<name>.<dtype>``); ``functions`` are
    the runner aliases it is run against; ``error`` is ``(class name, code)`` for a call that
    must raise, None for a case with golden values.
    """

    op: str
    name: str
    build: Callable[..., Any]
    dtypes: tuple[str, ...]
    functions: tuple[str, ...]
    error: tuple[str, str] | None = None
    seed_name: str | None = None

    @property
    def kind(self) -> str:
        return "values" if self.error is None else "error"

    @property
    def seed(self) -> int:
        """A hash of the case's name (``sdpa`` cases: the bare name, the others prefixed with
        their op, as they were first written), so adding a case never changes another."""
        default = self.name if self.op == "sdpa" else f"{self.op}.{self.name}"
        return seed_of(self.seed_name or default)

    @property
    def doc(self) -> str:
        return " ".join((self.build.__doc__ or "").split())


#: Every case, in registration order.
REGISTRY: list[CaseDef] = []


def seed_of(name: str) -> int:
    """A case's seed: a hash of its name, so adding a case never changes another one."""
    return zlib.crc32(name.encode())


def case(
    op: str,
    name: str,
    dtypes: tuple[str, ...] = F32,
    *,
    functions: tuple[str, ...] | None = None,
    error: tuple[str, str] | None = None,
    seed_name: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the case ``<op>.<name>`` in each of ``dtypes``."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        fns = OP_FUNCTIONS[op] if functions is None else tuple(functions)
        if error is not None and functions is None:  # the sharded errors are ring.error.*
            fns = tuple(f for f in fns if f not in (*SHARDED, "head_parallel_gqa"))
        REGISTRY.append(CaseDef(op, name, fn, tuple(dtypes), fns, error, seed_name))
        return fn

    return register


#: The named forms of :func:`case`, one per op.
sdpa_case = partial(case, "sdpa")
flash_case = partial(case, "flash")
causal_mask_case = partial(case, "causal_mask")
module_case = partial(case, "module")
decode_case = partial(case, "decode")


def cases(op: str | None = None, kind: str | None = None) -> list[CaseDef]:
    """The registered cases of ``op`` and ``kind`` (``"values"`` | ``"error"``), in order."""
    return [c for c in REGISTRY if op in (None, c.op) and kind in (None, c.kind)]


# ---------------------------------------------------------------------------------------------
# Attention calls
# ---------------------------------------------------------------------------------------------


#: The array arguments of contract v2 (stored in the fixture like mask and bias): segment ids
#: as int32, sinks and ALiBi slopes in the case's dtype.
SEGMENT_SINK_SLOPE_ARRAYS = ("q_segment_ids", "kv_segment_ids", "sinks", "alibi_slopes")


@dataclass
class Call:
    """The arguments of one ``scaled_dot_product_attention`` call (float64 or bool arrays, or
    :class:`Zeros` for an error case). ``bias_dtype`` stores the bias in a dtype of its own
    (the contract allows a float32 bias with float16 queries); None: the case's dtype.
    ``arrays`` holds the segment ids, sinks and slopes given
    (:data:`SEGMENT_SINK_SLOPE_ARRAYS`)."""

    query: Any
    key: Any
    value: Any
    mask: Any = None
    bias: Any = None
    keywords: dict[str, Any] = field(default_factory=dict)
    bias_dtype: str | None = None
    arrays: dict[str, Any] = field(default_factory=dict)


def call(query, key, value, *, mask=None, bias=None, bias_dtype=None, **keywords) -> Call:
    """A :class:`Call`; the segment ids, sinks and ALiBi slopes go among its arrays,
    every other keyword (window included) among its keywords."""
    arrays = {
        name: keywords.pop(name)
        for name in SEGMENT_SINK_SLOPE_ARRAYS
        if keywords.get(name) is not None
    }
    return Call(query, key, value, mask, bias, keywords, bias_dtype, arrays)


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


def qkv(rng, batch=(B,), h=H, k=K, l=L, s=S, d=D, e=E):
    """query (*batch, h, l, d), key (*batch, k, s, d), value (*batch, k, s, e), key/value heads
    made clearly different (value head n is shifted by 2n), so a wrong head mapping shows."""
    q = normal(rng, *batch, h, l, d)
    kk = normal(rng, *batch, k, s, d)
    v = normal(rng, *batch, k, s, e)
    v = v + 2.0 * np.arange(k).reshape(k, 1, 1)  # (K, 1, 1): head n's values sit near 2n
    kk = kk + 0.5 * np.arange(k).reshape(k, 1, 1)
    return q, kk, v


def random_mask(rng, *shape: int, keep=0.7) -> np.ndarray:
    """Boolean mask with about ``keep`` of the keys allowed; key 0 is always allowed, so no row
    is fully masked by accident (a case that wants one says so)."""
    mask = rng.random(shape) < keep
    mask[..., 0] = True
    return mask


def most_negative(dtype: str) -> float:
    """The most negative finite number of ``dtype``."""
    info = ml_dtypes.finfo(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.finfo(dtype)
    return float(info.min)


# ---------------------------------------------------------------------------------------------
# Module calls
# ---------------------------------------------------------------------------------------------


@dataclass
class ModuleCall:
    """One module case: float64 canonical weights, the call's inputs and keywords.

    The module is ``<cls>.from_canonical(weights, n_heads=..., n_kv_heads=..., **options)``
    (``n_kv_heads`` left out for ``MultiHeadAttention``, which defaults it to H; ``options``
    are the module's settings, e.g. ``rope_theta``, ``window``, ``alibi``), called as
    ``module(x, context, mask=, bias=, q_segment_ids=, kv_segment_ids=, **keywords)``. A
    module with sinks has the weight ``sinks (H,)`` among its ``weights``.
    """

    weights: dict[str, Any]
    x: Any
    n_heads: int
    n_kv_heads: int
    cls: str = "GroupedQueryAttention"
    context: Any = None
    mask: Any = None
    bias: Any = None
    keywords: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    q_segment_ids: Any = None
    kv_segment_ids: Any = None


def kernel_shapes(m: int, h: int, k: int, d: int, e: int) -> dict[str, tuple[int, int]]:
    """The canonical kernels' ``(in, out)`` shapes, in forward order."""
    return {"q_proj": (m, h * d), "k_proj": (m, k * d), "v_proj": (m, k * e), "o_proj": (h * e, m)}


def canonical(rng, *, m=MM, h=H, k=K, d=MD, e=MD, bias=True) -> dict[str, np.ndarray]:
    """Canonical weights ``q_proj.kernel (M, H*D)`` ... ``o_proj.kernel (H*E, M)`` (and biases),
    entries of order 1/sqrt(in) so activations stay of order one. The biases of key/value head
    n are shifted by 0.5n and 2n (as in :func:`qkv`), so the key/value heads differ clearly and a
    wrong head mapping or a wrong split of the feature axis shows."""
    weights = {}
    for name, (n_in, n_out) in kernel_shapes(m, h, k, d, e).items():
        weights[f"{name}.kernel"] = normal(rng, n_in, n_out) / math.sqrt(n_in)
        if bias:
            weights[f"{name}.bias"] = 0.5 * normal(rng, n_out)
    if bias:
        weights["k_proj.bias"] += 0.5 * np.repeat(np.arange(k), d)  # (K*D,): head n near 0.5n
        weights["v_proj.bias"] += 2.0 * np.repeat(np.arange(k), e)  # (K*E,): head n near 2n
    return weights


def padding(lengths: list[int], kv_len: int) -> np.ndarray:
    """The (B, 1, 1, S) padding mask of per-example key lengths: True where key j < length."""
    return (np.arange(kv_len)[None, :] < np.array(lengths)[:, None])[:, None, None, :]


# ---------------------------------------------------------------------------------------------
# Error cases: inputs given by shape and dtype
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Zeros:
    """An input given by shape and dtype; the runner builds zeros of it with the port."""

    shape: tuple[int, ...]
    dtype: str = "float32"


def z(*shape: int, dtype: str = "float32") -> Zeros:
    return Zeros(tuple(shape), dtype)


@dataclass
class ModuleErrorCall:
    """What the runner does before the expected error of a module case.

    ``call``:
      - ``"construct"``: ``<cls>(**arguments)``;
      - ``"load"``: ``<cls>.from_canonical(zeros of weights, n_heads=, n_kv_heads=)``;
      - ``"forward"``: load valid weights, then ``module(x, context, mask=, bias=, **keywords)``
        with zeros of the ``inputs``;
      - ``"decode"``: load, ``cache = module.init_cache(batch_size, max_len)``, then
        ``module.decode`` on consecutive ``chunks`` of zeros of ``inputs["x"]``.
    """

    call: str
    cls: str = "GroupedQueryAttention"
    arguments: dict[str, Any] = field(default_factory=dict)
    weights: dict[str, Zeros] = field(default_factory=dict)
    n_heads: int = H
    n_kv_heads: int | None = K
    inputs: dict[str, Zeros] = field(default_factory=dict)
    keywords: dict[str, Any] = field(default_factory=dict)
    decode: dict[str, Any] = field(default_factory=dict)
