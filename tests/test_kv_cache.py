"""KV-cache decoding in the three modules: any chunking of a sequence gives one causal forward.

The expected value of each decode is the same module's full causal forward over the whole
sequence (itself checked against the float64 reference in test_modules.py), and the reference
directly, under the tolerance rule. JAX runs under nnx.jit here (see module_frameworks.py);
test_jax_decode_runs_eagerly covers the eager path.
"""

from __future__ import annotations

import numpy as np
import pytest

from attention_spec import ConfigError, DimensionMismatchError
from conformance.oracle import assert_within
from tests.frameworks import AGREE, NP_DTYPES, same_error
from tests.module_frameworks import (
    MODULE_FRAMEWORKS,
    B,
    D,
    E,
    H,
    M,
    random_canonical,
    reference_plain,
)
from tests.module_frameworks import reference_forward as reference

T, MAX_LEN = 10, 12  # sequence length and cache capacity (distinct from every other size)
CHUNKINGS = {
    "token_by_token": [1] * T,
    "uneven_prefill": [3, 1, 4, 2],  # then decode stops exactly 2 short of MAX_LEN
}
HEADS = {"mha": H, "gqa_h6_k2": 2, "mqa": 1}
# Decode against the full forward of the same module (not the oracle): float64 the rule's floor,
# float32 tests.frameworks.AGREE. float16/bfloat16: decode and the full forward compute the same
# values in float32 and may round them to the output dtype differently; allow two steps of the
# output dtype's spacing at the output's magnitude.
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7}


def _sequence(dtype):
    return np.random.default_rng(31).standard_normal((B, T, M)).astype(NP_DTYPES[dtype])


@pytest.fixture(params=list(MODULE_FRAMEWORKS), ids=list(MODULE_FRAMEWORKS))
def mf(request):
    return MODULE_FRAMEWORKS[request.param]


def _decode_cases():
    """Every (chunking, heads, dtype) for NumPy and torch. JAX compiles each step anew, because
    the key length S grows (one nnx.jit compilation per step, a fraction of a second), so it runs
    the full product for uneven chunks and token by token once per head layout."""
    for fw in MODULE_FRAMEWORKS:
        for chunking in CHUNKINGS:
            for heads in HEADS:
                for dtype in ("float64", "float32", "float16", "bfloat16"):
                    if fw != "jax" or chunking == "uneven_prefill" or dtype == "float32":
                        yield pytest.param(fw, chunking, heads, dtype,
                                           id=f"{fw}-{chunking}-{heads}-{dtype}")


@pytest.mark.parametrize(("name", "chunking", "heads", "dtype"), list(_decode_cases()))
def test_decoding_matches_one_causal_forward(name, chunking, heads, dtype):
    mf = MODULE_FRAMEWORKS[name]
    K = HEADS[heads]
    weights = random_canonical(np.random.default_rng(30), K=K, dtype=dtype)
    x = _sequence(dtype)
    module = mf.build(weights, H, K)
    full = mf.forward(module, x, is_causal=True)  # (B, T, M)

    cache = module.init_cache(B, MAX_LEN)
    outputs, start = [], 0
    for n in CHUNKINGS[chunking]:
        y, cache = mf.decode(module, x[:, start : start + n], cache)
        outputs.append(y)
        start += n
        assert cache.position == start
    decoded = np.concatenate(outputs, axis=1)

    assert decoded.dtype == NP_DTYPES[dtype] and decoded.shape == (B, T, M)
    call = dict(n_heads=H, n_kv_heads=K, is_causal=True)
    want, _ = reference(weights, x, None, **call)
    plain, _ = reference_plain(weights, x, None, **call)
    assert_within(decoded, want, dtype, plain, what="decode against the oracle: ")
    if dtype == "float64":
        assert_within(decoded, full, dtype, what="decode against the full forward: ")
    elif dtype == "float32":
        np.testing.assert_allclose(decoded, full, rtol=0, atol=AGREE[dtype])
    else:
        full64 = full.astype(np.float64)
        bound = 2 * EPS[dtype] * max(1.0, np.abs(full64).max())
        np.testing.assert_allclose(decoded.astype(np.float64), full64, rtol=0, atol=bound)


