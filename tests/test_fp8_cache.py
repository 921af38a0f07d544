"""The modules' fp8 KV cache (``init_cache(..., dtype="float8_e4m3fn" | "float8_e5m2",
k_descale=, v_descale=)``) in the three frameworks (docs/SEMANTICS.md, "FP8 KV cache").

Every expected value is the float64 oracle's own fp8 cache (``conformance.oracle.
fp8_cache_decode``: keys rotated, then quantized with one descale per key/value head for the
cache's life), never an implementation's output. The bound is the manifest's rule for the same
fp8 cache computed in float32 (the strict bound of contract v3's fp8 fixtures). The inputs are
checked to keep every stored quotient away from an fp8 rounding boundary (``margin``), so the
three store the oracle's exact fp8 values.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import impl_jax
import impl_numpy
import impl_torch
from attention_spec import ConfigError, DimensionMismatchError, DTypeError
from conformance.oracle import assert_within, fp8_cache_decode, linear, rotary
from tests.frameworks import AGREE, same_error
from tests.module_frameworks import MODULE_FRAMEWORKS, B, H, M, random_canonical

K, T = 2, 6
ROPE = {"rope_theta": 100.0, "rotary_dim": 10}  # D = 11: the leading 10 features rotated
FORMATS = ("float8_e4m3fn", "float8_e5m2")
CHUNKINGS = {"tokens": [1] * T, "chunks_3_1_2": [3, 1, 2]}
#: cache kind -> init_cache's keywords and the module's settings
KINDS = {
    "plain": ({}, ROPE),
    "rolling": ({"rolling": True}, {**ROPE, "window": (2, 0)}),
    "paged": ({"page_size": 4}, ROPE),
}
IMPLS = {"numpy": impl_numpy, "torch": impl_torch, "jax": impl_jax}
#: A dynamic descale against the oracle's: 8 float32 ulps (a wrong rule is off by far more: a
#: descale per token or per query head, or a running max, changes it by whole percents). Relative,
#: not the tolerance rule: the rule's floor is 2e-6 * max(1, |golden|), 200 times this for a
#: descale of 1e-2.
DESCALE_RTOL = 2.0**-20


def _problem(seed: int = 3, scale_after: float = 1.0) -> tuple[dict, np.ndarray]:
    """float32 canonical weights (GQA 6:2) and x ``(B, T, M)``; tokens from 2 on multiplied by
    ``scale_after`` (a later range beyond the first write's)."""
    rng = np.random.default_rng(seed)
    weights = random_canonical(rng, K=K, dtype="float32")
    x = rng.standard_normal((B, T, M))
    x[:, 2:] *= scale_after
    return weights, x.astype(np.float32)


def _oracle(weights, x, chunks, fmt, settings, **descales):
    """The oracle's fp8 cache decode and its plain computation in float32 (its strict bound's)."""
    w64 = {n: w.astype(np.float64) for n, w in weights.items()}
    rope = {n: settings.get(n) for n in ("rope_theta", "rotary_dim", "window")}
    args = dict(fmt=fmt, n_heads=H, n_kv_heads=K, **rope, **descales)
    golden = fp8_cache_decode(w64, x.astype(np.float64), chunks, **args)
    plain = fp8_cache_decode(w64, x.astype(np.float64), chunks, **args, round_to="float32")
    assert golden.margin >= 1e-3, "inputs too near an fp8 rounding boundary: change the seed"
    return golden, plain


def _np(mf, a) -> np.ndarray:
    """``mf.to_numpy`` that also takes a torch fp8 tensor (torch has no NumPy fp8): its bytes
    viewed as ml_dtypes' format of the same name."""
    name = str(getattr(a, "dtype", "")).removeprefix("torch.")
    if mf.name == "torch" and name.startswith("float8"):
        raw = a.detach().cpu().view(torch.uint8).numpy()
        return raw.view(getattr(ml_dtypes, name))
    return mf.to_numpy(a)


def _decode(mf, module, x, cache, chunks):
    """Every step's output, concatenated ``(B, T, M)``, and the last cache."""
    out, start = [], 0
    for n in chunks:
        y, cache = mf.decode(module, x[:, start : start + n], cache)
        out.append(y)
        start += n
    return np.concatenate(out, axis=1), cache


def _stored(mf, cache) -> tuple[np.ndarray, np.ndarray]:
    """The cache's keys and values as float64 values, contiguous ``(B, K, T, D|E)`` (a paged
    pool read through its block table; a rolling ring as stored)."""
    if hasattr(cache, "key_pages"):
        pages = [_np(mf, p) for p in (cache.key_pages, cache.value_pages)]
        table = mf.to_numpy(cache.block_table())
        out = []
        for pool in pages:
            pool = pool.astype(np.float64)  # (P, page_size, K, X)
            seqs = [np.concatenate([pool[p] for p in row if p >= 0])[: cache.position]
                    for row in table]
            out.append(np.stack(seqs).transpose(0, 2, 1, 3))  # (B, K, T, X)
        return out[0], out[1]
    return _np(mf, cache.key).astype(np.float64), _np(mf, cache.value).astype(np.float64)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(MODULE_FRAMEWORKS))
