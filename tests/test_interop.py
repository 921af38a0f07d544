"""Canonical weights in torch.nn.MultiheadAttention and flax.nnx.MultiHeadAttention.

Where the contracts agree, the frameworks' own modules give our modules' outputs and per-head
weights on the same weights and inputs; where they differ (fully masked rows, the precision of
flax's fused path), the tests pin the difference so that a framework change is noticed.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors import safe_open

from attention_spec import DimensionMismatchError
from attention_spec.modules import heads_from_metadata
from conformance.oracle import assert_within
from impl_jax.interop import from_flax_multihead_attention, to_flax_multihead_attention
from impl_numpy.functional import causal_mask
from impl_torch.interop import (
    from_torch_multihead_attention,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
    to_torch_multihead_attention,
)
from impl_torch.modules import tensor_from_numpy
from tests.frameworks import AGREE, assert_agree
from tests.module_frameworks import MODULE_FRAMEWORKS, B, H, K, L, S, random_canonical

# torch's module needs H*D = M and E = D: M = 18 = 6 x 3. flax's needs only E = D.
TORCH_M, TORCH_D = 18, 3
FLAX_M, FLAX_D = 17, 11


def _x(seed, M, dtype="float64", length=L):
    return np.random.default_rng(seed).standard_normal((B, length, M)).astype(dtype)


def _lengths_mask(lengths, kv_len):
    mask = np.zeros((len(lengths), 1, 1, kv_len), bool)
    for b, n in enumerate(lengths):
        mask[b, ..., :n] = True
    return mask


def _ours(weights, n_kv_heads, x, ctx, **kw):
    mf = MODULE_FRAMEWORKS["torch"]
    return mf.forward(mf.build(weights, H, n_kv_heads), x, ctx, return_weights=True, **kw)


# -- torch.nn.MultiheadAttention ------------------------------------------------------------


def _torch_weights(seed=0, dtype="float64", bias=True):
    return random_canonical(
        np.random.default_rng(seed), M=TORCH_M, K=H, D=TORCH_D, E=TORCH_D, bias=bias, dtype=dtype
    )


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", ["self", "cross", "causal", "padding", "per_head_mask"])
def test_torch_mha_matches_our_module(case, dtype):
    weights = _torch_weights(1, dtype)
    x = _x(2, TORCH_M, dtype)
    ctx = None if case in ("self", "causal") else _x(3, TORCH_M, dtype, length=S)
    kv_len = L if ctx is None else S
    ours_kw, theirs_kw = {}, {}
    if case == "causal":  # torch's is_causal is only a hint; the mask carries the rule
        mask = causal_mask(L, L)
        ours_kw = {"is_causal": True}
        theirs_kw = {"attn_mask": to_torch_attn_mask(torch.from_numpy(mask), (B, H, L, L))}
    if case == "padding":
        mask = _lengths_mask([4, 6], S)
        ours_kw = {"mask": mask}
        theirs_kw = {"key_padding_mask": to_torch_key_padding_mask(torch.from_numpy(mask))}
    if case == "per_head_mask":
        mask = np.random.default_rng(4).random((B, H, L, S)) > 0.3
        mask[..., 0] = True  # every row keeps a key: the contracts agree there
        ours_kw = {"mask": mask}
        theirs_kw = {"attn_mask": to_torch_attn_mask(torch.from_numpy(mask), (B, H, L, S))}
    want_y, want_w = _ours(weights, H, x, ctx, **ours_kw)

    mha = to_torch_multihead_attention(weights, n_heads=H)
    xt = tensor_from_numpy(x)
    ct = xt if ctx is None else tensor_from_numpy(ctx)
    y, w = mha(xt, ct, ct, need_weights=True, average_attn_weights=False, **theirs_kw)
    assert w.shape == (B, H, L, kv_len)
    assert_agree(y.detach().numpy(), want_y, dtype, what="output")
    assert_agree(w.detach().numpy(), want_w, dtype, what="weights")


def test_torch_mha_batch_first_false_takes_length_major_inputs():
    weights = _torch_weights(5)
    x, ctx = _x(6, TORCH_M), _x(7, TORCH_M, length=S)
    want_y, _ = _ours(weights, H, x, ctx)
    mha = to_torch_multihead_attention(weights, n_heads=H, batch_first=False)
    xt, ct = tensor_from_numpy(x).transpose(0, 1), tensor_from_numpy(ctx).transpose(0, 1)
    y, _ = mha(xt, ct, ct)  # (L, B, M)
    assert_within(y.transpose(0, 1).detach().numpy(), want_y, "float64")


@pytest.mark.parametrize("bias", [True, False])
def test_torch_mha_round_trip_is_exact(bias):
    weights = _torch_weights(8, "float32", bias=bias)
    back = from_torch_multihead_attention(to_torch_multihead_attention(weights, n_heads=H))
    assert list(back) == list(weights)
    for name, w in weights.items():
        np.testing.assert_array_equal(back[name], w)


def test_torch_mha_of_its_own_init_runs_in_our_module():
    """torch's own in_proj layout (q | k | v rows) read back: its output is ours."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(TORCH_M, H, batch_first=True, dtype=torch.float64)
    with torch.no_grad():  # torch zeroes its biases at init; give them values to check
        mha.in_proj_bias.uniform_(-1, 1)
        mha.out_proj.bias.uniform_(-1, 1)
    x, ctx = _x(9, TORCH_M), _x(10, TORCH_M, length=S)
    want, _ = mha(tensor_from_numpy(x), tensor_from_numpy(ctx), tensor_from_numpy(ctx))
    for mf in MODULE_FRAMEWORKS.values():
        module = mf.modules.MultiHeadAttention.from_canonical(
            from_torch_multihead_attention(mha), n_heads=H
        )
        y = mf.forward(module, x, ctx)
        assert_within(y, want.detach().numpy(), "float64", what=f"{mf.name}: ")


