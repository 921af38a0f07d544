"""The case list: every point of the contract, one short named function each.

Read this file as documentation. Each ``@sdpa_case`` function builds the float64 inputs of one
case from its own seeded generator and says, in its docstring, what it pins down and which
mistake it catches. The generator (``conformance/generate.py``) rounds the inputs to each dtype
listed, computes the golden with the float64 oracle, and writes one fixture per dtype, with the
id ``sdpa.<name>.<dtype>`` (e.g. ``sdpa.gqa.h6_k2.float32``).

``@error_case`` functions give the shapes, dtypes and keywords of a call that must raise, and
the error class and code SEMANTICS.md's taxonomy prescribes. ``CAUSAL_MASK_CASES`` lists the
``causal_mask(L, S, alignment=...)`` calls whose boolean result is stored.

``@flash_case`` functions are attention cases for ``flash_attention`` alone, with the block
sizes in their keywords (``block_q``, ``block_k``): sequence lengths the blocks do not divide,
blocks larger than the sequence, blocks of one, fully masked blocks. Ids ``flash.tiling.<...>``.

``@module_case`` functions build the canonical weights (SEMANTICS.md, "Modules") and the inputs
of one call of ``GroupedQueryAttention``/``MultiHeadAttention`` (``module.<name>.<dtype>``);
``@decode_case`` functions build a module and a sequence whose golden is one full causal
forward, fed to ``init_cache``/``decode`` token by token and in uneven chunks
(``decode.<name>.<chunking>.<dtype>``). ``@module_error_case`` functions describe a
construction, a weight load, a forward call or a decode that must raise.

Default sizes are pairwise distinct where it matters (B=2, H=6, K=2, L=5, S=7, D=11, E=13) so
a swapped axis is a shape error or a wrong number, never a silent pass.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "ALL_DTYPES",
    "CAUSAL_MASK_CASES",
    "CAUSAL_MASK_ERROR_CASES",
    "DECODE_CASES",
    "DECODE_CHUNKINGS",
    "ERROR_CASES",
    "FLASH_CASES",
    "MODULE_CASES",
    "MODULE_ERROR_CASES",
    "SDPA_CASES",
    "Call",
    "ErrorCase",
    "ModuleCall",
    "ModuleCase",
    "ModuleErrorCall",
    "ModuleErrorCase",
    "SdpaCase",
    "Zeros",
]

ALL_DTYPES = ("float64", "float32", "float16", "bfloat16")
F32 = ("float32",)
B, H, K, L, S, D, E = 2, 6, 2, 5, 7, 11, 13


# ---------------------------------------------------------------------------------------------
# The vocabulary the cases are written in
# ---------------------------------------------------------------------------------------------


@dataclass
class Call:
    """The arguments of one ``scaled_dot_product_attention`` call (float64 or bool arrays)."""

    query: Any
    key: Any
    value: Any
    mask: Any = None
    bias: Any = None
    keywords: dict[str, Any] = field(default_factory=dict)


def call(query, key, value, *, mask=None, bias=None, **keywords) -> Call:
    return Call(query, key, value, mask, bias, keywords)


@dataclass
class SdpaCase:
    name: str  # e.g. "gqa.h6_k2": feature "gqa", variant "h6_k2"
    dtypes: tuple[str, ...]
    build: Callable[[np.random.Generator, str], Call]
    seed: int

    @property
    def doc(self) -> str:
        return " ".join((self.build.__doc__ or "").split())


SDPA_CASES: list[SdpaCase] = []


def seed_of(name: str) -> int:
    """A case's seed: a hash of its name, so adding a case never changes another one."""
    return zlib.crc32(name.encode())


def sdpa_case(name: str, dtypes: tuple[str, ...] = F32, *, seed_name: str | None = None):
    """Register ``fn(rng, dtype) -> Call`` as the case ``sdpa.<name>.<dtype>`` per dtype."""

    def register(fn: Callable[[np.random.Generator, str], Call]):
        SDPA_CASES.append(SdpaCase(name, tuple(dtypes), fn, seed_of(seed_name or name)))
        return fn

    return register


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
# Basic and grouped-query attention
# ---------------------------------------------------------------------------------------------


@sdpa_case("basic.mha", ALL_DTYPES)
def basic_mha(rng, dtype):
    """Plain multi-head attention (H = K = 3), default scale 1/sqrt(D), E != D."""
    return call(*qkv(rng, h=3, k=3))


@sdpa_case("gqa.h6_k2", ALL_DTYPES)
def gqa_h6_k2(rng, dtype):
    """GQA 6:2: query head h reads key/value head h // 3 (contiguous groups, repeat_interleave).
    The two key/value heads differ clearly, so tiling (h % 2) gives a different answer."""
    return call(*qkv(rng))


@sdpa_case("gqa.h8_k1", ALL_DTYPES)
def gqa_h8_k1(rng, dtype):
    """MQA 8:1: all eight query heads read the single key/value head."""
    return call(*qkv(rng, h=8, k=1))


@sdpa_case("gqa.h6_k3")
def gqa_h6_k3(rng, dtype):
    """GQA 6:3 (G = 2): contiguous [0,0,1,1,2,2] versus tiled [0,1,2,0,1,2]."""
    return call(*qkv(rng, k=3))


@sdpa_case("gqa.h6_k2.head_mask", ("float32", "bfloat16"))
def gqa_head_mask(rng, dtype):
    """A mask with a query-head axis (H, L, S): each of the 6 query heads has its own pattern,
    even heads that share a key/value head."""
    return call(*qkv(rng), mask=random_mask(rng, H, L, S))


# ---------------------------------------------------------------------------------------------
# Causal alignment
# ---------------------------------------------------------------------------------------------


@sdpa_case("causal.top_left.l5_s7", ALL_DTYPES)
def causal_top_left_l5_s7(rng, dtype):
    """top_left with L < S: query i sees keys 0..i; the last two keys are never seen."""
    return call(*qkv(rng, l=5, s=7), is_causal=True)


@sdpa_case("causal.top_left.l7_s5", ALL_DTYPES)
def causal_top_left_l7_s5(rng, dtype):
    """top_left with L > S: rows 4..6 see every key."""
    return call(*qkv(rng, l=7, s=5), is_causal=True)


@sdpa_case("causal.bottom_right.l5_s7", ALL_DTYPES)
def causal_bottom_right_l5_s7(rng, dtype):
    """bottom_right with L < S (KV cache): query i sees keys 0..i+2; the last row sees all."""
    return call(*qkv(rng, l=5, s=7), is_causal=True, causal_alignment="bottom_right")


@sdpa_case("causal.bottom_right.l9_s5", ALL_DTYPES)
def causal_bottom_right_l9_s5(rng, dtype):
    """bottom_right with L > S: the first L - S = 4 rows see no key (zero rows, not NaN),
    row 4 sees key 0, the last row sees all five."""
    return call(*qkv(rng, l=9, s=5), is_causal=True, causal_alignment="bottom_right")


