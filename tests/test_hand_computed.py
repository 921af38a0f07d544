"""Cases whose answers are known exactly, run in all three implementations.

The answers are written by hand, not computed by the oracle, and are held at rtol 1e-13 to 1e-15
(a few float64 roundings): tighter than the tolerance rule's float64 floor (1e-12 * max(1, |x|)),
which is for a result against the oracle's own computation of it.
"""

import math

import ml_dtypes
import numpy as np
import pytest

from conformance.oracle import assert_within
from tests.frameworks import DTYPES, NP_DTYPES


def test_two_keys_weights_are_one_and_e(fw):
    # q = [0, sqrt 2], k = I, D = 2: scores = [0, sqrt 2] / sqrt 2 = [0, 1].
    q = np.array([[[0.0, math.sqrt(2.0)]]])  # (H=1, L=1, D=2)
    k = np.eye(2)[None]  # (K=1, S=2, D=2)
    v = np.array([[[3.0, -1.0, 0.5], [7.0, 2.0, -4.0]]])  # (K=1, S=2, E=3)
    expected_w = np.array([1.0, math.e]) / (1.0 + math.e)
    np.testing.assert_allclose(fw.weights(q, k)[0, 0], expected_w, rtol=1e-14)
    np.testing.assert_allclose(fw.sdpa(q, k, v)[0, 0], expected_w @ v[0], rtol=1e-14)


def test_negative_scale_flips_the_preference(fw):
    q = np.array([[[0.0, 1.0]]])
    k = np.eye(2)[None]
    expected = np.array([math.e, 1.0]) / (1.0 + math.e)
    np.testing.assert_allclose(fw.weights(q, k, scale=-1.0)[0, 0], expected, rtol=1e-14)


def test_scale_zero_gives_the_mean_of_the_values(fw):
    rng = np.random.default_rng(1)
    q, k, v = (
        rng.standard_normal((2, 3, 5)),
        rng.standard_normal((2, 4, 5)),
        rng.standard_normal((2, 4, 6)),
    )
    out = fw.sdpa(q, k, v, scale=0.0)  # (H=2, L=3, E=6)
    np.testing.assert_allclose(
        out, np.broadcast_to(v.mean(axis=1, keepdims=True), out.shape), rtol=1e-13
    )


def test_softcap_caps_before_softmax(fw):
    # scale 1, scores [0, 10]; softcap 2 turns them into [0, 2 tanh 5].
    q = np.array([[[0.0, 10.0]]])
    k = np.eye(2)[None]
    capped = 2.0 * math.tanh(5.0)
    expected = np.array([1.0, math.exp(capped)]) / (1.0 + math.exp(capped))
    np.testing.assert_allclose(fw.weights(q, k, scale=1.0, softcap=2.0)[0, 0], expected, rtol=1e-14)


def test_gqa_query_head_h_reads_kv_head_h_over_g(fw):
    # H=6, K=2 (G=3). Value head k is the constant k + 1, so query head h outputs its kv head + 1.
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((6, 5, 4)), rng.standard_normal((2, 7, 4))
    v = np.stack([np.full((7, 3), 1.0), np.full((7, 3), 2.0)])  # (K=2, S=7, E=3)
    out = fw.sdpa(q, k, v)  # (H=6, L=5, E=3)
    contiguous = np.array([0, 0, 0, 1, 1, 1]) + 1.0  # h // G; tiling (h % K) would be 1,2,1,2,1,2
    np.testing.assert_allclose(
        out, np.broadcast_to(contiguous[:, None, None], out.shape), rtol=1e-14
    )


