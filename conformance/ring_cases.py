"""The ``ring.*`` cases: sharded attention (ring and head-parallel) held to the unsharded goldens.

Read this file as documentation, like ``conformance/cases.py``. Each ``@ring_case`` function
builds the float64 inputs of one ``scaled_dot_product_attention`` call from its own seeded
generator and says, in its docstring, what it pins down and which mistake of a sharded port it
catches. Sharding changes nothing the contract says, so the golden is the float64 oracle's
(:func:`conformance.oracle.attention`) for the same call, and the bound is the same rule as every
other fixture's (:func:`conformance.oracle.tolerance_bound`): :func:`golden` computes both, the
way ``conformance/generate.py`` does for an ``sdpa`` case. Case ids: ``ring.<name>.<dtype>``.

The lengths are long enough for several shards (L, S in 32 .. 96) and each case lists the shard
counts it is written for (``shards``): 2n divides L and S for every one of them, so both layouts
run. Which runs a fixture gets (SEMANTICS.md, "Sharded attention"):

- ``ring``: ``ring_attention(q, k, v, n_shards=n, layout="contiguous", **keywords)``, when n
  divides L and S;
- ``ring_zigzag``: ``ring_attention(..., layout="zigzag")``, when 2n divides L and S;
- ``head_parallel``: ``head_parallel_attention(q, k, v, n_shards=n, **keywords)``, when n
  divides K;
- ``head_parallel_gqa`` (``module`` fixtures): ``head_parallel_gqa(module, x, context,
  n_shards=n, **keywords)`` with the module loaded by ``from_canonical``, when n divides its K.

:func:`sharded_runs` applies these rules to any list of fixtures (the v1 ``sdpa`` fixtures and
these cases alike). Default sizes: B=1, H=4, K=2, D=5, E=3 (pairwise distinct where it matters;
value head n sits near 2n, so a head mapped wrongly shows).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from conformance.cases.base import Call
from conformance.fixtures import NP_DTYPES
from conformance.oracle import attention, tolerance_bound

__all__ = [
    "RING_CASES",
    "SHARDED_FUNCTIONS",
    "RingCase",
    "ShardedRun",
    "golden",
    "inputs",
    "ring_layouts",
    "sharded_runs",
]

#: The sharded aliases: alias -> (port function, ring layout or None).
SHARDED_FUNCTIONS: dict[str, tuple[str, str | None]] = {
    "ring": ("ring_attention", "contiguous"),
    "ring_zigzag": ("ring_attention", "zigzag"),
    "head_parallel": ("head_parallel_attention", None),
    "head_parallel_gqa": ("head_parallel_gqa", None),
}

B, H, K, D, E = 1, 4, 2, 5, 3


@dataclass
class RingCase:
    """One ``ring.*`` case: ``build(rng, dtype) -> Call`` and the shard counts it is for."""

    name: str
    dtypes: tuple[str, ...]
    build: Callable[[np.random.Generator, str], Call]
    seed: int
    shards: tuple[int, ...]

    def id(self, dtype: str) -> str:
        return f"ring.{self.name}.{dtype}"

    @property
    def doc(self) -> str:
        return " ".join((self.build.__doc__ or "").split())


RING_CASES: list[RingCase] = []


def ring_case(name: str, dtypes: tuple[str, ...] = ("float32",), *, shards: tuple[int, ...]):
    """Register ``fn(rng, dtype) -> Call`` as the case ``ring.<name>.<dtype>`` per dtype."""

    def register(fn: Callable[[np.random.Generator, str], Call]):
        seed = zlib.crc32(f"ring.{name}".encode())  # adding a case never changes another one
        RING_CASES.append(RingCase(name, tuple(dtypes), fn, seed, tuple(shards)))
        return fn

    return register


def _qkv(rng, *, batch=(B,), h=H, k=K, l, s, d=D, e=E):
    """query (*batch, h, l, d), key (*batch, k, s, d), value (*batch, k, s, e); key/value head
    n shifted (values by 2n), so that a wrong head mapping gives a wrong number."""
    q = rng.standard_normal((*batch, h, l, d))
    kk = rng.standard_normal((*batch, k, s, d)) + 0.5 * np.arange(k).reshape(k, 1, 1)
    v = rng.standard_normal((*batch, k, s, e)) + 2.0 * np.arange(k).reshape(k, 1, 1)
    return q, kk, v


def _call(q, k, v, *, mask=None, bias=None, **keywords) -> Call:
    return Call(q, k, v, mask, bias, keywords)


# ---------------------------------------------------------------------------------------------
# Causal, both alignments, L = S and L != S
# ---------------------------------------------------------------------------------------------


@ring_case("causal.top_left.l64_s64", ("float64", "float32", "bfloat16"), shards=(2, 4, 8))
def causal_top_left_l64_s64(rng, dtype):
    """L = S = 64, causal: with contiguous shards device r computes r + 1 of the n steps (its own
    shard on the diagonal, then the earlier ones) and skips the rest; zigzag computes two of its
    four chunk pairs at every step. Catches a ring that skips its own shard, a merge without the
    lse correction, swapped zigzag chunks (the causal rule at the wrong places)."""
    return _call(*_qkv(rng, l=64, s=64), is_causal=True)


@ring_case("causal.bottom_right.l64_s96", ("float64",), shards=(2, 4, 8))
def causal_bottom_right_l64_s96(rng, dtype):
    """L = 64 < S = 96, bottom_right (a KV cache): query i sees keys 0 .. i + 32, so shards
    past a query shard's own number are partly visible. Catches a causal skip decided by shard
    numbers (key shard after query shard: skip), which is only right for L = S."""
    return _call(*_qkv(rng, l=64, s=96), is_causal=True, causal_alignment="bottom_right")


@ring_case("causal.top_left.l96_s64", ("float64",), shards=(2, 4, 8))
def causal_top_left_l96_s64(rng, dtype):
    """L = 96 > S = 64, top_left: rows 64 .. 95 see every key; query and key shards are cut at
    different places, so block positions must be counted in rows and keys separately."""
    return _call(*_qkv(rng, l=96, s=64), is_causal=True)


@ring_case("causal.bottom_right.l96_s64", ("float64",), shards=(2, 4, 8))
def causal_bottom_right_l96_s64(rng, dtype):
    """L = 96 > S = 64, bottom_right: the first 32 rows see no key at all, so whole query
    chunks merge nothing but lse = -inf blocks and must come out zero (not NaN, not uniform)."""
    return _call(*_qkv(rng, l=96, s=64), is_causal=True, causal_alignment="bottom_right")


# ---------------------------------------------------------------------------------------------
# Grouped-query heads, no causal mask
# ---------------------------------------------------------------------------------------------


@ring_case("full.gqa.h6_k3.l96_s96", ("float64",), shards=(2, 3, 4))
def full_gqa_h6_k3(rng, dtype):
    """No mask, GQA 6:3 (G = 2): every block of every step is computed and merged. Head-parallel
    with 3 shards gives each device one key/value head and query heads 2r, 2r + 1; tiling
    (h % K) would give it heads r and r + 3."""
    return _call(*_qkv(rng, h=6, k=3, l=96, s=96))


# ---------------------------------------------------------------------------------------------
# Masks and fully masked rows, blocks and shards
# ---------------------------------------------------------------------------------------------


@ring_case("mask.random_causal.l64_s64", shards=(2, 4))
def mask_random_causal(rng, dtype):
    """A (B, 1, L, S) boolean mask AND the causal rule, B = 2: each device holds its query
    shard's rows of the mask, and each block takes the columns of the key chunk it holds."""
    mask = rng.random((2, 1, 64, 64)) < 0.7
    mask[..., 0] = True
    return _call(*_qkv(rng, batch=(2,), l=64, s=64), mask=mask, is_causal=True)


