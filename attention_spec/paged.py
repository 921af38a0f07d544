"""Validation of the paged key/value cache calls (Contract v3): ``paged_attention`` and
``paged_cache_write``.

Shapes (SEMANTICS.md, "Paged key/value caches"): query ``(T, H, D)`` token-major, key cache
``(P, page_size, K, D)``, value cache ``(P, page_size, K, E)``, ``block_table (N, max_pages)``,
``seq_lens (N,)``, ``cu_seqlens_q (N + 1,)``. Key j of sequence n is
``key_cache[block_table[n, j // page_size], j % page_size]``; sequence n's ``L_n`` queries are
its last ``L_n`` positions. Letters: T packed tokens, N sequences, P pages.

:func:`check_paged_attention` checks in a fixed order, so a call with several mistakes reports
the same one in every framework:

1. each keyword on its own (``is_causal``, ``scale``, ``softcap``, ``window``);
2. the six arrays given; ranks; dtypes; the two caches agree (``page_shape``); sizes; head dims
   and head divisibility; the integer arrays' dtypes and their N (``cu_seqlens_count``);
3. ``sinks`` and ``alibi_slopes`` against H; the fp8 descales (``()``, ``(H|K,)`` or
   ``(N, H|K)``; the dtypes' combination is checked in 2, ``check_fp8_dtypes``);
4. the integer arrays' values, where they are concrete (NumPy, torch, JAX outside ``jit``):
   ``cu_seqlens_q`` (``cu_seqlens_value``), ``seq_lens`` (``seq_lens_value``), then the pages
   each sequence needs (``block_table_value``);
5. scale and softcap against the compute dtype.

:func:`sequence_pages` is the tiled read's schedule (``paged_flash_attention``): each
sequence's query rows and the blocks of its own pages, made on the host from the concrete
``cu_seqlens_q`` and ``seq_lens`` the check kept.

:func:`check_paged_cache_write` checks the caches, the key and value to write, and
``slot_mapping`` (its values where concrete: ``slot_mapping_value``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from attention_spec.arrays import (
    FLOAT_DTYPES,
    ArraySpec,
    Shape,
    check_dtype,
    check_given,
    describe,
)
from attention_spec.errors import make_error
from attention_spec.fp8 import FP8_DTYPES, check_fp8_dtypes, check_token_descale
from attention_spec.keywords import (
    check_flag,
    check_ranges,
    check_scale,
    check_size,
    check_softcap,
    check_window,
    divisors,
)
from attention_spec.rules import key_band
from attention_spec.tiling import BLOCK_K, BLOCK_Q
from attention_spec.varlen import check_cu_seqlens_values, cu_seqlens_spec

__all__ = [
    "PAGED_BLOCK_K",
    "PagedCall",
    "SequencePages",
    "check_paged_attention",
    "check_paged_cache_write",
    "paged_block_k",
    "pages_needed",
    "sequence_pages",
]

Window = tuple[int | None, int | None]


@dataclass(frozen=True)
class PagedCall:
    """A validated ``paged_attention`` call: its sizes (T tokens, N sequences, H, K, D, E,
    P pages of ``page_size`` slots, ``max_pages`` per sequence), ``scale`` (resolved to
    ``1/sqrt(D)`` when None), ``softcap``, ``is_causal``, ``window`` and the ``sinks`` and
    ``alibi_slopes`` given (their :class:`ArraySpec`, or None), the fp8 descales (None: 1.0,
    a float32-rounded float, or the ArraySpec of a ``()``, ``(H|K,)`` or ``(N, H|K)`` array),
    and the values of ``cu_seqlens_q`` (``cu_q``) and ``seq_lens``, checked, as Python ints
    (None where they are traced, under ``jax.jit``)."""

    T: int
    N: int
    H: int
    K: int
    D: int
    E: int
    P: int
    page_size: int
    max_pages: int
    scale: float
    softcap: float | None
    is_causal: bool
    window: Window | None
    sinks: ArraySpec | None
    alibi_slopes: ArraySpec | None
    q_descale: float | ArraySpec | None = None
    k_descale: float | ArraySpec | None = None
    v_descale: float | ArraySpec | None = None
    cu_q: tuple[int, ...] | None = None
    seq_lens: tuple[int, ...] | None = None

    @property
    def G(self) -> int:
        """Query heads per key/value head."""
        return self.H // self.K

    @property
    def max_len(self) -> int:
        """The most keys a sequence can hold: ``max_pages * page_size``."""
        return self.max_pages * self.page_size


def pages_needed(seq_len: int, page_size: int) -> int:
    """The pages a sequence of ``seq_len`` keys reads: ``ceil(seq_len / page_size)``."""
    return -(-seq_len // page_size)


def _concrete(x: Any) -> list | None:
    """The values of integer array ``x`` as (nested) Python lists, or None when they are not
    concrete (a JAX tracer under ``jit``: unchecked, as JAX's own functions do)."""
    try:
        return x.tolist()
    except Exception:
        return None


def _check_rank(name: str, shape: Shape, letters: str) -> None:
    if len(shape) != len(letters.split(", ")):
        raise make_error(
            "rank",
            f"{name} must have shape ({letters}); got shape {shape}",
            expected=f"({letters})",
            actual=str(shape),
        )


def _check_integer(name: str, code: str, spec: ArraySpec, what: str) -> None:
    if not spec.dtype.startswith(("int", "uint")):
        raise make_error(
            code,
            f"{name} must be integers ({what}); got {spec.dtype}",
            expected="integer dtype",
            actual=spec.dtype,
        )


def _check_caches(k: ArraySpec, v: ArraySpec, *, fp8: bool) -> None:
    """The key cache ``(P, page_size, K, D)`` and value cache ``(P, page_size, K, E)``: ranks,
    one supported dtype (``fp8``: a float8 cache too), and the same P, page_size and K."""
    _check_rank("key_cache", k.shape, "P, page_size, K, D")
    _check_rank("value_cache", v.shape, "P, page_size, K, E")
    for name, spec in (("key_cache", k), ("value_cache", v)):
        if not (fp8 and spec.dtype in FP8_DTYPES):
            check_dtype(name, spec.dtype)
    if k.dtype != v.dtype:
        raise make_error(
            "dtype_mismatch",
            f"key_cache and value_cache must share one dtype; got key_cache={k.dtype}, "
            f"value_cache={v.dtype}",
            expected="one dtype",
            actual=f"key_cache={k.dtype}, value_cache={v.dtype}",
        )
    if k.shape[:3] != v.shape[:3]:
        raise make_error(
            "page_shape",
            f"key_cache (P, page_size, K, D) and value_cache (P, page_size, K, E) must agree "
            f"on P, page_size and K; got key_cache {k.shape}, value_cache {v.shape}",
            expected=f"value_cache ({k.shape[0]}, {k.shape[1]}, {k.shape[2]}, E)",
            actual=str(v.shape),
        )
    for what, n in (("pages P", k.shape[0]), ("page_size", k.shape[1]),
                    ("key/value heads K", k.shape[2]),
                    ("head dim D", k.shape[3]), ("value head dim E", v.shape[3])):
        if n < 1:
            raise make_error(
                "non_positive_size",
                f"{what} must be >= 1; got {n} (key_cache {k.shape}, value_cache {v.shape})",
                expected=">= 1",
                actual=str(n),
            )


def _per_head(name: str, array: Any, H: int) -> ArraySpec | None:
    """``sinks`` or ``alibi_slopes``: ``(H,)`` floating (the codes of the heads-first calls)."""
    spec = describe(array)
    if spec is None:
        return None
    short = name.split("_")[0]
    if spec.shape != (H,):
        raise make_error(
            f"{short}_shape",
            f"{name} must have one entry per query head, shape (H={H},); got {spec.shape}",
            expected=f"(H={H},)",
            actual=str(spec.shape),
        )
    if spec.dtype not in FLOAT_DTYPES:
        raise make_error(
            f"{short}_dtype",
            f"{name} must be floating, one of {FLOAT_DTYPES}; got {spec.dtype}",
            expected=" | ".join(FLOAT_DTYPES),
            actual=spec.dtype,
        )
    return spec


def _check_seq_lens(seq_lens: list[int], cu: list[int] | None, max_len: int, max_pages: int,
                    page_size: int) -> None:
    """Each ``seq_lens[n]`` in ``[L_n, max_pages * page_size]`` (``seq_lens_value``)."""
    for n, s in enumerate(seq_lens):
        L_n = 0 if cu is None else cu[n + 1] - cu[n]
        if not L_n <= s <= max_len:
            raise make_error(
                "seq_lens_value",
                f"seq_lens[{n}] must be in [L_n={L_n}, max_pages * page_size = {max_pages} * "
                f"{page_size} = {max_len}] (its queries are its last L_n keys; its keys fit its "
                f"block-table row); got {s}",
                expected=f"{L_n} <= seq_lens[{n}] <= {max_len}",
                actual=str(s),
            )


def _check_block_table(table: list[list[int]], seq_lens: list[int], P: int,
                       page_size: int) -> None:
    """Every page a sequence needs (the first ``ceil(seq_lens[n] / page_size)`` entries of its
    row) is in ``[0, P)`` (``block_table_value``); the other entries are never read."""
    for n, (row, s) in enumerate(zip(table, seq_lens)):
        for p, page in enumerate(row[: pages_needed(s, page_size)]):
            if not 0 <= page < P:
                raise make_error(
                    "block_table_value",
                    f"block_table[{n}, {p}] must be a page in [0, P={P}): sequence {n} holds "
                    f"seq_lens[{n}]={s} keys, so it reads pages 0..{pages_needed(s, page_size) - 1}"
                    f" of its row; got {page}",
                    expected=f"0 <= block_table[{n}, {p}] < {P}",
                    actual=str(page),
                )


def check_paged_attention(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_table: Any,
    seq_lens: Any,
    cu_seqlens_q: Any,
    *,
    is_causal: Any = False,
    window: Any = None,
    scale: Any = None,
    softcap: Any = None,
    sinks: Any = None,
    alibi_slopes: Any = None,
    q_descale: Any = None,
    k_descale: Any = None,
    v_descale: Any = None,
) -> PagedCall:
    """Validate one ``paged_attention`` call (the order of this module's docstring); return it
    as a :class:`PagedCall`. The arrays are read through :func:`describe`; the integer arrays'
    values through ``.tolist()`` when they are concrete.

    Raises:
        ConfigError, DimensionMismatchError, DTypeError: SEMANTICS.md, "New errors" (v3).
    """
    given = {"scale": scale, "softcap": softcap}
    # 1. each keyword on its own
    is_causal = check_flag("is_causal", is_causal)
    scale_value, softcap_value = check_scale(scale), check_softcap(softcap)
    window = check_window(window)

    # 2. the arrays: given, ranks, dtypes, the caches, sizes, the integer arrays
    check_given(query=query, key_cache=key_cache, value_cache=value_cache,
                block_table=block_table, seq_lens=seq_lens, cu_seqlens_q=cu_seqlens_q)
    q, k, v = describe(query), describe(key_cache), describe(value_cache)
    table, lens, cu = describe(block_table), describe(seq_lens), describe(cu_seqlens_q)
    _check_rank("query", q.shape, "T, H, D")
    _check_caches(k, v, fp8=True)
    fp8 = check_fp8_dtypes(q.dtype, k.dtype, v.dtype)  # an fp8 cache (or all fp8): allowed?
    if not fp8:
        check_dtype("query", q.dtype)
    if not fp8 and k.dtype != q.dtype:
        raise make_error(
            "dtype_mismatch",
            f"query, key_cache and value_cache must share one dtype; got query={q.dtype}, "
            f"key_cache={k.dtype}, value_cache={v.dtype}",
            expected="one dtype",
            actual=f"query={q.dtype}, key_cache={k.dtype}, value_cache={v.dtype}",
        )
    T, H, D = q.shape
    P, page_size, K, Dk = k.shape
    E = v.shape[3]
    if H < 1 or D < 1:
        raise make_error(
            "non_positive_size",
            f"query heads H and head dim D must be >= 1; got query {q.shape}",
            expected=">= 1",
            actual=str(q.shape),
        )
    if Dk != D:
        raise make_error(
            "qk_head_dim_mismatch",
            f"query head dim (D={D}) must equal the key cache's head dim (D={Dk}); "
            f"got query {q.shape}, key_cache {k.shape}",
            expected=f"key_cache (P, page_size, K, D={D})",
            actual=str(k.shape),
        )
    if H % K:
        choices = divisors(H)
        raise make_error(
            "heads_not_divisible",
            f"key heads (K={K}) must divide query heads (H={H})",
            expected="H % K == 0" + (f" (K in {choices})" if choices else ""),
            actual=f"H={H}, K={K}",
        )
    _check_integer("block_table", "block_table_dtype", table, "page ids")
    _check_integer("seq_lens", "seq_lens_dtype", lens, "key counts")
    cu_seqlens_spec("cu_seqlens_q", cu_seqlens_q)  # varlen_attention's rule, and codes
    _check_rank("block_table", table.shape, "N, max_pages")
    _check_rank("seq_lens", lens.shape, "N")
    N, max_pages = table.shape
    if lens.shape[0] != N or cu.shape[0] != N + 1:
        listing = f"block_table {table.shape}, seq_lens {lens.shape}, cu_seqlens_q {cu.shape}"
        raise make_error(
            "cu_seqlens_count",
            f"block_table (N, max_pages), seq_lens (N,) and cu_seqlens_q (N + 1,) must agree on "
            f"the number of sequences N; got {listing}",
            expected=f"seq_lens ({N},), cu_seqlens_q ({N + 1},)",
            actual=listing,
        )

    # 3. sinks and ALiBi slopes against H
    sinks_spec = _per_head("sinks", sinks, H)
    slopes_spec = _per_head("alibi_slopes", alibi_slopes, H)
    descales = {
        name: check_token_descale(name, x, dtype, N, letter, n)
        for name, x, dtype, letter, n in (("q_descale", q_descale, q.dtype, "H", H),
                                          ("k_descale", k_descale, k.dtype, "K", K),
                                          ("v_descale", v_descale, v.dtype, "K", K))
    }

    # 4. the integer arrays' values, where concrete
    cu_values, len_values = _concrete(cu_seqlens_q), _concrete(seq_lens)
    table_values = _concrete(block_table)
    if cu_values is not None:
        check_cu_seqlens_values("cu_seqlens_q", cu_values, T, "T")
    if len_values is not None:
        _check_seq_lens(len_values, cu_values, max_pages * page_size, max_pages, page_size)
        if table_values is not None:
            _check_block_table(table_values, len_values, P, page_size)

    # 5. scale and softcap against the compute dtype
    check_ranges(q.dtype, scale_value, softcap_value, given)
    return PagedCall(
        T=T, N=N, H=H, K=K, D=D, E=E, P=P, page_size=page_size, max_pages=max_pages,
        scale=D**-0.5 if scale_value is None else scale_value, softcap=softcap_value,
        is_causal=is_causal, window=window, sinks=sinks_spec, alibi_slopes=slopes_spec,
        **descales, cu_q=None if cu_values is None else tuple(int(c) for c in cu_values),
        seq_lens=None if len_values is None else tuple(int(s) for s in len_values),
    )


class SequencePages(NamedTuple):
    """One sequence of the tiled read's schedule (:func:`sequence_pages`), as Python ints:
    sequence ``n``, its query rows ``[q0, q1)`` (``L_n = q1 - q0 >= 1``, at positions
    ``S - L_n + i``), its keys ``S`` (``seq_lens[n]``) and the blocks of its pages it reads,
    ``((p0, p1), ...)``: entries ``p0 .. p1 - 1`` of its block-table row, keys
    ``p0 * page_size .. p1 * page_size - 1`` (those ``>= S``, the last page's tail, masked)."""

    n: int
    q0: int
    q1: int
    S: int
    blocks: tuple[tuple[int, int], ...]


#: The widest key block of the tiled paged read's default (:func:`paged_block_k`): 4 x BLOCK_K
#: keys, whose keys and values are ``2048 * K * (D + E)`` numbers (2 MiB at K = 2, D = E = 64
#: in float32), whatever P is.
PAGED_BLOCK_K: int = 4 * BLOCK_K


def paged_block_k(block_k: int | None, L_n: int) -> int:
    """The keys a block of the tiled paged read holds for a sequence of ``L_n`` queries:
    ``block_k`` as given (an integer >= 1, ConfigError ``non_positive_size``), or by default the
    keys whose scores fill the tiled path's ``BLOCK_Q x BLOCK_K`` tile with the sequence's own
    rows, between ``BLOCK_K`` and :data:`PAGED_BLOCK_K`: 2048 keys for a decode step (``L_n =
    1``), 512 for a prefill chunk of 256 rows or more. A decode step's scores are one row, so
    the flash tile's 512 keys would make it four times the steps, each a handful of small ops
    (the paged decode goal, docs/BENCH.md: torch 1.23-1.28x the contiguous step with 512-key
    blocks, 1.08-1.10x with 2048, on a quiet machine)."""
    if block_k is not None:
        check_size("block_k", block_k)
        return block_k
    return min(PAGED_BLOCK_K, max(BLOCK_K, BLOCK_Q * BLOCK_K // max(L_n, 1)))


def sequence_pages(call: PagedCall, block_k: int | None) -> list[SequencePages]:
    """The tiled paged read's schedule: each sequence with queries, in order, and the blocks of
    its own pages it reads, ``max(1, bk // page_size)`` whole pages a block, ``bk`` the
    caller's ``block_k`` or the default for the sequence's query rows (:func:`paged_block_k`).

    A sequence reads only the pages that hold keys its queries may attend: those of the causal
    and window bands of its rows (``rules.key_band`` at its diagonal ``S_n - L_n``, the rule
    the tiled path skips key blocks by), which end at its last key, ``S_n``; a sequence with no
    query (``L_n = 0``) reads nothing and gives no rows. The schedule is made on the host from
    the concrete ``cu_seqlens_q`` and ``seq_lens`` (:class:`PagedCall`'s ``cu_q`` and
    ``seq_lens``), as :func:`~attention_spec.sequence_bounds` is for the tiled varlen path;
    traced ones (under ``jax.jit``) are ConfigError ``cu_seqlens_value`` / ``seq_lens_value``,
    before any arithmetic. ``block_table`` may stay traced: it is only sliced and gathered by.
    """
    needed = (("cu_seqlens_q", "cu_seqlens_value", call.cu_q, "N + 1"),
              ("seq_lens", "seq_lens_value", call.seq_lens, "N"))
    for name, code, values, entries in needed:
        if values is None:
            raise make_error(
                code,
                f"the tiled paged read schedules each sequence's page blocks from concrete "
                f"cu_seqlens_q and seq_lens (host values); got a traced {name} (under jax.jit, "
                f"close over cu_seqlens_q and seq_lens as NumPy arrays, or call the plain "
                f"paged_attention)",
                expected=f"concrete ({entries},) integers",
                actual="traced",
            )
    cu, lens, page_size = call.cu_q, call.seq_lens, call.page_size
    if block_k is not None:
        check_size("block_k", block_k)
    schedule = []
    for n in range(call.N):
        q0, q1, S = cu[n], cu[n + 1], lens[n]
        if q1 == q0:  # no query: no rows, nothing read
            continue
        per_block = max(1, paged_block_k(block_k, q1 - q0) // page_size)  # whole pages a block
        lo, hi = key_band(call.is_causal, call.window, S - (q1 - q0), 0, q1 - q0, S)
        first, last = lo // page_size, pages_needed(hi, page_size)  # the band's pages
        blocks = tuple((p0, min(p0 + per_block, last)) for p0 in range(first, last, per_block))
        schedule.append(SequencePages(n, q0, q1, S, blocks))
    return schedule


def check_paged_cache_write(
    key_cache: Any, value_cache: Any, key: Any, value: Any, slot_mapping: Any
) -> tuple[int, int]:
    """Validate one ``paged_cache_write(key_cache, value_cache, key (T, K, D), value (T, K, E),
    slot_mapping (T,))`` call; return ``(T, P * page_size)``, the tokens and the slots.

    The caches as in :func:`check_paged_attention` (a float8 cache too); key and value in the
    cache's dtype with its K, D and E and one T (``cache_write_shape``); ``slot_mapping``
    integer (``slot_mapping_dtype``), ``(T,)`` (``cache_write_shape``), and, where concrete,
    each slot in ``[-1, P * page_size)`` with no slot >= 0 twice (``slot_mapping_value``).
    """
    check_given(key_cache=key_cache, value_cache=value_cache, key=key, value=value,
                slot_mapping=slot_mapping)
    kc, vc = describe(key_cache), describe(value_cache)
    k, v, slots = describe(key), describe(value), describe(slot_mapping)
    _check_caches(kc, vc, fp8=True)
    P, page_size, K, D = kc.shape
    E = vc.shape[3]
    want_k, want_v = f"(T, K={K}, D={D}) {kc.dtype}", f"(T, K={K}, E={E}) {vc.dtype}"
    for name, spec, want, dims in (("key", k, want_k, (K, D)), ("value", v, want_v, (K, E))):
        if len(spec.shape) != 3 or spec.shape[1:] != dims or spec.dtype != kc.dtype:
            raise make_error(
                "cache_write_shape",
                f"{name} must be {want}, the cache's heads, head dim and dtype (quantize an fp8 "
                f"cache's tokens first); got {spec.shape} {spec.dtype}",
                expected=want,
                actual=f"{spec.shape} {spec.dtype}",
            )
    _check_integer("slot_mapping", "slot_mapping_dtype", slots, "page * page_size + offset")
    T = k.shape[0]
    if v.shape[0] != T or slots.shape != (T,):
        listing = f"key {k.shape}, value {v.shape}, slot_mapping {slots.shape}"
        raise make_error(
            "cache_write_shape",
            f"key (T, K, D), value (T, K, E) and slot_mapping (T,) must agree on the tokens T; "
            f"got {listing}",
            expected=f"value ({T}, K, E), slot_mapping ({T},)",
            actual=listing,
        )
    n_slots = P * page_size
    values = _concrete(slot_mapping)
    if values is not None:
        seen: dict[int, int] = {}
        for t, slot in enumerate(values):
            if not -1 <= slot < n_slots:
                raise make_error(
                    "slot_mapping_value",
                    f"slot_mapping[{t}] must be -1 (skip) or a slot in [0, P * page_size = "
                    f"{P} * {page_size} = {n_slots}); got {slot}",
                    expected=f"-1 <= slot_mapping[{t}] < {n_slots}",
                    actual=str(slot),
                )
            if slot >= 0 and slot in seen:
                raise make_error(
                    "slot_mapping_value",
                    f"tokens {seen[slot]} and {t} are both written to slot {slot}: each slot "
                    "takes at most one token (-1, skip, may repeat)",
                    expected="distinct slots >= 0",
                    actual=f"slot_mapping[{seen[slot]}] = slot_mapping[{t}] = {slot}",
                )
            seen[slot] = t
    return T, n_slots