@sdpa_case("causal.top_left.l1_s9")
def causal_top_left_l1_s9(rng, dtype):
    """One query row against nine keys, top_left: it sees key 0 only (output = value row 0)."""
    return call(*qkv(rng, l=1, s=9), is_causal=True)


@sdpa_case("causal.bottom_right.l1_s9")
def causal_bottom_right_l1_s9(rng, dtype):
    """One query row against nine keys, bottom_right (a decoding step): it sees all nine."""
    return call(*qkv(rng, l=1, s=9), is_causal=True, causal_alignment="bottom_right")


@sdpa_case("causal.top_left.l6_s6")
def causal_top_left_square(rng, dtype):
    """L = S: the two alignments coincide (lower triangle)."""
    return call(*qkv(rng, l=6, s=6), is_causal=True)


@sdpa_case("causal.bottom_right.l6_s6")
def causal_bottom_right_square(rng, dtype):
    """L = S with bottom_right: the same lower triangle as top_left."""
    return call(*qkv(rng, l=6, s=6), is_causal=True, causal_alignment="bottom_right")


# ---------------------------------------------------------------------------------------------
# Fully masked rows, three ways, in every dtype
# ---------------------------------------------------------------------------------------------


@sdpa_case("fully_masked.bool_row", ALL_DTYPES)
def fully_masked_bool_row(rng, dtype):
    """Query row 2 has an all-False boolean mask row: its weights and output are exactly zero.
    (jax.nn.dot_product_attention gives a uniform row; a -1e9 fill does too; no guard: NaN.)"""
    mask = random_mask(rng, B, 1, L, S)
    mask[..., 2, :] = False
    return call(*qkv(rng), mask=mask)


@sdpa_case("fully_masked.neg_inf_bias_row", ALL_DTYPES)
def fully_masked_neg_inf_bias_row(rng, dtype):
    """Query row 2 has a bias of -inf at every key: zero weights and output, like a False mask
    row. (jax gives NaN here.)"""
    bias = 0.5 * normal(rng, B, H, L, S)
    bias[..., 2, :] = -math.inf
    return call(*qkv(rng), bias=bias)


@sdpa_case("fully_masked.huge_negative_bias_row", ALL_DTYPES)
def fully_masked_huge_negative_row(rng, dtype):
    """Query row 3 is zero (all its scores are 0) and its bias is the most negative finite
    number of the dtype at every key: every score is equal and finite, so the row is NOT fully
    masked and softmax is uniform, by the mathematics: the output is the mean of the values."""
    q, k, v = qkv(rng)
    q[..., 3, :] = 0.0
    bias = 0.5 * normal(rng, B, H, L, S)
    bias[..., 3, :] = most_negative(dtype)
    return call(q, k, v, bias=bias)


@sdpa_case("fully_masked.all_rows")
def fully_masked_all_rows(rng, dtype):
    """Every key of every row masked: all-zero weights and output."""
    return call(*qkv(rng), mask=np.zeros((L, S), dtype=bool))


# ---------------------------------------------------------------------------------------------
# Masks: random patterns, broadcast shapes, together with the causal rule
# ---------------------------------------------------------------------------------------------


@sdpa_case("mask.random", ALL_DTYPES)
def mask_random(rng, dtype):
    """A full (B, H, L, S) boolean mask, True = may attend."""
    return call(*qkv(rng), mask=random_mask(rng, B, H, L, S))


@sdpa_case("mask.with_causal", ("float32", "float16"))
def mask_with_causal(rng, dtype):
    """mask AND causal (top_left): a key is allowed only if both allow it."""
    return call(*qkv(rng), mask=random_mask(rng, B, 1, L, S), is_causal=True)


@sdpa_case("mask.with_causal_bottom_right")
def mask_with_causal_bottom_right(rng, dtype):
    """mask AND causal (bottom_right, L < S)."""
    return call(
        *qkv(rng),
        mask=random_mask(rng, B, 1, L, S),
        is_causal=True,
        causal_alignment="bottom_right",
    )


@sdpa_case("mask_broadcast.s")
def mask_broadcast_s(rng, dtype):
    """Mask of shape (S,): one key pattern for every batch, head and row."""
    return call(*qkv(rng), mask=random_mask(rng, S))


@sdpa_case("mask_broadcast.1s")
def mask_broadcast_1s(rng, dtype):
    """Mask of shape (1, S)."""
    return call(*qkv(rng), mask=random_mask(rng, 1, S))


@sdpa_case("mask_broadcast.l1")
def mask_broadcast_l1(rng, dtype):
    """Mask of shape (L, 1): whole query rows on or off; row 1 is off, so it is a fully masked
    row that arrives by broadcasting (zeros)."""
    mask = np.ones((L, 1), dtype=bool)
    mask[1, 0] = False
    return call(*qkv(rng), mask=mask)


@sdpa_case("mask_broadcast.b11s", ("float32", "float16", "bfloat16"))
def mask_broadcast_b11s(rng, dtype):
    """Mask of shape (B, 1, 1, S), a padding mask: example 0 keeps all 7 keys, example 1 the
    first 4."""
    lengths = np.array([7, 4])
    mask = np.arange(S)[None, :] < lengths[:, None]  # (B, S)
    return call(*qkv(rng), mask=mask[:, None, None, :])


@sdpa_case("mask_broadcast.b1ls")
def mask_broadcast_b1ls(rng, dtype):
    """Mask of shape (B, 1, L, S): per example, shared by the heads."""
    return call(*qkv(rng), mask=random_mask(rng, B, 1, L, S))


@sdpa_case("mask_broadcast.1hls")
def mask_broadcast_1hls(rng, dtype):
    """Mask of shape (1, H, L, S): per query head, shared by the batch."""
    return call(*qkv(rng), mask=random_mask(rng, 1, H, L, S))


@sdpa_case("mask_broadcast.hls")
def mask_broadcast_hls(rng, dtype):
    """Mask of shape (H, L, S) (no batch axis)."""
    return call(*qkv(rng), mask=random_mask(rng, H, L, S))


# ---------------------------------------------------------------------------------------------
# Bias
# ---------------------------------------------------------------------------------------------


@sdpa_case("bias.full", ALL_DTYPES)
def bias_full(rng, dtype):
    """An additive float bias of shape (B, H, L, S)."""
    return call(*qkv(rng), bias=normal(rng, B, H, L, S))


@sdpa_case("bias.neg_inf", ("float32", "float16"))
def bias_neg_inf(rng, dtype):
    """A bias holding -inf at about a quarter of the positions (never key 0): those keys are
    out, exactly as with a False mask."""
    bias = normal(rng, B, H, L, S)
    bias[rng.random(bias.shape) < 0.25] = -math.inf
    bias[..., 0] = 0.0
    return call(*qkv(rng), bias=bias)


