"""Multi-head, grouped-query and multi-query attention modules in NumPy: a plain class of arrays.

The same classes, methods, steps and comments as ``impl_torch/modules.py`` and
``impl_jax/modules.py``; only the idiom differs. Here a projection is a small :class:`Linear`
holding a ``kernel (in, out)`` and a ``bias (out,)`` array, initialized from a NumPy
``Generator``.

The attention itself is the functional API (``impl_numpy.functional``); a module only projects,
splits heads, calls it, merges heads and projects back:

    x (B, L, M)        --q_proj, split heads-->  q (B, H, L, D)
    context (B, S, M)  --k_proj, v_proj------->  k (B, K, S, D), v (B, K, S, E)
    (rope_theta given: apply_rotary(q), apply_rotary(k) at their positions)
    scaled_dot_product_attention(q, k, v, window=, softcap=, scale=, sinks=, alibi_slopes=)
                                             ->  (B, H, L, E)
    --merge heads--> (B, L, H*E) --o_proj--> y (B, L, M)

Decoding: ``init_cache`` makes a ``KVCache`` (``impl_numpy/cache.py``, importable from here
too) and ``decode`` appends the new tokens' keys and values to it, then attends.

Weights: the canonical flat dict of ``attention_spec.weights`` (``q_proj.kernel (M, H*D)``, ...,
``o_proj.bias (M,)``, and ``sinks (H,)`` for ``sinks=True``);
:meth:`GroupedQueryAttention.from_canonical` loads it,
:meth:`~GroupedQueryAttention.to_canonical` exports it, ``save``/``load`` write and read it as one
safetensors file. Initialization: every kernel and bias is drawn from ``U(-1/sqrt(in), 1/sqrt(in))``
with ``in`` the projection's input width (M for q/k/v, H*E for o), as torch's ``nn.Linear`` does.

Shape letters (SEMANTICS.md): B batch, H query heads, K key/value heads (G = H // K),
L query length, S key/value length, D query/key head dim, E value head dim, M model width.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import ml_dtypes  # registers bfloat16 with NumPy; the fp8 cache formats
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from attention_spec import alibi_slope_values, causal_offset, check_rope_config, compute_dtype
from attention_spec.cache import (
    check_cache_dtype,
    check_paged_decode_inputs,
    check_prefill_inputs,
)
from attention_spec.modules import (
    PROJECTIONS,
    check_attention_options,
    check_cache_size,
    check_canonical,
    check_decode_inputs,
    check_module_config,
    check_module_inputs,
    check_padding_mask_args,
    heads_from_metadata,
    module_dtype,
    options_from_metadata,
    weights_metadata,
)
from attention_spec.paged import pages_needed
from impl_numpy.cache import KVCache, PagedKVCache
from impl_numpy.functional import _asarray, attention_weights, scaled_dot_product_attention
from impl_numpy.paged import paged_attention
from impl_numpy.rotary import apply_rotary
from impl_numpy.varlen import varlen_attention

__all__ = [
    "GroupedQueryAttention", "KVCache", "Linear", "MultiHeadAttention", "PagedKVCache",
    "padding_mask",
]


def _memory_bytes() -> int | None:
    """This machine's physical memory in bytes, the bound ``check_module_config`` puts on a
    module's weights (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def padding_mask(lengths: np.ndarray, kv_len: int) -> np.ndarray:
    """Boolean ``(B, 1, 1, S)`` mask, True where key j < ``lengths[b]`` (a real, unpadded key).

    ``lengths`` is ``(B,)`` integers; a length >= S keeps every key, a length <= 0 masks every
    key (those query rows then give zeros). Broadcasts against ``(B, H, L, S)`` scores.
    """
    lengths = np.asarray(lengths)
    check_padding_mask_args(lengths, kv_len)
    j = np.arange(kv_len)  # (S,)
    return (j[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)


def _uniform(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, dtype) -> np.ndarray:
    """``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, drawn in float64 and rounded to ``dtype``."""
    bound = 1.0 / math.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


class Linear:
    """``y = x @ kernel + bias`` with ``kernel (in, out)``, ``bias (out,)`` or None."""

    def __init__(
        self, in_features: int, out_features: int, *, bias: bool, dtype, rng: np.random.Generator
    ) -> None:
        self.kernel = _uniform(rng, (in_features, out_features), in_features, dtype)
        self.bias = _uniform(rng, (out_features,), in_features, dtype) if bias else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = x @ self.kernel  # (..., out); ml_dtypes gives float32 for a bfloat16 matmul
        if self.bias is not None:
            y = y + self.bias
        return y.astype(x.dtype, copy=False)  # one rounding back to the input dtype


class GroupedQueryAttention:
    """Grouped-query attention: H query heads share K key/value heads (G = H // K per group).

    Query head h reads key/value head ``h // G``. MHA is K = H (:class:`MultiHeadAttention`),
    MQA is K = 1.

    Args:
        d_model: model width M (input and output features).
        n_heads: query heads H.
        n_kv_heads: key/value heads K; must divide H.
        head_dim: query/key head dim D, default ``d_model // n_heads`` (then M % H must be 0).
        value_head_dim: value head dim E, default D.
        bias: whether the four projections have biases.
        rope_theta: turns rotary position embedding on (None: off), with this base: queries and
            keys are rotated after the projections (``apply_rotary``); see ``_rotate``.
        rope_interleaved: RoPE pairs ``(x[2p], x[2p+1])`` instead of ``(x[p], x[p + R/2])``.
        rotary_dim: R, the leading features of each query/key head rotated (default D).
        rope_inv_freq: ``(R/2,)`` floating, the frequencies to rotate by instead of
            ``rope_theta ** (-2p / R)`` (Llama 3.1's ``llama3``, YaRN, linear scaling); None:
            theta's. As ``apply_rotary``'s ``inv_freq``.
        rope_attention_factor: multiplies cos and sin of queries and keys (YaRN's mscale), so
            the scores by its square; 1.0 is plain RoPE. As ``apply_rotary``'s
            ``attention_factor``.
        window: ``(left, right)``, the sliding window of every attention call (SEMANTICS.md v2,
            inclusive, on the causal alignment's diagonal); None: no window. ``(W - 1, 0)`` is
            Mistral's and Hugging Face's ``sliding_window=W``.
        sinks: a learned sink logit per query head, the weight ``sinks (H,)`` (gpt-oss),
            initialized to zeros.
        alibi: add ALiBi with ``alibi_slopes(H)`` (BLOOM, MPT).
        softcap: ``softcap * tanh(s / softcap)`` of the scores (Gemma 2); None: no cap.
        scale: the scores' scale (default ``1/sqrt(D)``; Gemma 2's ``query_pre_attn_scalar``).
        dtype: the weights' dtype (float64, float32, float16 or bfloat16); inputs must match it.
        rng: a NumPy ``Generator`` or a seed for ``np.random.default_rng`` (default 0).

    Raises:
        DimensionMismatchError, ConfigError, DTypeError: see ``check_module_config``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int,
        *,
        head_dim: int | None = None,
        value_head_dim: int | None = None,
        bias: bool = True,
        rope_theta: float | None = None,
        rope_interleaved: bool = False,
        rotary_dim: int | None = None,
        rope_inv_freq: np.ndarray | None = None,
        rope_attention_factor: float = 1.0,
        window: tuple[int | None, int | None] | None = None,
        sinks: bool = False,
        alibi: bool = False,
        softcap: float | None = None,
        scale: float | None = None,
        dtype: np.typing.DTypeLike = np.float32,
        rng: np.random.Generator | int = 0,
    ) -> None:
        dtype = np.dtype(module_dtype(dtype))
        dims = check_module_config(
            d_model, n_heads, n_kv_heads, head_dim, value_head_dim, bias=bias, dtype=dtype.name,
            sinks=sinks, memory_bytes=_memory_bytes(),
        )
        self.dims = dims
        self.rope = check_rope_config(
            rope_theta, rope_interleaved, rotary_dim, dims.D, rope_inv_freq, rope_attention_factor
        )  # or None
        self.options = check_attention_options(
            dtype.name, window=window, sinks=sinks, alibi=alibi, softcap=softcap, scale=scale
        )
        M, H, K, D, E = dims.M, dims.H, dims.K, dims.D, dims.E
        rng = np.random.default_rng(rng)
        self.q_proj = Linear(M, H * D, bias=bias, dtype=dtype, rng=rng)  # (M, H*D)
        self.k_proj = Linear(M, K * D, bias=bias, dtype=dtype, rng=rng)  # (M, K*D)
        self.v_proj = Linear(M, K * E, bias=bias, dtype=dtype, rng=rng)  # (M, K*E)
        self.o_proj = Linear(H * E, M, bias=bias, dtype=dtype, rng=rng)  # (H*E, M)
        self.sinks = np.zeros((H,), dtype) if dims.sinks else None  # (H,), learned

    @property
    def dtype(self) -> np.dtype:
        """The weights' dtype; inputs must have it."""
        return self.q_proj.kernel.dtype

    # -- the forward pass, in the steps a KV cache reuses ------------------------------------

    def _project_query(self, x: np.ndarray) -> np.ndarray:
        """``x (B, L, M)`` -> ``q (B, H, L, D)``; head h is features ``[h*D:(h+1)*D]``."""
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, self.dims.H, self.dims.D)  # (B, L, H, D)
        return q.transpose(0, 2, 1, 3)  # (B, H, L, D)

    def _project_key_value(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``context (B, S, M)`` -> ``k (B, K, S, D)``, ``v (B, K, S, E)``."""
        B, S, _ = context.shape
        k = self.k_proj(context).reshape(B, S, self.dims.K, self.dims.D)  # (B, S, K, D)
        v = self.v_proj(context).reshape(B, S, self.dims.K, self.dims.E)  # (B, S, K, E)
        return k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # (B, K, S, D), (B, K, S, E)

    def _rotate(self, q, k, q_start: int, k_start: int):
        """RoPE of the module's ``rope_theta`` (None: q and k unchanged): query i of
        ``q (B, H, L, D)`` at position ``q_start + i``, key j of ``k (B, K, S, D)`` at
        ``k_start + j``."""
        if self.rope is None:
            return q, k
        L, S = q.shape[2], k.shape[2]
        rope = self._rope_keywords()  # theta, rotary_dim, interleaved, factor, inv_freq
        q = apply_rotary(q, q_start + np.arange(L), **rope)  # (B, H, L, D)
        k = apply_rotary(k, k_start + np.arange(S), **rope)  # (B, K, S, D)
        return q, k

    def _rope_keywords(self) -> dict:
        """``apply_rotary``'s keywords for the module's RoPE: its theta, rotary_dim, interleaved
        and attention_factor, and ``inv_freq``: None (theta's frequencies) or the module's
        ``rope_inv_freq (R/2,)`` in float64."""
        r = self.rope
        inv_freq = None if r.inv_freq is None else np.asarray(r.inv_freq, np.float64)
        return r.keywords() | {"inv_freq": inv_freq}

    def _option_keywords(self) -> dict:
        """The module's options as the functional API's keywords: ``window``, ``softcap``,
        ``scale``, the ``sinks (H,)`` weight, ALiBi's ``alibi_slopes(H)`` in the compute dtype."""
        o = self.options
        slopes = None
        if o.alibi:
            slopes = np.asarray(alibi_slope_values(self.dims.H), compute_dtype(self.dtype.name))
        return dict(
            window=o.window, softcap=o.softcap, scale=o.scale, sinks=self.sinks, alibi_slopes=slopes
        )

    # The name sharded.py calls until it calls _option_keywords (a change of that file).

    def _attend(self, q, k, v, *, return_weights: bool, **keywords):
        """The functional API on the projected heads: output ``(B, H, L, E)``, weights or None.

        The output always comes from ``scaled_dot_product_attention``; the weights, when asked,
        from ``attention_weights`` with the same arguments. Both run the functional API's one
        implementation of steps 1-6, so the module holds no attention arithmetic of its own.
        """
        keywords |= self._option_keywords()
        out = scaled_dot_product_attention(q, k, v, **keywords)  # (B, H, L, E)
        keywords.pop("v_descale", None)  # an fp8 cache's: the weights read no value
        weights = attention_weights(q, k, **keywords) if return_weights else None  # (B, H, L, S)
        return out, weights

    def _project_output(self, out: np.ndarray) -> np.ndarray:
        """``out (B, H, L, E)`` -> ``(B, L, M)``: merge heads (head h -> ``[h*E:(h+1)*E]``)."""
        B, H, L, E = out.shape
        merged = out.transpose(0, 2, 1, 3).reshape(B, L, H * E)  # (B, L, H*E)
        return self.o_proj(merged)  # (B, L, M)

    def __call__(
        self,
        x: np.ndarray,
        context: np.ndarray | None = None,
        *,
        mask: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        is_causal: bool = False,
        causal_alignment: str = "top_left",
        return_weights: bool = False,
        q_segment_ids: np.ndarray | None = None,
        kv_segment_ids: np.ndarray | None = None,
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Attend from ``x (B, L, M)`` to ``context (B, S, M)`` (default: x itself).

        Args:
            x: the queries' input ``(B, L, M)``, in the module's dtype.
            context: the keys' and values' input ``(B, S, M)`` (cross-attention); None for
                self-attention (S = L).
            mask, bias, is_causal, causal_alignment: as in the functional API, broadcastable to
                ``(B, H, L, S)``; e.g. ``mask=padding_mask(lengths, S)``.
            return_weights: also return the attention weights ``(B, H, L, S)`` of every head.
            q_segment_ids, kv_segment_ids: integers broadcastable to ``(B, L)`` and ``(B, S)``,
                both or neither (packed sequences: a query attends only keys of its segment).

        The module's window, sinks, ALiBi, softcap and scale apply to every call.
        Returns the output ``(B, L, M)``, or ``(output, weights)`` when ``return_weights``.
        """
        x, context, mask, bias = _asarray(x), _asarray(context), _asarray(mask), _asarray(bias)
        q_segment_ids, kv_segment_ids = _asarray(q_segment_ids), _asarray(kv_segment_ids)
        check_module_inputs(
            self.dims, self.dtype.name, x, context, mask=mask, bias=bias, is_causal=is_causal,
            causal_alignment=causal_alignment, return_weights=return_weights,
            q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
        )
        # 1. projections: queries from x, keys and values from the context (x itself if None).
        q = self._project_query(x)  # (B, H, L, D)
        k, v = self._project_key_value(x if context is None else context)  # (B, K, S, D|E)
        #    RoPE: query i at i + offset (the causal alignment's diagonal: 0 for self-attention,
        #    S - L for bottom_right), key j at j.
        q, k = self._rotate(q, k, causal_offset(q.shape[2], k.shape[2], causal_alignment), 0)
        # 2. attention of every head: the functional API (query head h reads kv head h // G).
        out, weights = self._attend(
            q, k, v, mask=mask, bias=bias, is_causal=is_causal,
            causal_alignment=causal_alignment, return_weights=return_weights,
            q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
        )
        # 3. heads merged back, output projection.
        y = self._project_output(out)  # (B, L, M)
        return (y, weights) if return_weights else y

    # -- KV-cache decoding ---------------------------------------------------------------------

    def _stored_dtype(self, name: str) -> np.dtype:
        """The cache buffers' dtype for ``check_cache_dtype``'s name: the module's, or fp8."""
        return self.dtype if name == self.dtype.name else np.dtype(getattr(ml_dtypes, name))

    def _cache_descale(self, descale: np.ndarray | float | None) -> np.ndarray | None:
        """A given cache descale (a number or ``(K,)``) as the cache holds it, ``(K,)`` float32
        (None: computed at the first write)."""
        if descale is None:
            return None
        return np.broadcast_to(np.asarray(descale, np.float32), (self.dims.K,)).copy()  # (K,)

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        rolling: bool = False,
        page_size: int | None = None,
        dtype: np.typing.DTypeLike | None = None,
        k_descale: np.ndarray | float | None = None,
        v_descale: np.ndarray | float | None = None,
    ) -> KVCache | PagedKVCache:
        """An empty cache for ``batch_size`` sequences of up to ``max_len`` tokens (K heads).

        ``rolling=True`` (a module with ``window=(left, ...)``): a ring of
        T = ``min(left + 1, max_len)`` slots instead of ``max_len``, T/max_len of the bytes,
        whatever the sequence's length (see :class:`KVCache`).

        ``page_size`` given: a :class:`PagedKVCache`, a pool of ``B * ceil(max_len /
        page_size)`` pages of ``page_size`` slots that the sequences take as they grow;
        ``decode`` reads it through ``paged_attention``.

        ``dtype`` ``"float8_e4m3fn"`` or ``"float8_e5m2"`` (None: the module's dtype): keys and
        values stored in that fp8 format (plain, rolling or paged), quantized on write with one
        descale per key/value head, ``(K,)`` float32, for the cache's life: ``k_descale`` and
        ``v_descale`` (a number or ``(K,)``, vLLM's calibrated ``k_scale``/``v_scale``), or, when
        None, computed at the first write from that write's keys and values (``quantize_fp8``'s
        dynamic rule over (B, L, D)), then fixed: later tokens beyond that range saturate at the
        format's max. ``decode`` passes them to the attention (SEMANTICS.md of the project, "FP8
        KV cache"); its output is in the module's dtype.

        Raises:
            DTypeError ``unsupported_dtype`` (dtype neither the module's nor fp8),
            ``fp8_combination`` (an fp8 cache of a float64 module), ``descale_not_fp8`` (a
            descale without an fp8 dtype), ``descale_dtype``; DimensionMismatchError
            ``descale_shape`` (not ``()`` or ``(K,)``); ConfigError ``descale_value``.
        """
        T = check_cache_size(
            batch_size, max_len, rolling=rolling, left=self.options.left, page_size=page_size
        )
        stored = check_cache_dtype(
            self.dims.K, self.dtype.name, dtype, k_descale=k_descale, v_descale=v_descale
        )  # the module's dtype name, or an fp8 format's
        dtype = self._stored_dtype(stored)
        k_descale, v_descale = self._cache_descale(k_descale), self._cache_descale(v_descale)
        B, K, D, E = batch_size, self.dims.K, self.dims.D, self.dims.E
        if page_size is not None:
            P = B * pages_needed(max_len, page_size)
            shape = (P, page_size, K, D)
            key = np.zeros(shape, dtype)  # (P, page_size, K, D)
            shape = (P, page_size, K, E)
            value = np.zeros(shape, dtype)  # (P, page_size, K, E)
            return PagedKVCache(key, value, ((),) * B, tuple(range(P)), max_len, 0,
                                k_descale, v_descale)
        shape = (B, K, T, D)
        key = np.zeros(shape, dtype)  # (B, K, T, D)
        shape = (B, K, T, E)
        value = np.zeros(shape, dtype)  # (B, K, T, E)
        return KVCache(key, value, 0, max_len if rolling else None, k_descale, v_descale)

    def decode(
        self,
        x: np.ndarray,
        cache: KVCache,
        *,
        mask: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        return_weights: bool = False,
        q_segment_ids: np.ndarray | None = None,
        kv_segment_ids: np.ndarray | None = None,
    ) -> tuple:
        """Self-attention of new tokens ``x (B, L, M)`` over the cache and themselves.

        One token (decoding) or several (chunked prefill): their keys and values are appended to
        the cache, then the L new queries attend to all S = position + L keys with the
        bottom-right causal rule (new token i sees every cached token and new tokens 0..i) and
        the module's window (only the last ``left + 1`` positions). A rolling cache gives the
        new queries its last ``min(position, left)`` tokens, then the L new ones, with the same
        rules (S = that count + L). Decoding a sequence in any chunking gives the outputs of one
        causal forward over it.

        Args:
            x: the new tokens ``(B, L, M)``, in the module's dtype; B is the cache's batch.
            cache: from :meth:`init_cache` or a previous call.
            mask, bias: broadcastable to ``(B, H, L, S)``, e.g. a padding mask over the S keys.
            return_weights: also return the attention weights ``(B, H, L, S)``.
            q_segment_ids, kv_segment_ids: ``(B, L)`` of the new tokens, ``(B, S)`` of every
                token so far (packed prefill). A rolling cache takes no mask, bias or ids.

        Returns ``(y, cache)``: the output ``(B, L, M)`` and the cache holding ``position + L``
        tokens; ``(y, weights, cache)`` when ``return_weights``.

        A paged cache (``init_cache(..., page_size=)``) gives the same outputs through
        ``paged_attention`` (:meth:`_decode_paged`); it takes no mask, bias, ids or weights.
        An fp8 cache (``init_cache(..., dtype="float8_e4m3fn")``) is the same step: the new
        keys (rotated) and values quantized on write at the cache's descales, fixed at its first
        write, and read by the same attention call with ``k_descale``/``v_descale``; the output
        stays in the module's dtype.

        Raises:
            ConfigError ``cache_overflow``: ``position + L > max_len`` (never a wrap or a
                truncation).
        """
        x, mask, bias = _asarray(x), _asarray(mask), _asarray(bias)
        q_segment_ids, kv_segment_ids = _asarray(q_segment_ids), _asarray(kv_segment_ids)
        if isinstance(cache, PagedKVCache):
            return self._decode_paged(
                x, cache, mask=mask, bias=bias, return_weights=return_weights,
                q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
            )
        check_decode_inputs(
            self.dims, self.dtype.name, x, cache_key=cache.key, cache_value=cache.value,
            position=cache.position, max_len=cache.max_len, mask=mask, bias=bias,
            return_weights=return_weights, q_segment_ids=q_segment_ids,
            kv_segment_ids=kv_segment_ids, rolling=cache.rolling, left=self.options.left,
        )
        # 1. projections of the new tokens: their queries, keys and values.
        q = self._project_query(x)  # (B, H, L, D)
        k_new, v_new = self._project_key_value(x)  # (B, K, L, D), (B, K, L, E)
        #    RoPE: new token i at cache.position + i; the cache keeps the rotated keys.
        q, k_new = self._rotate(q, k_new, cache.position, cache.position)
        # 2. the cache: the new keys and values written at position .. position + L - 1 (an fp8
        #    cache: quantized with its descales, fixed at its first write); the keys attended:
        #    all S = position + L (a rolling cache: its last min(position, left), then the L
        #    new ones).
        cache, k, v = cache.append(k_new, v_new)  # (B, K, S, D), (B, K, S, E)
        # 3. attention over the S keys, bottom-right causal: new token i sees the cache and
        #    0..i, within the module's window; an fp8 cache's keys and values read with its
        #    descales (None: the module's dtype).
        out, weights = self._attend(
            q, k, v, mask=mask, bias=bias, is_causal=True, causal_alignment="bottom_right",
            return_weights=return_weights, q_segment_ids=q_segment_ids,
            kv_segment_ids=kv_segment_ids, k_descale=cache.k_descale, v_descale=cache.v_descale,
        )
        # 4. heads merged back, output projection.
        y = self._project_output(out)  # (B, L, M)
        return (y, weights, cache) if return_weights else (y, cache)

    def _decode_paged(self, x: np.ndarray, cache: PagedKVCache, **refused) -> tuple:
        """:meth:`decode` on a paged cache: ``(y (B, L, M), cache)``, the new tokens written
        into the sequences' pages, then ``paged_attention`` over each sequence's pages."""
        check_paged_decode_inputs(
            self.dims, self.dtype.name, x, key_pages=cache.key_pages,
            value_pages=cache.value_pages, batch_size=len(cache.pages),
            position=cache.position, max_len=cache.max_len, **refused,
        )
        B, L, _ = x.shape
        # 1. projections of the new tokens: their queries, keys and values.
        q = self._project_query(x)  # (B, H, L, D)
        k_new, v_new = self._project_key_value(x)  # (B, K, L, D), (B, K, L, E)
        #    RoPE: new token i at cache.position + i; the cache keeps the rotated keys.
        q, k_new = self._rotate(q, k_new, cache.position, cache.position)
        # 2. the cache: each sequence takes the pages its new tokens need from the pool, and
        #    the new keys and values are written into them (an fp8 pool: quantized with its
        #    descales, fixed at its first write).
        cache = cache.write(k_new, v_new)
        # 3. attention through paged_attention: each sequence's L new queries (token-major,
        #    sequence b's rows b*L .. b*L + L - 1) over its S = position + L keys, read through
        #    its block-table row; bottom-right causal, within the module's window; an fp8
        #    pool's keys and values read with its descales (None: the module's dtype).
        q = q.transpose(0, 2, 1, 3).reshape(B * L, self.dims.H, self.dims.D)  # (B*L, H, D)
        seq_lens = np.full((B,), cache.position, np.int32)  # (B,)
        cu_seqlens_q = np.arange(B + 1, dtype=np.int32) * L  # (B + 1,)
        out = paged_attention(
            q,
            cache.key_pages,
            cache.value_pages,
            cache.block_table(),
            seq_lens,
            cu_seqlens_q,
            is_causal=True,
            k_descale=cache.k_descale,
            v_descale=cache.v_descale,
            **self._option_keywords(),
        )  # (B*L, H, E)
        out = out.reshape(B, L, self.dims.H, self.dims.E).transpose(0, 2, 1, 3)  # (B, H, L, E)
        # 4. heads merged back, output projection.
        return self._project_output(out), cache  # (B, L, M)

    def prefill(
        self, x: np.ndarray, cu_seqlens: np.ndarray, *, is_causal: bool = True
    ) -> np.ndarray:
        """Self-attention of N sequences of different lengths packed into one row, ``x (1, T,
        M)`` (no padding): sequence n is tokens ``cu_seqlens[n] .. cu_seqlens[n + 1] - 1``
        (``cu_seqlens (N + 1,)`` integers, 0 to T), its tokens at positions 0, 1, ... of their
        own (RoPE), attending only its own tokens through ``varlen_attention`` (causal by
        default), with the module's window, sinks, ALiBi, softcap and scale.

        Returns ``(1, T, M)``: row t is what the module gives the token in a forward of its own
        sequence alone. It writes no cache.
        """
        x, cu_seqlens = _asarray(x), _asarray(cu_seqlens)
        check_prefill_inputs(self.dims, self.dtype.name, x, cu_seqlens, is_causal=is_causal)
        _, T, _ = x.shape
        # 1. projections of the packed tokens, token-major: q (T, H, D), k (T, K, D), v (T, K, E).
        q = self._project_query(x)  # (1, H, T, D)
        k, v = self._project_key_value(x)  # (1, K, T, D), (1, K, T, E)
        #    RoPE: token t of sequence n at position t - cu_seqlens[n], its place in its own.
        cu = cu_seqlens.astype(np.int64)  # (N + 1,)
        t = np.arange(T)  # (T,)
        positions = t - cu[np.searchsorted(cu, t, side="right") - 1]  # (T,)
        if self.rope is not None:
            q = apply_rotary(q, positions, **self._rope_keywords())  # (1, H, T, D)
            k = apply_rotary(k, positions, **self._rope_keywords())  # (1, K, T, D)
        q, k, v = (a[0].transpose(1, 0, 2) for a in (q, k, v))  # (T, H|K, D|E)
        # 2. attention of each sequence over its own keys.
        out = varlen_attention(
            q, k, v, cu_seqlens, cu_seqlens, is_causal=is_causal, **self._option_keywords()
        )  # (T, H, E)
        # 3. heads merged back, output projection.
        return self._project_output(out.transpose(1, 0, 2)[None])  # (1, T, M)

    # -- canonical weights ---------------------------------------------------------------------

    def to_canonical(self) -> dict[str, np.ndarray]:
        """The canonical weights: ``{"q_proj.kernel": (M, H*D), ..., "o_proj.bias": (M,)}``,
        and ``"sinks": (H,)`` for a module with sinks."""
        weights = {}
        for name in PROJECTIONS:
            proj = getattr(self, name)
            weights[f"{name}.kernel"] = proj.kernel.copy()  # (in, out)
            if proj.bias is not None:
                weights[f"{name}.bias"] = proj.bias.copy()  # (out,)
        if self.sinks is not None:
            weights["sinks"] = self.sinks.copy()  # (H,)
        return weights

    def load_canonical(self, weights: Mapping[str, np.ndarray]) -> None:
        """Copy canonical weights of this module's sizes into it, cast to its dtype."""
        weights = {name: np.asarray(w) for name, w in weights.items()}
        check_canonical(
            weights,
            n_heads=self.dims.H,
            n_kv_heads=self.dims.K,
            expected=self.dims,
        )
        for name in PROJECTIONS:
            proj = getattr(self, name)
            proj.kernel = weights[f"{name}.kernel"].astype(self.dtype)  # (in, out)
            if proj.bias is not None:
                proj.bias = weights[f"{name}.bias"].astype(self.dtype)  # (out,)
        if self.sinks is not None:
            self.sinks = weights["sinks"].astype(self.dtype)  # (H,)

    @classmethod
    def from_canonical(
        cls,
        weights: Mapping[str, np.ndarray],
        *,
        n_heads: int,
        n_kv_heads: int,
        dtype: np.typing.DTypeLike | None = None,
        rope_theta: float | None = None,
        rope_interleaved: bool = False,
        rotary_dim: int | None = None,
        rope_inv_freq: np.ndarray | None = None,
        rope_attention_factor: float = 1.0,
        window: tuple[int | None, int | None] | None = None,
        sinks: bool | None = None,
        alibi: bool = False,
        softcap: float | None = None,
        scale: float | None = None,
    ) -> GroupedQueryAttention:
        """A module holding ``weights`` (canonical dict); M, D, E, bias and sinks come from the
        shapes (``sinks=True``/``False``, if given, must agree with them).

        ``dtype`` defaults to the weights' own dtype (a name such as ``"bfloat16"`` works too);
        ``rope_theta``, ``rope_interleaved``, ``rotary_dim``, ``rope_inv_freq``,
        ``rope_attention_factor``, ``window``, ``alibi``, ``softcap``, ``scale`` are the
        constructor's.
        """
        weights = {name: np.asarray(w) for name, w in weights.items()}
        dims = check_canonical(weights, n_heads=n_heads, n_kv_heads=n_kv_heads, sinks=sinks)
        dtype = np.dtype(module_dtype(weights["q_proj.kernel"].dtype if dtype is None else dtype))
        # The constructor's keywords: sizes and flags from the shapes, the caller's options.
        keywords = dict(head_dim=dims.D, value_head_dim=dims.E, bias=dims.bias, sinks=dims.sinks,
                        dtype=dtype, rope_theta=rope_theta, rope_interleaved=rope_interleaved,
                        rotary_dim=rotary_dim, rope_inv_freq=rope_inv_freq,
                        rope_attention_factor=rope_attention_factor, window=window, alibi=alibi,
                        softcap=softcap, scale=scale)
        module = cls._unloaded(dims.M, dims.H, dims.K, **keywords)
        module.load_canonical(weights)
        return module

    @classmethod
    def _unloaded(
        cls, d_model: int, n_heads: int, n_kv_heads: int, **keywords: Any
    ) -> GroupedQueryAttention:
        """The module ``from_canonical`` loads the weights into (the class's own constructor)."""
        return cls(d_model, n_heads, n_kv_heads, **keywords)

    def save(self, path: str | os.PathLike) -> None:
        """Write the canonical weights (sinks included), with H, K and the module's options
        (RoPE, window, ALiBi, softcap, scale) in the metadata, to one safetensors file."""
        metadata = weights_metadata(self.dims, self.rope, self.options)
        save_file(self.to_canonical(), os.fspath(path), metadata=metadata)

    @classmethod
    def load(
        cls, path: str | os.PathLike, *, dtype: np.typing.DTypeLike | None = None
    ) -> GroupedQueryAttention:
        """A module from a file written by ``save`` (by any of the three implementations), with
        the options the file carries."""
        with safe_open(os.fspath(path), framework="numpy") as f:
            n_heads, n_kv_heads = heads_from_metadata(f.metadata())
            options = options_from_metadata(f.metadata())  # those not at their default
            weights = {name: f.get_tensor(name) for name in f.keys()}
        return cls.from_canonical(
            weights, n_heads=n_heads, n_kv_heads=n_kv_heads, dtype=dtype, **options
        )


class MultiHeadAttention(GroupedQueryAttention):
    """Multi-head attention: :class:`GroupedQueryAttention` with K = H key/value heads.

    ``MultiHeadAttention(d_model, n_heads, **keywords)`` is
    ``GroupedQueryAttention(d_model, n_heads, n_heads, **keywords)``: the same keywords, methods
    and errors; ``from_canonical``'s ``n_kv_heads`` defaults to H.
    """

    def __init__(self, d_model: int, n_heads: int, **keywords: Any) -> None:
        super().__init__(d_model, n_heads, n_heads, **keywords)  # K = H

    @classmethod
    def from_canonical(
        cls,
        weights: Mapping[str, np.ndarray],
        *,
        n_heads: int,
        n_kv_heads: int | None = None,
        **keywords: Any,
    ) -> MultiHeadAttention:
        """As :meth:`GroupedQueryAttention.from_canonical`, with ``n_kv_heads`` defaulting to H."""
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        return super().from_canonical(weights, n_heads=n_heads, n_kv_heads=n_kv_heads, **keywords)

    @classmethod
    def _unloaded(
        cls, d_model: int, n_heads: int, n_kv_heads: int, **keywords: Any
    ) -> MultiHeadAttention:
        # K = H whatever the weights hold: weights with another K fail load_canonical's check.
        return cls(d_model, n_heads, **keywords)
