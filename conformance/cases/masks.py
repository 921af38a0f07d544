"""Contract v2 cases: sliding windows, packed segments, attention sinks and ALiBi.

Each is an ``sdpa`` case (run against ``scaled_dot_product_attention``, ``attention_weights`` and
``flash_attention``) or, with block sizes, a ``flash`` tiling case. The window's and ALiBi's
diagonal is ``causal_alignment``'s (offset 0 for ``top_left``, ``S - L`` for ``bottom_right``)
whether or not ``is_causal`` is set. The ALiBi slopes are written out here from the paper's rule
(they are inputs; ``alibi_slopes(n_heads)`` itself is checked in tests/test_masks.py).
"""

from __future__ import annotations

import numpy as np

from conformance.cases.base import (
    ALL_DTYPES,
    B,
    H,
    L,
    S,
    call,
    flash_case,
    normal,
    qkv,
    random_mask,
    sdpa_case,
)
from conformance.cases.flash import long_qkv

F32_BF16 = ("float32", "bfloat16")


def pow2_slopes(n: int) -> np.ndarray:
    """ALiBi slopes of n heads, n a power of two: head h has 2 ** (-8 (h + 1) / n)."""
    return 2.0 ** (-8.0 * (np.arange(n) + 1) / n)


# ---------------------------------------------------------------------------------------------
# Sliding windows: i + offset - left <= j <= i + offset + right, both ends included
# ---------------------------------------------------------------------------------------------


@sdpa_case("window.left_only", ALL_DTYPES)
def window_left_only(rng, dtype):
    """window=(2, None), top_left, L = 5 < S = 7: query i sees keys i - 2 .. 6 (the left side
    bounds, the right does not); row 0 sees keys 0..6. An exclusive left end (i - 1 ..) fails."""
    return call(*qkv(rng), window=(2, None))


@sdpa_case("window.right_only")
def window_right_only(rng, dtype):
    """window=(None, 1): query i sees keys 0 .. i + 1 (a causal rule shifted one key ahead)."""
    return call(*qkv(rng), window=(None, 1))


@sdpa_case("window.both.bottom_right", ALL_DTYPES)
def window_both_bottom_right(rng, dtype):
    """window=(2, 1) with bottom_right, L = 5 < S = 7: the diagonal of row i is key i + 2, so
    row i sees keys i .. i + 3 (row 4 sees 4, 5, 6: the band ends at S). A window placed on
    the top-left diagonal instead gives other keys."""
    return call(*qkv(rng), window=(2, 1), causal_alignment="bottom_right")


@sdpa_case("window.both.top_left.l7_s5")
def window_both_top_left_tall(rng, dtype):
    """window=(1, 1), top_left, L = 7 > S = 5: rows 5 and 6 see key 4 only, or nothing (row 6's
    band is 5..7, past the last key): a zero row, not NaN."""
    return call(*qkv(rng, l=7, s=5), window=(1, 1))


@sdpa_case("window.zero")
def window_zero(rng, dtype):
    """window=(0, 0): each query sees exactly its diagonal key (top_left, L = 5 < S = 7: key i),
    so the output row is that key's value row."""
    return call(*qkv(rng), window=(0, 0))


@sdpa_case("window.larger_than_s")
def window_larger_than_s(rng, dtype):
    """window=(10, 10) with S = 7: every key of every row, the same as no window at all."""
    return call(*qkv(rng), window=(10, 10))


@sdpa_case("window.causal.bottom_right", ("float32", "float16"))
def window_causal_bottom_right(rng, dtype):
    """is_causal with window=(2, 0), bottom_right: the causal rule and the window's right side
    say the same thing; row i sees keys i .. i + 2 (W + 1 = 3 keys: flash-attn's window_size
    (2, 0), ONNX's left_window_size 2). An off-by-one window sees 2 or 4."""
    return call(*qkv(rng), window=(2, 0), is_causal=True, causal_alignment="bottom_right")


@sdpa_case("window.causal_left_unbounded_right")
def window_causal_left(rng, dtype):
    """is_causal with window=(2, None): the same keys as window=(2, 0) without is_causal (the
    metamorphic tests check the two agree)."""
    return call(*qkv(rng), window=(2, None), is_causal=True)


@sdpa_case("window.with_mask")
def window_with_mask(rng, dtype):
    """window=(3, 0), bottom_right, and a random (B, 1, L, S) mask: a key counts only where both
    allow it."""
    return call(*qkv(rng), window=(3, 0), causal_alignment="bottom_right",
                mask=random_mask(rng, B, 1, L, S))