@sdpa_case("bias.with_mask", ("float32", "bfloat16"))
def bias_with_mask(rng, dtype):
    """bias and mask together: the bias is added, then the mask's False positions are out."""
    return call(*qkv(rng), mask=random_mask(rng, B, 1, L, S), bias=normal(rng, H, L, S))


@sdpa_case("bias.broadcast_ls")
def bias_broadcast_ls(rng, dtype):
    """A distance bias of shape (L, S), -0.5 |i - j| (ALiBi-like), broadcast over batch/heads."""
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    return call(*qkv(rng), bias=-0.5 * np.abs(i - j).astype(np.float64))


# ---------------------------------------------------------------------------------------------
# Scale and softcap
# ---------------------------------------------------------------------------------------------


@sdpa_case("scale.custom", ("float64", "float32"))
def scale_custom(rng, dtype):
    """scale=0.37 instead of 1/sqrt(D)."""
    return call(*qkv(rng), scale=0.37)


@sdpa_case("scale.zero", ("float64", "float32"))
def scale_zero(rng, dtype):
    """scale=0 is legal: every score is 0, weights are uniform, output = mean of the values."""
    return call(*qkv(rng), scale=0.0)


@sdpa_case("scale.negative", ("float64", "float32"))
def scale_negative(rng, dtype):
    """scale=-0.6 is legal: attention prefers the least similar keys."""
    return call(*qkv(rng), scale=-0.6)


@sdpa_case("softcap.cap2_neg_inf_bias", ALL_DTYPES)
def softcap_2(rng, dtype):
    """softcap=2 with scale=1 (scores up to about 10 are capped to +-2) and a bias holding -inf.
    The cap comes before the bias: a cap applied after it would turn -inf into -2 and let
    masked keys back in."""
    bias = normal(rng, B, H, L, S)
    bias[rng.random(bias.shape) < 0.3] = -math.inf
    bias[..., 0] = 0.0
    return call(*qkv(rng), bias=bias, scale=1.0, softcap=2.0)


@sdpa_case("softcap.cap30_neg_inf_bias", ALL_DTYPES)
def softcap_30(rng, dtype):
    """softcap=30 (Gemma 2's value) with scale=8, so the largest scores (about 80) are capped;
    a bias holding -inf stays -inf."""
    bias = normal(rng, B, H, L, S)
    bias[rng.random(bias.shape) < 0.3] = -math.inf
    bias[..., 0] = 0.0
    return call(*qkv(rng), bias=bias, scale=8.0, softcap=30.0)


# ---------------------------------------------------------------------------------------------
# Shapes: E != D, empty lengths, length one, batch dims
# ---------------------------------------------------------------------------------------------


@sdpa_case("shapes.e_lt_d")
def shapes_e_lt_d(rng, dtype):
    """Value head dim smaller than query/key head dim (D=16, E=3)."""
    return call(*qkv(rng, d=16, e=3))


@sdpa_case("shapes.l0", ("float32", "bfloat16"))
def shapes_l0(rng, dtype):
    """L = 0: no query rows; the output is (B, H, 0, E)."""
    return call(*qkv(rng, l=0))


@sdpa_case("shapes.s0", ("float32", "bfloat16"))
def shapes_s0(rng, dtype):
    """S = 0: no keys, so every row is fully masked: zero output (B, H, L, E), weights
    (B, H, L, 0)."""
    return call(*qkv(rng, s=0))


@sdpa_case("shapes.l1_s1")
def shapes_l1_s1(rng, dtype):
    """One query, one key: the weight is 1 and the output is that key's value row."""
    return call(*qkv(rng, l=1, s=1))


@sdpa_case("shapes.no_batch")
def shapes_no_batch(rng, dtype):
    """No leading batch dim at all: query (H, L, D)."""
    return call(*qkv(rng, batch=()))


@sdpa_case("batch.many_dims")
def batch_many_dims(rng, dtype):
    """Three leading batch dims (2, 3, 4)."""
    return call(*qkv(rng, batch=(2, 3, 4), h=2, k=1))


@sdpa_case("batch.broadcast")
def batch_broadcast(rng, dtype):
    """Batch dims that broadcast: query (2, 1, ...), key (3, ...), value (1, 3, ...), mask
    (1, 3, 1, 1, S); the result has batch (2, 3)."""
    q = normal(rng, 2, 1, H, L, D)
    k = normal(rng, 3, K, S, D)
    v = normal(rng, 1, 3, K, S, E) + 2.0 * np.arange(K).reshape(K, 1, 1)
    return call(q, k, v, mask=random_mask(rng, 1, 3, 1, 1, S))


@sdpa_case("batch.value_only")
def batch_value_only(rng, dtype):
    """Only value has a batch dim: query (H, L, D), key (K, S, D), value (2, K, S, E). The
    weights have no batch; the output has batch (2,)."""
    q, k, v = qkv(rng, batch=())
    return call(q, k, np.stack([v, -v]))


# ---------------------------------------------------------------------------------------------
# Numerics: saturation, large logits, a hand-computed case
# ---------------------------------------------------------------------------------------------


@sdpa_case("saturation.default_scale", ("float32", "bfloat16"), seed_name="saturation")
def saturation_default_scale(rng, dtype):
    """Large head dim (D=256) with the default scale 1/16: scores have a standard deviation of
    about 1 and the weights are spread. Forgetting 1/sqrt(D) fails here."""
    return call(*qkv(rng, batch=(1,), h=2, k=2, l=3, s=5, d=256, e=4))


@sdpa_case("saturation.scale_one", ("float32", "bfloat16"), seed_name="saturation")
def saturation_scale_one(rng, dtype):
    """The same inputs with scale=1: scores have a standard deviation of about 16, and softmax
    collapses toward one-hot (most rows put over 95% on one key, against at most 70% with the
    default scale), which is what a missing 1/sqrt(D) does to every model."""
    return call(*qkv(rng, batch=(1,), h=2, k=2, l=3, s=5, d=256, e=4), scale=1.0)


@sdpa_case("large_logits.shifted", ALL_DTYPES)
def large_logits_shifted(rng, dtype):
    """Every score shifted by +200 through a constant bias: softmax does not change, but
    exp(200) overflows even float32 without the row-max subtraction."""
    return call(*qkv(rng), bias=np.full((1, S), 200.0))


@sdpa_case("hand.two_keys", ("float64", "float32"))
def hand_two_keys(rng, dtype):
    """By hand: q = [0, sqrt 2], keys = identity, D = 2, so scores = [0, 1] and the weights are
    [1, e] / (1 + e) = [0.2689..., 0.7310...]; values = identity, so output = weights."""
    q = np.array([[[0.0, math.sqrt(2.0)]]])  # (H=1, L=1, D=2)
    k = np.eye(2)[None]  # (K=1, S=2, D=2)
    return call(q, k, np.eye(2)[None])


