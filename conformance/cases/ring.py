"""Sharded-attention cases: ring and head-parallel attention, held to the unsharded goldens.

``@ring_case`` functions build the float64 inputs of one ``scaled_dot_product_attention`` call
from their own seeded generator, long enough for several shards (L, S in 32 .. 96), and say in
their docstring what they pin down and which mistake of a sharded port they catch. Sharding
changes nothing the contract says, so the golden is the float64 oracle's for the same call and
the bound is the same rule as every other fixture's; only the output is stored (the sharded
functions return no weights). Ids ``ring.<name>.<dtype>``; each fixture also records the shard
counts it was written for (``shards``: 2n divides its L and S for each, so both layouts run).

The runner (``conformance/runner/``) runs these fixtures, and the ``sdpa`` value fixtures, through
a port's sharded functions with n shards (``--shards``, default 2 and 4) wherever n fits:

- ``ring``: ``ring_attention(q, k, v, n_shards=n, layout="contiguous", **keywords)``, when n
  divides L and S;
- ``ring_zigzag``: ``ring_attention(..., layout="zigzag")``, when 2n divides L and S;
- ``head_parallel``: ``head_parallel_attention(q, k, v, n_shards=n, **keywords)``, when n
  divides K;
- ``head_parallel_gqa`` (the ``module`` fixtures): ``head_parallel_gqa(module, x, context,
  n_shards=n, **keywords)`` with the module loaded by ``from_canonical``, when n divides its K.

``@ring_error_case`` functions are the sharded rules of the error taxonomy (``ring.error.*``), each
with its own ``n_shards`` and ``layout`` in the keywords. Default sizes: B=1, H=4, K=2, D=5, E=3
(pairwise distinct where it matters; value head n sits near 2n, so a head mapped wrongly shows).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from conformance.cases.base import F32, Call, call, case, z

B, H, K, D, E = 1, 4, 2, 5, 3


def ring_case(name: str, dtypes: tuple[str, ...] = F32, *, shards: tuple[int, ...]):
    """Register ``fn(rng, dtype) -> Call`` as the case ``ring.<name>.<dtype>``, written for the
    shard counts ``shards`` (the fixture records them; the runner takes any n that fits)."""

    def register(fn: Callable[[np.random.Generator, str], Call]):
        fn.shards = tuple(shards)
        return case("ring", name, dtypes)(fn)

    return register


def ring_error_case(name: str, error_class: str, code: str, functions: tuple[str, ...]):
    """Register ``fn() -> Call`` (of :class:`~conformance.cases.base.Zeros`, with ``n_shards``
    and ``layout`` in its keywords) as ``ring.error.<name>.float32``, run against the sharded
    ``functions``."""
    return case("ring", name, F32, functions=functions, error=(error_class, code))


def _qkv(rng, *, batch=(B,), h=H, k=K, l, s, d=D, e=E):
    """query (*batch, h, l, d), key (*batch, k, s, d), value (*batch, k, s, e); key/value head
    n shifted (values by 2n), so that a wrong head mapping gives a wrong number."""
    q = rng.standard_normal((*batch, h, l, d))
    kk = rng.standard_normal((*batch, k, s, d)) + 0.5 * np.arange(k).reshape(k, 1, 1)
    v = rng.standard_normal((*batch, k, s, e)) + 2.0 * np.arange(k).reshape(k, 1, 1)
    return q, kk, v


# ---------------------------------------------------------------------------------------------
# Causal, both alignments, L = S and L != S
# ---------------------------------------------------------------------------------------------


@ring_case("causal.top_left.l64_s64", ("float64", "float32", "bfloat16"), shards=(2, 4, 8))
def causal_top_left_l64_s64(rng, dtype):
    """L = S = 64, causal: with contiguous shards device r computes r + 1 of the n steps (its own
    shard on the diagonal, then the earlier ones) and skips the rest; zigzag computes two of its
    four chunk pairs at every step. Catches a ring that skips its own shard, a merge without the
    lse correction, swapped zigzag chunks (the causal rule at the wrong places)."""
    return call(*_qkv(rng, l=64, s=64), is_causal=True)


@ring_case("causal.bottom_right.l64_s96", ("float64",), shards=(2, 4, 8))
def causal_bottom_right_l64_s96(rng, dtype):
    """L = 64 < S = 96, bottom_right (a KV cache): query i sees keys 0 .. i + 32, so shards
    past a query shard's own number are partly visible. Catches a causal skip decided by shard
    numbers (key shard after query shard: skip), which is only right for L = S."""
    return call(*_qkv(rng, l=64, s=96), is_causal=True, causal_alignment="bottom_right")


@ring_case("causal.top_left.l96_s64", ("float64",), shards=(2, 4, 8))
def causal_top_left_l96_s64(rng, dtype):
    """L = 96 > S = 64, top_left: rows 64 .. 95 see every key; query and key shards are cut at
    different places, so block positions must be counted in rows and keys separately."""
    return call(*_qkv(rng, l=96, s=64), is_causal=True)


@ring_case("causal.bottom_right.l96_s64", ("float64",), shards=(2, 4, 8))
def causal_bottom_right_l96_s64(rng, dtype):
    """L = 96 > S = 64, bottom_right: the first 32 rows see no key at all, so whole query
    chunks merge nothing but lse = -inf blocks and must come out zero (not NaN, not uniform)."""
    return call(*_qkv(rng, l=96, s=64), is_causal=True, causal_alignment="bottom_right")


# ---------------------------------------------------------------------------------------------
# Grouped-query heads, no causal mask
# ---------------------------------------------------------------------------------------------


@ring_case("full.gqa.h6_k3.l96_s96", ("float64",), shards=(2, 3, 4))
def full_gqa_h6_k3(rng, dtype):
    """No mask, GQA 6:3 (G = 2): every block of every step is computed and merged. Head-parallel
    with 3 shards gives each device one key/value head and query heads 2r, 2r + 1; tiling
    (h % K) would give it heads r and r + 3."""
    return call(*_qkv(rng, h=6, k=3, l=96, s=96))


# ---------------------------------------------------------------------------------------------
# Masks and fully masked rows, blocks and shards
# ---------------------------------------------------------------------------------------------


@ring_case("mask.random_causal.l64_s64", shards=(2, 4))
def mask_random_causal(rng, dtype):
    """A (B, 1, L, S) boolean mask AND the causal rule, B = 2: each device holds its query
    shard's rows of the mask, and each block takes the columns of the key chunk it holds."""
    mask = rng.random((2, 1, 64, 64)) < 0.7
    mask[..., 0] = True
    return call(*_qkv(rng, batch=(2,), l=64, s=64), mask=mask, is_causal=True)


