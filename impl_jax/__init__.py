"""JAX reference implementation of the attention contract (SEMANTICS.md)."""

from impl_jax.functional import (
    STATIC_ARGNAMES,
    attention_weights,
    causal_mask,
    scaled_dot_product_attention,
)

__all__ = ["STATIC_ARGNAMES", "attention_weights", "causal_mask", "scaled_dot_product_attention"]
