"""Sharded attention in NumPy: ring (context-parallel) and head-parallel, simulated in one process.

This file is the specification of the two sharded forms. The devices are Python lists indexed by
the device's rank r, and the ring's rotation is one explicit list operation, so a reader sees at
every step which device holds which key/value shard. ``impl_jax/sharded.py`` (``shard_map`` over
a ``Mesh``, ``lax.ppermute``) and ``impl_torch/sharded.py`` (``torch.distributed``,
``batch_isend_irecv``) do the same steps, with the same names and step numbers, on real devices.

**Ring attention** (context parallelism). L and S are cut into chunks (``attention_spec.sharded.
shard_chunks``): ``layout="contiguous"`` gives device r chunk r of n; ``"zigzag"`` gives it
chunks r and 2n - 1 - r of 2n. Device r keeps its query shard for the whole call and starts with
its own key/value shard. At each of n steps it attends its query rows to the key/value shard it
holds, then passes that shard to its right neighbour r + 1 and receives the next from its left
neighbour r - 1; at step t it holds the shard of device (r - t) mod n, so after n steps it has
seen every key exactly once, its own first.

Each block (a query chunk against a key chunk) is the unsharded contract on those rows and keys
alone: its own softmax, normalized over its own keys, returned with the row log-sum-exp
``lse = log(sum_j exp(s_ij))`` of its scores. Two partial results for the same rows over
disjoint keys merge exactly: the union's ``lse`` is ``log(exp(lse_a) + exp(lse_b))`` and its
output is ``exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b``: each partial softmax
reweighted by its share of the union's total mass. A block in which a row sees no key has
``lse = -inf``, a share of zero, and changes nothing; a row that sees no key anywhere stays zero
(the contract's fully masked row). The order of the merges does not matter.

Under ``is_causal`` a block whose first key is past its last row's diagonal is entirely masked
and is skipped (``attention_spec.sharded.block_visible``). With the contiguous layout and L = S,
device r then computes r + 1 of its n steps: device n - 1 does n blocks while device 0 waits
after one, and every step lasts as long as its busiest device. With zigzag, each device holds an
early and a late chunk: at every step after the first it computes exactly two of its four
chunk pairs (the early rows see a whole earlier key chunk, or the late rows see both key chunks
of a later shard), so every device does the same work at every step. docs/SHARDED.md draws both.

**Head-parallel attention** (Megatron-style tensor parallelism). Device r holds the key/value
heads ``r*K/n .. (r+1)*K/n - 1`` and the query heads that read them, which with contiguous
groups (query head h reads key/value head h // G) are ``r*H/n .. (r+1)*H/n - 1``; it runs the
unsharded contract on its heads, and the outputs are concatenated along H. In the module
(:func:`head_parallel_gqa`) each device also holds the projection columns of its heads and the
output projection's rows for them; its partial output projections are summed (all-reduce).

**Ulysses** (all-to-all sequence parallelism, DeepSpeed-Ulysses). Device r starts with a
contiguous 1/n of the positions of every head; an all-to-all (one list operation:
:func:`_all_to_all`) gives it every position of the query heads ``r*H/n .. (r+1)*H/n - 1`` and
of the key/value heads they read (split when ``K % n == 0``; when ``n % K == 0`` each key/value
head goes to the n / K devices of its group, never torn apart); it runs the unsharded contract
on them, and a second all-to-all gives every device its positions back, every head.

All three equal ``impl_numpy.functional.scaled_dot_product_attention`` on every input they accept
(tests/test_sharded.py holds them to the golden bounds).

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``), H query
heads, K key/value heads, G = H // K, L query length, S key/value length, D query/key head dim,
E value head dim, M model width; n = ``n_shards``, r a device, t a ring step, c chunks per shard
(1 contiguous, 2 zigzag), Lc = L / (c n) and Sc = S / (c n) the rows and keys of one chunk.
"""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
import numpy as np

