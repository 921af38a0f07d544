"""Gradient cases: the backward pass of every point of the contract, one short function each.

A ``@grad_case`` builds the forward call exactly as an ``sdpa`` case does; the generator then
draws ``grad_output`` (the cotangent ``dO`` of the output, standard normal, from the same seeded
generator) and stores the golden ``dq``, ``dk``, ``dv`` (and ``dbias``, ``dsinks`` when the
call has a bias or sinks) of the float64 oracle's own backward
(:func:`conformance.oracle.attention_vjp`). Ids ``grad.<name>.<dtype>``; each is run against a
port's ``scaled_dot_product_attention_vjp`` and, when it has one, ``flash_attention_vjp``
(with the runner's small blocks). A ``@flash_grad_case`` gives its own block sizes and is run
against ``flash_attention_vjp`` alone (``flash_grad.<name>.<dtype>``).

The sizes are the forward's, pairwise distinct, with small head dims so the files stay small:
B=2, H=6, K=2, L=5, S=7, D=4, E=3.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from conformance.cases.base import (
    ALL_DTYPES,
    B,
    H,
    K,
    L,
    S,
    call,
    case,
    normal,
    qkv,
    random_mask,
    z,
)
from conformance.cases.flash import LONG_L, LONG_S, long_qkv
from conformance.cases.masks import pow2_slopes

grad_case = partial(case, "grad")
flash_grad_case = partial(case, "flash_grad")

#: The head dims of the gradient cases (the forward's D = 11, E = 13 made the files 3x larger).
GD, GE = 4, 3
F32_BF16 = ("float32", "bfloat16")
F32_F16 = ("float32", "float16")


def gqkv(rng, **sizes):
    """:func:`~conformance.cases.base.qkv` with the gradient cases' head dims D = 4, E = 3."""
    return qkv(rng, **{"d": GD, "e": GE, **sizes})


# ---------------------------------------------------------------------------------------------
# Basic and grouped-query attention
# ---------------------------------------------------------------------------------------------


@grad_case("basic.mha", ALL_DTYPES)
def grad_basic_mha(rng, dtype):
    """MHA (H = K = 3): dV = W^T dO, dS = W * (dW - rowsum(dO * O)), dQ = dS K / sqrt(D),
    dK = dS^T Q / sqrt(D). A backward without the rowsum term, or with the scale twice, fails."""
    return call(*gqkv(rng, h=3, k=3))


@grad_case("gqa.h6_k2", ALL_DTYPES)
def grad_gqa_h6_k2(rng, dtype):
    """GQA 6:2: dK and dV of key/value head n sum over query heads 3n .. 3n + 2 (contiguous).
    Summing over h % 2 (tiling), or not summing (one head's gradient), gives other numbers."""
    return call(*gqkv(rng))


@grad_case("gqa.h8_k1", F32_BF16)
def grad_gqa_h8_k1(rng, dtype):
    """MQA 8:1: the single key/value head's gradient sums over all eight query heads."""
    return call(*gqkv(rng, h=8, k=1))


@grad_case("gqa.h6_k3")
def grad_gqa_h6_k3(rng, dtype):
    """GQA 6:3 (G = 2): group sums over [0, 1], [2, 3], [4, 5], not [0, 3], [1, 4], [2, 5]."""
    return call(*gqkv(rng, k=3))


# ---------------------------------------------------------------------------------------------
# Masks, every broadcast shape
# ---------------------------------------------------------------------------------------------


@grad_case("mask.bhls")
def grad_mask_bhls(rng, dtype):
    """A full (B, H, L, S) mask: masked positions get exactly zero dS, so no dQ or dK term."""
    return call(*gqkv(rng), mask=random_mask(rng, B, H, L, S))


@grad_case("mask_broadcast.s")
def grad_mask_s(rng, dtype):
    """Mask of shape (S,): one key pattern for every row; the masked keys' dK and dV are 0."""
    return call(*gqkv(rng), mask=random_mask(rng, S))


