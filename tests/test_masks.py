"""Contract v2 masks: the ALiBi slopes helper, and metamorphic checks on random inputs.

The golden fixtures pin chosen cases (conformance/cases/masks.py); here hypothesis draws shapes,
windows, documents and sinks, and each check is an identity the contract implies, run through
one of the three packages (drawn too) with its plain and tiled paths:

- packing documents with segment ids and running once equals running each document alone;
- ``window=(S, S)`` (wider than any sequence) equals no window;
- ``window=(W, 0)`` without ``is_causal`` equals ``is_causal`` with ``window=(W, None)``;
- sinks of ``-inf`` equal no sinks;
- the three packages agree on random window, segment, sink and ALiBi keywords.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import impl_jax
import impl_numpy
import impl_torch
from attention_spec import ConfigError
from tests.frameworks import FRAMEWORKS, NP_DTYPES, assert_agree

PACKAGES = (impl_numpy, impl_torch, impl_jax)
SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = ("float32", "float64")  # compared with tests.frameworks.assert_agree


# -- alibi_slopes(n_heads) ----------------------------------------------------------------------


def paper_slopes(n: int) -> list[float]:
    """The ALiBi paper's slopes, written from its rule
    (a power of two: 2^(-8/n), 2^(-16/n), ...; otherwise the largest power of two's slopes, then
    the odd-indexed ones of twice that)."""
    if n & (n - 1) == 0:
        return [2.0 ** (-8 * (h + 1) / n) for h in range(n)]
    low = 1 << (n.bit_length() - 1)
    return paper_slopes(low) + paper_slopes(2 * low)[0::2][: n - low]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda m: m.__name__)
def test_alibi_slopes_of_eight_heads_are_halvings(package) -> None:
    slopes = np.asarray(package.alibi_slopes(8))
    assert slopes.shape == (8,) and slopes.dtype == np.float32
    assert slopes.tolist() == [float(Fraction(1, 2 ** (h + 1))) for h in range(8)]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda m: m.__name__)
def test_alibi_slopes_of_six_heads_interleave_from_eight(package) -> None:
    """H = 6: 1/4, 1/16, 1/64, 1/256 (four heads), then 1/2 and 1/8 (eight heads' odd ones)."""
    slopes = np.asarray(package.alibi_slopes(6)).tolist()
    assert slopes == [0.25, 1 / 16, 1 / 64, 1 / 256, 0.5, 0.125]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 12, 16, 20, 64])
def test_alibi_slopes_follow_the_paper_in_all_three(n: int) -> None:
    expected = np.asarray(paper_slopes(n), np.float32)
    for package in PACKAGES:
        np.testing.assert_array_equal(np.asarray(package.alibi_slopes(n)), expected)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_alibi_slopes_refuse_a_non_size(package, n) -> None:
    with pytest.raises(ConfigError) as info:
        package.alibi_slopes(n)
    assert info.value.code == "non_positive_size"


# -- metamorphic checks -------------------------------------------------------------------------


def _run(name: str, path: str, q, k, v, **kw) -> np.ndarray:
    """One package's plain or tiled attention on NumPy inputs, as float64 NumPy."""
    fw = FRAMEWORKS[name]
    if path == "plain":
        return fw.sdpa(q, k, v, **kw).astype(np.float64)
    blocks = {"block_q": kw.pop("block_q", 3), "block_k": kw.pop("block_k", 2)}
    args = [fw.asarray(x) for x in (q, k, v)]
    out = fw.module.flash_attention(*args, **fw._kw(kw), **blocks)
    return fw.to_numpy(out).astype(np.float64)


@st.composite
def packages_and_paths(draw):
    name = draw(st.sampled_from(sorted(FRAMEWORKS)))
    path = draw(st.sampled_from(["plain", "tiled"]))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return name, path, dtype, rng


def _qkv(rng, dtype, H, K, L, S, D=4, E=3, batch=(2,)):
    dt = NP_DTYPES[dtype]
    return (
        rng.standard_normal((*batch, H, L, D)).astype(dt),
        rng.standard_normal((*batch, K, S, D)).astype(dt),
        rng.standard_normal((*batch, K, S, E)).astype(dt),
    )


@SETTINGS
@given(packages_and_paths(), st.lists(st.integers(1, 5), min_size=2, max_size=3),
       st.booleans(), st.sampled_from([None, (1, 0), (2, 1)]))
def test_packed_documents_equal_each_document_alone(setup, lengths, is_causal, window) -> None:
    """Self-attention over documents packed in one row, with segment ids, equals attention over
    each document by itself (causal positions and windows are the packed row's, which within a
    document are the document's own)."""
    name, path, dtype, rng = setup
    T = sum(lengths)
    q, k, v = _qkv(rng, dtype, H=4, K=2, L=T, S=T, batch=(1,))
    ids = np.repeat(np.arange(len(lengths)), lengths)  # (T,)
    kw = {"is_causal": is_causal, "window": window}
    packed = _run(name, path, q, k, v, q_segment_ids=ids, kv_segment_ids=ids, **kw)
    start = 0
    for n in lengths:
        doc = slice(start, start + n)
        alone = _run(name, path, q[..., doc, :], k[..., doc, :], v[..., doc, :], **kw)
        assert_agree(packed[..., doc, :], alone, dtype, what=f"document {doc}: ")
        start += n


