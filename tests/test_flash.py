"""``flash_attention`` of NumPy, PyTorch and JAX against the plain path and the float64 oracle.

For every case, the tiled output of each implementation must be within the project's tolerance
rule of the float64 oracle (``conformance.oracle.attention``, on the same inputs upcast to
float64): at most twice the error of the same framework's plain ``scaled_dot_product_attention``
in the same dtype, plus a noise floor of a few units in the last place (:data:`ULP_FLOOR`).
Rows with no allowed key must be exactly zero. The row log-sum-exp is checked against the
oracle's; gradients against the plain path's; errors against the plain path's (same class, code
and message). The broken ports of conformance/tests/flash_broken.py prove that these checks
catch the classic tiling bugs.

Sizes are pairwise distinct (H=6, K=2, L=113, S=203, D=11, E=13) so a swapped axis cannot pass.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache, partial

import jax

jax.config.update("jax_enable_x64", True)  # float64 is one of the four dtypes of the contract

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import impl_jax.flash  # noqa: E402
import impl_jax.functional  # noqa: E402
import impl_numpy.flash  # noqa: E402
import impl_numpy.functional  # noqa: E402
import impl_torch.flash  # noqa: E402
import impl_torch.functional  # noqa: E402
from attention_spec import BLOCK_K, BLOCK_Q, AttentionError, tiled_blocks  # noqa: E402
from conformance import oracle  # noqa: E402
from conformance.tests.flash_broken import BROKEN  # noqa: E402

#: Each framework's tiled module (``flash_attention``, ``flash_attention_vjp``, ``tiled_blocks``),
#: by the names of ``FRAMEWORKS``.
FLASH = {"numpy": impl_numpy.flash, "torch": impl_torch.flash, "jax": impl_jax.flash}

DTYPES = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
#: Noise floor of the tolerance rule, per unit of the largest output magnitude: a few units in the
#: last place of float32/float64 arithmetic, one unit of the output's rounding in float16/bfloat16.
#: Not the manifest's ``oracle.NOISE_FLOOR`` and ``oracle.tolerance_bound``: the plain computation
#: here is the framework's own plain path (float32 inside for float16/bfloat16), and with it these
#: floors are the tighter ones (float64: 7.1e-15 against the manifest's 1e-12; float16: 9.8e-4
#: against 1e-3; bfloat16: 7.8e-3 against 8e-3); the manifest's rule would loosen this check.
ULP_FLOOR = {
    "float64": 32 * 2.0**-52,
    "float32": 32 * 2.0**-23,
    "float16": 2.0**-10,
    "bfloat16": 2.0**-7,
}


# ---------------------------------------------------------------------------------------------
# The three frameworks, seen through NumPy arrays


@pytest.fixture(autouse=True, scope="module")
def _torch_one_thread():
    """torch on a busy 2-core machine: its thread pool spins on these small blocks, 100x slower
    (measured: 1 s instead of 5 ms per call); one thread for this module's calls."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass(frozen=True)
class Framework:
    name: str
    flash: Callable
    sdpa: Callable
    native: Callable[[np.ndarray], object]  # NumPy array -> the framework's array
    numpy: Callable[[object], np.ndarray]  # the framework's array -> float64 NumPy array


def _torch_native(x: np.ndarray) -> torch.Tensor:
    if x.dtype == ml_dtypes.bfloat16:  # exact: the values are bfloat16 already
        return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(x if x.flags.c_contiguous else x.copy())  # 0-d stays 0-d


def _torch_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).numpy()


_JAX_FLASH = jax.jit(impl_jax.flash.flash_attention, static_argnames=impl_jax.flash.STATIC_ARGNAMES)
_JAX_SDPA = jax.jit(
    impl_jax.functional.scaled_dot_product_attention,
    static_argnames=impl_jax.functional.STATIC_ARGNAMES,
)

FRAMEWORKS = {
    "numpy": Framework(
        "numpy",
        impl_numpy.flash.flash_attention,
        impl_numpy.functional.scaled_dot_product_attention,
        lambda x: x,
        lambda x: np.asarray(x, dtype=np.float64),
    ),
    "torch": Framework(
        "torch",
        impl_torch.flash.flash_attention,
        impl_torch.functional.scaled_dot_product_attention,
        _torch_native,
        _torch_numpy,
    ),
    "jax": Framework(
        "jax", _JAX_FLASH, _JAX_SDPA, jnp.asarray, lambda x: np.asarray(x).astype(np.float64)
    ),
}
#: The NumPy framework with one of the broken ports in place of its flash_attention.
BROKEN_FRAMEWORKS = {
    name: replace(FRAMEWORKS["numpy"], name=f"broken:{name}", flash=fn)
    for name, fn in BROKEN.items()
}


