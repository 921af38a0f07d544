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
- The ring and head-parallel functions are forward only: ``torch.distributed``'s
  point-to-point and gather operations record no autograd graph, so they run under
  ``torch.no_grad()`` and the result has no gradient history (``impl_jax/sharded.py`` is the
  differentiable one).
- ``stats=[]`` collects this rank's :class:`~attention_spec.sharded.RingStep` records: the blocks
  it computed at each step and the bytes it handed to ``batch_isend_irecv``.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``), H query
heads, K key/value heads, G = H // K, L query length, S key/value length, D query/key head dim,
E value head dim, M model width; n = ``n_shards``, r this rank, t a ring step, c chunks per
shard (1 contiguous, 2 zigzag), Lc = L / (c n) and Sc = S / (c n) the rows and keys of a chunk.

Ulysses and USP (all-to-all sequence parallelism) live in ``impl_torch/ulysses.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from attention_spec import causal_offset, check_attention, dtype_name
from attention_spec.modules import check_module_inputs
from attention_spec.rules import alibi
from attention_spec.sharded import (
    RingStep,
    block_computed,
    check_head_parallel,
    check_ring,
    check_shard_config,
    check_shard_devices,
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
                )

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
    )
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