# ---------------------------------------------------------------------------------------------
# causal_mask(L, S, alignment=...)
# ---------------------------------------------------------------------------------------------

#: (alignment, L, S): the boolean (L, S) result is stored. Includes L < S, L > S, L = S and
#: the empty sizes, for both alignments.
CAUSAL_MASK_CASES: list[tuple[str, int, int]] = [
    (alignment, q_len, kv_len)
    for alignment in ("top_left", "bottom_right")
    for q_len, kv_len in ((5, 7), (7, 5), (6, 6), (1, 9), (9, 1), (0, 4), (4, 0))
]


# ---------------------------------------------------------------------------------------------
# Error cases: one per rule of the taxonomy that the functional API can break
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Zeros:
    """An input given by shape and dtype; the runner builds zeros of it with the port."""

    shape: tuple[int, ...]
    dtype: str = "float32"


def z(*shape: int, dtype: str = "float32") -> Zeros:
    return Zeros(tuple(shape), dtype)


@dataclass
class ErrorCase:
    name: str  # e.g. "heads_not_divisible"
    error_class: str
    code: str
    functions: tuple[str, ...]
    build: Callable[[], Call]

    @property
    def doc(self) -> str:
        return " ".join((self.build.__doc__ or "").split())


ERROR_CASES: list[ErrorCase] = []
#: Error cases that involve the value (the weights function takes none).
WITH_VALUE = ("sdpa", "flash")
ALL_FUNCTIONS = ("sdpa", "weights", "flash")


def error_case(name: str, error_class: str, code: str, functions=ALL_FUNCTIONS):
    """Register ``fn() -> Call`` (of :class:`Zeros`) as ``<function>.error.<name>.<dtype>``."""

    def register(fn: Callable[[], Call]):
        ERROR_CASES.append(ErrorCase(name, error_class, code, tuple(functions), fn))
        return fn

    return register


QKV = (z(B, H, L, D), z(B, K, S, D), z(B, K, S, E))


@error_case("rank", "DimensionMismatchError", "rank")
def err_rank():
    """query of rank 2 (L, D): the heads axis is missing."""
    return call(z(L, D), z(B, K, S, D), z(B, K, S, E))


@error_case("heads_not_divisible", "DimensionMismatchError", "heads_not_divisible")
def err_heads_not_divisible():
    """H=6 query heads cannot be shared by K=4 key/value heads."""
    return call(z(B, H, L, D), z(B, 4, S, D), z(B, 4, S, E))


@error_case("kv_heads_mismatch", "DimensionMismatchError", "kv_heads_mismatch", WITH_VALUE)
def err_kv_heads_mismatch():
    """key has K=2 heads, value has 3."""
    return call(z(B, H, L, D), z(B, K, S, D), z(B, 3, S, E))


@error_case("kv_length_mismatch", "DimensionMismatchError", "kv_length_mismatch", WITH_VALUE)
def err_kv_length_mismatch():
    """key has S=7 positions, value has 6 (torch's fused CPU path silently accepts this)."""
    return call(z(B, H, L, D), z(B, K, S, D), z(B, K, S - 1, E))


@error_case("qk_head_dim_mismatch", "DimensionMismatchError", "qk_head_dim_mismatch")
def err_qk_head_dim_mismatch():
    """query head dim D=11, key head dim 12."""
    return call(z(B, H, L, D), z(B, K, S, D + 1), z(B, K, S, E))


@error_case("batch_not_broadcastable", "DimensionMismatchError", "batch_not_broadcastable")
def err_batch_not_broadcastable():
    """query batch 2, key and value batch 3."""
    return call(z(2, H, L, D), z(3, K, S, D), z(3, K, S, E))


@error_case("mask_dtype_int", "MaskError", "mask_dtype")
def err_mask_dtype_int():
    """An integer mask (0/1): must be bool; an additive float goes in bias=."""
    return call(*QKV, mask=z(L, S, dtype="int32"))


@error_case("mask_dtype_float", "MaskError", "mask_dtype")
def err_mask_dtype_float():
    """A float mask: must be bool (onnx adds it as a bias; this contract refuses)."""
    return call(*QKV, mask=z(L, S, dtype="float32"))


@error_case("mask_shape", "MaskError", "mask_shape")
def err_mask_shape():
    """A (4, S) mask cannot broadcast to L=5 rows."""
    return call(*QKV, mask=z(4, S, dtype="bool"))


@error_case("mask_kv_heads", "MaskError", "mask_kv_heads")
def err_mask_kv_heads():
    """A mask with a head axis of size K=2 (neither 1 nor H=6)."""
    return call(*QKV, mask=z(K, L, S, dtype="bool"))


@error_case("bias_dtype_int", "MaskError", "bias_dtype")
def err_bias_dtype_int():
    """An integer bias: must be floating."""
    return call(*QKV, bias=z(L, S, dtype="int32"))


@error_case("bias_dtype_bool", "MaskError", "bias_dtype")
def err_bias_dtype_bool():
    """A boolean bias: a keep/drop mask goes in mask=."""
    return call(*QKV, bias=z(L, S, dtype="bool"))


@error_case("bias_shape", "MaskError", "bias_shape")
def err_bias_shape():
    """A (L, S + 1) bias does not broadcast to S=7 keys."""
    return call(*QKV, bias=z(L, S + 1))


@error_case("bias_kv_heads", "MaskError", "bias_kv_heads")
def err_bias_kv_heads():
    """A bias with a head axis of size K=2."""
    return call(*QKV, bias=z(B, K, L, S))


@error_case("dtype_mismatch", "DTypeError", "dtype_mismatch")
def err_dtype_mismatch():
    """query float32, key float64."""
    return call(z(B, H, L, D), z(B, K, S, D, dtype="float64"), z(B, K, S, E))


@error_case("dtype_mismatch_value", "DTypeError", "dtype_mismatch", WITH_VALUE)
def err_dtype_mismatch_value():
    """query and key float32, value float16."""
    return call(z(B, H, L, D), z(B, K, S, D), z(B, K, S, E, dtype="float16"))


@error_case("unsupported_dtype", "DTypeError", "unsupported_dtype")
def err_unsupported_dtype():
    """int32 query, key and value."""
    return call(
        z(B, H, L, D, dtype="int32"), z(B, K, S, D, dtype="int32"), z(B, K, S, E, dtype="int32")
    )


@error_case("scale_inf", "ConfigError", "scale_not_finite")
def err_scale_inf():
    """scale=inf."""
    return call(*QKV, scale=math.inf)


@error_case("scale_nan", "ConfigError", "scale_not_finite")
def err_scale_nan():
    """scale=nan."""
    return call(*QKV, scale=math.nan)


