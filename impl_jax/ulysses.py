"""All-to-all sequence parallelism in JAX: Ulysses and USP, ``shard_map`` with ``lax.all_to_all``.

The steps, names and comments of ``impl_numpy/ulysses.py``, which is the specification (read its
docstring for the algorithm), on real devices: the first ``n_shards`` (Ulysses) or ``u * r``
(USP, a 2-D mesh ``(r, u)``, axes ``"seq"`` and ``"ulysses"``) of ``jax.devices()`` make the
``Mesh``. The ring that USP runs across its groups is ``impl_jax/sharded.py``'s. What JAX asks
for:

- Everything is pure and differentiable; jit with the static keywords of
  :data:`ULYSSES_STATIC_ARGNAMES` or :data:`USP_STATIC_ARGNAMES`.
- The functions take and return whole arrays in the natural order; ``shard_map`` cuts them along
  L and S for the devices, and the result is one array sharded over them.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``), H query
heads, K key/value heads, G = H // K, L query length, S key/value length, D query/key head dim,
E value head dim; n = ``n_shards``, Lc = L / n and Sc = S / n the rows and keys a device starts
with; u = ``ulysses_shards`` and r = ``ring_shards`` (USP), Lm and Sm a device's rows and keys.
"""

from __future__ import annotations

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from attention_spec import ARRAY_KEYWORDS, check_attention
from attention_spec.sharded import (
    RingLayout,
    check_shard_config,
    check_ulysses,
    check_usp,
    check_usp_config,
)
from impl_jax.functional import STATIC_ARGNAMES as _SDPA_STATIC_ARGNAMES
from impl_jax.functional import (
    _check_x64,
    _converted,
    _on_device,
    scaled_dot_product_attention,
)
from impl_jax.sharded import SEQ, ULY, _mesh, _ring_device, _spec

__all__ = [
    "ULYSSES_STATIC_ARGNAMES",
    "USP_STATIC_ARGNAMES",
    "ulysses_attention",
    "usp_attention",
]


#: The keywords to mark static under ``jax.jit`` for :func:`ulysses_attention`: those of
#: ``scaled_dot_product_attention`` and ``n_shards`` (it has no layout).
ULYSSES_STATIC_ARGNAMES: tuple[str, ...] = (*_SDPA_STATIC_ARGNAMES, "n_shards")
#: The same for :func:`usp_attention`: its two group sizes and the ring's layout.
USP_STATIC_ARGNAMES: tuple[str, ...] = (
    *_SDPA_STATIC_ARGNAMES,
    "ulysses_shards",
    "ring_shards",
    "layout",
)


def _exchange(piece, n, axis, name):
    """One all-to-all of Ulysses, this device's side: it sends ``piece(d)`` to every device d
    of the mesh axis ``name`` (``lax.all_to_all`` over the pieces stacked in device order) and
    joins what it received along ``axis`` in source order."""
    pieces = jnp.stack([piece(d) for d in range(n)])  # (n, ...): piece d to device d
    received = lax.all_to_all(pieces, name, 0, 0)  # received[src]: what device src sent
    return jnp.concatenate([received[src] for src in range(n)], axis=axis)


def _heads(x, span):
    """The heads ``span = (start, stop)`` of ``x (..., heads, positions, features)``."""
    return lax.slice_in_dim(x, *span, axis=x.ndim - 3)


def _rows(x, start, size):
    """The positions ``start .. start + size - 1`` of ``x (..., heads, positions, features)``."""
    return lax.slice_in_dim(x, start, start + size, axis=x.ndim - 2)


