"""All-to-all sequence parallelism in PyTorch: Ulysses and USP, one process per shard.

The steps, names and comments of ``impl_numpy/ulysses.py``, which is the specification (read its
docstring for the algorithm), run by real processes: every rank of the process group calls the
same function with the same whole arrays, works on its own shard, and returns the whole output
(gathered from every rank). The ring that USP runs across its groups is
``impl_torch/sharded.py``'s, whose docstring says how the processes are started. What torch asks
for:

- ``ulysses_attention`` is differentiable: its collectives are small
  ``torch.autograd.Function`` s whose backward is the conjugate exchange (an all-to-all's is
  the same all-to-all; a gather's is this rank's part; the cut of this rank's part from an
  array every rank holds has a gather), so one code runs with and without autograd.
- ``usp_attention`` is forward only, as the ring it runs: it runs under ``torch.no_grad()`` and
  the result has no gradient history (``impl_jax/ulysses.py`` is the differentiable one).
- USP's all-to-alls run in sub-groups of u ranks and its ring in sub-groups of r, made once per
  process group (:func:`_usp_groups`: ``new_group`` is collective).

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``), H query
heads, K key/value heads, G = H // K, L query length, S key/value length, D query/key head dim,
E value head dim; n = ``n_shards``, Lc = L / n and Sc = S / n the rows and keys a device starts
with; u = ``ulysses_shards`` and r = ``ring_shards`` (USP), Lm and Sm a device's rows and keys.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist

from attention_spec import check_attention
from attention_spec.sharded import (
    RingLayout,
    RingStep,
    UlyssesExchange,
    check_shard_config,
    check_ulysses,
    check_usp,
    check_usp_config,
)
from impl_torch.flash import _block
from impl_torch.functional import (
    _converted,
    scaled_dot_product_attention,
)
from impl_torch.sharded import _peer, _rank, ring_attention

__all__ = [
    "ulysses_attention",
    "usp_attention",
]


class _Split(torch.autograd.Function):
    """This rank's part r of n equal parts along ``axis`` of an array every rank holds whole;
    backward: the parts of the gradient gathered from every rank, the whole gradient."""

    @staticmethod
    def forward(ctx, x, axis, r, n, group):
        ctx.axis, ctx.n, ctx.group = axis, n, group
        size = x.shape[axis] // n
        return x.narrow(axis, r * size, size).contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.axis, ctx.n, ctx.group), None, None, None, None


class _Whole(torch.autograd.Function):
    """An array every rank uses whole; backward: the ranks' gradients summed."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


class _Gather(torch.autograd.Function):
    """Every rank's part, joined along ``axis`` in rank order (``_Split``'s inverse); backward:
    this rank's part r of the gradient (every rank holds the same whole gradient)."""

    @staticmethod
    def forward(ctx, x, axis, r, n, group):
        ctx.axis, ctx.r, ctx.size = axis, r, x.shape[axis]
        return _gather(x, axis, n, group)

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(ctx.axis, ctx.r * ctx.size, ctx.size), None, None, None, None


