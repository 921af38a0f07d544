"""Tiled-attention cases: blocks that do not divide the sequence, blocks larger than it, blocks
of one, fully masked blocks.

``@flash_case`` functions are attention cases for ``flash_attention`` alone, with the block sizes
in their keywords (``block_q``, ``block_k``; the plain functions take no block sizes). Ids
``flash.<name>.<dtype>``; no weights golden.
"""

from __future__ import annotations

import numpy as np

from conformance.cases.base import B, H, L, S, call, flash_case, normal, qkv, random_mask

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
                block_q=16, block_k=32)


@flash_case("tiling.causal_bottom_right.l203_s113")
def flash_causal_bottom_right_tall(rng, dtype):
    """bottom_right causal with L > S: the first 90 rows see no key (zeros, never NaN), so whole
    query blocks are fully masked, and the block holding row 90 is masked but for one key."""
    return call(*long_qkv(rng, l=LONG_S, s=LONG_L), is_causal=True,
                causal_alignment="bottom_right", block_q=16, block_k=32)


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
                is_causal=True, causal_alignment="bottom_right", block_q=1, block_k=1)


@flash_case("tiling.garbage_padding.l17_s203", ("float32", "bfloat16"))
def flash_garbage_padding(rng, dtype):
    """Left padding as above, with the 40 padded keys and values holding NaN and inf, and a
    padded block boundary inside a key block (keys 32..39 share the block with allowed keys 40..63):
    the tiled path must mask those keys and zero their value rows, not multiply by them."""
    q, k, v = long_qkv(rng, batch=(2,), l=17)
    k[1, :, :40, :] = np.nan
    v[1, :, :40, :] = np.inf
    mask = np.ones((2, 1, 1, LONG_S), dtype=bool)
    mask[1, ..., :40] = False
    return call(q, k, v, mask=mask, block_q=16, block_k=32)
