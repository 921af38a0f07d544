"""The allowed-position rules of step 4 and the ALiBi term of step 3: one small function each.

Each rule says, for query rows ``i`` and keys ``j`` given as index arrays that broadcast against
each other (``i`` of shape ``(L, 1)``, ``j`` of shape ``(1, S)``: the whole call; or a block's
rows and keys: the tiled path), whether query i may attend key j. The functions use only Python
operators (``<=``, ``&``, ``==``, ``abs``), so the same function serves NumPy arrays, torch
tensors and JAX arrays (traced or not) alike: the rule is written once, here, and the three
implementations call it; the float64 oracle (``conformance/oracle.py``) has its own version,
written separately, element by element.

Next to each elementwise rule is the same rule asked about a block's corners,
``*_block(i0, i1, j0, j1, ...) -> (some, every)``: whether some, and whether every, query row
``i0 <= i < i1`` may attend some (every) key ``j0 <= j < j1``. The tiled path skips a block in
which no position is allowed and masks elementwise only a block that is not wholly allowed.
``offset`` is the diagonal of ``causal_alignment`` (:func:`~attention_spec.causal_offset`: 0 for
``top_left``, ``S - L`` for ``bottom_right``); the window uses the same diagonal, with or
without ``is_causal``.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "alibi",
    "alibi_slope_values",
    "block_rules",
    "causal",
    "causal_block",
    "key_band",
    "segments",
    "segments_block",
    "window",
    "window_block",
]

Window = tuple[int | None, int | None]


def causal(i: Any, j: Any, offset: int) -> Any:
    """Query i may attend key j iff ``j <= i + offset``."""
    return j <= i + offset


def causal_block(i0: Any, i1: Any, j0: Any, j1: Any, offset: int) -> tuple[Any, Any]:
    """:func:`causal` on the block of rows ``[i0, i1)`` and keys ``[j0, j1)``: some position is
    allowed iff the first key is allowed for the last row; every one iff the last key is allowed
    for the first row."""
    return j0 <= i1 - 1 + offset, j1 - 1 <= i0 + offset


def window(i: Any, j: Any, offset: int, left_right: Window) -> Any:
    """Query i may attend key j iff ``i + offset - left <= j <= i + offset + right``, inclusive at
    both ends; a side that is None is unbounded. ``(W, 0)`` is the key on the diagonal and the W
    before it: W + 1 keys."""
    left, right = left_right
    allowed = True
    if left is not None:
        allowed = j >= i + offset - left
    if right is not None:
        allowed = allowed & (j <= i + offset + right)
    return allowed


def window_block(
    i0: Any, i1: Any, j0: Any, j1: Any, offset: int, left_right: Window
) -> tuple[Any, Any]:
    """:func:`window` on the block ``[i0, i1) x [j0, j1)``: the band ``[i + offset - left,
    i + offset + right]`` moves right with the row, so some position is allowed iff the block's
    keys meet the band of its first and last rows, every one iff they lie in every row's band."""
    left, right = left_right
    some, every = True, True
    if left is not None:
        some = j1 - 1 >= i0 + offset - left
        every = j0 >= i1 - 1 + offset - left
    if right is not None:
        some = some & (j0 <= i1 - 1 + offset + right)
        every = every & (j1 - 1 <= i0 + offset + right)
    return some, every


def segments(q_segment_ids: Any, kv_segment_ids: Any) -> Any:
    """``(..., L)`` and ``(..., S)`` segment ids -> ``(..., 1, L, S)``: query i may attend key j
    iff they belong to the same segment (packed documents). The axis of size 1 is the heads'."""
    return q_segment_ids[..., None, :, None] == kv_segment_ids[..., None, None, :]


def segments_block(q_low: Any, q_high: Any, kv_low: Any, kv_high: Any) -> tuple[Any, Any]:
    """:func:`segments` on a block from the range of its ids: the rows' ids lie in
    ``[q_low, q_high]``, the keys' in ``[kv_low, kv_high]``. No position can be allowed when the
    two ranges do not meet (sorted or not, this is exact enough to skip safely); every position
    is when both hold one and the same id."""
    some = (q_low <= kv_high) & (kv_low <= q_high)
    every = (q_low == q_high) & (kv_low == kv_high) & (q_low == kv_low)
    return some, every


def key_band(
    is_causal: bool, left_right: Window | None, offset: int, i0: int, i1: int, S: int
) -> tuple[int, int]:
    """The keys ``[lo, hi)`` that the causal and window bands leave to rows ``[i0, i1)``: every
    key outside is masked for every row (:func:`causal_block` and :func:`window_block` asked
    about the rows' whole band at once), so a tiled loop visits only the key blocks within."""
    lo, hi = 0, S
    if is_causal:
        hi = min(hi, i1 + offset)  # key i1 - 1 + offset is the last row's last
    if left_right is not None:
        left, right = left_right
        if left is not None:
            lo = max(lo, i0 + offset - left)  # the first row's first key
        if right is not None:
            hi = min(hi, i1 + offset + right)
    return max(0, lo), max(0, min(hi, S))


def block_rules(
    is_causal: bool, left_right: Window | None, offset: int, i0, i1, j0, j1, q_ids, kv_ids
) -> tuple[Any, Any]:
    """``(some, every)`` of causal, window and segments together on the block of rows
    ``[i0, i1)`` and keys ``[j0, j1)`` (``q_ids``, ``kv_ids``: the block's segment ids, or
    None): the block is skipped when no position is allowed, and masked elementwise only when
    not every one is. Python bools, or arrays (JAX, traced) where the arguments are."""
    some, every = True, True
    if is_causal:
        rule_some, rule_every = causal_block(i0, i1, j0, j1, offset)
        some, every = some & rule_some, every & rule_every
    if left_right is not None:
        rule_some, rule_every = window_block(i0, i1, j0, j1, offset, left_right)
        some, every = some & rule_some, every & rule_every
    if q_ids is not None:
        rule_some, rule_every = segments_block(q_ids.min(), q_ids.max(), kv_ids.min(), kv_ids.max())
        some, every = some & rule_some, every & rule_every
    return some, every


def alibi(slopes: Any, i: Any, j: Any, offset: int) -> Any:
    """The ALiBi term of step 3, ``-slope[h] * |i + offset - j|``: ``slopes`` of shape
    ``(H, 1, 1)`` against ``i (L, 1)`` and ``j (1, S)`` gives ``(H, L, S)`` (or one block's)."""
    return -slopes * abs(i + offset - j)


def alibi_slope_values(n_heads: int) -> list[float]:
    """The ALiBi paper's slopes for ``n_heads`` heads, as Python floats.

    For H a power of two, head h (from 0) has ``2 ** (-8 (h + 1) / H)``. Otherwise the slopes of
    the largest power of two below H come first, followed by every other slope of twice that
    power (its odd-numbered ones: 1, 3, 5, ... counting from 0), until there are H.
    """
    if n_heads <= 0:
        return []
    power = 2 ** math.floor(math.log2(n_heads))

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    slopes = geometric(power)
    if power < n_heads:
        slopes += geometric(2 * power)[0::2][: n_heads - power]
    return slopes
