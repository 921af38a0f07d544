"""Every input gets a correct answer or the taxonomy's error: one named test per break that
fuzzing 3,800 calls and mutating the code found (issue "Hardening"), in all three frameworks.

The decisions behind them are SEMANTICS.md's "Inputs, scalars and garbage" (docs/SEMANTICS.md
says the same in the project's words).
"""

from __future__ import annotations

import fractions
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import impl_jax
import impl_numpy
import impl_torch
from attention_spec import AttentionError, ConfigError, DTypeError
from conformance.oracle import assert_within, attention, attention_vjp
from tests.frameworks import FRAMEWORKS, NP_DTYPES, assert_agree, same_error

REPO = Path(__file__).resolve().parent.parent
IMPLS = {"numpy": impl_numpy, "torch": impl_torch, "jax": impl_jax}


def _qkv(dtype="float32", q=(1, 2, 3, 4), k=(1, 2, 5, 4), v=None, seed=0):
    rng = np.random.default_rng(seed)
    dt = NP_DTYPES[dtype]
    return (rng.standard_normal(q).astype(dt), rng.standard_normal(k).astype(dt),
            rng.standard_normal(v or k).astype(dt))


def _within_oracle(got, q, k, v=None, *, what: str = "", **kw) -> float:
    """``got`` against the float64 oracle's same call (its output, or its weights when ``v`` is
    None) under the tolerance rule in the query's dtype."""
    dtype = np.asarray(q).dtype.name
    args = [np.asarray(a, np.float64) for a in (q, k, v) if a is not None]
    field = "weights" if v is None else "output"
    golden = getattr(attention(*args, **kw), field)
    plain = None if dtype == "float64" else getattr(attention(*args, **kw, round_to=dtype), field)
    return assert_within(got, golden, dtype, plain, what=what)


def _error(fn) -> AttentionError:
    with pytest.raises(AttentionError) as info:
        fn()
    return info.value


# -- 1. large finite logits: the shift is exact -----------------------------------------------


def test_1_jax_large_logits_are_finite_jitted_and_tiled() -> None:
    """scale=1e10 gives logits around 1e10: XLA recomputes s * scale inside the exp fusion with
    other rounding, so exp(s - rowmax) could be exp(+hundreds) and the row NaN, or exp(-hundreds)
    and the row zeros. The exponent is clamped at 0, and in the plain and the tiled path the
    scale is on the queries: nothing sits between the matmul and the row max for XLA to
    recompute (with it on the scores, the jitted plain path gives zero rows here, and so did the
    tiled one with blocks whose keys need no mask: one block of all 5 keys, blocks of 1)."""
    q, k, v = _qkv()
    want = impl_numpy.scaled_dot_product_attention(q, k, v, scale=1e10)
    sdpa = jax.jit(impl_jax.scaled_dot_product_attention, static_argnames=impl_jax.STATIC_ARGNAMES)
    flash = jax.jit(impl_jax.flash_attention, static_argnames=impl_jax.FLASH_STATIC_ARGNAMES)
    tiled = [
        flash(q, k, v, scale=1e10, block_q=bq, block_k=bk) for bq, bk in ((2, 3), (3, 5), (1, 1))
    ]
    for got in (sdpa(q, k, v, scale=1e10), *tiled):
        got = np.asarray(got)
        assert np.isfinite(got).all()
        # logits of 1e10: a plain float32 call is off by whole units; the packages agree closely
        assert_agree(got, want, "float32")


# -- 2. scalars outside the compute dtype, and a bias that overflows there ---------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    ("keyword", "code"), [("scale", "scale_range"), ("softcap", "softcap_range")]
)
def test_2_scalars_beyond_the_compute_dtype_are_refused(dtype, keyword, code) -> None:
    q, k, v = _qkv(dtype)
    err = same_error(lambda fw: fw.sdpa(q, k, v, **{keyword: 1e39}))
    assert isinstance(err, ConfigError) and err.code == code and "got 1e+39" in str(err)


def test_2_a_float64_scale_beyond_float32_is_fine_in_float64() -> None:
    q, k, v = _qkv("float64")
    outs = [fw.sdpa(q, k, v, scale=1e39) for fw in FRAMEWORKS.values()]
    assert all(np.isfinite(o).all() for o in outs)


