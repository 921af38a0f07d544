"""The NumPy, torch and JAX attention modules: one contract, one weight format, one set of errors.

Expected values come from ``reference_forward`` (the float64 oracle's module, from the canonical
weights), never from a module's own output.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
import torch
from flax import nnx

import impl_jax.modules as jax_modules
import impl_numpy.modules as numpy_modules
import impl_torch.modules as torch_modules
from attention_spec import ConfigError, DimensionMismatchError, DTypeError, MaskError
from conformance.oracle import assert_within
from tests.frameworks import NP_DTYPES, same_error
from tests.module_frameworks import (
    MODULE_FRAMEWORKS,
    B,
    D,
    E,
    H,
    K,
    L,
    M,
    S,
    random_canonical,
    reference_forward,
    reference_plain,
)


@pytest.fixture(params=list(MODULE_FRAMEWORKS), ids=list(MODULE_FRAMEWORKS))
def mf(request):
    return MODULE_FRAMEWORKS[request.param]


def _inputs(seed: int, dtype: str, *, q_len=L, kv_len=S, cross=True):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, q_len, M)).astype(NP_DTYPES[dtype])
    ctx = rng.standard_normal((B, kv_len, M)).astype(NP_DTYPES[dtype]) if cross else None
    return x, ctx


def _lengths_mask(lengths, kv_len):
    """A (B, 1, 1, S) padding mask written out by hand."""
    mask = np.zeros((len(lengths), 1, 1, kv_len), bool)
    for b, n in enumerate(lengths):
        mask[b, ..., :n] = True
    return mask


# id: (n_heads, n_kv_heads, cross-attention, q_len, kv_len, forward keywords)
CASES = {
    "gqa_h6_k2.self": (H, K, False, L, L, {}),
    "gqa_h6_k2.cross": (H, K, True, L, S, {}),
    "mha.cross": (H, H, True, L, S, {}),
    "mqa.cross": (H, 1, True, L, S, {}),
    "causal.top_left.self": (H, K, False, L, L, {"is_causal": True}),
    "causal.top_left.cross": (H, K, True, L, S, {"is_causal": True}),
    "causal.bottom_right.cross": (H, K, True, L, S, {"is_causal": True,
                                                     "causal_alignment": "bottom_right"}),
    "causal.bottom_right.l_gt_s": (H, K, True, S, L, {"is_causal": True,
                                                      "causal_alignment": "bottom_right"}),
    "padding.cross": (H, K, True, L, S, {"mask": _lengths_mask([4, 0], S)}),  # b=1: all masked
    "padding.causal.self": (H, K, False, L, L, {"mask": _lengths_mask([3, 5], L),
                                                "is_causal": True}),
    "per_head_mask_and_bias": (H, K, True, L, S, {
        "mask": np.random.default_rng(7).random((B, H, L, S)) > 0.3,
        "bias": np.random.default_rng(8).standard_normal((1, H, 1, S)),
    }),
}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", list(CASES))
def test_module_matches_reference(mf, case, dtype):
    n_heads, n_kv_heads, cross, q_len, kv_len, kw = CASES[case]
    weights = random_canonical(np.random.default_rng(1), H=n_heads, K=n_kv_heads, dtype=dtype)
    x, ctx = _inputs(2, dtype, q_len=q_len, kv_len=kv_len, cross=cross)
    kw = {n: a.astype(NP_DTYPES[dtype]) if n == "bias" else a for n, a in kw.items()}
    want_y, want_w = reference_forward(
        weights, x, ctx, n_heads=n_heads, n_kv_heads=n_kv_heads, **kw
    )
    plain_y, plain_w = reference_plain(
        weights, x, ctx, n_heads=n_heads, n_kv_heads=n_kv_heads, **kw
    )

    module = mf.build(weights, n_heads, n_kv_heads)
    y, w = mf.forward(module, x, ctx, return_weights=True, **kw)

    assert y.dtype == NP_DTYPES[dtype] and w.dtype == NP_DTYPES[dtype]
    assert y.shape == (B, q_len, M) and w.shape == (B, n_heads, q_len, kv_len)
    assert_within(y, want_y, dtype, plain_y, what="output: ")
    assert_within(w, want_w, dtype, plain_w, what="weights: ")
    # the same call without return_weights gives the same output
    np.testing.assert_array_equal(mf.forward(module, x, ctx, **kw), y)


def test_fully_masked_rows_give_output_bias(mf):
    """A query row with no allowed key attends to nothing: zeros, so the output is o_proj.bias."""
    weights = random_canonical(np.random.default_rng(3))
    x, ctx = _inputs(4, "float64")
    module = mf.build(weights, H, K)
    y, w = mf.forward(module, x, ctx, mask=_lengths_mask([S, 0], S), return_weights=True)
    assert np.all(w[1] == 0.0)
    np.testing.assert_array_equal(y[1], np.broadcast_to(weights["o_proj.bias"], (L, M)))


def test_module_without_bias(mf):
    weights = random_canonical(np.random.default_rng(5), bias=False)
    x, ctx = _inputs(6, "float64")
    want_y, _ = reference_forward(weights, x, ctx, n_heads=H, n_kv_heads=K)
    module = mf.build(weights, H, K)
    assert_within(mf.forward(module, x, ctx), want_y, "float64")
    assert sorted(module.to_canonical()) == sorted(weights)


def test_low_precision_modules_run_in_their_dtype(mf):
    """float16 and bfloat16 weights and inputs give outputs of that dtype, within the rule's
    bound of the float64 oracle."""
    for dtype in ("float16", "bfloat16"):
        weights = random_canonical(np.random.default_rng(9), dtype=dtype)
        x, ctx = _inputs(10, dtype)
        call = dict(n_heads=H, n_kv_heads=K, is_causal=True)
        want_y, _ = reference_forward(weights, x, ctx, **call)
        plain_y, _ = reference_plain(weights, x, ctx, **call)
        y = mf.forward(mf.build(weights, H, K), x, ctx, is_causal=True)
        assert y.dtype == NP_DTYPES[dtype]
        assert_within(y, want_y, dtype, plain_y, what=f"{dtype}: ")


def test_to_canonical_round_trips_exactly(mf):
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        weights = random_canonical(np.random.default_rng(11), dtype=dtype)
        exported = mf.build(weights, H, K).to_canonical()
        assert list(exported) == list(weights)  # canonical order: q, k, v, o; kernel, bias
        for name, w in weights.items():
            assert exported[name].dtype == w.dtype
            np.testing.assert_array_equal(exported[name], w)


def test_from_canonical_casts_to_dtype(mf):
    weights = random_canonical(np.random.default_rng(12), dtype="float64")
    exported = mf.build(weights, H, K, dtype="float32").to_canonical()
    for name, w in weights.items():
        np.testing.assert_array_equal(exported[name], w.astype(np.float32))


def test_multi_head_attention_is_gqa_with_k_equal_h(mf):
    weights = random_canonical(np.random.default_rng(13), K=H)
    x, ctx = _inputs(14, "float64")
    mha = mf.modules.MultiHeadAttention.from_canonical(weights, n_heads=H)
    assert isinstance(mha, mf.modules.GroupedQueryAttention)
    assert (mha.dims.H, mha.dims.K) == (H, H)
    want_y, _ = reference_forward(weights, x, ctx, n_heads=H, n_kv_heads=H)
    assert_within(mf.forward(mha, x, ctx), want_y, "float64")


def test_multi_head_attention_hands_every_keyword_on(mf, tmp_path):
    """MultiHeadAttention declares only K = H and hands every other keyword to
    GroupedQueryAttention: from the same (default) seed, the same sizes, settings and weights; a
    K of its own is refused; from_canonical with settings gives a MultiHeadAttention with them,
    and a weight file carries them (the scaled rotary's frequencies as a JSON list too)."""
    kw = dict(
        head_dim=3, value_head_dim=5, bias=False, rope_theta=500.0, rotary_dim=2,
        rope_inv_freq=np.array([0.3]), rope_attention_factor=1.25, window=(2, 0),
        sinks=True, alibi=True, softcap=30.0, scale=0.5, dtype="float64",
    )
    mha = mf.modules.MultiHeadAttention(10, 4, **kw)
    gqa = mf.modules.GroupedQueryAttention(10, 4, 4, **kw)
    assert (mha.dims, mha.rope, mha.options) == (gqa.dims, gqa.rope, gqa.options)
    weights = gqa.to_canonical()
    assert list(mha.to_canonical()) == list(weights)
    for name, w in mha.to_canonical().items():
        np.testing.assert_array_equal(w, weights[name])
    with pytest.raises(TypeError):
        mf.modules.MultiHeadAttention(10, 4, 4, **kw)
    settings = ("rope_theta", "rotary_dim", "rope_inv_freq", "rope_attention_factor", "window",
                "alibi", "softcap", "scale")
    loaded = mf.modules.MultiHeadAttention.from_canonical(
        weights, n_heads=4, **{k: kw[k] for k in settings}
    )
    assert type(loaded) is mf.modules.MultiHeadAttention
    assert (loaded.dims, loaded.rope, loaded.options) == (gqa.dims, gqa.rope, gqa.options)
    assert (gqa.rope.inv_freq, gqa.rope.attention_factor) == ((0.3,), 1.25)
    gqa.save(tmp_path / "scaled.safetensors")
    assert mf.modules.GroupedQueryAttention.load(tmp_path / "scaled.safetensors").rope == gqa.rope


def test_query_head_reads_kv_head_h_div_g_not_h_mod_k(mf):
    """Only kv head 0 carries non-zero values, and o_proj reads one query head at a time: the
    output is non-zero exactly for heads 0..G-1 (tiling, h % K, would light heads 0, 2, 4)."""
    weights = random_canonical(np.random.default_rng(15), bias=False)
    weights["v_proj.kernel"][:, E:] = 0.0  # kv head 1 carries zero values
    x, ctx = _inputs(16, "float64")
    lit = []
    for h in range(H):
        only_h = dict(weights, **{"o_proj.kernel": np.zeros_like(weights["o_proj.kernel"])})
        only_h["o_proj.kernel"][h * E : (h + 1) * E] = weights["o_proj.kernel"][h * E : (h + 1) * E]
        lit.append(np.abs(mf.forward(mf.build(only_h, H, K), x, ctx)).max() > 0)
    assert lit == [h < H // K for h in range(H)]


# -- initialization -------------------------------------------------------------------------


def _init_weights(name: str, seed: int, **kw) -> dict[str, np.ndarray]:
    """Canonical weights of a fresh GQA module (M=64, H=8, K=2, D=16) seeded in its own way."""
    if name == "numpy":
        module = numpy_modules.GroupedQueryAttention(64, 8, 2, rng=seed, **kw)
    elif name == "torch":
        generator = torch.Generator().manual_seed(seed)
        module = torch_modules.GroupedQueryAttention(64, 8, 2, generator=generator, **kw)
    else:
        module = jax_modules.GroupedQueryAttention(64, 8, 2, rngs=nnx.Rngs(seed), **kw)
    return module.to_canonical()


@pytest.mark.parametrize("name", list(MODULE_FRAMEWORKS))
def test_init_is_uniform_with_bound_one_over_sqrt_fan_in(name):
    weights = _init_weights(name, seed=0)
    fan_in = {"q_proj": 64, "k_proj": 64, "v_proj": 64, "o_proj": 8 * 8}
    for proj, n_in in fan_in.items():
        bound = 1 / math.sqrt(n_in)
        kernel, bias = weights[f"{proj}.kernel"], weights[f"{proj}.bias"]
        assert kernel.dtype == np.float32
        for w in (kernel, bias):
            assert np.abs(w).max() <= bound
        # U(-b, b): mean 0, variance b^2 / 3; 5-sigma bands for the sample sizes (>= 1024)
        n = kernel.size
        assert abs(kernel.mean()) < 5 * bound / math.sqrt(3 * n)
        assert abs(kernel.var() / (bound**2 / 3) - 1) < 5 * math.sqrt(4 / 45 / n) * 3
        assert np.abs(kernel).max() > 0.95 * bound  # fills the range: not a narrower init
        assert np.abs(bias).max() > 0.5 * bound  # biases are drawn too, not zero


@pytest.mark.parametrize("name", list(MODULE_FRAMEWORKS))
def test_init_is_deterministic_from_seed(name):
    a, b, c = _init_weights(name, 3), _init_weights(name, 3), _init_weights(name, 4)
    for n in a:
        np.testing.assert_array_equal(a[n], b[n])
        assert not np.array_equal(a[n], c[n])


@pytest.mark.parametrize("name", list(MODULE_FRAMEWORKS))
def test_default_init_is_seeded_in_all_three(name):
    """Without a generator argument, the same constructor arguments give the same weights, even
    after something else has drawn from the framework's global generator (torch used to draw
    from its global one, while NumPy's rng and JAX's Rngs default to seed 0)."""
    cls = MODULE_FRAMEWORKS[name].modules.GroupedQueryAttention
    first = cls(64, 8, 2).to_canonical()
    torch.manual_seed(1234)
    torch.rand(17)  # the global generator moves on
    second = cls(64, 8, 2).to_canonical()
    for n in first:
        np.testing.assert_array_equal(first[n], second[n])


@pytest.mark.parametrize("name", list(MODULE_FRAMEWORKS))
def test_init_in_each_dtype(name):
    for dtype in ("float64", "float16", "bfloat16"):
        weights = _init_weights(name, 0, dtype=dtype)
        assert {w.dtype for w in weights.values()} == {NP_DTYPES[dtype]}
        assert np.abs(weights["q_proj.kernel"].astype(np.float64)).max() <= 1 / 8 * (1 + 2**-7)


# -- errors ---------------------------------------------------------------------------------


CONSTRUCTION_ERRORS = {
    "mha_m16_h5": (
        lambda mf: mf.modules.MultiHeadAttention(16, 5), DimensionMismatchError,
        "d_model_not_divisible",
        "d_model (M=16) must be divisible by n_heads (H=5) when head_dim is not given",
    ),
    "gqa_h6_k4": (
        lambda mf: mf.modules.GroupedQueryAttention(24, 6, 4), DimensionMismatchError,
        "heads_not_divisible", "n_kv_heads (K=4) must divide n_heads (H=6)",
    ),
    "n_heads_zero": (
        lambda mf: mf.modules.GroupedQueryAttention(16, 0, 1), ConfigError, "non_positive_size",
        "n_heads (H) must be an integer >= 1; got 0",
    ),
    "d_model_negative": (
        lambda mf: mf.modules.MultiHeadAttention(-16, 4), ConfigError, "non_positive_size",
        "d_model (M) must be an integer >= 1; got -16",
    ),
    "head_dim_zero": (
        lambda mf: mf.modules.GroupedQueryAttention(16, 4, 2, head_dim=0), ConfigError,
        "non_positive_size", "head_dim (D) must be an integer >= 1; got 0",
    ),
    "value_head_dim_float": (
        lambda mf: mf.modules.GroupedQueryAttention(16, 4, 2, value_head_dim=2.5), ConfigError,
        "non_positive_size", "value_head_dim (E) must be an integer >= 1; got 2.5",
    ),
    "dtype_int": (
        lambda mf: mf.modules.GroupedQueryAttention(16, 4, 2, dtype="int32"), DTypeError,
        "unsupported_dtype", "module dtype must be one of",
    ),
}


@pytest.mark.parametrize("case", list(CONSTRUCTION_ERRORS))
def test_construction_errors_are_identical(case):
    same_error(*CONSTRUCTION_ERRORS[case], frameworks=MODULE_FRAMEWORKS)


def test_head_dim_makes_indivisible_width_legal(mf):
    module = mf.modules.MultiHeadAttention(16, 5, head_dim=3)
    assert module.to_canonical()["q_proj.kernel"].shape == (16, 15)
    assert module.to_canonical()["o_proj.kernel"].shape == (15, 16)


def _call(mf, x_shape=(B, L, M), ctx_shape=(B, S, M), x_dtype="float32", ctx_dtype="float32",
          **kw):
    module = mf.build(random_canonical(np.random.default_rng(0), dtype="float32"), H, K)
    x = np.zeros(x_shape, NP_DTYPES[x_dtype])
    ctx = None if ctx_shape is None else np.zeros(ctx_shape, NP_DTYPES[ctx_dtype])
    return mf.forward(module, x, ctx, **kw)


FORWARD_ERRORS = {
    "x_rank": (
        lambda mf: _call(mf, x_shape=(L, M)), DimensionMismatchError, "rank",
        "x must have 3 dims (B, L, M) with M=17; got shape (5, 17)",
    ),
    "x_width": (
        lambda mf: _call(mf, x_shape=(B, L, 16)), DimensionMismatchError,
        "model_width_mismatch",
        "x last dim must be the module's d_model (M=17); got shape (2, 5, 16)",
    ),
    "context_width": (
        lambda mf: _call(mf, ctx_shape=(B, S, 18)), DimensionMismatchError,
        "model_width_mismatch",
        "context last dim must be the module's d_model (M=17); got shape (2, 7, 18)",
    ),
    "x_dtype": (
        lambda mf: _call(mf, x_dtype="float64", ctx_shape=None), DTypeError, "dtype_mismatch",
        "x dtype must match the module's weights (float32); got float64",
    ),
    "context_dtype": (
        lambda mf: _call(mf, ctx_dtype="float16"), DTypeError, "dtype_mismatch",
        "context dtype must match the module's weights (float32); got float16",
    ),
    "batch": (
        lambda mf: _call(mf, ctx_shape=(3, S, M)), DimensionMismatchError,
        "batch_not_broadcastable", "x and context batch dims must broadcast",
    ),
    "mask_kv_heads": (
        lambda mf: _call(mf, mask=np.ones((B, K, L, S), bool)), MaskError, "mask_kv_heads",
        "mask must broadcast to (B=2, H=6, L=5, S=7); got (2, 2, 5, 7)",
    ),
    "mask_not_bool": (
        lambda mf: _call(mf, mask=np.ones((L, S), np.float32)), MaskError, "mask_dtype",
        "pass it as bias=",
    ),
    "alignment": (
        lambda mf: _call(mf, is_causal=True, causal_alignment="lower_right"), ConfigError,
        "unknown_alignment", "causal_alignment must be one of",
    ),
}


@pytest.mark.parametrize("case", list(FORWARD_ERRORS))
def test_forward_errors_are_identical(case):
    same_error(*FORWARD_ERRORS[case], frameworks=MODULE_FRAMEWORKS)


def _without(weights, name):
    return {n: w for n, w in weights.items() if n != name}


_W = random_canonical(np.random.default_rng(0), dtype="float32")
LOAD_ERRORS = {
    "missing_bias": (
        lambda mf: mf.build(_without(_W, "k_proj.bias"), H, K), DimensionMismatchError,
        "weight_shape", "canonical weight k_proj.bias must be (22,)",
    ),
    "unexpected_key": (
        lambda mf: mf.build({**_W, "q_proj.weight": _W["q_proj.kernel"]}, H, K),
        DimensionMismatchError, "weight_shape",
        "canonical weight q_proj.weight must be absent",
    ),
    "transposed_o_proj": (
        lambda mf: mf.build({**_W, "o_proj.kernel": _W["o_proj.kernel"].T}, H, K),
        DimensionMismatchError, "weight_shape",
        "canonical weight o_proj.kernel must be (78, 17)",
    ),
    "wrong_heads": (
        lambda mf: mf.build(_W, 5, 1), DimensionMismatchError, "weight_shape",
        "q_proj.kernel must be (M, H*D) with H=5; got (17, 66)",
    ),
    "mixed_dtypes": (
        lambda mf: mf.build({**_W, "o_proj.bias": _W["o_proj.bias"].astype(np.float64)}, H, K),
        DTypeError, "dtype_mismatch", "o_proj.bias=float64",
    ),
    "mha_from_gqa_weights": (
        lambda mf: mf.modules.MultiHeadAttention.from_canonical(_W, n_heads=H, n_kv_heads=K),
        DimensionMismatchError, "weight_shape",
        "canonical weight k_proj.kernel must be (17, 66) for (M=17, H=6, K=6, D=11, E=13)",
    ),
    "load_into_other_sizes": (
        lambda mf: mf.build(_W, H, K).load_canonical(random_canonical(
            np.random.default_rng(0), E=D, dtype="float32")),
        DimensionMismatchError, "weight_shape",
        "canonical weight v_proj.kernel must be (17, 26) for (M=17, H=6, K=2, D=11, E=13)",
    ),
}


@pytest.mark.parametrize("case", list(LOAD_ERRORS))
def test_load_errors_are_identical(case):
    same_error(*LOAD_ERRORS[case], frameworks=MODULE_FRAMEWORKS)


# -- padding_mask ---------------------------------------------------------------------------


def test_padding_mask(mf):
    lengths = np.array([3, 0, 9], np.int32)
    got = mf.to_numpy(mf.modules.padding_mask(mf.asarray(lengths), 7))
    assert got.dtype == np.bool_ and got.shape == (3, 1, 1, 7)
    np.testing.assert_array_equal(got, _lengths_mask([3, 0, 7], 7))


PADDING_ERRORS = {
    "float_lengths": (
        lambda mf: mf.modules.padding_mask(mf.asarray(np.ones(2, np.float32)), 4), MaskError,
        "mask_dtype", "lengths must be integers; got float32",
    ),
    "lengths_2d": (
        lambda mf: mf.modules.padding_mask(mf.asarray(np.ones((2, 1), np.int32)), 4), MaskError,
        "mask_shape", "lengths must be 1-D (B,)",
    ),
    "negative_kv_len": (
        lambda mf: mf.modules.padding_mask(mf.asarray(np.ones(2, np.int32)), -1), ConfigError,
        "non_positive_size", "kv_len (S) must be an integer >= 0; got -1",
    ),
}


@pytest.mark.parametrize("case", list(PADDING_ERRORS))
def test_padding_mask_errors_are_identical(case):
    same_error(*PADDING_ERRORS[case], frameworks=MODULE_FRAMEWORKS)


# -- weight files ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_one_weight_file_loads_into_all_three(tmp_path, dtype):
    weights = random_canonical(np.random.default_rng(17), dtype=dtype)
    x, ctx = _inputs(18, dtype)
    path = tmp_path / "gqa.safetensors"
    MODULE_FRAMEWORKS["torch"].build(weights, H, K).save(path)
    for name, mf in MODULE_FRAMEWORKS.items():
        module = mf.modules.GroupedQueryAttention.load(path)
        assert (module.dims.H, module.dims.K, module.dims.D, module.dims.E) == (H, K, D, E), name
        for n, w in module.to_canonical().items():
            np.testing.assert_array_equal(w, weights[n])
        # every framework writes the same bytes for the same weights
        module.save(tmp_path / f"{name}.safetensors")
        assert (tmp_path / f"{name}.safetensors").read_bytes() == path.read_bytes(), name
    if dtype == "float32":
        call = dict(n_heads=H, n_kv_heads=K, is_causal=True)
        want_y, _ = reference_forward(weights, x, ctx, **call)
        plain_y, _ = reference_plain(weights, x, ctx, **call)
        for mf in MODULE_FRAMEWORKS.values():
            y = mf.forward(mf.modules.GroupedQueryAttention.load(path), x, ctx, is_causal=True)
            assert_within(y, want_y, dtype, plain_y, what=f"{mf.name}: ")


def test_weight_file_without_metadata_is_refused(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "bare.safetensors"
    save_file(random_canonical(np.random.default_rng(0)), str(path))
    same_error(
        lambda mf: mf.modules.GroupedQueryAttention.load(path), DimensionMismatchError,
        "weight_shape", "a weight file needs the metadata 'rosetta_attention'",
        frameworks=MODULE_FRAMEWORKS,
    )


# -- gradients ------------------------------------------------------------------------------


def _masked_inputs():
    weights = random_canonical(np.random.default_rng(19))
    x, ctx = _inputs(20, "float64")
    return weights, x, ctx, _lengths_mask([4, 0], S)  # example 1: every row fully masked


def test_torch_gradients_flow():
    weights, x, ctx, mask = _masked_inputs()
    mf = MODULE_FRAMEWORKS["torch"]
    module = mf.build(weights, H, K)
    y = module(mf.asarray(x), mf.asarray(ctx), mask=mf.asarray(mask), is_causal=True)
    (y[0] * torch.linspace(-1, 1, M, dtype=y.dtype)).sum().backward()
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        grad = getattr(module, name).weight.grad
        assert torch.isfinite(grad).all() and grad.abs().max() > 1e-3, name

    # fully masked example: its output is o_proj.bias, so only that bias gets a gradient
    module.zero_grad()
    y = module(mf.asarray(x), mf.asarray(ctx), mask=mf.asarray(mask))
    (y[1] * torch.linspace(-1, 1, M, dtype=y.dtype)).sum().backward()
    for name in ("q_proj", "k_proj", "v_proj"):
        assert torch.all(getattr(module, name).weight.grad == 0), name
        assert torch.all(getattr(module, name).bias.grad == 0), name
    assert torch.all(module.o_proj.weight.grad == 0)
    assert_within(module.o_proj.bias.grad, np.linspace(-1, 1, M) * L, "float64")


def test_jax_gradients_flow():
    weights, x, ctx, mask = _masked_inputs()
    module = MODULE_FRAMEWORKS["jax"].build(weights, H, K)
    r = jax.numpy.linspace(-1, 1, M)

    def loss(m, b, **kw):
        return (m(x, ctx, mask=mask, **kw)[b] * r).sum()

    grads = nnx.grad(lambda m: loss(m, 0, is_causal=True))(module)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        g = np.asarray(getattr(grads, name).kernel[...])
        assert np.isfinite(g).all() and np.abs(g).max() > 1e-3, name

    grads = nnx.grad(lambda m: loss(m, 1))(module)
    for name in ("q_proj", "k_proj", "v_proj"):
        assert np.all(np.asarray(getattr(grads, name).kernel[...]) == 0), name
        assert np.all(np.asarray(getattr(grads, name).bias[...]) == 0), name
    assert np.all(np.asarray(grads.o_proj.kernel[...]) == 0)
    assert_within(np.asarray(grads.o_proj.bias[...]), np.asarray(r) * L, "float64")


def test_jax_module_under_nnx_jit():
    weights = random_canonical(np.random.default_rng(21))
    x, ctx = _inputs(22, "float64")
    module = MODULE_FRAMEWORKS["jax"].build(weights, H, K)
    forward = nnx.jit(lambda m, x, c: m(x, c, is_causal=True, return_weights=True))
    y, w = forward(module, x, ctx)
    want_y, want_w = reference_forward(weights, x, ctx, n_heads=H, n_kv_heads=K, is_causal=True)
    assert_within(np.asarray(y), want_y, "float64")
    assert_within(np.asarray(w), want_w, "float64")