@error_case("softcap_zero", "ConfigError", "softcap_not_positive")
def err_softcap_zero():
    """softcap=0 (None means no cap)."""
    return call(*QKV, softcap=0.0)


@error_case("softcap_negative", "ConfigError", "softcap_not_positive")
def err_softcap_negative():
    """softcap=-5."""
    return call(*QKV, softcap=-5.0)


@error_case("unknown_alignment", "ConfigError", "unknown_alignment")
def err_unknown_alignment():
    """causal_alignment="bottom-right" (hyphen) is not one of the two names."""
    return call(*QKV, is_causal=True, causal_alignment="bottom-right")


@error_case("zero_heads", "ConfigError", "non_positive_size")
def err_zero_heads():
    """H = K = 0 heads."""
    return call(z(B, 0, L, D), z(B, 0, S, D), z(B, 0, S, E))


@error_case("zero_head_dim", "ConfigError", "non_positive_size")
def err_zero_head_dim():
    """D = 0 (L = 0 and S = 0 are legal; a zero head dim is not)."""
    return call(z(B, H, L, 0), z(B, K, S, 0), z(B, K, S, E))


#: causal_mask calls that must raise: (name, keywords, class, code).
CAUSAL_MASK_ERROR_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "unknown_alignment",
        {"q_len": 5, "kv_len": 7, "alignment": "diagonal"},
        "ConfigError",
        "unknown_alignment",
    ),
    (
        "negative_length",
        {"q_len": -1, "kv_len": 7, "alignment": "top_left"},
        "ConfigError",
        "non_positive_size",
    ),
    (
        "fractional_length",
        {"q_len": 5, "kv_len": 2.5, "alignment": "bottom_right"},
        "ConfigError",
        "non_positive_size",
    ),
]


# ---------------------------------------------------------------------------------------------
# flash_attention: blocks that do not divide the sequence, blocks larger than it, blocks of one
# ---------------------------------------------------------------------------------------------

#: Cases run against ``flash_attention`` only, with the block sizes of their keywords (the
#: plain functions take no block sizes). Ids ``flash.<name>.<dtype>``; no weights golden.
FLASH_CASES: list[SdpaCase] = []


def flash_case(name: str, dtypes: tuple[str, ...] = F32):
    """Register ``fn(rng, dtype) -> Call`` (keywords holding block_q and block_k) as the case
    ``flash.<name>.<dtype>`` per dtype."""

    def register(fn: Callable[[np.random.Generator, str], Call]):
        FLASH_CASES.append(SdpaCase(name, tuple(dtypes), fn, seed_of("flash." + name)))
        return fn

    return register


# L = 113 query rows and S = 203 keys: prime, so no block size above one divides either.
LONG_L, LONG_S = 113, 203


def long_qkv(rng, *, batch=(1,), h=1, l=LONG_L, s=LONG_S):
    """query (*batch, h, l, 8), key (*batch, 1, s, 8), value (*batch, 1, s, 5): E != D, one
    key/value head (the float64 oracle is a Python loop: long cases are kept narrow)."""
    return qkv(rng, batch=batch, h=h, k=1, l=l, s=s, d=8, e=5)


@flash_case("tiling.ragged.l113_s203", ("float32", "bfloat16"))
def flash_ragged(rng, dtype):
    """Blocks of 16 rows and 32 keys: 113 = 7 * 16 + 1 and 203 = 6 * 32 + 11, so the last query
    block has one row and the last key block eleven keys (MQA 2:1). The running max changes from
    block to block, so a missing rescale of the accumulator (or a division by the row sum before
    the last key block) gives a different answer."""
    return call(*long_qkv(rng, h=2), block_q=16, block_k=32)


@flash_case("tiling.causal_top_left.l113_s203")
def flash_causal_top_left(rng, dtype):
    """top_left causal with blocks of 16 x 32: the diagonal crosses key blocks partway, and the
    blocks above it are skipped. Skipping the partly masked blocks too leaves the first rows with
    no key at all (zeros instead of value row 0)."""
    return call(*long_qkv(rng), is_causal=True, block_q=16, block_k=32)


@flash_case("tiling.causal_bottom_right.l113_s203")
def flash_causal_bottom_right(rng, dtype):
    """bottom_right causal with L < S (offset 90): every row sees at least 91 keys; the diagonal
    crosses key blocks partway."""
    return call(*long_qkv(rng), is_causal=True, causal_alignment="bottom_right",
                block_q=16, block_k=32)  # fmt: skip


@flash_case("tiling.causal_bottom_right.l203_s113")
def flash_causal_bottom_right_tall(rng, dtype):
    """bottom_right causal with L > S: the first 90 rows see no key (zeros, never NaN), so whole
    query blocks are fully masked, and the block holding row 90 is masked but for one key."""
    return call(*long_qkv(rng, l=LONG_S, s=LONG_L), is_causal=True,
                causal_alignment="bottom_right", block_q=16, block_k=32)  # fmt: skip


@flash_case("tiling.left_padding.l17_s203")
def flash_left_padding(rng, dtype):
    """A (B, 1, 1, S) mask that pads example 1 on the left (its first 40 keys are out, as in a
    batch of left-padded prompts): its first key block of 32 is fully masked for every row, so a
    running max of -inf meets the first allowed keys in the second block. 17 = 16 + 1 rows."""
    mask = np.ones((2, 1, 1, LONG_S), dtype=bool)
    mask[1, ..., :40] = False
    return call(*long_qkv(rng, batch=(2,), l=17), mask=mask, block_q=16, block_k=32)


@flash_case("tiling.rising_max.l9_s40", ("float32", "float16"))
def flash_rising_max(rng, dtype):
    """Key j is scaled by 1 + j / 8, so the scores, and the running row max, grow with every key
    block of 8: what was summed under an old max must be rescaled by exp(m_old - m_new) at every
    step. Blocks of 4 rows (9 = 2 * 4 + 1)."""
    q, k, v = long_qkv(rng, l=9, s=40)
    k = k * (1.0 + np.arange(40) / 8.0)[:, None]  # (S, 1): later keys score higher
    return call(q, k, v, block_q=4, block_k=8)


@flash_case("tiling.block_larger.l5_s7", ("float32", "float16"))
def flash_block_larger(rng, dtype):
    """Blocks of 64 rows and 128 keys against L = 5, S = 7: one block each way, shorter than the
    block size (GQA 6:2, with a mask)."""
    return call(*qkv(rng), mask=random_mask(rng, B, 1, L, S), block_q=64, block_k=128)


@flash_case("tiling.block_one.l5_s7", ("float32", "bfloat16"))
def flash_block_one(rng, dtype):
    """Blocks of one row and one key: every key is its own block, so the online softmax rescales
    at almost every step; with a mask, a bias, and bottom_right causal."""
    return call(*qkv(rng), mask=random_mask(rng, B, 1, L, S), bias=0.5 * normal(rng, H, L, S),
                is_causal=True, causal_alignment="bottom_right", block_q=1, block_k=1)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Modules: GroupedQueryAttention / MultiHeadAttention from canonical weights
