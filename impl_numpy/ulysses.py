"""All-to-all sequence parallelism in NumPy: Ulysses and USP, simulated in one process.

This file is the specification of the two all-to-all forms. The devices are Python lists indexed
by the device's rank, and each all-to-all is one explicit list operation (:func:`_all_to_all`),
so a reader sees at every step which device holds which heads and positions.
``impl_jax/ulysses.py`` (``shard_map``, ``lax.all_to_all``) and ``impl_torch/ulysses.py``
(``torch.distributed``, ``all_to_all_single``) do the same steps, with the same names and step
numbers, on real devices. The ring that USP runs across its groups is ``impl_numpy/sharded.py``'s.

**Ulysses** (all-to-all sequence parallelism, DeepSpeed-Ulysses). Device r starts with a
contiguous 1/n of the positions of every head; an all-to-all (one list operation:
:func:`_all_to_all`) gives it every position of the query heads ``r*H/n .. (r+1)*H/n - 1`` and
of the key/value heads they read (split when ``K % n == 0``; when ``n % K == 0`` each key/value
head goes to the n / K devices of its group, never torn apart); it runs the unsharded contract
on them, and a second all-to-all gives every device its positions back, every head.

**USP** (unified sequence parallelism): Ulysses inside each of r ring groups of u devices, and
the ring (``impl_numpy.sharded.ring_attention``) across the groups, for each member's heads.

Both equal ``impl_numpy.functional.scaled_dot_product_attention`` on every input they accept
(tests/test_ulysses.py; the conformance suite's ``ulysses.*`` and ``usp.*`` runs).

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``), H query
heads, K key/value heads, G = H // K, L query length, S key/value length, D query/key head dim,
E value head dim; n = ``n_shards``, Lc = L / n and Sc = S / n the rows and keys a device starts
with; u = ``ulysses_shards`` and r = ``ring_shards`` (USP), Lm and Sm a device's rows and keys.
"""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
import numpy as np

from attention_spec import check_attention
from attention_spec.sharded import (
    RingLayout,
    RingStep,
    UlyssesExchange,
    UspPlan,
    check_shard_config,
    check_ulysses,
    check_usp,
    check_usp_config,
)
from impl_numpy.flash import _block
from impl_numpy.functional import (
    _converted,
    scaled_dot_product_attention,
)
from impl_numpy.sharded import ring_attention

__all__ = [
    "ulysses_attention",
    "usp_attention",
]


