"""Each implementation against its framework's own fused kernel, where the contract agrees,
and tests that pin the points where the kernels differ from the contract (SEMANTICS.md)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

import impl_jax
import impl_torch
from conformance.oracle import NOISE_FLOOR, assert_within
from tests.frameworks import NP_DTYPES, random_qkv

#: Ours against a framework's fused kernel in float32 (or jax's, whose softmax is float32 even for
#: float64 inputs): the float32 noise floor, absolute, for the floor's own reason (fused and
#: reordered float32 kernels agree to about 1e-6). float64 against a float64 kernel is
#: oracle.assert_within with the kernel's result as the golden.
FUSED_FLOAT32 = NOISE_FLOOR["float32"]
B, H, K, L, S, D, E = 2, 6, 2, 5, 7, 11, 13  # pairwise distinct


def _inputs(dtype, L=L, S=S, E=E, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(rng, (B,), H, K, L, S, D, E, dtype)
    mask = rng.random((B, H, L, S)) > 0.3  # per query head (head axis H)
    mask[..., 0] = True  # at least one key per row: the kernels agree there
    bias = rng.standard_normal((1, H, L, S)).astype(NP_DTYPES[dtype])
    bias[0, 0, 1, 2] = -np.inf
    return q, k, v, mask, bias


# keyword sets on which torch's fused kernel and the contract agree
TORCH_AGREES = {
    "plain": {},
    "mask_per_head": {"mask": True},
    "bias_with_inf": {"bias": True},
    "scale_custom": {"scale": 0.37},
    "scale_negative": {"scale": -0.5},
    "causal_top_left": {"is_causal": True},
    "causal_bottom_right": {"is_causal": True, "causal_alignment": "bottom_right"},
}


def _torch_kernel(q, k, v, mask, bias, kw):
    """torch.nn.functional.scaled_dot_product_attention spelling of the contract's keywords."""
    attn_mask = None
    if kw.get("mask"):
        attn_mask = torch.from_numpy(mask)
    if kw.get("bias"):
        attn_mask = torch.from_numpy(bias)
    is_causal = kw.get("is_causal", False)
    if is_causal and kw.get("causal_alignment") == "bottom_right":
        attn_mask, is_causal = causal_lower_right(q.shape[-2], k.shape[-2]), False
    return F.scaled_dot_product_attention(
        *map(torch.from_numpy, (q, k, v)),
        attn_mask=attn_mask, is_causal=is_causal, scale=kw.get("scale"), enable_gqa=True,
    ).numpy()


def _ours(impl, asarray, q, k, v, mask, bias, kw):
    ours_kw = {n: x for n, x in kw.items() if n not in ("mask", "bias")}
    if kw.get("mask"):
        ours_kw["mask"] = asarray(mask)
    if kw.get("bias"):
        ours_kw["bias"] = asarray(bias)
    return impl.scaled_dot_product_attention(*map(asarray, (q, k, v)), **ours_kw)


# torch warns that causal_lower_right "will produce NaNs" when L > S; in 2.13 it gives the
# contract's zeros for those leading rows, which this test checks.
@pytest.mark.filterwarnings("ignore:Lower right causal bias")
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", list(TORCH_AGREES))
@pytest.mark.parametrize(("L", "S"), [(5, 7), (7, 5)])
def test_torch_matches_torch_sdpa(case, dtype, L, S):
    kw = TORCH_AGREES[case]
    q, k, v, mask, bias = _inputs(dtype, L=L, S=S)
    expected = _torch_kernel(q, k, v, mask, bias, kw)
    ours = _ours(impl_torch, torch.from_numpy, q, k, v, mask, bias, kw).numpy()
    if dtype == "float64":
        assert_within(ours, expected, dtype)
    else:
        np.testing.assert_allclose(ours, expected, rtol=0, atol=FUSED_FLOAT32)


@pytest.mark.parametrize("how", ["mask", "bias"])
def test_torch_sdpa_also_zeroes_fully_masked_rows(how):
    # The contract took torch's choice: a row with no allowed key outputs zeros.
    q, k, v, mask, bias = _inputs("float64")
    mask[:, :, 2] = False
    bias[:, :, 2] = -np.inf
    kw = {how: True}
    expected = _torch_kernel(q, k, v, mask, bias, kw)
    np.testing.assert_array_equal(expected[:, :, 2], 0.0)
    ours = _ours(impl_torch, torch.from_numpy, q, k, v, mask, bias, kw).numpy()
    assert_within(ours, expected, "float64")


def test_torch_sdpa_silently_accepts_key_value_length_mismatch():
    # Difference: the fused CPU path (float32, D == E, K == H) returns a result; we refuse.
    q = torch.randn(2, 2, 5, 8)
    k, v = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 6, 8)
    assert F.scaled_dot_product_attention(q, k, v).shape == (2, 2, 5, 8)
    with pytest.raises(ValueError, match=r"key length \(S=7\) must equal value length \(S=6\)"):
        impl_torch.scaled_dot_product_attention(q, k, v)


def test_torch_sdpa_has_no_softcap():
    q = torch.randn(1, 2, 3)
    with pytest.raises(TypeError):
        F.scaled_dot_product_attention(q, q, q, softcap=2.0)
    assert impl_torch.scaled_dot_product_attention(q, q, q, softcap=2.0).shape == (1, 2, 3)


