"""A fuzzer that stays in CI: generated calls, valid and invalid, through the three frameworks.

Every call must end in one of two ways: the same ``AttentionError`` (class, code and message)
in NumPy, PyTorch and JAX, or a finite result in all three that agrees with the float64 oracle
within the fixture rule's bound. Anything else (a raw framework error, a NaN, a silent wrong
answer, frameworks that disagree) fails, with the call printed by hypothesis.

The second fuzzer puts contract v2's keywords (window, segment ids, sinks, ALiBi slopes), valid
or broken, on top of such a call, and runs it through the plain path or the tiled path with
random block sizes (which may be broken too) or the default ones.

The third takes the same calls backward: ``scaled_dot_product_attention_vjp`` or
``flash_attention_vjp`` with a random cotangent, whose gradients (query, key, value, bias,
sinks) must be the same error in the three or finite and within the bound of the oracle's own
backward (``oracle.attention_vjp``, derived by hand).

Seeded and bounded: ``FUZZ_EXAMPLES`` calls (default 300) and ``FUZZ_V2_EXAMPLES`` (default
150, forward and backward each) in ``make test``; set the variables higher for a longer hunt
(``FUZZ_EXAMPLES=5000 FUZZ_V2_EXAMPLES=3000 pytest tests/test_fuzz.py``).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import impl_numpy
from attention_spec import AttentionError, check_window
from conformance.oracle import assert_within, attention, attention_vjp, rounded, tolerance_bound
from tests.frameworks import FRAMEWORKS, NP_DTYPES

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))
EXTRA_EXAMPLES = int(os.environ.get("FUZZ_V2_EXAMPLES", "150"))


def _seeded(examples: int):
    """Hypothesis settings of every fuzzer here: ``examples`` calls, the same ones every run."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


FLOATS = ("float64", "float32", "float16", "bfloat16")


