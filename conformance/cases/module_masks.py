"""Module and KV-cache cases of contract v2: a module's window, sinks, ALiBi, softcap and segments.

A ``GroupedQueryAttention`` / ``MultiHeadAttention`` configured per layer (``window=``,
``sinks=True``, ``alibi=True``, ``softcap=``, SEMANTICS.md v2) passes its settings to every
attention call; its learned sinks are the canonical weight ``sinks (H,)``. The settings travel in
the manifest's module spec (the keywords of ``from_canonical``), the sinks among the weights.
The golden is the oracle's module forward (``conformance.oracle.module_forward``, float64, its own
ALiBi slopes). Decode cases of a module with a window are also fed through a rolling cache
(:data:`~conformance.cases.decode.ROLLING_CHUNKINGS`): ``min(left + 1, max_len)`` slots.
The module cases run against ``module`` and ``head_parallel_gqa``, whose sharded forward carries
the module's v2 settings (the sinks and slopes split with the query heads, segment ids whole).
"""

from __future__ import annotations

import numpy as np

from conformance.cases.base import (
    MB,
    ML,
    MM,
    MS,
    H,
    K,
    ModuleCall,
    ModuleErrorCall,
    canonical,
    case,
    normal,
    padding,
)
from conformance.cases.decode import DECODE_T
from conformance.cases.errors import construct, decode, module_error_case

LOW = ("float32", "bfloat16")


def _with_sinks(rng, weights: dict, h: int = H) -> dict:
    """``weights`` plus a learned ``sinks (H,)`` of order one, different per head (head h's
    sink near h / 2 - 1), so a dropped, shared or misplaced sink is a wrong number."""
    return weights | {"sinks": normal(rng, h) * 0.5 + np.arange(h) / 2.0 - 1.0}


@case("module", "v2.window.causal.gqa", LOW)
def module_window_causal(rng, dtype):
    """Self-attention, causal, window=(2, 0): query i sees keys i-2..i (three keys, flash-attn's
    inclusive rule). A window of W keys instead of W + 1 drops key i - 2."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      keywords={"is_causal": True, "return_weights": True},
                      options={"window": [2, 0]})


@case("module", "v2.window.cross.bottom_right.l5_s7")
def module_window_cross(rng, dtype):
    """Cross-attention L = 5, S = 7, not causal, window=(1, 1) with causal_alignment bottom_right:
    the band sits on the diagonal j = i + 2 (query i sees keys i+1..i+3). A port that places the
    window top-left (j = i) fails."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, MS, MM),
                      keywords={"causal_alignment": "bottom_right", "return_weights": True},
                      options={"window": [1, 1]})


@case("module", "v2.sinks.gqa.padding", LOW)
def module_sinks(rng, dtype):
    """sinks=True (the weights hold ``sinks (H,)``), cross-attention with a padding mask: every
    row's weights sum to less than one; example 1 sees 4 of 7 keys. A module that ignores its
    sinks, or loads them into the wrong heads, gives other numbers."""
    return ModuleCall(_with_sinks(rng, canonical(rng)), normal(rng, MB, ML, MM), n_heads=H,
                      n_kv_heads=K, context=normal(rng, MB, MS, MM), mask=padding([7, 4], MS),
                      keywords={"return_weights": True})


@case("module", "v2.alibi.mha.causal", LOW)
def module_alibi(rng, dtype):
    """MultiHeadAttention (H = 6, not a power of two) with alibi=True: the slopes of 4 heads, then
    every other slope of 8 (``alibi_slopes(6)``), causal self-attention."""
    return ModuleCall(canonical(rng, k=H), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=H,
                      cls="MultiHeadAttention", keywords={"is_causal": True},
                      options={"alibi": True})


@case("module", "v2.softcap.gqa")
def module_softcap(rng, dtype):
    """softcap=0.5 (Gemma 2's logit cap, small enough to bend these scores), cross-attention."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      context=normal(rng, MB, MS, MM), options={"softcap": 0.5})


@case("module", "v2.scale.gqa")
def module_scale(rng, dtype):
    """scale=1.5 (three times the default 1/sqrt(D) = 1/2), causal self-attention with the
    weights returned: a module that keeps the default scale gives flatter weights."""
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      keywords={"is_causal": True, "return_weights": True},
                      options={"scale": 1.5})


@case("module", "v2.segments.packed.causal", LOW)
def module_segments(rng, dtype):
    """Packed prefill: self-attention over two documents per row (example 0: 2 + 3 tokens,
    example 1: 4 + 1), causal, with q_segment_ids = kv_segment_ids. A query of the second document
    sees only its own document's earlier tokens."""
    ids = np.array([[0, 0, 1, 1, 1], [3, 3, 3, 3, 7]])
    return ModuleCall(canonical(rng), normal(rng, MB, ML, MM), n_heads=H, n_kv_heads=K,
                      keywords={"is_causal": True, "return_weights": True},
                      q_segment_ids=ids, kv_segment_ids=ids)


