"""Multi-head, grouped-query and multi-query attention modules in PyTorch: nn.Module, nn.Linear.

The same classes, methods, steps and comments as ``impl_numpy/modules.py`` and
``impl_jax/modules.py``; only the idiom differs. Here a projection is an ``nn.Linear``, heads are
split with ``view``/``transpose``, and initialization draws from a ``torch.Generator``, seeded
with 0 unless one is given (as NumPy's ``rng=0`` and JAX's ``nnx.Rngs(0)``): the same arguments
make the same module, whatever else has used torch's global generator.

The attention itself is the functional API (``impl_torch.functional``); a module only projects,
splits heads, calls it, merges heads and projects back:

    x (B, L, M)        --q_proj, split heads-->  q (B, H, L, D)
    context (B, S, M)  --k_proj, v_proj------->  k (B, K, S, D), v (B, K, S, E)
    (rope_theta given: apply_rotary(q), apply_rotary(k) at their positions)
    scaled_dot_product_attention(q, k, v, window=, softcap=, scale=, sinks=, alibi_slopes=)
                                             ->  (B, H, L, E)
    --merge heads--> (B, L, H*E) --o_proj--> y (B, L, M)

Decoding: ``init_cache`` makes a ``KVCache`` (``impl_torch/cache.py``, importable from here
too) and ``decode`` appends the new tokens' keys and values to it, then attends.

Weights: the canonical flat dict of ``attention_spec.weights`` (``q_proj.kernel (M, H*D)``, ...,
``o_proj.bias (M,)``, and ``sinks (H,)`` for ``sinks=True``);
:meth:`GroupedQueryAttention.from_canonical` loads it,
:meth:`~GroupedQueryAttention.to_canonical` exports it, ``save``/``load`` write and read it as one
safetensors file. ``nn.Linear.weight`` is the kernel's transpose ``(out, in)``;
:func:`linear_weight` is the one place that converts. Initialization: every kernel and bias is
drawn from ``U(-1/sqrt(in), 1/sqrt(in))`` with ``in`` the projection's input width (M for q/k/v,
H*E for o), which is also ``nn.Linear``'s own default.

Shape letters (SEMANTICS.md): B batch, H query heads, K key/value heads (G = H // K),
L query length, S key/value length, D query/key head dim, E value head dim, M model width.

Why one file of ~760 lines (its NumPy and JAX texts have ~680 and ~690): the same two classes,
plus what only torch needs at the module's edge: NumPy conversions that keep bfloat16 exact
(``tensor_from_numpy``, ``tensor_to_numpy``), the ``(out, in)`` weight transpose
(``linear_weight``), devices and the seeded generator.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file
from torch import nn

from attention_spec import (
    alibi_slope_values,
    causal_offset,
    check_rope_config,
    compute_dtype,
    dtype_name,
)
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
from impl_torch.cache import KVCache, PagedKVCache
from impl_torch.functional import _as_tensors, attention_weights, scaled_dot_product_attention
from impl_torch.paged import paged_attention
from impl_torch.rotary import apply_rotary
from impl_torch.varlen import varlen_attention

__all__ = [
    "GroupedQueryAttention",
    "KVCache",
    "MultiHeadAttention",
    "PagedKVCache",
    "linear_weight",
    "padding_mask",
    "tensor_from_numpy",
    "tensor_to_numpy",
]


def _memory_bytes() -> int | None:
    """This machine's physical memory in bytes, the bound ``check_module_config`` puts on a
    module's weights (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def tensor_from_numpy(
    a: np.ndarray, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """A NumPy array as a tensor; bfloat16 (ml_dtypes) goes through float32, exactly."""
    a = np.asarray(a)
    if a.dtype == ml_dtypes.bfloat16:  # torch.from_numpy has no bfloat16
        t = torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    else:
        t = torch.from_numpy(a if a.flags.c_contiguous else a.copy())  # 0-d stays 0-d
    return t.to(device=device, dtype=dtype)


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as a NumPy array of the same dtype (bfloat16 through ml_dtypes, exactly)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16, order="C")
    return t.numpy().copy()  # C order, as safetensors writes the buffer as it lies


def linear_weight(kernel: torch.Tensor) -> torch.Tensor:
    """Canonical kernel ``(in, out)`` <-> ``nn.Linear.weight`` ``(out, in)``.

    The one place the transpose happens; being its own inverse, it converts both ways. A view,
    no copy: the callers that keep it copy it (``copy_``, ``tensor_to_numpy``), and MLA's
    absorbed decode splits ``kv_b_proj``'s weight per head through it every step (a copy of
    ``R * H * (Dn + E)`` numbers a step, 8 MiB at DeepSeek's sizes, was a fifth of that step).
    """
    return kernel.T