# ---------------------------------------------------------------------------------------------
# Cases: shapes, keywords and block sizes


@dataclass(frozen=True)
class Case:
    """One call: batch dims of query/key/value, sizes, keywords, block sizes."""

    L: int = 113
    S: int = 203
    H: int = 6
    K: int = 2
    D: int = 11
    E: int = 13
    batch: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] = ((2,), (2,), (2,))
    blocks: tuple[int, int] = (32, 64)
    mask: str | None = None  # a name in _MASKS
    bias: str | None = None  # a name in _BIASES
    kwargs: tuple[tuple[str, object], ...] = ()

    def inputs(self, dtype: np.dtype) -> dict[str, np.ndarray | None]:
        """query, key, value rounded to ``dtype``, and mask, bias; seeded by the case."""
        rng = np.random.default_rng(zlib.crc32(repr(self).encode()))  # stable across runs
        (bq, bk, bv), H, K, L, S = self.batch, self.H, self.K, self.L, self.S
        out = {
            "query": 2.0 * rng.standard_normal((*bq, H, L, self.D)),  # scores of spread ~2
            "key": rng.standard_normal((*bk, K, S, self.D)),
            "value": rng.standard_normal((*bv, K, S, self.E)),
        }
        out = {name: x.astype(dtype) for name, x in out.items()}
        batch = np.broadcast_shapes(bq, bk, bv)
        out["mask"] = None if self.mask is None else _MASKS[self.mask](rng, batch, H, L, S)
        out["bias"] = None if self.bias is None else _BIASES[self.bias](rng, batch, H, L, S)
        if out["bias"] is not None:
            out["bias"] = out["bias"].astype(dtype)
        return out


def _mask_full(rng, batch, H, L, S):  # (..., H, L, S), ~70% allowed, rows 3 and 17 all False
    m = rng.random((*batch, H, L, S)) < 0.7
    m[..., 3, :] = False
    m[..., 1, 17, :] = False
    return m


_MASKS = {
    "full_with_empty_rows": _mask_full,
    "S": lambda rng, batch, H, L, S: rng.random(S) < 0.6,  # (S,)
    "L1": lambda rng, batch, H, L, S: rng.random((L, 1)) < 0.8,  # (L, 1): rows all True/False
    "1H1S": lambda rng, batch, H, L, S: rng.random((1, H, 1, S)) < 0.6,  # (1, H, 1, S)
    "B1LS": lambda rng, batch, H, L, S: rng.random((*batch, 1, L, S)) < 0.6,  # (B, 1, L, S)
}


def _bias_full(rng, batch, H, L, S):  # (..., H, L, S), with -inf entries and a -inf row
    b = rng.standard_normal((*batch, H, L, S))
    b[rng.random(b.shape) < 0.2] = -np.inf
    b[..., 5, :] = -np.inf
    return b


_BIASES = {
    "full_with_inf_rows": _bias_full,
    "LS": lambda rng, batch, H, L, S: rng.standard_normal((L, S)),  # (L, S)
    "H11": lambda rng, batch, H, L, S: rng.standard_normal((H, 1, 1)),  # (H, 1, 1)
}


def _c(**kw) -> Case:
    kwargs = tuple(sorted(kw.pop("kwargs", {}).items()))
    return Case(kwargs=kwargs, **kw)