@grad_case("mask_broadcast.1s")
def grad_mask_1s(rng, dtype):
    """Mask of shape (1, S)."""
    return call(*gqkv(rng), mask=random_mask(rng, 1, S))


@grad_case("mask_broadcast.l1")
def grad_mask_l1(rng, dtype):
    """Mask of shape (L, 1): row 1 is off, a fully masked row by broadcasting: its dQ is zero
    and it adds nothing to dK and dV."""
    mask = np.ones((L, 1), dtype=bool)
    mask[1, 0] = False
    return call(*gqkv(rng), mask=mask)


@grad_case("mask_broadcast.b11s", F32_BF16)
def grad_mask_b11s(rng, dtype):
    """A (B, 1, 1, S) padding mask (example 1 keeps 4 of 7 keys): the padded keys' gradients
    are zero in example 1 only."""
    mask = np.arange(S)[None, :] < np.array([7, 4])[:, None]  # (B, S)
    return call(*gqkv(rng), mask=mask[:, None, None, :])


@grad_case("mask_broadcast.b1ls")
def grad_mask_b1ls(rng, dtype):
    """Mask of shape (B, 1, L, S): per example, shared by the heads."""
    return call(*gqkv(rng), mask=random_mask(rng, B, 1, L, S))


@grad_case("mask_broadcast.1hls")
def grad_mask_1hls(rng, dtype):
    """Mask of shape (1, H, L, S): per query head; the heads of one group differ, so the group
    sum of dK adds differently masked terms."""
    return call(*gqkv(rng), mask=random_mask(rng, 1, H, L, S))


@grad_case("mask_broadcast.hls")
def grad_mask_hls(rng, dtype):
    """Mask of shape (H, L, S) (no batch axis)."""
    return call(*gqkv(rng), mask=random_mask(rng, H, L, S))


# ---------------------------------------------------------------------------------------------
# Causal, both alignments, L < S and L > S
# ---------------------------------------------------------------------------------------------


@grad_case("causal.top_left.l5_s7", F32_BF16)
def grad_causal_top_left_l5_s7(rng, dtype):
    """top_left, L < S: keys 5 and 6 are seen by no query, so their dK and dV are zero."""
    return call(*gqkv(rng), is_causal=True)


@grad_case("causal.top_left.l7_s5")
def grad_causal_top_left_l7_s5(rng, dtype):
    """top_left, L > S: rows 4..6 see every key."""
    return call(*gqkv(rng, l=7, s=5), is_causal=True)


@grad_case("causal.bottom_right.l5_s7", F32_BF16)
def grad_causal_bottom_right_l5_s7(rng, dtype):
    """bottom_right, L < S: row i sees keys 0 .. i + 2."""
    return call(*gqkv(rng), is_causal=True, causal_alignment="bottom_right")


@grad_case("causal.bottom_right.l9_s5")
def grad_causal_bottom_right_l9_s5(rng, dtype):
    """bottom_right, L > S: rows 0..3 see no key (zero dQ), row 4 sees key 0 only, whose weight
    is then 1, so its dS is zero (a softmax of one entry has no gradient)."""
    return call(*gqkv(rng, l=9, s=5), is_causal=True, causal_alignment="bottom_right")


# ---------------------------------------------------------------------------------------------
# Fully masked rows, four ways, in every dtype: zero gradient, never NaN
# ---------------------------------------------------------------------------------------------


@grad_case("fully_masked.bool_row", ALL_DTYPES)
def grad_fully_masked_bool_row(rng, dtype):
    """Query row 2's mask is all False: its dQ is exactly zero and it adds nothing to dK, dV.
    An unguarded softmax makes it NaN, and NaN then spreads through dK and dV to every key."""
    mask = random_mask(rng, B, 1, L, S)
    mask[..., 2, :] = False
    return call(*gqkv(rng), mask=mask)


