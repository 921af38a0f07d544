"""Property tests: on random shapes, groupings, masks, biases with -inf, alignments, scales and
softcaps, NumPy, PyTorch and JAX agree with each other within a bound for the dtype."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.frameworks import AGREE, FRAMEWORKS, NP_DTYPES, assert_agree


@st.composite
def attention_problems(draw):
    # Pairwise-distinct L, S, D, E so that a swapped axis cannot pass by accident.
    L, S, D, E = draw(st.lists(st.integers(1, 9), min_size=4, max_size=4, unique=True))
    K = draw(st.sampled_from([1, 2, 3]))
    G = draw(st.sampled_from([1, 2, 4]))
    H = K * G
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    dtype = draw(st.sampled_from(list(AGREE)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dt = NP_DTYPES[dtype]
    q = rng.standard_normal((*batch, H, L, D)).astype(dt)
    k = rng.standard_normal((*batch, K, S, D)).astype(dt)
    v = rng.standard_normal((*batch, K, S, E)).astype(dt)
    kw = {}
    if draw(st.booleans()):
        shape = draw(st.sampled_from([(S,), (L, S), (L, 1), (H, L, S), (1, 1, S)]))
        kw["mask"] = rng.random(shape) > draw(st.sampled_from([0.2, 0.6, 1.0]))
    if draw(st.booleans()):
        shape = draw(st.sampled_from([(S,), (L, S), (H, 1, S), (*batch, H, L, S)]))
        bias = rng.standard_normal(shape) * 2.0
        bias[rng.random(shape) < 0.3] = -np.inf
        kw["bias"] = bias.astype(dt)
    if draw(st.booleans()):
        kw["is_causal"] = True
        kw["causal_alignment"] = draw(st.sampled_from(["top_left", "bottom_right"]))
    kw["scale"] = draw(st.sampled_from([None, 0.0, -0.7, 1.0, 0.25]))
    kw["softcap"] = draw(st.sampled_from([None, 2.0, 30.0]))
    return q, k, v, kw, dtype


@pytest.mark.slow  # about 1 minute: 60 examples through the three packages
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(attention_problems())
def test_three_implementations_agree(problem):
    q, k, v, kw, dtype = problem
    outs = {name: fw.sdpa(q, k, v, **kw) for name, fw in FRAMEWORKS.items()}
    weights = {name: fw.weights(q, k, **kw) for name, fw in FRAMEWORKS.items()}
    ref_out, ref_w = outs["numpy"].astype(np.float64), weights["numpy"].astype(np.float64)
    assert not np.isnan(ref_out).any() and not np.isnan(ref_w).any()
    for name in ("torch", "jax"):
        assert outs[name].dtype == NP_DTYPES[dtype] and outs[name].shape == ref_out.shape
        assert_agree(outs[name], ref_out, dtype, what=f"{name} output: ")
        assert_agree(weights[name], ref_w, dtype, what=f"{name} weights: ")
    # rows of weights are distributions or, when no key is allowed, all zeros; each of the S
    # <= 9 weights rounded to the dtype once: within 20 x AGREE of 1 (2e-11 in float64)
    row_sums = ref_w.sum(-1)
    assert np.all((np.abs(row_sums - 1) < 20 * AGREE[dtype]) | (row_sums == 0))
