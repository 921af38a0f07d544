"""The attention contract's shared, framework-free pieces.

The error taxonomy, shape/dtype validation and the causal-alignment rule of SEMANTICS.md.
``impl_numpy``, ``impl_torch`` and ``impl_jax`` all call this package before any arithmetic;
it imports no array framework.

Shape letters: B batch, H query heads, K key/value heads (G = H // K), L query length,
S key/value length, D query/key head dim, E value head dim, M model width.
"""

from attention_spec.errors import (
    ERROR_CODES,
    MODULE_ERROR_CODES,
    SHARDED_ERROR_CODES,
    AttentionError,
    ConfigError,
    DimensionMismatchError,
    DTypeError,
    MaskError,
)
from attention_spec.validate import (
    ALIGNMENTS,
    FLOAT_DTYPES,
    SUPPORTED_DTYPES,
    AttentionDims,
    broadcast_shapes,
    causal_offset,
    check_attention,
    check_block_sizes,
    check_causal_mask_args,
    check_config,
    format_dims,
)

#: The public names every implementation (and every port) exposes.
FUNCTIONAL_API: tuple[str, ...] = (
    "scaled_dot_product_attention",
    "attention_weights",
    "causal_mask",
)

__all__ = [
    "ALIGNMENTS",
    "ERROR_CODES",
    "FLOAT_DTYPES",
    "FUNCTIONAL_API",
    "MODULE_ERROR_CODES",
    "SHARDED_ERROR_CODES",
    "SUPPORTED_DTYPES",
    "AttentionDims",
    "AttentionError",
    "ConfigError",
    "DTypeError",
    "DimensionMismatchError",
    "MaskError",
    "broadcast_shapes",
    "causal_offset",
    "check_attention",
    "check_block_sizes",
    "check_causal_mask_args",
    "check_config",
    "format_dims",
]
