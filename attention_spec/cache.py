"""The KV cache's checks: its size, its buffers, and a cached forward's inputs (SEMANTICS.md,
"Modules", the KV cache; "Rolling KV cache").

A cache holds ``key (B, K, T, D)`` and ``value (B, K, T, E)`` buffers: T is ``max_len`` for a
preallocated cache, the tokens so far for one that grows, and ``min(left + 1, max_len)`` slots
for a rolling cache of a module whose window has left side ``left``. Nothing is written before
:func:`check_decode_inputs` returns, so on any error the cache is unchanged.

Shape letters: B batch, H query heads, K key/value heads, L new tokens, S keys attended
(position + L), T cache slots, D query/key head dim, E value head dim, M model width.
"""

from __future__ import annotations

from typing import Any

from attention_spec.arrays import ArraySpec, check_given, describe, dtype_name
from attention_spec.call import AttentionCall
from attention_spec.deprecated import ARRAY_KEYWORDS_1_0, masks_1_0, spec_1_0, warn_1_0
from attention_spec.errors import make_error
from attention_spec.fp8 import FP8_DTYPES, check_descale, check_fp8_dtypes, is_fp8
from attention_spec.keywords import check_flag, check_size
from attention_spec.modules import ModuleDims, check_sequence
from attention_spec.validate import check_attention
from attention_spec.varlen import _check_cu_seqlens

__all__ = [
    "check_cache_dtype", "check_cache_size", "check_decode_inputs", "check_paged_decode_inputs",
    "check_prefill_inputs",
]


def check_cache_size(
    batch_size: int,
    max_len: int,
    *,
    rolling: object = False,
    left: int | None = None,
    page_size: int | None = None,
) -> int:
    """Validate ``init_cache(batch_size, max_len, rolling=, page_size=)`` and return the
    buffers' length T: ``max_len`` for a plain cache, ``min(left + 1, max_len)`` slots for a
    rolling one (the window of one decoded token: itself and the ``left`` before it); a paged
    cache (``page_size`` given) returns ``max_len`` too (its pool holds ``batch_size *
    ceil(max_len / page_size)`` pages).

    Raises:
        ConfigError ``non_positive_size``; ``not_a_bool`` (rolling);
        ConfigError ``rolling_cache``: ``rolling=True`` for a module without a window's left side.
        ConfigError ``paged_cache``: ``rolling=True`` with a ``page_size``.
    """
    check_size("batch_size (B)", batch_size)
    check_size("max_len", max_len)
    rolling = check_flag("rolling", rolling)
    if page_size is not None:
        check_size("page_size", page_size)
        if rolling:
            raise make_error(
                "paged_cache",
                "a KV cache is rolling or paged, not both: a paged cache keeps every token "
                "(a window's keys are chosen by paged_attention). Pass rolling=True or "
                "page_size=, not both",
                expected="rolling=False with page_size, or page_size=None",
                actual=f"rolling=True, page_size={page_size}",
            )
        return int(max_len)
    if not rolling:
        return int(max_len)
    if left is None:
        raise make_error(
            "rolling_cache",
            "a rolling KV cache keeps the last left + 1 tokens of a sliding window; this module "
            "has no window with a bounded left side. Build it with window=(left, 0) (left an "
            "int >= 0), or use rolling=False",
            expected="a module with window=(left, ...), left an int >= 0",
            actual="window left side unbounded (None)",
        )
    return min(left + 1, int(max_len))


