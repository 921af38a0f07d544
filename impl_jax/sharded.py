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
  a ``lax.cond``, as in ``impl_jax/flash.py``. Steps 0 .. n-2 (send, then compute) are one
  ``lax.scan``, so the compiled program does not grow with n; the last step, which sends
  nothing, follows it. The c x c chunk pairs of a step are Python loops.
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
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from attention_spec import causal_offset, check_attention
from attention_spec.modules import check_module_inputs
from attention_spec.sharded import (
    RingLayout,
    block_visible,
    check_head_parallel,
    check_ring,
    check_shard_config,
    check_shard_devices,
)
from impl_jax.flash import _block
from impl_jax.functional import (
    _PRECISION,
    _compute_dtype,
    scaled_dot_product_attention,
)
from impl_jax.functional import STATIC_ARGNAMES as _SDPA_STATIC_ARGNAMES

__all__ = ["HEADS", "SEQ", "STATIC_ARGNAMES", "head_parallel_attention", "head_parallel_gqa",
           "ring_attention"]  # fmt: skip

#: The mesh axis names: the sequence (ring) and the heads (head-parallel).
SEQ, HEADS = "seq", "heads"

#: The keywords to mark static under ``jax.jit``: those of ``scaled_dot_product_attention`` and
#: the sharding, which decide the program XLA compiles.
STATIC_ARGNAMES: tuple[str, ...] = (*_SDPA_STATIC_ARGNAMES, "n_shards", "layout")


def _mesh(n_shards: int, axis: str) -> Mesh:
    """A one-axis mesh of the first ``n_shards`` devices (ConfigError when there are fewer)."""
    devices = jax.devices()
    check_shard_devices(
        n_shards, len(devices),
        f"JAX sees {len(devices)} {jax.default_backend()} device(s). On a CPU, set "
        f"XLA_FLAGS=--xla_force_host_platform_device_count={n_shards} before JAX starts; "
        "on several hosts, call jax.distributed.initialize() first",
        exact=False,
    )  # fmt: skip
    return Mesh(np.array(devices[:n_shards]), (axis,))


def _spec(x: jax.Array, axis: int, name: str) -> P:
    """Split ``x`` along ``axis`` (-2: L or S, -3: heads) over the mesh axis ``name``; an array
    without that axis, or with size 1 there (a broadcasting mask or bias), goes whole to every
    device."""
    if x.ndim < -axis or x.shape[axis] == 1:
        return P()
    return P(*([None] * (x.ndim + axis)), name, *([None] * (-axis - 1)))


def _attend_block(q, k, v, q_pos, k_pos, mask, bias, *, dims, is_causal, offset, softcap):
    """Steps 1-7 of the contract for one block: the query rows at positions ``q_pos`` ``(Lc,)``
    against the keys at positions ``k_pos`` ``(Sc,)``, and nothing else.

    ``q (..., K, G, Lc, D)``, ``k (..., K, Sc, D)``, ``v (..., K, Sc, E)`` in the compute
    dtype; ``mask`` and ``bias`` this block's slices (or broadcastable whole). Returns
    ``(out, lse)``: the block's attention output ``(..., H, Lc, E)``, normalized over these keys
    only, and its row log-sum-exp ``(..., H, Lc)``; a row that sees no key here has zero output
    and ``lse = -inf``.
    """
    H, K, G, E = dims.H, dims.K, dims.G, dims.E
    Lc, Sc = q.shape[-2], k.shape[-2]

    # 1. scores = (query @ key^T) * scale, one group of G query heads per key/value head.
    s = jnp.einsum("...kgld,...ksd->...kgls", q, k, precision=_PRECISION)  # (..., K, G, Lc, Sc)
    s = s.reshape(*s.shape[:-4], H, Lc, Sc) * dims.scale  # (..., H, Lc, Sc); h reads kv h // G
    s = jnp.broadcast_to(s, (*dims.batch, H, Lc, Sc))  # a mask, bias or value with more batch

    # 2. softcap: s = softcap * tanh(s / softcap), before any bias or mask.
    if softcap is not None:
        s = softcap * jnp.tanh(s / softcap)

    # 3. bias: this block's slice of it is added, may hold -inf.
    if bias is not None:
        s = s + bias

    # 4. mask: False -> -inf, this block's slice of it.
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)

    # 5. causal, at the rows' and keys' places in the whole sequence: j <= i + offset.
    if is_causal:
        s = jnp.where(k_pos[None, :] <= q_pos[:, None] + offset, s, -jnp.inf)

    # 6. softmax over this block's keys, stable, and its row log-sum-exp lse = m + log(l).
    m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))  # (..., H, Lc, 1)
    m = jnp.where(jnp.isfinite(m), m, 0.0)  # a row with no key here: exp(-inf - 0) = 0
    e = jnp.exp(s - m)  # (..., H, Lc, Sc)
    l = jnp.sum(e, axis=-1, keepdims=True)  # (..., H, Lc, 1)
    seen = l > 0.0
    l = jnp.where(seen, l, 1.0)  # no key here: weights 0 / 1 = 0, and lse = -inf below
    lse = jnp.where(seen, m + jnp.log(l), -jnp.inf)[..., 0]  # (..., H, Lc)
    w = e / l

    # 7. output = weights @ value, per group.
    w = w.reshape(*w.shape[:-3], K, G, Lc, Sc)  # (..., K, G, Lc, Sc)
    out = jnp.einsum("...kgls,...kse->...kgle", w, v, precision=_PRECISION)  # (..., K, G, Lc, E)
    return out.reshape(*dims.batch, H, Lc, E), lse


