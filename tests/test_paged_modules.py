"""The modules' paged KV cache (``init_cache(..., page_size=)``) in the three frameworks.

A decode on a paged cache must give the contiguous cache's outputs, token by token and in
uneven chunks, with RoPE, a window, sinks, ALiBi, softcap and GQA; both are checked against the
float64 oracle's module (one causal forward over the sequence). The pool starts full of NaN, so
any read of a slot a sequence does not hold shows. JAX runs under nnx.jit (module_frameworks.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attention_spec import ConfigError, DimensionMismatchError
from conformance.oracle import assert_within
from tests.frameworks import same_error
from tests.module_frameworks import MODULE_FRAMEWORKS, B, H, M, random_canonical
from tests.module_frameworks import reference_forward as reference

T, MAX_LEN, PAGE = 10, 12, 3  # the last page partial (12 = 4 pages of 3; 10 tokens: 4 pages)
CHUNKINGS = ([1] * T, [3, 1, 4, 2])  # token by token; uneven chunks straddling pages
OPTIONS = {
    "rope_gqa": dict(rope_theta=10000.0, rotary_dim=10),
    "gemma_gptoss": dict(
        rope_theta=500.0, rotary_dim=10, window=(3, 0), alibi=True, softcap=4.0, sinks=True
    ),  # a window on the paged cache, sinks, ALiBi and softcap, GQA 6:2
}


def _nan_pool(mf, cache):
    """The paged cache with every slot of its pool NaN (none is written yet)."""
    nan = np.full(mf.to_numpy(cache.key_pages).shape, np.nan)
    nan_v = np.full(mf.to_numpy(cache.value_pages).shape, np.nan)
    return dataclasses.replace(cache, key_pages=mf.asarray(nan), value_pages=mf.asarray(nan_v))


@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.slow] if n == "jax" else []) for n in MODULE_FRAMEWORKS],
)  # JAX compiles each step anew (S grows): ~8 s, in make test-slow
def test_paged_decode_is_the_contiguous_decode(name, options):
    mf = MODULE_FRAMEWORKS[name]
    rng = np.random.default_rng(40)
    weights = random_canonical(rng, K=2)
    kw = dict(OPTIONS[options])
    if kw.pop("sinks", False):
        weights["sinks"] = rng.standard_normal(H)
    module = mf.build(weights, H, 2, **kw)
    x = rng.standard_normal((B, T, M))
    want, _ = reference(weights, x, None, n_heads=H, n_kv_heads=2, is_causal=True, **kw)
    for chunks in CHUNKINGS:
        plain, paged = module.init_cache(B, MAX_LEN), module.init_cache(B, MAX_LEN, page_size=PAGE)
        paged = _nan_pool(mf, paged)
        got, ref, start = [], [], 0
        for n in chunks:
            y_ref, plain = mf.decode(module, x[:, start : start + n], plain)
            y, paged = mf.decode(module, x[:, start : start + n], paged)
            ref.append(y_ref)
            got.append(y)
            start += n
            assert paged.position == start
        got, ref = np.concatenate(got, axis=1), np.concatenate(ref, axis=1)
        assert_within(got, ref, "float64", what=f"paged against contiguous, {chunks}: ")
        assert_within(got, want, "float64", what=f"paged against the oracle, {chunks}: ")
    # the sequences took their pages as they grew, interleaved in the pool: 4 pages each.
    table = mf.to_numpy(paged.block_table())
    assert table.tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]] and paged.free == ()


def test_paged_pool_grows_page_by_page():
    """Pages are taken only when a token needs them; -1 marks the pages not taken; the pool is
    B * ceil(max_len / page_size) pages, the contiguous cache's bytes rounded up to pages."""
    for mf in MODULE_FRAMEWORKS.values():
        module = mf.build(random_canonical(np.random.default_rng(41), K=2), H, 2)
        cache = module.init_cache(B, MAX_LEN - 1, page_size=PAGE)
        assert cache.pages == ((), ()) and len(cache.free) == B * 4
        _, cache = mf.decode(module, np.zeros((B, 4, M)), cache)
        assert mf.to_numpy(cache.block_table()).tolist() == [[0, 2, -1, -1], [1, 3, -1, -1]]
        assert cache.free == (4, 5, 6, 7)
        plain = module.init_cache(B, MAX_LEN)
        assert cache.nbytes == plain.nbytes  # 4 pages of 3 slots = 12 slots per sequence