def test_torch_mha_gives_nan_where_we_give_zeros():
    """A query row with no allowed key: NaN from torch with need_weights (its default); ours is
    a zero attention row, so the output row is o_proj.bias."""
    weights = _torch_weights(11)
    x, ctx = _x(12, TORCH_M), _x(13, TORCH_M, length=S)
    mask = _lengths_mask([S, 0], S)  # example 1 has no real key at all
    want_y, want_w = _ours(weights, H, x, ctx, mask=mask)
    mha = to_torch_multihead_attention(weights, n_heads=H)
    xt, ct = tensor_from_numpy(x), tensor_from_numpy(ctx)
    kpm = to_torch_key_padding_mask(torch.from_numpy(mask))

    y, w = mha(xt, ct, ct, key_padding_mask=kpm, average_attn_weights=False)
    assert torch.isnan(y[1]).all() and torch.isnan(w[1]).all()
    assert np.all(want_w[1] == 0) and np.all(want_y[1] == weights["o_proj.bias"])
    assert_within(y[0].detach().numpy(), want_y[0], "float64")

    # need_weights=False goes through torch's SDPA, which zeroes the row, as we do...
    y, _ = mha(xt, ct, ct, key_padding_mask=kpm, need_weights=False)
    assert_within(y.detach().numpy(), want_y, "float64")
    # ...except on the inference fast path (self-attention, eval, no_grad, float32): NaN again.
    want_y, _ = _ours(weights, H, x, None, mask=_lengths_mask([L, 0], L))
    kpm = to_torch_key_padding_mask(torch.from_numpy(_lengths_mask([L, 0], L)))
    xf = xt.float()  # the fast path needs query is key is value
    with torch.no_grad():
        y, _ = mha.float().eval()(xf, xf, xf, key_padding_mask=kpm, need_weights=False)
    assert torch.isnan(y[1]).all()
    assert_agree(y[0].numpy(), want_y[0], "float32")  # torch's float32 fast path against ours


def test_torch_mask_polarity_helpers():
    mask = torch.tensor([[True, False, True]])  # (L=1, S=3), True = may attend
    assert to_torch_attn_mask(mask, (2, 3, 1, 3)).tolist() == [[False, True, False]]
    per_head = torch.rand(2, 3, 4, 5) > 0.5
    converted = to_torch_attn_mask(per_head, (2, 3, 4, 5))
    assert converted.shape == (6, 4, 5)  # (B*H, L, S), batch-major like torch's reshape
    assert torch.equal(converted[3 + 1], ~per_head[1, 1])
    pad = torch.tensor([[True, True, False]])[:, None, None, :]  # (B=1, 1, 1, S=3)
    assert to_torch_key_padding_mask(pad).tolist() == [[False, False, True]]


