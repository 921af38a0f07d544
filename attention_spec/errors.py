"""The error taxonomy shared by every implementation.

Every error derives from :class:`AttentionError` (a ``ValueError``), carries a stable
machine-readable ``code``, and says what was expected and what was given. The NumPy,
PyTorch and JAX implementations raise exactly these objects, built by the same
validation functions, so class, code and message are identical in all three.
"""

from __future__ import annotations

__all__ = [
    "ERROR_CODES",
    "FP8_ERROR_CODES",
    "MODULE_ERROR_CODES",
    "PAGED_ERROR_CODES",
    "ROTARY_ERROR_CODES",
    "SHARDED_ERROR_CODES",
    "VARLEN_ERROR_CODES",
    "AttentionError",
    "ConfigError",
    "DTypeError",
    "DimensionMismatchError",
    "MaskError",
]


class AttentionError(ValueError):
    """Base class of every error this project raises on bad input.

    Attributes:
        code: stable identifier of the rule that was broken (e.g. ``"heads_not_divisible"``).
        expected: what the rule asked for, as text (shapes use the letters of SEMANTICS.md).
        actual: what was given, as text.
    """

    def __init__(self, code: str, message: str, *, expected: str = "", actual: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.expected = expected
        self.actual = actual

    def __str__(self) -> str:
        return f"[{self.code}] {self.args[0]}"

    def __reduce__(self):  # keep pickling (pytest-xdist, multiprocessing) lossless
        return (_rebuild, (type(self), self.code, self.args[0], self.expected, self.actual))


def _rebuild(cls, code, message, expected, actual):
    return cls(code, message, expected=expected, actual=actual)


class DimensionMismatchError(AttentionError):
    """Head counts, head dims, lengths or batch dims that do not fit together."""


class MaskError(AttentionError):
    """A mask or bias of the wrong dtype or a shape that does not broadcast to (..., H, L, S)."""


class DTypeError(AttentionError):
    """query/key/value dtypes that differ, or a dtype outside float64/32/16 and bfloat16."""


class ConfigError(AttentionError):
    """A keyword with an invalid value: scale, softcap, causal alignment, sizes."""


#: Every code, the class that raises it, and one line on when. Tests and fixtures refer to
#: this table; adding a rule means adding a row here.
ERROR_CODES: dict[str, tuple[type[AttentionError], str]] = {
    "rank": (
        DimensionMismatchError,
        "query/key/value need at least 3 dims (..., heads, length, dim)",
    ),
    "heads_not_divisible": (
        DimensionMismatchError,
        "K key/value heads do not divide H query heads",
    ),
    "kv_heads_mismatch": (DimensionMismatchError, "key and value have different head counts"),
    "kv_length_mismatch": (DimensionMismatchError, "key and value have different lengths S"),
    "qk_head_dim_mismatch": (DimensionMismatchError, "query and key head dims D differ"),
    "batch_not_broadcastable": (DimensionMismatchError, "leading batch dims do not broadcast"),
    "model_width_mismatch": (DimensionMismatchError, "x or context last dim is not d_model M"),
    "weight_shape": (DimensionMismatchError, "canonical weights missing, extra or misshaped"),
    "d_model_not_divisible": (
        DimensionMismatchError,
        "d_model % n_heads != 0 and no head_dim given",
    ),
    "mask_dtype": (MaskError, "mask is not boolean"),
    "mask_shape": (MaskError, "mask does not broadcast to (..., H, L, S)"),
    "mask_kv_heads": (MaskError, "mask head axis has size K (neither 1 nor H)"),
    "bias_dtype": (MaskError, "bias is not floating point"),
    "bias_shape": (MaskError, "bias does not broadcast to (..., H, L, S)"),
    "bias_kv_heads": (MaskError, "bias head axis has size K (neither 1 nor H)"),
    "dtype_mismatch": (DTypeError, "query, key and value dtypes differ"),
    "unsupported_dtype": (DTypeError, "dtype outside float64, float32, float16, bfloat16"),
    "not_an_array": (DTypeError, "None where an array is required"),
    "scale_not_finite": (ConfigError, "scale is not a finite real number"),
    "scale_range": (ConfigError, "scale is not finite in the compute dtype"),
    "softcap_not_positive": (ConfigError, "softcap is not a finite number > 0"),
    "softcap_range": (ConfigError, "softcap outside [2**-64, 2**64]"),
    "not_a_bool": (ConfigError, "a flag (is_causal, return_weights, bias=) is not a bool"),
    "unknown_alignment": (ConfigError, "causal_alignment is not 'top_left' or 'bottom_right'"),
    "non_positive_size": (ConfigError, "a size that must be positive is not"),
    "cache_overflow": (ConfigError, "a KV-cache write past its max_len"),
    "window_value": (ConfigError, "window is not a pair of ints >= 0 or None"),
    "segment_ids_pair": (ConfigError, "only one of q_segment_ids / kv_segment_ids is given"),
    "segment_ids_dtype": (MaskError, "segment ids are not integers"),
    "segment_ids_shape": (MaskError, "segment ids do not broadcast to (..., L) / (..., S)"),
    "sinks_shape": (DimensionMismatchError, "sinks is not (H,)"),
    "sinks_dtype": (DTypeError, "sinks is not floating"),
    "alibi_shape": (DimensionMismatchError, "alibi_slopes is not (H,)"),
    "alibi_dtype": (DTypeError, "alibi_slopes is not floating"),
    "grad_output_shape": (DimensionMismatchError, "grad_output is not the output's shape"),
    "cache_mismatch": (
        DimensionMismatchError,
        "a KV cache whose heads K, head dims D/E or length do not fit the module",
    ),
    "rolling_cache": (
        ConfigError,
        "a rolling KV cache for a module without a window's left side, or given mask/bias/ids",
    ),
    # -- rotary position embedding (apply_rotary; modules with rope_theta) -------------------
    "rotary_dim": (ConfigError, "rotary_dim not an even integer in [2, D]"),
    "rope_theta": (
        ConfigError,
        "theta / rope_theta not a finite number > 0, or RoPE options without rope_theta",
    ),
    "positions_dtype": (DTypeError, "rotary positions are not integers"),
    "positions_shape": (
        DimensionMismatchError,
        "rotary positions do not broadcast to (..., L), the batch dims of x without heads",
    ),
    "length_not_divisible": (
        DimensionMismatchError,
        "ring attention: n_shards (2 n_shards for zigzag) does not divide L and S",
    ),
    "kv_heads_not_divisible": (
        DimensionMismatchError,
        "head-parallel attention: n_shards does not divide the K key/value heads",
    ),
    "unknown_layout": (ConfigError, "ring layout is not 'contiguous' or 'zigzag'"),
    "shard_devices": (
        ConfigError,
        "fewer JAX devices, or another number of torch ranks, than n_shards",
    ),
    # -- FP8 inputs (Contract v3; attention_spec/fp8.py) -------------------------------------
    "descale_shape": (
        DimensionMismatchError,
        "a descale does not broadcast to (..., H) / (..., K)",
    ),
    "descale_dtype": (DTypeError, "a descale array is not float32 (or a real number)"),
    "descale_not_fp8": (DTypeError, "a descale given for an input that is not fp8"),
    "descale_value": (ConfigError, "a descale is not finite or <= 0"),
    "axes_value": (ConfigError, "quantize_fp8 axes outside x's rank or repeated"),
    "fp8_combination": (DTypeError, "an fp8 combination of dtypes outside the two allowed"),
    "fp8_nonfinite": (ConfigError, "quantize_fp8 of an x that is not finite in float32"),
    # -- variable-length batches (Contract v3; attention_spec/varlen.py); paged_attention's
    #    cu_seqlens_q raises them too
    "cu_seqlens_dtype": (DTypeError, "cu_seqlens_q / cu_seqlens_k is not integer"),
    "cu_seqlens_value": (
        ConfigError,
        "cu_seqlens not starting at 0, decreasing, or not ending at the packed tokens T; or "
        "traced where a tiled path schedules its blocks from them (varlen, paged)",
    ),
    "cu_seqlens_count": (
        DimensionMismatchError,
        "cu_seqlens not one axis of N + 1 >= 1 entries, or q and k (or block_table, seq_lens) "
        "disagree on N",
    ),
    # -- paged key/value caches (Contract v3; attention_spec/paged.py)
    "block_table_dtype": (DTypeError, "block_table is not integer"),
    "seq_lens_dtype": (DTypeError, "seq_lens is not integer"),
    "slot_mapping_dtype": (DTypeError, "slot_mapping is not integer"),
    "seq_lens_value": (
        ConfigError,
        "seq_lens negative, L_n > seq_lens[n], or seq_lens[n] > max_pages * page_size; or "
        "traced where the tiled paged read schedules its blocks from them",
    ),
    "block_table_value": (ConfigError, "a page a sequence needs is outside [0, P)"),
    "page_shape": (
        DimensionMismatchError,
        "key and value caches disagree on P, page_size or K",
    ),
    "cache_write_shape": (
        DimensionMismatchError,
        "key/value to write disagree with the cache (K, D, E, dtype) or with slot_mapping's T",
    ),
    "slot_mapping_value": (
        ConfigError,
        "a slot outside [-1, P * page_size), or two tokens in one slot >= 0",
    ),
    # -- scaled rotary frequencies (apply_rotary's inv_freq= and attention_factor=) ----------
    "inv_freq_shape": (DimensionMismatchError, "rotary inv_freq is not (rotary_dim/2,)"),
    "inv_freq_dtype": (DTypeError, "rotary inv_freq is not floating"),
    "attention_factor": (ConfigError, "rotary attention_factor not a finite number > 0"),
    # -- multi-head latent attention (attention_spec/mla.py) ---------------------------------
    "mla_dims": (ConfigError, "an MLA size <= 0, an odd qk_rope_head_dim, or a bad rms_norm_eps"),
    # -- all-to-all sequence parallelism (Ulysses, USP; contract v3) --------------------------
    "ulysses_heads": (
        DimensionMismatchError,
        "Ulysses: n_shards does not divide the H query heads",
    ),
    "ulysses_length": (DimensionMismatchError, "Ulysses: n_shards does not divide L and S"),
    "ulysses_kv_heads": (
        DimensionMismatchError,
        "Ulysses: neither K % n_shards == 0 (split) nor n_shards % K == 0 (replicate)",
    ),
    "usp_shape": (
        DimensionMismatchError,
        "USP: ulysses_shards does not fit H or K, or u * r (2 u r zigzag) does not divide L and S",
    ),
    # -- the modules' paged KV cache (init_cache(..., page_size=); attention_spec/cache.py) -----
    "paged_cache": (
        ConfigError,
        "a paged KV cache asked to be rolling too, or its decode given mask/bias/ids/weights",
    ),
    # -- the modules' fp8 KV cache (init_cache(..., dtype="float8_*"); attention_spec/cache.py) --
    "fp8_cache": (
        ConfigError,
        "an fp8 KV cache asked of a module whose cache has none (MultiHeadLatentAttention)",
    ),
}


#: The codes only the modules raise (construction, forward input, weights, KV cache); every
#: other code belongs to the functional API.
MODULE_ERROR_CODES: frozenset[str] = frozenset(
    {"d_model_not_divisible", "model_width_mismatch", "weight_shape", "cache_overflow",
     "cache_mismatch", "rolling_cache", "mla_dims"}
    | {"paged_cache"}  # the modules' paged KV cache
    | {"fp8_cache"}  # the modules' fp8 KV cache
)

#: The codes of rotary position embedding: ``apply_rotary`` raises them (and ``rotary_dim``,
#: ``rope_theta`` a module built with ``rope_theta``); the attention functions never do.
ROTARY_ERROR_CODES: frozenset[str] = frozenset(
    {"rotary_dim", "rope_theta", "positions_dtype", "positions_shape",
     "inv_freq_shape", "inv_freq_dtype", "attention_factor"}
)

#: The codes only the sharded functions raise (``ring_attention``, ``head_parallel_attention``,
#: ``head_parallel_gqa`` in ``impl_*/sharded.py``); they also raise every functional code.
SHARDED_ERROR_CODES: frozenset[str] = frozenset(
    {"length_not_divisible", "kv_heads_not_divisible", "unknown_layout", "shard_devices"}
    # all-to-all sequence parallelism (ulysses_attention, usp_attention; contract v3)
    | {"ulysses_heads", "ulysses_length", "ulysses_kv_heads", "usp_shape"}
)


#: The codes of FP8 inputs: raised by scaled_dot_product_attention and attention_weights (the
#: descales, the dtype combination) and by quantize_fp8: the sdpa.error.fp8_* and
#: quantize.error.* fixtures (conformance/cases/fp8.py) and tests/test_fp8.py.
FP8_ERROR_CODES: frozenset[str] = frozenset(
    {"descale_shape", "descale_dtype", "descale_not_fp8", "descale_value", "axes_value",
     "fp8_combination", "fp8_nonfinite"}
)


#: The codes of variable-length batches: raised by varlen_attention and varlen_attention_vjp
#: (attention_spec/varlen.py), with every functional code of their arrays and keywords.
VARLEN_ERROR_CODES: frozenset[str] = frozenset(
    {"cu_seqlens_dtype", "cu_seqlens_value", "cu_seqlens_count"}
)
#: The codes of the paged key/value caches (``paged_attention``, ``paged_cache_write``);
#: the cu_seqlens codes are ``varlen_attention``'s too.
PAGED_ERROR_CODES: frozenset[str] = frozenset(
    {"cu_seqlens_dtype", "cu_seqlens_value", "cu_seqlens_count", "block_table_dtype",
     "seq_lens_dtype", "slot_mapping_dtype", "seq_lens_value", "block_table_value",
     "page_shape", "cache_write_shape", "slot_mapping_value"}
)


def make_error(code: str, message: str, *, expected: str = "", actual: str = "") -> AttentionError:
    """Build the error of the class registered for ``code``."""
    cls, _ = ERROR_CODES[code]
    return cls(code, message, expected=expected, actual=actual)