# ---------------------------------------------------------------------------------------------

# Module sizes: M = H * D = H * E as in most models (so a transposed square projection is a
# wrong number, not a shape error), L != S for cross-attention.
MB, ML, MS, MM, MD = 2, 5, 7, 24, 4


@dataclass
class ModuleCall:
    """One module case: float64 canonical weights, the call's inputs and keywords.

    The module is ``<cls>.from_canonical(weights, n_heads=..., n_kv_heads=...)`` (``n_kv_heads``
    left out for ``MultiHeadAttention``, which defaults it to H), called as
    ``module(x, context, mask=, bias=, **keywords)``.
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


@dataclass
class ModuleCase:
    name: str
    dtypes: tuple[str, ...]
    build: Callable[[np.random.Generator, str], ModuleCall]
    seed: int

    @property
    def doc(self) -> str:
        return " ".join((self.build.__doc__ or "").split())


MODULE_CASES: list[ModuleCase] = []


def module_case(name: str, dtypes: tuple[str, ...] = F32):
    """Register ``fn(rng, dtype) -> ModuleCall`` as the case ``module.<name>.<dtype>``."""

    def register(fn: Callable[[np.random.Generator, str], ModuleCall]):
        MODULE_CASES.append(ModuleCase(name, tuple(dtypes), fn, seed_of("module." + name)))
        return fn

    return register


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


@module_case("mha.self", ALL_DTYPES)
def module_mha_self(rng, dtype):
    """MultiHeadAttention (H = K = 6, M = 24 = H * D), self-attention, with the weights of every
    head returned (B, H, L, L). Square q and o projections: a transposed kernel or q and k
    projections swapped give wrong numbers, not shape errors."""
    return ModuleCall(canonical(rng, k=H), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=H,
                      cls="MultiHeadAttention", keywords={"return_weights": True})  # fmt: skip


@module_case("gqa.h6_k2", ALL_DTYPES)
def module_gqa(rng, dtype):
    """GroupedQueryAttention 6:2, self-attention: query head h reads key/value head h // 3."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      keywords={"return_weights": True})  # fmt: skip


@module_case("mqa.h6_k1", ALL_DTYPES)
def module_mqa(rng, dtype):
    """Multi-query attention (n_kv_heads = 1): one key/value head for all six query heads."""
    return ModuleCall(canonical(rng, k=1), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=1,
                      keywords={"return_weights": True})  # fmt: skip


@module_case("cross.h6_k2", ALL_DTYPES)
def module_cross(rng, dtype):
    """Cross-attention: queries from x (B, L=5, M), keys and values from context (B, S=7, M)."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, MS, MM))  # fmt: skip


@module_case("causal.top_left.l5_s7", ALL_DTYPES)
def module_causal_top_left(rng, dtype):
    """Cross-attention, causal top_left with L = 5 < S = 7: query i sees context tokens 0..i."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, MS, MM),
                      keywords={"is_causal": True, "return_weights": True})  # fmt: skip


@module_case("causal.bottom_right.l5_s7", ALL_DTYPES)
def module_causal_bottom_right(rng, dtype):
    """Cross-attention, causal bottom_right with L = 5 < S = 7: query i sees tokens 0..i+2."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, MS, MM),
                      keywords={"is_causal": True, "causal_alignment": "bottom_right",
                                "return_weights": True})  # fmt: skip


@module_case("causal.bottom_right.l7_s5")
def module_causal_bottom_right_tall(rng, dtype):
    """Cross-attention, causal bottom_right with L = 7 > S = 5: the first two query rows see no
    key; their attention output is zero, so their module output is o_proj's bias alone."""
    return ModuleCall(canonical(rng), normal(rng, MB, MS, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, ML, MM),
                      keywords={"is_causal": True, "causal_alignment": "bottom_right"})  # fmt: skip


@module_case("causal.self", ("float32", "bfloat16"))
def module_causal_self(rng, dtype):
    """Self-attention with the causal rule (L = S: both alignments are the lower triangle)."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      keywords={"is_causal": True})  # fmt: skip


@module_case("padding.b11s", ("float32", "float16", "bfloat16"))
def module_padding(rng, dtype):
    """Cross-attention with a (B, 1, 1, S) padding mask: example 0 has all 7 context tokens,
    example 1 only its first 4 (what padding_mask([7, 4], 7) gives)."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, MS, MM), mask=padding([7, 4], MS),
                      keywords={"return_weights": True})  # fmt: skip


@module_case("bias.full")
def module_bias(rng, dtype):
    """An additive attention bias (B, H, L, S) passed through the module to the attention."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, MS, MM), bias=normal(rng, MB, H, ML, MS))  # fmt: skip


@module_case("no_bias", ("float32", "bfloat16"))
def module_no_bias(rng, dtype):
    """Weights without biases (the four kernels only): bias=False modules."""
    return ModuleCall(canonical(rng, bias=False), normal(rng, MB, ML, MM), n_heads=H,
                      n_kv_heads=K)  # fmt: skip


@module_case("shapes.d5_e3_m17")
def module_shapes(rng, dtype):
    """Head dims that are not d_model / n_heads: M = 17, H = 6, K = 3, D = 5, E = 3 (q_proj
    (17, 30), v_proj (17, 9), o_proj (18, 17)). D and E are read from the kernels' shapes."""
    return ModuleCall(canonical(rng, m=17, k=3, d=5, e=3), normal(rng, MB, ML, 17), n_heads=H,
                      n_kv_heads=3, context=normal(rng, MB, MS, 17))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# KV-cache decoding: any chunking of a sequence gives one full causal forward
# ---------------------------------------------------------------------------------------------

#: How the runner feeds a decode case's sequence of T = 5 tokens to ``decode``, and the
#: ``max_len`` of its cache: token by token into a cache it fills exactly, and in uneven chunks
#: (a prefill of 2, one token, then 2 more attending to 3 cached ones) into a larger cache.
DECODE_CHUNKINGS: dict[str, dict[str, Any]] = {
    "tokens": {"chunks": [1, 1, 1, 1, 1], "max_len": 5},
    "chunks_2_1_2": {"chunks": [2, 1, 2], "max_len": 8, "return_weights": True},
}
DECODE_T = 5


@dataclass
class DecodeCase:
    name: str
    dtypes: tuple[str, ...]
    build: Callable[[np.random.Generator, str], ModuleCall]
    seed: int

    @property
    def doc(self) -> str:
        return " ".join((self.build.__doc__ or "").split())


DECODE_CASES: list[DecodeCase] = []