@st.composite
def calls(draw) -> dict:
    """One call of scaled_dot_product_attention: arrays as NumPy, keywords as given."""
    valid = draw(st.booleans())  # half the calls aim to be valid, half may break any rule
    H = draw(st.integers(1, 6))
    K = draw(st.sampled_from([k for k in range(1, H + 1) if H % k == 0]))
    if not valid and draw(st.booleans()):
        K = draw(st.integers(0, 7))
    L, S = draw(st.integers(0, 5)), draw(st.integers(0, 6))
    D, E = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    if not valid and draw(st.integers(0, 9)) == 0:
        D = 0
    batch = tuple(draw(st.lists(st.integers(1, 2), max_size=2)))
    kv_batch = batch if valid or draw(st.booleans()) else (*batch[:-1], 3) if batch else (3,)
    dtype = draw(st.sampled_from(FLOATS))
    dtypes = [dtype] * 3
    if not valid and draw(st.integers(0, 5)) == 0:
        dtypes[draw(st.integers(0, 2))] = draw(st.sampled_from([*FLOATS, "int32"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    shapes = [(*batch, H, L, D), (*kv_batch, K, S, D), (*kv_batch, K, S, E)]
    if not valid and draw(st.integers(0, 7)) == 0:
        shapes[2] = (*kv_batch, K, S + 1, E)  # key and value lengths differ
    q, k, v = (
        (rng.standard_normal(shape) * 2).astype(NP_DTYPES.get(dt, dt))
        for shape, dt in zip(shapes, dtypes)
    )
    kw: dict = {}
    scores = (*batch, H, L, S)
    if draw(st.booleans()):  # a mask of some broadcastable shape, or a broken one
        shape = tuple(n if draw(st.booleans()) else 1 for n in scores)[draw(st.integers(0, 4)) :]
        kw["mask"] = rng.random(shape) < 0.7
        if not valid and draw(st.integers(0, 4)) == 0:
            kw["mask"] = kw["mask"].astype(draw(st.sampled_from(["int32", "float32"])))
        if not valid and draw(st.integers(0, 4)) == 0:
            kw["mask"] = np.ones((3, *scores), bool)  # rank above the scores
    if draw(st.booleans()):
        shape = tuple(n if draw(st.booleans()) else 1 for n in scores)[draw(st.integers(0, 4)) :]
        bias = rng.standard_normal(shape)
        bias[rng.random(shape) < 0.2] = -np.inf
        kw["bias"] = bias.astype(draw(st.sampled_from(FLOATS)))
        if not valid and draw(st.integers(0, 4)) == 0:
            kw["bias"] = np.zeros(shape, draw(st.sampled_from(["int32", "bool"])))
    if draw(st.booleans()):
        kw["is_causal"] = True if valid else draw(st.sampled_from([True, False, "False", 1]))
        kw["causal_alignment"] = draw(
            st.sampled_from(["top_left", "bottom_right"] + ([] if valid else ["bottom-right"]))
        )
    if draw(st.booleans()):
        good = [0.0, -0.7, 0.3, 2.0, 1e-3, np.float32(0.5), np.array(0.25)]
        bad = [math.inf, math.nan, 1e39, "1", np.array([1.0, 2.0]), 10**400]
        kw["scale"] = draw(st.sampled_from(good + ([] if valid else bad)))
    if draw(st.booleans()):
        # the allowance's edges in float32 (float64's is wider), and caps outside both
        good = [1.0, 5.0, 30.0, 2.0**60, 2.0**-102, 2.0**102, 1e30, 2**70]
        bad = [0.0, -1.0, 1e38, math.inf, "5", 2.0**103, 1e-45, 1e300, 1e-300]
        kw["softcap"] = draw(st.sampled_from(good + ([] if valid else bad)))
    return {"query": q, "key": k, "value": v, **kw}


def _outcome(fw, call: dict, blocks: dict | None = None):
    args = [call[n] for n in ("query", "key", "value")]
    kw = {n: x for n, x in call.items() if n not in ("query", "key", "value")}
    try:
        return fw.sdpa(*args, **kw) if blocks is None else fw.flash(*args, **kw, **blocks)
    except AttentionError as err:
        return err


def _same_error(outcomes: dict) -> bool:
    """True when the three raised the same AttentionError (class, code, message); fails when
    only some raised or they raised differently; False when none raised."""
    errors = {n: o for n, o in outcomes.items() if isinstance(o, AttentionError)}
    if not errors:
        return False
    assert len(errors) == 3, f"only {sorted(errors)} raised: {errors}"
    seen = {(type(e).__name__, e.code, str(e)) for e in errors.values()}
    assert len(seen) == 1, f"the three raised differently: {seen}"
    return True


def _oracle_inputs(call: dict) -> tuple[dict, dict]:
    """The oracle's float64 arrays and semantic keywords for a call that validated: bias,
    sinks and slopes cast to the compute dtype first, as the contract says."""
    dtype = call["query"].dtype.name
    semantic = {n: call[n] for n in ("is_causal", "causal_alignment") if n in call}
    for name in ("scale", "softcap"):
        if name in call:
            semantic[name] = float(np.asarray(call[name]))
    if "window" in call:
        semantic["window"] = check_window(call["window"])
    as64 = {n: call[n].astype(np.float64) for n in ("query", "key", "value", "grad_output")
            if n in call}
    for name in ("mask", "q_segment_ids", "kv_segment_ids"):
        if name in call:
            as64[name] = call[name]
    for name in ("bias", "sinks", "alibi_slopes"):
        if name in call:
            ct = np.float64 if dtype == "float64" else np.float32
            with np.errstate(over="ignore"):
                as64[name] = call[name].astype(ct).astype(np.float64)
    return as64, semantic


def _check(call: dict, blocks: dict | None = None) -> None:
    """The same AttentionError from the three, or three finite answers within the fixture
    rule's bound of the float64 oracle."""
    outcomes = {name: _outcome(fw, call, blocks) for name, fw in FRAMEWORKS.items()}
    if _same_error(outcomes):
        return
    q = call["query"]
    dtype = q.dtype.name
    as64, semantic = _oracle_inputs(call)
    golden = attention(**as64, **semantic)
    plain = None if dtype == "float64" else attention(**as64, **semantic, round_to=dtype).output
    for name, out in outcomes.items():
        assert out.dtype == q.dtype and out.shape == golden.output.shape, name
        assert np.isfinite(out.astype(np.float64)).all(), f"{name}: non-finite output"
        assert_within(out, golden.output, dtype, plain, what=f"{name}: ")


@pytest.mark.slow
@_seeded(EXAMPLES)
@given(calls())
def test_every_call_is_a_right_answer_or_the_same_error(call) -> None:
    _check(call)


@st.composite
def calls_with_extra_keywords(draw) -> tuple[dict, dict | None]:
    """A call of :func:`calls` with a random subset of contract v2's keywords on top, each
    valid or (in a call that may break rules) broken, and the path: None for the plain one, or
    the tiled path's block sizes."""
    call = draw(calls())
    valid = draw(st.booleans())
    *batch, H, L, _ = call["query"].shape
    S = call["key"].shape[-2]
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    floats = st.sampled_from(FLOATS)
    if draw(st.booleans()):
        side = st.sampled_from([None, 0, 1, 2, 5, np.int64(3)])
        window = (draw(side), draw(side))
        if not valid and draw(st.booleans()):
            window = draw(st.sampled_from([(-1, 0), (0, 1.5), (2,), 2, "2", (0, "1"), (0, -3)]))
        call["window"] = window
    if draw(st.booleans()):
        q_shape = (*batch, L) if batch and draw(st.booleans()) else (L,)
        kv_shape = (*batch, S) if batch and draw(st.booleans()) else (S,)
        call["q_segment_ids"] = np.sort(rng.integers(0, 3, q_shape), axis=-1)
        call["kv_segment_ids"] = rng.integers(0, 3, kv_shape)  # unsorted: equality is the rule
        if not valid:
            broken = draw(st.integers(0, 4))
            if broken == 0:
                del call["kv_segment_ids"]
            elif broken == 1:
                call["q_segment_ids"] = call["q_segment_ids"].astype(np.float32)
            elif broken == 2:
                call["kv_segment_ids"] = rng.integers(0, 3, (S + 1,))
    for name in ("sinks", "alibi_slopes"):
        if draw(st.booleans()):
            if name == "sinks":
                values = rng.standard_normal(H) * 3
                values[rng.random(H) < 0.2] = -np.inf  # a sink of -inf is no sink
            else:
                values = np.asarray(impl_numpy.alibi_slopes(H)) * rng.uniform(0.5, 2)
            call[name] = values.astype(NP_DTYPES[draw(floats)])
            if not valid and draw(st.booleans()):
                integers = np.where(np.isfinite(values), values, 0).astype(np.int32)
                call[name] = draw(st.sampled_from([values[:-1], integers, values[None]]))
    blocks = None
    if draw(st.booleans()):
        size = st.one_of(st.integers(1, 5), st.none())  # None: the default (tiled_blocks)
        blocks = {"block_q": draw(size), "block_k": draw(size)}
        if not valid and draw(st.integers(0, 5)) == 0:
            blocks["block_" + draw(st.sampled_from("qk"))] = draw(st.sampled_from([0, -1, 2.0]))
    return call, blocks


@pytest.mark.slow
@_seeded(EXTRA_EXAMPLES)
@given(calls_with_extra_keywords())
def test_extra_keywords_plain_or_tiled_are_a_right_answer_or_the_same_error(problem) -> None:
    call, blocks = problem
    _check(call, blocks)


#: The gradients of AttentionGrads, by field, and the call's input each belongs to.
GRADS = {"query": "query", "key": "key", "value": "value", "bias": "bias", "sinks": "sinks"}


def _grads(fw, call: dict, blocks: dict | None):
    args = [call[n] for n in ("query", "key", "value", "grad_output")]
    kw = {n: x for n, x in call.items() if n not in ("query", "key", "value", "grad_output")}
    module = fw.module
    vjp = module.scaled_dot_product_attention_vjp if blocks is None else module.flash_attention_vjp
    try:
        grads = vjp(*(fw.asarray(x) for x in args), **fw._kw(kw), **(blocks or {}))
    except AttentionError as err:
        return err
    return {f: None if getattr(grads, f) is None else fw.to_numpy(getattr(grads, f)) for f in GRADS}


@pytest.mark.slow
@_seeded(EXTRA_EXAMPLES)
@given(calls_with_extra_keywords(), st.integers(0, 2**16))
def test_gradients_of_every_call_are_right_or_the_same_error(problem, seed) -> None:
    call, blocks = problem
    q, v = call["query"], call["value"]
    try:  # the output's shape; a call that breaks a rule gets its query's batch
        batch = np.broadcast_shapes(q.shape[:-3], call["key"].shape[:-3], v.shape[:-3])
    except ValueError:
        batch = q.shape[:-3]
    shape = (*batch, *q.shape[-3:-1], v.shape[-1])
    call["grad_output"] = np.random.default_rng(seed).standard_normal(shape).astype(q.dtype)
    outcomes = {name: _grads(fw, call, blocks) for name, fw in FRAMEWORKS.items()}
    if _same_error(outcomes):
        return
    dtype = q.dtype.name
    as64, semantic = _oracle_inputs(call)
    golden = attention_vjp(**as64, **semantic)
    plain = golden if dtype == "float64" else attention_vjp(**as64, **semantic, round_to=dtype)
    for field, source in GRADS.items():
        want = getattr(golden, field)
        for name, got in outcomes.items():
            if want is None:
                assert got[field] is None, f"{name}: d{field} without {source}"
                continue
            assert got[field].dtype == call[source].dtype, f"{name}: d{field} dtype"
            assert got[field].shape == want.shape, f"{name}: d{field} shape"
            got64 = got[field].astype(np.float64)
            assert np.isfinite(got64).all(), f"{name}: non-finite d{field}"
            bound = tolerance_bound(want, getattr(plain, field), dtype)
            own = got[field].dtype.name  # a bias or sinks in another dtype: its gradient's
            if own != dtype:  # rounding to that dtype is part of the answer
                rounded_want = rounded(want, own).astype(np.float64)
                bound = max(bound, tolerance_bound(want, rounded_want, own))
            err = float(np.max(np.abs(got64 - want), initial=0.0))
            assert err <= bound, f"{name}: d{field} max error {err:.3g} > bound {bound:.3g}"


DECODE_EXAMPLES = int(os.environ.get("FUZZ_DECODE_EXAMPLES", "25"))


@st.composite
def decode_runs(draw) -> dict:
    """A layer with a random subset of contract v2's options, a sequence, a cache (plain, or
    rolling when the layer has a window's left side) and a random chunking of the sequence,
    sometimes into a cache too short for it."""
    from tests.module_frameworks import H

    K = draw(st.sampled_from([1, 2, 3, 6]))
    options: dict = {}
    if draw(st.booleans()):
        options["window"] = (draw(st.integers(0, 4)), draw(st.sampled_from([0, 2, None])))
    if draw(st.booleans()):
        options["alibi"] = True
    if draw(st.booleans()):
        options["softcap"] = draw(st.sampled_from([0.5, 3.0]))
    if draw(st.booleans()):
        options["rope_theta"], options["rotary_dim"] = 100.0, draw(st.sampled_from([4, 10]))
    T = draw(st.integers(1, 9))
    chunks, left = [], T
    while left:
        chunks.append(draw(st.integers(1, left)))
        left -= chunks[-1]
    rolling = "window" in options and draw(st.booleans())
    max_len = draw(st.integers(max(T - 2, 1), T + 3))  # below T: the cache runs out
    seed = draw(st.integers(0, 2**16))
    return dict(K=K, H=H, options=options, sinks=draw(st.booleans()), T=T, chunks=chunks,
                rolling=rolling, max_len=max_len, seed=seed)


def _decoded(mf, run: dict, weights: dict, x: np.ndarray):
    """The run's chunks decoded by one package: the outputs, concatenated, or the error of the
    first chunk that raised, as (chunk index, class, code, message)."""
    module = mf.build(weights, run["H"], run["K"], **run["options"])
    try:
        cache = module.init_cache(x.shape[0], run["max_len"], rolling=run["rolling"])
    except AttentionError as err:
        return (-1, type(err).__name__, err.code, str(err))
    outputs, start = [], 0
    for index, n in enumerate(run["chunks"]):
        try:
            y, cache = mf.decode(module, x[:, start : start + n], cache)
        except AttentionError as err:
            return (index, type(err).__name__, err.code, str(err))
        outputs.append(y)
        start += n
    return np.concatenate(outputs, axis=1)


@pytest.mark.slow
@_seeded(DECODE_EXAMPLES)
@given(decode_runs())
def test_decoding_in_any_chunks_is_the_full_forward_or_the_same_error(run) -> None:
    """Any chunking into a plain or rolling cache, for a layer with any v2 options: the float64
    oracle's full causal forward of the layer, or the same error at the same chunk in the three
    (a cache too short, a rolling cache refused)."""
    from conformance.oracle import module_forward
    from tests.module_frameworks import MODULE_FRAMEWORKS, B, M, random_canonical

    rng = np.random.default_rng(run["seed"])
    weights = random_canonical(rng, K=run["K"])
    if run["sinks"]:
        weights["sinks"] = rng.standard_normal(run["H"])
    x = rng.standard_normal((B, run["T"], M))
    results = {name: _decoded(mf, run, weights, x) for name, mf in MODULE_FRAMEWORKS.items()}
    errors = {n: r for n, r in results.items() if isinstance(r, tuple)}
    event("an error" if errors else "rolling" if run["rolling"] else "plain cache")
    if errors:
        assert len(errors) == 3, f"only {sorted(errors)} raised: {errors}"
        assert len(set(errors.values())) == 1, f"the three raised differently: {errors}"
        return
    golden = module_forward(weights, x, n_heads=run["H"], n_kv_heads=run["K"], is_causal=True,
                            **run["options"]).output
    for name, got in results.items():
        assert_within(got, golden, "float64", what=f"{name}: ")
