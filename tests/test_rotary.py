"""Rotary position embedding: what the rotation must be, by hand and by its algebra, the same
error in all three, and modules with RoPE (save/load, cross-attention, decoding).

The golden values of every dtype and convention are the conformance fixtures (``rope.*``,
``module.rope.*``, ``decode.rope.*``); these tests pin what the fixtures cannot say by
themselves: exact small cases, the relative-position property RoPE exists for, and the
module-level decisions of docs/SEMANTICS.md (where the queries of a cross-attention sit).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from attention_spec import (
    ConfigError,
    DimensionMismatchError,
    DTypeError,
    rotary_frequencies,
)
from conformance.oracle import assert_within
from tests.frameworks import FRAMEWORKS, same_error
from tests.module_frameworks import MODULE_FRAMEWORKS, random_canonical


@functools.cache
def _jax_rope():
    """JAX's apply_rotary jitted (eager JAX compiles each primitive anew for every shape)."""
    import jax

    import impl_jax

    return jax.jit(impl_jax.apply_rotary, static_argnames=impl_jax.ROTARY_STATIC_ARGNAMES)


def rope(fw, x, positions, **kw) -> np.ndarray:
    fn = _jax_rope() if fw.name == "jax" else fw.module.apply_rotary
    return fw.to_numpy(fn(fw.asarray(x), fw.asarray(positions), **kw))


def test_one_pair_turns_by_its_position_in_radians(fw):
    """x = (1, 0) at position t, rotary_dim 2 (frequency 1): (cos t, sin t); (0, 1): (-sin t,
    cos t). Both conventions are the same for a single pair."""
    x = np.array([[[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]]])  # (1, 1, 3, 2)
    t = np.array([2, 2, -1])
    want = [[math.cos(2), math.sin(2)], [-math.sin(2), math.cos(2)], [math.cos(1), -math.sin(1)]]
    for interleaved in (False, True):
        got = rope(fw, x, t, interleaved=interleaved)[0, 0]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)  # by hand: exact to an ulp


def test_the_pairs_of_each_convention(fw):
    """D = 4, theta 100: frequencies 1 and 0.1. Half-split pairs (x0, x2) and (x1, x3);
    interleaved pairs (x0, x1) and (x2, x3); features past rotary_dim are copied."""
    x = np.arange(1.0, 7.0).reshape(1, 1, 1, 6)  # one head, one token, D = 6
    c1, s1, c2, s2 = math.cos(3), math.sin(3), math.cos(0.3), math.sin(0.3)
    half = [1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2, 5, 6]
    inter = [1 * c1 - 2 * s1, 2 * c1 + 1 * s1, 3 * c2 - 4 * s2, 4 * c2 + 3 * s2, 5, 6]
    for interleaved, want in ((False, half), (True, inter)):
        got = rope(fw, x, np.array([3]), theta=100.0, rotary_dim=4, interleaved=interleaved)
        np.testing.assert_allclose(got[0, 0, 0], want, rtol=0, atol=1e-14)  # by hand: a few ulps


def test_scores_depend_only_on_the_relative_position(fw):
    """The reason RoPE exists: <rope(q, m), rope(k, n)> is a function of m - n. The same q and
    k at (7, 3) and at (1004, 1000) give the same score; at (7, 4) another one."""
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, 1, 1, 1, 8))
    for interleaved in (False, True):

        def score(m, n, q=q, k=k, interleaved=interleaved):
            kw = {"theta": 50.0, "interleaved": interleaved}
            qm = rope(fw, q, np.array([m]), **kw)
            kn = rope(fw, k, np.array([n]), **kw)
            return float(np.sum(qm * kn))

        assert_within(score(1004, 1000), score(7, 3), "float64")
        assert abs(score(7, 3) - score(7, 4)) > 1e-3