@ring_case("mask.padding.l64_s96", ("float64",), shards=(2, 4, 8))
def mask_padding(rng, dtype):
    """A (B, 1, 1, S) padding mask, B = 2: example 0 keeps all 96 keys, example 1 the first 41,
    so for example 1 the last key shards are masked whole (blocks with lse = -inf everywhere)."""
    mask = np.arange(96)[None, :] < np.array([96, 41])[:, None]  # (B, S)
    return call(*_qkv(rng, batch=(2,), l=64, s=96), mask=mask[:, None, None, :])


@ring_case("fully_masked.rows.l64_s64", ("float64",), shards=(4, 8))
def fully_masked_rows(rng, dtype):
    """Rows 0 .. 7 and row 50 have an all-False mask row and row 30 a bias of -inf at every key,
    with the causal rule on top: zero output rows (and zero gradient). Rows 0 .. 7 are a whole
    chunk for 8 shards (zigzag: two chunks of 4)."""
    mask = rng.random((64, 64)) < 0.8
    mask[:, 0] = True
    mask[0:8, :] = False
    mask[50, :] = False
    bias = 0.5 * rng.standard_normal((64, 64))
    bias[30, :] = -math.inf
    return call(*_qkv(rng, l=64, s=64), mask=mask, bias=bias, is_causal=True)


@ring_case("fully_masked.key_shard.l64_s64", ("float64",), shards=(2, 4))
def fully_masked_key_shard(rng, dtype):
    """Keys 16 .. 31 masked for every row (a (S,) mask) with causal top_left: with 4 contiguous
    shards all of key shard 1 is out; rows 16 .. 31 see only keys 0 .. 15, held by another
    device, so their result comes entirely from merges at later steps."""
    mask = np.ones(64, dtype=bool)
    mask[16:32] = False
    return call(*_qkv(rng, l=64, s=64), mask=mask, is_causal=True)


