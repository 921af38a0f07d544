"""Sharded attention in PyTorch: ``torch.distributed`` process groups, one process per shard.

The steps, names and comments of ``impl_numpy/sharded.py``, which is the specification (read its
docstring for the algorithm), run by real processes: every rank of the process group calls the
same function with the same whole arrays, works on its own shard, and returns the whole output
(gathered from every rank). What torch asks for:

- One process per shard, started by ``torchrun`` (one or many nodes) or by
  ``torch.multiprocessing``, each calling ``torch.distributed.init_process_group`` first: gloo on
  CPU, nccl on CUDA (each rank's tensors on its own GPU). ``n_shards`` must equal the group's
  size; ``group=`` picks a group other than the default one. docs/SHARDED.md gives the commands.
- The ring's rotation is point-to-point: ``dist.batch_isend_irecv`` posts the send of the held
  key/value shard to rank r + 1 and the receive of the next one from rank r - 1, the step's
  blocks are computed while the transfer runs, and the step ends by waiting for it. Two shards
  are alive on a rank during a step: the one it computes with and the one arriving.
- The ring, head-parallel and USP functions are forward only: ``torch.distributed``'s
  point-to-point and gather operations record no autograd graph, so they run under
  ``torch.no_grad()`` and the result has no gradient history (``impl_jax/sharded.py`` is the
  differentiable one). ``ulysses_attention`` is differentiable: its collectives are small
  ``torch.autograd.Function`` s whose backward is the conjugate exchange (an all-to-all's is
  the same all-to-all; a gather's is this rank's part; the cut of this rank's part from an
  array every rank holds has a gather), so one code runs with and without autograd.
- ``stats=[]`` collects this rank's :class:`~attention_spec.sharded.RingStep` records: the blocks
  it computed at each step and the bytes it handed to ``batch_isend_irecv``.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``), H query
heads, K key/value heads, G = H // K, L query length, S key/value length, D query/key head dim,
E value head dim, M model width; n = ``n_shards``, r this rank, t a ring step, c chunks per
shard (1 contiguous, 2 zigzag), Lc = L / (c n) and Sc = S / (c n) the rows and keys of a chunk.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from attention_spec import causal_offset, check_attention, dtype_name
from attention_spec.modules import check_module_inputs
from attention_spec.rules import alibi
from attention_spec.sharded import (
    RingLayout,
    RingStep,
    UlyssesExchange,
    block_computed,
    check_head_parallel,
    check_ring,
    check_shard_config,
    check_shard_devices,
    check_ulysses,
    check_usp,
    check_usp_config,
)
from impl_torch.flash import _block
from impl_torch.functional import (
    _allowed,
    _as_tensors,
    _attended,
    _cast,
    _compute_dtype,
    _converted,
    _unattended_zeroed,
    scaled_dot_product_attention,
)

__all__ = [
    "head_parallel_attention",
    "head_parallel_gqa",
    "ring_attention",
    "ulysses_attention",
    "usp_attention",
]


def _rank(n_shards: int, group: dist.ProcessGroup | None) -> int:
    """This process's rank in ``group``; ConfigError when the group is not ``n_shards`` big."""
    if not (dist.is_available() and dist.is_initialized()):
        check_shard_devices(
            n_shards,
            0,
            "torch.distributed is not initialized: start one process per shard (torchrun, or "
            "torch.multiprocessing) and call torch.distributed.init_process_group in each",
            exact=True,
        )
    size = dist.get_world_size(group)
    check_shard_devices(n_shards, size, f"the process group has {size} ranks", exact=True)
    return dist.get_rank(group)


def _peer(group: dist.ProcessGroup | None, rank: int) -> int:
    """The global rank of ``rank`` in ``group`` (point-to-point ops address global ranks)."""
    return rank if group is None else dist.get_global_rank(group, rank)