def decode_case(name: str, dtypes: tuple[str, ...] = ALL_DTYPES):
    """Register ``fn(rng, dtype) -> ModuleCall`` (self-attention, is_causal) as the cases
    ``decode.<name>.<chunking>.<dtype>``, one per chunking of :data:`DECODE_CHUNKINGS`."""

    def register(fn: Callable[[np.random.Generator, str], ModuleCall]):
        DECODE_CASES.append(DecodeCase(name, tuple(dtypes), fn, seed_of("decode." + name)))
        return fn

    return register


@decode_case("mha.h6")
def decode_mha(rng, dtype):
    """MultiHeadAttention, H = K = 6: the cache holds 6 key/value heads."""
    return ModuleCall(canonical(rng, k=H), normal(rng, MB, DECODE_T, MM), n_heads=H, n_kv_heads=H,
                      cls="MultiHeadAttention", keywords={"is_causal": True})  # fmt: skip


@decode_case("gqa.h6_k2")
def decode_gqa(rng, dtype):
    """GroupedQueryAttention 6:2: the cache holds K = 2 heads, a third of MHA's."""
    return ModuleCall(canonical(rng), normal(rng, MB, DECODE_T, MM), n_heads=H, n_kv_heads=K,
                      keywords={"is_causal": True})  # fmt: skip


@decode_case("mqa.h6_k1")
def decode_mqa(rng, dtype):
    """Multi-query attention: the cache holds one key/value head."""
    return ModuleCall(canonical(rng, k=1), normal(rng, MB, DECODE_T, MM), n_heads=H, n_kv_heads=1,
                      keywords={"is_causal": True})  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Module error cases: construction, weight loading, forward, decoding
# ---------------------------------------------------------------------------------------------

# A valid module for the load/forward/decode error cases: M=20, H=6, K=2, D=4, E=3 (zeros).
EM, EH, EK, ED, EE = 20, 6, 2, 4, 3


def error_weights(*, m=EM, h=EH, k=EK, d=ED, e=EE, dtype="float32") -> dict[str, Zeros]:
    """The canonical weights of a module of these sizes, as shapes and a dtype."""
    weights = {}
    for name, (n_in, n_out) in kernel_shapes(m, h, k, d, e).items():
        weights[f"{name}.kernel"] = z(n_in, n_out, dtype=dtype)
        weights[f"{name}.bias"] = z(n_out, dtype=dtype)
    return weights


@dataclass
class ModuleErrorCall:
    """What the runner does before the expected error.

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
    n_heads: int = EH
    n_kv_heads: int | None = EK
    inputs: dict[str, Zeros] = field(default_factory=dict)
    keywords: dict[str, Any] = field(default_factory=dict)
    decode: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModuleErrorCase:
    name: str
    error_class: str
    code: str
    build: Callable[[], ModuleErrorCall]

    @property
    def op(self) -> str:
        """``decode`` for errors of the cached path, ``module`` for the others."""
        return "decode" if self.build().call == "decode" else "module"

    @property
    def doc(self) -> str:
        return " ".join((self.build.__doc__ or "").split())


MODULE_ERROR_CASES: list[ModuleErrorCase] = []


def module_error_case(name: str, error_class: str, code: str):
    """Register ``fn() -> ModuleErrorCall`` as ``module.error.<name>.float32`` (or
    ``decode.error.<name>.float32`` for a decode)."""

    def register(fn: Callable[[], ModuleErrorCall]):
        MODULE_ERROR_CASES.append(ModuleErrorCase(name, error_class, code, fn))
        return fn

    return register


def construct(cls: str, **arguments: Any) -> ModuleErrorCall:
    return ModuleErrorCall("construct", cls, arguments=arguments)


def load(weights: dict[str, Zeros], *, cls="GroupedQueryAttention", n_heads=EH, n_kv_heads=EK):
    return ModuleErrorCall("load", cls, weights=weights, n_heads=n_heads, n_kv_heads=n_kv_heads)


def forward(x=None, context=None, *, mask=None, bias=None, **keywords) -> ModuleErrorCall:
    x = z(MB, ML, EM) if x is None else x
    inputs = {"x": x, "context": context, "mask": mask, "bias": bias}
    return ModuleErrorCall("forward", weights=error_weights(),
                           inputs={n: a for n, a in inputs.items() if a is not None},
                           keywords=keywords)  # fmt: skip


def decode(chunks: list[int], *, max_len: int, batch_size=MB, x=None) -> ModuleErrorCall:
    x = z(MB, sum(chunks), EM) if x is None else x
    return ModuleErrorCall("decode", weights=error_weights(), inputs={"x": x},
                           decode={"batch_size": batch_size, "max_len": max_len,
                                   "chunks": list(chunks)})  # fmt: skip


@module_error_case("d_model_not_divisible", "DimensionMismatchError", "d_model_not_divisible")
def err_d_model_not_divisible():
    """MultiHeadAttention(d_model=16, n_heads=5) without head_dim: 16 is not divisible by 5."""
    return construct("MultiHeadAttention", d_model=16, n_heads=5)


@module_error_case("construct_heads_not_divisible", "DimensionMismatchError",
                   "heads_not_divisible")  # fmt: skip
def err_construct_heads_not_divisible():
    """GroupedQueryAttention(d_model=24, n_heads=6, n_kv_heads=4): 4 does not divide 6."""
    return construct("GroupedQueryAttention", d_model=24, n_heads=6, n_kv_heads=4)


@module_error_case("construct_zero_d_model", "ConfigError", "non_positive_size")
def err_construct_zero_d_model():
    """GroupedQueryAttention(d_model=0, n_heads=6, n_kv_heads=2)."""
    return construct("GroupedQueryAttention", d_model=0, n_heads=6, n_kv_heads=2)


@module_error_case("construct_zero_heads", "ConfigError", "non_positive_size")
def err_construct_zero_heads():
    """MultiHeadAttention(d_model=24, n_heads=0) (not a ZeroDivisionError)."""
    return construct("MultiHeadAttention", d_model=24, n_heads=0)


@module_error_case("construct_zero_head_dim", "ConfigError", "non_positive_size")
def err_construct_zero_head_dim():
    """GroupedQueryAttention(d_model=24, n_heads=6, n_kv_heads=2, head_dim=0)."""
    return construct("GroupedQueryAttention", d_model=24, n_heads=6, n_kv_heads=2, head_dim=0)


@module_error_case("weights_missing", "DimensionMismatchError", "weight_shape")
def err_weights_missing():
    """Canonical weights without o_proj.kernel."""
    weights = error_weights()
    del weights["o_proj.kernel"]
    return load(weights)


@module_error_case("weights_transposed", "DimensionMismatchError", "weight_shape")
def err_weights_transposed():
    """o_proj.kernel given as (M, H*E) = (20, 18), torch's (out, in) layout, not (H*E, M)."""
    weights = error_weights()
    weights["o_proj.kernel"] = z(EM, EH * EE)
    return load(weights)


