"""Sharded attention in JAX: ``shard_map`` over a ``Mesh``, ring steps with ``lax.ppermute``.

The steps, names and comments of ``impl_numpy/sharded.py``, which is the specification (read its
docstring for the algorithm), on real devices: the first ``n_shards`` of ``jax.devices()`` make a
one-axis ``Mesh``, and ``jax.shard_map`` runs the per-device function :func:`_ring_device` (axis
``"seq"``) or the functional API itself (axis ``"heads"``) on each device's shard. What JAX asks
for:

- The ring's rotation is ``lax.ppermute`` with the pairs ``(i, i + 1 mod n)``, a
  collective-permute in the compiled program. It is issued before the step's blocks, which do
  not depend on it, so XLA may run the transfer of the next shard while they compute.
- A device finds its rank with ``lax.axis_index``, so which key shard it holds at step t
  (``(r - t) mod n``) and whether causal masking empties a block are traced values: the skip is
  a ``lax.cond``, as in ``impl_jax/flash.py``. One step is :func:`_ring_step`; steps 0 .. n-2
  (send, then compute) are one ``lax.scan`` of it, so the compiled program does not grow with
  n; the last step, which sends nothing, follows it. The c x c chunk pairs of a step are Python
  loops.
- Everything is pure and differentiable: ``jax.grad`` goes through the ring (``ppermute``'s
  transpose is the reverse rotation), and the gradients equal the unsharded ones
  (tests/test_sharded.py). jit with the static keywords of :data:`STATIC_ARGNAMES`::

      ring = jax.jit(ring_attention, static_argnames=STATIC_ARGNAMES)

- The functions take and return whole arrays in the natural order; ``shard_map`` cuts them along
  L and S (ring) or H and K (head-parallel) for the devices, and the result is one array sharded
  over them. With ``layout="zigzag"`` the rows are put in shard order first (shard r's two chunks
  side by side) and back after; a model that runs zigzag in every layer would keep its
  activations in shard order instead.
- Multi-host: after ``jax.distributed.initialize()`` in every process, ``jax.devices()`` lists
  every host's devices and the same code runs over them (docs/SHARDED.md, "Launching").

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``), H query
heads, K key/value heads, G = H // K, L query length, S key/value length, D query/key head dim,
E value head dim, M model width; n = ``n_shards``, r a device, t a ring step, c chunks per shard
(1 contiguous, 2 zigzag), Lc = L / (c n) and Sc = S / (c n) the rows and keys of one chunk.

Ulysses and USP (all-to-all sequence parallelism) live in ``impl_jax/ulysses.py``.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from attention_spec import ARRAY_KEYWORDS, causal_offset, check_attention
from attention_spec.modules import check_module_inputs
from attention_spec.rules import alibi
from attention_spec.sharded import (
    RingLayout,
    block_computed,
    check_head_parallel,
    check_ring,
    check_shard_config,
    check_shard_devices,
)
from impl_jax.flash import _block
from impl_jax.functional import (
    _PRECISION,
    _allowed,
    _as_given,
    _asarray,
    _attended,
    _cast,
    _check_x64,
    _compute_dtype,
    _converted,
    _min0,
    _on_device,
    _unattended_zeroed,
    scaled_dot_product_attention,
)
from impl_jax.functional import STATIC_ARGNAMES as _SDPA_STATIC_ARGNAMES

__all__ = [
    "HEADS",
    "SEQ",
    "STATIC_ARGNAMES",
    "ULY",
    "head_parallel_attention",
    "head_parallel_gqa",
    "ring_attention",
]

#: The mesh axis names: the sequence (ring) and the heads (head-parallel); USP's second axis,
#: the members of a Ulysses group.
SEQ, HEADS, ULY = "seq", "heads", "ulysses"

#: The keywords to mark static under ``jax.jit``: those of ``scaled_dot_product_attention`` and
#: the sharding, which decide the program XLA compiles.
STATIC_ARGNAMES: tuple[str, ...] = (*_SDPA_STATIC_ARGNAMES, "n_shards", "layout")


def _mesh(n_shards: int, axis: str) -> Mesh:
    """A one-axis mesh of the first ``n_shards`` devices (ConfigError when there are fewer)."""
    devices = jax.devices()
    check_shard_devices(
        n_shards,
        len(devices),
        f"JAX sees {len(devices)} {jax.default_backend()} device(s). On a CPU, set "
        f"XLA_FLAGS=--xla_force_host_platform_device_count={n_shards} before JAX starts; "
        "on several hosts, call jax.distributed.initialize() first",
        exact=False,
    )
    return Mesh(np.array(devices[:n_shards]), (axis,))


def _spec(x: jax.Array, axis: int, name: str) -> P:
    """Split ``x`` along ``axis`` (-2: L or S, -3: heads) over the mesh axis ``name``; an array
    without that axis, or with size 1 there (a broadcasting mask or bias), goes whole to every
    device."""
    if x.ndim < -axis or x.shape[axis] == 1:
        return P()
    return P(*([None] * (x.ndim + axis)), name, *([None] * (-axis - 1)))


def _attend_block(q, k, v, q_pos, k_pos, mask, bias, q_ids, kv_ids, *, dims, offset, slopes):
    """Steps 1-6 of the contract for one block: the query rows at positions ``q_pos`` ``(Lc,)``
    against the keys at positions ``k_pos`` ``(Sc,)``, and nothing else.

    ``q (..., K, G, Lc, D)``, ``k (..., K, Sc, D)``, ``v (..., K, Sc, E)`` in the compute
    dtype; ``mask``, ``bias``, ``q_ids (..., Lc)`` and ``kv_ids (..., Sc)`` this block's slices
    (or broadcastable whole, or None); ``slopes (H,)`` ALiBi's, or None. The sink is not here:
    it joins once, after the last block (R6). Returns
    ``(out, lse)``: the block's attention output ``(..., H, Lc, E)``, normalized over these keys
    only, and its row log-sum-exp ``(..., H, Lc)``; a row with no allowed key here has zero
    output and ``lse = -inf`` (and zero gradient). The same steps as ``impl_jax/flash.py``'s
    block, which keeps a running ``(m, l, acc)`` instead of normalizing each block.
    """
    H, K, G, E = dims.H, dims.K, dims.G, dims.E
    Lc, Sc = q.shape[-2], k.shape[-2]

    # 4. allowed, this block: mask AND causal AND window AND segment, at the rows' and keys'
    #    places in the whole sequence. Key and value rows no row of the block attends are zeroed.
    i, j = q_pos[:, None], k_pos[None, :]  # (Lc, 1), (1, Sc)
    allowed = _allowed(dims, offset, i, j, mask, q_ids, kv_ids)  # (..., Lc|1, Sc|1) or None
    attended = _attended(allowed, bias, (*dims.batch, H, Lc, Sc), K)  # (..., K, Sc)
    k = _unattended_zeroed(k, attended)  # (..., K, Sc, D)
    v = _unattended_zeroed(v, attended)  # (..., K, Sc, E)

    # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G. The scale
    #    goes on the block's queries, as in _weights (nothing between the matmul and the row
    #    max for XLA to recompute).
    s = jnp.einsum("...kgld,...ksd->...kgls", q * dims.scale, k, precision=_PRECISION)
    s = s.reshape(*s.shape[:-4], H, Lc, Sc)  # (..., H, Lc, Sc); h reads kv h // G

    # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
    if dims.softcap is not None:
        s = dims.softcap * jnp.tanh(s / dims.softcap)

    # 3. additive terms: this block's slice of the bias, may hold -inf, and ALiBi's
    #    -slope[h] * |i + offset - j| at the block's places in the whole sequence.
    if bias is not None:
        s = s + bias
    if slopes is not None:
        s = s + alibi(slopes[:, None, None], i, j, offset)  # (H, Lc, Sc)

    # 4. allowed: s = -inf where allowed(i, j) is False, in this block.
    if allowed is not None:
        s = jnp.where(allowed, s, -jnp.inf)
    s = jnp.broadcast_to(s, (*dims.batch, H, Lc, Sc))  # a mask, bias or value with more batch

    # 5. softmax over this block's keys, stable, and its row log-sum-exp: lse = m + log(l); a
    #    row with no allowed key here has l = 0: weights 0 / 1 = 0, lse = -inf + log 1 = -inf.
    m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))  # (..., H, Lc, 1), constant
    s = s - jnp.where(m == -jnp.inf, 0.0, m)  # no allowed key here: exp(-inf - 0) = 0, not NaN
    p = jnp.exp(_min0(s))  # (..., H, Lc, Sc); exp(s - m) <= 1 even if s was rounded differently
    l = jnp.sum(p, axis=-1, keepdims=True)  # (..., H, Lc, 1)
    l = jnp.where(l == 0.0, 1.0, l)
    p = p / l
    lse = (m + jnp.log(l))[..., 0]  # (..., H, Lc)

    # 6. output = weights @ value, per group.
    p = p.reshape(*p.shape[:-3], K, G, Lc, Sc)  # (..., K, G, Lc, Sc)
    out = jnp.einsum("...kgls,...kse->...kgle", p, v, precision=_PRECISION)  # (..., K, G, Lc, E)
    return out.reshape(*dims.batch, H, Lc, E), lse


def _merge(out, lse, out_blk, lse_blk):
    """Merge two partial results for the same rows over disjoint keys into their union's.

    ``lse = log(exp(lse) + exp(lse_blk))``; ``out = exp(lse_old - lse) * out +
    exp(lse_blk - lse) * out_blk``. Computed around the larger of the two (a stable
    log-sum-exp); a side with ``lse = -inf`` has share 0, and a row with ``-inf`` on both sides
    stays zero with ``lse = -inf``. out ``(..., H, Lc, E)``, lse ``(..., H, Lc)``.
    """
    top = jax.lax.stop_gradient(jnp.maximum(lse, lse_blk))  # (..., H, Lc)
    top = jnp.where(top == -jnp.inf, 0.0, top)  # both -inf: exp(-inf - 0) = 0, not NaN
    a, b = jnp.exp(lse - top), jnp.exp(lse_blk - top)  # each side's mass, relative to the top
    total = a + b
    seen = total > 0.0
    total = jnp.where(seen, total, 1.0)
    new_lse = jnp.where(seen, top + jnp.log(total), -jnp.inf)
    out = (a / total)[..., None] * out + (b / total)[..., None] * out_blk  # shares sum to 1
    return out, new_lse


def _unseen(q, k, v, q_pos, k_pos, mask, bias, q_ids, kv_ids, *, dims, offset, slopes):
    """A skipped block's ``(out, lse)``: zeros and -inf, which a merge leaves unchanged (marked
    as differing between devices, as :func:`_attend_block`'s result does: ``lax.cond`` wants
    both branches alike)."""
    out = jnp.zeros((*dims.batch, dims.H, q.shape[-2], dims.E), q.dtype)
    lse = jnp.full((*dims.batch, dims.H, q.shape[-2]), -jnp.inf, q.dtype)
    return _varying((out, lse), k)


def _varying(x, like):
    """``x`` marked as differing between devices along the mesh axes ``like`` differs along:
    the ring's axis, and in USP also the Ulysses axis (``lax.cond`` and ``lax.scan`` want
    their branches and carries alike)."""
    return jax.lax.pcast(x, tuple(sorted(jax.typeof(like).manual_axis_type.varying)), to="varying")


def _ring_device(x, *, ring: RingLayout, dims, offset):
    """What device r does: ``x`` holds its query shard ``(..., H, c*Lc, D)``, its rows of mask,
    bias and query segment ids, its own key/value shard ``(..., K, c*Sc, D|E)``, and whole: the
    key segment ids, sinks and ALiBi slopes; returns its output rows ``(..., H, c*Lc, E)`` in
    the compute dtype."""
    n, c, Lc, E = ring.n, ring.c, ring.Lc, dims.E
    ct = _compute_dtype(x["query"].dtype)
    q = x["query"].astype(ct)
    q = q.reshape(*q.shape[:-3], dims.K, dims.G, c * Lc, dims.D)  # (..., K, G, c*Lc, D)
    bias, sinks, slopes = (_cast(x.get(name), ct) for name in ("bias", "sinks", "alibi_slopes"))
    shard = dict(r=jax.lax.axis_index(SEQ), q=q, mask=x.get("mask"), bias=bias,
                 q_ids=x.get("q_segment_ids"), kv_ids=x.get("kv_segment_ids"), slopes=slopes,
                 ring=ring, dims=dims, offset=offset)

    # R2. the ring: every query chunk starts with nothing seen (output 0, row log-sum-exp
    #     -inf); steps 0 .. n-2 are one lax.scan (the program does not grow with n), then the
    #     last step, which sends nothing.
    outs = [jnp.zeros((*dims.batch, dims.H, Lc, E), ct) for _ in range(c)]
    lses = [jnp.full((*dims.batch, dims.H, Lc), -jnp.inf, ct) for _ in range(c)]
    outs, lses = _varying((outs, lses), x["key"])  # they differ between devices
    carry = (x["key"], x["value"], outs, lses)
    carry, _ = jax.lax.scan(partial(_ring_step, send=True, **shard), carry, jnp.arange(n - 1))
    (_, _, outs, lses), _ = _ring_step(carry, n - 1, send=False, **shard)

    # R6. sink: the sink joins each row once, as one more block with a zero value and
    #     lse = sinks[h] (a row that saw no key stays zero).
    if sinks is not None:
        for a in range(c):
            sink = jnp.broadcast_to(sinks[:, None], lses[a].shape)  # (..., H, Lc)
            outs[a], _ = _merge(outs[a], lses[a], jnp.zeros_like(outs[a]), sink)
    return jnp.concatenate(outs, axis=-2)  # (..., H, c*Lc, E)


def _ring_step(
    carry, t, *, send, r, q, mask, bias, q_ids, kv_ids, slopes, ring: RingLayout, dims, offset
):
    """Ring step t on device r (traced): this device's query chunks against the key/value shard
    it holds, while (``send``) that shard moves on to the right neighbour. ``carry``: the held
    shard ``(..., K, c*Sc, D|E)`` and the running ``(out, lse)`` of each query chunk."""
    k_shard, v_shard, outs, lses = carry
    n, c, Lc, Sc = ring.n, ring.c, ring.Lc, ring.Sc
    chunks = jnp.asarray(ring.chunks)  # (n, c): the chunks of every shard
    outs, lses = list(outs), list(lses)
    step = dict(dims=dims, offset=offset, slopes=slopes)
    # R3. step t: this device holds the key/value shard of device src = (r - t) mod n.
    src = (r - t) % n

    # R4. rotate, started: ppermute sends the held shard to the right neighbour (i -> i + 1)
    #     and receives the left one's; the blocks below do not use it, so XLA may run the
    #     transfer while they compute. The last step sends nothing.
    right = [(i, (i + 1) % n) for i in range(n)]
    k_next = jax.lax.ppermute(k_shard, SEQ, right) if send else k_shard
    v_next = jax.lax.ppermute(v_shard, SEQ, right) if send else v_shard

    # 4. allowed, whole blocks: each query chunk of the device meets each key chunk it holds; a
    #    block outside the causal or window band of its rows, or whose segments cannot meet
    #    theirs, is masked for every row, and skipped (lax.cond: the chunk numbers are traced).
    for a in range(c):  # its query chunks
        q_chunk = chunks[r, a]
        q_pos = q_chunk * Lc + jnp.arange(Lc)  # (Lc,) their rows in the sequence
        q_blk = q[..., a * Lc : (a + 1) * Lc, :]  # (..., K, G, Lc, D)
        mask_rows, bias_rows = _block(mask, -2, a * Lc, Lc), _block(bias, -2, a * Lc, Lc)
        q_ids_rows = _block(q_ids, -1, a * Lc, Lc)  # (..., Lc): their segments
        for b in range(c):  # the key chunks it holds
            k_chunk = chunks[src, b]
            kv_ids_blk = _block(kv_ids, -1, k_chunk * Sc, Sc)  # (..., Sc): its keys' segments
            blk = (
                q_blk,
                k_shard[..., b * Sc : (b + 1) * Sc, :].astype(q.dtype),  # (..., K, Sc, D)
                v_shard[..., b * Sc : (b + 1) * Sc, :].astype(q.dtype),  # (..., K, Sc, E)
                q_pos,
                k_chunk * Sc + jnp.arange(Sc),  # (Sc,) its keys in the sequence
                _block(mask_rows, -1, k_chunk * Sc, Sc),  # its columns of mask and bias
                _block(bias_rows, -1, k_chunk * Sc, Sc),
                q_ids_rows,
                kv_ids_blk,
            )
            some = block_computed(dims, offset, q_chunk, k_chunk, Lc, Sc, q_ids_rows, kv_ids_blk)
            if some is True:  # no causal, window or segment rule: every block is computed
                out_blk, lse_blk = _attend_block(*blk, **step)
            else:
                attend, skip = partial(_attend_block, **step), partial(_unseen, **step)
                out_blk, lse_blk = jax.lax.cond(some, attend, skip, *blk)

            # R5. merge: the block into what this query chunk has seen, by their lse.
            outs[a], lses[a] = _merge(outs[a], lses[a], out_blk, lse_blk)

    # R4. (end) rotate, finished: the shard received is the one held at the next step.
    return (k_next, v_next, outs, lses), None


def ring_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    n_shards: int,
    layout: str = "contiguous",
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    sinks: jax.Array | None = None,
    alibi_slopes: jax.Array | None = None,
) -> jax.Array:
    """``scaled_dot_product_attention`` on a ring of ``n_shards`` devices, shape
    ``(..., H, L, E)``, sharded along L over them.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        n_shards: n, the devices of the ring (the first n of ``jax.devices()``); n
            (contiguous) or 2n (zigzag) must divide L and S.
        layout: ``"contiguous"`` (device r holds chunk r of n) or ``"zigzag"`` (chunks r and
            2n - 1 - r of 2n, which balances causal work).
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in
            :func:`impl_jax.functional.attention_weights`. Mask, bias and ``q_segment_ids``
            are held by rows: each device keeps the rows of its query shard (with every
            column). ``kv_segment_ids`` (S integers, like a mask row) is held whole by every
            device; only key and value travel. ALiBi is computed per block at the block's
            places in the whole sequence; the sink joins each row once, after the last block.

    Returns the output in the query's dtype; rows with no allowed key are zeros (zero gradient).

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``,
    ``unknown_layout``, ``shard_devices``; DimensionMismatchError ``length_not_divisible``.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    check_shard_config(n_shards, layout)
    call = check_attention(query, key, value, **kw)
    ring = check_ring(call, n_shards, layout)
    _check_x64(query.dtype)
    mesh = _mesh(n_shards, SEQ)
    query, key, value, kw = _on_device(query, key, value, keywords=kw)
    mask, bias, sinks, slopes = kw["mask"], kw["bias"], kw["sinks"], kw["alibi_slopes"]
    q_ids, kv_ids = kw["q_segment_ids"], kw["kv_segment_ids"]
    H, L, S, E = call.H, call.L, call.S, call.E
    offset = call.offset  # query i sees key j iff j <= i + offset
    if L == 0 or S == 0:  # no rows, or no keys (every row fully masked): nothing to ring
        return jnp.zeros((*call.batch, H, L, E), query.dtype)

    # R1. split: rows (of query, mask, bias, query segment ids) and keys (of key, value) in
    #     shard order, then cut into n equal pieces along L and S by shard_map (in_specs),
    #     which runs _ring_device on each device's pieces; key segment ids, sinks and slopes go
    #     whole to every device. Zigzag puts shard r's two chunks side by side; contiguous is
    #     already in shard order.
    rows = np.concatenate(
        [np.arange(a * ring.Lc, (a + 1) * ring.Lc) for s in ring.chunks for a in s]
    )
    keys = np.concatenate(
        [np.arange(b * ring.Sc, (b + 1) * ring.Sc) for s in ring.chunks for b in s]
    )
    x = {"query": query, "key": key, "value": value, "mask": mask, "bias": bias}
    x = {name: a for name, a in x.items() if a is not None}
    if layout == "zigzag":
        for name in x:
            along = keys if name in ("key", "value") else rows
            if x[name].ndim >= 2 and x[name].shape[-2] != 1:  # mask/bias rows, if not broadcast
                x[name] = jnp.take(x[name], along, axis=-2)
    specs = {name: _spec(a, -2, SEQ) for name, a in x.items()}
    if q_ids is not None:  # rows along its last axis (L), unless it broadcasts there
        if layout == "zigzag" and q_ids.shape[-1] != 1:
            q_ids = jnp.take(q_ids, rows, axis=-1)
        split = q_ids.shape[-1] != 1
        x["q_segment_ids"] = q_ids
        specs["q_segment_ids"] = P(*([None] * (q_ids.ndim - 1)), SEQ) if split else P()
    whole = {"kv_segment_ids": kv_ids, "sinks": sinks, "alibi_slopes": slopes}
    for name, a in whole.items():
        if a is not None:
            x[name], specs[name] = a, P()
    device = partial(_ring_device, ring=ring, dims=call, offset=offset)
    out_spec = P(*([None] * (len(call.batch) + 1)), SEQ, None)
    out = jax.shard_map(device, mesh=mesh, in_specs=(specs,), out_specs=out_spec)(x)

    # R7. gather: the output is one array sharded along L (out_specs); zigzag's rows back in
    #     order; one rounding to the input dtype.
    if layout == "zigzag":
        out = jnp.take(out, np.argsort(rows), axis=-2)
    return out.astype(query.dtype)  # (..., H, L, E)