CASES: dict[str, Case] = {
    "odd_sizes": _c(),
    "blocks_larger_than_sequence": _c(blocks=(128, 256)),
    "blocks_not_dividing_small": _c(blocks=(17, 9)),
    "mqa": _c(K=1),
    "mha": _c(K=6),
    "causal_top_left_L<S": _c(kwargs=dict(is_causal=True)),
    "causal_bottom_right_L<S": _c(kwargs=dict(is_causal=True, causal_alignment="bottom_right")),
    "causal_top_left_L>S": _c(L=203, S=113, kwargs=dict(is_causal=True)),
    "causal_bottom_right_L>S": _c(  # the first L - S = 90 rows see no key
        L=203, S=113, kwargs=dict(is_causal=True, causal_alignment="bottom_right")
    ),
    "softcap": _c(kwargs=dict(softcap=1.5)),
    "scale_negative": _c(kwargs=dict(scale=-0.7)),
    "mask_with_empty_rows": _c(mask="full_with_empty_rows"),
    "mask_S": _c(mask="S"),
    "mask_L1": _c(mask="L1"),
    "mask_1H1S": _c(mask="1H1S"),
    "mask_B1LS": _c(mask="B1LS"),
    "bias_with_inf_rows": _c(bias="full_with_inf_rows"),
    "bias_LS": _c(bias="LS"),
    "bias_H11_softcap": _c(bias="H11", kwargs=dict(softcap=2.5)),
    "mask_bias_causal": _c(
        L=203,
        S=113,
        mask="B1LS",
        bias="LS",
        kwargs=dict(is_causal=True, causal_alignment="bottom_right"),
    ),
    "L0": _c(L=0),
    "S0": _c(S=0),
    "no_batch": _c(batch=((), (), ())),
    "batch_broadcast": _c(batch=((2, 1), (3,), (4, 1, 3))),  # value adds batch: (4, 2, 3)
    "value_more_batch": _c(batch=((), (), (2,))),
}
DTYPE_CASES = ["odd_sizes", "causal_bottom_right_L>S", "mask_with_empty_rows"]
#: JAX compiles each case (about half a second of XLA time on a CPU, as much as all the NumPy
#: cases together), so it runs the cases that reach every branch of impl_jax/flash.py: the
#: shifted last blocks, blocks larger than the sequence, causal skipping with empty rows, mask and
#: bias slicing, GQA/MQA, batch broadcasting, L = 0 and S = 0. The conformance suite runs every
#: SDPA fixture through it as well.
JAX_CASES = [
    "odd_sizes",
    "blocks_larger_than_sequence",
    "mqa",
    "causal_top_left_L<S",
    "causal_bottom_right_L>S",
    "mask_with_empty_rows",
    "bias_with_inf_rows",
    "mask_bias_causal",
    "bias_H11_softcap",
    "L0",
    "S0",
    "batch_broadcast",
]
JAX_DTYPE_CASES = ["causal_bottom_right_L>S"]


def _framework_cases(cases: list[str], jax_cases: list[str]) -> list[tuple[str, str]]:
    """(framework, case) pairs: every case for NumPy and torch, ``jax_cases`` for JAX."""
    return [(fw, case) for fw in FRAMEWORKS for case in (jax_cases if fw == "jax" else cases)]


# ---------------------------------------------------------------------------------------------
# The float64 oracle and the check


@dataclass(frozen=True)
class Expected:
    """What the check needs of the oracle's answer for one case and dtype."""

    output: np.ndarray  # (..., H, L, E): the batch of query, key and value
    empty_rows: np.ndarray  # (..., H, L) bool: rows with no allowed key
    lse: np.ndarray  # (..., H, L): -inf on the empty rows
    score_scale: float  # max(1, largest |allowed score|): the lse bound's scale


@cache
def _expected(case: Case, dtype_name: str) -> Expected:
    """The oracle on ``case``'s inputs in ``dtype_name``, upcast to float64. Cached (only what
    the check reads, not the oracle's (..., H, L, S) arrays): one answer serves the three
    frameworks and the broken ports."""
    inp = case.inputs(DTYPES[dtype_name])
    q, k, v = (inp[name].astype(np.float64) for name in ("query", "key", "value"))
    bias = None if inp["bias"] is None else inp["bias"].astype(np.float64)
    golden = oracle.attention(q, k, v, mask=inp["mask"], bias=bias, **dict(case.kwargs))
    rows = golden.output.shape[:-1]  # (..., H, L)
    kept = golden.scores[golden.allowed]  # the allowed (finite) scores
    return Expected(
        output=golden.output,
        empty_rows=np.broadcast_to(~golden.allowed.any(axis=-1), rows),
        lse=np.broadcast_to(golden.lse, rows),
        score_scale=max(1.0, float(np.abs(kept).max(initial=0.0))),
    )


def _max_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b), initial=0.0))