@grad_case("fully_masked.neg_inf_bias_row", ALL_DTYPES)
def grad_fully_masked_neg_inf_bias_row(rng, dtype):
    """Query row 2's bias is -inf at every key: zero dQ in that row, and a zero dbias there
    (the bias's gradient is dS, which is zero where the weight is)."""
    bias = 0.5 * normal(rng, B, H, L, S)
    bias[..., 2, :] = -math.inf
    return call(*gqkv(rng), bias=bias)


@grad_case("fully_masked.all_rows", ALL_DTYPES)
def grad_fully_masked_all_rows(rng, dtype):
    """Every key of every row masked: every gradient is zero."""
    return call(*gqkv(rng), mask=np.zeros((L, S), dtype=bool))


@grad_case("fully_masked.causal_rows", ALL_DTYPES)
def grad_fully_masked_causal_rows(rng, dtype):
    """bottom_right causal with L = 9 > S = 5 and a bias: the first four rows are fully masked
    by the causal rule alone; their dQ and dbias are zero, never NaN."""
    return call(*gqkv(rng, l=9, s=5), bias=0.5 * normal(rng, H, 9, 5), is_causal=True,
                causal_alignment="bottom_right")


# ---------------------------------------------------------------------------------------------
# Bias: -inf entries, every broadcast shape reduced back, a dtype of its own
# ---------------------------------------------------------------------------------------------


@grad_case("bias.full", F32_BF16)
def grad_bias_full(rng, dtype):
    """A (B, H, L, S) bias: dbias = dS, element for element."""
    return call(*gqkv(rng), bias=normal(rng, B, H, L, S))


@grad_case("bias.neg_inf", F32_F16)
def grad_bias_neg_inf(rng, dtype):
    """A bias holding -inf at a quarter of the positions: dbias is exactly zero there."""
    bias = normal(rng, B, H, L, S)
    bias[rng.random(bias.shape) < 0.25] = -math.inf
    bias[..., 0] = 0.0
    return call(*gqkv(rng), bias=bias)


@grad_case("bias_broadcast.ls")
def grad_bias_ls(rng, dtype):
    """A distance bias of shape (L, S): dbias sums dS over the batch and the heads."""
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]
    return call(*gqkv(rng), bias=-0.5 * np.abs(i - j).astype(np.float64))


@grad_case("bias_broadcast.h1s")
def grad_bias_h1s(rng, dtype):
    """A bias of shape (H, 1, S): dbias sums dS over the batch and the query rows."""
    return call(*gqkv(rng), bias=normal(rng, H, 1, S))


@grad_case("bias_broadcast.b11s")
def grad_bias_b11s(rng, dtype):
    """A (B, 1, 1, S) bias: dbias sums dS over the heads and the query rows, per example."""
    return call(*gqkv(rng), bias=normal(rng, B, 1, 1, S))


@grad_case("bias.float32_bias", ("float16", "bfloat16"))
def grad_bias_float32(rng, dtype):
    """A float32 bias with float16 or bfloat16 queries: dbias comes back in float32 (the
    bias's dtype), dQ, dK and dV in the queries' dtype."""
    return call(*gqkv(rng), bias=normal(rng, H, L, S), bias_dtype="float32")


# ---------------------------------------------------------------------------------------------
# Softcap and scale
# ---------------------------------------------------------------------------------------------


@grad_case("softcap.cap2_neg_inf_bias", ALL_DTYPES)
def grad_softcap_2(rng, dtype):
    """softcap=2, scale=1, and a bias holding -inf: dS is multiplied by 1 - tanh^2(s / 2)
    before dQ and dK (not before dbias: the bias is added after the cap). Scores are about
    +-4, so the factor is far from 1 and a missing one shows."""
    bias = normal(rng, B, H, L, S)
    bias[rng.random(bias.shape) < 0.3] = -math.inf
    bias[..., 0] = 0.0
    return call(*gqkv(rng), bias=bias, scale=1.0, softcap=2.0)


@grad_case("softcap.cap30")
def grad_softcap_30(rng, dtype):
    """softcap=30 with scale=12: the largest scores (about 60) are capped hard, and their
    factor 1 - tanh^2 is near zero."""
    return call(*gqkv(rng), scale=12.0, softcap=30.0)