TORCH_REFUSALS = {
    "gqa": ({"K": 2}, 2, "breaking K == H (no grouped-query attention)"),
    "e_ne_d": ({"K": H, "E": 4}, None, "breaking E == D (one head dim)"),
    "hd_ne_m": ({"K": H, "D": 4, "E": 4}, None, "breaking H*D == M"),
}


@pytest.mark.parametrize("case", list(TORCH_REFUSALS))
def test_torch_mha_refuses_what_it_cannot_hold(case):
    sizes, n_kv_heads, fragment = TORCH_REFUSALS[case]
    kw = {"M": TORCH_M, "D": TORCH_D, "E": TORCH_D, **sizes}
    weights = random_canonical(np.random.default_rng(0), **kw)
    with pytest.raises(DimensionMismatchError) as info:
        to_torch_multihead_attention(weights, n_heads=H, n_kv_heads=n_kv_heads)
    assert info.value.code == "weight_shape"
    assert "torch.nn.MultiheadAttention can only hold weights with" in str(info.value)
    assert fragment in str(info.value)


# -- flax.nnx.MultiHeadAttention ------------------------------------------------------------


def _flax_weights(seed=0, dtype="float64", n_kv_heads=K, bias=True):
    return random_canonical(
        np.random.default_rng(seed), M=FLAX_M, K=n_kv_heads, D=FLAX_D, E=FLAX_D, bias=bias,
        dtype=dtype,
    )


def _flax_call(mha, x, ctx, mask=None, *, sow_weights):
    """flax's output, and its per-head weights when sown."""
    args = (jnp.asarray(x), None if ctx is None else jnp.asarray(ctx))
    if not sow_weights:
        return np.asarray(mha(*args, mask=mask)), None
    y, intermediates = nnx.capture(mha, nnx.Intermediate)(*args, mask=mask, sow_weights=True)
    (w,) = intermediates["attention_weights"].get_value()
    return np.asarray(y), np.asarray(w)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n_kv_heads", [K, H, 1], ids=["gqa", "mha", "mqa"])
@pytest.mark.parametrize("case", ["self", "cross_padding", "causal"])
def test_flax_mha_matches_our_module(case, n_kv_heads, dtype):
    weights = _flax_weights(1, dtype, n_kv_heads)
    x = _x(2, FLAX_M, dtype)
    ctx = _x(3, FLAX_M, dtype, length=S) if case == "cross_padding" else None
    mask = {"self": None, "cross_padding": _lengths_mask([4, 6], S),
            "causal": causal_mask(L, L)}[case]
    want_y, want_w = _ours(weights, n_kv_heads, x, ctx, mask=mask)
    mha = to_flax_multihead_attention(weights, n_heads=H, n_kv_heads=n_kv_heads)
    # flax's explicit path (taken when weights are sown) computes in the input dtype
    y, w = _flax_call(mha, x, ctx, None if mask is None else jnp.asarray(mask), sow_weights=True)
    assert_agree(y, want_y, dtype, what="output")
    assert_agree(w, want_w, dtype, what="weights")


def test_flax_fused_path_runs_softmax_in_float32():
    """Without sow_weights flax calls jax.nn.dot_product_attention, whose softmax is float32
    even for float64 inputs: float64 agrees with ours only to float32 rounding."""
    weights = _flax_weights(4, "float64")
    x = _x(5, FLAX_M)
    want_y, _ = _ours(weights, K, x, None)
    mha = to_flax_multihead_attention(weights, n_heads=H, n_kv_heads=K)
    y, _ = _flax_call(mha, x, None, sow_weights=False)
    error = np.abs(y - want_y).max()
    assert AGREE["float64"] < error < AGREE["float32"]  # float32's rounding, not float64's


@pytest.mark.parametrize("bias", [True, False])
def test_flax_mha_round_trip_is_exact(bias):
    weights = _flax_weights(6, "float32", bias=bias)
    mha = to_flax_multihead_attention(weights, n_heads=H, n_kv_heads=K)
    back = from_flax_multihead_attention(mha)
    assert list(back) == list(weights)
    for name, w in weights.items():
        np.testing.assert_array_equal(back[name], w)