def check_flash(fw: Framework, case: Case, dtype_name: str) -> None:
    """Assert that ``fw.flash`` passes ``case`` in ``dtype_name`` (raises AssertionError): its
    output against the oracle's and the plain path's, its lse against the oracle's."""
    inp = case.inputs(DTYPES[dtype_name])
    expected = _expected(case, dtype_name)
    ref = expected.output  # (..., H, L, E)
    native = {k: (None if v is None else fw.native(v)) for k, v in inp.items()}
    block_q, block_k = case.blocks
    out, lse = fw.flash(
        **native, **dict(case.kwargs), block_q=block_q, block_k=block_k, return_lse=True
    )
    plain = fw.numpy(fw.sdpa(**native, **dict(case.kwargs)))
    assert _dtype_name(out) == dtype_name, "output dtype is not the input dtype"
    assert _dtype_name(lse) == ("float64" if dtype_name == "float64" else "float32")
    got, lse = fw.numpy(out), fw.numpy(lse)

    # The output: finite, zero where no key is allowed, within the tolerance rule.
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.isfinite(got).all(), "non-finite output"
    empty_rows = expected.empty_rows  # (..., H, L): no allowed key
    assert not got[empty_rows].any(), "a row with no allowed key is not zero"
    floor = ULP_FLOOR[dtype_name] * max(1.0, float(np.abs(ref).max(initial=0.0)))
    err_plain = _max_err(plain, ref)
    bound = 2 * err_plain + floor
    err = _max_err(got, ref)
    assert err <= bound, f"error {err:.3g} against float64 > bound {bound:.3g}"
    assert _max_err(got, plain) <= err_plain + bound, "too far from the plain path"

    # The row log-sum-exp: -inf exactly where no key is allowed, else the oracle's.
    want = expected.lse  # (..., H, L)
    assert lse.shape == want.shape, (lse.shape, want.shape)
    np.testing.assert_array_equal(np.isneginf(lse), empty_rows, "lse -inf rows")
    finite = ~empty_rows
    # Scores carry the error of dot products of length D in the compute dtype.
    lse_floor = ULP_FLOOR["float64" if dtype_name == "float64" else "float32"]
    lse_tol = lse_floor * expected.score_scale
    lse_err = _max_err(lse[finite], want[finite])
    assert lse_err <= lse_tol, f"lse error {lse_err:.3g} > {lse_tol:.3g}"


def _dtype_name(x) -> str:
    return str(x.dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------------------------
# Outputs


@pytest.mark.parametrize(("fw", "case"), _framework_cases(list(CASES), JAX_CASES))
def test_flash_matches_plain_and_float64(fw: str, case: str) -> None:
    check_flash(FRAMEWORKS[fw], CASES[case], "float64")


@pytest.mark.parametrize(("fw", "case"), _framework_cases(DTYPE_CASES, JAX_DTYPE_CASES))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_flash_low_precision(fw: str, dtype: str, case: str) -> None:
    check_flash(FRAMEWORKS[fw], CASES[case], dtype)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_hand_computed(fw: str) -> None:
    """q = [0, sqrt 2], k = I, scale 1/sqrt 2: scores [0, 1], weights [1, e] / (1 + e), lse
    log(1 + e); one key per block, so the second block raises the row max."""
    f = FRAMEWORKS[fw]
    q = np.array([[[0.0, np.sqrt(2.0)]]])  # (H=1, L=1, D=2)
    k = np.eye(2)[None]  # (K=1, S=2, D=2)
    v = np.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])  # (K=1, S=2, E=3)
    out, lse = f.flash(f.native(q), f.native(k), f.native(v), block_k=1, return_lse=True)
    e = np.e  # exact values by hand: held to 1e-14, tighter than the rule's float64 floor
    np.testing.assert_allclose(f.numpy(out), [[[1 / (1 + e), e / (1 + e), 0.0]]], rtol=1e-14)
    np.testing.assert_allclose(f.numpy(lse), [[np.log(1 + e)]], rtol=1e-14)
    alone = f.flash(f.native(q), f.native(k), f.native(v), block_k=1)  # return_lse=False
    np.testing.assert_array_equal(f.numpy(alone), f.numpy(out))


# ---------------------------------------------------------------------------------------------
# Causal blocks above the diagonal are never visited


