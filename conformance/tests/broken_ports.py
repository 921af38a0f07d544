"""Deliberately broken ports: the suite must catch every one of them.

:func:`make_port` builds a small, self-contained NumPy port of the contract (validation through
``attention_spec``, the same as any port would) with one named bug switched on. With no bug it
passes the whole suite (a test asserts that), so every failure of a broken port is the bug's.

Each bug is a mistake seen in real attention code; :data:`BUGS` says what it does and names one
run that must catch it.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from attention_spec import (
    AttentionError,
    causal_offset,
    check_attention,
    check_causal_mask_args,
)

#: bug -> (what it does, a run id that must fail because of it)
BUGS: dict[str, tuple[str, str]] = {
    "scale_missing": (
        "no 1/sqrt(D): the default scale is 1",
        "sdpa.saturation.default_scale.float32",
    ),
    "scale_one_over_d": ("default scale 1/D instead of 1/sqrt(D)", "sdpa.gqa.h6_k2.float32"),
    "scale_uses_e": ("default scale 1/sqrt(E), the value head dim", "sdpa.gqa.h6_k2.float32"),
    "gqa_tiling": ("query head h reads key/value head h % K (tiling)", "sdpa.gqa.h6_k2.float32"),
    "mask_fill_minus_1e9": (
        "masked positions get -1e9 instead of -inf: fully masked rows turn uniform",
        "sdpa.fully_masked.bool_row.float32",
    ),
    "nan_on_fully_masked": (
        "no guard for rows with no allowed key: exp(-inf - (-inf)) = NaN",
        "sdpa.fully_masked.neg_inf_bias_row.float32",
    ),
    "threshold_fully_masked": (
        "a row whose max score is below -1e30 is treated as fully masked (zeros)",
        "sdpa.fully_masked.huge_negative_bias_row.float32",
    ),
    "always_top_left": (
        "causal_alignment ignored: always top_left",
        "sdpa.causal.bottom_right.l5_s7.float32",
    ),
    "causal_off_by_one": (
        "causal rule j < i + offset (the diagonal is masked)",
        "sdpa.causal.top_left.l5_s7.float32",
    ),
    "softcap_after_mask": (
        "softcap applied after bias and mask: -inf becomes -softcap",
        "sdpa.softcap.cap2_neg_inf_bias.float32",
    ),
    "softmax_wrong_axis": ("softmax over the query axis L", "sdpa.gqa.h6_k2.float32"),
    "no_max_subtraction": (
        "exp(scores) without subtracting the row max: overflow",
        "sdpa.large_logits.shifted.float32",
    ),
    "mask_inverted": (
        "True means masked out (torch.nn.MultiheadAttention's polarity)",
        "sdpa.mask.random.float32",
    ),
    "bias_ignored": ("bias never added", "sdpa.bias.full.float32"),
    "output_not_cast": (
        "result returned in the float32 compute dtype, not the input dtype",
        "sdpa.gqa.h6_k2.float16",
    ),
    "wrong_error_class": (
        "bad input raises a plain ValueError without the taxonomy's class and code",
        "sdpa.error.heads_not_divisible.float32",
    ),
    "no_validation": (
        "no validation: mismatched key/value lengths are silently accepted",
        "sdpa.error.kv_length_mismatch.float32",
    ),
    "low_precision_softmax": (
        "softmax computed in float16 itself, no upcast, no max subtraction",
        "sdpa.large_logits.shifted.float16",
    ),
}


def make_port(bug: str | None = None) -> SimpleNamespace:
    """A NumPy port of the contract with ``bug`` (a key of :data:`BUGS`) switched on."""
    if bug is not None and bug not in BUGS:
        raise KeyError(bug)

    def validate(query, key, value, mask, bias, causal_alignment, scale, softcap):
        if bug == "no_validation":
            H, L, D = query.shape[-3:]
            K, S = key.shape[-3], key.shape[-2]
            return SimpleNamespace(
                H=H, K=K, L=L, S=S, D=D, G=H // K, scale=D**-0.5 if scale is None else scale
            )
        try:
            dims = check_attention(
                query.shape,
                query.dtype.name,
                key.shape,
                key.dtype.name,
                None if value is None else value.shape,
                None if value is None else value.dtype.name,
                mask_shape=None if mask is None else mask.shape,
                mask_dtype=None if mask is None else mask.dtype.name,
                bias_shape=None if bias is None else bias.shape,
                bias_dtype=None if bias is None else bias.dtype.name,
                causal_alignment=causal_alignment,
                scale=scale,
                softcap=softcap,
            )
        except AttentionError as exc:
            if bug == "wrong_error_class":
                raise ValueError(str(exc)) from None
            raise
        if scale is None and bug == "scale_missing":
            return SimpleNamespace(**{**vars_of(dims), "scale": 1.0})
        if scale is None and bug == "scale_one_over_d":
            return SimpleNamespace(**{**vars_of(dims), "scale": 1.0 / dims.D})
        if scale is None and bug == "scale_uses_e" and value is not None:
            return SimpleNamespace(**{**vars_of(dims), "scale": dims.E**-0.5})
        return dims

    def causal_mask(q_len, kv_len, *, alignment="top_left"):
        check_causal_mask_args(q_len, kv_len, alignment)
        offset = causal_offset(q_len, kv_len, alignment)
        if bug == "always_top_left":
            offset = 0
        i, j = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
        return j < i + offset if bug == "causal_off_by_one" else j <= i + offset

    def weights(query, key, dims, mask, bias, is_causal, causal_alignment, softcap):
        low = bug == "low_precision_softmax" and query.dtype == np.float16
        ct = np.float16 if low else np.float64 if query.dtype == np.float64 else np.float32
        K, G = key.shape[-3], dims.H // key.shape[-3]
        heads = np.arange(dims.H) % K if bug == "gqa_tiling" else np.arange(dims.H) // G
        k = np.take(key.astype(ct), heads, axis=-3)  # (..., H, S, D)
        s = query.astype(ct) @ np.swapaxes(k, -1, -2) * ct(dims.scale)  # (..., H, L, S)
        if softcap is not None and bug != "softcap_after_mask":
            s = softcap * np.tanh(s / softcap)
        if bias is not None and bug != "bias_ignored":
            s = s + bias.astype(ct)
        fill = -1e9 if bug == "mask_fill_minus_1e9" else -np.inf
        if mask is not None:
            s = np.where(~mask if bug == "mask_inverted" else mask, s, fill)
        if is_causal:
            s = np.where(causal_mask(dims.L, dims.S, alignment=causal_alignment), s, fill)
        if softcap is not None and bug == "softcap_after_mask":
            s = softcap * np.tanh(s / softcap)
        axis = -2 if bug == "softmax_wrong_axis" else -1
        if bug in ("no_max_subtraction", "low_precision_softmax"):
            e = np.exp(s)
        else:
            m = np.max(s, axis=axis, keepdims=True, initial=-np.inf)
            if bug == "threshold_fully_masked":
                m = np.where(m < -1e30, np.inf, m)  # such rows come out as exp(-inf) = 0
            elif bug != "nan_on_fully_masked":
                m = np.where(np.isfinite(m), m, 0.0)
            e = np.exp(s - m)
        z = e.sum(axis=axis, keepdims=True)
        if bug != "nan_on_fully_masked":
            z = np.where(z == 0, 1, z)
        return e / z

    def attention_weights(
        query,
        key,
        *,
        mask=None,
        bias=None,
        is_causal=False,
        causal_alignment="top_left",
        scale=None,
        softcap=None,
    ):
        with np.errstate(all="ignore"):  # the bugs make NaN and inf; the values must show it
            dims = validate(query, key, None, mask, bias, causal_alignment, scale, softcap)
            w = weights(query, key, dims, mask, bias, is_causal, causal_alignment, softcap)
        return w if bug == "output_not_cast" else w.astype(query.dtype)

    def scaled_dot_product_attention(
        query,
        key,
        value,
        *,
        mask=None,
        bias=None,
        is_causal=False,
        causal_alignment="top_left",
        scale=None,
        softcap=None,
    ):
        with np.errstate(all="ignore"):
            dims = validate(query, key, value, mask, bias, causal_alignment, scale, softcap)
            w = weights(query, key, dims, mask, bias, is_causal, causal_alignment, softcap)
            K, H = value.shape[-3], dims.H
            heads = np.arange(H) % K if bug == "gqa_tiling" else np.arange(H) // (H // K)
            v = np.take(value.astype(w.dtype), heads, axis=-3)  # (..., H, S, E)
            out = w @ v  # (..., H, L, E)
        return out if bug == "output_not_cast" else out.astype(query.dtype)

    return SimpleNamespace(
        __name__=f"broken_ports.{bug or 'correct'}",
        causal_mask=causal_mask,
        attention_weights=attention_weights,
        scaled_dot_product_attention=scaled_dot_product_attention,
    )


def vars_of(dims) -> dict:
    """The fields of an ``AttentionDims`` (plus E) as a dict, to change one of them."""
    fields = ("batch", "H", "K", "L", "S", "D", "E", "scale")
    return {f: getattr(dims, f) for f in fields} | {"G": dims.G}


#: One broken port as a module attribute, for the CLI:
#: ``python -m conformance --impl conformance.tests.broken_ports:scale_missing``.
scale_missing = make_port("scale_missing")