def test_conventions_differ_by_a_permutation_of_the_features(fw):
    """Half-split on x equals interleaved on x with its features permuted (pair p's two features
    moved to 2p, 2p + 1), permuted back: the two conventions are one rotation, stored in two
    layouts; what a converter of Meta's Llama checkpoints to Hugging Face's permutes."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 5, 8))
    order = np.array([0, 4, 1, 5, 2, 6, 3, 7])  # interleaved slot i holds half-split feature
    positions = np.arange(5)
    half = rope(fw, x, positions)
    inter = rope(fw, x[..., order], positions, interleaved=True)
    assert_within(inter[..., np.argsort(order)], half, "float64")
    assert np.abs(rope(fw, x, positions, interleaved=True) - half).max() > 0.1


def test_the_rotation_keeps_the_norm_and_the_dtype(fw):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    y = rope(fw, x, np.array([[0, 5, 10, 100000], [1, 2, 3, 4]]))
    assert y.dtype == np.float32
    norm = np.linalg.norm(x.astype(np.float64), axis=-1)
    # a property of a float32 rotation, not a comparison: the norm within a few float32 roundings
    # (of cos, sin and the products; 0.45 ulp measured)
    eps = float(np.finfo(np.float32).eps)
    np.testing.assert_allclose(np.linalg.norm(y.astype(np.float64), axis=-1), norm, rtol=4 * eps)


def test_the_frequencies_are_the_papers():
    """theta ** (-2p / R): for theta 10000 and R = 8, 1, 0.1, 0.01, 0.001; pair 0 is exactly 1,
    whatever theta (so its angle is the position itself, exact in float32 up to 2**24)."""
    # by hand: exact to an ulp
    assert rotary_frequencies(10000.0, 8) == pytest.approx((1.0, 0.1, 0.01, 0.001), rel=1e-15)
    assert rotary_frequencies(500000.0, 2) == (1.0,)
    assert len(rotary_frequencies(10000.0, 6)) == 3


# id: (x shape, x dtype, positions shape, positions dtype, keywords, class, code, message part)
ERRORS = {
    "rotary_dim_odd": ((2, 3, 5, 8), "float32", (5,), "int64", {"rotary_dim": 5},
                       ConfigError, "rotary_dim", "rotary_dim must be even and in [2, D=8]"),
    "rotary_dim_default_odd": ((2, 3, 5, 7), "float32", (5,), "int64", {}, ConfigError,
                               "rotary_dim", "got None, which means D=7"),
    "rotary_dim_float": ((2, 3, 5, 8), "float32", (5,), "int64", {"rotary_dim": 4.0},
                         ConfigError, "rotary_dim", "must be an even integer"),
    "theta_inf": ((2, 3, 5, 8), "float32", (5,), "int64", {"theta": math.inf}, ConfigError,
                  "rope_theta", "theta must be a finite number > 0"),
    "theta_text": ((2, 3, 5, 8), "float32", (5,), "int64", {"theta": "1e4"}, ConfigError,
                   "rope_theta", "theta must be a real number; got '1e4'"),
    "positions_float": ((2, 3, 5, 8), "float32", (5,), "float32", {}, DTypeError,
                        "positions_dtype", "positions must be integers (token indices); got"),
    "positions_per_head": ((2, 3, 5, 8), "float32", (2, 3, 5), "int32", {},
                           DimensionMismatchError, "positions_shape",
                           "positions must broadcast to (B=2, L=5), the batch dims of x"),
    "x_rank": ((5, 8), "float32", (5,), "int64", {}, DimensionMismatchError, "rank",
               "x must have at least 3 dims (..., heads, L, D); got shape (5, 8)"),
    "x_int": ((2, 3, 5, 8), "int32", (5,), "int64", {}, DTypeError, "unsupported_dtype",
              "x dtype must be one of"),
    "interleaved_text": ((2, 3, 5, 8), "float32", (5,), "int64", {"interleaved": "True"},
                         ConfigError, "not_a_bool", "interleaved must be a bool"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_every_rotary_error_is_identical_in_all_three(case):
    x_shape, x_dtype, p_shape, p_dtype, kw, cls, code, fragment = ERRORS[case]
    x, positions = np.zeros(x_shape, x_dtype), np.zeros(p_shape, p_dtype)
    same_error(
        lambda fw: fw.module.apply_rotary(fw.asarray(x), fw.asarray(positions), **kw),
        cls, code, fragment,
    )


def test_jax_apply_rotary_runs_eagerly_too():
    """The other tests run JAX's apply_rotary jitted (as the conformance runner does)."""
    import impl_jax

    x = np.random.default_rng(6).standard_normal((2, 3, 4, 8))
    positions = np.array([3, 1, 4, 1])
    got = np.asarray(
        impl_jax.apply_rotary(x, positions, theta=100.0, rotary_dim=6, interleaved=True)
    )
    want = rope(FRAMEWORKS["numpy"], x, positions, theta=100.0, rotary_dim=6, interleaved=True)
    assert_within(got, want, "float64")