@pytest.mark.parametrize("fw", FRAMEWORKS)
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_causal_skips_blocks_above_the_diagonal(fw: str, alignment: str) -> None:
    """NaN in the values of keys 75..99: a visited block turns its rows NaN (0 * NaN), so rows
    whose query blocks end before the poisoned keys are finite only if those blocks are skipped.
    The plain path, which visits every key, is NaN everywhere. (In JAX the skipped step is a
    ``lax.cond`` branch; that it is also not computed shows in the timings of docs/FLASH.md.)"""
    f = FRAMEWORKS[fw]
    L, S = (100, 100) if alignment == "top_left" else (50, 100)  # offset 0 or 50
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, L, 5))
    k = rng.standard_normal((1, S, 5))
    v = rng.standard_normal((1, S, 3))
    v[:, 75:, :] = np.nan
    kw = dict(is_causal=True, causal_alignment=alignment)
    out = f.numpy(f.flash(*map(f.native, (q, k, v)), **kw, block_q=25, block_k=25))
    clean_rows = 75 - (S - L if alignment == "bottom_right" else 0)  # rows i with i + offset < 75
    assert np.isfinite(out[:, :clean_rows]).all()
    assert np.isnan(out[:, clean_rows:]).any(axis=-1).all()  # these rows do see keys >= 75
    assert np.isnan(f.numpy(f.sdpa(*map(f.native, (q, k, v)), **kw))).all()


# ---------------------------------------------------------------------------------------------
# Errors: the plain path's, and a block size < 1

_ERROR_CASES = {
    "heads_not_divisible": (dict(query=(2, 6, 5, 11), key=(2, 4, 7, 11), value=(2, 4, 7, 13)), {}),
    "dtype_mismatch": (dict(key_dtype="float32"), {}),
    "kv_length_mismatch": (dict(value=(2, 2, 8, 13)), {}),
    "rank": (dict(query=(5, 11)), {}),
    "mask_dtype": (dict(mask=((5, 7), "int32")), {}),
    "mask_kv_heads": (dict(mask=((2, 2, 5, 7), "bool")), {}),
    "mask_shape": (dict(mask=((5, 8), "bool")), {}),
    "bias_dtype": (dict(bias=((5, 7), "int32")), {}),
    "bias_shape": (dict(bias=((4, 7), "float64")), {}),
    "unknown_alignment": ({}, dict(is_causal=True, causal_alignment="bottom")),
    "scale_not_finite": ({}, dict(scale=float("inf"))),
    "softcap_not_positive": ({}, dict(softcap=0.0)),
}


def _error_inputs(fw: Framework, spec: dict) -> dict:
    shapes = dict(query=(2, 6, 5, 11), key=(2, 2, 7, 11), value=(2, 2, 7, 13)) | {
        k: v for k, v in spec.items() if k in ("query", "key", "value")
    }
    out = {name: fw.native(np.zeros(shape)) for name, shape in shapes.items()}
    if "key_dtype" in spec:
        out["key"] = fw.native(np.zeros(shapes["key"], spec["key_dtype"]))
    for name in ("mask", "bias"):
        if name in spec:
            shape, dtype = spec[name]
            out[name] = fw.native(np.zeros(shape, dtype))
    return out


def _raised(fn: Callable) -> AttentionError:
    with pytest.raises(AttentionError) as info:
        fn()
    return info.value


@pytest.mark.parametrize("fw", FRAMEWORKS)
@pytest.mark.parametrize("code", _ERROR_CASES)
def test_errors_are_the_plain_paths(fw: str, code: str) -> None:
    f = FRAMEWORKS[fw]
    raw = FLASH[fw].flash_attention
    spec, kwargs = _ERROR_CASES[code]
    inputs = _error_inputs(f, spec)
    want = _raised(lambda: f.sdpa(**inputs, **kwargs))
    got = _raised(lambda: raw(**inputs, **kwargs))
    assert (type(got), got.code, str(got)) == (type(want), want.code, str(want))
    assert got.code == code