def _attend_block(q, k, v, q_pos, k_pos, mask, bias, q_ids, kv_ids, *, dims, offset, slopes):
    """Steps 1-6 of the contract for one block: the query rows at positions ``q_pos`` ``(Lc,)``
    against the keys at positions ``k_pos`` ``(Sc,)``, and nothing else.

    ``q (..., H, Lc, D)``, ``k (..., K, Sc, D)``, ``v (..., K, Sc, E)`` in the compute dtype;
    ``mask``, ``bias``, ``q_ids (..., Lc)`` and ``kv_ids (..., Sc)`` this block's slices (or
    broadcastable whole, or None); ``slopes (H,)`` ALiBi's, or None. The sink is not here: it
    joins once, after the last block (R6). Returns ``(out, lse)``:
    the block's attention output ``(..., H, Lc, E)``, normalized over these keys only, and its
    row log-sum-exp ``(..., H, Lc)``; a row with no allowed key here has zero output and
    ``lse = -inf``. The same steps as ``impl_torch/flash.py``'s block, which keeps a running
    ``(m, l, acc)`` instead of normalizing each block.
    """
    H, K, G, D, E = dims.H, dims.K, dims.G, dims.D, dims.E
    Lc, Sc = q.shape[-2], k.shape[-2]

    # 4. allowed, this block: mask AND causal AND window AND segment, at the rows' and keys'
    #    places in the whole sequence. Key and value rows no row of the block attends are zeroed.
    i, j = q_pos[:, None], k_pos[None, :]  # (Lc, 1), (1, Sc)
    allowed = _allowed(dims, offset, i, j, mask, q_ids, kv_ids)  # (..., Lc|1, Sc|1) or None
    attended = _attended(allowed, bias, (*dims.batch, H, Lc, Sc), K)  # (..., K, Sc)
    k = _unattended_zeroed(k, attended)  # (..., K, Sc, D)
    v = _unattended_zeroed(v, attended)  # (..., K, Sc, E)

    # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G: the G
    #    query heads of a group are G * Lc rows against their one key head (no copy of it).
    q = q.reshape(*q.shape[:-3], K, G * Lc, D)  # (..., K, G*Lc, D)
    s = q @ k.transpose(-2, -1)  # (..., K, G*Lc, Sc)
    s = s.view(*s.shape[:-3], H, Lc, Sc).mul_(dims.scale)  # (..., H, Lc, Sc)
    if s.shape[:-3] != dims.batch:  # a mask, bias or value with more batch than query and key
        s = s.expand(*dims.batch, H, Lc, Sc).clone()

    # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
    if dims.softcap is not None:
        s = dims.softcap * torch.tanh(s / dims.softcap)

    # 3. additive terms: this block's slice of the bias, may hold -inf, and ALiBi's
    #    -slope[h] * |i + offset - j| at the block's places in the whole sequence.
    if bias is not None:
        s.add_(bias)
    if slopes is not None:
        s.add_(alibi(slopes[:, None, None], i, j, offset))  # (H, Lc, Sc)

    # 4. allowed: s = -inf where allowed(i, j) is False, in this block.
    if allowed is not None:
        s.masked_fill_(~allowed, float("-inf"))

    # 5. softmax over this block's keys, stable, and its row log-sum-exp: lse = m + log(l); a
    #    row with no allowed key here has l = 0: weights 0 / 1 = 0, lse = -inf + log 1 = -inf.
    m = s.amax(dim=-1, keepdim=True)  # (..., H, Lc, 1)
    p = s.sub_(torch.where(m == float("-inf"), 0.0, m)).clamp_(max=0.0).exp_()  # exp(s - m) <= 1
    l = p.sum(dim=-1, keepdim=True)  # (..., H, Lc, 1)
    l = torch.where(l == 0.0, 1.0, l)
    p.div_(l)
    lse = (m + torch.log(l)).squeeze(-1)  # (..., H, Lc)

    # 6. output = weights @ value, per group (G * Lc rows per value head).
    out = p.view(*p.shape[:-3], K, G * Lc, Sc) @ v  # (..., K, G*Lc, E)
    return out.view(*dims.batch, H, Lc, E), lse  # (..., H, Lc, E), (..., H, Lc)


