"""Attention cases: every point of the functional contract, one short named function each.

Each ``@sdpa_case`` function builds the float64 inputs of one case from its own seeded generator
and says, in its docstring, what it pins down and which mistake it catches. The generator rounds
the inputs to each dtype listed, computes the golden with the float64 oracle, and writes one
fixture per dtype, with the id ``sdpa.<name>.<dtype>`` (e.g. ``sdpa.gqa.h6_k2.float32``); each
is run against ``scaled_dot_product_attention``, ``attention_weights`` and, when a port has it,
``flash_attention``. ``causal_mask_case`` entries store the boolean result of
``causal_mask(L, S, alignment=...)``.
"""

from __future__ import annotations

import math

import numpy as np

from conformance.cases.base import (
    ALL_DTYPES,
    B,
    D,
    E,
    H,
    K,
    L,
    S,
    call,
    causal_mask_case,
    most_negative,
    normal,
    qkv,
    random_mask,
    sdpa_case,
)

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


@sdpa_case("bias.pos_inf", ("float64", "float32"))
def bias_pos_inf(rng, dtype):
    """+inf in the bias: at an allowed position (query 1, key 2) the row is NaN, as IEEE
    arithmetic says (inf - inf); at a position the mask refuses (query 3, key 4) it is out like
    any other, and that row is a number. A port whose shift guard replaces any non-finite row
    max by 0 (not only -inf) turns row 1 into a finite, wrong answer instead."""
    bias = normal(rng, B, H, L, S)
    bias[..., 1, 2] = bias[..., 3, 4] = math.inf
    mask = np.ones((L, S), bool)
    mask[3, 4] = False
    return call(*qkv(rng), mask=mask, bias=bias)


@sdpa_case("bias.with_mask", ("float32", "bfloat16"))
def bias_with_mask(rng, dtype):
    """bias and mask together: the bias is added, then the mask's False positions are out."""
    return call(*qkv(rng), mask=random_mask(rng, B, 1, L, S), bias=normal(rng, H, L, S))


@sdpa_case("bias.broadcast_ls")
def bias_broadcast_ls(rng, dtype):
    """A distance bias of shape (L, S), -0.5 |i - j| (ALiBi-like), broadcast over batch/heads."""
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    return call(*qkv(rng), bias=-0.5 * np.abs(i - j).astype(np.float64))


@sdpa_case("bias.float32_bias", ("float16", "bfloat16"))
def bias_float32_with_low_precision(rng, dtype):
    """A float32 bias with float16 or bfloat16 queries: the contract lets the bias have a dtype
    of its own, and the sum is taken in the compute dtype (float32). A port that refuses the
    mixed dtypes (MLX's kernel does) fails here; its entries are finer than bfloat16 can hold,
    so the golden is the float32 bias's, not a rounded one's."""
    bias = np.round(normal(rng, B, H, L, S) * 1024.0) / 1024.0 + 1.0 / 3.0
    return call(*qkv(rng), bias=bias, bias_dtype="float32")


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

#: (alignment, L, S) of the ``causal_mask`` cases: L < S, L > S, L = S and the empty sizes, for
#: both alignments. The boolean (L, S) result is stored.
CAUSAL_MASK_SIZES: list[tuple[str, int, int]] = [
    (alignment, q_len, kv_len)
    for alignment in ("top_left", "bottom_right")
    for q_len, kv_len in ((5, 7), (7, 5), (6, 6), (1, 9), (9, 1), (0, 4), (4, 0))
]


def _register_causal_mask(alignment: str, q_len: int, kv_len: int) -> None:
    def build():
        return {"q_len": q_len, "kv_len": kv_len, "alignment": alignment}

    build.__doc__ = f"causal_mask({q_len}, {kv_len}, alignment={alignment!r}): j <= i + offset."
    causal_mask_case(f"{alignment}.l{q_len}_s{kv_len}", ("bool",))(build)


for _size in CAUSAL_MASK_SIZES:
    _register_causal_mask(*_size)


# ---------------------------------------------------------------------------------------------
# Garbage at keys no query attends
# ---------------------------------------------------------------------------------------------


@sdpa_case("garbage.padding", ALL_DTYPES)
def garbage_padding(rng, dtype):
    """A (B, 1, 1, S) padding mask (example 1 keeps its first 4 of 7 keys) whose padded keys and
    values hold NaN and inf: no query attends them, so they never reach the output or the
    weights. A plain path that multiplies their zero weights by NaN values (0 * NaN = NaN) fails
    here; it must zero those rows or select, as the tiled path does by skipping them."""
    q, k, v = qkv(rng)
    k[1, :, 4:, :] = math.nan
    v[1, :, 4:, :] = math.nan
    v[1, :, 5, 0] = math.inf
    lengths = np.array([7, 4])
    mask = np.arange(S)[None, :] < lengths[:, None]  # (B, S)
    return call(q, k, v, mask=mask[:, None, None, :])


@sdpa_case("garbage.causal_tail")
def garbage_causal_tail(rng, dtype):
    """top_left causal with L = 5 < S = 7: keys 5 and 6 are seen by no query (unused cache slots,
    say), and hold NaN; the output is the clean one."""
    q, k, v = qkv(rng)
    k[..., 5:, :] = math.nan
    v[..., 5:, :] = -math.inf
    return call(q, k, v, is_causal=True)


@sdpa_case("garbage.neg_inf_bias_column")
def garbage_neg_inf_bias_column(rng, dtype):
    """A key that every row's bias excludes (-inf in its whole column) holds NaN in its key and
    value: a -inf bias excludes a key as a False mask does, so the NaN never shows (a NaN score
    plus -inf is NaN, which an arithmetic-only mask would let through)."""
    q, k, v = qkv(rng)
    k[..., 3, :] = math.nan
    v[..., 3, :] = math.nan
    bias = 0.5 * normal(rng, B, H, L, S)
    bias[..., 3] = -math.inf
    return call(q, k, v, bias=bias)


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
