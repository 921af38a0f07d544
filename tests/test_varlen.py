"""varlen_attention and varlen_attention_vjp (SEMANTICS.md, Contract v3, "Variable-length
batches"): the three implementations against the float64 oracle (``conformance.oracle``, its
own per-sequence loop), the oracle against the contiguous oracle sequence by sequence, the
gradients against finite differences, the garbage rule, jit with traced boundaries, errors."""

from __future__ import annotations

import numpy as np
import pytest

from attention_spec import ConfigError, DimensionMismatchError, DTypeError
from conformance import oracle
from tests.frameworks import NP_DTYPES, same_error

#: Pairwise-distinct sizes: H=6, K=2 (GQA 6:2), D=5, E=7; the sequences' lengths below.
H, K, D, E = 6, 2, 5, 7

#: id: (L_n of each sequence, S_n of each sequence): N = 1, 3, 5, empty sequences (L_n = 0,
#: S_n = 0, both), L_n < S_n, L_n > S_n and L_n = S_n in one batch.
LENGTHS = {
    "n1_equal": ([6], [6]),
    "n1_decode": ([1], [9]),
    "n3_mixed": ([3, 5, 2], [7, 5, 1]),
    "n3_empty_q": ([4, 0, 3], [2, 6, 3]),
    "n5_empties": ([2, 0, 4, 3, 0], [5, 3, 0, 3, 0]),
}

#: id: keywords (per sequence: causal of both alignments, windows that would reach across a
#: boundary, sinks, ALiBi, softcap, scale).
KEYWORD_SETS = {
    "plain": {},
    "causal_top_left": {"is_causal": True},
    "causal_bottom_right": {"is_causal": True, "causal_alignment": "bottom_right"},
    "window_bottom_right": {"window": (2, 1), "causal_alignment": "bottom_right"},
    "window_causal": {"window": (1, 0), "is_causal": True},
    "sinks_alibi_softcap": {
        "sinks": "sinks", "alibi_slopes": "alibi", "softcap": 2.5, "scale": 0.7,
        "is_causal": True, "causal_alignment": "bottom_right",
    },
}


def _case(lengths: str, keywords: str, *, seed: int = 0, h: int = H, k: int = K):
    """query (Tq, H, D), key (Tk, K, D), value (Tk, K, E) float64, cu_seqlens, keywords."""
    rng = np.random.default_rng(seed)
    L, S = LENGTHS[lengths]
    cu_q, cu_k = np.cumsum([0, *L]), np.cumsum([0, *S])
    q = rng.standard_normal((cu_q[-1], h, D))
    key = rng.standard_normal((cu_k[-1], k, D))
    v = rng.standard_normal((cu_k[-1], k, E))
    kw = dict(KEYWORD_SETS[keywords])
    if kw.get("sinks") == "sinks":
        kw["sinks"] = rng.standard_normal(h)
    if kw.get("alibi_slopes") == "alibi":
        kw["alibi_slopes"] = np.asarray(oracle.alibi_slopes(h))
    return q, key, v, cu_q, cu_k, kw