def head_parallel_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    n_shards: int,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    sinks: jax.Array | None = None,
    alibi_slopes: jax.Array | None = None,
) -> jax.Array:
    """``scaled_dot_product_attention`` with its K key/value heads split over ``n_shards``
    devices, shape ``(..., H, L, E)``, sharded along H over them.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        n_shards: n, which must divide K; device r holds key/value heads ``r*K/n ..`` and query
            heads ``r*H/n ..`` (the query heads that read them: contiguous groups).
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in
            :func:`impl_jax.functional.attention_weights`; a head axis of size H (of mask
            or bias) is split with the query heads, one of size 1 is kept whole; sinks and
            ALiBi slopes ``(H,)`` are split with the query heads; segment ids (no head axis)
            go whole to every device.

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``,
    ``shard_devices``; DimensionMismatchError ``kv_heads_not_divisible``.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    check_shard_config(n_shards)
    call = check_attention(query, key, value, **kw)
    check_head_parallel(call.H, call.K, n_shards)
    _check_x64(query.dtype)
    mesh = _mesh(n_shards, HEADS)
    query, key, value, kw = _on_device(query, key, value, keywords=kw)

    # P1. split: device r holds key/value heads r*K/n .. and the query heads that read them,
    #     r*H/n .. (query head h reads kv head h // G), cut by shard_map; mask, bias, sinks and
    #     ALiBi slopes: its heads; segment ids (no head axis): whole.
    x = {"query": query, "key": key, "value": value, "mask": kw["mask"], "bias": kw["bias"]}
    x = {name: a for name, a in x.items() if a is not None}
    specs = {name: _spec(a, -3, HEADS) for name, a in x.items()}
    per_head = {"sinks": kw["sinks"], "alibi_slopes": kw["alibi_slopes"]}
    whole = {"q_segment_ids": kw["q_segment_ids"], "kv_segment_ids": kw["kv_segment_ids"]}
    for name, a in (*per_head.items(), *whole.items()):
        if a is not None:
            x[name], specs[name] = a, P(HEADS) if name in per_head else P()

    def device(x):
        # P2. attend: the unsharded contract on the device's heads (mask, bias, sinks and ALiBi
        #     slopes: its heads; segment ids: whole).
        on_heads = kw | {name: x.get(name) for name in ARRAY_KEYWORDS}  # the device's pieces
        out = scaled_dot_product_attention(x["query"], x["key"], x["value"], **on_heads)
        return out  # (..., H/n, L, E)

    # P3. gather: the output is one array sharded along H, the devices' heads in order.
    out_spec = P(*([None] * len(call.batch)), HEADS, None, None)
    return jax.shard_map(device, mesh=mesh, in_specs=(specs,), out_specs=out_spec)(x)


def head_parallel_gqa(
    module,
    x: jax.Array,
    context: jax.Array | None = None,
    *,
    n_shards: int,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
) -> jax.Array:
    """The forward pass of a ``GroupedQueryAttention`` (or ``MultiHeadAttention``) ``module``
    with its heads split over ``n_shards`` devices, output ``(B, L, M)``.

    Megatron-style: device r holds the q_proj columns of its query heads and the k_proj and
    v_proj columns of its key/value heads (column-parallel), attends on its heads, and applies
    the o_proj rows of its heads' features (row-parallel), which gives a partial ``(B, L, M)``;
    ``lax.psum`` sums the partials in the compute dtype, then o_proj's bias is added once and
    the result cast to the module's dtype. The module's settings (window, softcap, scale,
    its ``sinks (H,)`` weight and ALiBi's slopes) apply on every device, the sinks and slopes
    split with the query heads.

    Args:
        module: an ``impl_jax`` ``GroupedQueryAttention``; n_shards must divide its K.
        x, context, mask, bias, is_causal, causal_alignment, q_segment_ids, kv_segment_ids: as
            in the module's ``__call__`` (segment ids, with no head axis, go whole to every
            device).
    """
    x, context, mask, bias = _as_given(x), _as_given(context), _as_given(mask), _as_given(bias)
    q_ids, kv_ids = _as_given(q_segment_ids), _as_given(kv_segment_ids)
    check_shard_config(n_shards)
    dims = module.dims
    check_module_inputs(
        dims, module.dtype.name, x, context, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, q_segment_ids=q_ids, kv_segment_ids=kv_ids,
    )
    check_head_parallel(dims.H, dims.K, n_shards)
    mesh = _mesh(n_shards, HEADS)
    x, context, mask, bias = _asarray(x), _asarray(context), _asarray(mask), _asarray(bias)
    q_ids, kv_ids = _asarray(q_ids), _asarray(kv_ids)
    ct = _compute_dtype(module.dtype)
    settings = module._option_keywords()  # window, softcap, scale, sinks (H,), alibi_slopes (H,)
    n, D, E = n_shards, dims.D, dims.E
    Hn, Kn = dims.H // n, dims.K // n  # query and key/value heads per device
    o_bias = module.o_proj.bias

    # P1. split the projections: device r's columns of q_proj (query heads r*Hn ..), k_proj and
    #     v_proj (key/value heads r*Kn ..), and its rows of o_proj, cut by shard_map; head h
    #     owns features [h*D:(h+1)*D], so an even cut of the columns is a cut by heads; the
    #     sinks and ALiBi slopes (H,): its heads; segment ids (no head axis): whole.
    a = {"x": x, "context": x if context is None else context, "mask": mask, "bias": bias}
    a |= {"sinks": settings.pop("sinks"), "alibi_slopes": settings.pop("alibi_slopes")}
    a |= {"q_segment_ids": q_ids, "kv_segment_ids": kv_ids}
    specs = {"x": P(), "context": P(), "sinks": P(HEADS), "alibi_slopes": P(HEADS)}
    specs |= {"q_segment_ids": P(), "kv_segment_ids": P()}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        proj = getattr(module, name)
        a[f"{name}.kernel"] = proj.kernel[...]  # (in, out)
        specs[f"{name}.kernel"] = P(HEADS, None) if name == "o_proj" else P(None, HEADS)
        if proj.bias is not None and name != "o_proj":
            a[f"{name}.bias"] = proj.bias[...]  # (out,)
            specs[f"{name}.bias"] = P(HEADS)
    a = {name: arr for name, arr in a.items() if arr is not None}
    specs = {name: spec for name, spec in specs.items() if name in a}
    for name in ("mask", "bias"):
        if name in a:
            specs[name] = _spec(a[name], -3, HEADS)

    def project(inp, a, name):
        """``inp @ kernel + bias`` on this device's columns, in the module's dtype."""
        y = jnp.matmul(inp, a[f"{name}.kernel"], precision=_PRECISION)
        return y + a[f"{name}.bias"] if f"{name}.bias" in a else y

    def device(a):
        B, L, _ = a["x"].shape
        S = a["context"].shape[1]
        q = project(a["x"], a, "q_proj").reshape(B, L, Hn, D).transpose(0, 2, 1, 3)
        k = project(a["context"], a, "k_proj").reshape(B, S, Kn, D).transpose(0, 2, 1, 3)
        v = project(a["context"], a, "v_proj").reshape(B, S, Kn, E).transpose(0, 2, 1, 3)
        # q (B, Hn, L, D), k (B, Kn, S, D), v (B, Kn, S, E)
        #     RoPE (the module's rope_theta), as in its forward: per head, so per device too.
        q, k = module._rotate(q, k, causal_offset(L, S, causal_alignment), 0)

        # P2. attend on its heads: the device's, the unsharded contract with the module's settings
        #     (mask, bias, sinks and ALiBi slopes: its heads; segment ids: whole).
        out = scaled_dot_product_attention(
            q,
            k,
            v,
            mask=a.get("mask"),
            bias=a.get("bias"),
            is_causal=is_causal,
            causal_alignment=causal_alignment,
            q_segment_ids=a.get("q_segment_ids"),
            kv_segment_ids=a.get("kv_segment_ids"),
            sinks=a.get("sinks"),
            alibi_slopes=a.get("alibi_slopes"),
            **settings,
        )  # (B, Hn, L, E)

        # P3. row-parallel output projection: the device's heads' features meet the same rows
        #     of o_proj's kernel, a partial (B, L, M) in the compute dtype.
        merged = out.transpose(0, 2, 1, 3).reshape(B, L, Hn * E)  # (B, L, Hn*E)
        partial_y = jnp.matmul(
            merged.astype(ct), a["o_proj.kernel"].astype(ct), precision=_PRECISION
        )

        # P4. all-reduce: the partials summed over the devices, in the compute dtype.
        return jax.lax.psum(partial_y, HEADS)  # (B, L, M)

    # P5. output bias: o_proj's bias added once, to the sum (shard_map returns it, the same on
    #     every device: out_specs=P()); one rounding to the dtype.
    y = jax.shard_map(device, mesh=mesh, in_specs=(specs,), out_specs=P())(a)  # (B, L, M)
    if o_bias is not None:
        y = y + o_bias[...].astype(ct)
    return y.astype(module.dtype)