from attention_spec import causal_offset, check_attention
from attention_spec.modules import check_module_inputs
from attention_spec.rules import alibi
from attention_spec.sharded import (
    RingLayout,
    RingStep,
    UlyssesExchange,
    UspPlan,
    block_computed,
    check_head_parallel,
    check_ring,
    check_shard_config,
    check_ulysses,
    check_usp,
    check_usp_config,
)
from impl_numpy.flash import _block
from impl_numpy.functional import (
    _allowed,
    _asarray,
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


@np.errstate(invalid="ignore")  # a +inf score allowed makes its row NaN (the contract), quietly
def _attend_block(q, k, v, q_pos, k_pos, mask, bias, q_ids, kv_ids, *, dims, offset, slopes):
    """Steps 1-6 of the contract for one block: the query rows at positions ``q_pos`` ``(Lc,)``
    against the keys at positions ``k_pos`` ``(Sc,)``, and nothing else.

    ``q (..., K, G, Lc, D)``, ``k (..., K, 1, Sc, D)``, ``v (..., K, 1, Sc, E)`` in the compute
    dtype; ``mask``, ``bias``, ``q_ids (..., Lc)`` and ``kv_ids (..., Sc)`` this block's slices
    (or broadcastable whole, or None); ``slopes (H,)`` ALiBi's, or None. The sink is not here: it
    joins once, after the last block (R6). Returns
    ``(out, lse)``: the block's attention output ``(..., H, Lc, E)``, normalized over these keys
    only, and its row log-sum-exp ``(..., H, Lc)``; a row with no allowed key here has zero
    output and ``lse = -inf``. The same steps as ``impl_numpy/flash.py``'s block, which keeps a
    running ``(m, l, acc)`` instead of normalizing each block.
    """
    H, K, G, E = dims.H, dims.K, dims.G, dims.E
    Lc, Sc = q.shape[-2], k.shape[-2]

    # 4. allowed, this block: mask AND causal AND window AND segment, at the rows' and keys'
    #    places in the whole sequence. Key and value rows no row of the block attends are zeroed.
    i, j = q_pos[:, None], k_pos[None, :]  # (Lc, 1), (1, Sc)
    allowed = _allowed(dims, offset, i, j, mask, q_ids, kv_ids)  # (..., Lc|1, Sc|1) or None
    attended = _attended(allowed, bias, (*dims.batch, H, Lc, Sc), K)  # (..., K, Sc)
    attended = None if attended is None else attended[..., None, :]  # (..., K, 1, Sc)
    k = _unattended_zeroed(k, attended)  # (..., K, 1, Sc, D)
    v = _unattended_zeroed(v, attended)  # (..., K, 1, Sc, E)

    # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G.
    s = q @ np.swapaxes(k, -1, -2)  # (..., K, G, Lc, Sc)
    s = s.reshape(*s.shape[:-4], H, Lc, Sc)  # (..., H, Lc, Sc); head h reads kv head h // G
    if s.shape[:-3] != dims.batch:  # a mask, bias or value with more batch than query and key
        s = np.broadcast_to(s, (*dims.batch, H, Lc, Sc)).copy()
    s *= dims.scale

    # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
    if dims.softcap is not None:
        s /= dims.softcap
        np.tanh(s, out=s)
        s *= dims.softcap

    # 3. additive terms: this block's slice of the bias, may hold -inf, and ALiBi's
    #    -slope[h] * |i + offset - j| at the block's places in the whole sequence.
    if bias is not None:
        s += bias
    if slopes is not None:
        s += alibi(slopes[:, None, None], i, j, offset)  # (H, Lc, Sc)

    # 4. allowed: s = -inf where allowed(i, j) is False, in this block.
    if allowed is not None:
        np.copyto(s, -np.inf, where=~allowed)

    # 5. softmax over this block's keys, stable, and its row log-sum-exp: lse = m + log(l); a
    #    row with no allowed key here has l = 0: weights 0 / 1 = 0, lse = -inf + log 1 = -inf.
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., H, Lc, 1)
    s -= np.where(m == -np.inf, 0.0, m)  # no allowed key here: exp(-inf - 0) = 0, not NaN
    np.minimum(s, 0.0, out=s)  # exp(s - max) <= 1 even if s was rounded differently
    p = np.exp(s, out=s)  # (..., H, Lc, Sc)
    l = p.sum(axis=-1, keepdims=True)  # (..., H, Lc, 1)
    l[l == 0.0] = 1.0
    p /= l
    lse = (m + np.log(l))[..., 0]  # (..., H, Lc)

    # 6. output = weights @ value, per group.
    w = p.reshape(*p.shape[:-3], K, G, Lc, Sc)  # (..., K, G, Lc, Sc)
    out = (w @ v).reshape(*dims.batch, H, Lc, E)  # (..., H, Lc, E)
    return out, lse


