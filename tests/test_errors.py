"""Every row of the error taxonomy, raised identically (class, code, message) by all three."""

from __future__ import annotations

import numpy as np
import pytest

from attention_spec import (
    ERROR_CODES,
    FP8_ERROR_CODES,
    MODULE_ERROR_CODES,
    PAGED_ERROR_CODES,
    ROTARY_ERROR_CODES,
    SHARDED_ERROR_CODES,
    VARLEN_ERROR_CODES,
    AttentionError,
    ConfigError,
    DimensionMismatchError,
    DTypeError,
    MaskError,
)
from tests.frameworks import NP_DTYPES, same_error


def _arrays(q=(8, 5, 4), k=(2, 7, 4), v=(2, 7, 6), dtype="float32", k_dtype=None, v_dtype=None):
    return (
        np.zeros(q, NP_DTYPES.get(dtype, dtype)),
        np.zeros(k, NP_DTYPES.get(k_dtype or dtype, k_dtype or dtype)),
        np.zeros(v, NP_DTYPES.get(v_dtype or dtype, v_dtype or dtype)),
    )


# id: (arrays, keywords, class, code, a distinctive part of the message)
CASES = {
    "gqa_k3_h8": (
        _arrays(k=(3, 7, 4), v=(3, 7, 6)), {}, DimensionMismatchError, "heads_not_divisible",
        "key heads (K=3) must divide query heads (H=8)",
    ),
    "kv_length": (
        _arrays(v=(2, 6, 6)), {}, DimensionMismatchError, "kv_length_mismatch",
        "key length (S=7) must equal value length (S=6)",
    ),
    "kv_heads": (
        _arrays(v=(4, 7, 6)), {}, DimensionMismatchError, "kv_heads_mismatch",
        "got key K=2, value K=4",
    ),
    "qk_head_dim": (
        _arrays(k=(2, 7, 3), v=(2, 7, 6)), {}, DimensionMismatchError, "qk_head_dim_mismatch",
        "query head dim (D=4) must equal key head dim (D=3)",
    ),
    "batch": (
        _arrays(q=(2, 8, 5, 4), k=(3, 2, 7, 4), v=(3, 2, 7, 6)), {}, DimensionMismatchError,
        "batch_not_broadcastable", "query (2,), key (3,), value (3,)",
    ),
    "rank": (
        _arrays(q=(5, 4)), {}, DimensionMismatchError, "rank",
        "query must have at least 3 dims (..., H, L, D); got shape (5, 4)",
    ),
    "mask_int": (
        _arrays(), {"mask": np.ones((5, 7), np.int64)}, MaskError, "mask_dtype",
        "got int64. To add a float mask, pass it as bias=",
    ),
    "mask_float": (
        _arrays(), {"mask": np.zeros((5, 7), np.float32)}, MaskError, "mask_dtype",
        "mask must be boolean (True = may attend); got float32",
    ),
    "mask_shape": (
        _arrays(q=(2, 8, 5, 4), k=(2, 2, 7, 4), v=(2, 2, 7, 6)),
        {"mask": np.ones((2, 3, 5, 7), bool)}, MaskError, "mask_shape",
        "mask must broadcast to (B=2, H=8, L=5, S=7); got (2, 3, 5, 7)",
    ),
    "mask_kv_heads": (
        _arrays(), {"mask": np.ones((2, 5, 7), bool)}, MaskError, "mask_kv_heads",
        "mask head axis has size 2, the number of key/value heads (K=2)",
    ),
    "bias_bool": (
        _arrays(), {"bias": np.zeros((5, 7), bool)}, MaskError, "bias_dtype",
        "bias must be floating point",
    ),
    "bias_shape": (
        _arrays(), {"bias": np.zeros((5, 6), np.float32)}, MaskError, "bias_shape",
        "bias must broadcast to (H=8, L=5, S=7); got (5, 6)",
    ),
    "bias_kv_heads": (
        _arrays(), {"bias": np.zeros((2, 1, 7), np.float32)}, MaskError, "bias_kv_heads",
        "bias head axis has size 2",
    ),
    "dtype_mismatch": (
        _arrays(k_dtype="float64"), {}, DTypeError, "dtype_mismatch",
        "got query=float32, key=float64, value=float32",
    ),
    "unsupported_int": (
        _arrays(dtype="int32"), {}, DTypeError, "unsupported_dtype", "got int32",
    ),
    "scale_nan": (_arrays(), {"scale": float("nan")}, ConfigError, "scale_not_finite", "got nan"),
    "scale_inf": (_arrays(), {"scale": float("inf")}, ConfigError, "scale_not_finite", "got inf"),
    "scale_text": (_arrays(), {"scale": "0.5"}, ConfigError, "scale_not_finite", "got '0.5'"),
    "softcap_zero": (
        _arrays(), {"softcap": 0.0}, ConfigError, "softcap_not_positive", "> 0 (or None",
    ),
    "softcap_negative": (
        _arrays(), {"softcap": -2.0}, ConfigError, "softcap_not_positive", "got -2.0",
    ),
    "alignment": (
        _arrays(), {"is_causal": True, "causal_alignment": "bottom-right"}, ConfigError,
        "unknown_alignment", "got 'bottom-right'",
    ),
    "alignment_without_causal": (  # checked even when is_causal is False: a typo is a typo
        _arrays(), {"causal_alignment": "lower_right"}, ConfigError, "unknown_alignment",
        "('top_left', 'bottom_right')",
    ),
    "zero_head_dim": (
        _arrays(q=(8, 5, 0), k=(2, 7, 0)), {}, ConfigError, "non_positive_size",
        "head dim D must be >= 1; got 0",
    ),
    "scale_range": (
        _arrays(dtype="float16"), {"scale": 1e39}, ConfigError, "scale_range",
        "scale must be finite in the compute dtype float32",
    ),
    "softcap_range": (
        _arrays(), {"softcap": 2.0**103}, ConfigError, "softcap_range",
        "softcap must be in [2**-102, 2**102] for float32 inputs",
    ),
    "is_causal_string": (
        _arrays(), {"is_causal": "False"}, ConfigError, "not_a_bool",
        "is_causal must be a bool (True or False); got 'False'",
    ),
    "value_none": (
        (*_arrays()[:2], None), {}, DTypeError, "not_an_array", "value must be an array",
    ),
    # contract v2: window, segment ids, sinks, ALiBi
    "window_negative": (
        _arrays(), {"window": (-1, 0)}, ConfigError, "window_value", "got (-1, 0)",
    ),
    "window_triple": (
        _arrays(), {"window": (1, 2, 3)}, ConfigError, "window_value",
        "window must be a pair (left, right)",
    ),
    "segments_alone": (
        _arrays(), {"q_segment_ids": np.zeros(5, np.int32)}, ConfigError, "segment_ids_pair",
        "q_segment_ids was given without kv_segment_ids",
    ),
    "segments_float": (
        _arrays(), {"q_segment_ids": np.zeros(5, np.float32),
                    "kv_segment_ids": np.zeros(7, np.float32)},
        MaskError, "segment_ids_dtype", "q_segment_ids must be integers",
    ),
    "segments_shape": (
        _arrays(), {"q_segment_ids": np.zeros(4, np.int32),
                    "kv_segment_ids": np.zeros(7, np.int32)},
        MaskError, "segment_ids_shape", "q_segment_ids must broadcast to (L=5); got (4,)",
    ),
    "sinks_shape": (
        _arrays(), {"sinks": np.zeros(3, np.float32)}, DimensionMismatchError, "sinks_shape",
        "shape (H=8,); got (3,)",
    ),
    "sinks_int": (
        _arrays(), {"sinks": np.zeros(8, np.int32)}, DTypeError, "sinks_dtype", "got int32",
    ),
    "alibi_shape": (
        _arrays(), {"alibi_slopes": np.zeros(2, np.float32)}, DimensionMismatchError,
        "alibi_shape", "shape (H=8,); got (2,)",
    ),
    "alibi_bool": (
        _arrays(), {"alibi_slopes": np.zeros(8, bool)}, DTypeError, "alibi_dtype", "got bool",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_error_row_is_identical_in_all_three(case):
    (q, k, v), kw, cls, code, fragment = CASES[case]
    err = same_error(lambda fw: fw.sdpa(q, k, v, **kw), cls, code, fragment)
    assert isinstance(err, ValueError)  # AttentionError is a ValueError


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][0][0].ndim >= 3])
def test_attention_weights_raises_the_same(case, fw):
    (q, k, _), kw, cls, code, _ = CASES[case]
    if code in ("kv_length_mismatch", "kv_heads_mismatch", "not_an_array"):  # value errors
        assert fw.weights(q, k, **kw).shape == (*q.shape[:-1], k.shape[-2])
        return
    with pytest.raises(cls) as info:
        fw.weights(q, k, **kw)
    assert info.value.code == code