def padding_mask(lengths: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Boolean ``(B, 1, 1, S)`` mask, True where key j < ``lengths[b]`` (a real, unpadded key).

    ``lengths`` is ``(B,)`` integers; a length >= S keeps every key, a length <= 0 masks every
    key (those query rows then give zeros). Broadcasts against ``(B, H, L, S)`` scores.
    """
    lengths = torch.as_tensor(lengths)
    check_padding_mask_args(lengths, kv_len)
    j = torch.arange(kv_len, device=lengths.device)  # (S,)
    return (j[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)


def _torch_dtype(dtype: object) -> torch.dtype:
    """The torch dtype of a module's ``dtype`` argument: None (float32), a canonical name, or
    a torch, NumPy or ml_dtypes dtype (``attention_spec.modules.module_dtype``)."""
    return getattr(torch, module_dtype(dtype))


def _uniform_(t: torch.Tensor, fan_in: int, generator: torch.Generator | None) -> None:
    """Fill ``t`` from ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``."""
    bound = 1.0 / math.sqrt(fan_in)
    nn.init.uniform_(t, -bound, bound, generator=generator)


class GroupedQueryAttention(nn.Module):
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
        dtype: the weights' dtype (float64, float32, float16 or bfloat16; default torch's
            default dtype); inputs must match it.
        device: where the weights live.
        generator: a ``torch.Generator`` for the initialization (default: one seeded with 0, on
            the weights' device).

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
        rope_inv_freq: torch.Tensor | np.ndarray | None = None,
        rope_attention_factor: float = 1.0,
        window: tuple[int | None, int | None] | None = None,
        sinks: bool = False,
        alibi: bool = False,
        softcap: float | None = None,
        scale: float | None = None,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        dtype = _torch_dtype(dtype)
        dims = check_module_config(
            d_model, n_heads, n_kv_heads, head_dim, value_head_dim, bias=bias,
            dtype=dtype_name(dtype), sinks=sinks, memory_bytes=_memory_bytes(),
        )
        self.dims = dims
        self.rope = check_rope_config(
            rope_theta, rope_interleaved, rotary_dim, dims.D, rope_inv_freq, rope_attention_factor
        )  # or None
        self.options = check_attention_options(
            dtype_name(dtype), window=window, sinks=sinks, alibi=alibi, softcap=softcap,
            scale=scale,
        )
        M, H, K, D, E = dims.M, dims.H, dims.K, dims.D, dims.E
        factory = {"bias": bias, "dtype": dtype, "device": device}
        self.q_proj = nn.Linear(M, H * D, **factory)  # weight (H*D, M)
        self.k_proj = nn.Linear(M, K * D, **factory)  # weight (K*D, M)
        self.v_proj = nn.Linear(M, K * E, **factory)  # weight (K*E, M)
        self.o_proj = nn.Linear(H * E, M, **factory)  # weight (M, H*E)
        sinks = torch.zeros(H, dtype=dtype, device=device) if dims.sinks else None
        self.sinks = None if sinks is None else nn.Parameter(sinks)  # (H,), learned
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Draw every kernel and bias from ``U(-1/sqrt(in), 1/sqrt(in))``, in forward order
        (from a generator seeded with 0 when none is given); sinks, if any, are zeros."""
        device = self.q_proj.weight.device
        if generator is None and device.type != "meta":  # meta tensors hold no values to draw
            generator = torch.Generator(device=device).manual_seed(0)
        for name in PROJECTIONS:
            proj = getattr(self, name)
            _uniform_(proj.weight, proj.in_features, generator)  # (out, in)
            if proj.bias is not None:
                _uniform_(proj.bias, proj.in_features, generator)  # (out,)
        if self.sinks is not None:
            self.sinks.zero_()  # (H,): a sink logit of 0 until trained or loaded

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype; inputs must have it."""
        return self.q_proj.weight.dtype

    # -- the forward pass, in the steps a KV cache reuses ------------------------------------

    def _project_query(self, x: torch.Tensor) -> torch.Tensor:
        """``x (B, L, M)`` -> ``q (B, H, L, D)``; head h is features ``[h*D:(h+1)*D]``."""
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.dims.H, self.dims.D)  # (B, L, H, D)
        return q.transpose(1, 2)  # (B, H, L, D)

    def _project_key_value(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``context (B, S, M)`` -> ``k (B, K, S, D)``, ``v (B, K, S, E)``."""
        B, S, _ = context.shape
        k = self.k_proj(context).view(B, S, self.dims.K, self.dims.D)  # (B, S, K, D)
        v = self.v_proj(context).view(B, S, self.dims.K, self.dims.E)  # (B, S, K, E)
        return k.transpose(1, 2), v.transpose(1, 2)  # (B, K, S, D), (B, K, S, E)

    def _rotate(self, q, k, q_start: int, k_start: int):
        """RoPE of the module's ``rope_theta`` (None: q and k unchanged): query i of
        ``q (B, H, L, D)`` at position ``q_start + i``, key j of ``k (B, K, S, D)`` at
        ``k_start + j``."""
        if self.rope is None:
            return q, k
        L, S = q.shape[2], k.shape[2]
        rope = self._rope_keywords(q.device)  # theta, rotary_dim, interleaved, factor, inv_freq
        q = apply_rotary(q, q_start + torch.arange(L, device=q.device), **rope)  # (B, H, L, D)
        k = apply_rotary(k, k_start + torch.arange(S, device=k.device), **rope)  # (B, K, S, D)
        return q, k

    def _rope_keywords(self, device: torch.device) -> dict:
        """``apply_rotary``'s keywords for the module's RoPE: its theta, rotary_dim, interleaved
        and attention_factor, and ``inv_freq``: None (theta's frequencies) or the module's
        ``rope_inv_freq (R/2,)`` in float64."""
        r = self.rope
        inv_freq = (
            None
            if r.inv_freq is None
            else torch.tensor(r.inv_freq, dtype=torch.float64, device=device)
        )
        return r.keywords() | {"inv_freq": inv_freq}

    def _option_keywords(self) -> dict:
        """The module's options as the functional API's keywords: ``window``, ``softcap``,
        ``scale``, the ``sinks (H,)`` weight, ALiBi's ``alibi_slopes(H)`` in the compute dtype."""
        o = self.options
        slopes = None
        if o.alibi:
            ct = getattr(torch, compute_dtype(dtype_name(self.dtype)))
            device = self.q_proj.weight.device
            slopes = torch.tensor(alibi_slope_values(self.dims.H), dtype=ct, device=device)
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

    def _project_output(self, out: torch.Tensor) -> torch.Tensor:
        """``out (B, H, L, E)`` -> ``(B, L, M)``: merge heads (head h -> ``[h*E:(h+1)*E]``)."""
        B, H, L, E = out.shape
        merged = out.transpose(1, 2).reshape(B, L, H * E)  # (B, L, H*E)
        return self.o_proj(merged)  # (B, L, M)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        *,
        mask: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        is_causal: bool = False,
        causal_alignment: str = "top_left",
        return_weights: bool = False,
        q_segment_ids: torch.Tensor | None = None,
        kv_segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
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
        x, context, mask, bias = _as_tensors(x, context, mask, bias)
        q_segment_ids, kv_segment_ids = _as_tensors(q_segment_ids, kv_segment_ids)
        check_module_inputs(
            self.dims, dtype_name(self.dtype), x, context, mask=mask, bias=bias,
            is_causal=is_causal, causal_alignment=causal_alignment, return_weights=return_weights,
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

    def _stored_dtype(self, name: str) -> torch.dtype:
        """The cache buffers' dtype for ``check_cache_dtype``'s name: the module's, or fp8."""
        return self.dtype if name == dtype_name(self.dtype) else getattr(torch, name)

    def _cache_descale(self, descale: torch.Tensor | float | None) -> torch.Tensor | None:
        """A given cache descale (a number or ``(K,)``) as the cache holds it, ``(K,)`` float32
        (None: computed at the first write)."""
        if descale is None:
            return None
        device = self.q_proj.weight.device
        descale = torch.as_tensor(descale, dtype=torch.float32, device=device)
        return descale.broadcast_to((self.dims.K,)).clone()  # (K,)

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        rolling: bool = False,
        page_size: int | None = None,
        dtype: torch.dtype | str | None = None,
        k_descale: torch.Tensor | float | None = None,
        v_descale: torch.Tensor | float | None = None,
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
            self.dims.K, dtype_name(self.dtype), dtype, k_descale=k_descale, v_descale=v_descale
        )  # the module's dtype name, or an fp8 format's
        dtype = self._stored_dtype(stored)
        k_descale, v_descale = self._cache_descale(k_descale), self._cache_descale(v_descale)
        B, K, D, E = batch_size, self.dims.K, self.dims.D, self.dims.E
        device = self.q_proj.weight.device
        if page_size is not None:
            P = B * pages_needed(max_len, page_size)
            shape = (P, page_size, K, D)
            key = torch.zeros(shape, dtype=dtype, device=device)  # (P, page_size, K, D)
            shape = (P, page_size, K, E)
            value = torch.zeros(shape, dtype=dtype, device=device)  # (P, page_size, K, E)
            return PagedKVCache(key, value, ((),) * B, tuple(range(P)), max_len, 0,
                                k_descale, v_descale)
        shape = (B, K, T, D)
        key = torch.zeros(shape, dtype=dtype, device=device)  # (B, K, T, D)
        shape = (B, K, T, E)
        value = torch.zeros(shape, dtype=dtype, device=device)  # (B, K, T, E)
        return KVCache(key, value, 0, max_len if rolling else None, k_descale, v_descale)

    def decode(
        self,
        x: torch.Tensor,
        cache: KVCache,
        *,
        mask: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        return_weights: bool = False,
        q_segment_ids: torch.Tensor | None = None,
        kv_segment_ids: torch.Tensor | None = None,
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
        x, mask, bias = _as_tensors(x, mask, bias)
        q_segment_ids, kv_segment_ids = _as_tensors(q_segment_ids, kv_segment_ids)
        if isinstance(cache, PagedKVCache):
            return self._decode_paged(
                x, cache, mask=mask, bias=bias, return_weights=return_weights,
                q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
            )
        check_decode_inputs(
            self.dims, dtype_name(self.dtype), x, cache_key=cache.key, cache_value=cache.value,
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

    def _decode_paged(self, x: torch.Tensor, cache: PagedKVCache, **refused) -> tuple:
        """:meth:`decode` on a paged cache: ``(y (B, L, M), cache)``, the new tokens written
        into the sequences' pages, then ``paged_attention`` over each sequence's pages."""
        check_paged_decode_inputs(
            self.dims, dtype_name(self.dtype), x, key_pages=cache.key_pages,
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
        q = q.transpose(1, 2).reshape(B * L, self.dims.H, self.dims.D)  # (B*L, H, D)
        device = q.device
        seq_lens = torch.full((B,), cache.position, dtype=torch.int32, device=device)  # (B,)
        cu_seqlens_q = torch.arange(B + 1, dtype=torch.int32, device=device) * L  # (B + 1,)
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
        out = out.reshape(B, L, self.dims.H, self.dims.E).transpose(1, 2)  # (B, H, L, E)
        # 4. heads merged back, output projection.
        return self._project_output(out), cache  # (B, L, M)

    def prefill(
        self, x: torch.Tensor, cu_seqlens: torch.Tensor, *, is_causal: bool = True
    ) -> torch.Tensor:
        """Self-attention of N sequences of different lengths packed into one row, ``x (1, T,
        M)`` (no padding): sequence n is tokens ``cu_seqlens[n] .. cu_seqlens[n + 1] - 1``
        (``cu_seqlens (N + 1,)`` integers, 0 to T), its tokens at positions 0, 1, ... of their
        own (RoPE), attending only its own tokens through ``varlen_attention`` (causal by
        default), with the module's window, sinks, ALiBi, softcap and scale.

        Returns ``(1, T, M)``: row t is what the module gives the token in a forward of its own
        sequence alone. It writes no cache.
        """
        x, cu_seqlens = _as_tensors(x, cu_seqlens)
        check_prefill_inputs(self.dims, dtype_name(self.dtype), x, cu_seqlens, is_causal=is_causal)
        _, T, _ = x.shape
        # 1. projections of the packed tokens, token-major: q (T, H, D), k (T, K, D), v (T, K, E).
        q = self._project_query(x)  # (1, H, T, D)
        k, v = self._project_key_value(x)  # (1, K, T, D), (1, K, T, E)
        #    RoPE: token t of sequence n at position t - cu_seqlens[n], its place in its own.
        cu = cu_seqlens.to(torch.int64)  # (N + 1,)
        t = torch.arange(T, device=cu.device)  # (T,)
        positions = t - cu[torch.searchsorted(cu, t, right=True) - 1]  # (T,)
        if self.rope is not None:
            q = apply_rotary(q, positions, **self._rope_keywords(x.device))  # (1, H, T, D)
            k = apply_rotary(k, positions, **self._rope_keywords(x.device))  # (1, K, T, D)
        q, k, v = (a[0].transpose(0, 1) for a in (q, k, v))  # (T, H|K, D|E)
        # 2. attention of each sequence over its own keys.
        out = varlen_attention(
            q, k, v, cu_seqlens, cu_seqlens, is_causal=is_causal, **self._option_keywords()
        )  # (T, H, E)
        # 3. heads merged back, output projection.
        return self._project_output(out.transpose(0, 1)[None])  # (1, T, M)

    # -- canonical weights ---------------------------------------------------------------------

    def to_canonical(self) -> dict[str, np.ndarray]:
        """The canonical weights: ``{"q_proj.kernel": (M, H*D), ..., "o_proj.bias": (M,)}``,
        and ``"sinks": (H,)`` for a module with sinks."""
        weights = {}
        for name in PROJECTIONS:
            proj = getattr(self, name)
            weights[f"{name}.kernel"] = tensor_to_numpy(linear_weight(proj.weight))  # (in, out)
            if proj.bias is not None:
                weights[f"{name}.bias"] = tensor_to_numpy(proj.bias)  # (out,)
        if self.sinks is not None:
            weights["sinks"] = tensor_to_numpy(self.sinks)  # (H,)
        return weights

    @torch.no_grad()
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
            kernel = tensor_from_numpy(weights[f"{name}.kernel"])  # (in, out)
            proj.weight.copy_(linear_weight(kernel))  # (out, in); copy_ casts to the module dtype
            if proj.bias is not None:
                proj.bias.copy_(tensor_from_numpy(weights[f"{name}.bias"]))  # (out,)
        if self.sinks is not None:
            self.sinks.copy_(tensor_from_numpy(weights["sinks"]))  # (H,)

    @classmethod
    def from_canonical(
        cls,
        weights: Mapping[str, np.ndarray],
        *,
        n_heads: int,
        n_kv_heads: int,
        dtype: torch.dtype | str | None = None,
        rope_theta: float | None = None,
        rope_interleaved: bool = False,
        rotary_dim: int | None = None,
        rope_inv_freq: torch.Tensor | np.ndarray | None = None,
        rope_attention_factor: float = 1.0,
        window: tuple[int | None, int | None] | None = None,
        sinks: bool | None = None,
        alibi: bool = False,
        softcap: float | None = None,
        scale: float | None = None,
        device: torch.device | str | None = None,
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
        dtype = _torch_dtype(weights["q_proj.kernel"].dtype if dtype is None else dtype)
        # The constructor's keywords: sizes and flags from the shapes, the caller's options.
        keywords = dict(head_dim=dims.D, value_head_dim=dims.E, bias=dims.bias, sinks=dims.sinks,
                        dtype=dtype, device=device, rope_theta=rope_theta,
                        rope_interleaved=rope_interleaved, rotary_dim=rotary_dim,
                        rope_inv_freq=rope_inv_freq, rope_attention_factor=rope_attention_factor,
                        window=window, alibi=alibi, softcap=softcap, scale=scale)
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
        cls,
        path: str | os.PathLike,
        *,
        dtype: torch.dtype | str | None = None,
        device: torch.device | str | None = None,
    ) -> GroupedQueryAttention:
        """A module from a file written by ``save`` (by any of the three implementations), with
        the options the file carries."""
        with safe_open(os.fspath(path), framework="numpy") as f:
            n_heads, n_kv_heads = heads_from_metadata(f.metadata())
            options = options_from_metadata(f.metadata())  # those not at their default
            weights = {name: f.get_tensor(name) for name in f.keys()}
        return cls.from_canonical(
            weights, n_heads=n_heads, n_kv_heads=n_kv_heads, dtype=dtype, device=device, **options
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
        device: torch.device | str | None = None,
        **keywords: Any,
    ) -> MultiHeadAttention:
        """As :meth:`GroupedQueryAttention.from_canonical`, with ``n_kv_heads`` defaulting to H
        (``device`` is named so that a caller reading the signature, as the conformance runner
        does, finds it)."""
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        return super().from_canonical(
            weights, n_heads=n_heads, n_kv_heads=n_kv_heads, device=device, **keywords
        )

    @classmethod
    def _unloaded(
        cls, d_model: int, n_heads: int, n_kv_heads: int, **keywords: Any
    ) -> MultiHeadAttention:
        # K = H whatever the weights hold: weights with another K fail load_canonical's check.
        return cls(d_model, n_heads, **keywords)
