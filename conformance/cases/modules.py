"""Module cases: ``GroupedQueryAttention`` / ``MultiHeadAttention`` from canonical weights.

``@module_case`` functions build the canonical weights (SEMANTICS.md, "Modules") and the inputs
of one call of the module (``module.<name>.<dtype>``); the golden is the oracle's module forward.
"""

from __future__ import annotations

from conformance.cases.base import (
    ALL_DTYPES,
    MB,
    ML,
    MM,
    MS,
    H,
    K,
    ModuleCall,
    canonical,
    module_case,
    normal,
    padding,
)


@module_case("mha.self", ALL_DTYPES)
def module_mha_self(rng, dtype):
    """MultiHeadAttention (H = K = 6, M = 24 = H * D), self-attention, with the weights of every
    head returned (B, H, L, L). Square q and o projections: a transposed kernel or q and k
    projections swapped give wrong numbers, not shape errors."""
    return ModuleCall(canonical(rng, k=H), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=H,
                      cls="MultiHeadAttention", keywords={"return_weights": True})


@module_case("gqa.h6_k2", ALL_DTYPES)
def module_gqa(rng, dtype):
    """GroupedQueryAttention 6:2, self-attention: query head h reads key/value head h // 3."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      keywords={"return_weights": True})


@module_case("mqa.h6_k1", ALL_DTYPES)
def module_mqa(rng, dtype):
    """Multi-query attention (n_kv_heads = 1): one key/value head for all six query heads."""
    return ModuleCall(canonical(rng, k=1), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=1,
                      keywords={"return_weights": True})


@module_case("cross.h6_k2", ALL_DTYPES)
def module_cross(rng, dtype):
    """Cross-attention: queries from x (B, L=5, M), keys and values from context (B, S=7, M)."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, MS, MM))


@module_case("causal.top_left.l5_s7", ALL_DTYPES)
def module_causal_top_left(rng, dtype):
    """Cross-attention, causal top_left with L = 5 < S = 7: query i sees context tokens 0..i."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, MS, MM),
                      keywords={"is_causal": True, "return_weights": True})


@module_case("causal.bottom_right.l5_s7", ALL_DTYPES)
def module_causal_bottom_right(rng, dtype):
    """Cross-attention, causal bottom_right with L = 5 < S = 7: query i sees tokens 0..i+2."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, MS, MM),
                      keywords={"is_causal": True, "causal_alignment": "bottom_right",
                                "return_weights": True})


@module_case("causal.bottom_right.l7_s5")
def module_causal_bottom_right_tall(rng, dtype):
    """Cross-attention, causal bottom_right with L = 7 > S = 5: the first two query rows see no
    key; their attention output is zero, so their module output is o_proj's bias alone."""
    return ModuleCall(canonical(rng), normal(rng, MB, MS, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, ML, MM),
                      keywords={"is_causal": True, "causal_alignment": "bottom_right"})


@module_case("causal.self", ("float32", "bfloat16"))
def module_causal_self(rng, dtype):
    """Self-attention with the causal rule (L = S: both alignments are the lower triangle)."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      keywords={"is_causal": True})


@module_case("padding.b11s", ("float32", "float16", "bfloat16"))
def module_padding(rng, dtype):
    """Cross-attention with a (B, 1, 1, S) padding mask: example 0 has all 7 context tokens,
    example 1 only its first 4 (what padding_mask([7, 4], 7) gives)."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, MS, MM), mask=padding([7, 4], MS),
                      keywords={"return_weights": True})


@module_case("padding.nan_context", ("float32", "bfloat16"))
def module_padding_nan_context(rng, dtype):
    """The padding case with the padded context tokens of example 1 holding NaN (uninitialized
    padding): their keys and values are NaN, no query attends them, and the output is clean."""
    context = normal(rng, MB, MS, MM)
    context[1, 4:, :] = float("nan")
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=context, mask=padding([7, 4], MS),
                      keywords={"return_weights": True})


@module_case("bias.full")
def module_bias(rng, dtype):
    """An additive attention bias (B, H, L, S) passed through the module to the attention."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, MS, MM), bias=normal(rng, MB, H, ML, MS))


@module_case("no_bias", ("float32", "bfloat16"))
def module_no_bias(rng, dtype):
    """Weights without biases (the four kernels only): bias=False modules."""
    return ModuleCall(canonical(rng, bias=False), normal(rng, MB, ML, MM), n_heads=H,
                      n_kv_heads=K)


@module_case("shapes.d5_e3_m17")
def module_shapes(rng, dtype):
    """Head dims that are not d_model / n_heads: M = 17, H = 6, K = 3, D = 5, E = 3 (q_proj
    (17, 30), v_proj (17, 9), o_proj (18, 17)). D and E are read from the kernels' shapes."""
    return ModuleCall(canonical(rng, m=17, k=3, d=5, e=3), normal(rng, MB, ML, 17), n_heads=H,
                      n_kv_heads=3, context=normal(rng, MB, MS, 17))