def test_every_functional_code_has_a_case():
    covered = {c[3] for c in CASES.values()}
    # the sharded functions' own codes: tests/test_sharded.py, in all three; RoPE's: test_rotary.py
    # and grad_output_shape, raised by the *_vjp functions only: the grad.error.* fixtures
    functional = set(ERROR_CODES) - MODULE_ERROR_CODES - SHARDED_ERROR_CODES - ROTARY_ERROR_CODES
    functional -= {"grad_output_shape"}
    functional -= FP8_ERROR_CODES  # fp8's: the sdpa.error.fp8_* and quantize.error.* fixtures
    functional -= VARLEN_ERROR_CODES  # varlen's: VARLEN_CASES below
    functional -= PAGED_ERROR_CODES  # the paged cache's: tests/test_paged.py, in all three
    assert functional - covered == set()
    for code, (cls, _) in ERROR_CODES.items():
        assert issubclass(cls, AttentionError), code


@pytest.mark.parametrize(("args", "kw"), [((-1, 3), {}), ((2, 3), {"alignment": "diagonal"})])
def test_causal_mask_arguments(fw, args, kw):
    with pytest.raises(ConfigError):
        fw.module.causal_mask(*args, **kw)


# -- variable-length batches (varlen_attention; attention_spec/varlen.py) ------------------------