def _all_to_all(pieces: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """The all-to-all: ``pieces[src][dst]`` is what device src sends device dst; returns
    ``received[dst][src]``, what device dst got from each device, in source order."""
    n = len(pieces)
    return [[pieces[src][dst] for src in range(n)] for dst in range(n)]


def _exchange(name, piece, n, axis, stats, rank=None):
    """One all-to-all of Ulysses: device src sends ``piece(src, dst)`` to every device dst,
    and each device joins what it received along ``axis`` in source order. Records each
    device's bytes sent to the others (its own piece stays) in ``stats``, under its number in
    the exchange, or ``rank(src)`` (USP: its number among all the devices)."""
    pieces = [[piece(src, dst) for dst in range(n)] for src in range(n)]
    if stats is not None:
        for src in range(n):
            sent = sum(pieces[src][dst].nbytes for dst in range(n) if dst != src)
            stats.append(UlyssesExchange(name, src if rank is None else rank(src), sent))
    return [np.concatenate(got, axis=axis) for got in _all_to_all(pieces)]


def ulysses_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    n_shards: int,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    stats: list[UlyssesExchange] | None = None,
) -> np.ndarray:
    """``scaled_dot_product_attention`` on ``n_shards`` simulated devices by all-to-all
    sequence parallelism (Ulysses), shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        n_shards: n, which must divide H, L and S; K % n == 0 (key/value heads split) or
            n % K == 0 (each key/value head replicated to the n / K devices of its group).
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in
            :func:`impl_numpy.functional.attention_weights`; a head axis of size H (of mask
            or bias), sinks and ALiBi slopes ``(H,)`` are split with the query heads; segment
            ids, and masks and biases without a head axis (or with one of size 1), go whole to
            every device.
        stats: a list to append one :class:`~attention_spec.sharded.UlyssesExchange` per
            device and all-to-all to (the bytes it sent), or None.

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``;
    DimensionMismatchError ``ulysses_heads``, ``ulysses_length``, ``ulysses_kv_heads``.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    check_shard_config(n_shards)
    call = check_attention(query, key, value, **kw)
    plan = check_ulysses(call, n_shards)
    n, heads, kv_heads, Lc, Sc = plan.n, plan.heads, plan.kv_heads, plan.Lc, plan.Sc
    if call.L == 0 or call.S == 0:  # no rows, or no keys (every row fully masked)
        return np.zeros((*call.batch, call.H, call.L, call.E), query.dtype)

    # U1. split: device r holds a contiguous 1/n of the positions, every head: query rows
    #     r*Lc .. (r+1)*Lc - 1, key and value positions r*Sc .. (r+1)*Sc - 1.
    queries = [query[..., r * Lc : (r + 1) * Lc, :] for r in range(n)]  # (..., H, Lc, D)
    keys = [key[..., r * Sc : (r + 1) * Sc, :] for r in range(n)]  # (..., K, Sc, D)
    values = [value[..., r * Sc : (r + 1) * Sc, :] for r in range(n)]  # (..., K, Sc, E)

    # U2. all-to-all, positions to heads: device r sends device d its positions of d's query
    #     heads and of the key/value heads they read; device d joins what it gets along the
    #     positions, in source order: every position of its heads.
    q_heads = _exchange("query", lambda r, d: _block(queries[r], -3, *heads[d]), n, -2, stats)
    k_heads = _exchange("key", lambda r, d: _block(keys[r], -3, *kv_heads[d]), n, -2, stats)
    v_heads = _exchange("value", lambda r, d: _block(values[r], -3, *kv_heads[d]), n, -2, stats)
    # device d: q (..., H/n, L, D), k (..., K/n or 1, S, D), v (..., K/n or 1, S, E)

    # U3. attend: the unsharded contract on the device's heads, every position (mask, bias,
    #     sinks and ALiBi slopes: its query heads; segment ids and head-less masks: whole).
    outs = []
    for d in range(n):
        on_heads = kw | {
            "mask": _block(kw["mask"], -3, *heads[d]),
            "bias": _block(kw["bias"], -3, *heads[d]),
            "sinks": _block(kw["sinks"], -1, *heads[d]),
            "alibi_slopes": _block(kw["alibi_slopes"], -1, *heads[d]),
        }  # the device's heads of mask, bias, sinks and slopes; every other keyword whole
        outs.append(scaled_dot_product_attention(q_heads[d], k_heads[d], v_heads[d], **on_heads))

    # U4. all-to-all, heads to positions: device d sends device r its heads at r's rows;
    #     device r joins them along the heads, in source order; the rows, in order, are the
    #     output.
    mine = _exchange("output", lambda d, r: outs[d][..., r * Lc : (r + 1) * Lc, :], n, -3, stats)
    return np.concatenate(mine, axis=-2)  # (..., H, L, E); device r held rows r*Lc ..


def _in_group(name, held, cut, group, axis, stats):
    """One all-to-all among the u devices ``group`` of a USP ring group (:func:`_exchange`):
    member a holds ``held[a]`` and sends member d ``cut(held[a], d)``; stats under the devices'
    numbers among all of them."""
    return _exchange(name, lambda a, d: cut(held[a], d), len(group), axis, stats,
                     group.__getitem__)


def _ring_of(plan: UspPlan, j: int) -> list[tuple[int, int]]:
    """The ring of member j: the devices (i, j) of every ring group i, one per ring shard (the
    ring runs across the groups; inside a group the members hold different heads)."""
    return [(i, j) for i in range(plan.r)]


def _shard_order(ring: RingLayout, size: int) -> np.ndarray:
    """The positions of the sequence in ring shard order: shard 0's chunks side by side, then
    shard 1's, ..., chunks of ``size`` positions (``ring.Lc`` for rows, ``ring.Sc`` for keys)."""
    return np.concatenate([np.arange(a * size, (a + 1) * size) for s in ring.chunks for a in s])


