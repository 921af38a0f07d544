"""The attention contract's shared, framework-free pieces.

The error taxonomy, shape/dtype validation and the causal-alignment rule of SEMANTICS.md.
``impl_numpy``, ``impl_torch`` and ``impl_jax`` all call this package before any arithmetic,
handing it their arrays as they are (it reads ``.shape`` and ``.dtype`` through one adapter,
:func:`describe`); it imports no array framework and reads nothing of the machine.

One module per concern: ``arrays`` (the adapter), ``keywords`` (flags, scalars, the window, the
causal alignment), ``validate`` (the keyword table and :func:`check_attention`), ``call`` (what it
returns, :class:`AttentionCall`), ``tiling`` (block sizes), ``rules`` (the allowed-position
rules), ``modules`` (a module's sizes, settings and inputs), ``weights`` (the canonical
weights), ``cache`` (the KV cache), ``rotary``, ``grads``, ``sharded``, ``varlen`` (packed
variable-length calls), ``errors``.

**The stable API** for ports (conformance/PORTING.md, "The attention_spec API") is
:data:`PUBLIC_API`, at version :data:`API_VERSION`: a change to one of these names keeps the
old call working, with a ``DeprecationWarning``, for at least one minor version. The other names
here serve this project's own implementations and may change with them.

Shape letters: B batch, H query heads, K key/value heads (G = H // K), L query length,
S key/value length, D query/key head dim, E value head dim, M model width.
"""

from attention_spec.arrays import (
    FLOAT_DTYPES,
    SUPPORTED_DTYPES,
    ArraySpec,
    broadcast_shapes,
    check_dtype,
    check_float64,
    check_given,
    compute_dtype,
    describe,
    dtype_name,
    format_dims,
)
from attention_spec.cache import check_cache_size, check_decode_inputs
from attention_spec.call import AttentionCall, AttentionDims, Keywords
from attention_spec.errors import (
    ERROR_CODES,
    FP8_ERROR_CODES,
    MODULE_ERROR_CODES,
    PAGED_ERROR_CODES,  # paged key/value caches (Contract v3)
    ROTARY_ERROR_CODES,
    SHARDED_ERROR_CODES,
    VARLEN_ERROR_CODES,
    AttentionError,
    ConfigError,
    DimensionMismatchError,
    DTypeError,
    MaskError,
    make_error,
)
from attention_spec.fp8 import (
    FP8_DTYPES,
    FP8_MAX,
    FP8_QUERY_DTYPES,
    MIN_DESCALE,
    QuantizeCall,
    check_descale,
    check_fp8_dtypes,
    check_quantize_fp8,
    is_fp8,
    output_dtype,
)
from attention_spec.grads import AttentionGrads, check_grad_output
from attention_spec.keywords import (
    ALIGNMENTS,
    causal_offset,
    check_alignment,
    check_causal_mask_args,
    check_config,
    check_flag,
    check_size,
    check_window,
    real_keyword,
)
from attention_spec.modules import (
    ModuleDims,
    check_module_config,
    check_module_inputs,
    module_dtype,
)
from attention_spec.paged import (
    PAGED_BLOCK_K,
    PagedCall,
    SequencePages,
    check_paged_attention,
    check_paged_cache_write,
    paged_block_k,
    pages_needed,
    sequence_pages,
)
from attention_spec.rotary import (
    RopeConfig,
    RotaryDims,
    check_rope_config,
    check_rotary,
    rotary_frequencies,
)
from attention_spec.rules import alibi_slope_values
from attention_spec.tiling import BLOCK_K, BLOCK_Q, check_block_sizes, tiled_blocks
from attention_spec.validate import (
    ARRAY_KEYWORDS,
    KEYWORDS,
    NO_VALUE,
    Keyword,
    call_keywords,
    check_attention,
)
from attention_spec.varlen import (
    VarlenCall,
    check_varlen,
    check_varlen_grad_output,
    sequence_bounds,
)
from attention_spec.weights import check_canonical

