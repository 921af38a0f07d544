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

Ulysses and USP (all-to-all sequence parallelism) live in ``impl_numpy/ulysses.py``.

Both equal ``impl_numpy.functional.scaled_dot_product_attention`` on every input they accept
(tests/test_sharded.py holds them to the golden bounds).

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``), H query
heads, K key/value heads, G = H // K, L query length, S key/value length, D query/key head dim,
E value head dim, M model width; n = ``n_shards``, r a device, t a ring step, c chunks per shard
(1 contiguous, 2 zigzag), Lc = L / (c n) and Sc = S / (c n) the rows and keys of one chunk.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
import numpy as np

from attention_spec import causal_offset, check_attention
from attention_spec.modules import check_module_inputs
from attention_spec.rules import alibi
from attention_spec.sharded import (
    RingStep,
    block_computed,
    check_head_parallel,
    check_ring,
    check_shard_config,
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
                    )

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
    )
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