def test_2_a_float64_bias_that_overflows_float32_masks() -> None:
    """-1e300 in a float64 bias is -inf once cast to the float32 compute dtype, and masks."""
    q, k, v = _qkv()
    bias = np.zeros((1, 1, 3, 5))
    bias[..., 1] = -1e300
    mask = np.ones((3, 5), bool)
    mask[:, 1] = False
    for fw in FRAMEWORKS.values():
        np.testing.assert_array_equal(fw.sdpa(q, k, v, bias=bias), fw.sdpa(q, k, v, mask=mask))


# -- 3. flush-to-zero: the softcap allowance of each compute dtype ------------------------------


def _spread(dtype: str):
    """Scores exactly ``k_j`` (query rows +1 and -1, D = 1, scale 1): one exact zero and
    magnitudes 1e-9 .. 3, so a flushed ``s / softcap`` (a large cap) or ``g * softcap`` (a small
    one), or a cap read as zero (``0 / 0``), shows; and a small ``grad_output`` (1e-5, float64
    1e-9), so that a flushed gradient term is not below the noise floor."""
    grad_scale = 1e-9 if dtype == "float64" else 1e-5
    rng = np.random.default_rng(3)
    q = np.ones((1, 2, 3, 1))
    q[:, :, 1] = -1.0
    k = np.broadcast_to(np.array([0.0, 1e-9, 1e-6, 1e-3, 0.1, 1.0, 3.0])[:, None], (1, 2, 7, 1))
    v, do = rng.standard_normal((1, 2, 7, 3)), rng.standard_normal((1, 2, 3, 3)) * grad_scale
    return [x.astype(NP_DTYPES[dtype]) for x in (q, k, v, do)]


def _grads(name: str, tiled: bool, q, k, v, do, **kw) -> tuple[np.ndarray, np.ndarray]:
    fw = FRAMEWORKS[name]
    vjp = fw.module.flash_attention_vjp if tiled else fw.module.scaled_dot_product_attention_vjp
    blocks = dict(block_q=2, block_k=3) if tiled else {}
    grads = vjp(*map(fw.asarray, (q, k, v, do)), **kw, **blocks)
    return fw.to_numpy(grads.query), fw.to_numpy(grads.key)


@pytest.mark.parametrize(
    ("dtype", "softcap"),
    [
        ("float32", 2.0**-102), ("float32", 2.0**102), ("float32", 1e30), ("float32", 2**70),
        ("float16", 2.0**102), ("float64", 2.0**-969), ("float64", 2.0**969),
    ],
)
def test_3_a_softcap_in_the_allowance_agrees_everywhere(dtype, softcap) -> None:
    """Inside ``[tiny / u, u / tiny]`` of the compute dtype (float32 ``[2**-102, 2**102]``,
    float64 ``[2**-969, 2**969]``) whatever a flush to zero removes is below the unit roundoff:
    outputs and gradients of the three, plain and tiled, are within the fixture rule's bound of
    the float64 oracle (which rounds nothing to zero)."""
    q, k, v, do = _spread(dtype)
    as64 = [x.astype(np.float64) for x in (q, k, v, do)]
    kw = dict(scale=1.0, softcap=softcap)
    golden = attention(*as64[:3], **kw).output
    plain = None if dtype == "float64" else attention(*as64[:3], **kw, round_to=dtype).output
    grads = attention_vjp(*as64, **kw)
    plain_grads = grads if dtype == "float64" else attention_vjp(*as64, **kw, round_to=dtype)
    for name, fw in FRAMEWORKS.items():
        outs = {"plain": fw.sdpa(q, k, v, **kw), "tiled": fw.flash(q, k, v, **kw, block_q=2,
                                                                    block_k=3)}
        for path, out in outs.items():
            assert_within(out, golden, dtype, plain, what=f"{name} {path} output: ")
        if dtype == "float16":
            continue  # the gradients' bounds are float32's: the float32 cases cover them
        for tiled in (False, True):
            for got, field in zip(_grads(name, tiled, q, k, v, do, **kw), ("query", "key")):
                assert_within(got, getattr(grads, field), dtype, getattr(plain_grads, field),
                              what=f"{name} tiled={tiled} d{field}: ")


