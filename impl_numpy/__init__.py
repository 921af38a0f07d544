"""NumPy reference implementation of the attention contract (SEMANTICS.md)."""

from impl_numpy.flash import flash_attention
from impl_numpy.functional import attention_weights, causal_mask, scaled_dot_product_attention

__all__ = [
    "attention_weights",
    "causal_mask",
    "flash_attention",
    "scaled_dot_product_attention",
]