@grad_case("scale.custom", ("float64", "float32"))
def grad_scale_custom(rng, dtype):
    """scale=0.37: dQ and dK carry the scale once."""
    return call(*gqkv(rng), scale=0.37)


@grad_case("scale.zero")
def grad_scale_zero(rng, dtype):
    """scale=0: uniform weights whatever q and k are, so dQ and dK are exactly zero; dV is
    the mean of dO over the rows' weights."""
    return call(*gqkv(rng), scale=0.0)


@grad_case("scale.negative")
def grad_scale_negative(rng, dtype):
    """scale=-0.6: the sign goes through dQ and dK."""
    return call(*gqkv(rng), scale=-0.6)


# ---------------------------------------------------------------------------------------------
# Shapes and batch dims
# ---------------------------------------------------------------------------------------------


@grad_case("shapes.e_gt_d")
def grad_e_gt_d(rng, dtype):
    """E = 9 > D = 2: dV is (..., K, S, E), dQ and dK (..., D); swapped head dims fail."""
    return call(*qkv(rng, d=2, e=9))


@grad_case("shapes.l1_s1")
def grad_l1_s1(rng, dtype):
    """One query, one key: the weight is 1 whatever the score, so dQ and dK are zero and
    dV = dO."""
    return call(*gqkv(rng, l=1, s=1))


@grad_case("shapes.s0", F32_BF16)
def grad_s0(rng, dtype):
    """No keys: every row is fully masked and every gradient is zero (dK, dV have S = 0)."""
    return call(*gqkv(rng, s=0))


@grad_case("shapes.no_batch")
def grad_no_batch(rng, dtype):
    """No batch dim: query (H, L, D)."""
    return call(*gqkv(rng, batch=()))


@grad_case("batch.many_dims")
def grad_many_dims(rng, dtype):
    """Three leading batch dims (2, 3, 1)."""
    return call(*gqkv(rng, batch=(2, 3, 1), h=2, k=1))


@grad_case("batch.broadcast")
def grad_batch_broadcast(rng, dtype):
    """Batch dims that broadcast: query (2, 1, ...), key (3, ...), value (1, 3, ...), mask
    (1, 3, 1, 1, S); the output has batch (2, 3), and each gradient is summed back to its
    input's batch: dQ over the 3, dK over the 2, dV over the 2."""
    q = normal(rng, 2, 1, H, L, GD)
    k = normal(rng, 3, K, S, GD)
    v = normal(rng, 1, 3, K, S, GE) + 2.0 * np.arange(K).reshape(K, 1, 1)
    return call(q, k, v, mask=random_mask(rng, 1, 3, 1, 1, S))


@grad_case("batch.value_only")
def grad_value_only(rng, dtype):
    """Only value has a batch dim (2,): dQ and dK sum over it, dV does not."""
    q, k, v = gqkv(rng, batch=())
    return call(q, k, np.stack([v, -0.5 * v]))


@grad_case("large_logits.shifted", F32_BF16)
def grad_large_logits(rng, dtype):
    """Every score shifted by +200 through a (1, S) bias: the gradients do not change, but an
    exp(s) without the row max overflows; dbias sums dS over batch, heads and rows, which is
    zero up to rounding (each row's dS sums to zero)."""
    return call(*gqkv(rng), bias=np.full((1, S), 200.0))


# ---------------------------------------------------------------------------------------------
# Contract v2: windows, segments, sinks, ALiBi, garbage at unattended keys
# ---------------------------------------------------------------------------------------------


@grad_case("window.both.bottom_right", F32_BF16)
def grad_window(rng, dtype):
    """window=(2, 1), bottom_right: row i sees keys i .. i + 3; keys outside every band get
    zero dK and dV."""
    return call(*gqkv(rng), window=(2, 1), causal_alignment="bottom_right")