def _run(fw, function: str, *arrays, **kw):
    args = [fw.asarray(x) for x in arrays]
    kw = {n: fw.asarray(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
    return getattr(fw.module, function)(*args, **kw)


#: (lengths, keywords): every length set and every keyword set, each at least once, the
#: alignments on the sets where L_n != S_n.
FORWARD_CASES = [
    ("n1_equal", "causal_top_left"), ("n1_decode", "causal_bottom_right"),
    ("n1_decode", "window_bottom_right"), ("n3_mixed", "plain"),
    ("n3_mixed", "causal_top_left"), ("n3_mixed", "causal_bottom_right"),
    ("n3_mixed", "window_causal"), ("n3_empty_q", "window_bottom_right"),
    ("n3_empty_q", "sinks_alibi_softcap"), ("n5_empties", "causal_top_left"),
    ("n5_empties", "causal_bottom_right"), ("n5_empties", "sinks_alibi_softcap"),
]


@pytest.mark.parametrize(("lengths", "keywords"), FORWARD_CASES)
def test_varlen_matches_the_oracle(fw, lengths: str, keywords: str) -> None:
    q, k, v, cu_q, cu_k, kw = _case(lengths, keywords)
    golden = oracle.varlen_attention(q, k, v, cu_q, cu_k, **kw)
    got = fw.to_numpy(_run(fw, "varlen_attention", q, k, v, cu_q, cu_k, **kw))
    oracle.assert_within(got, golden, "float64")


@pytest.mark.parametrize("keywords", ["causal_bottom_right", "sinks_alibi_softcap"])
@pytest.mark.parametrize("lengths", ["n3_mixed", "n5_empties"])
def test_the_oracle_is_the_contiguous_oracle_per_sequence(lengths: str, keywords: str) -> None:
    """The oracle's own loop against oracle.attention on each sequence's rows, heads-first."""
    q, k, v, cu_q, cu_k, kw = _case(lengths, keywords)
    golden = oracle.varlen_attention(q, k, v, cu_q, cu_k, **kw)
    for n in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[n], cu_q[n + 1]), slice(cu_k[n], cu_k[n + 1])
        heads_first = [x.transpose(1, 0, 2) for x in (q[rows], k[keys], v[keys])]
        want = oracle.attention(*heads_first, **kw).output.transpose(1, 0, 2)
        np.testing.assert_array_equal(golden[rows], want)


def test_gqa_8_to_1_and_one_key_head_per_query_head(fw) -> None:
    for h, k in ((8, 1), (3, 3)):
        q, key, v, cu_q, cu_k, kw = _case("n3_mixed", "causal_bottom_right", h=h, k=k)
        golden = oracle.varlen_attention(q, key, v, cu_q, cu_k, **kw)
        got = fw.to_numpy(_run(fw, "varlen_attention", q, key, v, cu_q, cu_k, **kw))
        oracle.assert_within(got, golden, "float64", what=f"H={h} K={k}: ")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_low_precision_within_the_manifest_rule(fw, dtype: str) -> None:
    q, k, v, cu_q, cu_k, kw = _case("n5_empties", "sinks_alibi_softcap", seed=3)
    q, k, v = (oracle.rounded(x, dtype) for x in (q, k, v))
    golden = oracle.varlen_attention(q, k, v, cu_q, cu_k, **kw)
    plain = oracle.varlen_attention(q, k, v, cu_q, cu_k, **kw, round_to=dtype)
    out = _run(fw, "varlen_attention", q, k, v, cu_q, cu_k, **kw)
    assert str(out.dtype).endswith(dtype)
    oracle.assert_within(fw.to_numpy(out), golden, dtype, plain)


def test_a_sequence_never_sees_another_sequences_keys(fw) -> None:
    """NaN in the keys and values of a sequence with no queries, and inf in another's rows
    the window leaves out, never reach an output row (the garbage rule)."""
    q, k, v, cu_q, cu_k, kw = _case("n3_empty_q", "window_bottom_right")
    k, v = k.copy(), v.copy()
    k[cu_k[1] : cu_k[2]] = np.nan  # sequence 1: L_n = 0, S_n = 6
    v[cu_k[1] : cu_k[2]] = np.nan
    golden = oracle.varlen_attention(q, k, v, cu_q, cu_k, **kw)
    out = fw.to_numpy(_run(fw, "varlen_attention", q, k, v, cu_q, cu_k, **kw))
    assert np.isfinite(out).all()
    oracle.assert_within(out, golden, "float64")


def test_jax_jit_with_traced_boundaries() -> None:
    import jax

    import impl_jax

    f = jax.jit(impl_jax.varlen_attention, static_argnames=impl_jax.VARLEN_STATIC_ARGNAMES)
    q, k, v, cu_a, cu_b, kw = _case("n3_mixed", "causal_bottom_right")  # Tq=10, Tk=13
    for cu_q, cu_k in ((cu_a, cu_b), (np.array([0, 4, 4, 10]), np.array([0, 2, 8, 13]))):
        golden = oracle.varlen_attention(q, k, v, cu_q, cu_k, **kw)
        oracle.assert_within(np.asarray(f(q, k, v, cu_q, cu_k, **kw)), golden, "float64")


# -- gradients ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lengths", "keywords"),
    [("n3_mixed", "causal_top_left"), ("n5_empties", "sinks_alibi_softcap")],
)
def test_varlen_vjp_matches_the_oracle(fw, lengths: str, keywords: str) -> None:
    q, k, v, cu_q, cu_k, kw = _case(lengths, keywords, seed=1)
    do = np.random.default_rng(2).standard_normal((q.shape[0], H, E))
    golden = oracle.varlen_attention_vjp(q, k, v, cu_q, cu_k, do, **kw)
    grads = _run(fw, "varlen_attention_vjp", q, k, v, cu_q, cu_k, do, **kw)
    for name in ("query", "key", "value", "sinks"):
        want = getattr(golden, name)
        if want is None:
            assert getattr(grads, name) is None
            continue
        oracle.assert_within(fw.to_numpy(getattr(grads, name)), want, "float64", what=f"d{name}: ")
    assert grads.bias is None