@pytest.mark.parametrize(
    ("dtype", "softcap", "shown"),
    [
        ("float32", 2.0**-103, "9.860761315262648e-32"), ("float32", 1e-45, "1e-45"),
        ("float32", 2.0**103, "1.0141204801825835e+31"), ("float32", 1e38, "1e+38"),
        ("bfloat16", 1e35, "1e+35"), ("float64", 1e-300, "1e-300"), ("float64", 1e300, "1e+300"),
    ],
)
def test_3_b_a_softcap_outside_the_allowance_is_refused_everywhere(dtype, softcap, shown) -> None:
    """Just outside, and where the frameworks were measured to differ (docs/SEMANTICS.md,
    "softcap"): JAX gave uniform weights for 1e38 and 1e35 (float32) and 1e300 (float64), NaN
    for 1e-45 (a subnormal cap read as 0, 0 / 0), and gradients 117 times their bound for
    1e-300 (float64): refused alike by the three, the allowance in the message."""
    q, k, v = _qkv(dtype)
    err = same_error(lambda fw: fw.sdpa(q, k, v, softcap=softcap))
    text = "[2**-969, 2**969]" if dtype == "float64" else "[2**-102, 2**102]"
    assert err.code == "softcap_range" and f"got {shown}" in str(err) and text in str(err)


@pytest.mark.parametrize(("keyword", "value"), [("softcap", 1e38), ("scale", 1e39)])
def test_3_c_a_range_never_hides_a_shape_mistake(keyword, value) -> None:
    """The fuzzer's call: batches that do not broadcast and a cap out of range raised
    ``softcap_range``; the ranges are checked after every shape rule, so the shape mistake is
    reported, and with the shapes right the range is."""
    q, k, v = _qkv(q=(2, 2, 3, 4), k=(3, 2, 5, 4))
    err = same_error(lambda fw: fw.sdpa(q, k, v, **{keyword: value}))
    assert err.code == "batch_not_broadcastable"
    mask = np.ones((2, 3, 5), np.float32)  # a float mask: mask_dtype, before the range
    q, k, v = _qkv()
    assert same_error(lambda fw: fw.sdpa(q, k, v, mask=mask, **{keyword: value})
                                    ).code == "mask_dtype"
    assert same_error(lambda fw: fw.sdpa(q, k, v, **{keyword: value})).code == (f"{keyword}_range")


# -- 4. sizes are validated without work proportional to them ---------------------------------

HUGE = """
import numpy as np
import impl_numpy, impl_torch, impl_jax
from attention_spec import AttentionError
calls = [
    lambda m: m.MultiHeadAttention(10**12, 7),
    lambda m: m.GroupedQueryAttention(8, 10**12, 7, head_dim=2),
    lambda m: m.scaled_dot_product_attention(
        np.empty((10**12, 0, 4), np.float32), np.empty((7, 5, 4), np.float32),
        np.empty((7, 5, 4), np.float32)),
]
for m in (impl_numpy, impl_torch, impl_jax):
    for call in calls:
        try:
            call(m)
        except AttentionError as e:
            print(type(e).__name__, e.code, len(str(e)))
"""


