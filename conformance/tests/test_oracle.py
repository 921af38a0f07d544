"""The float64 oracle and the tolerance rule, against answers known by hand."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from conformance import oracle


def test_hand_computed_two_keys() -> None:
    """q = [0, sqrt 2], k = I, D = 2: scores [0, 1], weights [1, e] / (1 + e)."""
    q = np.array([[[0.0, math.sqrt(2.0)]]])  # (H=1, L=1, D=2)
    k = np.eye(2)[None]
    v = np.array([[[1.0, 0.0, 3.0], [0.0, 1.0, 5.0]]])  # (K=1, S=2, E=3)
    g = oracle.attention(q, k, v)
    e = math.e
    np.testing.assert_allclose(g.weights[0, 0], [1 / (1 + e), e / (1 + e)], rtol=1e-15)
    np.testing.assert_allclose(
        g.output[0, 0], [1 / (1 + e), e / (1 + e), (3 + 5 * e) / (1 + e)], rtol=1e-15
    )


def test_fully_masked_rows_are_zero_and_huge_negative_rows_uniform() -> None:
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((1, 3, 4)), rng.standard_normal((1, 5, 4)), np.ones((1, 5, 2))
    mask = np.ones((3, 5), bool)
    mask[1] = False
    bias = np.zeros((3, 5))
    bias[2] = -math.inf
    g = oracle.attention(q, k, v, mask=mask, bias=bias)
    assert np.all(g.weights[0, 1:] == 0) and np.all(g.output[0, 1:] == 0)
    assert not g.allowed[0, 1:].any() and g.allowed[0, 0].all()
    q[0, 0] = 0.0
    g = oracle.attention(q, k, v, bias=np.full((3, 5), -1e300))
    np.testing.assert_allclose(g.weights[0, 0], 0.2, rtol=1e-15)


def test_gqa_contiguous_groups() -> None:
    """H = 4, K = 2: heads 0, 1 read kv head 0; heads 2, 3 read kv head 1."""
    q = np.zeros((4, 1, 3))  # zero scores: uniform weights, output = mean of the kv head
    k = np.zeros((2, 2, 3))
    v = np.stack([np.full((2, 1), 10.0), np.full((2, 1), 20.0)])  # (K=2, S=2, E=1)
    out = oracle.attention(q, k, v).output[:, 0, 0]
    assert out.tolist() == [10.0, 10.0, 20.0, 20.0]


def test_causal_mask_alignments() -> None:
    assert oracle.causal_mask(2, 3).tolist() == [[True, False, False], [True, True, False]]
    assert oracle.causal_mask(2, 3, "bottom_right").tolist() == [
        [True, True, False],
        [True, True, True],
    ]
    assert oracle.causal_mask(3, 1, "bottom_right").tolist() == [[False], [False], [True]]


def test_softcap_comes_before_the_bias() -> None:
    q, k = np.array([[[3.0]]]), np.array([[[1.0], [1.0]]])  # scores [3, 3] with scale 1
    g = oracle.attention(q, k, bias=np.array([0.0, -math.inf]), scale=1.0, softcap=2.0)
    assert g.weights[0, 0].tolist() == [1.0, 0.0]


def test_plain_rounding_and_the_bound() -> None:
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 5), (2, 4, 5), (2, 4, 3)))
    q, k, v = (x.astype(np.float16).astype(np.float64) for x in (q, k, v))
    golden = oracle.attention(q, k, v)
    plain = oracle.attention(q, k, v, round_to="float16")
    err = np.max(np.abs(plain.output - golden.output))
    assert 0 < err < 1e-2
    assert np.all(plain.output.astype(np.float16).astype(np.float64) == plain.output)
    bound = oracle.tolerance_bound(golden.output, plain.output, "float16")
    assert bound >= 2 * err + oracle.NOISE_FLOOR["float16"]
    floor = oracle.NOISE_FLOOR["float16"] * max(1.0, np.abs(golden.output).max())
    assert bound <= 1.1 * (2 * err + floor)


def test_assert_within_applies_the_bound_and_says_where() -> None:
    """float64 needs no plain computation (its bound is the floor times max(1, max|golden|));
    another dtype does; a failure names the error, the bound and the element."""
    golden = np.array([[0.5, -3.0], [2.0, -np.inf]])
    at_10 = np.array([[0.0, 0.0], [1.0, 0.0]])  # one at (1, 0), where golden is 2
    assert oracle.assert_within(golden + 2.5e-12, golden, "float64") == pytest.approx(2.5e-12)
    with pytest.raises(AssertionError, match=r"4e-12 > the float64 bound 3e-12 at \(1, 0\)"):
        oracle.assert_within(golden + 4e-12 * at_10, golden, "float64", what="y: ")
    with pytest.raises(AssertionError, match="inf > the float64 bound"):  # -inf met only by -inf
        oracle.assert_within(np.where(np.isinf(golden), 0.0, golden), golden, "float64")
    with pytest.raises(AssertionError, match="inf > the float64 bound"):  # a NaN is no number
        oracle.assert_within(np.where(at_10 == 1, np.nan, golden), golden, "float64")
    with pytest.raises(ValueError, match="a float16 bound needs plain"):
        oracle.assert_within(golden, golden, "float16")
    plain = golden + 1e-3 * at_10  # bound 2 * 1e-3 + 1e-3 * max(1, 3) = 5e-3
    oracle.assert_within(golden - 4.9e-3 * at_10, golden, "float16", plain)
    with pytest.raises(AssertionError, match=r"0\.0051 > the float16 bound 0\.005 at \(1, 0\)"):
        oracle.assert_within(golden - 5.1e-3 * at_10, golden, "float16", plain)


def test_bound_is_rounded_up_to_two_digits() -> None:
    assert oracle._round_up_2_digits(1.234e-5) == 1.3e-5
    assert oracle._round_up_2_digits(2.0e-6) == 2.0e-6
    assert oracle._round_up_2_digits(9.91e-3) == 1.0e-2


def test_the_oracle_imports_no_implementation() -> None:
    tree = ast.parse(Path(oracle.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in names if m.split(".")[0].startswith("impl_")}


def test_bfloat16_rounds_through_float32_whatever_ml_dtypes_does() -> None:
    """The fixtures' one rounding rule (``oracle.rounded``): bfloat16 goes through float32. The
    value below is 2^-29 above the midpoint 1.17578125 of 1.171875 and 1.1796875: float32
    rounds it onto the midpoint and bfloat16 then rounds to even, 1.171875; a direct rounding
    (ml_dtypes 0.7's float64 cast) gives 1.1796875, and made two committed fixtures differ."""
    x = 1.17578125 + 2.0**-29
    assert float(np.float32(x)) == 1.17578125
    assert float(oracle.rounded(np.array([x]), "bfloat16")[0]) == 1.171875
    assert oracle.rounding("bfloat16")(x) == 1.171875
    assert oracle.rounding("float32")(x) == 1.17578125
    # float16 and float32 are single IEEE roundings of the float64 value
    assert float(oracle.rounded(x, "float16")) == float(np.float16(x))


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_rounding_is_ml_dtypes_round_trip_on_every_value_tie_and_binade(fmt: str) -> None:
    """The oracle's own fp8 rounding (from the formats' bits) against ml_dtypes' cast of the
    clipped float32 values: every representable value, every tie between neighbours, and
    random values over 32 binades, subnormals and saturation included."""
    import ml_dtypes

    grid = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, fmt)).astype(np.float64)
    grid = np.sort(grid[np.isfinite(grid)])
    rng = np.random.default_rng(28)
    spread = rng.standard_normal(20000) * np.exp(rng.uniform(-20, 12, 20000))
    x = np.concatenate([grid, (grid[:-1] + grid[1:]) / 2, spread]).astype(np.float32)
    top = oracle.FP8_FORMATS[fmt][2]
    want = np.clip(x, -top, top).astype(getattr(ml_dtypes, fmt)).astype(np.float64)
    assert np.array_equal(oracle.fp8_rounded(x.astype(np.float64), fmt), want)


def test_fp8_quantize_by_hand() -> None:
    """500 saturates to 448 in e4m3fn (never NaN); 0.3 with descale 1/448 is 134.4, between 128
    and 144, and rounds to 128; a tie (1.0625 = 1 + 1/16, between 1 and 1.125) goes to even."""
    values, d = oracle.quantize_fp8(np.array([[1.0, 0.3]]), axes=(0, 1))
    assert d == np.float32(1 / 448) and list(values[0]) == [448.0, 128.0]
    values, _ = oracle.quantize_fp8(np.array([[500.0, 1.0625, -1.1875]]), axes=(0, 1), descale=1.0)
    assert list(values[0]) == [448.0, 1.0, -1.25]
    assert list(oracle.dequantized(values[None, None], np.array([2.0]))[0, 0, 0]) == [
        896.0, 2.0, -2.5]