@module_error_case("weights_torch_names", "DimensionMismatchError", "weight_shape")
def err_weights_torch_names():
    """An extra entry q_proj.weight (a torch state-dict name) next to the canonical ones."""
    return load(error_weights() | {"q_proj.weight": z(EH * ED, EM)})


@module_error_case("weights_some_biases", "DimensionMismatchError", "weight_shape")
def err_weights_some_biases():
    """Biases must be all present or all absent: only q_proj.bias is missing."""
    weights = error_weights()
    del weights["q_proj.bias"]
    return load(weights)


@module_error_case("weights_gqa_into_mha", "DimensionMismatchError", "weight_shape")
def err_weights_gqa_into_mha():
    """GQA 6:2 weights loaded with MultiHeadAttention.from_canonical(n_heads=6): K = H = 6
    cannot split v_proj's 2 * 3 features."""
    return load(error_weights(), cls="MultiHeadAttention", n_heads=EH, n_kv_heads=None)


@module_error_case("weights_mixed_dtypes", "DTypeError", "dtype_mismatch")
def err_weights_mixed_dtypes():
    """Every weight float32 but v_proj.kernel float16."""
    weights = error_weights()
    weights["v_proj.kernel"] = z(EM, EK * EE, dtype="float16")
    return load(weights)


@module_error_case("weights_int", "DTypeError", "unsupported_dtype")
def err_weights_int():
    """Integer weights."""
    return load(error_weights(dtype="int32"))


@module_error_case("x_width", "DimensionMismatchError", "model_width_mismatch")
def err_x_width():
    """x (B, L, 21) into a module of d_model M = 20."""
    return forward(z(MB, ML, EM + 1))


@module_error_case("context_width", "DimensionMismatchError", "model_width_mismatch")
def err_context_width():
    """context (B, S, 19) into a module of d_model M = 20."""
    return forward(z(MB, ML, EM), z(MB, MS, EM - 1))


@module_error_case("x_rank", "DimensionMismatchError", "rank")
def err_x_rank():
    """x of rank 2 (L, M): the batch axis is missing."""
    return forward(z(ML, EM))


@module_error_case("x_dtype", "DTypeError", "dtype_mismatch")
def err_x_dtype():
    """float64 x into a float32 module."""
    return forward(z(MB, ML, EM, dtype="float64"))


@module_error_case("context_batch", "DimensionMismatchError", "batch_not_broadcastable")
def err_context_batch():
    """x batch 2, context batch 3."""
    return forward(z(2, ML, EM), z(3, MS, EM))


@module_error_case("mask_kv_heads", "MaskError", "mask_kv_heads")
def err_module_mask_kv_heads():
    """A mask with a head axis of size K = 2 (neither 1 nor H = 6)."""
    return forward(z(MB, ML, EM), z(MB, MS, EM), mask=z(MB, EK, ML, MS, dtype="bool"))


@module_error_case("mask_dtype", "MaskError", "mask_dtype")
def err_module_mask_dtype():
    """An integer padding mask (0/1)."""
    return forward(z(MB, ML, EM), z(MB, MS, EM), mask=z(MB, 1, 1, MS, dtype="int32"))


@module_error_case("padding_mask_of_x", "MaskError", "mask_shape")
def err_module_mask_shape():
    """A (B, 1, 1, L) padding mask for cross-attention, where the keys are the S = 7 context
    tokens."""
    return forward(z(MB, ML, EM), z(MB, MS, EM), mask=z(MB, 1, 1, ML, dtype="bool"))


@module_error_case("unknown_alignment", "ConfigError", "unknown_alignment")
def err_module_alignment():
    """causal_alignment="lower_right" (torch's name for the bias object, not an alignment)."""
    return forward(is_causal=True, causal_alignment="lower_right")


@module_error_case("cache_overflow", "ConfigError", "cache_overflow")
def err_cache_overflow():
    """A cache of max_len 6: a prefill of 4 tokens fits, 3 more would need 7. Never a wrap or a
    silent truncation."""
    return decode([4, 3], max_len=6)


@module_error_case("cache_overflow_one_token", "ConfigError", "cache_overflow")
def err_cache_overflow_one_token():
    """A cache of max_len 3 filled token by token: the fourth token overflows."""
    return decode([1, 1, 1, 1], max_len=3)


@module_error_case("cache_zero_max_len", "ConfigError", "non_positive_size")
def err_cache_zero_max_len():
    """init_cache(batch_size=2, max_len=0)."""
    return decode([1], max_len=0)


@module_error_case("cache_batch", "DimensionMismatchError", "batch_not_broadcastable")
def err_cache_batch():
    """A cache made for 3 sequences fed a batch of 2."""
    return decode([2], max_len=6, batch_size=3)


@module_error_case("decode_width", "DimensionMismatchError", "model_width_mismatch")
def err_decode_width():
    """New tokens of width 21 into a module of d_model M = 20."""
    return decode([2], max_len=6, x=z(MB, 2, EM + 1))


# ---------------------------------------------------------------------------------------------
# Sizes the GPU fused kernels take (the benchmark gates each pinned backend on these)
# ---------------------------------------------------------------------------------------------

#: The dtypes the GPU fused kernels compute in.
HALF_DTYPES = ("float16", "bfloat16")
#: query/key/value sizes every fused GPU kernel accepts: D = E = 16 (a multiple of 8, at most
#: 128), L = 8, S = 24; B = 2 and H = 4 keep the axes pairwise distinct.
KERNEL_SIZES = {"l": 8, "s": 24, "d": 16, "e": 16}


@sdpa_case("kernel.d16.mha", HALF_DTYPES)
def kernel_d16_mha(rng, dtype):
    """MHA (H = K = 4) with D = E = 16: a case torch's flash, memory-efficient and cuDNN SDPA
    backends and JAX's cuDNN attention all accept (the small cases above, D = 11 or 2 and
    E != D, never reach those kernels)."""
    return call(*qkv(rng, h=4, k=4, **KERNEL_SIZES))


@sdpa_case("kernel.d16.causal", HALF_DTYPES)
def kernel_d16_causal(rng, dtype):
    """The same sizes with is_causal (top_left, L < S): the kernels' own causal path, which
    skips the masked blocks instead of masking a score matrix."""
    return call(*qkv(rng, h=4, k=4, **KERNEL_SIZES), is_causal=True)


@sdpa_case("kernel.d16.gqa", HALF_DTYPES)
def kernel_d16_gqa(rng, dtype):
    """GQA 4:2 at the same sizes: the kernels that take grouped heads natively (a kernel that
    does not is reported unsupported by the benchmark's gate, not failed)."""
    return call(*qkv(rng, h=4, k=2, **KERNEL_SIZES))