@ring_case("garbage.padding.l32_s64", ("float32", "bfloat16"), shards=(2, 4))
def garbage_padding(rng, dtype):
    """A (B, 1, 1, S) padding mask, B = 2: example 1 keeps its first 20 of 64 keys, and its
    padded keys and values hold NaN and inf. No query attends them, so they never reach the
    output: each block zeroes the key and value rows no row of it attends (the block holding
    keys 16 .. 31, or 0 .. 31, has both kinds). A block that multiplies zero weights by NaN
    values (0 * NaN = NaN) fails here."""
    q, k, v = _qkv(rng, batch=(2,), l=32, s=64)
    k[1, :, 20:, :] = math.nan
    v[1, :, 20:, :] = math.nan
    v[1, :, 30, 0] = math.inf
    mask = np.arange(64)[None, :] < np.array([64, 20])[:, None]  # (B, S)
    return call(q, k, v, mask=mask[:, None, None, :])


# ---------------------------------------------------------------------------------------------
# Bias, softcap, scale; large logits; batch dims
# ---------------------------------------------------------------------------------------------


@ring_case("bias.softcap.l32_s32", ("float64", "float32"), shards=(2, 4, 8))
def bias_softcap(rng, dtype):
    """An (H, L, S) bias with -inf at about 30% of the positions (never key 0), softcap=2,
    scale=1, causal: the cap comes before the bias, in every block, on its own scores; the
    head-parallel split cuts the bias's head axis with the query heads."""
    bias = rng.standard_normal((H, 32, 32))
    bias[rng.random(bias.shape) < 0.3] = -math.inf
    bias[..., 0] = 0.0
    return call(*_qkv(rng, l=32, s=32), bias=bias, scale=1.0, softcap=2.0, is_causal=True)


@ring_case("large_logits.shifted.l64_s64", ("float32", "float16"), shards=(2, 4))
def large_logits_shifted(rng, dtype):
    """Every score shifted by +200 (a constant (1, S) bias): each block's lse is about 200, and
    a merge that takes exp(lse) instead of exp(lse - max) overflows even float32."""
    return call(*_qkv(rng, l=64, s=64), bias=np.full((1, 64), 200.0))


@ring_case("batch.broadcast.l32_s64", ("float64",), shards=(2, 4))
def batch_broadcast(rng, dtype):
    """Batch dims that broadcast: query (2, 1, ...), key (3, ...), value (1, 3, ...): the key and
    value shards that travel keep their own batch dims; the output has batch (2, 3)."""
    q = rng.standard_normal((2, 1, 2, 32, 3))
    k = rng.standard_normal((3, 1, 64, 3))
    v = rng.standard_normal((1, 3, 1, 64, 4))
    return call(q, k, v, is_causal=True, causal_alignment="bottom_right")


# ---------------------------------------------------------------------------------------------
# Contract v2 across shards: windows, packed segments, sinks, ALiBi
# ---------------------------------------------------------------------------------------------


@ring_case("window.causal.l32_s32", ("float64", "float32"), shards=(2, 4))
def window_causal(rng, dtype):
    """window=(5, 0) with causal, L = S = 32: each row sees itself and the 5 keys before it, so
    with 4 contiguous shards (8 rows each) a device computes its own diagonal block and the
    tail of the previous shard, and skips the rest; zigzag's chunks of 4 rows reach back two
    chunks. The window's left edge crosses every shard boundary."""
    return call(*_qkv(rng, l=32, s=32), window=(5, 0), is_causal=True)


@ring_case("window.both.bottom_right.l32_s48", ("float64",), shards=(2, 4))
def window_both_bottom_right(rng, dtype):
    """window=(3, 2), no causal, L = 32 < S = 48, bottom_right: the band's diagonal is
    i + 16, so every query shard's keys lie in a later key shard, and both sides of the band
    cross shard boundaries. Catches a band skip decided from a chunk's first row alone (its
    later rows lose the keys of the next key chunk)."""
    return call(*_qkv(rng, l=32, s=48), window=(3, 2), causal_alignment="bottom_right")


@ring_case("segments.packed.causal.l32_s32", ("float64", "float32"), shards=(2, 4))
def segments_packed(rng, dtype):
    """Three packed documents of 11, 13 and 8 tokens (boundaries inside shards, not on them),
    causal, B = 2 (example 1: one document): a query attends earlier keys of its own document
    only. Each key chunk's ids must travel with (or be read at) that chunk's places; the ids of
    the device's own query chunk are the wrong ones."""
    ids = np.repeat([0, 1, 2], [11, 13, 8])
    ids = np.stack([ids, np.zeros(32, dtype=int)])  # (B, L)
    return call(*_qkv(rng, batch=(2,), l=32, s=32), q_segment_ids=ids, kv_segment_ids=ids,
                is_causal=True)