def test_paged_cache_refusals_are_identical():
    """Each framework refuses the same calls with the same error, before any write."""

    def module(mf):
        return mf.build(random_canonical(np.random.default_rng(42), K=2), H, 2, window=(3, 0))

    same_error(
        lambda mf: module(mf).init_cache(B, MAX_LEN, rolling=True, page_size=PAGE),
        ConfigError, "paged_cache", "a KV cache is rolling or paged, not both",
        frameworks=MODULE_FRAMEWORKS,
    )
    same_error(
        lambda mf: module(mf).init_cache(B, MAX_LEN, page_size=0),
        ConfigError, "non_positive_size", "page_size must be an integer >= 1; got 0",
        frameworks=MODULE_FRAMEWORKS,
    )

    def decode(mf, **kw):
        m = module(mf)
        cache = m.init_cache(B, MAX_LEN, page_size=PAGE)
        m.decode(mf.asarray(np.zeros((B, 2, M))), cache, **kw)

    same_error(
        lambda mf: decode(mf, mask=mf.asarray(np.ones((B, 1, 2, 2), bool))),
        ConfigError, "paged_cache", "a paged KV cache's decode takes no mask",
        frameworks=MODULE_FRAMEWORKS,
    )
    same_error(
        lambda mf: decode(mf, return_weights=True), ConfigError, "paged_cache",
        "takes no return_weights=True", frameworks=MODULE_FRAMEWORKS,
    )


# -- packed prefill of sequences of different lengths (module.prefill, varlen_attention) ------


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.slow] if n == "jax" else []) for n in MODULE_FRAMEWORKS],
)
@pytest.mark.parametrize("scaled", [False, True], ids=["theta", "inv_freq"])
def test_packed_prefill_is_each_sequence_alone(name, scaled):
    """Sequences of 3, 0, 5 and 1 tokens packed into x (1, 9, M): each token's row is the
    oracle's causal forward of its own sequence alone (RoPE from its own position 0, a window,
    sinks, ALiBi, softcap, GQA 6:2); RoPE by theta, or by the module's rope_inv_freq and
    rope_attention_factor (which the prefill must rotate by as the forward does)."""
    mf = MODULE_FRAMEWORKS[name]
    rng = np.random.default_rng(43)
    weights = random_canonical(rng, K=2)
    weights["sinks"] = rng.standard_normal(H)
    kw = dict(rope_theta=500.0, rotary_dim=10, window=(2, 0), alibi=True, softcap=4.0)
    if scaled:  # 5 frequencies far from theta's, and a factor on cos and sin
        kw |= dict(rope_inv_freq=np.array([0.9, 0.3, 0.05, 0.01, 0.002]), rope_attention_factor=1.2)
    module = mf.build(weights, H, 2, **kw)
    lengths = [3, 0, 5, 1]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    x = rng.standard_normal((1, int(cu[-1]), M))
    got = mf.to_numpy(module.prefill(mf.asarray(x), mf.asarray(cu)))
    assert got.shape == x.shape
    for n in range(len(lengths)):
        if lengths[n] == 0:
            continue
        alone = x[:, cu[n] : cu[n + 1]]
        want, _ = reference(weights, alone, None, n_heads=H, n_kv_heads=2, is_causal=True, **kw)
        assert_within(got[:, cu[n] : cu[n + 1]], want, "float64", what=f"sequence {n}: ")


def test_packed_prefill_refusals_are_identical():
    def prefill(mf, x_shape, cu):
        module = mf.build(random_canonical(np.random.default_rng(44), K=2), H, 2)
        module.prefill(mf.asarray(np.zeros(x_shape)), mf.asarray(np.asarray(cu, np.int32)))

    same_error(
        lambda mf: prefill(mf, (2, 4, M), [0, 4]), DimensionMismatchError,
        "batch_not_broadcastable", "a packed prefill takes its sequences in one row",
        frameworks=MODULE_FRAMEWORKS,
    )
    same_error(
        lambda mf: prefill(mf, (1, 4, M), [0, 3]), ConfigError, "cu_seqlens_value",
        "cu_seqlens[N] = 3, not T=4", frameworks=MODULE_FRAMEWORKS,
    )