def test_4_huge_sizes_get_their_error_at_once() -> None:
    """The messages used to list divisors with range(1, n + 1): a size of 10**12 never came
    back. A child process with a generous timeout (a watchdog against a hang, not a timing)."""
    done = subprocess.run([sys.executable, "-c", HUGE], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 9 and len(set(lines[:3])) == 3 and lines[:3] == lines[3:6] == lines[6:]
    assert [line.split()[1] for line in lines[:3]] == [
        "d_model_not_divisible", "heads_not_divisible", "heads_not_divisible",
    ]


# -- 5. modules too large to allocate ----------------------------------------------------------


@pytest.mark.parametrize("name", list(IMPLS))
@pytest.mark.parametrize("head_dim", [10**12, 2**62])
def test_5_a_module_that_cannot_be_allocated_is_a_memory_error(name, head_dim) -> None:
    """JAX used to return a module whose first call aborted the process (an XLA CHECK); NumPy
    raised MemoryError, torch RuntimeError, and 2**62 three other errors. Now: MemoryError, at
    construction, in all three."""
    with pytest.raises(MemoryError, match="GiB"):
        IMPLS[name].GroupedQueryAttention(4, 1, 1, head_dim=head_dim)


# -- 6. decode validates the cache it is given; on error the cache is unchanged ---------------


def _cache_buffers(name: str, cache) -> list[np.ndarray]:
    return [FRAMEWORKS[name].to_numpy(b).copy() for b in (cache.key, cache.value)]


@pytest.mark.parametrize("name", list(IMPLS))
@pytest.mark.parametrize(
    ("other", "code"),
    [
        (dict(d_model=16, n_heads=4, n_kv_heads=4), "cache_mismatch"),  # K = 4, not 2
        (dict(d_model=16, n_heads=4, n_kv_heads=2, head_dim=8), "cache_mismatch"),  # D = 8
        (dict(d_model=16, n_heads=4, n_kv_heads=2, value_head_dim=3), "cache_mismatch"),  # E
        (dict(d_model=16, n_heads=4, n_kv_heads=2, dtype="float16"), "dtype_mismatch"),
    ],
)
def test_6_a_cache_of_another_module_is_refused_and_left_unchanged(name, other, code) -> None:
    m = IMPLS[name]
    module = m.GroupedQueryAttention(16, 4, 2)
    foreign = m.GroupedQueryAttention(**other)
    cache = foreign.init_cache(2, 6)
    x0 = FRAMEWORKS[name].asarray(np.ones((2, 1, 16), NP_DTYPES[other.get("dtype", "float32")]))
    _, cache = foreign.decode(x0, cache)  # one token written: the buffers hold something
    before = _cache_buffers(name, cache)
    x = FRAMEWORKS[name].asarray(np.ones((2, 2, 16), np.float32))
    err = _error(lambda: module.decode(x, cache))
    assert err.code == code
    for a, b in zip(before, _cache_buffers(name, cache)):
        np.testing.assert_array_equal(a, b)  # bitwise: nothing written
    assert cache.position == 1


@pytest.mark.parametrize("name", list(IMPLS))
def test_6_a_cache_filled_to_exactly_max_len_is_fine_one_more_overflows(name) -> None:
    m = IMPLS[name]
    module = m.GroupedQueryAttention(16, 4, 2)
    cache = module.init_cache(2, 3)
    x = FRAMEWORKS[name].asarray(np.ones((2, 3, 16), np.float32))
    _, cache = module.decode(x, cache)  # 3 of 3: exactly full, no error
    assert cache.position == 3
    before = _cache_buffers(name, cache)
    err = _error(lambda: module.decode(x[:, :1], cache))
    assert err.code == "cache_overflow"
    for a, b in zip(before, _cache_buffers(name, cache)):
        np.testing.assert_array_equal(a, b)


# -- 7. keyword scalars are converted once -----------------------------------------------------


def test_7_keyword_scalars_of_every_kind() -> None:
    q, k, v = _qkv()
    err = same_error(lambda fw: fw.sdpa(q, k, v, scale=10**400))
    assert err.code == "scale_range" and "got 1.000e+400" in str(err)
    err = same_error(lambda fw: fw.sdpa(q, k, v, softcap=2**103))
    assert err.code == "softcap_range" and "got 1.014e+31" in str(err)
    for fw in FRAMEWORKS.values():
        for softcap in (fractions.Fraction(5), np.float64(5.0)):
            got = fw.sdpa(q, k, v, softcap=softcap)
            _within_oracle(got, q, k, v, softcap=5.0, what=f"{fw.name} {softcap!r}: ")


def test_7_a_numpy_float64_softcap_in_jax_flash_with_float32_inputs() -> None:
    """The scan carry was float64 (x64 on) beside float32 blocks: a JAX TypeError."""
    q, k, v = _qkv()
    got = impl_jax.flash_attention(q, k, v, softcap=np.float64(5.0), block_q=2, block_k=2)
    assert got.dtype == jnp.float32
    _within_oracle(np.asarray(got), q, k, v, softcap=5.0)


# -- 8. array-likes are converted by each framework; None is not_an_array ---------------------


@pytest.mark.parametrize("name", list(IMPLS))
def test_8_array_likes_work_in_all_three(name) -> None:
    """Nested lists, NumPy arrays, Python scalars and NumPy bools, given straight to the
    functions (no adapter): torch converts them with torch.as_tensor."""
    m = IMPLS[name]
    q = [[[0.0, 1.0], [1.0, 0.0]]]  # (H=1, L=2, D=2)
    k = np.array([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]], np.float32)  # (K=1, S=3, D=2)
    v = np.eye(3, dtype=np.float32)[None]  # (K=1, S=3, E=3)
    out = m.scaled_dot_product_attention(np.asarray(q, np.float32), k, v, mask=True, bias=0.5,
                                         is_causal=np.bool_(False))
    _within_oracle(np.asarray(out.tolist(), np.float32), np.asarray(q, np.float32), k, v,
                   bias=np.float32(0.5))  # v = I: the output is the weights
    out = m.scaled_dot_product_attention(q, k.tolist(), v.tolist())
    assert np.asarray(out.tolist()).shape == (1, 2, 3)