def test_decode_weights_are_bottom_right_causal(mf):
    """A chunk of 3 after 4 cached tokens: query i sees keys 0..4+i, weights over S = 7."""
    weights = random_canonical(np.random.default_rng(32))
    x = _sequence("float64")
    module = mf.build(weights, H, 2)
    _, cache = mf.decode(module, x[:, :4], module.init_cache(B, MAX_LEN))
    _, w, cache = mf.decode(module, x[:, 4:7], cache, return_weights=True)
    _, want = reference(weights, x[:, :7], None, n_heads=H, n_kv_heads=2, is_causal=True)
    assert w.shape == (B, H, 3, 7)
    assert_within(w, want[:, :, 4:7], "float64")
    assert np.all(w[:, :, 0, 5:] == 0) and np.all(w[:, :, 1, 6:] == 0) and np.all(w[..., 2, :] > 0)


def test_decode_with_padding_mask(mf):
    """A padding mask over the S cached keys applies as in the full forward."""
    weights = random_canonical(np.random.default_rng(33))
    x = _sequence("float64")
    module = mf.build(weights, H, 2)
    keep = np.ones((B, 1, 1, T), bool)
    keep[1, ..., 2:4] = False  # example 1: tokens 2 and 3 are padding
    want, _ = reference(weights, x, None, n_heads=H, n_kv_heads=2, is_causal=True, mask=keep)
    cache, outputs, start = module.init_cache(B, MAX_LEN), [], 0
    for n in CHUNKINGS["uneven_prefill"]:
        chunk_mask = keep[..., : start + n]  # (B, 1, 1, S) over every key so far
        y, cache = mf.decode(module, x[:, start : start + n], cache, mask=chunk_mask)
        outputs.append(y)
        start += n
    assert_within(np.concatenate(outputs, axis=1), want, "float64")


def test_gqa_cache_is_k_over_h_of_mha(mf):
    sizes = {}
    for K in (H, 2, 1):
        module = mf.build(random_canonical(np.random.default_rng(0), K=K, dtype="float32"), H, K)
        cache = module.init_cache(B, MAX_LEN)
        assert tuple(cache.key.shape) == (B, K, MAX_LEN, D)
        assert tuple(cache.value.shape) == (B, K, MAX_LEN, E)
        sizes[K] = cache.nbytes
    assert sizes[H] == B * H * MAX_LEN * (D + E) * 4
    assert sizes[2] * H == sizes[H] * 2  # GQA 6:2 holds a third
    assert sizes[1] * H == sizes[H]  # MQA a sixth


@pytest.mark.parametrize("rolling_max_len", [None, MAX_LEN], ids=["plain", "rolling"])
def test_a_zero_width_value_caches_the_keys_alone(mf, rolling_max_len):
    """A value of E = 0 (MultiHeadLatentAttention's latent cache: its values are its keys'
    first R features): append, write and read move the keys as with any E, the values stay
    ``(B, K, S, 0)`` and the cache's bytes are the keys'."""
    slots = 4 if rolling_max_len else MAX_LEN
    keys = np.random.default_rng(36).standard_normal((B, 1, 7, D)).astype(np.float32)
    cache = mf.modules.KVCache(mf.asarray(np.zeros((B, 1, slots, D), np.float32)),
                               mf.asarray(np.zeros((B, 1, slots, 0), np.float32)), 0,
                               rolling_max_len)
    cache, k, v = cache.append(mf.asarray(keys[:, :, :5]), mf.asarray(keys[:, :, :5, :0]))
    cache, k, v = cache.append(mf.asarray(keys[:, :, 5:6]), mf.asarray(keys[:, :, 5:6, :0]))
    attended = slots if rolling_max_len else 6  # a ring's last T - 1 then the new token
    np.testing.assert_array_equal(mf.to_numpy(k), keys[:, :, 6 - attended : 6])
    assert tuple(v.shape) == (B, 1, attended, 0)
    cache = cache.write(mf.asarray(keys[:, :, 6:]), mf.asarray(keys[:, :, 6:, :0]))
    k, v = cache.read()
    held = slots - 1 if rolling_max_len else 7
    np.testing.assert_array_equal(mf.to_numpy(k), keys[:, :, 7 - held :])
    assert cache.position == 7 and tuple(v.shape) == (B, 1, held, 0)
    assert cache.nbytes == B * slots * D * 4