@ring_case("mask.padding.l64_s96", ("float64",), shards=(2, 4, 8))
def mask_padding(rng, dtype):
    """A (B, 1, 1, S) padding mask, B = 2: example 0 keeps all 96 keys, example 1 the first 41,
    so for example 1 the last key shards are masked whole (blocks with lse = -inf everywhere)."""
    mask = np.arange(96)[None, :] < np.array([96, 41])[:, None]  # (B, S)
    return _call(*_qkv(rng, batch=(2,), l=64, s=96), mask=mask[:, None, None, :])


@ring_case("fully_masked.rows.l64_s64", ("float64",), shards=(4, 8))
def fully_masked_rows(rng, dtype):
    """Rows 0 .. 7 and row 50 have an all-False mask row and row 30 a bias of -inf at every key,
    with the causal rule on top: zero output rows (and zero gradient). Rows 0 .. 7 are a whole
    chunk for 8 shards (zigzag: two chunks of 4)."""
    mask = rng.random((64, 64)) < 0.8
    mask[:, 0] = True
    mask[0:8, :] = False
    mask[50, :] = False
    bias = 0.5 * rng.standard_normal((H, 64, 64))
    bias[:, 30, :] = -math.inf
    return _call(*_qkv(rng, l=64, s=64), mask=mask, bias=bias, is_causal=True)


@ring_case("fully_masked.key_shard.l64_s64", ("float64",), shards=(2, 4))
def fully_masked_key_shard(rng, dtype):
    """Keys 16 .. 31 masked for every row (a (S,) mask) with causal top_left: with 4 contiguous
    shards all of key shard 1 is out; rows 16 .. 31 see only keys 0 .. 15, held by another
    device, so their result comes entirely from merges at later steps."""
    mask = np.ones(64, dtype=bool)
    mask[16:32] = False
    return _call(*_qkv(rng, l=64, s=64), mask=mask, is_causal=True)


# ---------------------------------------------------------------------------------------------
# Bias, softcap, scale; large logits; batch dims
# ---------------------------------------------------------------------------------------------