@pytest.mark.parametrize(
    ("alignment", "L", "S", "visible"),
    [
        ("top_left", 3, 5, [1, 2, 3]),
        ("bottom_right", 3, 5, [3, 4, 5]),
        ("top_left", 5, 3, [1, 2, 3, 3, 3]),
        ("bottom_right", 5, 3, [0, 0, 1, 2, 3]),  # L > S: the first L - S rows see nothing
    ],
)
def test_causal_alignment_counts_visible_keys(fw, alignment, L, S, visible):
    # Row i sees a prefix of `visible[i]` keys. With q = 0 the allowed keys weigh the same.
    expected_mask = np.array([[j < n for j in range(S)] for n in visible])  # (L, S)
    np.testing.assert_array_equal(
        fw.to_numpy(fw.module.causal_mask(L, S, alignment=alignment)), expected_mask
    )
    q, k = np.zeros((1, L, 2)), np.ones((1, S, 2))
    w = fw.weights(q, k, is_causal=True, causal_alignment=alignment)[0]  # (L, S)
    n = np.maximum(np.array(visible, dtype=float), 1.0)[:, None]
    np.testing.assert_allclose(w, np.where(expected_mask, 1.0 / n, 0.0), rtol=1e-14, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("how", ["mask", "bias", "causal", "no_keys"])
def test_fully_masked_rows_are_zero(fw, dtype, how):
    rng = np.random.default_rng(3)
    dt = NP_DTYPES[dtype]
    L, S = 4, 0 if how == "no_keys" else 5
    q, k, v = (rng.standard_normal(s).astype(dt) for s in ((2, L, 3), (2, S, 3), (2, S, 6)))
    kw = {}
    if how == "mask":
        mask = np.ones((L, S), bool)
        mask[1] = False
        kw["mask"] = mask
    elif how == "bias":
        bias = np.zeros((L, S), dt)
        bias[1] = -np.inf
        kw["bias"] = bias
    elif how == "causal":  # bottom_right with L > S: rows 0 .. L-S-1 see nothing
        q, k, v = q, k[:, :2], v[:, :2]
        kw = {"is_causal": True, "causal_alignment": "bottom_right"}
    out, w = fw.sdpa(q, k, v, **kw), fw.weights(q, k, **kw)
    assert out.dtype == dt and w.dtype == dt
    empty_rows = [1] if how in ("mask", "bias") else [0, 1] if how == "causal" else list(range(L))
    assert not np.isnan(out.astype(np.float64)).any()
    np.testing.assert_array_equal(out[:, empty_rows].astype(np.float64), 0.0)
    np.testing.assert_array_equal(w[:, empty_rows].astype(np.float64), 0.0)
    live = [i for i in range(L) if i not in empty_rows]
    if live:  # the other rows are proper distributions: 1 within half an ulp of 1 for the
        # rounding of weights that sum to 1, plus the computation's ulp or so (1.5 measured)
        eps = float(ml_dtypes.finfo(dt).eps)
        np.testing.assert_allclose(w[:, live].astype(np.float64).sum(-1), 1.0, rtol=2 * eps)


def test_huge_negative_finite_bias_is_not_a_masked_row(fw):
    # All finite and equal: softmax is uniform, by the mathematics (unlike an all -inf row).
    q, k, v = np.zeros((1, 2, 3)), np.ones((1, 4, 3)), np.arange(8.0).reshape(1, 4, 2)
    bias = np.zeros((2, 4))
    bias[0] = -1e30
    np.testing.assert_allclose(fw.weights(q, k, bias=bias)[0, 0], np.full(4, 0.25), rtol=1e-15)
    np.testing.assert_allclose(fw.sdpa(q, k, v, bias=bias)[0, 0], [3.0, 4.0], rtol=1e-15)


@pytest.mark.parametrize("dtype", DTYPES)
def test_output_has_the_input_dtype(fw, dtype):
    rng = np.random.default_rng(4)
    dt = NP_DTYPES[dtype]
    q, k, v = (rng.standard_normal(s).astype(dt) for s in ((2, 3, 4), (1, 5, 4), (1, 5, 7)))
    assert fw.sdpa(q, k, v).dtype == dt
    assert fw.weights(q, k).dtype == dt


def test_leading_batch_dims_broadcast(fw):
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 1, 4, 3, 5))  # (B1=2, B2=1, H=4, L=3, D=5)
    k = rng.standard_normal((3, 2, 6, 5))  # (B2=3, K=2, S=6, D=5)
    v = rng.standard_normal((3, 2, 6, 7))
    out = fw.sdpa(q, k, v)
    assert out.shape == (2, 3, 4, 3, 7)
    for b1 in range(2):
        for b2 in range(3):  # each batch element equals the unbatched call
            assert_within(out[b1, b2], fw.sdpa(q[b1, 0], k[b2], v[b2]), "float64")


def test_zero_query_length(fw):
    q, k, v = np.zeros((2, 0, 3)), np.ones((1, 5, 3)), np.ones((1, 5, 4))
    assert fw.sdpa(q, k, v).shape == (2, 0, 4)
    assert fw.weights(q, k, is_causal=True).shape == (2, 0, 5)


def test_value_head_dim_may_differ(fw):
    q, k = np.zeros((3, 2, 5)), np.zeros((3, 4, 5))
    v = np.arange(3 * 4 * 9, dtype=np.float64).reshape(3, 4, 9)
    out = fw.sdpa(q, k, v)  # (H=3, L=2, E=9): uniform weights, mean over S
    np.testing.assert_allclose(
        out, np.broadcast_to(v.mean(1, keepdims=True), (3, 2, 9)), rtol=1e-14
    )