@pytest.mark.parametrize("which", ["query", "key", "value"])
def test_8_none_for_an_array_is_not_an_array(which) -> None:
    q, k, v = _qkv()
    args = {"query": q, "key": k, "value": v} | {which: None}

    def call(fw):
        return fw.module.scaled_dot_product_attention(
            *(None if a is None else fw.asarray(a) for a in args.values())
        )

    err = same_error(call)
    assert isinstance(err, DTypeError) and err.code == "not_an_array" and which in str(err)


# -- 9. messages show Python numbers -----------------------------------------------------------


def test_9_messages_show_python_numbers_not_the_callers_repr() -> None:
    q, k, v = _qkv()
    for scale, shown in ((np.array(np.inf), "got inf"), (np.float64(np.nan), "got nan")):
        err = same_error(lambda fw, s=scale: fw.sdpa(q, k, v, scale=s))
        assert err.code == "scale_not_finite" and shown in str(err), str(err)
        assert "array" not in str(err) and "tensor" not in str(err)
    err = same_error(lambda fw: fw.sdpa(q, k, v, softcap=torch.tensor(-1.0)))
    assert "got -1.0" in str(err)


# -- 10. the module dtype -----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(IMPLS))
@pytest.mark.parametrize("dtype", ["f4", "float128", "bogus", "int32"])
def test_10_a_module_dtype_outside_the_four_is_unsupported(name, dtype) -> None:
    err = _error(lambda: IMPLS[name].GroupedQueryAttention(16, 4, 2, dtype=dtype))
    assert isinstance(err, DTypeError) and err.code == "unsupported_dtype"


@pytest.mark.parametrize("name", list(IMPLS))
def test_10_none_is_float32_and_framework_dtypes_are_accepted(name) -> None:
    m = IMPLS[name]
    weights = m.GroupedQueryAttention(16, 4, 2, dtype=None).to_canonical()
    assert {np.asarray(w).dtype for w in weights.values()} == {np.dtype(np.float32)}
    own = {"numpy": (np.float16, np.dtype("bfloat16"), ml_dtypes.bfloat16),
           "torch": (torch.float16, torch.bfloat16, np.float16),
           "jax": (jnp.float16, jnp.bfloat16, np.dtype("float16"))}[name]
    for dtype in own:
        weights = m.GroupedQueryAttention(16, 4, 2, dtype=dtype).to_canonical()
        assert np.asarray(weights["q_proj.kernel"]).dtype.name in ("float16", "bfloat16")


# -- 11. flags are bools --------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["False", "no", 0, 1, None])
def test_11_is_causal_must_be_a_bool(flag) -> None:
    q, k, v = _qkv()
    err = same_error(lambda fw: fw.sdpa(q, k, v, is_causal=flag))
    assert isinstance(err, ConfigError) and err.code == "not_a_bool"


@pytest.mark.parametrize("name", list(IMPLS))
def test_11_module_flags_must_be_bools(name) -> None:
    m = IMPLS[name]
    assert _error(lambda: m.GroupedQueryAttention(16, 4, 2, bias="no")).code == "not_a_bool"
    module = m.GroupedQueryAttention(16, 4, 2)
    x = FRAMEWORKS[name].asarray(np.ones((1, 3, 16), np.float32))
    assert _error(lambda: module(x, return_weights="yes")).code == "not_a_bool"
    assert _error(lambda: module(x, is_causal="False")).code == "not_a_bool"


# -- 12. a mask or bias of higher rank than the scores ----------------------------------------


@pytest.mark.parametrize("kind", ["mask", "bias"])
def test_12_rank_above_the_scores_is_refused(kind) -> None:
    """An unbatched query (H, L, D) with a (3, H, L, S) mask: NumPy raised a raw ValueError,
    torch a RuntimeError, and JAX's attention_weights returned a (3, H, L, S) array."""
    q, k, _ = _qkv(q=(2, 3, 4), k=(2, 5, 4))
    extra = np.ones((3, 2, 3, 5), bool if kind == "mask" else np.float32)
    err = same_error(lambda fw: fw.weights(q, k, **{kind: extra}))
    assert err.code == f"{kind}_shape" and "got (3, 2, 3, 5)" in str(err)


# -- 13. garbage at keys no query attends, in every path ---------------------------------------


def _poisoned():
    q, k, v = _qkv(q=(2, 6, 5, 4), k=(2, 2, 7, 4), v=(2, 2, 7, 3))
    mask = np.ones((2, 1, 1, 7), bool)
    mask[1, ..., 4:] = False  # example 1 has 4 real keys
    k_bad, v_bad = k.copy(), v.copy()
    k_bad[1, :, 4:] = np.nan
    v_bad[1, :, 4:] = np.inf
    return q, (k, v), (k_bad, v_bad), mask


