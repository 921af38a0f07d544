"""Multi-head latent attention (DeepSeek-V2/V3) in JAX: a flax.nnx.Module of nnx.Linear.

The same class, methods, steps and comments as ``impl_numpy/mla.py`` and ``impl_torch/mla.py``;
only the idiom differs (``nnx.Linear``'s kernel is already ``(in, out)``; the cache is a
pytree). Keys and values come from one low-rank latent per token plus one rotary key head shared
by every query head (SEMANTICS.md, Contract v3):

    x (B, L, M) --q_proj (or q_a_proj, RMSNorm, q_b_proj)--> (B, L, H*(Dn+Dr))
                --split heads--> q_nope (B, H, L, Dn), q_pe (B, H, L, Dr)
    x (B, L, M) --kv_a_proj_with_mqa--> [c_kv (B, L, R), k_pe (B, L, Dr)]; c_kv = RMSNorm(c_kv)
    q_pe, k_pe rotated (rotary_dim = Dr; k_pe one head, shared)

    naive (forward, decode_naive: a KVCache of H heads, D = Dn + Dr, E):
    c_kv --kv_b_proj--> k_nope (B, H, S, Dn), v (B, H, S, E)
    q = [q_nope, q_pe] (B, H, L, Dn+Dr), k = [k_nope, k_pe] (B, H, S, Dn+Dr)
    scaled_dot_product_attention(q, k, v, scale=(Dn + Dr) ** -0.5, ...) -> (B, H, L, E)

    absorbed (decode: a latent KVCache, key [c_kv, k_pe] (B, 1, T, R+Dr), value (B, 1, T, 0)):
    q_lat = q_nope W_UK^T (B, H, L, R)   (W_UK: kv_b_proj's key part, (R, H, Dn))
    one MQA: q = [q_lat, q_pe] (B, H, L, R+Dr), k = [c_kv, k_pe] (B, 1, S, R+Dr), v = k[..., :R]
    scaled_dot_product_attention(q, k, v, scale=(Dn + Dr) ** -0.5, ...) -> o_lat (B, H, L, R)
    o = o_lat W_UV (B, H, L, E)          (W_UV: kv_b_proj's value part, (R, H, E))

    absorbed, paged (decode: ``init_cache(..., page_size=)``, a PagedKVCache of one head,
    key pages [c_kv, k_pe] (P, page_size, 1, R+Dr), value pages c_kv (P, page_size, 1, R)):
    the same steps, the cache written by paged_cache_write and the MQA run by paged_attention
    on q = [q_lat, q_pe] token-major (B*L, H, R+Dr) -> o_lat (B*L, H, R)

    --merge heads--> (B, L, H*E) --o_proj--> y (B, L, M)

The scale is the module's ``scale`` or ``(Dn + Dr) ** -0.5`` on both paths: the absorbed call's
query width R + Dr is not what the scores were trained at. RMSNorm is ``x / sqrt(mean(x^2) +
eps) * weight`` in float32 (float64 for float64), rounded once to the module's dtype.

Shape letters: B batch, H heads, L new tokens, S keys attended, T cache slots, M model width,
Q q_lora_rank, R kv_lora_rank, Dn qk_nope_head_dim, Dr qk_rope_head_dim, E v_head_dim.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from attention_spec import compute_dtype
from attention_spec.cache import check_cache_dtype, check_paged_decode_inputs
from attention_spec.mla import (
    check_latent_decode_inputs,
    check_mla_canonical,
    check_mla_config,
    check_mla_rope,
    check_naive_cache,
    check_rms_norm_eps,
    mla_from_metadata,
    mla_metadata,
)
from attention_spec.modules import (
    check_attention_options,
    check_cache_size,
    check_decode_inputs,
    check_module_inputs,
    module_dtype,
)
from attention_spec.paged import pages_needed
from impl_jax.cache import KVCache, PagedKVCache
from impl_jax.functional import (
    _asarray,
    _check_x64,
    attention_weights,
    scaled_dot_product_attention,
)
from impl_jax.modules import _PRECISION, _linear
from impl_jax.paged import paged_attention
from impl_jax.rotary import apply_rotary

__all__ = ["MultiHeadLatentAttention", "rms_norm"]


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis, in float32 (float64 for
    float64), rounded once to x's dtype. ``x (..., N)``, ``weight (N,)``."""
    ct = compute_dtype(x.dtype.name)
    xf = x.astype(ct)
    norm = xf / jnp.sqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)  # (..., N)
    return (norm * weight.astype(ct)).astype(x.dtype)