def test_fp8_decode_equals_the_oracles_fp8_cache(name, fmt, chunking, kind):
    """Token by token and in uneven chunks, plain, rolling and paged: every step's rows within
    the strict fp8 bound of the oracle's, and the stored fp8 values exactly the oracle's."""
    mf = MODULE_FRAMEWORKS[name]
    weights, x = _problem()
    cache_kw, settings = KINDS[kind]
    chunks = CHUNKINGS[chunking]
    golden, plain = _oracle(weights, x, chunks, fmt, settings)
    module = mf.build(weights, H, K, **settings)
    got, cache = _decode(mf, module, x, module.init_cache(B, T, dtype=fmt, **cache_kw), chunks)
    assert_within(got, golden.output, "float32", plain.output)
    key, value = _stored(mf, cache)
    if kind == "rolling":  # the ring's slots hold tokens p % slots: the last window of them
        slots = key.shape[2]
        keep = [p % slots for p in range(T - slots, T)]
        key, value = key[:, :, keep], value[:, :, keep]
        want_k, want_v = golden.key[:, :, T - slots :], golden.value[:, :, T - slots :]
    else:
        want_k, want_v = golden.key, golden.value
    np.testing.assert_array_equal(key, want_k)
    np.testing.assert_array_equal(value, want_v)
    # the first write's max|k| / fp8_max: the port's float32 projections differ from the
    # oracle's in the last bits, so its descales by a few float32 ulps (DESCALE_RTOL).
    np.testing.assert_allclose(mf.to_numpy(cache.k_descale), golden.k_descale, rtol=DESCALE_RTOL)
    np.testing.assert_allclose(mf.to_numpy(cache.v_descale), golden.v_descale, rtol=DESCALE_RTOL)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(MODULE_FRAMEWORKS))
def test_the_callers_descales_are_used_as_given(name, fmt):
    """k_descale (K,) and v_descale a number, fixed from init_cache: the oracle's static
    cache, in chunks, plain and paged."""
    mf = MODULE_FRAMEWORKS[name]
    weights, x = _problem(seed=6)
    descales = dict(k_descale=np.array([0.02, 0.5], np.float32), v_descale=0.05)
    golden, plain = _oracle(weights, x, [3, 1, 2], fmt, ROPE, **descales)
    module = mf.build(weights, H, K, **ROPE)
    given = dict(descales, k_descale=mf.asarray(descales["k_descale"]))
    for extra in ({}, {"page_size": 4}):
        cache = module.init_cache(B, T, dtype=fmt, **given, **extra)
        got, cache = _decode(mf, module, x, cache, [3, 1, 2])
        assert_within(got, golden.output, "float32", plain.output, what=f"{extra}: ")
        np.testing.assert_array_equal(mf.to_numpy(cache.k_descale), np.float32([0.02, 0.5]))
        np.testing.assert_array_equal(mf.to_numpy(cache.v_descale), np.float32([0.05, 0.05]))
        np.testing.assert_array_equal(_stored(mf, cache)[0], golden.key)


@pytest.mark.parametrize("fmt", FORMATS)
def test_stored_bytes_are_quantize_fp8_of_the_rotated_keys(fmt):
    """The cache's fp8 bytes are each package's own ``quantize_fp8`` of the rotated keys (the
    oracle's float64 projection and rotation, taken to float32) at the cache's descales, and
    the three packages' bytes are identical."""
    weights, x = _problem()
    w64 = {n: w.astype(np.float64) for n, w in weights.items()}
    k = linear(x.astype(np.float64), w64["k_proj.kernel"], w64["k_proj.bias"])  # (B, T, K*D)
    k = k.reshape(B, T, K, -1).transpose(0, 2, 1, 3)  # (B, K, T, D)
    k = rotary(
        k, np.arange(T), theta=ROPE["rope_theta"], rotary_dim=ROPE["rotary_dim"]
    )  # the cache holds rotated keys
    stored = {}
    for name, mf in MODULE_FRAMEWORKS.items():
        module = mf.build(weights, H, K, **ROPE)
        _, cache = _decode(mf, module, x, module.init_cache(B, T, dtype=fmt), [2, 4])
        stored[name] = _np(mf, cache.key).view(np.uint8)  # the bytes
        quantize = IMPLS[name].quantize_fp8
        want, _ = quantize(mf.asarray(k.astype(np.float32)), fmt, axes=(0, 2, 3),
                           descale=cache.k_descale)
        np.testing.assert_array_equal(stored[name], _np(mf, want).view(np.uint8))
    np.testing.assert_array_equal(stored["numpy"], stored["torch"])
    np.testing.assert_array_equal(stored["numpy"], stored["jax"])