@grad_case("window.fully_masked_rows.l9_s5")
def grad_window_fully_masked(rng, dtype):
    """window=(1, 0), bottom_right, L > S: rows 0..3 see no key: zero dQ, never NaN."""
    return call(*gqkv(rng, l=9, s=5), window=(1, 0), causal_alignment="bottom_right")


@grad_case("segments.two_docs", F32_BF16)
def grad_segments(rng, dtype):
    """Two packed documents per example: no gradient crosses from one document to the other."""
    q_ids = np.array([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]])  # (B, L)
    kv_ids = np.array([[0, 0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1]])  # (B, S)
    return call(*gqkv(rng), q_segment_ids=q_ids, kv_segment_ids=kv_ids)


@grad_case("segments.no_key")
def grad_segments_no_key(rng, dtype):
    """Query 4's segment has no key: a zero row of dQ."""
    q_ids = np.array([0, 0, 1, 1, 2])  # (L,)
    kv_ids = np.array([0, 0, 0, 1, 1, 1, 1])  # (S,)
    return call(*gqkv(rng), q_segment_ids=q_ids, kv_segment_ids=kv_ids)


@grad_case("sinks.basic", ALL_DTYPES)
def grad_sinks(rng, dtype):
    """A sink per head: dsink_h = -sum_i w_sink,i (dO_i . O_i) over the head's rows and the
    batch; dS keeps its form (the sink's value is zero)."""
    return call(*gqkv(rng), sinks=normal(rng, H), scale=0.5)


@grad_case("sinks.fully_masked_rows", F32_BF16)
def grad_sinks_fully_masked(rng, dtype):
    """A sink and a fully masked row: the sink takes the whole row, whose output is zero, so
    the row adds nothing to dsink (and nothing is NaN)."""
    mask = random_mask(rng, B, 1, L, S)
    mask[..., 2, :] = False
    return call(*gqkv(rng), mask=mask, sinks=normal(rng, H))


@grad_case("sinks.gqa.h8_k1")
def grad_sinks_gqa(rng, dtype):
    """MQA 8:1 with a sink per query head: dsink belongs to the query head."""
    return call(*gqkv(rng, h=8, k=1), sinks=np.linspace(-2.0, 2.0, 8))


@grad_case("sinks.large", F32_F16)
def grad_sinks_large(rng, dtype):
    """Sinks of 4 against scores of about 1: the sink takes most of each row's weight."""
    return call(*gqkv(rng), sinks=np.full(H, 4.0))


@grad_case("alibi.pow2.h8", F32_BF16)
def grad_alibi(rng, dtype):
    """ALiBi with H = 8: a term of the scores, not differentiated; dQ and dK see the biased
    weights."""
    return call(*gqkv(rng, h=8, k=2), alibi_slopes=pow2_slopes(8), scale=0.7)


@grad_case("alibi.softcap")
def grad_alibi_softcap(rng, dtype):
    """ALiBi with softcap=2, scale=1: the softcap factor belongs to the capped scores only."""
    return call(*gqkv(rng), alibi_slopes=np.full(H, 0.75), softcap=2.0, scale=1.0)


@grad_case("garbage.padding", F32_BF16)
def grad_garbage_padding(rng, dtype):
    """A padding mask whose padded keys and values hold NaN and inf: no query attends them, so
    their dK and dV are zero and nothing else is NaN."""
    q, k, v = gqkv(rng)
    k[1, :, 4:, :] = math.nan
    v[1, :, 4:, :] = math.nan
    v[1, :, 5, 0] = math.inf
    mask = np.arange(S)[None, :] < np.array([7, 4])[:, None]  # (B, S)
    return call(q, k, v, mask=mask[:, None, None, :])


# ---------------------------------------------------------------------------------------------
# The tiled backward: 113 x 203 with blocks of 1, of 7, and larger than the sequence
# ---------------------------------------------------------------------------------------------


