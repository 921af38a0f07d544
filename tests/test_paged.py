"""Paged key/value caches (Contract v3): ``paged_attention`` and ``paged_cache_write`` in all
three, against the float64 oracle, and their errors, identical in all three."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import impl_jax
import impl_numpy
from attention_spec import (
    PAGED_ERROR_CODES,
    ConfigError,
    DimensionMismatchError,
    DTypeError,
    MaskError,
    check_paged_attention,
    paged_block_k,
    sequence_pages,
)
from conformance import oracle
from conformance.cases.paged import paged_problem, write_problem
from conformance.tests.flash_broken import PAGED_BROKEN
from tests.frameworks import FRAMEWORKS, same_error

ARGS = ("query", "key_cache", "value_cache", "block_table", "seq_lens", "cu_seqlens_q")


def _paged(fw, c, dtype="float64", function="paged_attention", **keywords):
    """``fw.module.<function>`` (``paged_attention`` or the tiled ``paged_flash_attention``) on
    the problem ``c`` (floats rounded to ``dtype``)."""
    cast = {"float64": np.float64, "float32": np.float32}[dtype]
    args = [getattr(c, name) for name in ARGS]
    args = [a.astype(cast) if a.dtype.kind == "f" else a.astype(np.int32) for a in args]
    arrays = {n: np.asarray(a, cast) for n, a in c.arrays.items()}
    kw = {**c.keywords, **{n: fw.asarray(a) for n, a in arrays.items()}, **keywords}
    fn = getattr(fw.module, function)
    return fw.to_numpy(fn(*(fw.asarray(a) for a in args), **kw))


def _golden(c):
    return oracle.paged_attention(*(getattr(c, n) for n in ARGS), **c.keywords, **c.arrays)


PROBLEMS = {
    "page3_mixed_causal": dict(seq_lens=[7, 1, 0, 12, 5], q_lens=[1, 1, 0, 4, 2], page_size=3,
                               is_causal=True),
    "page1": dict(seq_lens=[5, 3, 8], q_lens=[1, 3, 2], page_size=1, is_causal=True),
    "page16": dict(seq_lens=[20, 33, 5], q_lens=[1, 5, 5], page_size=16, is_causal=True),
    "page_larger": dict(seq_lens=[9, 30, 1], q_lens=[2, 1, 1], page_size=64, is_causal=True),
    "not_causal_wide_table": dict(seq_lens=[4, 10], q_lens=[2, 3], page_size=4, max_pages=5),
    "window_sinks": dict(seq_lens=[13, 4], q_lens=[3, 2], page_size=4, is_causal=True,
                         window=(3, 1), sinks=np.linspace(-1, 1, 6)),
    "alibi_softcap": dict(seq_lens=[9, 5], q_lens=[3, 1], page_size=2, is_causal=True,
                          alibi_slopes=np.linspace(0.1, 0.8, 6), softcap=3.0, scale=0.7),
    "mqa": dict(seq_lens=[7, 3], q_lens=[2, 1], page_size=3, h=8, k=1, is_causal=True),
}


FUNCTIONS = ("paged_attention", "paged_flash_attention")


@pytest.mark.parametrize("function", FUNCTIONS)
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_paged_attention_equals_the_oracle(fw, name, function):
    """NaN in every slot no sequence holds, -1 past the pages, shuffled pages: float64 exact
    to rounding, and no NaN anywhere; the plain path and the tiled read (each sequence one
    block of pages here: the small blocks are below)."""
    c = paged_problem(np.random.default_rng(len(name)), **PROBLEMS[name])
    want = _golden(c)
    got = _paged(fw, c, function=function)
    assert got.shape == want.shape and not np.isnan(got).any()
    oracle.assert_within(got, want, "float64")


def test_the_oracle_equals_the_contiguous_oracle_on_gathered_keys():
    """The paged oracle's own loop against :func:`oracle.attention` per sequence over keys
    gathered here (bottom-right, as every cache is)."""
    c = paged_problem(np.random.default_rng(5), **PROBLEMS["window_sinks"])
    want = _golden(c)
    cu, ps = c.cu_seqlens_q, c.key_cache.shape[1]
    for n, s in enumerate(c.seq_lens):
        j = np.arange(s)
        keys = c.key_cache[c.block_table[n, j // ps], j % ps].transpose(1, 0, 2)  # (K, S, D)
        values = c.value_cache[c.block_table[n, j // ps], j % ps].transpose(1, 0, 2)
        q = c.query[cu[n] : cu[n + 1]].transpose(1, 0, 2)  # (H, L, D)
        got = oracle.attention(q, keys, values, causal_alignment="bottom_right", **c.keywords,
                               **c.arrays).output
        oracle.assert_within(got.transpose(1, 0, 2), want[cu[n] : cu[n + 1]], "float64")


@pytest.mark.parametrize("function", FUNCTIONS)
def test_float32_within_a_float32_distance(fw, function):
    c = paged_problem(np.random.default_rng(1), **PROBLEMS["page3_mixed_causal"])
    got = _paged(fw, c, "float32", function)
    assert got.dtype == np.float32
    # the manifest's rule: the golden of the float32-rounded inputs, and the oracle's own
    # float32 computation of them (round_to) for the plain term
    args = [getattr(c, n) for n in ARGS]
    args = [a.astype(np.float32).astype(np.float64) if a.dtype.kind == "f" else a for a in args]
    arrays = {n: np.asarray(a, np.float32).astype(np.float64) for n, a in c.arrays.items()}
    golden = oracle.paged_attention(*args, **c.keywords, **arrays)
    plain = oracle.paged_attention(*args, **c.keywords, **arrays, round_to="float32")
    oracle.assert_within(got, golden, "float32", plain)


def test_jax_under_jit_equals_the_oracle():
    """The plain path jits with every array traced (its shapes are static)."""
    c = paged_problem(np.random.default_rng(2), **PROBLEMS["window_sinks"])
    args = [jnp.asarray(getattr(c, n)) for n in ARGS]
    sinks = jnp.asarray(c.arrays["sinks"])
    kw = dict(c.keywords)
    jitted = jax.jit(lambda *a: impl_jax.paged_attention(*a, **kw, sinks=sinks))
    oracle.assert_within(np.asarray(jitted(*args)), _golden(c), "float64")


def test_the_tiled_read_jits_with_its_lengths_closed_over():
    """The tiled read schedules its blocks on the host: under jax.jit, seq_lens and
    cu_seqlens_q are concrete constants of the traced function (one compilation per schedule),
    the block table, the query and the pools traced."""
    c = paged_problem(np.random.default_rng(2), **PROBLEMS["window_sinks"])
    query, key_cache, value_cache, table, lens, cu = (jnp.asarray(getattr(c, n)) for n in ARGS)
    sinks = jnp.asarray(c.arrays["sinks"])

    @jax.jit
    def step(query, key_cache, value_cache, table):
        return impl_jax.paged_flash_attention(query, key_cache, value_cache, table, lens, cu,
                                              **c.keywords, sinks=sinks)

    got = np.asarray(step(query, key_cache, value_cache, table))
    oracle.assert_within(got, _golden(c), "float64")


@pytest.mark.parametrize(("traced", "code"), [("seq_lens", "seq_lens_value"),
                                              ("cu_seqlens_q", "cu_seqlens_value")])
def test_the_tiled_read_refuses_traced_lengths(traced, code):
    """A traced seq_lens or cu_seqlens_q cannot be scheduled on the host: ConfigError with the
    value code of that array, which says how to call it instead (attention_spec.sequence_pages).
    """
    c = paged_problem(np.random.default_rng(2), **PROBLEMS["page3_mixed_causal"])
    arrays = {n: jnp.asarray(getattr(c, n)) for n in ARGS}

    def call(x):
        given = [x if n == traced else arrays[n] for n in ARGS]
        return impl_jax.paged_flash_attention(*given, **c.keywords)

    with pytest.raises(ConfigError) as info:
        jax.jit(call)(arrays[traced])
    assert info.value.code == code
    assert f"got a traced {traced} (under jax.jit, close over cu_seqlens_q and seq_lens" in str(
        info.value
    )
    assert info.value.actual == "traced"


#: The problems whose sequences span several pages (all but page_larger's one-page sequences).
MULTI_BLOCK = [name for name in PROBLEMS if name != "page_larger"]


def _block_k(pages: int, page_size: int) -> int:
    """A block_k that gives ``pages`` pages a block, one short of the next page (a block is
    ``block_k // page_size`` whole pages)."""
    return pages * page_size + page_size - 1


def _multi_block_errors(fn, name: str, pages: int) -> float:
    """The largest error of the tiled read ``fn(*args, block_k=...)`` (NumPy arrays in and
    out) against the float64 oracle on problem ``name`` at ``pages`` pages a block; inf for a
    NaN anywhere."""
    c = paged_problem(np.random.default_rng(len(name)), **PROBLEMS[name])
    args = [getattr(c, n) for n in ARGS]
    args = [a if a.dtype.kind == "f" else a.astype(np.int32) for a in args]
    got = fn(*args, **c.keywords, **c.arrays, block_k=_block_k(pages, c.key_cache.shape[1]))
    return np.inf if np.isnan(got).any() else float(np.abs(got - _golden(c)).max())


@pytest.mark.parametrize("pages", [1, 2])
@pytest.mark.parametrize("name", MULTI_BLOCK)
def test_the_tiled_read_in_small_blocks_equals_the_oracle(fw, name, pages):
    """One and two pages a block: every sequence of these problems spans several blocks, its
    last page partial with NaN in the unused slots (the fixtures' sequences fit one default
    block of 512 keys, so the walk from block to block is tested here)."""

    def tiled(*args, **kw):
        arrays = {n: fw.asarray(a) if isinstance(a, np.ndarray) else a for n, a in kw.items()}
        return fw.to_numpy(fw.module.paged_flash_attention(*map(fw.asarray, args), **arrays))

    assert _multi_block_errors(tiled, name, pages) <= 1e-12


@pytest.mark.parametrize("bug", list(PAGED_BROKEN))
def test_the_small_blocks_catch_a_broken_block_walk(bug):
    """The test above has power: impl_numpy's tiled read with one line of its block walk broken
    (conformance/tests/flash_broken.py, PAGED_BUGS) fails it."""
    broken = PAGED_BROKEN[bug]
    errors = [_multi_block_errors(broken, n, p) for n in MULTI_BLOCK for p in (1, 2)]
    assert max(errors) > 1e-3, bug


def test_the_schedule_reads_each_sequences_band_in_blocks():
    """attention_spec.sequence_pages: sequences without queries give nothing; a block is
    block_k // page_size whole pages (1 at least), clipped at the last page a sequence's
    queries may attend; a window starts the walk at the page of the first row's first key."""
    c = paged_problem(np.random.default_rng(0), [7, 1, 0, 12, 5], [1, 1, 0, 4, 2], page_size=3)
    args = [getattr(c, n) for n in ARGS]
    call = check_paged_attention(*args, is_causal=True)
    schedule = sequence_pages(call, 7)  # 2 pages a block
    assert [(s.n, s.q0, s.q1, s.S) for s in schedule] == [(0, 0, 1, 7), (1, 1, 2, 1),
                                                          (3, 2, 6, 12), (4, 6, 8, 5)]
    assert [s.blocks for s in schedule] == [((0, 2), (2, 3)), ((0, 1),), ((0, 2), (2, 4)),
                                            ((0, 2),)]
    assert [s.blocks for s in sequence_pages(call, 2)][2] == ((0, 1), (1, 2), (2, 3), (3, 4))
    windowed = check_paged_attention(*args, is_causal=True, window=(4, 0))
    # sequence 3's rows sit at 8..11: the first sees keys 4..8, so pages 1.. (page 0 unread)
    assert sequence_pages(windowed, 7)[2].blocks == ((1, 3), (3, 4))
    with pytest.raises(ConfigError, match="block_k must be"):
        impl_numpy.paged_flash_attention(*args, block_k=0)


def test_the_default_block_fills_the_flash_tile_with_the_sequences_rows():
    """attention_spec.paged_block_k: a decode step's block is PAGED_BLOCK_K = 2048 keys, a chunk
    of 256 rows or more BLOCK_K = 512, between them BLOCK_Q * BLOCK_K / L_n; a block_k given is
    kept; the schedule gives each sequence its own (page 16: 128 pages, then 32)."""
    assert [paged_block_k(None, L) for L in (1, 64, 100, 256, 4096)] == [2048, 2048, 1310, 512,
                                                                         512]
    assert paged_block_k(7, 1) == 7
    with pytest.raises(ConfigError, match="block_k must be"):
        paged_block_k(0, 1)
    c = paged_problem(np.random.default_rng(0), [4000, 4000], [1, 300], page_size=16)
    call = check_paged_attention(*(getattr(c, n) for n in ARGS))
    decode, chunk = sequence_pages(call, None)
    assert decode.blocks[0] == (0, 128) and chunk.blocks[0] == (0, 32)


def test_paged_cache_write(fw):
    """-1 slots skipped (the pool's last slot keeps its number); NumPy and torch write in place
    and return the arrays given, JAX returns new arrays."""
    c = write_problem(np.random.default_rng(3), [4, -1, 0, -1, 10])
    want_k, want_v = oracle.paged_cache_write(c.key_cache, c.value_cache, c.key, c.value,
                                              c.slot_mapping)
    kc, vc = fw.asarray(c.key_cache.copy()), fw.asarray(c.value_cache.copy())
    out_k, out_v = fw.module.paged_cache_write(kc, vc, fw.asarray(c.key), fw.asarray(c.value),
                                               fw.asarray(c.slot_mapping))
    np.testing.assert_array_equal(fw.to_numpy(out_k), want_k)
    np.testing.assert_array_equal(fw.to_numpy(out_v), want_v)
    assert fw.to_numpy(out_k)[-1, -1].tolist() == c.key_cache[-1, -1].tolist()
    if fw.name in ("numpy", "torch"):
        assert out_k is kc and out_v is vc
    else:
        np.testing.assert_array_equal(np.asarray(kc), c.key_cache)  # the input is unchanged


def _ints(*v):
    return np.asarray(v, np.int32)


def _call(query=(3, 6, 4), kc=(4, 3, 2, 4), vc=(4, 3, 2, 5), table=None, lens=None, cu=None,
          dtype=np.float32, **kw):
    """A paged_attention call of two sequences (4 and 5 keys; 1 and 2 queries) but for what is
    given, as a function of the framework."""
    table = _ints([0, 1], [2, 3]) if table is None else table
    lens = _ints(4, 5) if lens is None else lens
    cu = _ints(0, 1, 3) if cu is None else cu
    arrays = [np.zeros(query, dtype), np.zeros(kc, dtype), np.zeros(vc, dtype), table, lens, cu]

    def call(fw):
        return fw.module.paged_attention(
            *(fw.asarray(a) for a in arrays),
            **{k: fw.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()},
        )

    return call


def _write(kc=(4, 3, 2, 4), vc=(4, 3, 2, 5), key=(2, 2, 4), value=(2, 2, 5), slots=None,
           dtype=np.float32, key_dtype=None):
    slots = _ints(0, 1) if slots is None else slots
    arrays = [np.zeros(kc, dtype), np.zeros(vc, dtype), np.zeros(key, key_dtype or dtype),
              np.zeros(value, dtype), slots]
    return lambda fw: fw.module.paged_cache_write(*(fw.asarray(a) for a in arrays))


# id: (call, class, code, a distinctive part of the message)
ERRORS = {
    "cu_float": (_call(cu=np.zeros(3, np.float32)), DTypeError, "cu_seqlens_dtype",
                 "cu_seqlens_q must be integers (the cumulative sequence lengths"),
    "table_float": (_call(table=np.zeros((2, 2), np.float32)), DTypeError, "block_table_dtype",
                    "block_table must be integers"),
    "lens_float": (_call(lens=np.zeros(2, np.float32)), DTypeError, "seq_lens_dtype",
                   "seq_lens must be integers"),
    "cu_end": (_call(cu=_ints(0, 1, 2)), ConfigError, "cu_seqlens_value", "end at T=3"),
    "cu_decreasing": (_call(cu=_ints(0, 2, 1, 3), table=_ints([0], [1], [2]), lens=_ints(2, 2, 2)),
                      ConfigError, "cu_seqlens_value", "cu_seqlens_q[2] = 1 < cu_seqlens_q[1] = 2"),
    "count": (_call(lens=_ints(4, 5, 1)), DimensionMismatchError, "cu_seqlens_count",
              "must agree on the number of sequences N"),
    "cu_rank": (_call(cu=_ints([0, 1, 3])), DimensionMismatchError, "cu_seqlens_count",
                "cu_seqlens_q must have one axis of N + 1 >= 1 entries"),
    "table_rank": (_call(table=_ints(0, 1, 2, 3)), DimensionMismatchError, "rank",
                   "block_table must have shape (N, max_pages)"),
    "lens_past_row": (_call(lens=_ints(7, 5)), ConfigError, "seq_lens_value",
                      "seq_lens[0] must be in [L_n=1, max_pages * page_size = 2 * 3 = 6]"),
    "lens_below_queries": (_call(lens=_ints(4, 1)), ConfigError, "seq_lens_value", "got 1"),
    "table_past_pool": (_call(table=_ints([0, 1], [2, 4])), ConfigError, "block_table_value",
                        "block_table[1, 1] must be a page in [0, P=4)"),
    "table_minus_one": (_call(table=_ints([0, -1], [2, 3])), ConfigError, "block_table_value",
                        "got -1"),
    "page_shape": (_call(vc=(4, 2, 2, 5)), DimensionMismatchError, "page_shape",
                   "must agree on P, page_size and K"),
    "no_pages": (_call(kc=(0, 3, 2, 4), vc=(0, 3, 2, 5)), ConfigError, "non_positive_size",
                 "pages P must be >= 1; got 0"),
    "rank": (_call(query=(3, 6)), DimensionMismatchError, "rank",
             "query must have shape (T, H, D); got shape (3, 6)"),
    "heads": (_call(kc=(4, 3, 4, 4), vc=(4, 3, 4, 5)), DimensionMismatchError,
              "heads_not_divisible", "key heads (K=4) must divide query heads (H=6)"),
    "head_dim": (_call(kc=(4, 3, 2, 3)), DimensionMismatchError, "qk_head_dim_mismatch",
                 "query head dim (D=4)"),
    "sinks": (_call(sinks=np.zeros(2, np.float32)), DimensionMismatchError, "sinks_shape",
              "shape (H=6,); got (2,)"),
    "alibi_dtype": (_call(alibi_slopes=np.zeros(6, np.int32)), DTypeError, "alibi_dtype",
                    "got int32"),
    "window": (_call(window=(-1, 0)), ConfigError, "window_value", None),
    "causal_flag": (_call(is_causal="yes"), ConfigError, "not_a_bool", None),
    "scale_range": (_call(scale=1e39), ConfigError, "scale_range", None),
    "slot_past_pool": (_write(slots=_ints(0, 12)), ConfigError, "slot_mapping_value",
                       "slot_mapping[1] must be -1 (skip) or a slot in [0, P * page_size"),
    "slot_twice": (_write(key=(3, 2, 4), value=(3, 2, 5), slots=_ints(5, -1, 5)), ConfigError,
                   "slot_mapping_value", "tokens 0 and 2 are both written to slot 5"),
    "slot_float": (_write(slots=np.zeros(2, np.float32)), DTypeError, "slot_mapping_dtype",
                   "slot_mapping must be integers"),
    "write_heads": (_write(key=(2, 3, 4)), DimensionMismatchError, "cache_write_shape",
                    "key must be (T, K=2, D=4) float32"),
    "write_dtype": (_write(key_dtype=np.float64), DimensionMismatchError, "cache_write_shape",
                    "got (2, 2, 4) float64"),
    "write_tokens": (_write(slots=_ints(0, 1, 2)), DimensionMismatchError, "cache_write_shape",
                     "must agree on the tokens T"),
    "write_page_shape": (_write(vc=(4, 3, 1, 5)), DimensionMismatchError, "page_shape", None),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_paged_errors_are_identical_in_all_three(case):
    call, cls, code, fragment = ERRORS[case]
    err = same_error(call, cls, code, fragment)
    assert not isinstance(err, MaskError)


@pytest.mark.parametrize("case", [c for c in ERRORS if not c.startswith(("slot", "write"))])
def test_the_tiled_read_raises_the_same(case):
    """``paged_flash_attention`` validates as ``paged_attention`` does, in all three."""
    call, cls, code, fragment = ERRORS[case]

    class Tiled:  # the framework, with paged_attention standing for the tiled read
        def __init__(self, fw):
            self.module = type("M", (), {"paged_attention": fw.module.paged_flash_attention})
            self.asarray = fw.asarray

    same_error(lambda fw: call(Tiled(fw)), cls, code, fragment)


def test_a_mixed_dtype_cache_is_refused_in_all_three():
    arrays = [np.zeros((3, 6, 4), np.float32), np.zeros((4, 3, 2, 4), np.float64),
              np.zeros((4, 3, 2, 5), np.float64), _ints([0, 1], [2, 3]), _ints(4, 5),
              _ints(0, 1, 3)]
    same_error(lambda fw: fw.module.paged_attention(*(fw.asarray(a) for a in arrays)),
               DTypeError, "dtype_mismatch", "query=float32, key_cache=float64")


def test_every_paged_code_has_a_case():
    assert {ERRORS[c][2] for c in ERRORS} >= PAGED_ERROR_CODES


def test_values_are_unchecked_under_jit_and_checked_outside():
    """Under jax.jit the integer arrays are tracers: their values cannot raise (SEMANTICS.md)."""
    table = jnp.asarray(_ints([0, 1], [2, 9]))  # page 9 of 4: refused when concrete
    args = [jnp.zeros((3, 6, 4)), jnp.zeros((4, 3, 2, 4)), jnp.zeros((4, 3, 2, 5))]
    with pytest.raises(ConfigError):
        impl_jax.paged_attention(
            *args, table, jnp.asarray(_ints(4, 5)), jnp.asarray(_ints(0, 1, 3))
        )
    out = jax.jit(impl_jax.paged_attention)(*args, table, jnp.asarray(_ints(4, 5)),
                                            jnp.asarray(_ints(0, 1, 3)))
    assert out.shape == (3, 6, 5)


def _peak(fn, *args, **kw) -> int:
    """Bytes NumPy allocated at the peak of ``fn(*args, **kw)``, above what was live before
    (tracemalloc, as tests/test_flash_memory.py measures)."""
    import tracemalloc

    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        out = fn(*args, **kw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del out
    return peak - before


def test_the_tiled_read_memory_does_not_grow_with_the_pool_or_the_table():
    """A decode step of 4 sequences (page 16, up to 300 keys) in a pool of 64 and of 1024 pages,
    block tables 20 and 320 entries wide: the tiled read's peak is one block of one sequence
    (its keys and values, ``bk * K * (D + E)``, and its scores, ``H * L_n * bk``), whatever the
    pool and the table (it never gathers a row of the table); at one page a block it is a
    page's. The plain path's grows with the table's width."""
    T, H, K, D, E, page_size = 4, 8, 2, 64, 64, 16
    peaks = {}
    for width, spare in ((20, 31), (320, 991)):  # 33 pages needed
        c = paged_problem(np.random.default_rng(6), [300, 17, 120, 64], [1, 1, 1, 1], h=H, k=K,
                          page_size=page_size, max_pages=width, spare=spare, d=D, e=E)
        args = [getattr(c, n) for n in ARGS]
        args = [a.astype(np.float32 if a.dtype.kind == "f" else np.int32) for a in args]
        assert args[1].shape[0] in (64, 1024)
        for block_k in (None, page_size):
            peaks[width, block_k] = _peak(impl_numpy.paged_flash_attention, *args,
                                          block_k=block_k)
        peaks[width, "plain"] = _peak(impl_numpy.paged_attention, *args)
    out = T * H * E * 4  # the output's float32 bytes: kept, and once more concatenated
    # the default block (512 keys) holds the longest sequence's 19 pages whole; one page: 16 keys
    for block_k, bk in ((None, 19 * page_size), (page_size, page_size)):
        block = (bk * K * (D + E) + H * 1 * bk) * 4  # one block's float32 bytes, L_n = 1
        small, wide = peaks[20, block_k], peaks[320, block_k]
        assert wide < 2 * block + 4 * out and wide < 1.5 * small, (block_k, wide, block)
    assert peaks[320, page_size] < peaks[320, None] / 4  # a block's memory, not a sequence's
    plain_small, plain_wide = peaks[20, "plain"], peaks[320, "plain"]
    assert plain_wide > 10 * plain_small and plain_wide > 10 * peaks[320, None]


def test_the_jax_tiled_read_holds_one_block_of_a_long_sequence():
    """JAX's block walk is a lax.fori_loop: the compiled step's temporaries are one block
    (512 keys here), not the sequence's keys, whether it holds 4,096 or 16,384 of them (the
    blocks unrolled held every block's gather: 16.8 MB at 16,384 keys)."""
    rng, page_size, K, D, H = np.random.default_rng(0), 16, 2, 64, 8
    temps = {}
    for S in (4096, 16384):
        pool = jnp.asarray(rng.standard_normal((S // page_size, page_size, K, D), np.float32))
        table = jnp.arange(S // page_size, dtype=jnp.int32)[None]  # (1, S / page_size)
        lens, cu = np.array([S], np.int32), np.array([0, 1], np.int32)
        query = jnp.asarray(rng.standard_normal((1, H, D), np.float32))

        def step(query, key_cache, value_cache, block_table, lens=lens, cu=cu):
            return impl_jax.paged_flash_attention(query, key_cache, value_cache, block_table,
                                                  lens, cu, block_k=512)

        compiled = jax.jit(step).lower(query, pool, pool, table).compile()
        temps[S] = compiled.memory_analysis().temp_size_in_bytes
    block = 512 * K * (D + D) * 4  # one block's keys and values, float32
    assert temps[16384] < 1.5 * temps[4096] and temps[16384] < 4 * block, (temps, block)


def test_the_drawn_block_table_of_semantics_md(fw):
    """docs/SEMANTICS.md's drawing: pages 4 then 1 hold sequence 0's keys a0..a4, page 0
    sequence 1's b0, b1; sequence 1's next key goes to slot 0 * 3 + 2 = 2. Every other slot is
    NaN; the answer is attention over the keys read in that order, bottom-right."""
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((5, 1, 4)), rng.standard_normal((3, 1, 4))  # keys (j, K=1, D=4)
    key_cache = np.full((6, 3, 1, 4), np.nan)
    key_cache[4], key_cache[1, :2], key_cache[0, :2] = a[:3], a[3:], b[:2]
    value_cache = key_cache.copy()  # values equal to keys: (6, 3, 1, E=4)
    table = _ints([4, 1, -1], [0, -1, -1])
    key_cache, value_cache = (
        fw.to_numpy(x)
        for x in fw.module.paged_cache_write(
            fw.asarray(key_cache), fw.asarray(value_cache), fw.asarray(b[2:]),
            fw.asarray(b[2:]), fw.asarray(_ints(2)),
        )
    )
    np.testing.assert_array_equal(key_cache[0, 2], b[2])
    query = rng.standard_normal((3, 2, 4))  # (T=3, H=2, D=4): 2 queries of 0, 1 of 1
    args = (query, key_cache, value_cache, table, _ints(5, 3), _ints(0, 2, 3))
    got = fw.to_numpy(fw.module.paged_attention(*(fw.asarray(x) for x in args), is_causal=True))
    for rows, keys in ((slice(0, 2), a), (slice(2, 3), b)):
        k = keys.transpose(1, 0, 2)  # (K, S, D)
        want = oracle.attention(query[rows].transpose(1, 0, 2), k, k, is_causal=True,
                                causal_alignment="bottom_right").output
        oracle.assert_within(got[rows], want.transpose(1, 0, 2), "float64")


# ---------------------------------------------------------------------------------------------
# FP8 caches (Contract v3, "FP8 inputs and caches"): dequantized as they are read
# ---------------------------------------------------------------------------------------------

FP8_COMBINATIONS = [("float8_e4m3fn", None), ("float8_e5m2", None), ("float8_e4m3fn", "bfloat16"),
                    ("float8_e5m2", "float16"), ("float8_e4m3fn", "float32")]
N_SEQ, H_, K_ = 5, 6, 2


def _descales(kind: str, rng, fp8_query: bool) -> dict:
    """Descales from 1e-2 to 1e2: Python numbers, one per head, or per sequence and head."""
    if kind == "numbers":
        d = {"q_descale": 0.5, "k_descale": 0.07, "v_descale": 30.0}
    elif kind == "per_head":
        d = {"q_descale": np.linspace(0.02, 3.0, H_).astype(np.float32),
             "k_descale": np.array([0.3, 2.0], np.float32),
             "v_descale": np.array([50.0, 0.9], np.float32)}
    else:
        d = {name: (10.0 ** rng.uniform(-2, 2, (N_SEQ, n))).astype(np.float32)
             for name, n in (("q_descale", H_), ("k_descale", K_), ("v_descale", K_))}
    if not fp8_query:
        del d["q_descale"]
    return d


def _fp8_problem(fmt: str, q_dtype: str | None, kind: str):
    import ml_dtypes

    rng = np.random.default_rng(len(fmt) + len(kind) + len(q_dtype or ""))
    c = paged_problem(rng, [7, 1, 0, 12, 5], [1, 1, 0, 4, 2], page_size=3, is_causal=True,
                      window=(6, 0), sinks=np.linspace(-1, 2, H_))
    dt = getattr(ml_dtypes, fmt)
    key_cache, value_cache = (c.key_cache * 4).astype(dt), (c.value_cache * 4).astype(dt)
    q_np = {"bfloat16": ml_dtypes.bfloat16}.get(q_dtype, q_dtype)
    query = (c.query * 4).astype(dt if q_dtype is None else q_np)
    arrays = {"sinks": c.arrays["sinks"].astype(np.float32)}
    args = (query, key_cache, value_cache, c.block_table.astype(np.int32),
            c.seq_lens.astype(np.int32), c.cu_seqlens_q.astype(np.int32))
    return args, {**c.keywords, **arrays, **_descales(kind, rng, q_dtype is None)}


@pytest.mark.parametrize("function", FUNCTIONS)
@pytest.mark.parametrize("kind", ["numbers", "per_head", "per_sequence"])
@pytest.mark.parametrize(("fmt", "q_dtype"), FP8_COMBINATIONS)
def test_an_fp8_cache_matches_the_oracle_within_the_strict_bound(fmt, q_dtype, kind, function):
    """An fp8 cache (NaN in its unused slots: e4m3fn and e5m2 both have NaN), with a float query
    or all fp8: the oracle dequantizes each row in float64 as it reads it; each framework is
    within the strict bound (a correct float32 computation rounded once to the output dtype,
    bfloat16 for an fp8 query) of it, in every framework."""
    args, kw = _fp8_problem(fmt, q_dtype, kind)
    out = "bfloat16" if q_dtype is None else q_dtype
    golden = oracle.paged_attention(*args, **kw)
    plain = oracle.paged_attention(*args, **kw, round_to="float32")
    bound = oracle.tolerance_bound(golden, oracle.rounded(plain, out).astype(np.float64), out)
    for fw in FRAMEWORKS.values():
        got = fw.to_numpy(getattr(fw.module, function)(*args, **kw))
        assert got.dtype.name == out and not np.isnan(got).any(), fw.name
        err = np.abs(got.astype(np.float64) - golden).max()
        assert err <= bound, (fw.name, err, bound)


@pytest.mark.parametrize(("fmt", "q_dtype"), [("float8_e4m3fn", "bfloat16"), ("float8_e5m2", None)])
def test_an_fp8_cache_read_a_page_a_block_matches_the_oracle(fmt, q_dtype):
    """The tiled read at one page a block (the sequences of 7 and 12 keys are 3 and 4 blocks),
    per-sequence descales: each block dequantized with its sequence's row, within the strict
    bound, in every framework."""
    args, kw = _fp8_problem(fmt, q_dtype, "per_sequence")
    out = "bfloat16" if q_dtype is None else q_dtype
    golden = oracle.paged_attention(*args, **kw)
    plain = oracle.paged_attention(*args, **kw, round_to="float32")
    bound = oracle.tolerance_bound(golden, oracle.rounded(plain, out).astype(np.float64), out)
    for fw in FRAMEWORKS.values():
        got = fw.to_numpy(fw.module.paged_flash_attention(*args, **kw, block_k=3))
        err = np.abs(got.astype(np.float64) - golden).max()
        assert err <= bound, (fw.name, err, bound)


def test_a_dropped_or_doubled_descale_fails_the_strict_bound():
    """The bound has power: k_descale dropped, applied twice, or read per query head."""
    args, kw = _fp8_problem("float8_e4m3fn", "bfloat16", "per_sequence")
    golden = oracle.paged_attention(*args, **kw)
    plain = oracle.paged_attention(*args, **kw, round_to="float32")
    bound = oracle.tolerance_bound(golden, oracle.rounded(plain, "bfloat16").astype(np.float64),
                                   "bfloat16")
    for wrong in ({"k_descale": None}, {"k_descale": kw["k_descale"] ** 2},
                  {"v_descale": kw["v_descale"][::-1].copy()}):
        got = impl_numpy.paged_attention(*args, **{**kw, **wrong}).astype(np.float64)
        assert np.abs(got - golden).max() > 2 * bound, wrong


def _fp8_call(kc_dtype="float8_e4m3fn", q_dtype=np.float32, **kw):
    import ml_dtypes

    dt = getattr(ml_dtypes, kc_dtype) if kc_dtype.startswith("float8") else kc_dtype
    arrays = [np.zeros((3, 6, 4), q_dtype), np.zeros((4, 3, 2, 4), dt), np.zeros((4, 3, 2, 5), dt),
              _ints([0, 1], [2, 3]), _ints(4, 5), _ints(0, 1, 3)]
    return lambda fw: fw.module.paged_attention(*arrays, **kw)


FP8_ERRORS = {
    "k_descale_broadcast_only": (_fp8_call(k_descale=np.ones((1, 2), np.float32)),
                                 DimensionMismatchError, "descale_shape",
                                 "k_descale of a token-major call must be (), (K=2,) or (N=2"),
    "k_descale_per_query_head": (_fp8_call(k_descale=np.ones(6, np.float32)),
                                 DimensionMismatchError, "descale_shape", "got (6,)"),
    "descale_float64": (_fp8_call(v_descale=np.ones(2)), DTypeError, "descale_dtype", "float64"),
    "descale_zero": (_fp8_call(k_descale=0.0), ConfigError, "descale_value", None),
    "descale_not_fp8": (_fp8_call("float32", k_descale=1.0), DTypeError, "descale_not_fp8",
                        None),
    "q_descale_float_query": (_fp8_call(q_descale=2.0), DTypeError, "descale_not_fp8", None),
    "float64_query": (_fp8_call(q_dtype=np.float64), DTypeError, "fp8_combination", None),
}


@pytest.mark.parametrize("case", list(FP8_ERRORS))
def test_fp8_paged_errors_are_identical_in_all_three(case):
    call, cls, code, fragment = FP8_ERRORS[case]
    same_error(call, cls, code, fragment)