@sdpa_case("window.fully_masked_rows.l9_s5")
def window_fully_masked_rows(rng, dtype):
    """window=(1, 0), bottom_right, L = 9 > S = 5: the diagonal of row i is key i - 4, so rows
    0..3 see no key at all (zero rows, never NaN), row 4 key 0, the last rows two keys."""
    return call(*qkv(rng, l=9, s=5), window=(1, 0), causal_alignment="bottom_right")


@sdpa_case("window.gqa.h8_k2", F32_BF16)
def window_gqa(rng, dtype):
    """window=(1, 1) with GQA 8:2: the window is per position, the same for every head."""
    return call(*qkv(rng, h=8, k=2), window=(1, 1))


# ---------------------------------------------------------------------------------------------
# Packed sequences: a query attends only keys of its own segment
# ---------------------------------------------------------------------------------------------


@sdpa_case("segments.two_docs", ALL_DTYPES)
def segments_two_docs(rng, dtype):
    """Two documents packed in each row of the batch (example 0: queries [0 0 0 1 1], keys
    [0 0 0 0 1 1 1]; example 1 splits elsewhere): no query sees the other document's keys."""
    q_ids = np.array([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]])  # (B, L)
    kv_ids = np.array([[0, 0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1]])  # (B, S)
    return call(*qkv(rng), q_segment_ids=q_ids, kv_segment_ids=kv_ids)


@sdpa_case("segments.three_docs.causal", ("float32", "float16"))
def segments_three_docs_causal(rng, dtype):
    """Self-attention over a packed row of three documents (lengths 2, 3, 1), is_causal: query
    i sees the keys of its document up to itself; the first token of each document sees only
    itself. Causal positions are the packed row's."""
    ids = np.array([0, 0, 1, 1, 1, 2])  # (L,) = (S,): shared by the batch
    return call(*qkv(rng, l=6, s=6), q_segment_ids=ids, kv_segment_ids=ids, is_causal=True)


@sdpa_case("segments.no_key")
def segments_no_key(rng, dtype):
    """Query 4 belongs to segment 2, which has no key: its row is all zeros (not uniform over
    the other segments)."""
    q_ids = np.array([0, 0, 1, 1, 2])  # (L,)
    kv_ids = np.array([0, 0, 0, 1, 1, 1, 1])  # (S,)
    return call(*qkv(rng), q_segment_ids=q_ids, kv_segment_ids=kv_ids)


@sdpa_case("segments.with_window")
def segments_with_window(rng, dtype):
    """Segments, causal and window=(1, 0) together, self-attention L = S = 6: a token sees
    itself and the token before it, if that one is in its document."""
    ids = np.array([0, 0, 0, 1, 1, 1])
    return call(*qkv(rng, l=6, s=6), q_segment_ids=ids, kv_segment_ids=ids, is_causal=True,
                window=(1, 0))


@sdpa_case("segments.unsorted")
def segments_unsorted(rng, dtype):
    """Segment ids that are not sorted (1 0 2 0 1 / 0 1 2 1 0 2 1): equality is the rule, not
    ranges; a port comparing with <= (or skipping by sorted ranges) fails here."""
    q_ids = np.array([1, 0, 2, 0, 1])
    kv_ids = np.array([0, 1, 2, 1, 0, 2, 1])
    return call(*qkv(rng), q_segment_ids=q_ids, kv_segment_ids=kv_ids)


# ---------------------------------------------------------------------------------------------
# Attention sinks: one extra logit per head in the softmax's denominator, with no value
# ---------------------------------------------------------------------------------------------


@sdpa_case("sinks.basic", ALL_DTYPES)
def sinks_basic(rng, dtype):
    """A sink logit per query head (normal values): each row's weights sum to less than 1, by
    exp(sink) / (sum_j exp(s_ij) + exp(sink)). Untouched by scale: scale=0.5 here."""
    return call(*qkv(rng), sinks=normal(rng, H), scale=0.5)


@sdpa_case("sinks.with_mask_and_softcap")
def sinks_with_mask_and_softcap(rng, dtype):
    """Sinks with a mask, a -inf bias and softcap=1.5: the sink is neither capped, biased nor
    masked. A port that softcaps the sink logit (capping 3.0 to about 1.4) fails here."""
    bias = normal(rng, B, H, L, S)
    bias[..., 3] = -np.inf
    return call(*qkv(rng), mask=random_mask(rng, B, 1, L, S), bias=bias, softcap=1.5,
                sinks=np.array([3.0, -2.0, 0.5, 2.5, -0.5, 1.0]))


@sdpa_case("sinks.fully_masked_rows", ("float32", "bfloat16"))
def sinks_fully_masked_rows(rng, dtype):
    """A sink and a row whose mask allows no key: the row is all zeros (the sink takes all the
    weight but has no value), never NaN."""
    mask = random_mask(rng, B, 1, L, S)
    mask[..., 2, :] = False
    return call(*qkv(rng), mask=mask, sinks=normal(rng, H))


