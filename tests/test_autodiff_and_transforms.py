"""What each framework adds: autograd and devices in torch; jit, vmap and grad in JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import impl_jax
import impl_numpy
import impl_torch
from conformance.oracle import assert_within
from tests.frameworks import random_qkv

B, H, K, L, S, D, E = 2, 6, 2, 5, 7, 11, 13


def _case(seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(rng, (B,), H, K, L, S, D, E)
    mask = np.ones((L, S), bool)
    mask[3] = False  # query row 3 sees no key
    bias = rng.standard_normal((H, 1, S))
    return q, k, v, mask, bias


def _finite_difference_grad_wrt_query(q, k, v, mask, bias, eps=1e-6):
    """d sum(sdpa) / d query, by central differences on the NumPy implementation (float64)."""
    grad = np.zeros_like(q)
    for idx in np.ndindex(q.shape):
        for sign in (1.0, -1.0):
            qq = q.copy()
            qq[idx] += sign * eps
            out = impl_numpy.scaled_dot_product_attention(qq, k, v, mask=mask, bias=bias)
            grad[idx] += sign * out.sum() / (2 * eps)
    return grad


@pytest.fixture(scope="module")
def numeric_grad():
    q, k, v, mask, bias = _case()
    return _finite_difference_grad_wrt_query(q, k, v, mask, bias)


def test_torch_autograd_matches_finite_differences_and_is_zero_on_masked_rows(numeric_grad):
    q, k, v, mask, bias = _case()
    qt = torch.from_numpy(q).requires_grad_()
    kt, vt = torch.from_numpy(k).requires_grad_(), torch.from_numpy(v).requires_grad_()
    out = impl_torch.scaled_dot_product_attention(
        qt, kt, vt, mask=torch.from_numpy(mask), bias=torch.from_numpy(bias)
    )
    out.sum().backward()
    for g in (qt.grad, kt.grad, vt.grad):
        assert torch.isfinite(g).all()
    np.testing.assert_array_equal(qt.grad[:, :, 3].numpy(), 0.0)
    # against central differences of step 1e-6: their truncation and cancellation, not the rule
    np.testing.assert_allclose(qt.grad.numpy(), numeric_grad, rtol=1e-6, atol=1e-8)


def test_jax_grad_matches_finite_differences_and_is_zero_on_masked_rows(numeric_grad):
    q, k, v, mask, bias = _case()

    def loss(q, k, v):
        return impl_jax.scaled_dot_product_attention(q, k, v, mask=mask, bias=bias).sum()

    gq, gk, gv = jax.grad(loss, argnums=(0, 1, 2))(*map(jnp.asarray, (q, k, v)))
    for g in (gq, gk, gv):
        assert np.isfinite(np.asarray(g)).all()
    np.testing.assert_array_equal(np.asarray(gq)[:, :, 3], 0.0)
    # against central differences of step 1e-6: their truncation and cancellation, not the rule
    np.testing.assert_allclose(np.asarray(gq), numeric_grad, rtol=1e-6, atol=1e-8)


def test_jax_grad_under_jit_matches_the_oracle_in_float32():
    """A jitted training step gets the eager gradients: XLA may round ``s - max`` to just above
    0 at a row's max, and the clamp that keeps ``exp`` <= 1 must not cut the gradient there
    (a ``jnp.where`` clamp lost dK of the key every causal row sees first)."""
    from conformance.oracle import attention_vjp

    rng = np.random.default_rng(0)
    q, k, v = (x.astype(np.float32) for x in random_qkv(rng, (1,), H, K, L, S, D, E))
    do = rng.standard_normal((1, H, L, E)).astype(np.float32)
    args = [x.astype(np.float64) for x in (q, k, v, do)]
    golden = attention_vjp(*args, is_causal=True)
    plain = attention_vjp(*args, is_causal=True, round_to="float32")
    step = jax.jit(lambda *a: impl_jax.scaled_dot_product_attention_vjp(*a, is_causal=True))
    got = step(q, k, v, do)
    for g, name in zip(got[:3], ("query", "key", "value")):
        want, rounded = getattr(golden, name), getattr(plain, name)
        assert_within(np.asarray(g), want, "float32", rounded, what=f"d{name}: ")


def test_gradient_through_an_all_minus_inf_bias_row_is_zero_not_nan():
    q, k, v, _, bias = _case()
    bias = np.broadcast_to(bias, (H, L, S)).copy()
    bias[:, 1] = -np.inf
    qt = torch.from_numpy(q).requires_grad_()
    bt = torch.from_numpy(bias).requires_grad_()
    impl_torch.scaled_dot_product_attention(
        qt, torch.from_numpy(k), torch.from_numpy(v), bias=bt
    ).sum().backward()
    assert torch.isfinite(qt.grad).all() and torch.isfinite(bt.grad).all()
    np.testing.assert_array_equal(qt.grad[:, :, 1].numpy(), 0.0)

    gq, gb = jax.grad(
        lambda q, b: impl_jax.scaled_dot_product_attention(q, k, v, bias=b).sum(), argnums=(0, 1)
    )(jnp.asarray(q), jnp.asarray(bias))
    assert np.isfinite(np.asarray(gq)).all() and np.isfinite(np.asarray(gb)).all()
    np.testing.assert_array_equal(np.asarray(gq)[:, :, 1], 0.0)


@pytest.mark.parametrize(
    "keywords",
    [
        {},
        {"softcap": 2.0, "alibi_slopes": np.linspace(0.1, 0.6, H)},
        {"is_causal": True, "causal_alignment": "bottom_right", "window": (2, 0)},
    ],
    ids=["plain", "softcap-alibi", "causal-window"],
)
def test_torch_forward_is_the_same_with_and_without_autograd(keywords):
    """torch's steps are one path, with and without a gradient to record (no ``torch.softmax``
    where autograd is off): the same weights bit for bit, zeros on a row the mask empties and on
    a row an all -inf bias empties, and NaN where the query holds it."""
    q, k, v, mask, bias = _case(4)
    bias = np.repeat(bias, L, axis=1)  # (H, L, S)
    bias[:, 1] = -np.inf  # query row 1 sees no key through the bias
    q[0, 0, 2, 0] = np.nan  # garbage in an attended query row: it propagates
    kw = {"mask": torch.from_numpy(mask), "bias": torch.from_numpy(bias)} | {
        n: torch.from_numpy(x) if isinstance(x, np.ndarray) else x for n, x in keywords.items()
    }
    plain = impl_torch.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), **kw)
    leaves = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
    recorded = impl_torch.scaled_dot_product_attention(*leaves, **kw)
    assert plain.grad_fn is None and recorded.grad_fn is not None  # autograd off, then on
    torch.testing.assert_close(plain, recorded.detach(), rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(plain[0, 0, 2]).all() and not torch.isnan(plain[0, 1:]).any()
    assert (plain[:, :, [1, 3]] == 0).all()  # the bias's empty row and the mask's
    # The meta device has shapes but no data: any hidden .cpu(), .item() or host-side
    # value inspection would raise here.
    q, k, v = (torch.empty(s, device="meta") for s in ((B, H, L, D), (B, K, S, D), (B, K, S, E)))
    mask = torch.empty((L, S), dtype=torch.bool, device="meta")
    out = impl_torch.scaled_dot_product_attention(q, k, v, mask=mask, is_causal=True)
    assert out.device.type == "meta" and out.shape == (B, H, L, E)


def test_torch_compile_traces_one_graph():
    # fullgraph=True fails on any graph break; the eager backend keeps this test fast.
    q, k, v, mask, bias = (torch.from_numpy(x) for x in _case())
    compiled = torch.compile(
        impl_torch.scaled_dot_product_attention, backend="eager", fullgraph=True
    )
    kw = {"mask": mask, "bias": bias, "is_causal": True, "causal_alignment": "bottom_right"}
    want = impl_torch.scaled_dot_product_attention(q, k, v, **kw).numpy()
    assert_within(compiled(q, k, v, **kw).numpy(), want, "float64")


def test_jax_jit_with_static_keywords_and_vmap():
    q, k, v, mask, bias = _case()
    kw = {"is_causal": True, "causal_alignment": "bottom_right", "scale": 0.3, "softcap": 5.0}
    sdpa = jax.jit(impl_jax.scaled_dot_product_attention, static_argnames=impl_jax.STATIC_ARGNAMES)
    expected = impl_numpy.scaled_dot_product_attention(q, k, v, mask=mask, bias=bias, **kw)
    out = sdpa(q, k, v, mask=mask, bias=bias, **kw)
    assert_within(np.asarray(out), expected, "float64")
    # vmap over the batch axis gives the same as the batched call
    per_example = jax.vmap(lambda q, k, v: sdpa(q, k, v, mask=mask, bias=bias, **kw))(q, k, v)
    assert_within(np.asarray(per_example), expected, "float64")


def test_jax_errors_surface_under_jit():
    sdpa = jax.jit(impl_jax.scaled_dot_product_attention, static_argnames=impl_jax.STATIC_ARGNAMES)
    q, k, v = jnp.zeros((8, 5, 4)), jnp.zeros((3, 7, 4)), jnp.zeros((3, 7, 4))
    with pytest.raises(ValueError, match=r"key heads \(K=3\) must divide query heads \(H=8\)"):
        sdpa(q, k, v)