#: The version of :data:`PUBLIC_API`. 1.0: PORTING.md of 2026-11-30 (the checks took shapes and
#: dtype names); 1.1: the checks take the arrays (or :class:`ArraySpec`), ``check_attention``
#: returns an :class:`AttentionCall`, and 1.0's forms still work, with a ``DeprecationWarning``.
API_VERSION = "1.1"

#: The stable API: what conformance/PORTING.md offers ports, by name.
PUBLIC_API: tuple[str, ...] = (
    # the attention call
    "check_attention",
    "NO_VALUE",
    "ArraySpec",
    "AttentionCall",
    "AttentionDims",
    "causal_offset",
    "check_causal_mask_args",
    "check_flag",
    "check_block_sizes",
    # rotary positions
    "check_rope_config",
    "check_rotary",
    # the modules (also importable from attention_spec.modules)
    "ModuleDims",
    "module_dtype",
    "check_module_config",
    "check_canonical",
    "check_module_inputs",
    "check_cache_size",
    "check_decode_inputs",
    # gradients
    "AttentionGrads",
    # the error taxonomy
    "AttentionError",
    "ConfigError",
    "DimensionMismatchError",
    "DTypeError",
    "MaskError",
    "make_error",
    "ERROR_CODES",
    "MODULE_ERROR_CODES",
    "ROTARY_ERROR_CODES",
    "SHARDED_ERROR_CODES",
    # the version
    "API_VERSION",
    "PUBLIC_API",
)

#: Everything this package offers: :data:`PUBLIC_API` and the names its implementations use.
__all__ = [
    "ALIGNMENTS",
    "API_VERSION",
    "ARRAY_KEYWORDS",
    "BLOCK_K",
    "BLOCK_Q",
    "ERROR_CODES",
    "FLOAT_DTYPES",
    "FP8_DTYPES",
    "FP8_ERROR_CODES",
    "FP8_MAX",
    "FP8_QUERY_DTYPES",
    "KEYWORDS",
    "MIN_DESCALE",
    "MODULE_ERROR_CODES",
    "NO_VALUE",
    "PAGED_BLOCK_K",
    # paged key/value caches (Contract v3)
    "PAGED_ERROR_CODES",
    "PUBLIC_API",
    "ROTARY_ERROR_CODES",
    "SHARDED_ERROR_CODES",
    "SUPPORTED_DTYPES",
    "VARLEN_ERROR_CODES",
    "ArraySpec",
    "AttentionCall",
    "AttentionDims",
    "AttentionError",
    "AttentionGrads",
    "ConfigError",
    "DTypeError",
    "DimensionMismatchError",
    "Keyword",
    "Keywords",
    "MaskError",
    "ModuleDims",
    "PagedCall",
    "QuantizeCall",
    "RopeConfig",
    "RotaryDims",
    "SequencePages",
    "VarlenCall",
    "alibi_slope_values",
    "broadcast_shapes",
    "call_keywords",
    "causal_offset",
    "check_alignment",
    "check_attention",
    "check_block_sizes",
    "check_cache_size",
    "check_canonical",
    "check_causal_mask_args",
    "check_config",
    "check_decode_inputs",
    "check_descale",
    "check_dtype",
    "check_flag",
    "check_float64",
    "check_fp8_dtypes",
    "check_given",
    "check_grad_output",
    "check_module_config",
    "check_module_inputs",
    "check_paged_attention",
    "check_paged_cache_write",
    "check_quantize_fp8",
    "check_rope_config",
    "check_rotary",
    "check_size",
    "check_varlen",
    "check_varlen_grad_output",
    "check_window",
    "compute_dtype",
    "describe",
    "dtype_name",
    "format_dims",
    "is_fp8",
    "make_error",
    "module_dtype",
    "output_dtype",
    "paged_block_k",
    "pages_needed",
    "real_keyword",
    "rotary_frequencies",
    "sequence_bounds",
    "sequence_pages",
    "tiled_blocks",
]
