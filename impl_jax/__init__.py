"""JAX reference implementation of the attention contract (SEMANTICS.md)."""

from impl_jax.flash import STATIC_ARGNAMES as FLASH_STATIC_ARGNAMES
from impl_jax.flash import flash_attention, flash_attention_vjp, paged_flash_attention
from impl_jax.fp8 import quantize_fp8
from impl_jax.functional import (
    STATIC_ARGNAMES,
    alibi_slopes,
    attention_weights,
    causal_mask,
    scaled_dot_product_attention,
    scaled_dot_product_attention_vjp,
)
from impl_jax.mla import MultiHeadLatentAttention
from impl_jax.modules import GroupedQueryAttention, KVCache, MultiHeadAttention, padding_mask
from impl_jax.paged import paged_attention, paged_cache_write  # paged KV caches (v3)
from impl_jax.rotary import ROTARY_STATIC_ARGNAMES, apply_rotary
from impl_jax.varlen import (
    VARLEN_STATIC_ARGNAMES,
    varlen_attention,
    varlen_attention_vjp,
    varlen_flash_attention,
    varlen_flash_attention_vjp,
)

__all__ = [
    "FLASH_STATIC_ARGNAMES",
    "ROTARY_STATIC_ARGNAMES",
    "STATIC_ARGNAMES",
    "VARLEN_STATIC_ARGNAMES",
    "GroupedQueryAttention",
    "KVCache",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "alibi_slopes",
    "apply_rotary",
    "attention_weights",
    "causal_mask",
    "flash_attention",
    "flash_attention_vjp",
    "padding_mask",
    "paged_attention",
    "paged_cache_write",
    "paged_flash_attention",
    "quantize_fp8",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_vjp",
    "varlen_attention",
    "varlen_attention_vjp",
    "varlen_flash_attention",
    "varlen_flash_attention_vjp",
]