def check_cache_dtype(
    n_kv_heads: int,
    param_dtype: str,
    dtype: Any = None,
    *,
    k_descale: Any = None,
    v_descale: Any = None,
    fp8: bool = True,
) -> str:
    """Validate ``init_cache(..., dtype=, k_descale=, v_descale=)`` and return the name of the
    cache's dtype: the module's (``dtype`` None or the module's own), or an fp8 format
    (``"float8_e4m3fn"``, ``"float8_e5m2"``: keys and values stored in it, SEMANTICS.md of the
    project, "FP8 KV cache").

    ``k_descale``/``v_descale``: None (computed at the cache's first write) or the caller's,
    one for the cache's life: a real number or a float32 array of shape exactly ``()`` or
    ``(K,)``, finite and > 0 (vLLM's calibrated ``k_scale``/``v_scale``). ``fp8`` False: the
    module's cache has no fp8 form (``MultiHeadLatentAttention``).

    Raises:
        DTypeError ``unsupported_dtype``: ``dtype`` neither the module's nor an fp8 format;
        DTypeError ``fp8_combination``: an fp8 cache of a float64 module (the contract's fp8
        key/value with a float64 query);
        ConfigError ``fp8_cache``: an fp8 dtype where ``fp8`` is False;
        DTypeError ``descale_not_fp8``: a descale given without an fp8 dtype;
        DTypeError ``descale_dtype``, DimensionMismatchError ``descale_shape``, ConfigError
        ``descale_value``: a descale not float32, not ``()``/``(K,)``, not finite or <= 0.
    """
    name = param_dtype if dtype is None else dtype if isinstance(dtype, str) else dtype_name(dtype)
    if name not in (param_dtype, *FP8_DTYPES):
        raise make_error(
            "unsupported_dtype",
            f"a KV cache's dtype is the module's ({param_dtype}) or an fp8 format "
            f"{FP8_DTYPES}; got {name}",
            expected=" | ".join((param_dtype, *FP8_DTYPES)),
            actual=str(name),
        )
    if is_fp8(name) and not fp8:
        raise make_error(
            "fp8_cache",
            "this module's KV cache has no fp8 form: MultiHeadLatentAttention's latent cache "
            "holds c_kv and k_pe, which its absorbed decode multiplies by weights before the "
            "attention; leave dtype as None",
            expected="dtype=None",
            actual=f"dtype={name}",
        )
    if is_fp8(name):
        check_fp8_dtypes(param_dtype, name, name)  # a float64 module: fp8_combination
    text = f"() or (K={n_kv_heads},)"
    for key, given in (("k_descale", k_descale), ("v_descale", v_descale)):
        checked = check_descale(key, given, name, (n_kv_heads,), text)
        if isinstance(checked, ArraySpec) and checked.shape not in ((), (n_kv_heads,)):
            raise make_error(
                "descale_shape",
                f"an fp8 KV cache's {key} is one per key/value head, {text}; got {checked.shape}",
                expected=text,
                actual=str(checked.shape),
            )
    return name


def _check_cache(
    dims: ModuleDims, param_dtype: str, key: ArraySpec, value: ArraySpec, *, paged: bool = False
) -> None:
    """A KV cache's buffers are this module's: ``key (B, K, T, D)``, ``value (B, K, T, E)``, or
    with ``paged`` a pool's pages ``key (P, page_size, K, D)``, ``value (P, page_size, K, E)``."""
    owner, head = ("paged KV cache", 2) if paged else ("KV cache", 1)  # head: the K axis
    stored = key.dtype if is_fp8(key.dtype) else param_dtype  # an fp8 cache's, or the module's
    for name, spec, last in (("key", key, dims.D), ("value", value, dims.E)):
        letter = "D" if name == "key" else "E"
        want = f"(B, K={dims.K}, T, {letter}={last})"
        if paged:
            want = f"(P, page_size, K={dims.K}, {letter}={last})"
        if len(spec.shape) != 4 or spec.shape[head] != dims.K or spec.shape[3] != last:
            raise make_error(
                "cache_mismatch",
                f"the {owner}'s {name}{' pages' if paged else ''} must be {want} for this module "
                f"{dims}; got {spec.shape}. A cache belongs to the module that made it "
                "(init_cache)",
                expected=want,
                actual=str(spec.shape),
            )
        if spec.dtype != stored:
            raise make_error(
                "dtype_mismatch",
                f"the {owner}'s {name} dtype must be the module's ({param_dtype}), or for an fp8 "
                f"cache the key's ({stored}); got {spec.dtype}",
                expected=stored,
                actual=spec.dtype,
            )
    if is_fp8(stored):
        check_fp8_dtypes(param_dtype, stored, stored)  # a float64 module: fp8_combination
    if key.shape[:3] != value.shape[:3]:
        raise make_error(
            "cache_mismatch",
            f"the KV cache's key and value must share (B, K, T); got key {key.shape}, value "
            f"{value.shape}",
            expected=f"value (B={key.shape[0]}, K={key.shape[1]}, T={key.shape[2]}, E)",
            actual=str(value.shape),
        )