def _merge(out, lse, out_blk, lse_blk):
    """Merge two partial results for the same rows over disjoint keys into their union's.

    ``lse = log(exp(lse) + exp(lse_blk))``; ``out = exp(lse_old - lse) * out +
    exp(lse_blk - lse) * out_blk``. Computed around the larger of the two (a stable
    log-sum-exp); a side with ``lse = -inf`` has share 0, and a row with ``-inf`` on both sides
    stays zero with ``lse = -inf``. out ``(..., H, Lc, E)``, lse ``(..., H, Lc)``.
    """
    top = torch.maximum(lse, lse_blk)  # (..., H, Lc)
    top = torch.where(top == float("-inf"), 0.0, top)  # both -inf: exp(-inf - 0) = 0, not NaN
    a, b = torch.exp(lse - top), torch.exp(lse_blk - top)  # each side's mass, relative to top
    total = a + b
    seen = total > 0.0
    total = torch.where(seen, total, 1.0)
    new_lse = torch.where(seen, top + torch.log(total), float("-inf"))
    out = (a / total)[..., None] * out + (b / total)[..., None] * out_blk  # shares sum to 1
    return out, new_lse


@torch.no_grad()
def ring_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    n_shards: int,
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
    stats: list[RingStep] | None = None,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` on a ring of ``n_shards`` processes, shape
    ``(..., H, L, E)``; every rank passes the same arguments and gets the whole output.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        n_shards: n, the size of the process group; n (contiguous) or 2n (zigzag) must divide
            L and S.
        layout: ``"contiguous"`` (rank r holds chunk r of n) or ``"zigzag"`` (chunks r and
            2n - 1 - r of 2n, which balances causal work).
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in
            :func:`impl_torch.functional.attention_weights`. Mask, bias and ``q_segment_ids``
            are held by rows: each rank keeps the rows of its query shard (with every column).
            ``kv_segment_ids`` (S integers, like a mask row) is held whole by every rank; only
            key and value travel. ALiBi is computed per block at the block's places in the
            whole sequence; the sink joins each row once, after the last block.
        group: the process group (default: the world).
        stats: a list to append this rank's :class:`~attention_spec.sharded.RingStep` per step
            to (the blocks computed, the bytes sent), or None.

    Returns the output in the query's dtype, without autograd history; rows with no allowed
    key are zeros.

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``,
    ``unknown_layout``, ``shard_devices``; DimensionMismatchError ``length_not_divisible``.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    check_shard_config(n_shards, layout)
    call = check_attention(query, key, value, **kw)
    mask, bias, sinks, slopes = kw["mask"], kw["bias"], kw["sinks"], kw["alibi_slopes"]
    q_ids, kv_ids = kw["q_segment_ids"], kw["kv_segment_ids"]
    ring = check_ring(call, n_shards, layout)
    r = _rank(n_shards, group)  # this process
    ct = _compute_dtype(query.dtype)
    n, chunks, Lc, Sc = ring.n, ring.chunks, ring.Lc, ring.Sc
    H, L, E = call.H, call.L, call.E
    offset = call.offset  # query i sees key j iff j <= i + offset
    if L == 0 or call.S == 0:  # no rows, or no keys (every row fully masked): nothing to ring
        return query.new_zeros((*call.batch, H, L, E))
    device = query.device

    # R1. split: this rank keeps its query chunks (and their rows of mask, bias and query
    #     segment ids) for the whole call, and starts with its own key/value shard, the key
    #     chunks of the same numbers. Keys and values travel in the input dtype; each block
    #     computes in the compute dtype.
    q = query.to(ct)  # (..., H, L, D)
    bias, sinks, slopes = _cast(bias, ct), _cast(sinks, ct), _cast(slopes, ct)
    queries = [q[..., a * Lc : (a + 1) * Lc, :] for a in chunks[r]]  # (..., H, Lc, D) each
    mask_rows = [_block(mask, -2, a * Lc, (a + 1) * Lc) for a in chunks[r]]
    bias_rows = [_block(bias, -2, a * Lc, (a + 1) * Lc) for a in chunks[r]]
    q_ids_rows = [_block(q_ids, -1, a * Lc, (a + 1) * Lc) for a in chunks[r]]
    k_shard = torch.cat([key[..., b * Sc : (b + 1) * Sc, :] for b in chunks[r]], dim=-2)
    v_shard = torch.cat([value[..., b * Sc : (b + 1) * Sc, :] for b in chunks[r]], dim=-2)
    # k_shard (..., K, c*Sc, D), v_shard (..., K, c*Sc, E), contiguous: ready to send

    # R2. the ring: every query chunk starts with nothing seen (output 0, row log-sum-exp
    #     -inf); n steps, at each of which every rank attends to the shard it holds.
    outs = [torch.zeros((*call.batch, H, Lc, E), dtype=ct, device=device) for _ in chunks[r]]
    lses = [
        torch.full((*call.batch, H, Lc), float("-inf"), dtype=ct, device=device) for _ in chunks[r]
    ]
    right, left = _peer(group, (r + 1) % n), _peer(group, (r - 1) % n)
    for t in range(n):
        # R3. step t: this rank holds the key/value shard of rank src = (r - t) mod n.
        src = (r - t) % n

        # R4. rotate, started: batch_isend_irecv posts the send of the held shard to the right
        #     neighbour and the receive of the left one's into fresh buffers; the blocks below
        #     compute while they travel. The last step sends nothing.
        if t < n - 1:
            k_next, v_next = torch.empty_like(k_shard), torch.empty_like(v_shard)
            requests = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, k_shard, right, group),
                    dist.P2POp(dist.isend, v_shard, right, group),
                    dist.P2POp(dist.irecv, k_next, left, group),
                    dist.P2POp(dist.irecv, v_next, left, group),
                ]
            )

        # 4. allowed, whole blocks: each query chunk of the rank meets each key chunk it holds;
        #    a block outside the causal or window band of its rows, or whose segments cannot
        #    meet theirs, is masked for every row, and skipped.
        blocks = []
        for a, q_chunk in enumerate(chunks[r]):  # its query chunks
            q_pos = q_chunk * Lc + torch.arange(Lc, device=device)  # (Lc,) rows in the sequence
            for b, k_chunk in enumerate(chunks[src]):  # the key chunks it holds
                cols = (k_chunk * Sc, (k_chunk + 1) * Sc)  # its columns of mask and bias
                kv_ids_blk = _block(kv_ids, -1, *cols)  # (..., Sc): its keys' segments
                if not block_computed(
                    call, offset, q_chunk, k_chunk, Lc, Sc, q_ids_rows[a], kv_ids_blk
                ):
                    continue
                k_pos = k_chunk * Sc + torch.arange(Sc, device=device)  # (Sc,) its keys
                k = k_shard[..., b * Sc : (b + 1) * Sc, :].to(ct)  # (..., K, Sc, D)
                v = v_shard[..., b * Sc : (b + 1) * Sc, :].to(ct)  # (..., K, Sc, E)
                out_blk, lse_blk = _attend_block(
                    queries[a], k, v, q_pos, k_pos,
                    _block(mask_rows[a], -1, *cols), _block(bias_rows[a], -1, *cols),
                    q_ids_rows[a], kv_ids_blk, dims=call, offset=offset, slopes=slopes,
                )  # fmt: skip

                # R5. merge: the block into what this query chunk has seen, by their lse.
                outs[a], lses[a] = _merge(outs[a], lses[a], out_blk, lse_blk)
                blocks.append((q_chunk, k_chunk))
        if stats is not None:
            sent = k_shard.nbytes + v_shard.nbytes if t < n - 1 else 0
            stats.append(RingStep(t, r, src, tuple(blocks), sent))

        # R4. (end) rotate, finished: wait for the transfer; the shard received is the one held
        #     at the next step.
        if t < n - 1:
            for request in requests:
                request.wait()
            k_shard, v_shard = k_next, v_next

    # R6. sink: the sink joins each row once, as one more block with a zero value and
    #     lse = sinks[h] (a row that saw no key stays zero).
    if sinks is not None:
        for a in range(len(outs)):
            sink = sinks[:, None].expand(lses[a].shape)  # (..., H, Lc)
            outs[a], _ = _merge(outs[a], lses[a], torch.zeros_like(outs[a]), sink)

    # R7. gather: every rank's output rows to every rank, back to their rows; one rounding to
    #     the input dtype (before the gather, which then moves half the bytes for 16-bit types).
    mine = torch.cat(outs, dim=-2).to(query.dtype)  # (..., H, c*Lc, E)
    pieces = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(pieces, mine, group=group)
    out = query.new_empty((*call.batch, H, L, E))  # (..., H, L, E)
    for rank, piece in enumerate(pieces):
        for a, q_chunk in enumerate(chunks[rank]):
            out[..., q_chunk * Lc : (q_chunk + 1) * Lc, :] = piece[..., a * Lc : (a + 1) * Lc, :]
    return out


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
                     stats, grp)  # (..., H, Lc, E)  # fmt: skip
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
                  g)  # fmt: skip

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
                         stats=steps, **on_heads)  # fmt: skip  # (..., H/u, L, E)
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


@torch.no_grad()
def head_parallel_attention(
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
) -> torch.Tensor:
    """``scaled_dot_product_attention`` with its K key/value heads split over ``n_shards``
    processes, shape ``(..., H, L, E)``; every rank passes the same arguments and gets the whole
    output.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        n_shards: n, the size of the process group, which must divide K; rank r holds key/value
            heads ``r*K/n ..`` and query heads ``r*H/n ..`` (the query heads that read them).
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in
            :func:`impl_torch.functional.attention_weights`; a head axis of size H (of mask
            or bias) is split with the query heads, one of size 1 is kept whole; sinks and
            ALiBi slopes ``(H,)`` are split with the query heads; segment ids (no head axis)
            go whole to every rank.
        group: the process group (default: the world).

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``,
    ``shard_devices``; DimensionMismatchError ``kv_heads_not_divisible``.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    check_shard_config(n_shards)
    call = check_attention(query, key, value, **kw)
    check_head_parallel(call.H, call.K, n_shards)
    r = _rank(n_shards, group)  # this process
    Hn, Kn = call.H // n_shards, call.K // n_shards  # query and key/value heads per rank

    # P1. split: this rank holds key/value heads r*Kn .. (r+1)*Kn - 1 and the query heads that
    #     read them, r*Hn .. (r+1)*Hn - 1 (query head h reads kv head h // G).
    heads, kv_heads = (r * Hn, (r + 1) * Hn), (r * Kn, (r + 1) * Kn)
    q, k, v = _block(query, -3, *heads), _block(key, -3, *kv_heads), _block(value, -3, *kv_heads)

    # P2. attend: the unsharded contract on this rank's heads (mask, bias, sinks and ALiBi
    #     slopes: its heads; segment ids: whole).
    on_heads = kw | {
        "mask": _block(kw["mask"], -3, *heads),
        "bias": _block(kw["bias"], -3, *heads),
        "sinks": _block(kw["sinks"], -1, *heads),
        "alibi_slopes": _block(kw["alibi_slopes"], -1, *heads),
    }  # this rank's heads of mask, bias, sinks and slopes; every other keyword whole
    mine = scaled_dot_product_attention(q, k, v, **on_heads).contiguous()  # (..., Hn, L, E)

    # P3. gather: the ranks' heads, in order, along H.
    pieces = [torch.empty_like(mine) for _ in range(n_shards)]
    dist.all_gather(pieces, mine, group=group)
    return torch.cat(pieces, dim=-3)  # (..., H, L, E)


@torch.no_grad()
def head_parallel_gqa(
    module,
    x: torch.Tensor,
    context: torch.Tensor | None = None,
    *,
    n_shards: int,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """The forward pass of a ``GroupedQueryAttention`` (or ``MultiHeadAttention``) ``module``
    with its heads split over ``n_shards`` processes, output ``(B, L, M)`` on every rank.

    Megatron-style: rank r holds the q_proj rows (``nn.Linear.weight`` is ``(out, in)``) of its
    query heads and the k_proj and v_proj rows of its key/value heads (column-parallel), attends
    on its heads, and applies the o_proj columns of its heads' features (row-parallel), which
    gives a partial ``(B, L, M)``; ``dist.all_reduce`` sums the partials in the compute dtype,
    then o_proj's bias is added once and the result cast to the module's dtype. The module's
    settings (window, softcap, scale, its ``sinks (H,)`` weight and ALiBi's slopes) apply on
    every rank, the sinks and slopes split with the query heads.

    Args:
        module: an ``impl_torch`` ``GroupedQueryAttention``; n_shards must divide its K.
        x, context, mask, bias, is_causal, causal_alignment, q_segment_ids, kv_segment_ids: as
            in the module's ``forward`` (segment ids, with no head axis, go whole to every rank).
        group: the process group (default: the world).
    """
    x, context, mask, bias, q_ids, kv_ids = _as_tensors(
        x, context, mask, bias, q_segment_ids, kv_segment_ids
    )
    check_shard_config(n_shards)
    dims = module.dims
    check_module_inputs(
        dims, dtype_name(module.dtype), x, context, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, q_segment_ids=q_ids, kv_segment_ids=kv_ids,
    )  # fmt: skip
    check_head_parallel(dims.H, dims.K, n_shards)
    r = _rank(n_shards, group)  # this process
    context = x if context is None else context
    ct = _compute_dtype(module.dtype)
    settings = module._option_keywords()  # window, softcap, scale, sinks (H,), alibi_slopes (H,)
    sinks, slopes = settings.pop("sinks"), settings.pop("alibi_slopes")
    D, E = dims.D, dims.E
    Hn, Kn = dims.H // n_shards, dims.K // n_shards  # query and key/value heads per rank
    B, L, _ = x.shape
    S = context.shape[1]

    # P1. split the projections: this rank's rows of q_proj (query heads r*Hn ..), k_proj and
    #     v_proj (key/value heads r*Kn ..); head h owns features [h*D:(h+1)*D].
    def project(inp, proj, start, stop):
        """``nn.Linear`` on the output features ``start .. stop - 1`` (rows of its weight)."""
        b = None if proj.bias is None else proj.bias[start:stop]
        return F.linear(inp, proj.weight[start:stop], b)

    q = project(x, module.q_proj, r * Hn * D, (r + 1) * Hn * D)  # (B, L, Hn*D)
    k = project(context, module.k_proj, r * Kn * D, (r + 1) * Kn * D)  # (B, S, Kn*D)
    v = project(context, module.v_proj, r * Kn * E, (r + 1) * Kn * E)  # (B, S, Kn*E)
    q = q.view(B, L, Hn, D).transpose(1, 2)  # (B, Hn, L, D)
    k = k.view(B, S, Kn, D).transpose(1, 2)  # (B, Kn, S, D)
    v = v.view(B, S, Kn, E).transpose(1, 2)  # (B, Kn, S, E)
    #     RoPE (the module's rope_theta), as in its forward: per head, so per rank too.
    q, k = module._rotate(q, k, causal_offset(L, S, causal_alignment), 0)

    # P2. attend on its heads: this rank's, the unsharded contract with the module's settings
    #     (mask, bias, sinks and ALiBi slopes: its heads; segment ids: whole).
    heads = (r * Hn, (r + 1) * Hn)
    out = scaled_dot_product_attention(
        q,
        k,
        v,
        mask=_block(mask, -3, *heads),
        bias=_block(bias, -3, *heads),
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        q_segment_ids=q_ids,
        kv_segment_ids=kv_ids,
        sinks=None if sinks is None else sinks[heads[0] : heads[1]],
        alibi_slopes=None if slopes is None else slopes[heads[0] : heads[1]],
        **settings,
    )  # (B, Hn, L, E)

    # P3. row-parallel output projection: this rank's heads' features [r*Hn*E ..) meet the same
    #     columns of o_proj's weight (M, H*E), a partial (B, L, M) in the compute dtype.
    merged = out.transpose(1, 2).reshape(B, L, Hn * E)  # (B, L, Hn*E)
    cols = module.o_proj.weight[:, r * Hn * E : (r + 1) * Hn * E]  # (M, Hn*E)
    y = F.linear(merged.to(ct), cols.to(ct))  # (B, L, M)

    # P4. all-reduce: the partials summed over the ranks, in the compute dtype.
    dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)

    # P5. output bias: o_proj's bias added once, to the sum; one rounding to the dtype.
    if module.o_proj.bias is not None:
        y = y + module.o_proj.bias.to(ct)
    return y.to(module.dtype)
