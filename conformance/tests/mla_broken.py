"""The broken port's ``MultiHeadLatentAttention``: a small NumPy MLA on the broken port's own
functions (its ``scaled_dot_product_attention``, ``attention_weights``, ``apply_rotary``), the
forward naive, ``decode`` the absorbed step over a latent cache (contiguous, or paged: the
modules' broken paged pool of one head, key pages ``[c_kv, k_pe]`` and value pages ``c_kv``),
with the MLA bugs of :data:`conformance.tests.broken_ports.BUGS` switched in
(:func:`broken_mla`)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from attention_spec.arrays import ArraySpec
from attention_spec.cache import check_cache_dtype, check_paged_decode_inputs
from attention_spec.mla import check_mla_canonical, check_mla_config, check_mla_rope
from attention_spec.modules import (
    ModuleDims,
    check_attention_options,
    check_cache_size,
    check_decode_inputs,
    check_module_inputs,
)
from attention_spec.paged import pages_needed
from conformance.tests.module_broken import _paged_read, _paged_write, _PagedCache


class _LatentCache(NamedTuple):
    """``c_kv (B, 1, position, R)`` and the rotated ``k_pe (B, 1, position, Dr)`` so far."""

    key: np.ndarray
    value: np.ndarray
    max_len: int
    position: int = 0


def broken_mla(bug: str | None, scaled_dot_product_attention, attention_weights, apply_rotary):
    """The broken port's MultiHeadLatentAttention (loaded with ``from_canonical`` only)."""

    class MultiHeadLatentAttention:
        def __init__(self, d_model=None, n_heads=None, **sizes):
            if d_model is not None:  # construction checks only; from_canonical loads
                sizes.setdefault("q_lora_rank", None)
                check_mla_config(d_model, n_heads, **sizes)

        @classmethod
        def from_canonical(cls, weights, *, n_heads, qk_rope_head_dim, dtype=None, sinks=None,
                           rope_theta=10000.0, rope_interleaved=False, rope_inv_freq=None,
                           rope_attention_factor=1.0, rms_norm_eps=1e-6, window=None,
                           softcap=None, scale=None):
            weights = {n: np.asarray(w) for n, w in weights.items()}
            self = cls()
            self.dims = check_mla_canonical(
                weights, n_heads=n_heads, qk_rope_head_dim=qk_rope_head_dim, sinks=sinks
            )
            self.dtype = np.dtype(dtype or weights["kv_a_proj_with_mqa.kernel"].dtype)
            self.rope = check_mla_rope(rope_theta, rope_interleaved, rope_inv_freq,
                                       rope_attention_factor, self.dims)
            self.options = check_attention_options(self.dtype.name, window=window,
                                                   softcap=softcap, scale=scale)
            d = self.dims
            self.scale = (d.Dn + d.Dr) ** -0.5 if scale is None else self.options.scale
            if bug == "mla_mscale_twice":  # YaRN's cos/sin factor squared into the scale too
                self.scale *= self.rope.attention_factor**2
            self.eps = rms_norm_eps
            self.w = {n: w.astype(self.dtype) for n, w in weights.items()}
            return self

        def _ct(self):
            return np.float64 if self.dtype == np.float64 else np.float32

        def _linear(self, name, x):  # (B, T, in) -> (B, T, out)
            return (x.astype(self._ct()) @ self.w[f"{name}.kernel"].astype(self._ct())).astype(
                self.dtype
            )

        def _norm(self, x, name):  # RMSNorm in float32 (float64), rounded once
            xf = x.astype(self._ct())
            y = xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
            return (y * self.w[f"{name}.weight"].astype(self._ct())).astype(self.dtype)

        def _rotate(self, x, start):  # (B, heads, L, Dr) at positions start + i (first Dr)
            r = self.rope
            inv = None if r.inv_freq is None else np.array(r.inv_freq)
            interleaved = r.interleaved != (bug == "mla_rope_pairs_other")
            return apply_rotary(x, start + np.arange(x.shape[2]), theta=r.theta,
                                rotary_dim=self.dims.Dr, interleaved=interleaved, inv_freq=inv,
                                attention_factor=r.attention_factor)

        def _project(self, x, start):
            """q_nope (B, H, L, Dn), rotated q_pe (B, H, L, Dr), c_kv (B, 1, L, R), rotated
            k_pe (B, 1, L, Dr) (and the unrotated one)."""
            d, (B, L, _) = self.dims, x.shape
            if d.Q is None:
                q = self._linear("q_proj", x)
            else:
                q_a = self._linear("q_a_proj", x)  # (B, L, Q)
                if bug != "mla_q_norm_missing":
                    q_a = self._norm(q_a, "q_a_layernorm")
                q = self._linear("q_b_proj", q_a)
            q = q.reshape(B, L, d.H, d.Dn + d.Dr).transpose(0, 2, 1, 3)
            kv = self._linear("kv_a_proj_with_mqa", x)  # (B, L, R+Dr)
            c_kv = kv[..., : d.R] if bug == "mla_kv_norm_missing" else self._norm(
                kv[..., : d.R], "kv_a_layernorm")
            k_pe = kv[:, None, :, d.R :]  # (B, 1, L, Dr)
            rotated = self._rotate(k_pe, start)
            q_nope = q[..., : d.Dn]
            if bug == "mla_rope_on_nope":  # the nope features rotated too (their first Dr)
                q_nope = self._rotate(q_nope, start)
            return q_nope, self._rotate(q[..., d.Dn :], start), c_kv[:, None], rotated, k_pe

        def _attend(self, q, k, v, return_weights, scale, **keywords):
            o = self.options
            keywords |= dict(window=o.window, softcap=o.softcap, sinks=self.w.get("sinks"),
                             scale=scale)
            out = scaled_dot_product_attention(q, k, v, **keywords)
            w = attention_weights(q, k, **keywords) if return_weights else None
            return out, w

        def _output(self, out):  # (B, H, L, E) -> (B, L, M)
            B, H, L, E = out.shape
            return self._linear("o_proj", out.transpose(0, 2, 1, 3).reshape(B, L, H * E))

        def __call__(self, x, *, mask=None, bias=None, is_causal=False,
                     causal_alignment="top_left", return_weights=False, q_segment_ids=None,
                     kv_segment_ids=None):
            d = self.dims
            ids = dict(q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
            check_module_inputs(d.naive, self.dtype.name, x, None, mask=mask, bias=bias,
                                is_causal=is_causal, causal_alignment=causal_alignment,
                                return_weights=return_weights, **ids)
            q_nope, q_pe, c_kv, k_pe, _ = self._project(x, 0)
            B, _, S, _ = c_kv.shape
            kv = self._linear("kv_b_proj", c_kv[:, 0]).reshape(B, S, d.H, d.Dn + d.E)
            kv = kv.transpose(0, 2, 1, 3)  # (B, H, S, Dn+E)
            k_pe = np.broadcast_to(k_pe, (B, d.H, S, d.Dr))
            if bug == "mla_k_pe_not_shared":  # only head 0 gets the shared rotary key
                k_pe = np.concatenate([k_pe[:, :1], np.zeros_like(k_pe[:, 1:])], axis=1)
            q = np.concatenate([q_nope, q_pe], -1)
            k_nope = kv[..., : d.Dn]
            if bug == "mla_rope_on_nope":
                k_nope = self._rotate(k_nope, 0)
            k = np.concatenate([k_nope, k_pe], -1)
            out, w = self._attend(q, k, kv[..., d.Dn :], return_weights, self.scale, mask=mask,
                                  bias=bias, is_causal=is_causal,
                                  causal_alignment=causal_alignment, **ids)
            y = self._output(out)
            return (y, w) if return_weights else y

        def init_cache(self, batch_size, max_len, *, page_size=None, dtype=None):
            check_cache_size(batch_size, max_len, page_size=page_size)
            check_cache_dtype(1, self.dtype.name, dtype, fp8=False)  # no fp8 latent cache
            d = self.dims
            if page_size is not None:  # NaN pools: a stray read shows
                P = batch_size * pages_needed(max_len, page_size)
                key = np.full((P, page_size, 1, d.R + d.Dr), np.nan, self.dtype)  # [c_kv, k_pe]
                value = np.full((P, page_size, 1, d.R), np.nan, self.dtype)  # c_kv
                return _PagedCache(key, value, ((),) * batch_size, tuple(range(P)), max_len)
            c_kv = np.zeros((batch_size, 1, 0, d.R), self.dtype)  # (B, 1, 0, R)
            k_pe = np.zeros((batch_size, 1, 0, d.Dr), self.dtype)  # (B, 1, 0, Dr)
            return _LatentCache(c_kv, k_pe, max_len)

        def _absorb(self, q_nope):
            """``q_lat (B, H, L, R)`` and ``W_UV (R, H, E)`` in the compute dtype."""
            d, ct = self.dims, self._ct()
            w = self.w["kv_b_proj.kernel"].reshape(d.R, d.H, d.Dn + d.E).astype(ct)
            w_uk, w_uv = w[..., : d.Dn], w[..., d.Dn :]  # (R, H, Dn), (R, H, E)
            if bug == "mla_absorb_uk_uv_swapped":  # each head's columns read as value, key
                w_uv, w_uk = w[..., : d.E], w[..., d.E :]
            return np.einsum("bhld,rhd->bhlr", q_nope.astype(ct), w_uk), w_uv

        def _decode_paged(self, x, cache, **refused):
            d, position = self.dims, cache.position
            paged = ModuleDims(d.M, d.H, 1, d.R + d.Dr, d.R, False, d.sinks)
            check_paged_decode_inputs(
                paged, self.dtype.name, x, key_pages=cache.key_pages,
                value_pages=cache.value_pages, batch_size=len(cache.pages), position=position,
                max_len=cache.max_len, **refused,
            )
            q_nope, q_pe, c_new, k_pe_new, unrotated = self._project(x, position)
            q_lat, w_uv = self._absorb(q_nope)
            stored = unrotated if bug == "mla_paged_k_pe_unrotated" else k_pe_new
            cache = _paged_write(cache, np.concatenate([c_new, stored], -1), c_new, bug)
            k, v = _paged_read(cache, bug)  # (B, 1, S, R+Dr), (B, 1, S, R)
            if bug == "mla_paged_value_from_key_tail":  # the key's last R features, not c_kv
                v = k[..., d.Dr :]
            q = np.concatenate([q_lat.astype(self.dtype), q_pe], -1)
            o_lat, _ = self._attend(q, k, v, False, self.scale, is_causal=True,
                                    causal_alignment="bottom_right")
            out = np.einsum("bhlr,rhe->bhle", o_lat.astype(self._ct()), w_uv).astype(self.dtype)
            return self._output(out), cache

        def decode(self, x, cache, *, mask=None, bias=None, return_weights=False):
            if isinstance(cache, _PagedCache):
                return self._decode_paged(x, cache, mask=mask, bias=bias,
                                          return_weights=return_weights)
            d, position = self.dims, cache.position
            B = cache.key.shape[0]
            latent = ModuleDims(d.M, d.H, 1, d.R, d.Dr, False, d.sinks)
            check_decode_inputs(
                latent, self.dtype.name, x,
                cache_key=ArraySpec((B, 1, cache.max_len, d.R), self.dtype.name),
                cache_value=ArraySpec((B, 1, cache.max_len, d.Dr), self.dtype.name),
                position=position, max_len=cache.max_len, mask=mask, bias=bias,
                return_weights=return_weights,
            )
            q_nope, q_pe, c_new, k_pe_new, unrotated = self._project(x, position)
            ct = self._ct()
            q_lat, w_uv = self._absorb(q_nope)
            stored = unrotated if bug == "mla_cache_k_pe_unrotated" else k_pe_new
            c_kv = np.concatenate([cache.key, c_new], axis=2)  # (B, 1, S, R)
            k_pe = np.concatenate([cache.value, k_pe_new], axis=2)  # (B, 1, S, Dr)
            q = np.concatenate([q_lat.astype(self.dtype), q_pe], -1)
            k = np.concatenate([c_kv, k_pe], -1)
            scale = None if bug == "mla_absorbed_scale_latent" else self.scale  # (R + Dr) ** -0.5
            o_lat, weights = self._attend(q, k, c_kv, return_weights, scale, mask=mask,
                                          bias=bias, is_causal=True,
                                          causal_alignment="bottom_right")
            out = np.einsum("bhlr,rhe->bhle", o_lat.astype(ct), w_uv).astype(self.dtype)
            y = self._output(out)
            end = position + x.shape[1]
            new = _LatentCache(c_kv, np.concatenate([cache.value, stored], axis=2),
                               cache.max_len, end)
            return (y, weights, new) if return_weights else (y, new)

    return MultiHeadLatentAttention
