"""NumPy reference implementation of the attention contract (SEMANTICS.md)."""

from impl_numpy.flash import flash_attention, flash_attention_vjp
from impl_numpy.fp8 import quantize_fp8
from impl_numpy.functional import (
    alibi_slopes,
    attention_weights,
    causal_mask,
    scaled_dot_product_attention,
    scaled_dot_product_attention_vjp,
)
from impl_numpy.modules import GroupedQueryAttention, KVCache, MultiHeadAttention, padding_mask
from impl_numpy.rotary import apply_rotary

__all__ = [
    "GroupedQueryAttention",
    "KVCache",
    "MultiHeadAttention",
    "alibi_slopes",
    "apply_rotary",
    "attention_weights",
    "causal_mask",
    "flash_attention",
    "flash_attention_vjp",
    "padding_mask",
    "quantize_fp8",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_vjp",
]