@pytest.mark.parametrize("fw", FRAMEWORKS)
@pytest.mark.parametrize(
    ("name", "value"),
    [("block_q", 0), ("block_k", -3), ("block_q", 2.5), ("block_k", True), ("block_q", "64")],
)
def test_block_size_errors(fw: str, name: str, value: object) -> None:
    f = FRAMEWORKS[fw]
    x = f.native(np.zeros((2, 3, 4)))
    raw = FLASH[fw].flash_attention
    err = _raised(lambda: raw(x, x, x, **{name: value}))
    assert type(err).__name__ == "ConfigError" and err.code == "non_positive_size"
    assert f"{name} must be an integer >= 1; got {value!r}" in str(err)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_vjp_checks_block_sizes_before_grad_output(fw: str) -> None:
    """A block size < 1 with a cotangent of the wrong shape: the block size's error, in all
    three (NumPy checks the sizes with the call, torch and JAX before the cotangent)."""
    f = FRAMEWORKS[fw]
    module = FLASH[fw]
    x, wrong = f.native(np.zeros((2, 3, 4))), f.native(np.zeros((2, 3, 5)))
    err = _raised(lambda: module.flash_attention_vjp(x, x, x, wrong, block_k=0))
    assert (type(err).__name__, err.code) == ("ConfigError", "non_positive_size")
    assert "block_k must be an integer >= 1; got 0" in str(err)


# ---------------------------------------------------------------------------------------------
# The default blocks: BLOCK_Q x BLOCK_K, or a narrow window's band (attention_spec.tiled_blocks)


def test_default_blocks_are_a_narrow_bands_rows_and_keys() -> None:
    """A band of ``left + 1 + right`` keys per row spans ``rows + left + right`` keys for a block
    of ``rows`` query rows; NumPy and torch tile such a band in 128-row blocks of that many keys
    while it fits in 512 keys, JAX in 64-row blocks while it fits in 256: the rule is
    attention_spec's, the pair each package's own ``BAND_BLOCKS``."""
    assert (BLOCK_Q, BLOCK_K) == (256, 512)
    N, T, J = (FLASH[fw].BAND_BLOCKS for fw in ("numpy", "torch", "jax"))
    assert (N, T, J) == ((128, 512), (128, 512), (64, 256))
    assert tiled_blocks(T, None, None, False, None) == (256, 512)
    assert tiled_blocks(N, None, None, True, (256, 0)) == (128, 384)
    assert tiled_blocks(T, None, None, True, (256, None)) == (128, 384)  # causal: right 0
    assert tiled_blocks(T, None, None, True, (256, 7)) == (128, 384)
    assert tiled_blocks(N, None, None, False, (100, 20)) == (128, 248)
    assert tiled_blocks(N, None, None, False, (0, 0)) == (128, 128)
    assert tiled_blocks(N, None, None, True, (384, 0)) == (128, 512)  # the widest that fits
    assert tiled_blocks(N, None, None, True, (385, 0)) == (256, 512)
    assert tiled_blocks(T, None, None, False, (256, None)) == (256, 512)  # no right bound
    assert tiled_blocks(N, None, None, True, (None, 0)) == (256, 512)  # no left bound
    assert tiled_blocks(J, None, None, True, (256, 0)) == (256, 512)
    assert tiled_blocks(J, None, None, True, (192, 0)) == (64, 256)  # the widest that fits
    assert tiled_blocks(J, None, None, True, (193, 0)) == (256, 512)
    assert tiled_blocks(J, None, None, False, (0, 0)) == (64, 64)
    assert tiled_blocks(J, None, None, False, (20, None)) == (256, 512)
    # a size given is kept; the other comes from the default pair
    assert tiled_blocks(T, 7, 9, True, (256, 0)) == (7, 9)
    assert tiled_blocks(T, 64, None, True, (256, 0)) == (64, 384)
    assert tiled_blocks(N, None, 100, False, None) == (256, 100)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_flash_without_block_sizes_tiles_in_the_default_blocks(fw: str, monkeypatch) -> None:
    """The call without block sizes asks ``tiled_blocks`` with its package's pair and computes
    bit for bit what the call with that pair given computes; under a narrow window that differs
    from the BLOCK_Q x BLOCK_K tiling in the last bits (the online softmax rescales in another
    order), so the comparison can tell the two tilings apart."""
    f = FRAMEWORKS[fw]
    module = FLASH[fw]
    asked = []
    real = module.tiled_blocks
    monkeypatch.setattr(module, "tiled_blocks", lambda *a: asked.append(a) or real(*a))
    rng = np.random.default_rng(11)
    q, k, v = (f.native(rng.standard_normal((1, 2, 600, 8))) for _ in range(3))
    kw = dict(is_causal=True, window=(40, 0))
    default = f.numpy(module.flash_attention(q, k, v, **kw))
    assert asked == [(module.BAND_BLOCKS, None, None, True, (40, 0))]
    pair = (64, 104) if fw == "jax" else (128, 168)  # 40 keys left of each row's band
    given = f.numpy(module.flash_attention(q, k, v, **kw, block_q=pair[0], block_k=pair[1]))
    np.testing.assert_array_equal(default, given)
    wide = f.numpy(module.flash_attention(q, k, v, **kw, block_q=256, block_k=512))
    assert not np.array_equal(default, wide)
    oracle.assert_within(default, wide, "float64")