@pytest.mark.parametrize("name", list(IMPLS))
def test_13_garbage_in_padding_never_reaches_output_or_gradient(name) -> None:
    q, clean, bad, mask = _poisoned()
    fw = FRAMEWORKS[name]
    for path in ("scaled_dot_product_attention", "flash_attention"):
        extra = {"block_q": 2, "block_k": 3} if path == "flash_attention" else {}
        fn = getattr(fw.module, path)
        got = fw.to_numpy(fn(*(fw.asarray(a) for a in (q, *bad)), mask=fw.asarray(mask), **extra))
        _within_oracle(got, q, *clean, mask=mask, what=f"{path}: ")


def test_13_garbage_gets_zero_gradient_in_torch_and_jax() -> None:
    q, _, (k, v), mask = _poisoned()
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out = impl_torch.scaled_dot_product_attention(tq, tk, tv, mask=torch.tensor(mask))
    grads = torch.autograd.grad(out.sum(), (tq, tk, tv))
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[1][1, :, 4:] == 0).all() and (grads[2][1, :, 4:] == 0).all()

    def loss(q_, k_, v_):
        return impl_jax.scaled_dot_product_attention(q_, k_, v_, mask=mask).sum()

    jgrads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    assert all(np.isfinite(np.asarray(g)).all() for g in jgrads)
    assert (np.asarray(jgrads[2])[1, :, 4:] == 0).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's inf * 0 in query 1's row
@pytest.mark.parametrize("name", list(IMPLS))
def test_13_inf_and_nan_at_a_position_only_some_rows_mask(name) -> None:
    """Key 4 holds inf (its scores are +/-inf or NaN) and bias (0, 3) is +inf; query 0 masks
    both, query 1 attends both. Query 0's row is the clean answer in both paths (torch's CPU
    masking adds -inf, which turns +inf into NaN, and must then mask as written); query 1's
    row is not finite."""
    q, k, v = _qkv("float64", q=(1, 2, 4, 3), k=(1, 2, 5, 3))
    mask = np.ones((4, 5), bool)
    mask[0, 3:] = False
    bias = np.zeros((4, 5))
    k_bad, bias_bad = k.copy(), bias.copy()
    k_bad[..., 4, :] = np.inf
    bias_bad[0, 3] = bias_bad[1, 3] = np.inf
    fw = FRAMEWORKS[name]
    want = fw.sdpa(q, k, v, mask=mask, bias=bias)
    for path in ("scaled_dot_product_attention", "flash_attention"):
        extra = {"block_q": 2, "block_k": 3} if path == "flash_attention" else {}
        fn = getattr(fw.module, path)
        args = (fw.asarray(a) for a in (q, k_bad, v))
        got = fw.to_numpy(fn(*args, mask=fw.asarray(mask), bias=fw.asarray(bias_bad), **extra))
        assert_within(got[..., 0, :], want[..., 0, :], "float64", what=f"{path}: ")
        assert not np.isfinite(got[..., 1, :]).all(), path


@pytest.mark.parametrize("name", list(IMPLS))
def test_13_unused_cache_slots_holding_nan_are_never_read(name) -> None:
    """Decode reads the cache's first ``position`` slots only: NaN in the others is garbage."""
    m, fw = IMPLS[name], FRAMEWORKS[name]
    module = m.GroupedQueryAttention(16, 4, 2)
    x = fw.asarray(np.random.default_rng(1).standard_normal((2, 3, 16)).astype(np.float32))
    clean, _ = module.decode(x, module.init_cache(2, 8))
    cache = module.init_cache(2, 8)
    poisoned = type(cache)(*(b * np.nan if name != "torch" else b.fill_(float("nan"))
                             for b in (cache.key, cache.value)), cache.position)
    got, _ = module.decode(x, poisoned)
    np.testing.assert_array_equal(fw.to_numpy(got), fw.to_numpy(clean))


# -- 14. JAX without x64 ---------------------------------------------------------------------------

NO_X64 = """
import numpy as np
import impl_jax
from attention_spec import AttentionError
q = np.zeros((2, 3, 4), np.float32)
for kw in ({"mask": np.ones((3, 5), np.int64)}, {}):
    try:
        impl_jax.scaled_dot_product_attention(
            q if kw else q.astype(np.float64), np.zeros((2, 5, 4), q.dtype if kw else np.float64),
            np.zeros((2, 5, 4), q.dtype if kw else np.float64), **kw)
    except AttentionError as e:
        print(e.code, e)
"""


