"""A fuzzer that stays in CI: generated calls, valid and invalid, through the three frameworks.

Every call must end in one of two ways: the same ``AttentionError`` (class, code and message)
in NumPy, PyTorch and JAX, or a finite result in all three that agrees with the float64 oracle
within the fixture rule's bound. Anything else (a raw framework error, a NaN, a silent wrong
answer, frameworks that disagree) fails, with the call printed by hypothesis.

Seeded and bounded: ``FUZZ_EXAMPLES`` calls (default 300) in ``make test``; set the variable
higher for a longer hunt (``FUZZ_EXAMPLES=5000 pytest tests/test_fuzz.py``).
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attention_spec import AttentionError
from conformance.oracle import attention, tolerance_bound
from tests.frameworks import FRAMEWORKS, NP_DTYPES

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))
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
        good = [1.0, 5.0, 30.0, 2.0**60]
        bad = [0.0, -1.0, 1e38, math.inf, "5"]
        kw["softcap"] = draw(st.sampled_from(good + ([] if valid else bad)))
    return {"query": q, "key": k, "value": v, **kw}


def _outcome(fw, call: dict):
    args = [call[n] for n in ("query", "key", "value")]
    kw = {n: x for n, x in call.items() if n not in ("query", "key", "value")}
    try:
        return fw.sdpa(*args, **kw)
    except AttentionError as err:
        return err


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(calls())
def test_every_call_is_a_right_answer_or_the_same_error(call) -> None:
    outcomes = {name: _outcome(fw, call) for name, fw in FRAMEWORKS.items()}
    errors = {n: o for n, o in outcomes.items() if isinstance(o, AttentionError)}
    if errors:
        assert len(errors) == 3, f"only {sorted(errors)} raised: {errors}"
        seen = {(type(e).__name__, e.code, str(e)) for e in errors.values()}
        assert len(seen) == 1, f"the three raised differently: {seen}"
        return
    q = call["query"]
    dtype = q.dtype.name
    semantic = {n: call[n] for n in ("is_causal", "causal_alignment") if n in call}
    for name in ("scale", "softcap"):
        if name in call:
            semantic[name] = float(np.asarray(call[name]))
    as64 = {n: call[n].astype(np.float64) for n in ("query", "key", "value")}
    if "mask" in call:
        as64["mask"] = call["mask"]
    if "bias" in call:  # cast to the compute dtype first, as the contract says
        ct = np.float64 if dtype == "float64" else np.float32
        with np.errstate(over="ignore"):
            as64["bias"] = call["bias"].astype(ct).astype(np.float64)
    golden = attention(**as64, **semantic)
    plain = golden if dtype == "float64" else attention(**as64, **semantic, round_to=dtype)
    bound = tolerance_bound(golden.output, plain.output, dtype)
    for name, out in outcomes.items():
        assert out.dtype == q.dtype and out.shape == golden.output.shape, name
        got = out.astype(np.float64)
        assert np.isfinite(got).all(), f"{name}: non-finite output"
        err = float(np.max(np.abs(got - golden.output), initial=0.0))
        assert err <= bound, f"{name}: max error {err:.3g} > bound {bound:.3g}"