class MultiHeadLatentAttention(nnx.Module):
    """Multi-head latent attention: keys and values from a per-token latent ``c_kv (R)`` and
    one shared rotary key ``k_pe (Dr)``; decoding caches only those, R + Dr numbers per token.

    Args:
        d_model: model width M.
        n_heads: heads H.
        kv_lora_rank: R, the key/value latent's width.
        qk_nope_head_dim: Dn, the query/key features without rotary.
        qk_rope_head_dim: Dr, the rotated query/key features (even); one key head of them.
        v_head_dim: E, the value head dim.
        q_lora_rank: Q, the query latent's width (``q_a_proj``, RMSNorm, ``q_b_proj``); None:
            one ``q_proj``.
        rope_theta, rope_interleaved, rope_inv_freq, rope_attention_factor: the rotary of q_pe
            and k_pe (``apply_rotary`` with ``rotary_dim = Dr``; YaRN is ``rope_inv_freq``,
            ``rope_attention_factor`` and a ``scale``).
        rms_norm_eps: the two latent norms' epsilon.
        window, sinks, softcap: the v2 settings, applied to every attention call (ALiBi does not
            apply: the positions are RoPE's).
        scale: the scores' scale (default ``(Dn + Dr) ** -0.5``, on the naive and absorbed
            paths alike).
        dtype: the weights' dtype; rngs: the ``nnx.Rngs`` to initialize from (default 0).

    Raises:
        ConfigError ``mla_dims``, ``non_positive_size``, ``rope_theta``, ...; DTypeError.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        rope_theta: float = 10000.0,
        rope_interleaved: bool = False,
        rope_inv_freq: jax.Array | np.ndarray | None = None,
        rope_attention_factor: float = 1.0,
        rms_norm_eps: float = 1e-6,
        window: tuple[int | None, int | None] | None = None,
        sinks: bool = False,
        softcap: float | None = None,
        scale: float | None = None,
        dtype: jnp.dtype | str = jnp.float32,
        rngs: nnx.Rngs | None = None,
    ) -> None:
        dtype = jnp.dtype(module_dtype(dtype))
        dims = check_mla_config(
            d_model, n_heads, kv_lora_rank=kv_lora_rank, qk_nope_head_dim=qk_nope_head_dim,
            qk_rope_head_dim=qk_rope_head_dim, v_head_dim=v_head_dim, q_lora_rank=q_lora_rank,
            sinks=sinks, dtype=dtype.name,
        )
        _check_x64(dtype)  # float64 weights need x64, as float64 inputs do
        self.dims = dims
        self.rope = check_mla_rope(
            rope_theta, rope_interleaved, rope_inv_freq, rope_attention_factor, dims
        )
        self.rms_norm_eps = check_rms_norm_eps(rms_norm_eps)
        self.options = check_attention_options(
            dtype.name, window=window, sinks=sinks, softcap=softcap, scale=scale
        )
        self.scale = (dims.Dn + dims.Dr) ** -0.5 if scale is None else self.options.scale
        M, H, R, Dn, Dr, E, Q = dims.M, dims.H, dims.R, dims.Dn, dims.Dr, dims.E, dims.Q
        rngs = nnx.Rngs(0) if rngs is None else rngs
        linear = dict(bias=False, dtype=dtype, rngs=rngs)
        if Q is None:
            self.q_proj = _linear(M, H * (Dn + Dr), **linear)
        else:
            self.q_a_proj = _linear(M, Q, **linear)  # kernel (M, Q)
            self.q_a_layernorm = nnx.Param(jnp.ones((Q,), dtype))  # (Q,)
            self.q_b_proj = _linear(Q, H * (Dn + Dr), **linear)
        self.kv_a_proj_with_mqa = _linear(M, R + Dr, **linear)
        self.kv_a_layernorm = nnx.Param(jnp.ones((R,), dtype))  # (R,)
        self.kv_b_proj = _linear(R, H * (Dn + E), **linear)
        self.o_proj = _linear(H * E, M, **linear)  # kernel (H*E, M)
        self.sinks = nnx.Param(jnp.zeros((H,), dtype)) if dims.sinks else None  # (H,), learned

    @property
    def dtype(self) -> jnp.dtype:
        """The weights' dtype; inputs must have it."""
        return self.kv_a_proj_with_mqa.kernel.dtype

    # -- the steps both paths share ------------------------------------------------------------

    def _project_query(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``x (B, L, M)`` -> ``q_nope (B, H, L, Dn)``, ``q_pe (B, H, L, Dr)``."""
        B, L, _ = x.shape
        H, Dn, Dr = self.dims.H, self.dims.Dn, self.dims.Dr
        if self.dims.Q is None:
            q = self.q_proj(x)  # (B, L, H*(Dn+Dr))
        else:
            q_lat = rms_norm(
                self.q_a_proj(x), self.q_a_layernorm[...], self.rms_norm_eps
            )  # (B, L, Q)
            q = self.q_b_proj(q_lat)  # (B, L, H*(Dn+Dr))
        q = q.reshape(B, L, H, Dn + Dr).transpose(0, 2, 1, 3)  # (B, H, L, Dn+Dr)
        return q[..., :Dn], q[..., Dn:]  # (B, H, L, Dn), (B, H, L, Dr)

    def _project_latent(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``x (B, L, M)`` -> ``c_kv (B, 1, L, R)`` (normalised), ``k_pe (B, 1, L, Dr)``."""
        R = self.dims.R
        kv = self.kv_a_proj_with_mqa(x)  # (B, L, R+Dr)
        c_kv = rms_norm(kv[..., :R], self.kv_a_layernorm[...], self.rms_norm_eps)  # (B, L, R)
        return c_kv[:, None], kv[:, None, :, R:]  # (B, 1, L, R), (B, 1, L, Dr)

    def _rotate(self, q_pe: jax.Array, k_pe: jax.Array, start: int):
        """RoPE of ``q_pe (B, H, L, Dr)`` and the shared ``k_pe (B, 1, L, Dr)``: token i at
        position ``start + i``."""
        r = self.rope
        inv_freq = None if r.inv_freq is None else np.asarray(r.inv_freq, np.float64)  # static
        rope = dict(theta=r.theta, rotary_dim=r.rotary_dim, interleaved=r.interleaved,
                    inv_freq=inv_freq, attention_factor=r.attention_factor)
        positions = start + jnp.arange(q_pe.shape[2])  # (L,)
        return apply_rotary(q_pe, positions, **rope), apply_rotary(k_pe, positions, **rope)

    def _expand(self, c_kv: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``c_kv (B, 1, S, R)`` -> ``k_nope (B, H, S, Dn)``, ``v (B, H, S, E)`` (kv_b_proj)."""
        B, _, S, _ = c_kv.shape
        H, Dn, E = self.dims.H, self.dims.Dn, self.dims.E
        kv = self.kv_b_proj(c_kv[:, 0]).reshape(B, S, H, Dn + E)  # (B, S, H, Dn+E)
        kv = kv.transpose(0, 2, 1, 3)  # (B, H, S, Dn+E)
        return kv[..., :Dn], kv[..., Dn:]  # (B, H, S, Dn), (B, H, S, E)

    def _heads(self, q_nope, q_pe, k_nope, k_pe):
        """Each head's query ``[q_nope_h, q_pe_h]`` (B, H, L, Dn+Dr) and key ``[k_nope_h,
        k_pe]`` (B, H, S, Dn+Dr): the one k_pe head is every head's."""
        k_pe = jnp.broadcast_to(k_pe, (*k_nope.shape[:-1], k_pe.shape[-1]))  # (B, H, S, Dr)
        return jnp.concatenate([q_nope, q_pe], -1), jnp.concatenate([k_nope, k_pe], -1)

    def _absorbed(self) -> tuple[jax.Array, jax.Array]:
        """``kv_b_proj``'s kernel split per head: ``W_UK (R, H, Dn)``, ``W_UV (R, H, E)``."""
        R, H, Dn, E = self.dims.R, self.dims.H, self.dims.Dn, self.dims.E
        w = self.kv_b_proj.kernel[...].reshape(R, H, Dn + E)  # (R, H, Dn+E)
        return w[..., :Dn], w[..., Dn:]

    def _attend(self, q, k, v, *, return_weights: bool, **keywords):
        """The functional API with the module's scale, window, softcap and sinks: output
        ``(B, H, L, E or R)`` and the weights ``(B, H, L, S)`` or None."""
        o = self.options
        sinks = None if self.sinks is None else self.sinks[...]
        keywords |= dict(scale=self.scale, window=o.window, softcap=o.softcap, sinks=sinks)
        out = scaled_dot_product_attention(q, k, v, **keywords)
        weights = attention_weights(q, k, **keywords) if return_weights else None
        return out, weights

    def _project_output(self, out: jax.Array) -> jax.Array:
        """``out (B, H, L, E)`` -> ``(B, L, M)``: merge heads, output projection."""
        B, H, L, E = out.shape
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, H * E))  # (B, L, M)

    # -- the forward pass (naive) -------------------------------------------------------------

    def __call__(
        self,
        x: jax.Array,
        *,
        mask: jax.Array | None = None,
        bias: jax.Array | None = None,
        is_causal: bool = False,
        causal_alignment: str = "top_left",
        return_weights: bool = False,
        q_segment_ids: jax.Array | None = None,
        kv_segment_ids: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        """Self-attention of ``x (B, L, M)`` (S = L), token i at position i.

        mask, bias (to ``(B, H, L, S)``), is_causal, causal_alignment, q_segment_ids,
        kv_segment_ids: as in the functional API. Returns ``(B, L, M)``, or ``(output,
        weights (B, H, L, S))`` when ``return_weights``.
        """
        x, mask, bias = _asarray(x), _asarray(mask), _asarray(bias)
        q_segment_ids, kv_segment_ids = _asarray(q_segment_ids), _asarray(kv_segment_ids)
        check_module_inputs(
            self.dims.naive, jnp.dtype(self.dtype).name, x, None, mask=mask, bias=bias,
            is_causal=is_causal, causal_alignment=causal_alignment,
            return_weights=return_weights, q_segment_ids=q_segment_ids,
            kv_segment_ids=kv_segment_ids,
        )
        # 1. projections: the query heads, the latent c_kv and the shared k_pe.
        q_nope, q_pe = self._project_query(x)  # (B, H, L, Dn), (B, H, L, Dr)
        c_kv, k_pe = self._project_latent(x)  # (B, 1, L, R), (B, 1, L, Dr)
        # 2. RoPE of q_pe and k_pe: token i at position i.
        q_pe, k_pe = self._rotate(q_pe, k_pe, 0)
        # 3. keys and values of every head from the latent; k_pe shared by the heads.
        k_nope, v = self._expand(c_kv)  # (B, H, L, Dn), (B, H, L, E)
        q, k = self._heads(q_nope, q_pe, k_nope, k_pe)  # (B, H, L, Dn+Dr) each
        # 4. attention of every head, scale (Dn + Dr) ** -0.5 unless given.
        out, weights = self._attend(
            q, k, v, mask=mask, bias=bias, is_causal=is_causal,
            causal_alignment=causal_alignment, return_weights=return_weights,
            q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
        )
        # 5. heads merged back, output projection.
        y = self._project_output(out)  # (B, L, M)
        return (y, weights) if return_weights else y

    # -- decoding, naive: a KV cache of every head's keys and values ---------------------------

    def init_kv_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty naive cache: ``key (B, H, T, Dn+Dr)``, ``value (B, H, T, E)``."""
        T = check_cache_size(batch_size, max_len)
        d = self.dims
        key = jnp.zeros((batch_size, d.H, T, d.Dn + d.Dr), self.dtype)  # (B, H, T, Dn+Dr)
        value = jnp.zeros((batch_size, d.H, T, d.E), self.dtype)  # (B, H, T, E)
        return KVCache(key, value, 0)

    def decode_naive(
        self, x: jax.Array, cache: KVCache, *, mask: jax.Array | None = None,
        bias: jax.Array | None = None, return_weights: bool = False,
    ) -> tuple:
        """New tokens ``x (B, L, M)`` through a naive cache (:meth:`init_kv_cache`): their keys
        and values expanded per head and appended, then bottom-right causal attention over the
        S = position + L keys. Returns ``(y, cache)`` or ``(y, weights, cache)``."""
        x, mask, bias = _asarray(x), _asarray(mask), _asarray(bias)
        check_naive_cache(isinstance(cache, PagedKVCache))
        check_decode_inputs(
            self.dims.naive, jnp.dtype(self.dtype).name, x, cache_key=cache.key,
            cache_value=cache.value,
            position=cache.position, max_len=cache.max_len, mask=mask, bias=bias,
            return_weights=return_weights,
        )
        # 1. projections of the new tokens.
        q_nope, q_pe = self._project_query(x)  # (B, H, L, Dn), (B, H, L, Dr)
        c_kv, k_pe = self._project_latent(x)  # (B, 1, L, R), (B, 1, L, Dr)
        # 2. RoPE: new token i at cache.position + i.
        q_pe, k_pe = self._rotate(q_pe, k_pe, cache.position)
        # 3. keys and values of every head, appended to the cache.
        k_nope, v_new = self._expand(c_kv)  # (B, H, L, Dn), (B, H, L, E)
        q, k_new = self._heads(q_nope, q_pe, k_nope, k_pe)  # (B, H, L, Dn+Dr)
        cache, k, v = cache.append(k_new, v_new)  # (B, H, S, Dn+Dr), (B, H, S, E)
        # 4. attention over the S keys, bottom-right causal.
        out, weights = self._attend(
            q, k, v, mask=mask, bias=bias, is_causal=True, causal_alignment="bottom_right",
            return_weights=return_weights,
        )
        # 5. heads merged back, output projection.
        y = self._project_output(out)  # (B, L, M)
        return (y, weights, cache) if return_weights else (y, cache)

    # -- decoding, absorbed: the latent cache, one MQA call --------------------------------------

    def init_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        page_size: int | None = None,
        dtype: jnp.dtype | str | None = None,
    ) -> KVCache | PagedKVCache:
        """An empty latent cache, R + Dr numbers per token: ``key`` is the latent ``[c_kv,
        k_pe] (B, 1, T, R + Dr)``, each token's c_kv and rotated k_pe in one row (FlashMLA's
        and vLLM's layout), and ``value`` is zero-width, ``(B, 1, T, 0)``: ``decode`` reads the
        values, c_kv, in place as the key's first R features.

        ``page_size`` given: a paged latent cache (:class:`PagedKVCache`, one head), a pool of
        ``P = B * ceil(max_len / page_size)`` pages that the sequences take as they grow: key
        pages ``[c_kv, k_pe] (P, page_size, 1, R + Dr)`` and value pages ``c_kv (P, page_size,
        1, R)`` (c_kv twice: 2R + Dr numbers per token); ``decode`` reads it through
        ``paged_attention``.

        ``dtype``: None or the module's; an fp8 format is ``fp8_cache`` (ConfigError): the
        latent cache has no fp8 form (its c_kv is multiplied by ``kv_b``'s absorbed weights).
        """
        T = check_cache_size(batch_size, max_len, page_size=page_size)
        check_cache_dtype(1, self.dtype.name, dtype, fp8=False)  # the module's dtype only
        d = self.dims
        if page_size is not None:
            P = batch_size * pages_needed(max_len, page_size)
            shape = (P, page_size, 1, d.R + d.Dr)
            key = jnp.zeros(shape, self.dtype)  # (P, page_size, 1, R+Dr): [c_kv, k_pe]
            shape = (P, page_size, 1, d.R)
            value = jnp.zeros(shape, self.dtype)  # (P, page_size, 1, R): c_kv
            return PagedKVCache(key, value, ((),) * batch_size, tuple(range(P)), max_len)
        latent = jnp.zeros((batch_size, 1, T, d.R + d.Dr), self.dtype)  # (B, 1, T, R+Dr)
        empty = jnp.zeros((batch_size, 1, T, 0), self.dtype)  # (B, 1, T, 0)
        return KVCache(latent, empty, 0)

    def decode(
        self, x: jax.Array, cache: KVCache, *, mask: jax.Array | None = None,
        bias: jax.Array | None = None, return_weights: bool = False,
    ) -> tuple:
        """New tokens ``x (B, L, M)`` through the latent cache (:meth:`init_cache`): the
        absorbed step, one MQA over the latent ``[c_kv, k_pe]`` (K = 1, D = R + Dr, E = R: the
        values are its first R features) with the module's scale. The same outputs as the naive
        forward's rows, token by token or in chunks. Returns ``(y, cache)`` or ``(y, weights,
        cache)``.

        A paged latent cache (``init_cache(..., page_size=)``) is written with
        ``paged_cache_write`` and read with ``paged_attention`` (:meth:`_decode_paged`); it
        takes no mask, bias or weights."""
        x, mask, bias = _asarray(x), _asarray(mask), _asarray(bias)
        if isinstance(cache, PagedKVCache):
            return self._decode_paged(x, cache, mask=mask, bias=bias, return_weights=return_weights)
        check_latent_decode_inputs(
            self.dims, jnp.dtype(self.dtype).name, x, cache_key=cache.key, cache_value=cache.value,
            position=cache.position, max_len=cache.max_len, mask=mask, bias=bias,
            return_weights=return_weights,
        )
        R = self.dims.R
        ct = compute_dtype(jnp.dtype(self.dtype).name)
        W_UK, W_UV = self._absorbed()  # (R, H, Dn), (R, H, E)
        # 1. projections of the new tokens.
        q_nope, q_pe = self._project_query(x)  # (B, H, L, Dn), (B, H, L, Dr)
        c_kv_new, k_pe_new = self._project_latent(x)  # (B, 1, L, R), (B, 1, L, Dr)
        # 2. RoPE: new token i at cache.position + i; the cache keeps the rotated k_pe.
        q_pe, k_pe_new = self._rotate(q_pe, k_pe_new, cache.position)
        # 3. absorption of kv_b_proj's key part into the query: q_lat_h = q_nope_h W_UK_h^T.
        q_lat = jnp.einsum("bhld,rhd->bhlr", q_nope.astype(ct), W_UK.astype(ct),
                           precision=_PRECISION)
        q_lat = q_lat.astype(self.dtype)  # (B, H, L, R)
        # 4. the latent cache: the new tokens' [c_kv, k_pe] written as keys (the value buffer
        #    is zero-width); all S = position + L read.
        latent_new = jnp.concatenate([c_kv_new, k_pe_new], -1)  # (B, 1, L, R+Dr)
        cache, k, _ = cache.append(latent_new, latent_new[..., :0])  # k (B, 1, S, R+Dr)
        # 5. one MQA over the latent: K = 1, D = R + Dr, E = R, the values the keys' first R
        #    features (c_kv), bottom-right causal.
        q = jnp.concatenate([q_lat, q_pe], -1)  # (B, H, L, R+Dr)
        v = k[..., :R]  # (B, 1, S, R), a slice
        o_lat, weights = self._attend(
            q, k, v, mask=mask, bias=bias, is_causal=True, causal_alignment="bottom_right",
            return_weights=return_weights,
        )  # o_lat (B, H, L, R)
        # 6. absorption of the value part into the output: o_h = o_lat_h W_UV_h.
        out = jnp.einsum("bhlr,rhe->bhle", o_lat.astype(ct), W_UV.astype(ct), precision=_PRECISION)
        out = out.astype(self.dtype)  # (B, H, L, E)
        # 7. heads merged back, output projection.
        y = self._project_output(out)  # (B, L, M)
        return (y, weights, cache) if return_weights else (y, cache)

    def _decode_paged(self, x: jax.Array, cache: PagedKVCache, **refused) -> tuple:
        """:meth:`decode` on a paged latent cache: ``(y (B, L, M), cache)``, the new tokens'
        ``[c_kv, k_pe]`` and ``c_kv`` written into the sequences' pages, then one MQA through
        ``paged_attention`` over each sequence's pages (K = 1, D = R + Dr, E = R)."""
        check_paged_decode_inputs(
            self.dims.paged, jnp.dtype(self.dtype).name, x, key_pages=cache.key_pages,
            value_pages=cache.value_pages, batch_size=len(cache.pages),
            position=cache.position, max_len=cache.max_len, **refused,
        )
        B, L, _ = x.shape
        H, R, Dr = self.dims.H, self.dims.R, self.dims.Dr
        ct = compute_dtype(jnp.dtype(self.dtype).name)
        W_UK, W_UV = self._absorbed()  # (R, H, Dn), (R, H, E)
        # 1. projections of the new tokens.
        q_nope, q_pe = self._project_query(x)  # (B, H, L, Dn), (B, H, L, Dr)
        c_kv_new, k_pe_new = self._project_latent(x)  # (B, 1, L, R), (B, 1, L, Dr)
        # 2. RoPE: new token i at cache.position + i; the cache keeps the rotated k_pe.
        q_pe, k_pe_new = self._rotate(q_pe, k_pe_new, cache.position)
        # 3. absorption of kv_b_proj's key part into the query: q_lat_h = q_nope_h W_UK_h^T.
        q_lat = jnp.einsum("bhld,rhd->bhlr", q_nope.astype(ct), W_UK.astype(ct),
                           precision=_PRECISION)
        q_lat = q_lat.astype(self.dtype)  # (B, H, L, R)
        # 4. the latent cache: each sequence takes the pages its new tokens need from the pool,
        #    and the new [c_kv, k_pe] (key pages) and c_kv (value pages) are written into them.
        cache = cache.write(jnp.concatenate([c_kv_new, k_pe_new], -1), c_kv_new)
        # 5. one MQA through paged_attention: K = 1, D = R + Dr, E = R, each sequence's L new
        #    queries (sequence b's rows b*L .. b*L + L - 1) over its S = position + L keys,
        #    read through its block-table row; bottom-right causal.
        q = jnp.concatenate([q_lat, q_pe], -1)  # (B, H, L, R+Dr)
        q = q.transpose(0, 2, 1, 3).reshape(B * L, H, R + Dr)  # (B*L, H, R+Dr)
        seq_lens = jnp.full((B,), cache.position, jnp.int32)  # (B,)
        cu_seqlens_q = jnp.arange(B + 1, dtype=jnp.int32) * L  # (B + 1,)
        o = self.options
        o_lat = paged_attention(
            q,
            cache.key_pages,
            cache.value_pages,
            cache.block_table(),
            seq_lens,
            cu_seqlens_q,
            is_causal=True,
            scale=self.scale,
            window=o.window,
            softcap=o.softcap,
            sinks=self.sinks,
        )  # (B*L, H, R)
        o_lat = o_lat.reshape(B, L, H, R).transpose(0, 2, 1, 3)  # (B, H, L, R)
        # 6. absorption of the value part into the output: o_h = o_lat_h W_UV_h.
        out = jnp.einsum("bhlr,rhe->bhle", o_lat.astype(ct), W_UV.astype(ct), precision=_PRECISION)
        out = out.astype(self.dtype)
        # 7. heads merged back, output projection.
        return self._project_output(out), cache  # (B, L, M)

    # -- canonical weights ---------------------------------------------------------------------

    def to_canonical(self) -> dict[str, np.ndarray]:
        """The canonical weights (``attention_spec.mla``), in forward order."""
        weights = {}
        for name in self.dims.canonical_shapes():
            owner, _, leaf = name.partition(".")
            held = getattr(self, owner)
            param = held.kernel if leaf == "kernel" else held  # (in, out), a norm's, or sinks
            weights[name] = np.array(param[...])
        return weights

    def load_canonical(self, weights: Mapping[str, np.ndarray]) -> None:
        """Copy canonical weights of this module's sizes into it, cast to its dtype."""
        weights = {name: np.asarray(w) for name, w in weights.items()}
        check_mla_canonical(
            weights, n_heads=self.dims.H, qk_rope_head_dim=self.dims.Dr, expected=self.dims
        )
        for name, w in weights.items():
            owner, _, leaf = name.partition(".")
            held = getattr(self, owner)
            param = held.kernel if leaf == "kernel" else held
            param.set_value(jnp.asarray(w, self.dtype))

    @classmethod
    def from_canonical(
        cls,
        weights: Mapping[str, np.ndarray],
        *,
        n_heads: int,
        qk_rope_head_dim: int,
        dtype: jnp.dtype | str | None = None,
        sinks: bool | None = None,
        **settings: Any,
    ) -> MultiHeadLatentAttention:
        """A module holding ``weights``; M, Q, R, Dn, E and sinks come from the shapes.
        ``settings``: the constructor's ``rope_*``, ``rms_norm_eps``, ``window``, ``softcap``,
        ``scale``."""
        weights = {name: np.asarray(w) for name, w in weights.items()}
        d = check_mla_canonical(
            weights, n_heads=n_heads, qk_rope_head_dim=qk_rope_head_dim, sinks=sinks
        )
        first = weights["kv_a_proj_with_mqa.kernel"].dtype
        dtype = jnp.dtype(module_dtype(first if dtype is None else dtype))
        # An abstract module (shapes only, no random init; how flax restores checkpoints).
        module = nnx.eval_shape(lambda: cls(
            d.M, d.H, kv_lora_rank=d.R, qk_nope_head_dim=d.Dn, qk_rope_head_dim=d.Dr,
            v_head_dim=d.E, q_lora_rank=d.Q, sinks=d.sinks, dtype=dtype, **settings,
        ))
        module.load_canonical(weights)
        return module

    def _settings(self) -> dict[str, Any]:
        o = self.options
        return {"rms_norm_eps": self.rms_norm_eps, "softcap": o.softcap, "scale": o.scale,
                "window": None if o.window is None else list(o.window)}

    def save(self, path: str | os.PathLike) -> None:
        """Write the canonical weights with H, Dr and the settings in the metadata."""
        metadata = mla_metadata(self.dims, self.rope, self._settings())
        save_file(self.to_canonical(), os.fspath(path), metadata=metadata)

    @classmethod
    def load(
        cls, path: str | os.PathLike, *, dtype: jnp.dtype | str | None = None
    ) -> MultiHeadLatentAttention:
        """A module from a file written by ``save`` (by any of the three implementations)."""
        with safe_open(os.fspath(path), framework="numpy") as f:
            settings = mla_from_metadata(f.metadata())
            weights = {name: f.get_tensor(name) for name in f.keys()}
        return cls.from_canonical(weights, dtype=dtype, **settings)