def check_decode_inputs(
    dims: ModuleDims,
    param_dtype: str,
    x: Any,
    *x_dtype_1_0: str,
    cache_key: Any = None,
    cache_value: Any = None,
    position: int,
    max_len: int,
    mask: Any = None,
    bias: Any = None,
    return_weights: object = False,
    q_segment_ids: Any = None,
    kv_segment_ids: Any = None,
    rolling: bool = False,
    left: int | None = None,
    **keywords_1_0: Any,
) -> AttentionCall:
    """Validate a cached forward before any projection or write: new tokens ``x (B, L, M)``
    into a KV cache whose buffers ``cache_key (B, K, T, D)`` and ``cache_value (B, K, T, E)``
    hold ``position`` of at most ``max_len`` tokens (T is the buffers' length: ``max_len`` for a
    preallocated cache, ``position`` for one that grows).

    The new queries attend to S = position + L keys with the bottom-right causal rule; mask and
    bias broadcast to ``(B, H, L, S)``, ``q_segment_ids`` to ``(B, L)`` and ``kv_segment_ids``
    to ``(B, S)`` (the segments of every token written so far, then of the new ones).

    ``rolling``: the cache is a rolling one (``init_cache(..., rolling=True)``) for a module
    whose window has left side ``left``: its buffers must have ``min(left + 1, max_len)`` slots
    (T), and it takes
    no mask, bias or segment ids (the keys it attends are not the whole sequence: SEMANTICS.md of
    the project, "Rolling KV cache"). Nothing is written before this returns, so on any error
    the cache is unchanged.

    Deprecated (API 1.0, removed in 2.0 at the earliest): ``check_decode_inputs(dims,
    param_dtype, x_shape, x_dtype, *, cache_batch, position, max_len, mask_shape=None,
    mask_dtype=None, bias_shape=None, bias_dtype=None)``, for a cache that grows (its buffers
    then hold ``position`` tokens); it warns (``DeprecationWarning``) and returns what the 1.1
    form returns for such a cache.

    Raises:
        the errors of :func:`check_module_inputs` for x, mask and bias;
        DimensionMismatchError ``cache_mismatch``: a cache of another module (K, D, E);
        DTypeError ``dtype_mismatch``: a cache of another dtype;
        DimensionMismatchError ``batch_not_broadcastable``: x's batch is not the cache's;
        ConfigError ``cache_overflow``: ``position + L > max_len`` (never a wrap or truncation);
        ConfigError ``rolling_cache``: a rolling cache with mask, bias or segment ids.
    """
    if x_dtype_1_0 or keywords_1_0:
        return _check_decode_inputs_1_0(
            dims, param_dtype, x, *x_dtype_1_0, position=position, max_len=max_len,
            return_weights=return_weights, **keywords_1_0,
        )
    check_flag("return_weights", return_weights)
    check_given(x=x, cache_key=cache_key, cache_value=cache_value)
    x = describe(x)
    check_sequence("x", x, dims, param_dtype)
    _check_cache(dims, param_dtype, describe(cache_key), describe(cache_value))
    if rolling:
        slots = check_cache_size(1, max_len, rolling=True, left=left)
        _check_rolling(describe(cache_key).shape[2], slots, mask=mask, bias=bias,
                       q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
    n_batch, new_len, _ = x.shape
    _check_batch_and_length(x.shape, describe(cache_key).shape[0], position, max_len)
    S = position + new_len
    stored = describe(cache_key).dtype  # the module's, or an fp8 cache's format
    fp8 = {"k_descale": None, "v_descale": None} if is_fp8(stored) else {}  # the cache's own
    return check_attention(
        ArraySpec((n_batch, dims.H, new_len, dims.D), param_dtype),  # q of the new tokens
        ArraySpec((n_batch, dims.K, S, dims.D), stored),  # k: cached and new
        ArraySpec((n_batch, dims.K, S, dims.E), stored),  # v
        mask=mask, bias=bias, causal_alignment="bottom_right",
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, **fp8,
    )


def _check_batch_and_length(
    x_shape: tuple[int, ...], cache_batch: int, position: int, max_len: int
) -> None:
    """x ``(B, L, M)`` has the cache's batch, and ``position + L`` fits ``max_len``."""
    n_batch, new_len, _ = x_shape
    if n_batch != cache_batch:
        raise make_error(
            "batch_not_broadcastable",
            f"x batch (B={n_batch}) must be the KV cache's (B={cache_batch}); got x {x_shape}",
            expected=f"B={cache_batch}",
            actual=f"B={n_batch}",
        )
    if position + new_len > max_len:
        raise make_error(
            "cache_overflow",
            f"the KV cache holds {position} of at most {max_len} tokens; writing {new_len} more "
            f"would need {position + new_len}. Create the cache with a larger max_len",
            expected=f"position + L <= max_len={max_len}",
            actual=f"{position} + {new_len} = {position + new_len}",
        )


def check_paged_decode_inputs(
    dims: ModuleDims,
    param_dtype: str,
    x: Any,
    *,
    key_pages: Any,
    value_pages: Any,
    batch_size: int,
    position: int,
    max_len: int,
    return_weights: object = False,
    **refused: Any,
) -> None:
    """Validate a decode step on a paged cache (``init_cache(..., page_size=)``) before any
    projection or write: new tokens ``x (B, L, M)`` into a pool ``key_pages (P, page_size, K,
    D)``, ``value_pages (P, page_size, K, E)`` of ``batch_size`` sequences holding ``position``
    of at most ``max_len`` tokens each.

    A paged decode goes through ``paged_attention``, which takes no mask, bias or segment ids
    and gives no weights: ``refused`` (mask, bias, q_segment_ids, kv_segment_ids) must be None
    and ``return_weights`` False.

    Raises:
        the errors of :func:`check_module_inputs` for x; ConfigError ``not_a_bool``;
        DimensionMismatchError ``cache_mismatch``, DTypeError ``dtype_mismatch``: a pool of
        another module; ConfigError ``paged_cache``: a refused keyword given;
        DimensionMismatchError ``batch_not_broadcastable``; ConfigError ``cache_overflow``.
    """
    weights = check_flag("return_weights", return_weights)
    check_given(x=x, key_pages=key_pages, value_pages=value_pages)
    x = describe(x)
    check_sequence("x", x, dims, param_dtype)
    _check_cache(dims, param_dtype, describe(key_pages), describe(value_pages), paged=True)
    given = [name for name, value in refused.items() if value is not None]
    given += ["return_weights=True"] if weights else []
    if given:
        raise make_error(
            "paged_cache",
            f"a paged KV cache's decode takes no {', '.join(given)}: it runs paged_attention, "
            "which reads every sequence's own keys by its block table (no mask, bias or ids) "
            "and gives no weights. Use a plain cache (no page_size) for them",
            expected="no mask, bias, segment ids or return_weights with a paged cache",
            actual=", ".join(given) + " given",
        )
    _check_batch_and_length(x.shape, batch_size, position, max_len)


def _check_decode_inputs_1_0(
    dims: ModuleDims,
    param_dtype: str,
    x_shape: tuple[int, ...],
    x_dtype: str,
    *,
    cache_batch: int,
    position: int,
    max_len: int,
    **keywords: Any,
) -> AttentionCall:
    """API 1.0's form of :func:`check_decode_inputs`: shapes and dtype names, and the cache as
    its batch size, for a cache whose buffers ``(B, K, position, D)`` and ``(B, K, position,
    E)`` grow by concatenation (PORTING.md's example of 2026-11-30)."""
    unknown = sorted(keywords.keys() - ARRAY_KEYWORDS_1_0 - {"return_weights"})
    if unknown:
        raise TypeError(f"check_decode_inputs() got an unexpected keyword argument {unknown[0]!r}")
    warn_1_0(
        "check_decode_inputs(dims, param_dtype, x_shape, x_dtype, cache_batch=..., ...)",
        "pass the arrays and the cache's buffers: check_decode_inputs(dims, param_dtype, x, "
        "cache_key=..., cache_value=..., position=..., max_len=..., mask=mask, ...)",
    )
    masks = masks_1_0(keywords)
    return check_decode_inputs(
        dims, param_dtype, spec_1_0(x_shape, x_dtype),
        cache_key=ArraySpec((cache_batch, dims.K, position, dims.D), param_dtype),
        cache_value=ArraySpec((cache_batch, dims.K, position, dims.E), param_dtype),
        position=position, max_len=max_len, **masks, **keywords,
    )


def _check_rolling(length: int, slots: int, **refused: Any) -> None:
    """A rolling cache has ``slots`` slots and takes none of ``refused`` (mask, bias, ids)."""
    if length != slots:
        raise make_error(
            "cache_mismatch",
            f"this rolling KV cache has {length} slots; this module's window needs {slots} "
            "(min(left + 1, max_len)). A cache belongs to the module that made it (init_cache)",
            expected=f"T={slots}",
            actual=f"T={length}",
        )
    given = [name for name, value in refused.items() if value is not None]
    if given:
        raise make_error(
            "rolling_cache",
            f"a rolling KV cache takes no {', '.join(given)}: it attends only the last window of "
            "the sequence, so a mask or ids over all its positions cannot be lined up with the "
            "keys it keeps. Use a plain cache (rolling=False) for padded or packed decoding",
            expected="no mask, bias or segment ids with a rolling cache",
            actual=", ".join(given) + " given",
        )


def check_prefill_inputs(
    dims: ModuleDims, param_dtype: str, x: Any, cu_seqlens: Any, *, is_causal: object = True
) -> int:
    """Validate a packed prefill ``module.prefill(x, cu_seqlens)`` before any projection: N
    sequences of different lengths packed into ``x (1, T, M)`` (one row, as Hugging Face's
    padding-free batches), sequence n being tokens ``cu_seqlens[n] .. cu_seqlens[n + 1] - 1``.
    Returns N.

    Raises:
        the errors of :func:`check_module_inputs` for x; ConfigError ``not_a_bool``;
        DimensionMismatchError ``batch_not_broadcastable``: x's batch is not 1;
        the ``cu_seqlens_*`` errors of ``varlen_attention`` (its values against T).
    """
    check_flag("is_causal", is_causal)
    check_given(x=x)
    x = describe(x)
    check_sequence("x", x, dims, param_dtype)
    if x.shape[0] != 1:
        raise make_error(
            "batch_not_broadcastable",
            f"a packed prefill takes its sequences in one row, x (1, T, M); got x {x.shape}. "
            "Concatenate them along L and pass their boundaries as cu_seqlens",
            expected="B=1",
            actual=f"B={x.shape[0]}",
        )
    n, _ = _check_cu_seqlens("cu_seqlens", cu_seqlens, x.shape[1], "T")
    return n