def test_torch_gradient_is_the_inverse_rotation():
    """The rotation is orthogonal: the gradient of <rope(x), g> with respect to x is the
    rotation of g by minus the angles."""
    import torch

    import impl_torch

    rng = np.random.default_rng(7)
    x = torch.tensor(rng.standard_normal((1, 2, 3, 6)), requires_grad=True)
    g = torch.tensor(rng.standard_normal((1, 2, 3, 6)))
    positions = torch.tensor([2, 9, 4])
    (impl_torch.apply_rotary(x, positions) * g).sum().backward()
    assert_within(x.grad, impl_torch.apply_rotary(g, -positions).numpy(), "float64")


# ---------------------------------------------------------------------------------------------
# Modules with RoPE
# ---------------------------------------------------------------------------------------------

ROPE = {"rope_theta": 100.0, "rope_interleaved": True, "rotary_dim": 4}


def test_module_rope_settings_are_refused_the_same_way_in_all_three():
    for kw, code in (({"rotary_dim": 4}, "rope_theta"), ({"rope_interleaved": True}, "rope_theta"),
                     ({"rope_theta": 1e4, "rotary_dim": 3}, "rotary_dim"),
                     ({"rope_theta": 1e4, "rotary_dim": 10}, "rotary_dim"),
                     ({"rope_theta": -1.0}, "rope_theta"),
                     ({"rope_theta": 1e4, "rope_interleaved": 1}, "not_a_bool")):
        same_error(
            lambda mf, kw=kw: mf.modules.GroupedQueryAttention(24, 6, 2, **kw),  # D = 4
            code=code, frameworks=MODULE_FRAMEWORKS,
        )


@pytest.mark.parametrize("name", list(MODULE_FRAMEWORKS))
def test_a_weight_file_carries_the_rope_settings(tmp_path, name):
    """save writes rope_theta, rope_interleaved and rotary_dim into the file's metadata, load
    rebuilds the same module; every framework writes the same bytes and reads any other's."""
    weights = random_canonical(np.random.default_rng(8), M=16, H=4, K=2, D=6, E=3)
    x = np.random.default_rng(9).standard_normal((2, 5, 16))
    files = {}
    for other, mf in MODULE_FRAMEWORKS.items():
        module = mf.build(weights, 4, 2, **ROPE)
        files[other] = tmp_path / f"{other}.safetensors"
        module.save(files[other])
    assert len({f.read_bytes() for f in files.values()}) == 1
    mf = MODULE_FRAMEWORKS[name]
    loaded = mf.modules.GroupedQueryAttention.load(files["numpy" if name != "numpy" else "jax"])
    assert loaded.rope.module_keywords() == ROPE
    want = mf.forward(mf.build(weights, 4, 2, **ROPE), x)
    np.testing.assert_array_equal(mf.forward(loaded, x), want)
    assert np.abs(mf.forward(mf.build(weights, 4, 2), x) - want).max() > 1e-3  # RoPE matters


@pytest.mark.parametrize("name", list(MODULE_FRAMEWORKS))
def test_cross_attention_bottom_right_puts_the_queries_where_decoding_does(name):
    """Decided in docs/SEMANTICS.md: in cross-attention query i sits at i + offset (the causal
    alignment's), key j at j. So the last L tokens attending, bottom-right causal, to the whole
    sequence as context give what decoding those L tokens after the first T - L gives."""
    mf = MODULE_FRAMEWORKS[name]
    weights = random_canonical(np.random.default_rng(10), M=16, H=4, K=2, D=6, E=3)
    module = mf.build(weights, 4, 2, rope_theta=100.0)
    seq = np.random.default_rng(11).standard_normal((2, 7, 16))  # T = 7
    cache = module.init_cache(2, 7)
    _, cache = mf.decode(module, seq[:, :4], cache)
    decoded, _ = mf.decode(module, seq[:, 4:], cache)  # tokens 4, 5, 6 at positions 4, 5, 6
    crossed = mf.forward(module, seq[:, 4:], seq, is_causal=True, causal_alignment="bottom_right")
    assert_within(crossed, decoded, "float64")
    top_left = mf.forward(module, seq[:, 4:], seq, is_causal=True)  # queries at 0, 1, 2
    assert np.abs(top_left - decoded).max() > 1e-3