# ---------------------------------------------------------------------------------------------
# Gradients: the same as the plain path's, zero (not NaN) in fully masked rows

_GRAD = _c(
    L=37,
    S=53,
    blocks=(16, 24),
    mask="full_with_empty_rows",
    bias="LS",
    kwargs=dict(is_causal=True, causal_alignment="bottom_right", softcap=3.0),
)


def test_torch_autograd_matches_plain() -> None:
    inp = _GRAD.inputs(np.dtype(np.float64))
    names = ("query", "key", "value", "bias")
    cotangent = torch.from_numpy(np.random.default_rng(3).standard_normal((2, 6, 37, 13)))

    def grads(fn, **blocks):
        leaves = {n: torch.from_numpy(inp[n]).requires_grad_() for n in names}
        out = fn(**leaves, mask=torch.from_numpy(inp["mask"]), **dict(_GRAD.kwargs), **blocks)
        return torch.autograd.grad((out * cotangent).sum(), [leaves[n] for n in names])

    plain = grads(impl_torch.functional.scaled_dot_product_attention)
    tiled = grads(impl_torch.flash.flash_attention, block_q=16, block_k=24)
    for name, a, b in zip(names, tiled, plain):
        assert torch.isfinite(a).all(), name
        oracle.assert_within(a, b.numpy(), "float64", what=f"d{name}: ")
    assert not tiled[0][:, :, 3].any()  # query row 3 sees no key: zero gradient


def test_jax_grad_matches_plain() -> None:
    inp = _GRAD.inputs(np.dtype(np.float64))
    cotangent = jnp.asarray(np.random.default_rng(3).standard_normal((2, 6, 37, 13)))
    mask = jnp.asarray(inp["mask"])
    kw = dict(_GRAD.kwargs)

    def loss(fn, q, k, v, bias):
        return jnp.sum(fn(q, k, v, mask=mask, bias=bias, **kw) * cotangent)

    flash = partial(impl_jax.flash.flash_attention, block_q=16, block_k=24)
    args = tuple(jnp.asarray(inp[n]) for n in ("query", "key", "value", "bias"))
    plain = jax.jit(
        jax.grad(
            partial(loss, impl_jax.functional.scaled_dot_product_attention), argnums=(0, 1, 2, 3)
        )
    )(*args)
    tiled = jax.jit(jax.grad(partial(loss, flash), argnums=(0, 1, 2, 3)))(*args)
    for name, a, b in zip(("query", "key", "value", "bias"), tiled, plain):
        assert np.isfinite(a).all(), name
        oracle.assert_within(a, b, "float64", what=f"d{name}: ")
    assert not np.asarray(tiled[0])[:, :, 3].any()  # query row 3 sees no key: zero gradient


# ---------------------------------------------------------------------------------------------
# The checks above catch the classic tiling bugs


def _failures(fw: Framework) -> list[str]:
    failed = []
    for name, case in CASES.items():
        try:
            check_flash(fw, case, "float64")
        except AssertionError:
            failed.append(name)
    return failed


def test_numpy_flash_passes_the_battery_that_catches_broken_ports() -> None:
    assert _failures(FRAMEWORKS["numpy"]) == []


@pytest.mark.parametrize("bug", BROKEN)
def test_checks_catch_broken_port(bug: str) -> None:
    failed = _failures(BROKEN_FRAMEWORKS[bug])
    assert failed, f"no check catches {bug}"
    must_catch = {  # the case that was written to catch it
        "no_rescale": "odd_sizes",
        "early_normalize": "odd_sizes",
        "skip_partial_block": "causal_top_left_L<S",
        "unguarded_max": "causal_bottom_right_L>S",
    }[bug]
    assert must_catch in failed, failed