def test_14_jax_without_x64_names_the_dtype_the_user_passed() -> None:
    """An int64 mask is reported as int64 (JAX would have made it int32 first), and float64
    inputs ask for the 64-bit mode instead of silently computing in float32."""
    done = subprocess.run([sys.executable, "-c", NO_X64], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    mask_line, x64_line = done.stdout.splitlines()
    assert mask_line.startswith("mask_dtype") and "got int64" in mask_line
    assert x64_line.startswith("unsupported_dtype") and "jax_enable_x64" in x64_line


NO_X64_MODULES = """
import numpy as np
import impl_jax, impl_numpy
from attention_spec import AttentionError
weights = impl_numpy.GroupedQueryAttention(8, 2, 1, dtype="float64").to_canonical()
x = np.zeros((1, 3, 8))
calls = {
    "sdpa": lambda: impl_jax.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None]),
    "GroupedQueryAttention": lambda: impl_jax.GroupedQueryAttention(8, 2, 1, dtype="float64"),
    "MultiHeadAttention": lambda: impl_jax.MultiHeadAttention(8, 2, dtype=np.float64),
    "from_canonical": lambda: impl_jax.GroupedQueryAttention.from_canonical(
        weights, n_heads=2, n_kv_heads=1),
}
for name, call in calls.items():
    try:
        got = call()
        print(name, "built", getattr(got, "dtype", None))
    except AttentionError as e:
        print(name, type(e).__name__, e.code, e)
m = impl_jax.GroupedQueryAttention.from_canonical(weights, n_heads=2, n_kv_heads=1,
                                                  dtype="float32")
print("float32", m(x.astype(np.float32)).dtype)
"""


def test_14_jax_modules_without_x64_refuse_float64_as_the_functions_do() -> None:
    """Without x64 a float64 module was built in float32 (nnx.Linear's params, silently), while
    the functional API refused float64: now every one raises the functional API's error."""
    args = [sys.executable, "-c", NO_X64_MODULES]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    *refused, float32 = done.stdout.splitlines()
    errors = dict(line.split(" ", 1) for line in refused)
    assert set(errors) == {"sdpa", "GroupedQueryAttention", "MultiHeadAttention", "from_canonical"}
    sdpa = errors["sdpa"]
    assert sdpa.startswith("DTypeError unsupported_dtype") and "jax_enable_x64" in sdpa
    assert set(errors.values()) == {sdpa}, errors  # the same class, code and message
    assert float32 == "float32 float32"  # a float32 module from float64 weights is fine


# -- 15. what the gradient fuzzer found (tests/test_fuzz.py) -------------------------------------


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
@pytest.mark.parametrize("tiled", [False, True])
def test_15_sinks_gradient_without_query_rows_is_zero(name, tiled) -> None:
    """L = 0 with sinks: dsinks is zeros of (H,). NumPy's plain and tiled backward and torch's
    tiled one summed the rows with ``reshape(-1, H, L)``, which an empty array cannot take (a
    raw ValueError / RuntimeError)."""
    fw = FRAMEWORKS[name]
    q, k, v = _qkv("float64", q=(1, 2, 0, 3), k=(1, 2, 4, 3))
    do = np.zeros((1, 2, 0, 3))
    module = fw.module
    vjp = module.flash_attention_vjp if tiled else module.scaled_dot_product_attention_vjp
    blocks = {"block_q": 2, "block_k": 3} if tiled else {}
    sinks = np.array([0.3, -1.0])
    grads = vjp(*(fw.asarray(x) for x in (q, k, v, do)), sinks=fw.asarray(sinks), **blocks)
    assert fw.to_numpy(grads.sinks).tolist() == [0.0, 0.0]
    assert fw.to_numpy(grads.query).shape == (1, 2, 0, 3)


def test_15_a_scalar_array_stays_a_scalar_on_its_way_to_torch() -> None:
    """``impl_torch.modules.tensor_from_numpy`` (and the tests' own adapter) used
    ``np.ascontiguousarray``, which returns at least 1-d: a 0-d bias became ``(1,)`` and its
    gradient came back ``(1,)`` instead of the bias's shape ``()``."""
    from impl_torch.modules import tensor_from_numpy

    assert tensor_from_numpy(np.array(0.5)).shape == ()
    assert tensor_from_numpy(np.ones((2, 3))[:, ::2]).shape == (2, 2)  # a strided view copies
    q, k, v = _qkv("float64", q=(1, 2, 3), k=(1, 4, 3))
    grads = impl_torch.scaled_dot_product_attention_vjp(
        *(tensor_from_numpy(x) for x in (q, k, v, np.ones((1, 2, 3)))),
        bias=tensor_from_numpy(np.array(0.25)),
    )
    assert grads.bias.shape == ()


# -- the tests the mutation run asked for ---------------------------------------------------------


@pytest.mark.parametrize("name", list(IMPLS))
@pytest.mark.parametrize(("block_q", "block_k"), [(17, 9), (2, 3), (4, 1)])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_causal_key_blocks_starting_at_the_last_rows_diagonal(name, block_q, block_k, alignment):
    """L = 34, S = 37: with these blocks some key block starts exactly at a query block's last
    row's diagonal (j0 == i1 - 1 + offset): it must be visited, not skipped."""
    q, k, v = _qkv(q=(1, 2, 34, 4), k=(1, 2, 37, 4), seed=3)
    fw = FRAMEWORKS[name]
    kw = {"is_causal": True, "causal_alignment": alignment}
    args = [fw.asarray(a) for a in (q, k, v)]
    got = fw.to_numpy(fw.module.flash_attention(*args, block_q=block_q, block_k=block_k, **kw))
    _within_oracle(got, q, k, v, **kw)


def test_gqa_maps_distinct_keys_per_head_contiguously() -> None:
    """Each key/value head has keys of its own (not only values): query head h must score
    against kv head h // G; a tiled mapping h % K scores against the wrong keys."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((6, 4, 3)).astype(np.float32)  # H = 6
    k = (rng.standard_normal((3, 5, 3)) * np.array([1, 4, 9])[:, None, None]).astype(np.float32)
    w_contig = np.stack([impl_numpy.attention_weights(q[h : h + 1], k[h // 2 : h // 2 + 1])[0]
                         for h in range(6)])
    w_tiled = np.stack([impl_numpy.attention_weights(q[h : h + 1], k[h % 3 : h % 3 + 1])[0]
                        for h in range(6)])
    assert not np.allclose(w_contig, w_tiled)  # the oracle's mapping is w_contig's
    for fw in FRAMEWORKS.values():
        _within_oracle(fw.weights(q, k), q, k, what=f"{fw.name}: ")


def test_softcap_comes_before_the_bias() -> None:
    """With a bias present, cap(s) + bias differs from cap(s + bias): the order is pinned."""
    q, k, _ = _qkv(seed=5)
    bias = np.full((3, 5), 3.0, np.float32)  # the same for every key: softmax ignores it...
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    want = attention(q64, k64, bias=bias.astype(np.float64), scale=4.0, softcap=2.0).weights
    # the wrong order, written out: the oracle has only the right one
    s = np.einsum("bhld,bhsd->bhls", q64, k64) * 4.0
    biased_then_capped = 2.0 * np.tanh((s + 3.0) / 2.0)
    wrong = np.exp(biased_then_capped - biased_then_capped.max(-1, keepdims=True))
    wrong /= wrong.sum(-1, keepdims=True)
    assert np.abs(want - wrong).max() > 1e-2  # ... unless it goes inside the cap
    for fw in FRAMEWORKS.values():
        got = fw.weights(q, k, bias=bias, scale=4.0, softcap=2.0)
        _within_oracle(got, q, k, bias=bias, scale=4.0, softcap=2.0, what=f"{fw.name}: ")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_results_are_a_float32_computation_rounded(dtype) -> None:
    """The tolerance rule is relative to a plain same-dtype computation, so a port computing
    the softmax in float16 passes every fixture; this pins what SEMANTICS.md asks instead: the
    float32 computation of the same inputs, rounded once to the dtype (within one ulp)."""
    q, k, v = _qkv(dtype, q=(2, 4, 9, 8), k=(2, 2, 11, 8), seed=9)
    f32 = impl_numpy.scaled_dot_product_attention(*(a.astype(np.float32) for a in (q, k, v)),
                                                  is_causal=True)
    rounded = f32.astype(NP_DTYPES[dtype])
    ulp = np.abs(np.spacing(rounded.astype(np.float32)) if dtype == "float16"
                 else rounded.astype(np.float32) * 2.0**-7)
    for fw in FRAMEWORKS.values():
        got = fw.sdpa(q, k, v, is_causal=True)
        assert got.dtype == NP_DTYPES[dtype]
        err = np.abs(got.astype(np.float32) - rounded.astype(np.float32))
        assert (err <= ulp + 1e-30).all(), (fw.name, float(err.max()))
