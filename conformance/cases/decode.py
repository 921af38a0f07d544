"""KV-cache decoding cases: any chunking of a sequence gives one full causal forward.

``@decode_case`` functions build a module and a sequence (self-attention, ``is_causal``) whose
golden is one full causal forward, fed to ``init_cache``/``decode`` token by token and in uneven
chunks: one fixture per chunking of :data:`DECODE_CHUNKINGS`, with the id
``decode.<name>.<chunking>.<dtype>``.
"""

from __future__ import annotations

from typing import Any

from conformance.cases.base import (
    ALL_DTYPES,
    MB,
    MM,
    H,
    K,
    ModuleCall,
    canonical,
    decode_case,
    normal,
)

#: How the runner feeds a decode case's sequence of T = 5 tokens to ``decode``, and the
#: ``max_len`` of its cache: token by token into a cache it fills exactly, and in uneven chunks
#: (a prefill of 2, one token, then 2 more attending to 3 cached ones) into a larger cache.
DECODE_CHUNKINGS: dict[str, dict[str, Any]] = {
    "tokens": {"chunks": [1, 1, 1, 1, 1], "max_len": 5},
    "chunks_2_1_2": {"chunks": [2, 1, 2], "max_len": 8, "return_weights": True},
}
DECODE_T = 5

#: The chunkings a decode case of a module with a window (a bounded left side) also gets, into
#: a rolling cache (``init_cache(..., rolling=True)``: ``min(left + 1, max_len)`` slots). No
#: weights: a rolling cache's step attends only the keys it kept, not the S of the full forward.
ROLLING_CHUNKINGS: dict[str, dict[str, Any]] = {
    "rolling.tokens": {"chunks": [1, 1, 1, 1, 1], "max_len": 5, "rolling": True},
    "rolling.chunks_2_1_2": {"chunks": [2, 1, 2], "max_len": 8, "rolling": True},
}

#: The chunkings the decode cases of :data:`PAGED_DECODE_CASES` also get, in float32, into a
#: paged cache (``init_cache(..., page_size=)``, contract v3): pages of 2 (the last one partial
#: at T = 5) token by token, and pages of 3 that the chunks straddle. No weights: a paged decode
#: gives none.
PAGED_CHUNKINGS: dict[str, dict[str, Any]] = {
    "paged.tokens": {"chunks": [1, 1, 1, 1, 1], "max_len": 5, "page_size": 2},
    "paged.chunks_2_1_2": {"chunks": [2, 1, 2], "max_len": 8, "page_size": 3},
}
#: The decode cases run on a paged cache too: GQA, RoPE with GQA, and a window with sinks,
#: ALiBi and softcap; and multi-head latent attention's absorbed decode on a paged latent
#: cache (FlashMLA's form: one head, key pages [c_kv, k_pe], value pages c_kv).
PAGED_DECODE_CASES = (
    "gqa.h6_k2", "rope.gqa.h6_k2", "v2.window_sinks_alibi_softcap.mha",
    "mla.q_lora", "mla.q_proj.yarn.sinks",
)
PAGED_DTYPE = "float32"


@decode_case("mha.h6", ALL_DTYPES)
def decode_mha(rng, dtype):
    """MultiHeadAttention, H = K = 6: the cache holds 6 key/value heads."""
    return ModuleCall(canonical(rng, k=H), normal(rng, MB, DECODE_T, MM), n_heads=H, n_kv_heads=H,
                      cls="MultiHeadAttention", keywords={"is_causal": True})


@decode_case("gqa.h6_k2", ALL_DTYPES)
def decode_gqa(rng, dtype):
    """GroupedQueryAttention 6:2: the cache holds K = 2 heads, a third of MHA's."""
    return ModuleCall(canonical(rng), normal(rng, MB, DECODE_T, MM), n_heads=H, n_kv_heads=K,
                      keywords={"is_causal": True})


@decode_case("mqa.h6_k1", ALL_DTYPES)
def decode_mqa(rng, dtype):
    """Multi-query attention: the cache holds one key/value head."""
    return ModuleCall(canonical(rng, k=1), normal(rng, MB, DECODE_T, MM), n_heads=H, n_kv_heads=1,
                      keywords={"is_causal": True})