# --- JAX: jax.nn.dot_product_attention is heads-second (B, L, H, D) and needs E == D ---------


def _heads_second(x):
    return jnp.swapaxes(jnp.asarray(x), -3, -2)  # (B, H, L, D) <-> (B, L, H, D)


def _jax_kernel(q, k, v, *, mask=None, bias=None, is_causal=False, scale=None):
    out = jax.nn.dot_product_attention(
        _heads_second(q), _heads_second(k), _heads_second(v),
        bias=None if bias is None else jnp.asarray(bias),
        mask=None if mask is None else jnp.asarray(mask),
        scale=scale, is_causal=is_causal, implementation="xla",
    )
    return np.asarray(_heads_second(out))


JAX_AGREES = {
    "plain": {},
    "mask_per_head": {"mask": True},
    "bias_with_inf": {"bias": True},
    "scale_negative": {"scale": -0.5},
    "causal_top_left": {"is_causal": True},
}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", list(JAX_AGREES))
@pytest.mark.parametrize(("L", "S"), [(5, 7), (7, 5)])
def test_jax_matches_jax_dot_product_attention(case, dtype, L, S):
    kw = JAX_AGREES[case]
    q, k, v, mask, bias = _inputs(dtype, L=L, S=S, E=D)  # jax needs E == D
    expected = _jax_kernel(
        q, k, v, mask=mask if kw.get("mask") else None, bias=bias if kw.get("bias") else None,
        is_causal=kw.get("is_causal", False), scale=kw.get("scale"),
    )
    ours = np.asarray(_ours(impl_jax, jnp.asarray, q, k, v, mask, bias, kw))
    # jax's softmax runs in float32 even for float64 input (pinned below), hence float32's bound
    np.testing.assert_allclose(ours, expected, rtol=0, atol=FUSED_FLOAT32)


def test_jax_kernel_softmax_is_float32_even_for_float64():
    # Difference: our float64 path is float64 throughout (it agrees with torch to 1e-12 above);
    # jax.nn.dot_product_attention casts the logits to float32 before its softmax.
    q, k, v, *_ = _inputs("float64", E=D)
    theirs = _jax_kernel(q, k, v)
    assert theirs.dtype == np.float64
    ours = np.asarray(impl_jax.scaled_dot_product_attention(*map(jnp.asarray, (q, k, v))))
    torch_f64 = _torch_kernel(q, k, v, None, None, {})
    assert_within(ours, torch_f64, "float64")
    # measured: jax's float32 softmax is ~1e-7 off, far above any float64 rounding (1e-10)
    assert 1e-10 < np.abs(theirs - ours).max() < FUSED_FLOAT32


def test_jax_bottom_right_through_an_explicit_mask():
    # jax has no bottom_right alignment; our causal_mask spells it as a mask it accepts.
    q, k, v, *_ = _inputs("float64", L=3, S=7, E=D)
    expected = _jax_kernel(q, k, v, mask=impl_jax.causal_mask(3, 7, alignment="bottom_right"))
    ours = impl_jax.scaled_dot_product_attention(
        *map(jnp.asarray, (q, k, v)), is_causal=True, causal_alignment="bottom_right"
    )
    np.testing.assert_allclose(np.asarray(ours), expected, rtol=0, atol=FUSED_FLOAT32)


def test_jax_gives_uniform_rows_where_the_contract_gives_zeros():
    q, k, v, mask, _ = _inputs("float64", E=D)
    mask[:, :, 2] = False  # row 2: no allowed key
    theirs = _jax_kernel(q, k, v, mask=mask)
    ours = np.asarray(
        impl_jax.scaled_dot_product_attention(*map(jnp.asarray, (q, k, v)), mask=mask)
    )
    value_mean = np.repeat(v, H // K, axis=1).mean(axis=-2)  # (B, H, E): uniform weights
    np.testing.assert_allclose(theirs[:, :, 2], value_mean, rtol=0, atol=FUSED_FLOAT32)
    np.testing.assert_array_equal(ours[:, :, 2], 0.0)
    live = [0, 1, 3, 4]
    np.testing.assert_allclose(ours[:, :, live], theirs[:, :, live], rtol=0, atol=FUSED_FLOAT32)


def test_jax_gives_nan_for_an_all_minus_inf_bias_row():
    q, k, v, _, bias = _inputs("float64", E=D)
    bias[:, :, 2] = -np.inf
    theirs = _jax_kernel(q, k, v, bias=bias)
    ours = np.asarray(
        impl_jax.scaled_dot_product_attention(*map(jnp.asarray, (q, k, v)), bias=bias)
    )
    assert np.isnan(theirs[:, :, 2]).all()
    np.testing.assert_array_equal(ours[:, :, 2], 0.0)


def test_jax_kernel_refuses_value_head_dim_different_from_query():
    q, k, v, *_ = _inputs("float64")  # E = 13 != D = 11
    with pytest.raises(ValueError):
        _jax_kernel(q, k, v)
    assert impl_jax.scaled_dot_product_attention(*map(jnp.asarray, (q, k, v))).shape == (B, H, L, E)