def test_flax_mha_of_its_own_init_runs_in_our_module():
    mha = nnx.MultiHeadAttention(
        num_heads=H, in_features=FLAX_M, qkv_features=H * FLAX_D, num_kv_heads=K,
        param_dtype=jnp.float64, precision=jax.lax.Precision.HIGHEST,
        bias_init=nnx.initializers.uniform(1.0), decode=False, rngs=nnx.Rngs(7),
    )
    x, ctx = _x(8, FLAX_M), _x(9, FLAX_M, length=S)
    want, _ = _flax_call(mha, x, ctx, sow_weights=True)
    for mf in MODULE_FRAMEWORKS.values():
        module = mf.build(from_flax_multihead_attention(mha), H, K)
        assert_within(mf.forward(module, x, ctx), want, "float64", what=f"{mf.name}: ")


def test_flax_mha_gives_uniform_rows_where_we_give_zeros():
    """flax fills masked scores with the most negative finite number: a row with no allowed key
    becomes uniform over all S keys (the mean of the values), ours a zero row."""
    weights = _flax_weights(10)
    x, ctx = _x(11, FLAX_M), _x(12, FLAX_M, length=S)
    mask = _lengths_mask([S, 0], S)
    want_y, want_w = _ours(weights, K, x, ctx, mask=mask)
    mha = to_flax_multihead_attention(weights, n_heads=H, n_kv_heads=K)
    y, w = _flax_call(mha, x, ctx, jnp.asarray(mask), sow_weights=True)
    # exp(0) / S by hand: an exact value, held tighter than the rule's 1e-12 floor
    np.testing.assert_allclose(w[1], np.full((H, L, S), 1 / S), rtol=0, atol=1e-15)
    assert np.all(want_w[1] == 0)
    # uniform weights: the output is o_proj of the mean value of each kv head, for every row
    v = ctx[1] @ weights["v_proj.kernel"] + weights["v_proj.bias"]  # (S, K*E)
    mean_v = np.repeat(v.mean(axis=0).reshape(K, FLAX_D), H // K, axis=0).reshape(-1)  # (H*E,)
    uniform_y = mean_v @ weights["o_proj.kernel"] + weights["o_proj.bias"]  # (M,)
    assert_within(y[1], np.broadcast_to(uniform_y, (L, FLAX_M)), "float64")
    assert np.all(want_y[1] == weights["o_proj.bias"])
    assert_within(y[0], want_y[0], "float64")  # the rest agrees


def test_flax_mha_refuses_e_ne_d():
    weights = random_canonical(np.random.default_rng(0), M=FLAX_M, D=FLAX_D, E=5)
    with pytest.raises(DimensionMismatchError) as info:
        to_flax_multihead_attention(weights, n_heads=H, n_kv_heads=K)
    assert info.value.code == "weight_shape"
    assert "flax.nnx.MultiHeadAttention can only hold weights with E == D" in str(info.value)


# -- one file, five modules -----------------------------------------------------------------


def test_one_weight_file_runs_in_five_modules(tmp_path):
    """A file saved by the JAX module loads into ours (three), torch's and flax's: one output."""
    weights = random_canonical(np.random.default_rng(13), M=TORCH_M, K=H, D=TORCH_D, E=TORCH_D)
    path = tmp_path / "mha.safetensors"
    MODULE_FRAMEWORKS["jax"].build(weights, H, H).save(path)
    x, ctx = _x(14, TORCH_M), _x(15, TORCH_M, length=S)
    mask = _lengths_mask([5, 3], S)
    outputs = {}
    for name, mf in MODULE_FRAMEWORKS.items():
        outputs[name] = mf.forward(mf.modules.MultiHeadAttention.load(path), x, ctx, mask=mask)
    with safe_open(str(path), framework="numpy") as f:
        n_heads, n_kv_heads = heads_from_metadata(f.metadata())
        loaded = {n: f.get_tensor(n) for n in f.keys()}
    mha = to_torch_multihead_attention(loaded, n_heads=n_heads)
    xt, ct = tensor_from_numpy(x), tensor_from_numpy(ctx)
    kpm = to_torch_key_padding_mask(torch.from_numpy(mask))
    outputs["torch.nn"] = mha(xt, ct, ct, key_padding_mask=kpm)[0].detach().numpy()
    flax_mha = to_flax_multihead_attention(loaded, n_heads=n_heads, n_kv_heads=n_kv_heads)
    outputs["flax.nnx"], _ = _flax_call(flax_mha, x, ctx, jnp.asarray(mask), sow_weights=True)
    for name, y in outputs.items():
        assert_within(y, outputs["numpy"], "float64", what=f"{name}: ")
    assert math.isfinite(float(np.abs(outputs["numpy"]).max()))