def ulysses_attention(
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
    """``scaled_dot_product_attention`` on ``n_shards`` devices by all-to-all sequence
    parallelism (Ulysses), shape ``(..., H, L, E)``, sharded along L over them.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        n_shards: n (the first n of ``jax.devices()``), which must divide H, L and S;
            K % n == 0 (key/value heads split) or n % K == 0 (each key/value head replicated
            to the n / K devices of its group).
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in
            :func:`impl_jax.functional.attention_weights`; a head axis of size H (of mask
            or bias), sinks and ALiBi slopes ``(H,)`` are split with the query heads; segment
            ids, and masks and biases without a head axis (or with one of size 1), go whole to
            every device.

    Pure and differentiable (``lax.all_to_all``'s transpose is the reverse all-to-all); jit
    with :data:`ULYSSES_STATIC_ARGNAMES`.

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``,
    ``shard_devices``; DimensionMismatchError ``ulysses_heads``, ``ulysses_length``,
    ``ulysses_kv_heads``.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    check_shard_config(n_shards)
    call = check_attention(query, key, value, **kw)
    plan = check_ulysses(call, n_shards)
    _check_x64(query.dtype)
    mesh = _mesh(n_shards, SEQ)
    query, key, value, kw = _on_device(query, key, value, keywords=kw)
    n, heads, kv_heads, Lc = plan.n, plan.heads, plan.kv_heads, plan.Lc
    if call.L == 0 or call.S == 0:  # no rows, or no keys (every row fully masked)
        return jnp.zeros((*call.batch, call.H, call.L, call.E), query.dtype)

    # U1. split: device r holds a contiguous 1/n of the positions, every head (shard_map cuts
    #     query, key and value along L and S); mask and bias with a head axis of H, sinks and
    #     slopes are cut along the heads (they go with the query heads, U3); segment ids and
    #     head-less masks go whole.
    x = {"query": query, "key": key, "value": value}
    specs = {name: _spec(a, -2, SEQ) for name, a in x.items()}
    for name in ("mask", "bias"):
        if kw[name] is not None:
            x[name], specs[name] = kw[name], _spec(kw[name], -3, SEQ)
    per_head = {"sinks": kw["sinks"], "alibi_slopes": kw["alibi_slopes"]}
    whole = {"q_segment_ids": kw["q_segment_ids"], "kv_segment_ids": kw["kv_segment_ids"]}
    for name, a in (*per_head.items(), *whole.items()):
        if a is not None:
            x[name], specs[name] = a, P(SEQ) if name in per_head else P()

    def device(x):
        # U2. all-to-all, positions to heads: this device sends device d its positions of d's
        #     query heads and of the key/value heads they read; it joins what it gets along
        #     the positions, in source order: every position of its heads.
        q_rows, k_rows, v_rows = x["query"], x["key"], x["value"]  # (..., H|K, Lc|Sc, D|E)
        q = _exchange(lambda d: _heads(q_rows, heads[d]), n, -2, SEQ)
        k = _exchange(lambda d: _heads(k_rows, kv_heads[d]), n, -2, SEQ)
        v = _exchange(lambda d: _heads(v_rows, kv_heads[d]), n, -2, SEQ)
        # q (..., H/n, L, D), k (..., K/n or 1, S, D), v (..., K/n or 1, S, E)

        # U3. attend: the unsharded contract on the device's heads, every position (mask, bias,
        #     sinks and ALiBi slopes: its query heads; segment ids and head-less masks: whole).
        on_heads = kw | {name: x.get(name) for name in ARRAY_KEYWORDS}  # the device's pieces
        out = scaled_dot_product_attention(q, k, v, **on_heads)  # (..., H/n, L, E)

        # U4. all-to-all, heads to positions: this device sends device d its heads at d's rows
        #     and joins what it gets along the heads, in source order: its rows, every head.
        return _exchange(lambda d: _rows(out, d * Lc, Lc), n, -3, SEQ)  # (..., H, Lc, E)

    out_spec = P(*([None] * (len(call.batch) + 1)), SEQ, None)  # rows r*L/n .. on device r
    return jax.shard_map(device, mesh=mesh, in_specs=(specs,), out_specs=out_spec)(x)


def _shard_order(ring: RingLayout, size: int) -> np.ndarray:
    """The positions of the sequence in ring shard order (chunks of ``size`` positions)."""
    return np.concatenate([np.arange(a * size, (a + 1) * size) for s in ring.chunks for a in s])


def _usp_spec(x: jax.Array, heads: int | None, rows: int | None) -> P:
    """USP's split of a mask, bias or segment ids: the axis ``heads`` (if not None, and not of
    size 1) over the Ulysses members, the axis ``rows`` over the ring groups; the rest whole."""
    spec = [None] * x.ndim
    for axis, name in ((heads, ULY), (rows, SEQ)):
        if axis is not None and x.ndim >= -axis and x.shape[axis] != 1:
            spec[axis] = name
    return P(*spec)


def usp_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    ulysses_shards: int | None = None,
    ring_shards: int | None = None,
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
    """``scaled_dot_product_attention`` on ``u * r`` devices by USP, Ulysses inside each of r
    ring groups of u devices, shape ``(..., H, L, E)``: a 2-D mesh ``(r, u)`` of the first
    ``u * r`` devices, axes ``"seq"`` (the ring across the groups) and ``"ulysses"`` (the
    members of a group); device ``i * u + j`` is member j of ring group i.

    Args:
        query: ``(..., H, L, D)``; key ``(..., K, S, D)``; value ``(..., K, S, E)``.
        ulysses_shards: u, which must divide H, with K % u == 0 or u % K == 0. Required.
        ring_shards: r; ``u * r`` (contiguous) or ``2 u r`` (zigzag) must divide L and S.
            Required.
        layout: the ring's shards, as in :func:`ring_attention`.
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in :func:`ulysses_attention` and
            :func:`ring_attention`.

    Pure and differentiable; jit with :data:`USP_STATIC_ARGNAMES`.

    Raises the errors of ``scaled_dot_product_attention``; ConfigError ``non_positive_size``
    (a group size missing or < 1), ``unknown_layout``, ``shard_devices``;
    DimensionMismatchError ``usp_shape``.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    check_usp_config(ulysses_shards, ring_shards, layout)
    call = check_attention(query, key, value, **kw)
    plan = check_usp(call, ulysses_shards, ring_shards, layout)
    _check_x64(query.dtype)
    u, r, ring, K = plan.u, plan.r, plan.ring, call.K
    heads, kv_heads = plan.ulysses.heads, plan.ulysses.kv_heads  # member j's query, kv heads
    Lm = plan.ulysses.Lc  # the rows each device starts with
    mesh = Mesh(_mesh(u * r, SEQ).devices.reshape(r, u), (SEQ, ULY))  # device i*u + j at (i, j)
    query, key, value, kw = _on_device(query, key, value, keywords=kw)
    if call.L == 0 or call.S == 0:  # no rows, or no keys (every row fully masked)
        return jnp.zeros((*call.batch, call.H, call.L, call.E), query.dtype)

    # S1. split: rows and keys in ring shard order (zigzag: shard i's chunks side by side),
    #     cut by shard_map into u*r pieces, device (i, j) the j-th 1/u of shard i, every head;
    #     mask, bias and query segment ids: the rows of shard i (whole to the group's members)
    #     and, with a head axis of H, member j's heads; sinks and slopes: member j's heads;
    #     key segment ids whole.
    rows, keys = _shard_order(ring, ring.Lc), _shard_order(ring, ring.Sc)
    both = (SEQ, ULY)  # the sequence over the groups, then over a group's members
    x, specs = {}, {}
    for name, a, along in (("query", query, rows), ("key", key, keys), ("value", value, keys)):
        x[name] = jnp.take(a, along, axis=-2)
        specs[name] = P(*([None] * (a.ndim - 2)), both, None)
    for name in ("mask", "bias"):
        if (a := kw[name]) is not None:
            x[name] = jnp.take(a, rows, axis=-2) if a.ndim >= 2 and a.shape[-2] != 1 else a
            specs[name] = _usp_spec(a, -3, -2)
    if (a := kw["q_segment_ids"]) is not None:
        x["q_segment_ids"] = jnp.take(a, rows, axis=-1) if a.shape[-1] != 1 else a
        specs["q_segment_ids"] = _usp_spec(a, None, -1)
    if (a := kw["kv_segment_ids"]) is not None:
        x["kv_segment_ids"], specs["kv_segment_ids"] = a, P()
    for name in ("sinks", "alibi_slopes"):
        if (a := kw[name]) is not None:
            x[name], specs[name] = a, P(ULY)
    local = replace(call, H=call.H // u, K=max(K // u, 1))  # one member's heads

    def device(x):
        # S2. all-to-all inside the ring group, positions to heads (Ulysses' U2): over the
        #     "ulysses" axis, every position of the group (ring shard i, in shard order) of
        #     member j's query heads and of the key/value heads they read.
        q_rows, k_rows, v_rows = x["query"], x["key"], x["value"]  # (..., H|K, Lm|Sm, D|E)
        held = x | {
            "query": _exchange(lambda d: _heads(q_rows, heads[d]), u, -2, ULY),
            "key": _exchange(lambda d: _heads(k_rows, kv_heads[d]), u, -2, ULY),
            "value": _exchange(lambda d: _heads(v_rows, kv_heads[d]), u, -2, ULY),
        }  # member j's heads, every position of ring shard i

        # S3. the ring across the groups: over the "seq" axis, this device is device i of
        #     member j's ring, holding ring shard i of its heads: the ring's own steps.
        out = _ring_device(held, ring=ring, dims=local, offset=call.offset)
        out = out.astype(query.dtype)  # (..., H/u, c*Lc, E), one rounding to the input dtype

        # S4. all-to-all inside the ring group, heads to positions (Ulysses' U4): member j
        #     sends member d its heads at d's rows; joined along the heads: its rows, every head.
        return _exchange(lambda d: _rows(out, d * Lm, Lm), u, -3, ULY)  # (..., H, Lm, E)

    out_spec = P(*([None] * (len(call.batch) + 1)), both, None)
    out = jax.shard_map(device, mesh=mesh, in_specs=(specs,), out_specs=out_spec)(x)

    # S5. gather: the output is one array sharded along L in shard order; back to positions.
    return jnp.take(out, np.argsort(rows), axis=-2)  # (..., H, L, E)
