"""PyTorch reference implementation of the attention contract (SEMANTICS.md)."""

from impl_torch.flash import flash_attention, flash_attention_vjp, paged_flash_attention
from impl_torch.fp8 import quantize_fp8
from impl_torch.functional import (
    alibi_slopes,
    attention_weights,
    causal_mask,
    scaled_dot_product_attention,
    scaled_dot_product_attention_vjp,
)
from impl_torch.mla import MultiHeadLatentAttention
from impl_torch.modules import GroupedQueryAttention, KVCache, MultiHeadAttention, padding_mask
from impl_torch.paged import paged_attention, paged_cache_write  # paged KV caches (v3)
from impl_torch.rotary import apply_rotary
from impl_torch.varlen import (
    varlen_attention,
    varlen_attention_vjp,
    varlen_flash_attention,
    varlen_flash_attention_vjp,
)

__all__ = [
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