class _AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` over dim 0 (piece d to rank d); backward: the same exchange of
    the gradient (an all-to-all of equal pieces is its own transpose)."""

    @staticmethod
    def forward(ctx, pieces, group):
        ctx.group = group
        received = torch.empty_like(pieces)  # received[src]: what rank src sent this rank
        dist.all_to_all_single(received, pieces, group=group)
        return received

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.apply(grad.contiguous(), ctx.group), None


def _gather(x, axis, n, group):
    """``dist.all_gather`` of every rank's ``x``, joined along ``axis`` in rank order."""
    x = x.contiguous()
    pieces = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(pieces, x, group=group)
    return torch.cat(pieces, dim=axis)


def _held(x, axis, r, n, group):
    """This rank's heads of a per-head keyword every rank holds whole (bias, sinks, ALiBi
    slopes; ``axis`` its head axis), as ``_block`` cuts it, with the whole gradient on every
    rank: part r of n (:class:`_Split`), or the whole array when it has no head axis or one of
    size 1 (:class:`_Whole`). None stays None."""
    if x is None:
        return None
    if x.dim() < -axis or x.shape[axis] == 1:
        return _Whole.apply(x, group)
    return _Split.apply(x, axis, r, n, group)


def _exchange(name, piece, n, r, axis, stats, group, rank=None):
    """One all-to-all of Ulysses, this rank's side: it sends ``piece(r, dst)`` to every rank
    dst (:class:`_AllToAll` over the pieces stacked in rank order) and joins what it received
    along ``axis`` in source order. Records the bytes it sent to the others, under its rank r
    in ``group`` or ``rank`` (USP: its rank among all the devices)."""
    pieces = torch.stack([piece(r, dst) for dst in range(n)])  # (n, ...): piece dst to rank dst
    received = _AllToAll.apply(pieces, group)  # received[src]: what rank src sent this rank
    if stats is not None:
        sent = pieces.nbytes // n * (n - 1)
        stats.append(UlyssesExchange(name, r if rank is None else rank, sent))
    return torch.cat(list(received.unbind(0)), dim=axis)


def ulysses_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    n_shards: int,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    group: dist.ProcessGroup | None = None,
    stats: list[UlyssesExchange] | None = None,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` on ``n_shards`` processes by all-to-all sequence
    parallelism (Ulysses), shape ``(..., H, L, E)``; every rank passes the same arguments and
    gets the whole output.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        n_shards: n, the size of the process group, which must divide H, L and S; K % n == 0
            (key/value heads split) or n % K == 0 (each key/value head replicated to the n / K
            ranks of its group).
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in
            :func:`impl_torch.functional.attention_weights`; a head axis of size H (of mask
            or bias), sinks and ALiBi slopes ``(H,)`` are split with the query heads; segment
            ids, and masks and biases without a head axis (or with one of size 1), go whole to
            every rank.
        group: the process group (default: the world).
        stats: a list to append this rank's :class:`~attention_spec.sharded.UlyssesExchange`
            per all-to-all to (the bytes it sent), or None.

    Differentiable (the ring is not): autograd records both all-to-alls and the gather, and
    every rank that calls backward with the same gradient of the whole output gets the whole
    gradient of query, key, value, bias, sinks and ALiBi slopes, as the unsharded call gives
    it (:class:`_Split` and :class:`_Gather`: what a rank cuts from an array every rank holds,
    its backward gathers; what it gathers, its backward cuts).

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``,
    ``shard_devices``; DimensionMismatchError ``ulysses_heads``, ``ulysses_length``,
    ``ulysses_kv_heads``.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    check_shard_config(n_shards)
    call = check_attention(query, key, value, **kw)
    plan = check_ulysses(call, n_shards)
    r = _rank(n_shards, group)  # this process
    n, heads, kv_heads, Lc, Sc = plan.n, plan.heads, plan.kv_heads, plan.Lc, plan.Sc
    if call.L == 0 or call.S == 0:  # no rows, or no keys (every row fully masked)
        return query.new_zeros((*call.batch, call.H, call.L, call.E))

    # U1. split: this rank holds a contiguous 1/n of the positions, every head: query rows
    #     r*Lc .. (r+1)*Lc - 1, key and value positions r*Sc .. (r+1)*Sc - 1.
    q_rows = _Split.apply(query, -2, r, n, group)  # (..., H, Lc, D)
    k_rows = _Split.apply(key, -2, r, n, group)  # (..., K, Sc, D)
    v_rows = _Split.apply(value, -2, r, n, group)  # (..., K, Sc, E)

    # U2. all-to-all, positions to heads: this rank sends rank d its positions of d's query
    #     heads and of the key/value heads they read; it joins what it gets along the
    #     positions, in source order: every position of its heads.
    grp = group
    q = _exchange("query", lambda r, d: _block(q_rows, -3, *heads[d]), n, r, -2, stats, grp)
    k = _exchange("key", lambda r, d: _block(k_rows, -3, *kv_heads[d]), n, r, -2, stats, grp)
    v = _exchange("value", lambda r, d: _block(v_rows, -3, *kv_heads[d]), n, r, -2, stats, grp)
    # q (..., H/n, L, D), k (..., K/n or 1, S, D), v (..., K/n or 1, S, E)

    # U3. attend: the unsharded contract on this rank's heads, every position (mask, bias,
    #     sinks and ALiBi slopes: its query heads; segment ids and head-less masks: whole).
    on_heads = kw | {
        "mask": _block(kw["mask"], -3, *heads[r]),
        "bias": _held(kw["bias"], -3, r, n, group),
        "sinks": _held(kw["sinks"], -1, r, n, group),
        "alibi_slopes": _held(kw["alibi_slopes"], -1, r, n, group),
    }  # this rank's heads of mask, bias, sinks and slopes; every other keyword whole
    out = scaled_dot_product_attention(q, k, v, **on_heads)  # (..., H/n, L, E)

    # U4. all-to-all, heads to positions: this rank sends rank d its heads at d's rows and
    #     joins what it gets along the heads, in source order: its rows, every head. Then every
    #     rank's rows to every rank, in order (the whole output).
    mine = _exchange("output", lambda r, d: out[..., d * Lc : (d + 1) * Lc, :], n, r, -3,
                     stats, grp)  # (..., H, Lc, E)
    return _Gather.apply(mine, -2, r, n, group)  # (..., H, L, E)