def usp_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    ulysses_shards: int | None = None,
    ring_shards: int | None = None,
    layout: str = "contiguous",
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    stats: list[UlyssesExchange | RingStep] | None = None,
) -> np.ndarray:
    """``scaled_dot_product_attention`` on ``u * r`` simulated devices by USP, Ulysses inside
    each of r ring groups of u devices, shape ``(..., H, L, E)``.

    Device ``i * u + j`` is member j of ring group i. The sequence is cut into the ring's
    shards (``layout`` as in :func:`ring_attention`); ring group i holds shard i and its
    members a contiguous 1/u of it each. Inside a group Ulysses turns positions into heads
    (member j: every position of the group, query heads ``j*H/u ..``); the r devices with the
    same j then run the ring for those heads, across the groups; a second all-to-all inside
    each group gives every device its positions back.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        ulysses_shards: u, the devices of a Ulysses group; u must divide H, and K % u == 0 or
            u % K == 0. Required: None is an error (ConfigError), never "no hybrid".
        ring_shards: r, the ring groups. Required, as u. ``u * r`` (contiguous) or ``2 u r``
            (zigzag) must divide L and S.
        layout: ``"contiguous"`` or ``"zigzag"``: the ring's shards, as in
            :func:`ring_attention`.
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in :func:`ulysses_attention` (a head axis
            of size H, sinks and slopes split with the query heads over a group's members) and
            :func:`ring_attention` (held by rows across the groups).
        stats: a list to append to, or None: one
            :class:`~attention_spec.sharded.UlyssesExchange` per device and all-to-all and one
            :class:`~attention_spec.sharded.RingStep` per device and ring step, each under the
            device's number ``i * u + j``.

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``
    (a group size missing or < 1), ``unknown_layout``; DimensionMismatchError ``usp_shape``.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    check_usp_config(ulysses_shards, ring_shards, layout)
    call = check_attention(query, key, value, **kw)
    plan = check_usp(call, ulysses_shards, ring_shards, layout)
    u, r, ring, heads, kv_heads = (
        plan.u,
        plan.r,
        plan.ring,
        plan.ulysses.heads,
        plan.ulysses.kv_heads,
    )
    Lm, Sm = plan.ulysses.Lc, plan.ulysses.Sc  # the rows and keys each device starts with
    if call.L == 0 or call.S == 0:  # no rows, or no keys (every row fully masked)
        return np.zeros((*call.batch, call.H, call.L, call.E), query.dtype)

    # S1. split: ring group i holds ring shard i (its chunks side by side, as ring_attention's
    #     R1 cuts them) and its member j the contiguous j-th 1/u of it: device g = i*u + j holds
    #     rows g*Lm .. (g+1)*Lm - 1 and keys g*Sm .. of the sequence in shard order, every head.
    rows, keys = _shard_order(ring, ring.Lc), _shard_order(ring, ring.Sc)
    q_sh, k_sh, v_sh = query[..., rows, :], key[..., keys, :], value[..., keys, :]
    queries = [q_sh[..., g * Lm : (g + 1) * Lm, :] for g in range(u * r)]  # (..., H, Lm, D)
    keys_held = [k_sh[..., g * Sm : (g + 1) * Sm, :] for g in range(u * r)]  # (..., K, Sm, D)
    values_held = [v_sh[..., g * Sm : (g + 1) * Sm, :] for g in range(u * r)]  # (..., K, Sm, E)

    # S2. all-to-all inside the ring group, positions to heads (Ulysses' U2): in each ring
    #     group, member j of group i gets every position of its group (ring shard i, in shard
    #     order) of its query heads and of the key/value heads they read.
    def to_heads(x, d):
        return _block(x, -3, *heads[d])  # member d's query heads

    def to_kv_heads(x, d):
        return _block(x, -3, *kv_heads[d])  # the key/value heads they read

    q_heads, k_heads, v_heads = [], [], []  # [i][j]: device i*u + j
    for i in range(r):
        group = [plan.rank(i, j) for j in range(u)]  # its devices
        q_heads.append(_in_group("query", [queries[g] for g in group], to_heads, group, -2, stats))
        k_heads.append(_in_group("key", [keys_held[g] for g in group], to_kv_heads, group, -2,
                                 stats))
        v_heads.append(_in_group("value", [values_held[g] for g in group], to_kv_heads, group,
                                 -2, stats))

    # S3. the ring across the groups: for each j, the r devices (i, j) hold ring shard i of
    #     the heads of member j, which is what ring_attention's R1 gives its device i of those
    #     heads: ring_attention runs them (mask, bias, sinks and ALiBi slopes: those heads;
    #     segment ids and head-less masks: whole). Its output, rows of shard i on device (i, j).
    outs = []  # [j]: (..., H/u, L, E), the rows of every ring group
    for j in range(u):
        ring_j = _ring_of(plan, j)  # its devices (i, m), ring shard i first to last
        back = np.argsort(rows), np.argsort(keys)  # the shards' positions back in order
        q_j = np.concatenate([q_heads[i][m] for i, m in ring_j], axis=-2)[..., back[0], :]
        k_j = np.concatenate([k_heads[i][m] for i, m in ring_j], axis=-2)[..., back[1], :]
        v_j = np.concatenate([v_heads[i][m] for i, m in ring_j], axis=-2)[..., back[1], :]
        on_heads = kw | {
            "mask": _block(kw["mask"], -3, *heads[j]),
            "bias": _block(kw["bias"], -3, *heads[j]),
            "sinks": _block(kw["sinks"], -1, *heads[j]),
            "alibi_slopes": _block(kw["alibi_slopes"], -1, *heads[j]),
        }  # member j's heads of mask, bias, sinks and slopes; every other keyword whole
        steps = None if stats is None else []
        out = ring_attention(q_j, k_j, v_j, n_shards=r, layout=layout, stats=steps, **on_heads)
        outs.append(out[..., rows, :])  # (..., H/u, L, E) in shard order: group i's rows at i
        for step in steps or ():  # the ring's device i is device (i, j)
            stats.append(replace(step, r=plan.rank(step.r, j), src=plan.rank(step.src, j)))

    # S4. all-to-all inside the ring group, heads to positions (Ulysses' U4): in each ring
    #     group, member j sends member d its heads at d's rows; member d joins them along the
    #     heads, in source order.
    mine = []  # [g]: (..., H, Lm, E), the rows device g started with, every head
    for i in range(r):
        group = [plan.rank(i, j) for j in range(u)]

        def its_rows(x, d, group=group):
            """Member d's rows (device group[d]'s), of one member's output."""
            return x[..., group[d] * Lm : (group[d] + 1) * Lm, :]

        mine += _in_group("output", outs, its_rows, group, -3, stats)

    # S5. gather: the devices' rows in device order are the sequence in shard order; back to
    #     their positions.
    return np.concatenate(mine, axis=-2)[..., np.argsort(rows), :]  # (..., H, L, E)
