"""The shared, framework-free pieces of sharded attention (SEMANTICS.md, "Sharded attention").

Ring (context-parallel) attention cuts the query rows L and the keys S into chunks and gives each
of ``n`` devices one shard: one chunk (``layout="contiguous"``) or two (``"zigzag"``, shard r
holds chunks r and 2n - 1 - r of 2n, which evens out the causal work). Head-parallel attention
gives each device K / n key/value heads and the query heads that read them. Which chunks a shard
holds, the checks on ``n_shards`` and ``layout``, and the communication formula of the ring are
facts the NumPy, PyTorch and JAX versions share; they live here, once.

Shape letters (SEMANTICS.md): B batch, H query heads, K key/value heads (G = H // K), L query
length, S key/value length, D query/key head dim, E value head dim; n = ``n_shards``, c chunks
per shard (1 or 2), ``Lc = L / (c n)`` and ``Sc = S / (c n)`` the rows and keys of one chunk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from attention_spec.arrays import broadcast_shapes
from attention_spec.call import AttentionDims
from attention_spec.errors import make_error
from attention_spec.keywords import check_size, divisors
from attention_spec.rules import block_rules

__all__ = [
    "LAYOUTS",
    "RingLayout",
    "RingStep",
    "UlyssesExchange",
    "UlyssesPlan",
    "UspPlan",
    "block_computed",
    "block_visible",
    "check_head_parallel",
    "check_ring",
    "check_shard_config",
    "check_shard_devices",
    "check_ulysses",
    "check_usp",
    "check_usp_config",
    "ring_bytes_per_step",
    "ring_memory_per_device",
    "shard_chunks",
    "ulysses_bytes_per_exchange",
    "usp_bytes_per_device",
]

#: The two ways of cutting L and S into shards (see :func:`shard_chunks`).
LAYOUTS: tuple[str, ...] = ("contiguous", "zigzag")


def shard_chunks(n_shards: int, layout: str) -> tuple[tuple[int, ...], ...]:
    """The chunks each shard holds, shard by shard; chunk i is positions ``[i*size, (i+1)*size)``.

    ``contiguous``: n chunks, shard r holds chunk r.
    ``zigzag``: 2n chunks, shard r holds chunks r and 2n - 1 - r: one from the start of the
    sequence, one from its end. Under a causal mask the early rows see few keys and the late rows
    many; pairing them gives every shard the same amount of work.

    >>> shard_chunks(4, "zigzag")
    ((0, 7), (1, 6), (2, 5), (3, 4))
    """
    if layout == "contiguous":
        return tuple((r,) for r in range(n_shards))
    return tuple((r, 2 * n_shards - 1 - r) for r in range(n_shards))


@dataclass(frozen=True)
class RingLayout:
    """How one ring-attention call cuts L and S.

    ``chunks[r]`` are the chunks of shard r (:func:`shard_chunks`); a chunk is ``Lc`` query rows
    and ``Sc`` keys. Device r keeps query shard r for the whole call; key/value shards travel.
    """

    n: int
    layout: str
    chunks: tuple[tuple[int, ...], ...]
    Lc: int
    Sc: int

    @property
    def c(self) -> int:
        """Chunks per shard: 1 (contiguous) or 2 (zigzag)."""
        return len(self.chunks[0])


def check_shard_config(n_shards: int, layout: str | None = None) -> None:
    """Validate the sharding keywords (ConfigError): ``n_shards`` an integer >= 1, ``layout``
    one of :data:`LAYOUTS` (None: head-parallel, which has no layout)."""
    check_size("n_shards", n_shards)
    if layout is not None and layout not in LAYOUTS:
        raise make_error(
            "unknown_layout",
            f"layout must be one of {LAYOUTS}; got {layout!r}",
            expected=" | ".join(LAYOUTS),
            actual=repr(layout),
        )


def check_ring(dims: AttentionDims, n_shards: int, layout: str) -> RingLayout:
    """Validate a ring-attention call whose attention arguments ``dims`` already passed
    :func:`~attention_spec.check_attention`, and return how it cuts L and S.

    Raises:
        DimensionMismatchError ``length_not_divisible``: the chunk count (n, or 2n for zigzag)
        does not divide both L and S.
    """
    L, S = dims.L, dims.S
    n_chunks = n_shards if layout == "contiguous" else 2 * n_shards
    if L % n_chunks or S % n_chunks:
        how = (
            f"{n_shards} contiguous shards"
            if layout == "contiguous"
            else f"2 * {n_shards} = {n_chunks} chunks (layout='zigzag')"
        )
        raise make_error(
            "length_not_divisible",
            f"ring attention with n_shards={n_shards} cuts L and S into {how}, so {n_chunks} "
            f"must divide both; got L={L}, S={S}",
            expected=f"L % {n_chunks} == 0 and S % {n_chunks} == 0",
            actual=f"L={L}, S={S}",
        )
    chunks = shard_chunks(n_shards, layout)
    return RingLayout(n_shards, layout, chunks, L // n_chunks, S // n_chunks)


def check_head_parallel(H: int, K: int, n_shards: int) -> None:
    """Validate a head-parallel split of K key/value heads (and their H query heads).

    Raises:
        DimensionMismatchError ``kv_heads_not_divisible``: n_shards does not divide K.
    """
    if K % n_shards:
        raise make_error(
            "kv_heads_not_divisible",
            f"head-parallel attention with n_shards={n_shards} gives each device K/{n_shards} "
            f"key/value heads (with their query heads), so {n_shards} must divide K; "
            f"got K={K} (H={H})",
            expected=f"K % n_shards == 0 (n_shards in {divisors(K)})",
            actual=f"K={K}, n_shards={n_shards}",
        )


def check_shard_devices(n_shards: int, available: int, where: str, *, exact: bool) -> None:
    """Validate that there are devices for the shards: at least ``n_shards`` JAX devices (the
    first n make the mesh), exactly ``n_shards`` torch processes (``exact``: one per rank).

    ``where`` says what was counted and how to get more, e.g. ``"the process group has 2
    ranks"``. Raises ConfigError ``shard_devices``.
    """
    if available < n_shards or (exact and available != n_shards):
        raise make_error(
            "shard_devices",
            f"n_shards={n_shards} needs {n_shards} devices, one per shard; {where}",
            expected=f"{'exactly' if exact else 'at least'} {n_shards} devices",
            actual=str(available),
        )


def ring_bytes_per_step(
    key_shape: Sequence[int], value_shape: Sequence[int], n_shards: int, itemsize: int
) -> list[int]:
    """Bytes one device sends at each of the n ring steps (docs/SHARDED.md, "Communication").

    At steps 0 .. n-2 a device passes the key/value shard it holds to its right neighbour:
    ``prod(key batch) * K * S/n * D + prod(value batch) * K * S/n * E`` elements of the input
    dtype. At the last step it sends nothing: every device has then seen every shard. Over the
    call a device sends ``(n - 1) / n`` of the whole key and value.
    """
    per_step = (math.prod(key_shape) + math.prod(value_shape)) // n_shards * itemsize
    return [per_step] * (n_shards - 1) + [0]


@dataclass(frozen=True)
class RingStep:
    """What one device did at one ring step (recorded when a caller passes ``stats=[]``).

    ``t`` the step, ``r`` the device, ``src`` the device whose key/value shard it held,
    ``blocks`` the (query chunk, key chunk) pairs it computed (causal skips the others),
    ``bytes_sent`` what it passed to its right neighbour after the step (0 at the last step).
    """

    t: int
    r: int
    src: int
    blocks: tuple[tuple[int, int], ...]
    bytes_sent: int


def block_visible(q_chunk, k_chunk, Lc: int, Sc: int, offset: int):
    """Causal, whole blocks: may some row of query chunk ``q_chunk`` see some key of key chunk
    ``k_chunk``? Yes iff the chunk's first key is at or before its last row's diagonal,
    ``k_chunk * Sc <= (q_chunk + 1) * Lc - 1 + offset`` (query i sees key j iff
    ``j <= i + offset``). A block for which this is False is entirely masked and is skipped.

    Plain arithmetic, so the chunk indices may be Python ints or traced JAX integers.
    """
    return k_chunk * Sc <= (q_chunk + 1) * Lc - 1 + offset


def block_computed(dims, offset: int, q_chunk, k_chunk, Lc: int, Sc: int, q_ids, kv_ids):
    """Whole blocks, every rule: may some row of query chunk ``q_chunk`` attend some key of key
    chunk ``k_chunk`` under the causal, window and segment rules (``q_ids``, ``kv_ids``: the
    chunks' segment ids, or None)? A block for which this is False is masked for every row and
    is skipped (:func:`attention_spec.rules.block_rules` on the block's rows and keys; with
    ``is_causal`` alone it is :func:`block_visible`).

    Python bools, or arrays (JAX, traced) where the chunk indices or ids are.
    """
    i0, j0 = q_chunk * Lc, k_chunk * Sc
    some, _ = block_rules(dims.is_causal, dims.window, offset, i0, i0 + Lc, j0, j0 + Sc,
                          q_ids, kv_ids)
    return some


def ring_memory_per_device(
    query_shape: Sequence[int],
    key_shape: Sequence[int],
    value_shape: Sequence[int],
    n_shards: int,
    layout: str,
    itemsize: int,
    compute_itemsize: int,
) -> dict[str, int]:
    """Bytes one device of the ring holds (docs/SHARDED.md, "Memory"), without mask and bias.

    What it is handed and keeps: ``query_shard`` (its L/n rows) and ``kv_shard`` (its S/n keys
    and values), in the input dtype (``itemsize``). What it adds at its peak, ``extra``: the
    key/value shard arriving while it computes with the held one (``kv_arriving``), the
    running output and row log-sum-exp of its rows (``accumulators``, compute dtype), and one
    block's scratch, the scores and their exponentials for one (query chunk, key chunk) pair
    (``block_scratch``, compute dtype); a 16-bit input adds its query shard in the compute
    dtype. ``output_shard`` is what it returns. ``kv_block_zeroed`` is not in ``extra``: one
    block's key and value rows with the rows no query attends zeroed (the garbage rule), a copy
    a compiler may fuse away in part; it bounds what it may add.
    """
    *qb, H, L, D = query_shape
    S, E = key_shape[-2], value_shape[-1]
    batch = math.prod(broadcast_shapes(tuple(qb), tuple(key_shape[:-3]), tuple(value_shape[:-3])))
    c = 1 if layout == "contiguous" else 2
    rows, keys = L // n_shards, S // n_shards
    kv = (math.prod(key_shape) + math.prod(value_shape)) // n_shards * itemsize
    terms = {
        "query_shard": math.prod(qb) * H * rows * D * itemsize,
        "kv_shard": kv,
        "kv_arriving": kv,
        "accumulators": batch * H * rows * (E + 1) * compute_itemsize,
        "block_scratch": 2 * batch * H * (rows // c) * (keys // c) * compute_itemsize,
        "query_compute_copy": (
            math.prod(qb) * H * rows * D * compute_itemsize if compute_itemsize != itemsize else 0
        ),
        "output_shard": batch * H * rows * E * itemsize,
        "kv_block_zeroed": (
            (math.prod(key_shape[:-2]) * D + math.prod(value_shape[:-2]) * E)
            * (keys // c)
            * compute_itemsize
        ),
    }
    terms["extra"] = (
        terms["kv_arriving"]
        + terms["accumulators"]
        + terms["block_scratch"]
        + terms["query_compute_copy"]
    )
    return terms


# ---------------------------------------------------------------------------------------------
# All-to-all sequence parallelism (Ulysses; contract v3)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UlyssesPlan:
    """Which heads each of ``n`` devices attends after Ulysses' first all-to-all.

    ``heads[r] = (start, stop)``: the query heads of device r, ``r*H/n .. (r+1)*H/n - 1``.
    ``kv_heads[r] = (start, stop)``: its key/value heads: ``r*K/n .. (r+1)*K/n - 1`` when
    ``K % n == 0`` (split like the queries), else the one head ``r*K // n`` that its query heads
    read (``n % K == 0``: each key/value head goes to the ``n / K`` devices of its group).
    ``Lc = L / n`` and ``Sc = S / n``: the positions each device holds before and after.
    """

    n: int
    heads: tuple[tuple[int, int], ...]
    kv_heads: tuple[tuple[int, int], ...]
    Lc: int
    Sc: int


def check_ulysses(dims: AttentionDims, n_shards: int) -> UlyssesPlan:
    """Validate a Ulysses call whose attention arguments ``dims`` already passed
    :func:`~attention_spec.check_attention`, and return its :class:`UlyssesPlan`.

    Raises:
        DimensionMismatchError ``ulysses_heads``: n does not divide H.
        DimensionMismatchError ``ulysses_length``: n does not divide L or S.
        DimensionMismatchError ``ulysses_kv_heads``: neither ``K % n == 0`` nor ``n % K == 0``.
    """
    n, H, K, L, S = n_shards, dims.H, dims.K, dims.L, dims.S
    if H % n:
        raise make_error(
            "ulysses_heads",
            f"Ulysses with n_shards={n} gives each device H/{n} query heads after its "
            f"all-to-all, so {n} must divide H; got H={H}",
            expected=f"H % n_shards == 0 (n_shards in {divisors(H)})",
            actual=f"H={H}, n_shards={n}",
        )
    if L % n or S % n:
        raise make_error(
            "ulysses_length",
            f"Ulysses with n_shards={n} starts each device with a contiguous 1/{n} of the "
            f"positions, so {n} must divide L and S; got L={L}, S={S}",
            expected=f"L % {n} == 0 and S % {n} == 0",
            actual=f"L={L}, S={S}",
        )
    if K % n and n % K:
        raise make_error(
            "ulysses_kv_heads",
            f"Ulysses with n_shards={n} splits the K={K} key/value heads (K % n == 0) or "
            f"replicates each to the n/K devices of its query heads (n % K == 0); neither "
            f"holds (H={H})",
            expected=f"K % {n} == 0 or {n} % K == 0",
            actual=f"K={K}, n_shards={n}",
        )
    Hn = H // n
    heads = tuple((r * Hn, (r + 1) * Hn) for r in range(n))
    if K % n == 0:
        kv_heads = tuple((r * K // n, (r + 1) * K // n) for r in range(n))
    else:  # n % K == 0: device r's query heads all read kv head r*K // n (one group)
        kv_heads = tuple((r * K // n, r * K // n + 1) for r in range(n))
    return UlyssesPlan(n, heads, kv_heads, L // n, S // n)


@dataclass(frozen=True)
class UspPlan:
    """How one USP call (Ulysses inside each of r ring groups of u devices) cuts its work.

    ``ring``: the ring across the groups (:class:`RingLayout` for r shards: ring group i holds
    ring shard i, its chunks side by side, ``c * Lc`` rows and ``c * Sc`` keys). ``ulysses``:
    Ulysses inside a group (:class:`UlyssesPlan` for u devices over the group's positions:
    member j holds the contiguous j-th 1/u of them, ``ulysses.Lc`` rows and ``ulysses.Sc``
    keys, and attends the query heads ``ulysses.heads[j]``). Device ``i * u + j`` is member j
    of ring group i.
    """

    u: int
    r: int
    ring: RingLayout
    ulysses: UlyssesPlan

    def rank(self, i: int, j: int) -> int:
        """The device of member j of ring group i."""
        return i * self.u + j


def check_usp_config(ulysses_shards: object, ring_shards: object, layout: str) -> None:
    """Validate USP's keywords (ConfigError): both group sizes given, integers >= 1, and
    ``layout`` one of :data:`LAYOUTS`.

    A hybrid without its group sizes is an error, never a default: a ``"a2a+p2p"`` setting
    whose sizes were dropped ran without context parallelism and said nothing
    (Megatron-Bridge PR 2665).
    """
    for name, size in (("ulysses_shards", ulysses_shards), ("ring_shards", ring_shards)):
        if size is None:
            raise make_error(
                "non_positive_size",
                f"usp_attention needs both group sizes, ulysses_shards (u, the devices of a "
                f"Ulysses group) and ring_shards (r, the ring groups); {name} is None: a hybrid "
                "without its sizes is not run as one without context parallelism",
                expected=f"{name} an integer >= 1",
                actual="None",
            )
        check_size(name, size)
    check_shard_config(1, layout)


def check_usp(dims: AttentionDims, ulysses_shards: int, ring_shards: int, layout: str) -> UspPlan:
    """Validate a USP call (Ulysses inside each of ``ring_shards`` ring groups of
    ``ulysses_shards`` devices) whose attention arguments ``dims`` passed
    :func:`~attention_spec.check_attention` and whose keywords passed
    :func:`check_usp_config`, and return its :class:`UspPlan`.

    Raises:
        DimensionMismatchError ``usp_shape``: u does not divide H, the key/value rule fails for
        u, or ``u * r`` (``2 u r`` for zigzag) does not divide L and S.
    """
    u, r, H, K, L, S = ulysses_shards, ring_shards, dims.H, dims.K, dims.L, dims.S
    c = 2 if layout == "zigzag" else 1
    chunks = u * r * c
    problems = []
    if H % u:
        problems.append(f"H={H} is not divisible by ulysses_shards={u}")
    if K % u and u % K:
        problems.append(f"neither K % u nor u % K is 0 (K={K}, ulysses_shards={u})")
    if L % chunks or S % chunks:
        problems.append(f"{chunks} does not divide L={L} and S={S}")
    if problems:
        raise make_error(
            "usp_shape",
            f"USP with ulysses_shards={u}, ring_shards={r}, layout={layout!r}: "
            + "; ".join(problems),
            expected=f"H % {u} == 0, K % {u} == 0 or {u} % K == 0, L % {chunks} == 0 and "
            f"S % {chunks} == 0",
            actual=f"H={H}, K={K}, L={L}, S={S}",
        )
    n_chunks = r * c
    ring = RingLayout(r, layout, shard_chunks(r, layout), L // n_chunks, S // n_chunks)
    group = replace(dims, L=L // r, S=S // r)  # the positions of one ring group
    return UspPlan(u, r, ring, check_ulysses(group, u))


@dataclass(frozen=True)
class UlyssesExchange:
    """What one device sent in one all-to-all of a Ulysses call (``stats=[]``).

    ``exchange``: ``"query"``, ``"key"``, ``"value"`` (the first all-to-all, positions to heads)
    or ``"output"`` (the second, heads back to positions); ``r`` the device; ``bytes_sent`` what
    it sent to the other n - 1 devices (its own piece stays).
    """

    exchange: str
    r: int
    bytes_sent: int


def ulysses_bytes_per_exchange(
    query_shape: Sequence[int],
    key_shape: Sequence[int],
    value_shape: Sequence[int],
    output_shape: Sequence[int],
    n_shards: int,
    itemsize: int,
) -> dict[str, int]:
    """Bytes one device sends in each of Ulysses' four all-to-alls (docs/SHARDED.md), by
    exchange: ``"query"``, ``"key"``, ``"value"``, ``"output"``.

    A device holds 1/n of the positions of every head and sends each of the other n - 1
    devices that device's heads of them: ``(n - 1) / n`` of its query and output shards, and of
    its key and value shards when ``K % n == 0``; with replicated key/value heads (``K < n``)
    it sends its positions of one key/value head to each of the n - 1 others.
    """
    n = n_shards

    def sent(shape: Sequence[int]) -> int:
        """``prod(batch) * max(heads / n, 1) * positions / n * dim * (n - 1)`` elements."""
        *batch, heads, positions, dim = shape
        per_device = max(heads // n, 1)  # the heads each other device receives
        return math.prod(batch) * per_device * (positions // n) * dim * (n - 1) * itemsize

    shapes = {"query": query_shape, "key": key_shape, "value": value_shape,
              "output": output_shape}
    return {name: sent(shape) for name, shape in shapes.items()}


def usp_bytes_per_device(
    query_shape: Sequence[int],
    key_shape: Sequence[int],
    value_shape: Sequence[int],
    output_shape: Sequence[int],
    ulysses_shards: int,
    ring_shards: int,
    itemsize: int,
) -> dict[str, int]:
    """Bytes one device of a USP call sends (docs/SHARDED.md), by exchange: ``"query"``,
    ``"key"``, ``"value"``, ``"output"`` (Ulysses' all-to-alls inside its ring group, over the
    group's ``1/r`` of the positions: :func:`ulysses_bytes_per_exchange` with u devices) and
    ``"ring"`` (the ring across the groups: r - 1 steps, each passing on the key/value shard of
    its member's key/value heads, ``K/u`` of them, or 1 when they are replicated).
    """
    u, r = ulysses_shards, ring_shards

    def group(shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of one ring group's positions: 1/r of them."""
        return (*shape[:-2], shape[-2] // r, shape[-1])

    sent = ulysses_bytes_per_exchange(
        group(query_shape), group(key_shape), group(value_shape), group(output_shape), u,
        itemsize,
    )
    *kb, K, S, D = key_shape
    *vb, _, _, E = value_shape
    kv_heads = max(K // u, 1)  # a member's key/value heads
    per_step = (math.prod(kb) * D + math.prod(vb) * E) * kv_heads * (S // r) * itemsize
    return {**sent, "ring": per_step * (r - 1)}