@flash_grad_case("tiling.blocks_1.window.l113_s203")
def flash_grad_blocks_1(rng, dtype):
    """Blocks of one row and one key, window=(20, 3), bottom_right: every key is its own block,
    so dQ of a row sums over 24 blocks and dK, dV of a key over as many; the blocks outside
    the band are skipped in the backward as in the forward."""
    return call(*long_qkv(rng, h=2), window=(20, 3), causal_alignment="bottom_right",
                block_q=1, block_k=1)


@flash_grad_case("tiling.blocks_7.causal.l113_s203", F32_BF16)
def flash_grad_blocks_7(rng, dtype):
    """Blocks of 7 x 7 (neither divides 113 or 203), top_left causal: the diagonal crosses
    blocks partway; a backward that skips the blocks on the diagonal loses their terms."""
    return call(*long_qkv(rng), is_causal=True, block_q=7, block_k=7)


@flash_grad_case("tiling.blocks_7.bottom_right.l203_s113")
def flash_grad_tall(rng, dtype):
    """bottom_right causal with L = 203 > S = 113 and blocks of 7 x 16: the first 90 rows see
    no key (whole query blocks fully masked: zero dQ, never NaN)."""
    return call(*long_qkv(rng, l=LONG_S, s=LONG_L), is_causal=True,
                causal_alignment="bottom_right", block_q=7, block_k=16)


@flash_grad_case("tiling.blocks_larger.l113_s203")
def flash_grad_blocks_larger(rng, dtype):
    """Blocks of 128 x 256, larger than L and S: one block, with an (S,) mask and a (1, 1, S)
    bias whose dbias sums over every row."""
    mask = random_mask(rng, LONG_S)
    return call(*long_qkv(rng), mask=mask, bias=normal(rng, 1, 1, LONG_S), block_q=128,
                block_k=256)


@flash_grad_case("tiling.lse_rows.l113_s203")
def flash_grad_lse_rows(rng, dtype):
    """Blocks of 16 x 32, GQA 2:1, with rows whose scores differ by up to 6 (a row-dependent
    bias): each block is rebuilt as exp(s - lse) with its own rows' log-sum-exp; another
    block's rows give weights off by exp(lse_i - lse_i')."""
    bias = 3.0 * normal(rng, 1, LONG_L, 1)  # (1, L, 1): each row shifted by its own amount
    return call(*long_qkv(rng, h=2), bias=bias, block_q=16, block_k=32)


@flash_grad_case("tiling.sinks_segments.l113_s203")
def flash_grad_sinks_segments(rng, dtype):
    """Sinks, ALiBi and packed segments over blocks of 16 x 32: dsink is summed over every
    query block; blocks whose segments cannot meet are skipped."""
    q_ids = np.repeat([0, 1, 2], [30, 50, 33])  # (L = 113,)
    kv_ids = np.repeat([0, 1, 2], [60, 100, 43])  # (S = 203,)
    return call(*long_qkv(rng, h=2), sinks=np.array([1.0, -1.0]), alibi_slopes=pow2_slopes(2),
                q_segment_ids=q_ids, kv_segment_ids=kv_ids, block_q=16,
                block_k=32)


# ---------------------------------------------------------------------------------------------
# Errors of the backward's own argument
# ---------------------------------------------------------------------------------------------


def grad_error_case(name: str, error_class: str, code: str):
    """Register ``fn() -> (Call, grad_output Zeros)`` as ``grad.error.<name>.float32``."""
    return case("grad", name, ("float32",), error=(error_class, code))


@grad_error_case("grad_output_shape", "DimensionMismatchError", "grad_output_shape")
def grad_err_shape():
    """grad_output of shape (B, H, L, D) where the output is (B, H, L, E): D and E swapped."""
    return call(z(B, H, L, GD), z(B, K, S, GD), z(B, K, S, GE)), z(B, H, L, GD)


@grad_error_case("grad_output_no_batch", "DimensionMismatchError", "grad_output_shape")
def grad_err_no_batch():
    """grad_output (H, L, E) for an output (B, H, L, E): it must have the output's exact shape;
    it is not broadcast."""
    return call(z(B, H, L, GD), z(B, K, S, GD), z(B, K, S, GE)), z(H, L, GE)
