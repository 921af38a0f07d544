"""The case list: every point of the contract, one short named function each.

Read this file as documentation. Each ``@sdpa_case`` function builds the float64 inputs of one
case from its own seeded generator and says, in its docstring, what it pins down and which
mistake it catches. The generator (``conformance/generate.py``) rounds the inputs to each dtype
listed, computes the golden with the float64 oracle, and writes one fixture per dtype, with the
id ``sdpa.<name>.<dtype>`` (e.g. ``sdpa.gqa.h6_k2.float32``).

``@error_case`` functions give the shapes, dtypes and keywords of a call that must raise, and
the error class and code SEMANTICS.md's taxonomy prescribes. ``CAUSAL_MASK_CASES`` lists the
``causal_mask(L, S, alignment=...)`` calls whose boolean result is stored.

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
    "ERROR_CASES",
    "SDPA_CASES",
    "Call",
    "ErrorCase",
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