@ring_case("bias.softcap.l64_s64", ("float64", "float32"), shards=(2, 4, 8))
def bias_softcap(rng, dtype):
    """An (H, L, S) bias with -inf at about 30% of the positions (never key 0), softcap=2,
    scale=1, causal: the cap comes before the bias, in every block, on its own scores."""
    bias = rng.standard_normal((H, 64, 64))
    bias[rng.random(bias.shape) < 0.3] = -math.inf
    bias[..., 0] = 0.0
    return _call(*_qkv(rng, l=64, s=64), bias=bias, scale=1.0, softcap=2.0, is_causal=True)


@ring_case("large_logits.shifted.l64_s64", ("float32", "float16"), shards=(2, 4))
def large_logits_shifted(rng, dtype):
    """Every score shifted by +200 (a constant (1, S) bias): each block's lse is about 200, and
    a merge that takes exp(lse) instead of exp(lse - max) overflows even float32."""
    return _call(*_qkv(rng, l=64, s=64), bias=np.full((1, 64), 200.0))


@ring_case("batch.broadcast.l32_s64", ("float64",), shards=(2, 4))
def batch_broadcast(rng, dtype):
    """Batch dims that broadcast: query (2, 1, ...), key (3, ...), value (1, 3, ...): the key and
    value shards that travel keep their own batch dims; the output has batch (2, 3)."""
    q = rng.standard_normal((2, 1, 2, 32, 3))
    k = rng.standard_normal((3, 1, 64, 3))
    v = rng.standard_normal((1, 3, 1, 64, 4))
    return _call(q, k, v, is_causal=True, causal_alignment="bottom_right")


# ---------------------------------------------------------------------------------------------
# Inputs, goldens and runs
# ---------------------------------------------------------------------------------------------


def inputs(case: RingCase, dtype: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The case's arrays rounded to ``dtype`` (masks stay boolean), as the generator stores
    them, and its keywords."""
    c = case.build(np.random.default_rng(case.seed), dtype)
    dt = NP_DTYPES[dtype]
    arrays = {name: np.asarray(getattr(c, name), np.float64).astype(dt)
              for name in ("query", "key", "value")}  # fmt: skip
    if c.mask is not None:
        arrays["mask"] = np.asarray(c.mask, dtype=bool)
    if c.bias is not None:
        arrays["bias"] = np.asarray(c.bias, np.float64).astype(dt)
    return arrays, dict(c.keywords)


def golden(case: RingCase, dtype: str) -> tuple[np.ndarray, float]:
    """The float64 oracle's output for the case's rounded inputs and the bound of the tolerance
    rule (the plain same-dtype oracle's error, doubled, plus the noise floor)."""
    arrays, keywords = inputs(case, dtype)
    as64 = {n: (a if a.dtype == bool else a.astype(np.float64)) for n, a in arrays.items()}
    exact = attention(**as64, **keywords)
    plain = exact if dtype == "float64" else attention(**as64, **keywords, round_to=dtype)
    return exact.output, tolerance_bound(exact.output, plain.output, dtype)


def ring_layouts(L: int, S: int, n_shards: int) -> tuple[str, ...]:
    """The ring aliases a fixture with lengths L, S runs under with n shards."""
    aliases = []
    if L % n_shards == 0 and S % n_shards == 0:
        aliases.append("ring")
    if L % (2 * n_shards) == 0 and S % (2 * n_shards) == 0:
        aliases.append("ring_zigzag")
    return tuple(aliases)


@dataclass(frozen=True)
class ShardedRun:
    """One fixture (or ring case) through one sharded alias with ``n_shards`` shards."""

    alias: str  # a key of SHARDED_FUNCTIONS
    n_shards: int
    case_id: str  # a fixture id (sdpa.*) or a ring case id (ring.*)

    @property
    def id(self) -> str:
        """``<alias>.n<n>.<case id>``, e.g. ``ring_zigzag.n4.ring.causal.top_left.l64_s64``."""
        return f"{self.alias}.n{self.n_shards}.{self.case_id}"

    @property
    def layout(self) -> str | None:
        return SHARDED_FUNCTIONS[self.alias][1]


def sharded_runs(
    cases: Iterable[tuple[str, tuple[int, ...], tuple[int, ...]]],
    n_shards: int,
    aliases: Iterable[str] = tuple(SHARDED_FUNCTIONS),
) -> list[ShardedRun]:
    """The runs of ``cases`` (``(case id, query shape, key shape)`` each) with ``n_shards``:
    ``ring`` when n divides L and S, ``ring_zigzag`` when 2n does, ``head_parallel`` when n
    divides K. A fixture that fits none is not run (it is not a failure)."""
    wanted = set(aliases)
    runs = []
    for case_id, q_shape, k_shape in cases:
        L, (K, S) = q_shape[-2], k_shape[-3:-1]
        fits = [*ring_layouts(L, S, n_shards), *(["head_parallel"] if K % n_shards == 0 else [])]
        runs += [ShardedRun(alias, n_shards, case_id) for alias in fits if alias in wanted]
    return runs