@ring_case("sinks.padding.l32_s32", ("float64", "float32"), shards=(2, 4))
def sinks_padding(rng, dtype):
    """A sink per head with a (B, 1, L, S) mask (B = 2; example 1 keeps keys 0 .. 9, and its
    rows 0 .. 3 see none) and causal: the sink joins each row's denominator once, after the
    last merge; a row with no key stays zero. Catches a sink added in every block (counted once
    per step) and a sink dropped."""
    mask = np.ones((2, 1, 32, 32), dtype=bool)
    mask[1, :, :, 10:] = False
    mask[1, :, :4, :] = False
    return call(*_qkv(rng, batch=(2,), l=32, s=32), mask=mask, is_causal=True,
                sinks=np.array([0.5, -1.0, 2.0, 0.0]))


@ring_case("alibi.causal.bottom_right.l32_s48", ("float64", "float32"), shards=(2, 4))
def alibi_bottom_right(rng, dtype):
    """ALiBi (slopes of 4 heads, the paper's rule) with causal bottom_right, L = 32 < S = 48:
    the bias -slope[h] * |i + 16 - j| is computed per block at the block's places in the whole
    sequence. Catches ALiBi at positions within the shard (every block would see distances as
    if it were on the diagonal)."""
    slopes = 2.0 ** (-8.0 * np.arange(1, 5) / 4)
    return call(*_qkv(rng, l=32, s=48), alibi_slopes=slopes, is_causal=True,
                causal_alignment="bottom_right")


# ---------------------------------------------------------------------------------------------
# All-to-all sequence parallelism (Ulysses, USP): the head bookkeeping (contract v3)
# ---------------------------------------------------------------------------------------------


@ring_case("ulysses.gqa.h8_k1.causal.l32_s32", ("float64", "float32"), shards=(2, 4, 8))
def ulysses_gqa_8_1(rng, dtype):
    """GQA 8:1 (one key/value head, MQA), causal: Ulysses gives each of n devices H/n query
    heads and the one key/value head, replicated to all of them (n % K == 0). Catches a port
    that splits the key/value heads like the queries ([1, 0, 0, 0] at n = 4: DeepSpeed's
    [4, 4, 4, 0]) or pads them with zero heads."""
    return call(*_qkv(rng, h=8, k=1, l=32, s=32), is_causal=True)


@ring_case("ulysses.gqa.h8_k2.head_mask.sinks.alibi.l32_s48", ("float64", "float32"),
           shards=(2, 4, 8))
def ulysses_gqa_8_2(rng, dtype):
    """GQA 8:2, a mask with a head axis of 8, a sink and an ALiBi slope per head, causal
    bottom_right with L = 32 < S = 48: at n = 4 and 8 the two key/value heads each go to the
    n / 2 devices of their group, and the mask, sinks and slopes must go with the query heads
    (every device taking the first H/n of them is wrong). Key/value head n's values sit near
    2n, so a query head given the wrong key/value head shows."""
    mask = rng.random((1, 8, 32, 48)) > 0.25
    mask[0, 5, 7] = False  # a fully masked row on head 5
    return call(*_qkv(rng, h=8, k=2, l=32, s=48), mask=mask, is_causal=True,
                causal_alignment="bottom_right", sinks=rng.standard_normal(8),
                alibi_slopes=2.0 ** (-np.arange(1, 9)))


@ring_case("ulysses.gqa.h12_k4.window.segments.l48_s48", ("float64",), shards=(2, 4))
def ulysses_gqa_12_4(rng, dtype):
    """GQA 12:4 (groups of 3 query heads), a window (5, 2) and three packed documents whose
    boundaries fall inside the shards: the key/value heads split (K % n == 0 at n = 2, 4), so
    each device's query heads must be exactly those reading its key/value heads; the window and
    the documents are checked across the shard boundaries."""
    ids = np.repeat([0, 1, 2], [13, 21, 14])[None]  # (1, 48)
    return call(*_qkv(rng, h=12, k=4, l=48, s=48), window=(5, 2), q_segment_ids=ids,
                kv_segment_ids=ids)


# ---------------------------------------------------------------------------------------------
# Errors: the sharded rules of the taxonomy
# ---------------------------------------------------------------------------------------------