#: USP's sub-groups, made once per (u, r, process group): new_group is collective.
_USP_GROUPS: dict = {}


def _usp_groups(u: int, r: int, group: dist.ProcessGroup | None) -> tuple[list, list]:
    """The sub-groups of the ``u * r`` ranks of ``group``: Ulysses group i is the ranks
    ``i*u .. i*u + u - 1`` (ring group i's members), ring j the ranks ``j, u + j, ..`` (member
    j of every ring group). Every rank makes every sub-group, in the same order."""
    world = group if group is not None else dist.group.WORLD
    if (u, r, world) not in _USP_GROUPS:
        ulysses = [dist.new_group([_peer(group, i * u + j) for j in range(u)]) for i in range(r)]
        rings = [dist.new_group([_peer(group, i * u + j) for i in range(r)]) for j in range(u)]
        _USP_GROUPS[(u, r, world)] = (ulysses, rings)
    return _USP_GROUPS[(u, r, world)]


def _shard_order(ring: RingLayout, size: int) -> torch.Tensor:
    """The positions of the sequence in ring shard order (chunks of ``size`` positions)."""
    return torch.cat([torch.arange(a * size, (a + 1) * size) for s in ring.chunks for a in s])


@torch.no_grad()
def usp_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    ulysses_shards: int | None = None,
    ring_shards: int | None = None,
    layout: str = "contiguous",
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    group: dist.ProcessGroup | None = None,
    stats: list[UlyssesExchange | RingStep] | None = None,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` on ``u * r`` processes by USP, Ulysses inside each of
    r ring groups of u ranks, shape ``(..., H, L, E)``; every rank passes the same arguments
    and gets the whole output. Rank ``i * u + j`` is member j of ring group i; the Ulysses
    all-to-alls run in sub-groups of u ranks, the ring in sub-groups of r (:func:`_usp_groups`).

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        ulysses_shards: u, which must divide H, with K % u == 0 or u % K == 0. Required.
        ring_shards: r; ``u * r`` must be the group's size, and ``u * r`` (contiguous) or
            ``2 u r`` (zigzag) must divide L and S. Required.
        layout: the ring's shards, as in :func:`ring_attention`.
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in :func:`ulysses_attention` and
            :func:`ring_attention`.
        group: the process group of the u * r ranks (default: the world).
        stats: a list to append this rank's all-to-alls and ring steps to, under its rank.

    Forward only, like the ring.

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``
    (a group size missing or < 1), ``unknown_layout``, ``shard_devices``;
    DimensionMismatchError ``usp_shape``.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    check_usp_config(ulysses_shards, ring_shards, layout)
    call = check_attention(query, key, value, **kw)
    plan = check_usp(call, ulysses_shards, ring_shards, layout)
    u, r, ring = plan.u, plan.r, plan.ring
    heads, kv_heads = plan.ulysses.heads, plan.ulysses.kv_heads  # member j's query, kv heads
    Lm, Sm = plan.ulysses.Lc, plan.ulysses.Sc  # the rows and keys each rank starts with
    g = _rank(u * r, group)  # this process
    i, j = divmod(g, u)  # member j of ring group i
    if call.L == 0 or call.S == 0:  # no rows, or no keys (every row fully masked)
        return query.new_zeros((*call.batch, call.H, call.L, call.E))
    mates, ring_mates = (groups[k] for groups, k in zip(_usp_groups(u, r, group), (i, j)))

    # S1. split: ring group i holds ring shard i (its chunks side by side, as ring_attention's
    #     R1 cuts them) and its member j the contiguous j-th 1/u of it: this rank g = i*u + j
    #     holds rows g*Lm .. (g+1)*Lm - 1 and keys g*Sm .. of the sequence in shard order.
    rows, keys = _shard_order(ring, ring.Lc).to(query.device), _shard_order(ring, ring.Sc)
    keys = keys.to(query.device)
    q_rows = query[..., rows[g * Lm : (g + 1) * Lm], :]  # (..., H, Lm, D)
    k_rows = key[..., keys[g * Sm : (g + 1) * Sm], :]  # (..., K, Sm, D)
    v_rows = value[..., keys[g * Sm : (g + 1) * Sm], :]  # (..., K, Sm, E)

    # S2. all-to-all inside the ring group, positions to heads (Ulysses' U2): every position
    #     of the group (ring shard i, in shard order) of member j's query heads and of the
    #     key/value heads they read.
    q = _exchange("query", lambda a, d: _block(q_rows, -3, *heads[d]), u, j, -2, stats, mates, g)
    k = _exchange("key", lambda a, d: _block(k_rows, -3, *kv_heads[d]), u, j, -2, stats, mates, g)
    v = _exchange("value", lambda a, d: _block(v_rows, -3, *kv_heads[d]), u, j, -2, stats, mates,
                  g)

    # S3. the ring across the groups: this rank is rank i of member j's ring, holding ring
    #     shard i of its heads; ring_attention reads only its own shard of the arrays it is
    #     given (the rest zeros here, never read) and passes keys and values on to the others.
    shard_rows = rows[i * Lm * u : (i + 1) * Lm * u]  # ring shard i's positions
    shard_keys = keys[i * Sm * u : (i + 1) * Sm * u]
    q_all = q.new_zeros((*q.shape[:-2], call.L, call.D))
    k_all = k.new_zeros((*k.shape[:-2], call.S, call.D))
    v_all = v.new_zeros((*v.shape[:-2], call.S, call.E))
    q_all[..., shard_rows, :], k_all[..., shard_keys, :], v_all[..., shard_keys, :] = q, k, v
    on_heads = kw | {
        "mask": _block(kw["mask"], -3, *heads[j]),
        "bias": _block(kw["bias"], -3, *heads[j]),
        "sinks": _block(kw["sinks"], -1, *heads[j]),
        "alibi_slopes": _block(kw["alibi_slopes"], -1, *heads[j]),
    }  # member j's heads of mask, bias, sinks and slopes; every other keyword whole
    steps = None if stats is None else []
    out = ring_attention(q_all, k_all, v_all, n_shards=r, layout=layout, group=ring_mates,
                         stats=steps, **on_heads)  # (..., H/u, L, E)
    for step in steps or ():  # the ring's rank i is rank (i, j)
        stats.append(replace(step, r=plan.rank(step.r, j), src=plan.rank(step.src, j)))

    # S4. all-to-all inside the ring group, heads to positions (Ulysses' U4): member j sends
    #     member d its heads at d's rows; joined along the heads: this rank's rows, every head.
    def its_rows(a, d):
        d = plan.rank(i, d)  # member d's rank
        return out[..., rows[d * Lm : (d + 1) * Lm], :]

    mine = _exchange("output", its_rows, u, j, -3, stats, mates, g)

    # S5. gather: every rank's rows to every rank; in rank order they are the sequence in shard
    #     order; back to their positions.
    return _gather(mine, -2, u * r, group)[..., torch.argsort(rows), :]  # (..., H, L, E)