def _packed(q=(9, 6, 4), k=(11, 2, 4), v=(11, 2, 5), dtype="float32"):
    """Token-major query (Tq, H, D), key (Tk, K, D), value (Tk, K, E): Tq=9, Tk=11, H=6, K=2."""
    return tuple(np.zeros(s, NP_DTYPES.get(dtype, dtype)) for s in (q, k, v))


_CU_Q, _CU_K = np.array([0, 4, 4, 9]), np.array([0, 3, 8, 11])  # N = 3, sequence 1 has L_n = 0

# id: (arrays, cu_seqlens_q, cu_seqlens_k, keywords, class, code, a distinctive part)
VARLEN_CASES = {
    "cu_float": (
        _packed(), _CU_Q.astype(np.float32), _CU_K, {}, DTypeError, "cu_seqlens_dtype",
        "cu_seqlens_q must be integers",
    ),
    "cu_bool": (
        _packed(), _CU_Q, np.ones(4, bool), {}, DTypeError, "cu_seqlens_dtype",
        "cu_seqlens_k must be integers (the cumulative sequence lengths, (N + 1,)); got bool",
    ),
    "cu_not_zero": (
        _packed(), np.array([1, 4, 4, 9]), _CU_K, {}, ConfigError, "cu_seqlens_value",
        "got cu_seqlens_q[0] = 1, not 0",
    ),
    "cu_decreasing": (
        _packed(), _CU_Q, np.array([0, 8, 3, 11]), {}, ConfigError, "cu_seqlens_value",
        "cu_seqlens_k[2] = 3 < cu_seqlens_k[1] = 8 (decreasing)",
    ),
    "cu_short_of_total": (
        _packed(), np.array([0, 4, 4, 8]), _CU_K, {}, ConfigError, "cu_seqlens_value",
        "cu_seqlens_q[N] = 8, not Tq=9 (the packed tokens)",
    ),
    "cu_past_total": (
        _packed(), _CU_Q, np.array([0, 3, 8, 12]), {}, ConfigError, "cu_seqlens_value",
        "cu_seqlens_k[N] = 12, not Tk=11",
    ),
    "cu_count": (
        _packed(), _CU_Q, np.array([0, 11]), {}, DimensionMismatchError, "cu_seqlens_count",
        "the same N sequences (N + 1 entries each); got 4 and 2 entries",
    ),
    "cu_2d": (
        _packed(), _CU_Q[None], _CU_K, {}, DimensionMismatchError, "cu_seqlens_count",
        "one axis of N + 1 >= 1 entries (0, then each sequence's end); got shape (1, 4)",
    ),
    "cu_empty": (
        _packed(), np.zeros(0, np.int32), _CU_K, {}, DimensionMismatchError, "cu_seqlens_count",
        "got shape (0,)",
    ),
    "varlen_rank": (
        _packed(q=(1, 9, 6, 4)), _CU_Q, _CU_K, {}, DimensionMismatchError, "rank",
        "query of varlen_attention must have exactly 3 dims (Tq, H, D), token-major",
    ),
    "varlen_kv_tokens": (
        _packed(v=(10, 2, 5)), _CU_Q, _CU_K, {}, DimensionMismatchError, "kv_length_mismatch",
        "key tokens (Tk=11) must equal value tokens (Tk=10)",
    ),
    "varlen_gqa": (
        _packed(k=(11, 4, 4), v=(11, 4, 5)), _CU_Q, _CU_K, {}, DimensionMismatchError,
        "heads_not_divisible", "key heads (K=4) must divide query heads (H=6)",
    ),
    "varlen_sinks": (
        _packed(), _CU_Q, _CU_K, {"sinks": np.zeros(2, np.float32)}, DimensionMismatchError,
        "sinks_shape", "shape (H=6,); got (2,)",
    ),
    "varlen_window_before_arrays": (  # step 1 (a keyword alone) before step 3 (cu_seqlens)
        _packed(), np.array([1, 9]), _CU_K, {"window": (-1, 0)}, ConfigError, "window_value",
        "",
    ),
}


@pytest.mark.parametrize("case", list(VARLEN_CASES))
def test_varlen_error_row(case):
    from attention_spec import check_varlen

    (q, k, v), cu_q, cu_k, kw, cls, code, fragment = VARLEN_CASES[case]
    with pytest.raises(cls) as info:
        check_varlen(q, k, v, cu_q, cu_k, **kw)
    assert type(info.value) is cls and info.value.code == code
    assert fragment in str(info.value)


def test_every_varlen_code_has_a_case():
    assert VARLEN_ERROR_CODES - {c[5] for c in VARLEN_CASES.values()} == set()
    assert VARLEN_ERROR_CODES <= set(ERROR_CODES)