@np.errstate(invalid="ignore")  # a +inf score allowed makes its row NaN (the contract), quietly
def _merge(out, lse, out_blk, lse_blk):
    """Merge two partial results for the same rows over disjoint keys into their union's.

    ``lse = log(exp(lse) + exp(lse_blk))``; ``out = exp(lse_old - lse) * out +
    exp(lse_blk - lse) * out_blk``. Computed around the larger of the two (a stable
    log-sum-exp); a side with ``lse = -inf`` has share 0, and a row with ``-inf`` on both sides
    stays zero with ``lse = -inf``. out ``(..., H, Lc, E)``, lse ``(..., H, Lc)``.
    """
    top = np.maximum(lse, lse_blk)  # (..., H, Lc)
    top = np.where(top == -np.inf, 0.0, top)  # both -inf: exp(-inf - 0) = 0, not NaN
    a, b = np.exp(lse - top), np.exp(lse_blk - top)  # each side's mass, relative to the top
    total = a + b
    seen = total > 0.0
    total = np.where(seen, total, 1.0)
    new_lse = np.where(seen, top + np.log(total), -np.inf)
    out = (a / total)[..., None] * out + (b / total)[..., None] * out_blk  # shares sum to 1
    return out, new_lse


def ring_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    n_shards: int,
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
    stats: list[RingStep] | None = None,
) -> np.ndarray:
    """``scaled_dot_product_attention`` on ``n_shards`` simulated devices in a ring,
    shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        n_shards: n, the devices of the ring; n (contiguous) or 2n (zigzag) must divide L and S.
        layout: ``"contiguous"`` (device r holds chunk r of n) or ``"zigzag"`` (chunks r and
            2n - 1 - r of 2n, which balances causal work).
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in
            :func:`impl_numpy.functional.attention_weights`. Mask, bias and ``q_segment_ids``
            are held by rows: each device keeps the rows of its query shard (with every
            column). ``kv_segment_ids`` (S integers, like a mask row) is held whole by every
            device; only key and value travel. ALiBi is computed per block at the block's
            places in the whole sequence; the sink joins each row once, after the last block.
        stats: a list to append one :class:`~attention_spec.sharded.RingStep` per device and
            step to (the blocks computed, the bytes sent), or None.

    Returns the output in the query's dtype; rows with no allowed key are zeros.

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``,
    ``unknown_layout``; DimensionMismatchError ``length_not_divisible``.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    check_shard_config(n_shards, layout)
    call = check_attention(query, key, value, **kw)
    mask, bias, sinks, slopes = kw["mask"], kw["bias"], kw["sinks"], kw["alibi_slopes"]
    q_ids, kv_ids = kw["q_segment_ids"], kw["kv_segment_ids"]
    ring = check_ring(call, n_shards, layout)
    ct = _compute_dtype(query.dtype)
    n, chunks, Lc, Sc = ring.n, ring.chunks, ring.Lc, ring.Sc
    H, K, G, L, D, E = call.H, call.K, call.G, call.L, call.D, call.E
    offset = call.offset  # query i sees key j iff j <= i + offset
    if L == 0 or call.S == 0:  # no rows, or no keys (every row fully masked): nothing to ring
        return np.zeros((*call.batch, H, L, E), query.dtype)

    # R1. split: device r keeps its query chunks (and their rows of mask, bias and query
    #     segment ids) for the whole call, and starts with its own key/value shard, the key
    #     chunks of the same numbers. Keys and values travel in the input dtype; each block
    #     computes in the compute dtype.
    q = query.astype(ct, copy=False).reshape(*query.shape[:-3], K, G, L, D)  # (..., K, G, L, D)
    bias, sinks, slopes = _cast(bias, ct), _cast(sinks, ct), _cast(slopes, ct)
    queries = [[q[..., a * Lc : (a + 1) * Lc, :] for a in chunks[r]] for r in range(n)]
    mask_rows = [[_block(mask, -2, a * Lc, (a + 1) * Lc) for a in chunks[r]] for r in range(n)]
    bias_rows = [[_block(bias, -2, a * Lc, (a + 1) * Lc) for a in chunks[r]] for r in range(n)]
    q_ids_rows = [[_block(q_ids, -1, a * Lc, (a + 1) * Lc) for a in chunks[r]] for r in range(n)]
    held = [
        (
            np.concatenate([key[..., b * Sc : (b + 1) * Sc, :] for b in chunks[r]], axis=-2),
            np.concatenate([value[..., b * Sc : (b + 1) * Sc, :] for b in chunks[r]], axis=-2),
        )
        for r in range(n)
    ]  # device r: key (..., K, c*Sc, D), value (..., K, c*Sc, E)

    # R2. the ring: every query chunk starts with nothing seen (output 0, row log-sum-exp
    #     -inf); n steps, at each of which every device attends to the shard it holds.
    outs = [[np.zeros((*call.batch, H, Lc, E), ct) for _ in chunks[r]] for r in range(n)]
    lses = [[np.full((*call.batch, H, Lc), -np.inf, ct) for _ in chunks[r]] for r in range(n)]
    for t in range(n):
        arriving = list(held)  # what each device holds at step t + 1
        for r in range(n):  # every device, at the same step
            # R3. step t: device r holds the key/value shard of device src = (r - t) mod n.
            src = (r - t) % n
            k_shard, v_shard = held[r]

            # R4. rotate, started: device r sends the shard it holds to its right neighbour
            #     r + 1 (and receives its left neighbour's); a device starts the transfer now,
            #     and the blocks below do not wait for it. The last step sends nothing.
            if t < n - 1:
                arriving[(r + 1) % n] = held[r]

            # 4. allowed, whole blocks: each query chunk of the device meets each key chunk it
            #    holds; a block outside the causal or window band of its rows, or whose
            #    segments cannot meet theirs, is masked for every row, and skipped.
            blocks = []
            for a, q_chunk in enumerate(chunks[r]):  # its query chunks
                q_pos = q_chunk * Lc + np.arange(Lc)  # (Lc,) their rows in the sequence
                for b, k_chunk in enumerate(chunks[src]):  # the key chunks it holds
                    cols = (k_chunk * Sc, (k_chunk + 1) * Sc)  # its columns of mask and bias
                    kv_ids_blk = _block(kv_ids, -1, *cols)  # (..., Sc): its keys' segments
                    if not block_computed(
                        call, offset, q_chunk, k_chunk, Lc, Sc, q_ids_rows[r][a], kv_ids_blk
                    ):
                        continue
                    k_pos = k_chunk * Sc + np.arange(Sc)  # (Sc,) their keys in the sequence
                    k = k_shard[..., b * Sc : (b + 1) * Sc, :].astype(ct)[..., :, None, :, :]
                    v = v_shard[..., b * Sc : (b + 1) * Sc, :].astype(ct)[..., :, None, :, :]
                    out_blk, lse_blk = _attend_block(
                        queries[r][a], k, v, q_pos, k_pos,
                        _block(mask_rows[r][a], -1, *cols), _block(bias_rows[r][a], -1, *cols),
                        q_ids_rows[r][a], kv_ids_blk, dims=call, offset=offset, slopes=slopes,
                    )  # fmt: skip

                    # R5. merge: the block into what this query chunk has seen, by their lse.
                    outs[r][a], lses[r][a] = _merge(outs[r][a], lses[r][a], out_blk, lse_blk)
                    blocks.append((q_chunk, k_chunk))
            if stats is not None:
                sent = k_shard.nbytes + v_shard.nbytes if t < n - 1 else 0
                stats.append(RingStep(t, r, src, tuple(blocks), sent))

        # R4. (end) rotate, finished: every device now holds the shard its left neighbour sent.
        held = arriving

    # R6. sink: the sink joins each row once, as one more block with a zero value and
    #     lse = sinks[h] (a row that saw no key stays zero).
    if sinks is not None:
        for r in range(n):
            for a in range(len(chunks[r])):
                sink = np.broadcast_to(sinks[:, None], lses[r][a].shape)  # (..., H, Lc)
                outs[r][a], _ = _merge(outs[r][a], lses[r][a], 0.0, sink)

    # R7. gather: each device's query chunks back to their rows; one rounding to the input dtype.
    out = np.empty((*call.batch, H, L, E), ct)  # (..., H, L, E)
    for r in range(n):
        for a, q_chunk in enumerate(chunks[r]):
            out[..., q_chunk * Lc : (q_chunk + 1) * Lc, :] = outs[r][a]
    return out.astype(query.dtype, copy=False)


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
                     group.__getitem__)  # fmt: skip


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
                                 stats))  # fmt: skip
        v_heads.append(_in_group("value", [values_held[g] for g in group], to_kv_heads, group,
                                 -2, stats))  # fmt: skip

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


def head_parallel_attention(
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
) -> np.ndarray:
    """``scaled_dot_product_attention`` with its K key/value heads split over ``n_shards``
    simulated devices, shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        n_shards: n, which must divide K; device r holds key/value heads ``r*K/n ..`` and query
            heads ``r*H/n ..`` (the query heads that read them: contiguous groups).
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in
            :func:`impl_numpy.functional.attention_weights`; a head axis of size H (of mask
            or bias) is split with the query heads, one of size 1 is kept whole; sinks and
            ALiBi slopes ``(H,)`` are split with the query heads; segment ids (no head axis)
            go whole to every device.

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``;
    DimensionMismatchError ``kv_heads_not_divisible``.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    check_shard_config(n_shards)
    call = check_attention(query, key, value, **kw)
    check_head_parallel(call.H, call.K, n_shards)
    n = n_shards
    Hn, Kn = call.H // n, call.K // n  # query and key/value heads per device

    # P1. split: device r holds key/value heads r*Kn .. (r+1)*Kn - 1 and the query heads that
    #     read them, r*Hn .. (r+1)*Hn - 1 (query head h reads kv head h // G).
    outs = []
    for r in range(n):
        heads, kv_heads = slice(r * Hn, (r + 1) * Hn), slice(r * Kn, (r + 1) * Kn)
        q, k, v = query[..., heads, :, :], key[..., kv_heads, :, :], value[..., kv_heads, :, :]
        # P2. attend: the unsharded contract on the device's heads (mask, bias, sinks and ALiBi
        #     slopes: its heads; segment ids: whole).
        on_heads = kw | {
            "mask": _block(kw["mask"], -3, heads.start, heads.stop),
            "bias": _block(kw["bias"], -3, heads.start, heads.stop),
            "sinks": _block(kw["sinks"], -1, heads.start, heads.stop),
            "alibi_slopes": _block(kw["alibi_slopes"], -1, heads.start, heads.stop),
        }  # the device's heads of mask, bias, sinks and slopes; every other keyword whole
        out = scaled_dot_product_attention(q, k, v, **on_heads)  # (..., Hn, L, E)
        outs.append(out)

    # P3. gather: the devices' heads, in order, along H.
    return np.concatenate(outs, axis=-3)  # (..., H, L, E)