@sdpa_case("sinks.large", ("float32", "float16"))
def sinks_large(rng, dtype):
    """Sink logits of 40, far above the scores: the sink takes almost all the weight, and the
    row max must include it (exp(40 - max score) overflows float16 otherwise)."""
    return call(*qkv(rng), sinks=np.full(H, 40.0))


@sdpa_case("sinks.gqa.h8_k1")
def sinks_gqa(rng, dtype):
    """MQA 8:1 with a different sink per query head: the sink belongs to the query head, not to
    the key/value head."""
    return call(*qkv(rng, h=8, k=1), sinks=np.linspace(-2.0, 2.0, 8))


# ---------------------------------------------------------------------------------------------
# ALiBi: -slope[h] * |i + offset - j| added to the scores
# ---------------------------------------------------------------------------------------------


@sdpa_case("alibi.pow2.h8", ALL_DTYPES)
def alibi_pow2(rng, dtype):
    """ALiBi with H = 8 (slopes 1/2, 1/4, ..., 1/256): head 0 decays fastest. Slopes in reverse
    head order, or the sign flipped (a bonus for distance), give other weights."""
    return call(*qkv(rng, h=8, k=2), alibi_slopes=pow2_slopes(8), scale=0.7)


@sdpa_case("alibi.non_pow2.h6")
def alibi_non_pow2(rng, dtype):
    """ALiBi with H = 6: the 4 slopes of 4 heads (1/4, 1/16, 1/64, 1/256) then every other
    slope of 8 heads (1/2, 1/8), the paper's order."""
    slopes = np.concatenate([pow2_slopes(4), pow2_slopes(8)[0::2][:2]])
    return call(*qkv(rng), alibi_slopes=slopes)


@sdpa_case("alibi.bottom_right.causal", ("float32", "bfloat16"))
def alibi_bottom_right_causal(rng, dtype):
    """ALiBi with bottom_right causal, L = 5 < S = 7: the distance is to row i's diagonal key
    i + 2, so the last key of each row is free of penalty. ALiBi without the offset (|i - j|)
    gives other weights."""
    return call(*qkv(rng), alibi_slopes=pow2_slopes(8)[:6], is_causal=True,
                causal_alignment="bottom_right")


@sdpa_case("alibi.softcap")
def alibi_softcap(rng, dtype):
    """ALiBi with softcap=2 and scale=1: the cap applies to the scores before ALiBi is added,
    so the penalty of far keys is not capped."""
    return call(*qkv(rng), alibi_slopes=np.full(H, 0.75), softcap=2.0, scale=1.0)


# ---------------------------------------------------------------------------------------------
# The tiled path: blocks outside the band skipped, blocks a boundary crosses masked
# ---------------------------------------------------------------------------------------------


@flash_case("tiling.window.l113_s203", F32_BF16)
def flash_window(rng, dtype):
    """window=(20, 3), bottom_right (offset 90), blocks of 16 x 32: each query block sees two or
    three key blocks; the band's edges cross blocks partway, and every other block is skipped."""
    return call(*long_qkv(rng), window=(20, 3), causal_alignment="bottom_right", block_q=16,
                block_k=32)


@flash_case("tiling.window_causal.l113_s203")
def flash_window_causal(rng, dtype):
    """window=(7, 0) with is_causal, top_left, blocks of 16 x 8: W + 1 = 8 keys, one block wide,
    crossing two blocks for most rows."""
    return call(*long_qkv(rng), window=(7, 0), is_causal=True, block_q=16, block_k=8)


@flash_case("tiling.segments.l113_s203")
def flash_segments(rng, dtype):
    """Packed documents across block boundaries (query and key segments of lengths 30, 50, 33 /
    60, 100, 43), blocks of 16 x 32: blocks whose id ranges cannot meet are skipped."""
    q_ids = np.repeat([0, 1, 2], [30, 50, 33])  # (L = 113,)
    kv_ids = np.repeat([0, 1, 2], [60, 100, 43])  # (S = 203,)
    return call(*long_qkv(rng), q_segment_ids=q_ids, kv_segment_ids=kv_ids, block_q=16,
                block_k=32)


@flash_case("tiling.sinks_alibi.l113_s203", F32_BF16)
def flash_sinks_alibi(rng, dtype):
    """Sinks and ALiBi with bottom_right causal over many blocks (16 x 32): the sink joins the
    denominator once, after the last key block; ALiBi is computed per block."""
    return call(*long_qkv(rng, h=2), sinks=np.array([1.0, -1.0]), alibi_slopes=pow2_slopes(2),
                is_causal=True, causal_alignment="bottom_right", block_q=16,
                block_k=32)