def test_the_oracle_gradients_are_finite_differences_of_the_oracle() -> None:
    """Central differences of sum(oracle.varlen_attention * dO), float64, on every input
    element of a small case with empty sequences, sinks, ALiBi and softcap."""
    rng = np.random.default_rng(4)
    cu_q, cu_k = np.array([0, 2, 2, 4]), np.array([0, 3, 4, 4])
    q, k, v = (
        rng.standard_normal((4, 2, 3)),
        rng.standard_normal((4, 1, 3)),
        rng.standard_normal((4, 1, 2)),
    )
    kw = {"is_causal": True, "causal_alignment": "bottom_right", "softcap": 2.0,
          "sinks": rng.standard_normal(2), "alibi_slopes": np.array([0.5, 0.25])}
    do = rng.standard_normal((4, 2, 2))
    golden = oracle.varlen_attention_vjp(q, k, v, cu_q, cu_k, do, **kw)
    inputs = {"query": q, "key": k, "value": v, "sinks": kw["sinks"]}

    def loss(name: str, x: np.ndarray) -> float:
        given = inputs | {name: x}
        out = oracle.varlen_attention(
            given["query"],
            given["key"],
            given["value"],
            cu_q,
            cu_k,
            **(kw | {"sinks": given["sinks"]}),
        )
        return float((out * do).sum())

    step = 1e-6
    for name, x in inputs.items():
        numeric = np.zeros_like(x)
        for index in np.ndindex(*x.shape):
            up, down = x.copy(), x.copy()
            up[index] += step
            down[index] -= step
            numeric[index] = (loss(name, up) - loss(name, down)) / (2 * step)
        # central differences of step 1e-6: their truncation and cancellation, not the rule
        np.testing.assert_allclose(getattr(golden, name), numeric, atol=1e-7, rtol=1e-6)
    assert not golden.key[3].any()  # key row 3 (sequence 1, no queries) has no gradient


# -- errors ---------------------------------------------------------------------------------


def _packed(q=(9, 6, 4), k=(11, 2, 4), v=(11, 2, 5), dtype="float32"):
    return tuple(np.zeros(s, NP_DTYPES.get(dtype, dtype)) for s in (q, k, v))


_CU_Q, _CU_K = np.array([0, 4, 4, 9]), np.array([0, 3, 8, 11])


@pytest.mark.parametrize(
    ("cu_q", "cu_k", "kw", "cls", "code", "fragment"),
    [
        (_CU_Q.astype(np.float32), _CU_K, {}, DTypeError, "cu_seqlens_dtype", "got float32"),
        (np.array([0, 4, 4, 8]), _CU_K, {}, ConfigError, "cu_seqlens_value", "not Tq=9"),
        (_CU_Q, np.array([0, 8, 3, 11]), {}, ConfigError, "cu_seqlens_value", "(decreasing)"),
        (_CU_Q, np.array([0, 11]), {}, DimensionMismatchError, "cu_seqlens_count", "4 and 2"),
        (_CU_Q, _CU_K, {"sinks": np.zeros(2, np.float32)}, DimensionMismatchError,
         "sinks_shape", "(H=6,)"),
        (_CU_Q, _CU_K, {"window": (1,)}, ConfigError, "window_value", ""),
    ],
)
def test_errors_are_identical_in_all_three(cu_q, cu_k, kw, cls, code, fragment) -> None:
    q, k, v = _packed()
    same_error(lambda fw: _run(fw, "varlen_attention", q, k, v, cu_q, cu_k, **kw), cls, code,
               fragment)
    do = np.zeros((9, 6, 5), np.float32)
    same_error(lambda fw: _run(fw, "varlen_attention_vjp", q, k, v, cu_q, cu_k, do, **kw), cls,
               code, fragment)


def test_vjp_checks_grad_output_after_the_call() -> None:
    q, k, v = _packed()
    do = np.zeros((9, 6, 4), np.float32)
    same_error(
        lambda fw: _run(fw, "varlen_attention_vjp", q, k, v, _CU_Q, _CU_K, do),
        DimensionMismatchError, "grad_output_shape", "(Tq=9, H=6, E=5); got (9, 6, 4)",
    )