@SETTINGS
@given(packages_and_paths(), st.integers(1, 6), st.integers(1, 6), st.booleans(),
       st.sampled_from(["top_left", "bottom_right"]))
def test_a_window_wider_than_the_sequence_is_no_window(setup, L, S, is_causal, alignment):
    name, path, dtype, rng = setup
    q, k, v = _qkv(rng, dtype, H=2, K=1, L=L, S=S)
    kw = {"is_causal": is_causal, "causal_alignment": alignment}
    wide = _run(name, path, q, k, v, window=(S + L, S + L), **kw)
    assert_agree(wide, _run(name, path, q, k, v, **kw), dtype)


@SETTINGS
@given(packages_and_paths(), st.integers(1, 6), st.integers(1, 6), st.integers(0, 7),
       st.sampled_from(["top_left", "bottom_right"]))
def test_a_left_window_to_the_diagonal_is_causal(setup, L, S, W, alignment) -> None:
    """``window=(W, 0)`` alone equals ``is_causal`` with ``window=(W, None)``: the window's right
    end is the causal diagonal of the same alignment (rows left without keys are zeros in both)."""
    name, path, dtype, rng = setup
    q, k, v = _qkv(rng, dtype, H=2, K=2, L=L, S=S)
    banded = _run(name, path, q, k, v, window=(W, 0), causal_alignment=alignment)
    causal = _run(name, path, q, k, v, window=(W, None), is_causal=True, causal_alignment=alignment)
    assert_agree(banded, causal, dtype)


@SETTINGS
@given(packages_and_paths(), st.integers(1, 6), st.integers(1, 6), st.booleans())
def test_sinks_of_minus_infinity_are_no_sinks(setup, L, S, masked) -> None:
    name, path, dtype, rng = setup
    q, k, v = _qkv(rng, dtype, H=4, K=2, L=L, S=S)
    kw = {"mask": rng.random((L, S)) > 0.4} if masked else {}
    sinks = np.full(4, -np.inf, NP_DTYPES[dtype])
    with_sinks = _run(name, path, q, k, v, sinks=sinks, **kw)
    assert_agree(with_sinks, _run(name, path, q, k, v, **kw), dtype)


@st.composite
def extra_keyword_problems(draw):
    """Random shapes with a random subset of the window, segment ids, sinks
    and ALiBi slopes, on top of causal and a mask."""
    L, S = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    K, G = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 3]))
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q, k, v = _qkv(rng, dtype, H=K * G, K=K, L=L, S=S)
    dt = NP_DTYPES[dtype]
    kw = {"causal_alignment": draw(st.sampled_from(["top_left", "bottom_right"]))}
    kw["is_causal"] = draw(st.booleans())
    if draw(st.booleans()):
        kw["window"] = (draw(st.sampled_from([None, 0, 1, 3])), draw(st.sampled_from([None, 0, 2])))
    if draw(st.booleans()):
        kw["q_segment_ids"] = np.sort(rng.integers(0, 3, (2, L)), axis=-1)
        kw["kv_segment_ids"] = rng.integers(0, 3, (S,))  # unsorted: equality is the rule
    if draw(st.booleans()):
        kw["sinks"] = rng.standard_normal(K * G).astype(dt)
    if draw(st.booleans()):
        kw["alibi_slopes"] = np.asarray(impl_numpy.alibi_slopes(K * G)).astype(dt)
    if draw(st.booleans()):
        kw["mask"] = rng.random((L, S)) > 0.3
    blocks = {"block_q": draw(st.integers(1, 4)), "block_k": draw(st.integers(1, 5))}
    return q, k, v, kw, dtype, blocks


# slow: 10 random problems through six paths, JAX compiling each (32 s of a cold `make test`);
# `make test-slow` runs it, beside test_properties' property test of the same kind.
@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extra_keyword_problems())
def test_the_three_packages_agree_on_extra_keywords_plain_and_tiled(problem) -> None:
    q, k, v, kw, dtype, blocks = problem
    ref = _run("numpy", "plain", q, k, v, **kw)
    assert not np.isnan(ref).any()
    for name in ("numpy", "torch", "jax"):
        for path in ("plain", "tiled"):
            if (name, path) == ("numpy", "plain"):
                continue
            got = _run(name, path, q, k, v, **kw, **(blocks if path == "tiled" else {}))
            assert_agree(got, ref, dtype, what=f"{name} {path}: ")
