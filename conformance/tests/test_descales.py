"""conformance/ports/descales.py: the framework ports' fp8 descales, folded into the scale and
the output, never into the inputs, and exact for the descale shapes it takes."""

from __future__ import annotations

import inspect
import math

import ml_dtypes
import numpy as np
import pytest

from conformance.ports.descales import (
    DESCALES,
    folded_scale,
    numpy_output,
    takes_descales,
    value_factor,
    without_descales,
)

B, H, K, L, S, D, E = 2, 6, 2, 3, 5, 4, 7


def _attention(
    query: np.ndarray, key: np.ndarray, value: np.ndarray, *, scale: float | None = None
) -> np.ndarray:
    """A float64 reference kernel with one number as its scale and no descales (GQA in
    contiguous groups): what the decorator wraps."""
    q, k, v = (np.asarray(x, np.float64) for x in (query, key, value))
    k, v = (np.repeat(x, q.shape[-3] // x.shape[-3], axis=-3) for x in (k, v))
    scores = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


def test_folded_scale_takes_numbers_and_refuses_per_head_descales() -> None:
    assert folded_scale(None, D, None, None, "k") is None  # nothing given: the kernel's default
    assert folded_scale(0.5, D, 0.25, np.array([4.0], np.float32), "k") == 0.5
    assert folded_scale(None, D, 2.0, None, "k") == pytest.approx(2.0 / math.sqrt(D))
    with pytest.raises(NotImplementedError, match=r"my kernel .* k_descale of shape \(2, 2\)"):
        folded_scale(None, D, 1.0, np.ones((B, K), np.float32), "my kernel")


def test_value_factor_repeats_each_kv_head_over_its_contiguous_group() -> None:
    vd = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)  # (B, K)
    factor = value_factor(vd, H, K)
    assert factor.shape == (B, H, 1, 1)
    np.testing.assert_array_equal(factor[0, :, 0, 0], [1, 1, 1, 2, 2, 2])
    assert value_factor(np.array([5.0, 6.0], np.float32), H, K, token_major=True).shape == (H, 1)
    assert value_factor(None, H, K) is None
    with pytest.raises(NotImplementedError, match="per-sequence"):
        value_factor(vd, H, K, token_major=True)


def test_the_wrapper_is_exact_for_per_tensor_query_and_key_and_per_head_value_descales() -> None:
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((B, H, L, D)), rng.standard_normal((B, K, S, D))
    v = rng.standard_normal((B, K, S, E))
    vd = np.array([[0.5, 8.0], [2.0, 0.25]], np.float32)
    wrapped = takes_descales("test kernel", numpy_output)(_attention)
    got = wrapped(q, k, v, q_descale=0.5, k_descale=4.0, v_descale=vd)
    want = _attention(q * 0.5, k * 4.0, v * vd[..., None, None])
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # the product in float32


def test_an_fp8_query_gives_bfloat16_and_the_signature_has_the_descales() -> None:
    fp8 = ml_dtypes.float8_e4m3fn
    q, k, v = (np.ones(shape, fp8) for shape in ((B, H, L, D), (B, K, S, D), (B, K, S, E)))
    wrapped = takes_descales("test kernel", numpy_output)(_attention)
    assert wrapped(q, k, v, q_descale=2.0).dtype == ml_dtypes.bfloat16
    assert wrapped(q, k, v).dtype == ml_dtypes.bfloat16  # fp8 without descales: still bfloat16
    params = inspect.signature(wrapped).parameters
    assert list(params)[-3:] == list(DESCALES) and "scale" in params
    assert not set(DESCALES) & set(inspect.signature(without_descales(wrapped)).parameters)
