"""Paged key/value cache cases (Contract v3): ``paged_attention`` and ``paged_cache_write``.

``@paged_case`` functions build one ``paged_attention(query, key_cache, value_cache,
block_table, seq_lens, cu_seqlens_q, **keywords)`` call (``paged.<name>.<dtype>``) with
:func:`paged_problem`: a pool of pages, shuffled among the sequences (never in order, so a port
that reads the cache as contiguous rows fails), the block-table entries past a sequence's pages
-1, and every slot no sequence holds (the tail of a partial last page, the spare pages, the
last page of the pool among them) NaN, so any read past ``seq_lens[n]`` shows (vLLM's kernel
tests do the same). Queries are a sequence's last ``L_n`` positions: a decode step is
``L_n = 1``, a chunked prefill ``L_n > 1``; most cases mix both, with an empty sequence.
``@paged_write_case`` functions build one ``paged_cache_write`` call
(``paged_write.<name>.<dtype>``), and the error cases at the end a call that must raise, with
the integer arrays' values given (the value checks need them).

The golden is the oracle's :func:`~conformance.oracle.paged_attention` (one token, head and key
at a time, its own gather loop), cross-checked at generation against the contiguous oracle
:func:`~conformance.oracle.attention` on the keys gathered here
(:func:`conformance.generate.paged.contiguous_check`).

Sizes: H=6, K=2 (value head n shifted by 2n, key head n by 0.5n, so a read of head h % K shows),
D=11, E=13.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from conformance.cases.base import ALL_DTYPES, F32, Zeros, case, normal, z

H, K, D, E = 6, 2, 11, 13


@dataclass
class PagedCall:
    """One ``paged_attention`` call: float64 ``query (T, H, D)`` and caches ``(P, page_size,
    K, D|E)`` (NaN in every slot no sequence holds), integer ``block_table (N, max_pages)``,
    ``seq_lens (N,)``, ``cu_seqlens_q (N + 1,)``, the ``sinks`` and ``alibi_slopes`` given
    (``arrays``) and the other keywords. In an error case the floating inputs are
    :class:`Zeros` and the integer ones NumPy arrays (their values matter)."""

    query: Any
    key_cache: Any
    value_cache: Any
    block_table: Any
    seq_lens: Any
    cu_seqlens_q: Any
    keywords: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, Any] = field(default_factory=dict)
    #: An fp8 case (``paged.fp8.*``): name -> a float32 array ``(H|K,)`` or ``(N, H|K)``, a
    #: float, or None for an input that is not fp8; the float64 arrays are then the values
    #: *before* quantization (each row at its own sequence's descale), and ``query_dtype`` None
    #: (the query is fp8 too) or the float dtype of the query.
    descales: dict[str, Any] | None = None
    query_dtype: str | None = None


@dataclass
class PagedWriteCall:
    """One ``paged_cache_write(key_cache, value_cache, key, value, slot_mapping)`` call."""

    key_cache: Any
    value_cache: Any
    key: Any
    value: Any
    slot_mapping: Any


#: The positional inputs of each call, in order.
PAGED_INPUTS = ("query", "key_cache", "value_cache", "block_table", "seq_lens", "cu_seqlens_q")
PAGED_WRITE_INPUTS = ("key_cache", "value_cache", "key", "value", "slot_mapping")
#: The integer inputs (stored as int32).
INTEGER_INPUTS = ("block_table", "seq_lens", "cu_seqlens_q", "slot_mapping")


def paged_problem(
    rng: np.random.Generator,
    seq_lens: list[int],
    q_lens: list[int],
    *,
    page_size: int,
    max_pages: int | None = None,
    spare: int = 2,
    h: int = H,
    k: int = K,
    d: int = D,
    e: int = E,
    order: str = "shuffled",
    **keywords: Any,
) -> PagedCall:
    """A paged call: sequence n holds ``seq_lens[n]`` keys and asks ``q_lens[n]`` queries.

    Its ``ceil(seq_lens[n] / page_size)`` pages come from a pool of all the pages needed plus
    ``spare`` pages no sequence uses (the pool's last page is always a spare one, when there is
    one: a port reading -1 as the last page reads NaN); ``order="shuffled"`` deals them out in
    a random order (never sorted), ``"in_order"`` one after another. ``max_pages``: the
    block table's width (default: the most pages a sequence needs). Keys and values of key
    head n are shifted by 0.5n and 2n; every slot no sequence holds is NaN. ``keywords``: the
    call's keywords; ``sinks`` and ``alibi_slopes`` go among its arrays."""
    need = [-(-s // page_size) for s in seq_lens]
    width = max(need, default=0) if max_pages is None else max_pages
    P = sum(need) + spare
    pool = np.arange(P - spare) if order == "in_order" else rng.permutation(P - spare)
    table = np.full((len(seq_lens), width), -1, dtype=np.int64)
    start = 0
    for n, pages in enumerate(need):
        table[n, :pages] = pool[start : start + pages]
        start += pages
    key_cache = np.full((P, page_size, k, d), np.nan)
    value_cache = np.full((P, page_size, k, e), np.nan)
    for n, s in enumerate(seq_lens):
        for j in range(s):
            page, offset = table[n, j // page_size], j % page_size
            key_cache[page, offset] = normal(rng, k, d) + 0.5 * np.arange(k)[:, None]
            value_cache[page, offset] = normal(rng, k, e) + 2.0 * np.arange(k)[:, None]
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int64)
    query = normal(rng, int(cu[-1]), h, d)
    arrays = {name: keywords.pop(name) for name in ("sinks", "alibi_slopes") if name in keywords}
    return PagedCall(query, key_cache, value_cache, table, np.asarray(seq_lens, np.int64), cu,
                     keywords, arrays)


#: The aliases a paged_attention case is run against: the plain path and the tiled read.
PAGED_FUNCTIONS = ("paged", "paged_flash")
paged_case = partial(case, "paged", functions=PAGED_FUNCTIONS)
paged_write_case = partial(case, "paged_write", functions=("paged_write",))


# ---------------------------------------------------------------------------------------------
# paged_attention: page sizes, block tables, lengths
# ---------------------------------------------------------------------------------------------


@paged_case("page3.decode_and_prefill.causal", ALL_DTYPES)
def page3_mixed(rng, dtype):
    """Page size 3: decode steps (L_n = 1), a chunked prefill (L_n = 4 of 12 keys, exactly
    max_pages * page_size), an empty sequence (seq_lens 0) and a partial last page, causal.
    A port aligning causal top-left lets the chunk's first row see one key, not nine."""
    return paged_problem(rng, [7, 1, 0, 12, 5], [1, 1, 0, 4, 2], page_size=3, is_causal=True)


@paged_case("page1.causal")
def page1(rng, dtype):
    """Page size 1: every key its own page, scattered over the pool."""
    return paged_problem(rng, [5, 3, 8], [1, 3, 2], page_size=1, is_causal=True)


@paged_case("page16.causal", ("float32", "bfloat16"))
def page16(rng, dtype):
    """Page size 16 (vLLM's default): two sequences over several pages, one within its first."""
    return paged_problem(rng, [20, 33, 5], [1, 5, 5], page_size=16, is_causal=True)


@paged_case("page_larger_than_every_sequence")
def page_larger(rng, dtype):
    """Page size 64, larger than every sequence: one partial page each."""
    return paged_problem(rng, [9, 30, 1], [2, 1, 1], page_size=64, is_causal=True)


@paged_case("in_order.not_causal")
def in_order(rng, dtype):
    """Pages dealt out in order, the block table wider than any sequence needs (-1 past the
    pages), no causal rule: a chunk's queries see every key of their sequence."""
    return paged_problem(rng, [4, 10, 6], [2, 3, 1], page_size=4, max_pages=5, order="in_order")


@paged_case("full_rows.page4")
def full_rows(rng, dtype):
    """Every sequence exactly max_pages * page_size keys (no partial page, no -1 entry)."""
    return paged_problem(rng, [8, 8, 8], [1, 2, 8], page_size=4, is_causal=True)


@paged_case("empty_sequences")
def empty_sequences(rng, dtype):
    """Sequences with no keys and no queries around one decode step; a sequence with keys but
    no queries (L_n = 0) reads nothing."""
    return paged_problem(rng, [0, 6, 0, 5], [0, 1, 0, 0], page_size=2, is_causal=True)


@paged_case("shared_prefix_page")
def shared_prefix(rng, dtype):
    """Two sequences sharing their first page (prefix caching: one block-table entry in two
    rows); the page sequence 1 had is now used by no sequence, NaN. A port that assumes each
    page belongs to one sequence, or that a row's pages are distinct from the others', fails."""
    c = paged_problem(rng, [7, 5], [2, 1], page_size=3, is_causal=True)
    own = c.block_table[1, 0]
    c.block_table[1, 0] = c.block_table[0, 0]  # sequence 1 reads sequence 0's first 3 keys
    c.key_cache[own], c.value_cache[own] = np.nan, np.nan
    return c


@paged_case("decode.gqa_h8_k2.page16", ("float32", "bfloat16"))
def decode_gqa(rng, dtype):
    """A decode step of 8 sequences of different lengths (1 to 97 keys), GQA 8:2, page 16: the
    serving batch of the bench's paged row, at small sizes."""
    lens = [97, 1, 33, 16, 17, 64, 5, 48]
    return paged_problem(rng, lens, [1] * 8, page_size=16, h=8, k=2, is_causal=True)


# ---------------------------------------------------------------------------------------------
# paged_attention: heads and the v2 keywords
# ---------------------------------------------------------------------------------------------


@paged_case("gqa.h8_k1")
def gqa_h8_k1(rng, dtype):
    """MQA 8:1 on a paged cache: every query head reads the one key/value head."""
    return paged_problem(rng, [7, 3], [2, 1], page_size=3, h=8, k=1, is_causal=True)


@paged_case("mha.h3_k3")
def mha(rng, dtype):
    """MHA: head h reads key/value head h."""
    return paged_problem(rng, [7, 3], [3, 1], page_size=3, h=3, k=3, is_causal=True)


@paged_case("window.left3.causal", ("float32", "float16"))
def window_left(rng, dtype):
    """A sliding window of 3 before the diagonal (4 keys), causal, on the token's own position:
    the chunk's rows each see their last 4 keys, across page boundaries."""
    return paged_problem(rng, [11, 7, 2], [4, 1, 2], page_size=3, is_causal=True, window=(3, 0))


@paged_case("window.both_sides.not_causal")
def window_both(rng, dtype):
    """A window (2, 1) without causal: the chunk's rows see one key after their position."""
    return paged_problem(rng, [10, 6], [3, 2], page_size=4, window=(2, 1))


@paged_case("sinks.window.gpt_oss")
def sinks_window(rng, dtype):
    """gpt-oss on a paged cache: attention sinks with a sliding window (7 keys), causal."""
    sinks = normal(rng, H)
    return paged_problem(rng, [13, 4, 9], [1, 3, 2], page_size=4, is_causal=True, window=(6, 0),
                         sinks=sinks)


@paged_case("softcap.window.gemma", ("float32", "bfloat16"))
def softcap_window(rng, dtype):
    """Gemma 2 on a paged cache: softcap 2 (scaled scores of order 3 are capped) with a local
    window, causal, a custom scale."""
    return paged_problem(rng, [12, 5], [3, 1], page_size=3, is_causal=True, window=(4, 0),
                         softcap=2.0, scale=1.0)


@paged_case("alibi.causal")
def alibi_causal(rng, dtype):
    """ALiBi on the token's position: -slope[h] * |p - j| with p = seq_lens[n] - L_n + i."""
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    return paged_problem(rng, [9, 5, 1], [3, 1, 1], page_size=2, is_causal=True,
                         alibi_slopes=slopes)


# ---------------------------------------------------------------------------------------------
# paged_attention on an fp8 cache (Contract v3, "FP8 inputs and caches"): token-major descales
# ---------------------------------------------------------------------------------------------

FP8 = ("float8_e4m3fn", "float8_e5m2")


def slot_sequences(c: PagedCall) -> np.ndarray:
    """The sequence holding each slot of the pool, ``(P, page_size)`` int64, -1 for a slot no
    sequence holds (the fp8 cases share no page between sequences)."""
    P, page_size = c.key_cache.shape[:2]
    owner = np.full((P, page_size), -1, np.int64)
    for n, s in enumerate(np.asarray(c.seq_lens).tolist()):
        for j in range(s):
            owner[c.block_table[n, j // page_size], j % page_size] = n
    return owner


def paged_fp8_problem(rng, seq_lens, q_lens, qd, kd, vd, query_dtype=None, **keywords) -> PagedCall:
    """A :func:`paged_problem` whose inputs are fp8 (conformance/generate/paged.py quantizes
    each at its static descale, each query token and each cache slot at its own sequence's):
    values of order 4 times the descale of the row's sequence, so a descale read from another
    sequence or head changes the answer. Every slot no sequence holds stays NaN; half of them
    (every other page) negative NaN, so both of the format's NaN bytes (e4m3fn 0x7f and 0xff)
    are in the pool."""
    c = paged_problem(rng, seq_lens, q_lens, **keywords)
    N = len(seq_lens)
    owner = slot_sequences(c)  # (P, page_size)
    for name, d in (("key_cache", kd), ("value_cache", vd)):
        x = getattr(c, name) * 4.0  # (P, page_size, K, D|E)
        if d is not None:
            per_sequence = np.broadcast_to(np.asarray(d, np.float64), (N, x.shape[2]))  # (N, K)
            slot_d = np.where((owner >= 0)[..., None], per_sequence[np.maximum(owner, 0)], 1.0)
            x = x * slot_d[..., None]  # (P, page_size, K, 1)
        x[1::2] = np.where(np.isnan(x[1::2]), -np.nan, x[1::2])  # negative NaN on odd pages
        setattr(c, name, x)
    q = c.query * 4.0  # (T, H, D)
    if qd is not None:
        per_sequence = np.broadcast_to(np.asarray(qd, np.float64), (N, q.shape[1]))  # (N, H)
        q = q * np.repeat(per_sequence, np.diff(c.cu_seqlens_q), axis=0)[:, :, None]
    c.query = q
    c.descales = {"q_descale": qd, "k_descale": kd, "v_descale": vd}
    c.query_dtype = query_dtype
    return c


#: Per-sequence descales ``(N=4, K=2)``, differing between sequences and between a GQA group's
#: key/value heads (so sequence 0's row, a head's neighbour or a dropped descale is far outside
#: the bound); sequence 2 is empty (its row is checked, never read). The query's descales are
#: chosen so that ``q_descale * k_descale`` stays between 0.08 and 0.32: scores of order 1 to
#: 5, a softmax that is not one-hot, in which a wrong k_descale shows.
_KD = np.array([[0.3, 0.04], [6.0, 6.0], [1.0, 1.0], [2.0, 20.0]], np.float32)
_VD = np.array([[1e-2, 3.0], [1.0, 0.2], [1.0, 1.0], [40.0, 0.5]], np.float32)
_QD = np.array([[0.5, 0.3, 1.0, 5.0, 2.0, 8.0], [0.02, 0.05, 0.03, 0.04, 0.01, 0.02],
                [1.0] * 6, [0.1, 0.05, 0.08, 0.01, 0.012, 0.015]], np.float32)
#: k_descale of the caches read by a float query (of order 4): 0.01 to 0.5, scores of order 1.
_KD_CACHE = np.array([[0.02, 0.1], [0.5, 0.05], [1.0, 1.0], [0.01, 0.3]], np.float32)


@paged_case("fp8.all.per_sequence.causal", FP8)
def paged_fp8_per_sequence(rng, dtype):
    """All fp8, page 3, N = 4 (decode steps, a chunked prefill, an empty sequence), GQA 6:2,
    causal on the token's position; q_descale ``(N, H)``, k_descale and v_descale ``(N, K)``
    from 1e-2 to 40: sequence 0's row for every sequence, k_descale read by query head or a
    dropped descale is far outside the bound. The unused slots are NaN (0x7f/0xff in e4m3fn,
    e5m2's NaN bytes too). Output bfloat16."""
    return paged_fp8_problem(rng, [7, 1, 0, 12], [1, 1, 0, 4], _QD, _KD, _VD, page_size=3,
                             is_causal=True)


@paged_case("fp8.all.per_head.window_sinks", ("float8_e4m3fn",))
def paged_fp8_per_head(rng, dtype):
    """All e4m3, the per-head and per-tensor forms: q_descale ``(H,)``, k_descale ``(K,)``
    (0.04 and 20: a key head's descale read by query head h % K instead of h // G is off by
    500x), v_descale a scalar keyword; causal with a window (4, 0) and gpt-oss sinks, page 4."""
    qd = np.array([5.0, 2.0, 8.0, 0.01, 0.015, 0.012], np.float32)
    sinks = np.linspace(-1.0, 2.0, H).astype(np.float32)
    return paged_fp8_problem(rng, [9, 5, 13], [2, 1, 3], qd, np.array([0.04, 20.0], np.float32),
                             float(np.float32(0.125)), page_size=4, is_causal=True,
                             window=(4, 0), sinks=sinks)


@paged_case("fp8.kv_cache.bfloat16_query.per_sequence.window", ("float8_e4m3fn",))
def paged_fp8_cache_bf16(rng, dtype):
    """An e4m3 key/value cache with a bfloat16 query (no q_descale), k_descale and v_descale
    per sequence ``(N, K)``, an empty sequence and a sequence with keys but no query, causal
    with a window (5, 0), page 2: output bfloat16."""
    return paged_fp8_problem(rng, [6, 11, 0, 4], [1, 3, 0, 0], None, _KD_CACHE, _VD, "bfloat16",
                             page_size=2, is_causal=True, window=(5, 0))


@paged_case("fp8.kv_cache.float16_query.per_head.causal", ("float8_e5m2",))
def paged_fp8_cache_f16(rng, dtype):
    """An e5m2 key/value cache with a float16 query, k_descale ``(K,)`` (0.5 and 0.02) and
    v_descale ``(K,)`` (1e-2 and 1e2), GQA 6:2, decode steps and a chunk, causal, page 4:
    output float16."""
    return paged_fp8_problem(rng, [10, 3, 17], [1, 1, 5], None, np.array([0.5, 0.02], np.float32),
                             np.array([0.01, 100.0], np.float32), "float16", page_size=4,
                             is_causal=True)


@paged_case("fp8.kv_cache.float32_query.scalar.causal_sinks", ("float8_e4m3fn",))
def paged_fp8_cache_f32(rng, dtype):
    """An e4m3 key/value cache with a float32 query, k_descale and v_descale float32 arrays of
    shape ``()`` (per tensor: 0.03 and 70), causal with sinks, an empty sequence, page 3:
    output float32."""
    sinks = np.linspace(1.5, -0.5, H).astype(np.float32)
    return paged_fp8_problem(rng, [8, 0, 5], [2, 0, 1], None, np.array(0.03, np.float32),
                             np.array(70.0, np.float32), "float32", page_size=3, is_causal=True,
                             sinks=sinks)


# ---------------------------------------------------------------------------------------------
# paged_cache_write
# ---------------------------------------------------------------------------------------------


def write_problem(rng, slots: list[int], *, P: int = 4, page_size: int = 3) -> PagedWriteCall:
    """Caches of P pages filled with numbers, and one token per slot of ``slots`` to write."""
    T = len(slots)
    return PagedWriteCall(
        normal(rng, P, page_size, K, D), normal(rng, P, page_size, K, E),
        normal(rng, T, K, D), normal(rng, T, K, E), np.asarray(slots, np.int64),
    )


@paged_write_case("padding_slots", ALL_DTYPES)
def write_padding(rng, dtype):
    """Two padding tokens (-1, repeated) among five: they are skipped; the pool's last slot
    (11), which a port taking -1 as an index would overwrite, keeps its number."""
    return write_problem(rng, [4, -1, 0, -1, 10])


@paged_write_case("scattered_pages")
def write_scattered(rng, dtype):
    """A prefill's tokens written to slots of two non-adjacent pages, out of order."""
    return write_problem(rng, [9, 10, 11, 3, 4], P=5)


# ---------------------------------------------------------------------------------------------
# Errors: the floating inputs as shapes, the integer ones with their values
# ---------------------------------------------------------------------------------------------


def _ints(*values) -> np.ndarray:
    return np.asarray(values, np.int32)


def paged_error(T=3, P=4, page_size=3, k=K, d=D, e=E, h=H, *, block_table=None, seq_lens=None,
                cu_seqlens_q=None, dtype="float32", **keywords) -> PagedCall:
    """A valid call of two sequences (4 and 5 keys; 1 and 2 queries) but for what is given."""
    table = _ints([0, 1], [2, 3]) if block_table is None else block_table
    return PagedCall(
        z(T, h, d, dtype=dtype), z(P, page_size, k, d, dtype=dtype),
        z(P, page_size, k, e, dtype=dtype), table,
        _ints(4, 5) if seq_lens is None else seq_lens,
        _ints(0, 1, 3) if cu_seqlens_q is None else cu_seqlens_q,
        {name: v for name, v in keywords.items() if name not in ("sinks", "alibi_slopes")},
        {name: v for name, v in keywords.items() if name in ("sinks", "alibi_slopes")},
    )


def paged_error_case(name: str, error_class: str, code: str):
    """Register ``fn() -> PagedCall`` as ``paged.error.<name>.float32``."""
    return case("paged", name, F32, functions=PAGED_FUNCTIONS, error=(error_class, code))


def paged_write_error_case(name: str, error_class: str, code: str):
    """Register ``fn() -> PagedWriteCall`` as ``paged_write.error.<name>.float32``."""
    return case("paged_write", name, F32, functions=("paged_write",), error=(error_class, code))


@paged_error_case("cu_seqlens_float", "DTypeError", "cu_seqlens_dtype")
def err_cu_dtype():
    """cu_seqlens_q of floats."""
    return paged_error(cu_seqlens_q=Zeros((3,), "float32"))


@paged_error_case("block_table_float", "DTypeError", "block_table_dtype")
def err_table_dtype():
    """A block table of floats."""
    return paged_error(block_table=Zeros((2, 2), "float32"))


@paged_error_case("seq_lens_float", "DTypeError", "seq_lens_dtype")
def err_lens_dtype():
    """seq_lens of floats."""
    return paged_error(seq_lens=Zeros((2,), "float32"))


@paged_error_case("cu_seqlens_not_ending_at_t", "ConfigError", "cu_seqlens_value")
def err_cu_value():
    """cu_seqlens_q ending at 2 for T = 3 query tokens."""
    return paged_error(cu_seqlens_q=_ints(0, 1, 2))


@paged_error_case("cu_seqlens_decreasing", "ConfigError", "cu_seqlens_value")
def err_cu_decreasing():
    """cu_seqlens_q going down (0, 2, 1, 3): a negative L_n."""
    return paged_error(cu_seqlens_q=_ints(0, 2, 1, 3), block_table=_ints([0], [1], [2]),
                       seq_lens=_ints(2, 2, 2))


@paged_error_case("seq_lens_count", "DimensionMismatchError", "cu_seqlens_count")
def err_count():
    """Three seq_lens for a block table of two sequences."""
    return paged_error(seq_lens=_ints(4, 5, 1))


@paged_error_case("seq_lens_past_the_row", "ConfigError", "seq_lens_value")
def err_lens_past_row():
    """seq_lens 7 for a row of 2 pages of 3 slots (6 keys at most)."""
    return paged_error(seq_lens=_ints(7, 5))


@paged_error_case("seq_lens_below_queries", "ConfigError", "seq_lens_value")
def err_lens_below_queries():
    """A sequence of 2 queries and 1 key: its queries are its last positions, so L_n <= S_n."""
    return paged_error(seq_lens=_ints(4, 1))


@paged_error_case("seq_lens_negative", "ConfigError", "seq_lens_value")
def err_lens_negative():
    """A negative key count."""
    return paged_error(seq_lens=_ints(-1, 5), cu_seqlens_q=_ints(0, 0, 3), T=3)


@paged_error_case("block_table_past_the_pool", "ConfigError", "block_table_value")
def err_table_past_pool():
    """A page id 4 in a pool of 4 pages, in a page the sequence needs."""
    return paged_error(block_table=_ints([0, 1], [2, 4]))


@paged_error_case("block_table_minus_one_needed", "ConfigError", "block_table_value")
def err_table_minus_one():
    """-1 where sequence 0 needs its second page (4 keys in pages of 3)."""
    return paged_error(block_table=_ints([0, -1], [2, 3]))


@paged_error_case("page_shape", "DimensionMismatchError", "page_shape")
def err_page_shape():
    """A value cache with another page size than the key cache."""
    c = paged_error()
    c.value_cache = z(4, 2, K, E)
    return c


@paged_error_case("heads_not_divisible", "DimensionMismatchError", "heads_not_divisible")
def err_heads():
    """K = 4 key/value heads for H = 6 query heads."""
    return paged_error(k=4)


@paged_error_case("sinks_shape", "DimensionMismatchError", "sinks_shape")
def err_sinks():
    """Sinks of K entries, not H."""
    return paged_error(sinks=z(K))


@paged_write_error_case("slot_past_the_pool", "ConfigError", "slot_mapping_value")
def err_slot_past():
    """Slot 12 in a pool of 4 pages of 3 slots."""
    return PagedWriteCall(z(4, 3, K, D), z(4, 3, K, E), z(2, K, D), z(2, K, E), _ints(0, 12))


@paged_write_error_case("slot_twice", "ConfigError", "slot_mapping_value")
def err_slot_twice():
    """Two tokens into slot 5 (-1 may repeat, a slot >= 0 may not)."""
    return PagedWriteCall(z(4, 3, K, D), z(4, 3, K, E), z(3, K, D), z(3, K, E), _ints(5, -1, 5))


@paged_write_error_case("slot_mapping_float", "DTypeError", "slot_mapping_dtype")
def err_slot_dtype():
    """A slot mapping of floats."""
    return PagedWriteCall(z(4, 3, K, D), z(4, 3, K, E), z(2, K, D), z(2, K, E), z(2))


@paged_write_error_case("key_heads", "DimensionMismatchError", "cache_write_shape")
def err_write_heads():
    """Keys of 3 heads for a cache of K = 2."""
    return PagedWriteCall(z(4, 3, K, D), z(4, 3, K, E), z(2, 3, D), z(2, K, E), _ints(0, 1))