def head_parallel_gqa(
    module,
    x: np.ndarray,
    context: np.ndarray | None = None,
    *,
    n_shards: int,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
) -> np.ndarray:
    """The forward pass of a ``GroupedQueryAttention`` (or ``MultiHeadAttention``) ``module``
    with its heads split over ``n_shards`` simulated devices, output ``(B, L, M)``.

    Megatron-style: device r holds the q_proj columns of its query heads and the k_proj and
    v_proj columns of its key/value heads (column-parallel), attends on its heads, and applies
    the o_proj rows of its heads' features (row-parallel), which gives a partial ``(B, L, M)``;
    the partials are summed (an all-reduce) in the compute dtype, then o_proj's bias is added
    once and the result cast to the module's dtype. The module's settings (window, softcap,
    scale, its ``sinks (H,)`` weight and ALiBi's slopes) apply on every device, the sinks and
    slopes split with the query heads.

    Args:
        module: an ``impl_numpy`` ``GroupedQueryAttention``; n_shards must divide its K.
        x, context, mask, bias, is_causal, causal_alignment, q_segment_ids, kv_segment_ids: as
            in the module's ``__call__`` (segment ids, with no head axis, go whole to every
            device).
    """
    x, context, mask, bias = _asarray(x), _asarray(context), _asarray(mask), _asarray(bias)
    q_ids, kv_ids = _asarray(q_segment_ids), _asarray(kv_segment_ids)
    check_shard_config(n_shards)
    dims = module.dims
    check_module_inputs(
        dims, module.dtype.name, x, context, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, q_segment_ids=q_ids, kv_segment_ids=kv_ids,
    )  # fmt: skip
    check_head_parallel(dims.H, dims.K, n_shards)
    context = x if context is None else context
    w = module.to_canonical()
    ct = _compute_dtype(module.dtype)
    settings = module._option_keywords()  # window, softcap, scale, sinks (H,), alibi_slopes (H,)
    sinks, slopes = settings.pop("sinks"), settings.pop("alibi_slopes")
    n, D, E = n_shards, dims.D, dims.E
    Hn, Kn = dims.H // n, dims.K // n  # query and key/value heads per device
    B, L, _ = x.shape
    S = context.shape[1]

    # P1. split the projections: device r's columns of q_proj (query heads r*Hn ..), k_proj
    #     and v_proj (key/value heads r*Kn ..); head h owns features [h*D:(h+1)*D].
    def project(inp, name, features):
        """``inp @ kernel[:, features] + bias[features]``, rounded to the module's dtype."""
        y = inp @ w[f"{name}.kernel"][:, features]
        if f"{name}.bias" in w:
            y = y + w[f"{name}.bias"][features]
        return y.astype(inp.dtype, copy=False)

    partials = []
    for r in range(n):
        q = project(x, "q_proj", slice(r * Hn * D, (r + 1) * Hn * D))  # (B, L, Hn*D)
        k = project(context, "k_proj", slice(r * Kn * D, (r + 1) * Kn * D))  # (B, S, Kn*D)
        v = project(context, "v_proj", slice(r * Kn * E, (r + 1) * Kn * E))  # (B, S, Kn*E)
        q = q.reshape(B, L, Hn, D).transpose(0, 2, 1, 3)  # (B, Hn, L, D)
        k = k.reshape(B, S, Kn, D).transpose(0, 2, 1, 3)  # (B, Kn, S, D)
        v = v.reshape(B, S, Kn, E).transpose(0, 2, 1, 3)  # (B, Kn, S, E)
        #     RoPE (the module's rope_theta), as in its forward: per head, so per device too.
        q, k = module._rotate(q, k, causal_offset(L, S, causal_alignment), 0)

        # P2. attend on its heads: the device's, the unsharded contract with the module's settings
        #     (mask, bias, sinks and ALiBi slopes: its heads; segment ids: whole).
        heads = slice(r * Hn, (r + 1) * Hn)
        out = scaled_dot_product_attention(
            q,
            k,
            v,
            mask=_block(mask, -3, heads.start, heads.stop),
            bias=_block(bias, -3, heads.start, heads.stop),
            is_causal=is_causal,
            causal_alignment=causal_alignment,
            q_segment_ids=q_ids,
            kv_segment_ids=kv_ids,
            sinks=None if sinks is None else sinks[heads],
            alibi_slopes=None if slopes is None else slopes[heads],
            **settings,
        )  # (B, Hn, L, E)

        # P3. row-parallel output projection: the device's heads' features [r*Hn*E ..) meet
        #     the same rows of o_proj's kernel, a partial (B, L, M) in the compute dtype.
        merged = out.transpose(0, 2, 1, 3).reshape(B, L, Hn * E)  # (B, L, Hn*E)
        rows = w["o_proj.kernel"][r * Hn * E : (r + 1) * Hn * E, :]  # (Hn*E, M)
        partials.append(merged.astype(ct) @ rows.astype(ct))  # (B, L, M)

    # P4. all-reduce: the partials summed, in the compute dtype.
    y = sum(partials[1:], partials[0])  # (B, L, M)

    # P5. output bias: o_proj's bias added once, to the sum; one rounding to the dtype.
    if "o_proj.bias" in w:
        y = y + w["o_proj.bias"].astype(ct)
    return y.astype(module.dtype, copy=False)