def _decode_error(mf, *, x_shape, filled=0, max_len=MAX_LEN):
    module = mf.build(random_canonical(np.random.default_rng(0), dtype="float32"), H, 2)
    cache = module.init_cache(B, max_len)
    if filled:
        _, cache = mf.decode(module, np.zeros((B, filled, M), np.float32), cache)
    module.decode(mf.asarray(np.zeros(x_shape, np.float32)), cache)


def test_writing_past_max_len_raises_everywhere():
    same_error(
        lambda mf: _decode_error(mf, x_shape=(B, 3, M), filled=10),
        ConfigError, "cache_overflow",
        "the KV cache holds 10 of at most 12 tokens; writing 3 more would need 13",
        frameworks=MODULE_FRAMEWORKS,
    )


def test_prefill_longer_than_cache_raises_everywhere():
    same_error(
        lambda mf: _decode_error(mf, x_shape=(B, 13, M)), ConfigError,
        "cache_overflow", "writing 13 more would need 13",
        frameworks=MODULE_FRAMEWORKS,
    )


def test_decode_batch_must_be_the_caches():
    same_error(
        lambda mf: _decode_error(mf, x_shape=(1, 1, M)), DimensionMismatchError,
        "batch_not_broadcastable", "x batch (B=1) must be the KV cache's (B=2)",
        frameworks=MODULE_FRAMEWORKS,
    )


def test_init_cache_needs_positive_sizes():
    same_error(
        lambda mf: mf.build(random_canonical(np.random.default_rng(0)), H, 2).init_cache(B, 0),
        ConfigError, "non_positive_size", "max_len must be an integer >= 1; got 0",
        frameworks=MODULE_FRAMEWORKS,
    )


def test_jax_cache_is_pure_and_jits():
    import jax
    from flax import nnx

    mf = MODULE_FRAMEWORKS["jax"]
    weights = random_canonical(np.random.default_rng(34))
    x = _sequence("float64")
    module = mf.build(weights, H, 2)
    empty = module.init_cache(B, MAX_LEN)
    step = nnx.jit(lambda m, x, cache: m.decode(x, cache))
    _, cache = step(module, x[:, :6], empty)
    assert empty.position == 0 and not np.any(np.asarray(empty.key))  # untouched
    assert cache.position == 6 and isinstance(jax.tree.leaves(cache)[0], jax.Array)
    y2, cache = step(module, x[:, 6:7], cache)
    want, _ = reference(weights, x[:, :7], None, n_heads=H, n_kv_heads=2, is_causal=True)
    assert_within(np.asarray(y2)[:, 0], want[:, 6], "float64")


def test_jax_decode_runs_eagerly():
    """The same decode without jit: an uneven prefill then one token, against the reference."""
    mf = MODULE_FRAMEWORKS["jax"]
    weights = random_canonical(np.random.default_rng(35))
    x = _sequence("float64")
    module = mf.build(weights, H, 2)
    y1, cache = module.decode(x[:, :3], module.init_cache(B, MAX_LEN))
    y2, cache = module.decode(x[:, 3:4], cache)
    want, _ = reference(weights, x[:, :4], None, n_heads=H, n_kv_heads=2, is_causal=True)
    got = np.concatenate([np.asarray(y1), np.asarray(y2)], axis=1)
    assert_within(got, want, "float64")