@ring_error_case("length_not_divisible", "DimensionMismatchError", "length_not_divisible",
                 ("ring",))
def err_length_not_divisible():
    """4 contiguous shards cannot cut L = S = 6: 4 must divide both."""
    return call(z(B, H, 6, D), z(B, K, 6, D), z(B, K, 6, E), n_shards=4, layout="contiguous")


@ring_error_case("length_not_divisible_zigzag", "DimensionMismatchError", "length_not_divisible",
                 ("ring_zigzag",))
def err_length_not_divisible_zigzag():
    """Zigzag with 4 shards cuts L and S into 2 * 4 = 8 chunks: L = 8 fits, S = 12 does not
    (4 alone would divide both)."""
    return call(z(B, H, 8, D), z(B, K, 12, D), z(B, K, 12, E), n_shards=4, layout="zigzag")


@ring_error_case("kv_heads_not_divisible", "DimensionMismatchError", "kv_heads_not_divisible",
                 ("head_parallel",))
def err_kv_heads_not_divisible():
    """Head-parallel over 4 devices with K = 2 key/value heads (H = 6): 4 must divide K. (4
    divides neither H nor K here; with contiguous groups it is K that is split.)"""
    return call(z(B, 6, 8, D), z(B, 2, 8, D), z(B, 2, 8, E), n_shards=4)


@ring_error_case("unknown_layout", "ConfigError", "unknown_layout", ("ring",))
def err_unknown_layout():
    """layout="striped" is neither "contiguous" nor "zigzag"."""
    return call(z(B, H, 8, D), z(B, K, 8, D), z(B, K, 8, E), n_shards=2, layout="striped")


@ring_error_case("zero_shards", "ConfigError", "non_positive_size", ("ring", "head_parallel"))
def err_zero_shards():
    """n_shards=0: a ring or a split needs at least one device."""
    return call(z(B, H, 8, D), z(B, K, 8, D), z(B, K, 8, E), n_shards=0)


# ---------------------------------------------------------------------------------------------
# Errors of all-to-all sequence parallelism (Ulysses; contract v3)
# ---------------------------------------------------------------------------------------------


@ring_error_case("ulysses_heads", "DimensionMismatchError", "ulysses_heads", ("ulysses",))
def err_ulysses_heads():
    """Ulysses over 4 devices with H = 6 query heads (K = 2): after the all-to-all each device
    holds H/4 heads, so 4 must divide H (it divides L and S, and 4 % K == 0)."""
    return call(z(B, 6, 8, D), z(B, 2, 8, D), z(B, 2, 8, E), n_shards=4)


@ring_error_case("ulysses_length", "DimensionMismatchError", "ulysses_length", ("ulysses",))
def err_ulysses_length():
    """Ulysses over 4 devices with S = 6: each device starts with a contiguous quarter of the
    key positions, so 4 must divide S (it divides L = 8 and H)."""
    return call(z(B, 4, 8, D), z(B, 2, 6, D), z(B, 2, 6, E), n_shards=4)


@ring_error_case("ulysses_kv_heads", "DimensionMismatchError", "ulysses_kv_heads", ("ulysses",))
def err_ulysses_kv_heads():
    """Ulysses over 4 devices with H = 12, K = 6: 4 divides H, but the 6 key/value heads can be
    neither split (6 % 4) nor replicated whole to groups of devices (4 % 6): the [2, 2, 2, 0]
    split of DeepSpeed's hang."""
    return call(z(B, 12, 8, D), z(B, 6, 8, D), z(B, 6, 8, E), n_shards=4)


@ring_error_case("usp_shape", "DimensionMismatchError", "usp_shape", ("usp",))
def err_usp_shape():
    """USP with u = 4 Ulysses members and r = 2 ring groups over H = 6 query heads: u must
    divide H (u * r = 8 divides L and S)."""
    return call(z(B, 6, 16, D), z(B, 2, 16, D), z(B, 2, 16, E), ulysses_shards=4,
                ring_shards=2, layout="contiguous")


@ring_error_case("usp_without_group_sizes", "ConfigError", "non_positive_size", ("usp",))
def err_usp_without_group_sizes():
    """A hybrid given its ring size but not its Ulysses size: an error, never a run without
    context parallelism (Megatron-Bridge PR 2665 dropped the sizes of "a2a+p2p" silently)."""
    return call(z(B, H, 16, D), z(B, K, 16, D), z(B, K, 16, E), ring_shards=2)