def _merge(out, lse, out_blk, lse_blk):
    """Merge two partial results for the same rows over disjoint keys into their union's.

    ``lse = log(exp(lse) + exp(lse_blk))``; ``out = exp(lse_old - lse) * out +
    exp(lse_blk - lse) * out_blk``. Computed around the larger of the two (a stable
    log-sum-exp); a side with ``lse = -inf`` has share 0, and a row with ``-inf`` on both sides
    stays zero with ``lse = -inf``. out ``(..., H, Lc, E)``, lse ``(..., H, Lc)``.
    """
    top = jax.lax.stop_gradient(jnp.maximum(lse, lse_blk))  # (..., H, Lc)
    top = jnp.where(jnp.isfinite(top), top, 0.0)  # both -inf: exp(-inf - 0) = 0, not NaN
    a, b = jnp.exp(lse - top), jnp.exp(lse_blk - top)  # each side's mass, relative to the top
    total = a + b
    seen = total > 0.0
    total = jnp.where(seen, total, 1.0)
    new_lse = jnp.where(seen, top + jnp.log(total), -jnp.inf)
    out = (a / total)[..., None] * out + (b / total)[..., None] * out_blk  # shares sum to 1
    return out, new_lse


def _ring_device(x, *, ring: RingLayout, dims, is_causal, offset, softcap):
    """What device r does: ``x`` holds its query shard ``(..., H, c*Lc, D)``, its rows of mask
    and bias, and its own key/value shard ``(..., K, c*Sc, D|E)``; returns its output rows
    ``(..., H, c*Lc, E)`` in the compute dtype."""
    n, c, Lc, Sc = ring.n, ring.c, ring.Lc, ring.Sc
    H, K, G, D, E = dims.H, dims.K, dims.G, dims.D, dims.E
    ct = _compute_dtype(x["query"].dtype)
    step = dict(dims=dims, is_causal=is_causal, offset=offset, softcap=softcap)
    r = jax.lax.axis_index(SEQ)  # this device
    chunks = jnp.asarray(ring.chunks)  # (n, c): the chunks of every shard

    # R1. split (done by shard_map): this device's query chunks, their rows of mask and bias,
    #     and its own key/value shard, which travels in the input dtype.
    q = x["query"].astype(ct)
    q = q.reshape(*q.shape[:-3], K, G, c * Lc, D)  # (..., K, G, c*Lc, D)
    mask, bias = x.get("mask"), x.get("bias")
    bias = None if bias is None else bias.astype(ct)
    k_shard, v_shard = x["key"], x["value"]  # (..., K, c*Sc, D), (..., K, c*Sc, E)

    # Every query chunk starts with nothing seen: output 0, row log-sum-exp -inf. (pcast marks
    # them as differing between devices, as they will: lax.cond wants both branches alike.)
    outs = [jnp.zeros((*dims.batch, H, Lc, E), ct) for _ in range(c)]
    lses = [jnp.full((*dims.batch, H, Lc), -jnp.inf, ct) for _ in range(c)]
    outs, lses = jax.lax.pcast((outs, lses), SEQ, to="varying")
    right = [(i, (i + 1) % n) for i in range(n)]  # device i sends to device i + 1

    def blocks(t, k_shard, v_shard, outs, lses):
        """R2-R3 of step t: this device's query chunks against the key/value shard it holds."""
        # R2. at step t this device holds the key/value shard of device src = (r - t) mod n.
        src = (r - t) % n
        outs, lses = list(outs), list(lses)
        for a in range(c):  # its query chunks
            q_chunk = chunks[r, a]
            q_pos = q_chunk * Lc + jnp.arange(Lc)  # (Lc,) their rows in the sequence
            q_blk = q[..., a * Lc : (a + 1) * Lc, :]  # (..., K, G, Lc, D)
            mask_rows, bias_rows = _block(mask, -2, a * Lc, Lc), _block(bias, -2, a * Lc, Lc)
            for b in range(c):  # the key chunks it holds
                k_chunk = chunks[src, b]
                k_pos = k_chunk * Sc + jnp.arange(Sc)  # (Sc,) their keys in the sequence
                blk = (
                    q_blk,
                    k_shard[..., b * Sc : (b + 1) * Sc, :].astype(ct),  # (..., K, Sc, D)
                    v_shard[..., b * Sc : (b + 1) * Sc, :].astype(ct),  # (..., K, Sc, E)
                    q_pos, k_pos,
                    _block(mask_rows, -1, k_chunk * Sc, Sc),  # its columns of mask and bias
                    _block(bias_rows, -1, k_chunk * Sc, Sc),
                )  # fmt: skip

                # R3. merge the block into what this query chunk has seen, by their lse.
                def attend(acc, blk=blk):
                    return _merge(*acc, *_attend_block(*blk, **step))

                if is_causal:  # 5. causal, whole blocks: a block above the diagonal is skipped.
                    visible = block_visible(q_chunk, k_chunk, Lc, Sc, offset)
                    outs[a], lses[a] = jax.lax.cond(visible, attend, lambda acc: acc,
                                                    (outs[a], lses[a]))  # fmt: skip
                else:
                    outs[a], lses[a] = attend((outs[a], lses[a]))
        return outs, lses

    def send_and_attend(carry, t):
        """Steps 0 .. n-2 of the ring: R4 issued first, then R2-R3 on the shard held."""
        k_shard, v_shard, outs, lses = carry
        # R4. send the held shard to the right neighbour, receive the left one's; the blocks
        #     below do not wait for it, so the transfer can run while they compute.
        k_next = jax.lax.ppermute(k_shard, SEQ, right)
        v_next = jax.lax.ppermute(v_shard, SEQ, right)
        outs, lses = blocks(t, k_shard, v_shard, outs, lses)
        return (k_next, v_next, outs, lses), None

    # The ring: steps 0 .. n-2 as one compiled loop (lax.scan: the program does not grow with
    # n), then the last step, which sends nothing: every device has then seen every shard.
    carry = (k_shard, v_shard, outs, lses)
    (k_shard, v_shard, outs, lses), _ = jax.lax.scan(send_and_attend, carry, jnp.arange(n - 1))
    outs, lses = blocks(n - 1, k_shard, v_shard, outs, lses)

    return jnp.concatenate(outs, axis=-2)  # (..., H, c*Lc, E)


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
) -> jax.Array:
    """``scaled_dot_product_attention`` on a ring of ``n_shards`` devices, shape
    ``(..., H, L, E)``, sharded along L over them.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        n_shards: n, the devices of the ring (the first n of ``jax.devices()``); n
            (contiguous) or 2n (zigzag) must divide L and S.
        layout: ``"contiguous"`` (device r holds chunk r of n) or ``"zigzag"`` (chunks r and
            2n - 1 - r of 2n, which balances causal work).
        mask, bias, is_causal, causal_alignment, scale, softcap: as in
            :func:`impl_jax.functional.attention_weights`; mask and bias are held by rows:
            each device keeps the rows of its query shard.

    Returns the output in the query's dtype; rows with no allowed key are zeros (zero gradient).

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``,
    ``unknown_layout``, ``shard_devices``; DimensionMismatchError ``length_not_divisible``.
    """
    query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    mask = None if mask is None else jnp.asarray(mask)
    bias = None if bias is None else jnp.asarray(bias)
    check_shard_config(n_shards, layout)
    dims = check_attention(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap,
    )  # fmt: skip
    is_causal, softcap = dims.is_causal, dims.softcap  # as Python values, checked
    ring = check_ring(dims, n_shards, layout)
    mesh = _mesh(n_shards, SEQ)
    H, L, S, E = dims.H, dims.L, dims.S, dims.E
    offset = causal_offset(L, S, causal_alignment)  # query i sees key j iff j <= i + offset
    if L == 0 or S == 0:  # no rows, or no keys (every row fully masked): nothing to ring
        return jnp.zeros((*dims.batch, H, L, E), query.dtype)

    # R1. split: rows (of query, mask, bias) and keys (of key, value) in shard order, then cut
    #     into n equal pieces along L and S by shard_map. Zigzag puts shard r's two chunks side
    #     by side; contiguous is already in shard order.
    rows = np.concatenate([np.arange(a * ring.Lc, (a + 1) * ring.Lc) for s in ring.chunks
                           for a in s])  # fmt: skip
    keys = np.concatenate([np.arange(b * ring.Sc, (b + 1) * ring.Sc) for s in ring.chunks
                           for b in s])  # fmt: skip
    x = {"query": query, "key": key, "value": value, "mask": mask, "bias": bias}
    x = {name: a for name, a in x.items() if a is not None}
    if layout == "zigzag":
        for name in x:
            along = keys if name in ("key", "value") else rows
            if x[name].ndim >= 2 and x[name].shape[-2] != 1:  # mask/bias rows, if not broadcast
                x[name] = jnp.take(x[name], along, axis=-2)
    specs = {name: _spec(a, -2, SEQ) for name, a in x.items()}
    device = partial(_ring_device, ring=ring, dims=dims, is_causal=is_causal, offset=offset,
                     softcap=softcap)  # fmt: skip
    out_spec = P(*([None] * (len(dims.batch) + 1)), SEQ, None)
    out = jax.shard_map(device, mesh=mesh, in_specs=(specs,), out_specs=out_spec)(x)

    # R5. gather: the output is one array sharded along L; zigzag's rows back in order.
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
) -> jax.Array:
    """``scaled_dot_product_attention`` with its K key/value heads split over ``n_shards``
    devices, shape ``(..., H, L, E)``, sharded along H over them.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        n_shards: n, which must divide K; device r holds key/value heads ``r*K/n ..`` and query
            heads ``r*H/n ..`` (the query heads that read them: contiguous groups).
        mask, bias, is_causal, causal_alignment, scale, softcap: as in
            :func:`impl_jax.functional.attention_weights`; a head axis of size H is split
            with the query heads, one of size 1 is kept whole.

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``,
    ``shard_devices``; DimensionMismatchError ``kv_heads_not_divisible``.
    """
    query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    mask = None if mask is None else jnp.asarray(mask)
    bias = None if bias is None else jnp.asarray(bias)
    check_shard_config(n_shards)
    dims = check_attention(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap,
    )  # fmt: skip
    is_causal, softcap = dims.is_causal, dims.softcap  # as Python values, checked
    check_head_parallel(dims.H, dims.K, n_shards)
    mesh = _mesh(n_shards, HEADS)

    # P1. split (by shard_map): device r holds key/value heads r*K/n .. and the query heads that
    #     read them, r*H/n .. (query head h reads kv head h // G); mask and bias: its heads.
    x = {"query": query, "key": key, "value": value, "mask": mask, "bias": bias}
    x = {name: a for name, a in x.items() if a is not None}
    specs = {name: _spec(a, -3, HEADS) for name, a in x.items()}

    def device(x):
        # P2. attend: the unsharded contract on the device's heads.
        return scaled_dot_product_attention(
            x["query"],
            x["key"],
            x["value"],
            mask=x.get("mask"),
            bias=x.get("bias"),
            is_causal=is_causal,
            causal_alignment=causal_alignment,
            scale=dims.scale,
            softcap=softcap,
        )  # (..., H/n, L, E)

    # P3. gather: the output is one array sharded along H, the devices' heads in order.
    out_spec = P(*([None] * len(dims.batch)), HEADS, None, None)
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
) -> jax.Array:
    """The forward pass of a ``GroupedQueryAttention`` (or ``MultiHeadAttention``) ``module``
    with its heads split over ``n_shards`` devices, output ``(B, L, M)``.

    Megatron-style: device r holds the q_proj columns of its query heads and the k_proj and
    v_proj columns of its key/value heads (column-parallel), attends on its heads, and applies
    the o_proj rows of its heads' features (row-parallel), which gives a partial ``(B, L, M)``;
    ``lax.psum`` sums the partials in the compute dtype, then o_proj's bias is added once and
    the result cast to the module's dtype.

    Args:
        module: an ``impl_jax`` ``GroupedQueryAttention``; n_shards must divide its K.
        x, context, mask, bias, is_causal, causal_alignment: as in the module's ``__call__``.
    """
    x = jnp.asarray(x)
    context = None if context is None else jnp.asarray(context)
    mask = None if mask is None else jnp.asarray(mask)
    bias = None if bias is None else jnp.asarray(bias)
    check_shard_config(n_shards)
    dims = module.dims
    check_module_inputs(
        dims, module.dtype.name, x, context, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment,
    )  # fmt: skip
    check_head_parallel(dims.H, dims.K, n_shards)
    mesh = _mesh(n_shards, HEADS)
    ct = _compute_dtype(module.dtype)
    n, D, E = n_shards, dims.D, dims.E
    Hn, Kn = dims.H // n, dims.K // n  # query and key/value heads per device
    o_bias = module.o_proj.bias

    # P1. split (by shard_map): device r's columns of q_proj (query heads r*Hn ..), k_proj and
    #     v_proj (key/value heads r*Kn ..), and its rows of o_proj; head h owns features
    #     [h*D:(h+1)*D], so an even cut of the columns is a cut by heads.
    a = {"x": x, "context": x if context is None else context, "mask": mask, "bias": bias}
    specs = {"x": P(), "context": P()}
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        proj = getattr(module, name)
        a[f"{name}.kernel"] = proj.kernel[...]  # (in, out)
        specs[f"{name}.kernel"] = P(HEADS, None) if name == "o_proj" else P(None, HEADS)
        if proj.bias is not None and name != "o_proj":
            a[f"{name}.bias"] = proj.bias[...]  # (out,)
            specs[f"{name}.bias"] = P(HEADS)
    a = {name: arr for name, arr in a.items() if arr is not None}
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

        # P2. attend on the device's heads.
        out = scaled_dot_product_attention(
            q,
            k,
            v,
            mask=a.get("mask"),
            bias=a.get("bias"),
            is_causal=is_causal,
            causal_alignment=causal_alignment,
        )  # (B, Hn, L, E)

        # P3. row-parallel output projection: the device's heads' features meet the same rows
        #     of o_proj's kernel, a partial (B, L, M) in the compute dtype.
        merged = out.transpose(0, 2, 1, 3).reshape(B, L, Hn * E)  # (B, L, Hn*E)
        partial_y = jnp.matmul(merged.astype(ct), a["o_proj.kernel"].astype(ct),
                               precision=_PRECISION)  # fmt: skip

        # P4. all-reduce: the partials summed over the devices.
        return jax.lax.psum(partial_y, HEADS)  # (B, L, M)

    y = jax.shard_map(device, mesh=mesh, in_specs=(specs,), out_specs=P())(a)
    if o_bias is not None:  # o_proj's bias once; one rounding to the dtype
        y = y + o_bias[...].astype(ct)
    return y.astype(module.dtype)