@pytest.mark.parametrize("kind", ["plain", "paged"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_three_agree_and_the_descale_is_fixed_after_the_first_write(fmt, kind):
    """Later tokens 16 times the first write's range: the descales stay the first write's
    (computed from its 2 tokens), the later values saturate at the format's max (never NaN),
    the three give the same outputs and the oracle's within the bound."""
    weights, x = _problem(seed=4, scale_after=16.0)
    cache_kw, settings = KINDS[kind]
    golden, plain = _oracle(weights, x, [2, 1, 3], fmt, settings)
    assert golden.saturated > 0
    top = float(ml_dtypes.finfo(getattr(ml_dtypes, fmt)).max)
    outputs = {}
    for name, mf in MODULE_FRAMEWORKS.items():
        module = mf.build(weights, H, K, **settings)
        cache = module.init_cache(B, T, dtype=fmt, **cache_kw)
        assert cache.k_descale is None and cache.v_descale is None
        first = None
        start = 0
        out = []
        for n in [2, 1, 3]:
            y, cache = mf.decode(module, x[:, start : start + n], cache)
            out.append(y)
            start += n
            descales = (mf.to_numpy(cache.k_descale), mf.to_numpy(cache.v_descale))
            first = descales if first is None else first
            np.testing.assert_array_equal(descales[0], first[0])
            np.testing.assert_array_equal(descales[1], first[1])
        np.testing.assert_allclose(first[0], golden.k_descale, rtol=DESCALE_RTOL)
        np.testing.assert_allclose(first[1], golden.v_descale, rtol=DESCALE_RTOL)
        key, value = _stored(mf, cache)
        assert not np.isnan(key).any() and not np.isnan(value).any()
        assert np.abs(key[:, :, 2:]).max() == top  # saturated, not NaN or inf
        outputs[name] = np.concatenate(out, axis=1)
        assert_within(outputs[name], golden.output, "float32", plain.output, what=f"{name}: ")
    for name in ("torch", "jax"):
        np.testing.assert_allclose(outputs[name], outputs["numpy"], rtol=0, atol=AGREE["float32"])


def test_a_cache_of_the_modules_dtype_is_unchanged():
    """dtype None (or the module's own) keeps today's cache: no descales, the module's dtype."""
    weights, _ = _problem()
    for mf in MODULE_FRAMEWORKS.values():
        module = mf.build(weights, H, K)
        for cache in (module.init_cache(B, T), module.init_cache(B, T, dtype="float32")):
            assert cache.k_descale is None and cache.v_descale is None
            assert _np(mf, cache.key).dtype == np.float32


# -- errors: identical in the three, from init_cache, before any arithmetic --------------------

ERRORS = [
    ("descale_without_dtype", dict(k_descale=0.5), DTypeError, "descale_not_fp8"),
    ("unknown_dtype", dict(dtype="int8"), DTypeError, "unsupported_dtype"),
    ("e4m3_misspelt", dict(dtype="float8_e4m3"), DTypeError, "unsupported_dtype"),
    ("per_query_head", dict(dtype="float8_e4m3fn", k_descale=np.full(H, 0.5, np.float32)),
     DimensionMismatchError, "descale_shape"),
    ("broadcast_only", dict(dtype="float8_e4m3fn", v_descale=np.full(1, 0.5, np.float32)),
     DimensionMismatchError, "descale_shape"),
    ("zero", dict(dtype="float8_e5m2", v_descale=np.float32([0.5, 0.0])), ConfigError,
     "descale_value"),
    ("nan", dict(dtype="float8_e5m2", k_descale=math.nan), ConfigError, "descale_value"),
    ("float64_array", dict(dtype="float8_e5m2", k_descale=np.ones(K)), DTypeError,
     "descale_dtype"),
]


@pytest.mark.parametrize("keywords, cls, code", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_init_cache_errors_are_identical_in_all_three(keywords, cls, code):
    weights, _ = _problem()

    def call(mf):
        module = mf.build(weights, H, K)
        kw = {n: mf.asarray(v) if isinstance(v, np.ndarray) else v for n, v in keywords.items()}
        module.init_cache(B, T, **kw)

    same_error(call, cls, code, frameworks=MODULE_FRAMEWORKS)


def test_an_fp8_cache_of_a_float64_module_is_fp8_combination():
    weights, _ = _problem()
    w64 = {n: w.astype(np.float64) for n, w in weights.items()}
    same_error(lambda mf: mf.build(w64, H, K).init_cache(B, T, dtype="float8_e4m3fn"),
               DTypeError, "fp8_combination", frameworks=MODULE_FRAMEWORKS)


def test_multi_head_latent_attention_refuses_an_fp8_cache():
    """MLA's latent cache has no fp8 form: ConfigError fp8_cache, the same in the three; its
    own dtype is accepted."""
    sizes = dict(kv_lora_rank=5, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=3)

    def call(mf):
        module = IMPLS[mf.name].MultiHeadLatentAttention(M, 3, **sizes, dtype="float32")
        module.init_cache(B, T, dtype="float32")  # the module's own: fine
        module.init_cache(B, T, dtype="float8_e4m3fn")

    same_error(call, ConfigError, "fp8_cache", "no fp8 form", frameworks=MODULE_FRAMEWORKS)