@case("module", "v2.gpt_oss_like.rope_window_sinks")
def module_gpt_oss_like(rng, dtype):
    """Every setting of a gpt-oss sliding layer at once: RoPE (theta 100), window=(1, 0), sinks,
    GQA 6:2, causal, with the weights returned."""
    return ModuleCall(_with_sinks(rng, canonical(rng)), normal(rng, MB, ML, MM), n_heads=H,
                      n_kv_heads=K, keywords={"is_causal": True, "return_weights": True},
                      options={"rope_theta": 100.0, "window": [1, 0]})


@case("decode", "v2.window.gqa")
def decode_window(rng, dtype):
    """KV-cache decoding with window=(1, 0), GQA 6:2: a new token attends itself and one token
    before, fed token by token and in chunks into a plain cache (which masks the rest) and into
    a rolling cache of 2 slots (whose chunk of 2 attends its one kept token, then the chunk)."""
    return ModuleCall(canonical(rng), normal(rng, MB, DECODE_T, MM), n_heads=H, n_kv_heads=K,
                      keywords={"is_causal": True}, options={"window": [1, 0]})


@case("decode", "v2.window_sinks_alibi_softcap.mha")
def decode_window_sinks_alibi(rng, dtype):
    """MultiHeadAttention with window=(2, 0), sinks, ALiBi and softcap 2.0, decoded through plain
    and rolling (3-slot) caches: ALiBi's distance is the absolute position's, which a rolling
    cache keeps (bottom-right diagonal over the keys it gives the new tokens)."""
    return ModuleCall(_with_sinks(rng, canonical(rng, k=H)), normal(rng, MB, DECODE_T, MM),
                      n_heads=H, n_kv_heads=H, cls="MultiHeadAttention",
                      keywords={"is_causal": True},
                      options={"window": [2, 0], "alibi": True, "softcap": 2.0})


# -- errors --------------------------------------------------------------------------------------


@module_error_case("rolling_cache_without_window", "ConfigError", "rolling_cache")
def err_rolling_cache_without_window() -> ModuleErrorCall:
    """init_cache(..., rolling=True) for a module without a window: there is no window size to
    keep, so no rolling cache (never a silent plain cache)."""
    call = decode([1], max_len=6)
    call.decode["rolling"] = True
    return call


@module_error_case("paged_cache_rolling", "ConfigError", "paged_cache")
def err_paged_cache_rolling() -> ModuleErrorCall:
    """init_cache(..., rolling=True, page_size=2): a KV cache is rolling or paged, not both
    (contract v3's paged cache keeps every token)."""
    call = decode([1], max_len=6)
    call.decode |= {"rolling": True, "page_size": 2}
    return call


@module_error_case("paged_cache_weights", "ConfigError", "paged_cache")
def err_paged_cache_weights() -> ModuleErrorCall:
    """decode(..., return_weights=True) on a paged cache: it runs paged_attention, which gives
    no weights (never a silent plain-cache fallback)."""
    call = decode([2], max_len=6)
    call.decode["page_size"] = 2
    call.keywords["return_weights"] = True
    return call


@module_error_case("construct_window_negative", "ConfigError", "window_value")
def err_construct_window() -> ModuleErrorCall:
    """GroupedQueryAttention(24, 6, 2, window=(-1, 0)): a window side is an int >= 0 or None."""
    return construct("GroupedQueryAttention", d_model=24, n_heads=6, n_kv_heads=2, window=[-1, 0])


@module_error_case("construct_sinks_flag", "ConfigError", "not_a_bool")
def err_construct_sinks_flag() -> ModuleErrorCall:
    """sinks="yes": a module flag must be a bool."""
    return construct("GroupedQueryAttention", d_model=24, n_heads=6, n_kv_heads=2, sinks="yes")


@module_error_case("construct_softcap_zero", "ConfigError", "softcap_not_positive")
def err_construct_softcap() -> ModuleErrorCall:
    """softcap=0.0 for a module: the functional API's rule, at construction."""
    return construct("GroupedQueryAttention", d_model=24, n_heads=6, n_kv_heads=2, softcap=0.0)
