"""The broken port's modules: ``GroupedQueryAttention`` and ``MultiHeadAttention`` with a KV
cache (plain, rolling and paged; of the module's dtype or fp8), built on the broken port's own
functions, with the module and cache bugs of :data:`conformance.tests.broken_ports.BUGS`
switched in (:func:`broken_modules`)."""

from __future__ import annotations

from typing import NamedTuple

import ml_dtypes
import numpy as np

from attention_spec import FP8_MAX, alibi_slope_values, causal_offset, check_rope_config, is_fp8
from attention_spec.cache import check_cache_dtype, check_paged_decode_inputs
from attention_spec.modules import (
    check_attention_options,
    check_cache_size,
    check_canonical,
    check_decode_inputs,
    check_module_config,
    check_module_inputs,
    module_dtype,
)
from attention_spec.paged import pages_needed
from attention_spec.validate import ArraySpec


class _Cache(NamedTuple):
    """The broken ports' KV cache: the keys (B, K, position, D) and values written so far (a
    rolling one: the last ``slots`` of them), and how many tokens were written."""

    key: np.ndarray
    value: np.ndarray
    max_len: int
    position: int = 0
    slots: int | None = None  # a rolling cache's min(left + 1, max_len)
    k_descale: np.ndarray | None = None  # an fp8 cache's (K,), fixed at its first write
    v_descale: np.ndarray | None = None


class _PagedCache(NamedTuple):
    """The broken ports' paged KV cache: a pool ``(P, page_size, K, D|E)``, each sequence's
    pages in order (taken page index by page index, the sequences in turn, so sequence b's
    pages are not ``b * max_pages ..``), the free pages, and how many tokens were written."""

    key_pages: np.ndarray
    value_pages: np.ndarray
    pages: tuple[tuple[int, ...], ...]
    free: tuple[int, ...]
    max_len: int
    position: int = 0
    k_descale: np.ndarray | None = None  # an fp8 pool's (K,), fixed at its first write
    v_descale: np.ndarray | None = None


def _fp8_write(cache, new_k, new_v, bug: str | None):
    """The new tokens ``(B, K, L, D|E)`` in the cache's dtype, and the cache with its descales:
    an fp8 cache quantizes them at its descales (the first write's dynamic ones when none),
    saturating; any other cache returns them as they are."""
    fmt = cache.key_pages.dtype if isinstance(cache, _PagedCache) else cache.key.dtype
    if not is_fp8(fmt.name):
        return cache, new_k, new_v
    top = np.float32(FP8_MAX[fmt.name])
    descales = []
    for x, given in ((new_k, cache.k_descale), (new_v, cache.v_descale)):
        if given is None or bug == "decode_fp8_cache_descale_per_write":
            amax = np.abs(x.astype(np.float32)).max(axis=(0, 2, 3))  # (K,)
            dynamic = np.maximum(amax / top, np.float32(2.0**-126))
            given = np.where(amax == 0, np.float32(1.0), dynamic).astype(np.float32)
        descales.append(given)
    stored = []
    for x, d in zip((new_k, new_v), descales, strict=True):
        quotient = x.astype(np.float32) / d[None, :, None, None]
        if bug != "decode_fp8_cache_not_saturating":
            quotient = np.clip(quotient, -top, top)
        with np.errstate(all="ignore"):
            stored.append(quotient.astype(getattr(ml_dtypes, fmt.name)))
    return cache._replace(k_descale=descales[0], v_descale=descales[1]), *stored


def _fp8_keywords(cache, bug: str | None) -> dict:
    """The descales an fp8 cache's attention call takes (none for a cache of the module's
    dtype)."""
    if cache.k_descale is None or bug == "decode_fp8_cache_descale_dropped":
        return {}
    return {"k_descale": cache.k_descale, "v_descale": cache.v_descale}


def _by_query_head(k, v, keywords: dict, H: int):
    """The bug ``decode_fp8_cache_k_descale_by_query_head``: keys and values widened to the H
    query heads (head h reads key/value head h // G), k_descale indexed by h % K."""
    if "k_descale" not in keywords:
        return k, v, keywords
    K = k.shape[1]
    heads = np.arange(H) // (H // K)
    k, v = np.take(k, heads, axis=1), np.take(v, heads, axis=1)  # (B, H, S, D|E)
    keywords = {"k_descale": keywords["k_descale"][np.arange(H) % K],
                "v_descale": keywords["v_descale"][heads]}
    return k, v, keywords


def _paged_write(cache: _PagedCache, new_k, new_v, bug: str | None) -> _PagedCache:
    """The new tokens ``(B, K, L, D|E)`` into the pool, each sequence taking the pages it needs."""
    ps, end = cache.key_pages.shape[1], cache.position + new_k.shape[2]
    pages, free = [list(p) for p in cache.pages], list(cache.free)
    while len(pages[0]) < pages_needed(end, ps):
        for held in pages:
            held.append(free.pop(0))
    for b, held in enumerate(pages):
        for i, p in enumerate(range(cache.position, end)):
            offset = p % ps
            if bug == "decode_paged_offset_from_chunk":  # the chunk's own index, not p's
                offset = i % ps
            cache.key_pages[held[p // ps], offset] = new_k[b, :, i]
            cache.value_pages[held[p // ps], offset] = new_v[b, :, i]
    pages = tuple(tuple(p) for p in pages)
    return cache._replace(pages=pages, free=tuple(free), position=end)


def _paged_read(cache: _PagedCache, bug: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Every sequence's ``position`` keys ``(B, K, S, D)`` and values, page by page."""
    ps, max_pages = cache.key_pages.shape[1], pages_needed(cache.max_len, cache.key_pages.shape[1])
    keys, values = [], []
    for b, held in enumerate(cache.pages):
        if bug == "decode_paged_contiguous_pages":  # pages assumed b * max_pages + i
            held = [b * max_pages + i for i in range(len(held))]
        rows = [(held[p // ps], p % ps) for p in range(cache.position)]
        keys.append(np.stack([cache.key_pages[page, off] for page, off in rows], axis=1))
        values.append(np.stack([cache.value_pages[page, off] for page, off in rows], axis=1))
    return np.stack(keys), np.stack(values)


def broken_modules(bug: str | None, scaled_dot_product_attention, attention_weights, apply_rotary):
    """GroupedQueryAttention and MultiHeadAttention of the broken port, on its own functions."""

    class GroupedQueryAttention:
        def __init__(self, d_model, n_heads, n_kv_heads, *, head_dim=None, value_head_dim=None,
                     bias=True, rope_theta=None, rope_interleaved=False, rotary_dim=None,
                     rope_inv_freq=None, rope_attention_factor=1.0, window=None, sinks=False,
                     alibi=False, softcap=None, scale=None, dtype="float32"):
            dtype = np.dtype(module_dtype(dtype))
            self.dims = check_module_config(
                d_model, n_heads, n_kv_heads, head_dim, value_head_dim, bias=bias,
                dtype=dtype.name, sinks=sinks,
            )
            self.rope = check_rope_config(
                rope_theta, rope_interleaved, rotary_dim, self.dims.D, rope_inv_freq,
                rope_attention_factor,
            )
            self.options = check_attention_options(
                dtype.name, window=window, sinks=sinks, alibi=alibi, softcap=softcap, scale=scale
            )
            self.dtype = dtype
            self.w = {n: np.zeros(s, dtype) for n, s in self.dims.canonical_shapes().items()}

        @classmethod
        def from_canonical(cls, weights, *, n_heads, n_kv_heads, dtype=None, sinks=None, **rope):
            weights = {n: np.asarray(w) for n, w in weights.items()}
            shapes = {n: w.shape for n, w in weights.items()}
            if bug == "weights_not_checked":  # sizes read off two kernels, nothing else checked
                (M, HD), KE = shapes["q_proj.kernel"], shapes["v_proj.kernel"][1]
                D, E, bias = HD // n_heads, KE // n_kv_heads, "q_proj.bias" in shapes
                dims = check_module_config(M, n_heads, n_kv_heads, D, E, bias=bias)
            else:
                dims = check_canonical(weights, n_heads=n_heads, n_kv_heads=n_kv_heads, sinks=sinks)
            dtype = np.dtype(dtype or weights["q_proj.kernel"].dtype)
            module = GroupedQueryAttention(
                dims.M, dims.H, dims.K, head_dim=dims.D, value_head_dim=dims.E, bias=dims.bias,
                sinks=dims.sinks, dtype=dtype, **rope,
            )
            module.w = {n: w.astype(dtype) for n, w in weights.items()}
            return module

        def _linear(self, name, x):  # (B, T, in) -> (B, T, out), computed in float32 or 64
            ct = np.float64 if x.dtype == np.float64 else np.float32
            kernel = self.w[f"{name}.kernel"].astype(ct)
            if bug == "o_proj_transposed" and name == "o_proj":
                kernel = kernel.T
            y = x.astype(ct) @ kernel
            if f"{name}.bias" in self.w and bug != "bias_missing":
                y = y + self.w[f"{name}.bias"].astype(ct)
            return y.astype(x.dtype)

        def _split(self, y, n):  # (B, T, n*X) -> (B, n, T, X)
            B, T, F = y.shape
            if bug == "heads_wrong_end":
                return y.reshape(B, T, F // n, n).transpose(0, 3, 1, 2)
            return y.reshape(B, T, n, F // n).transpose(0, 2, 1, 3)

        def _merge(self, out):  # (B, H, L, E) -> (B, L, H*E)
            B, H, L, E = out.shape
            if bug == "heads_wrong_end":
                return out.transpose(0, 2, 3, 1).reshape(B, L, E * H)
            return out.transpose(0, 2, 1, 3).reshape(B, L, H * E)

        def _rotate(self, q, k, q_start, k_start, decode=False):  # RoPE: query i at q_start + i
            if self.rope is None:
                return q, k
            kw = self.rope.keywords()  # theta, rotary_dim, interleaved, attention_factor
            if self.rope.inv_freq is not None and not (
                bug == "module_rope_inv_freq_ignored"
                or (bug == "decode_rope_inv_freq_ignored" and decode)
            ):
                kw["inv_freq"] = np.asarray(self.rope.inv_freq, np.float64)
            q = apply_rotary(q, q_start + np.arange(q.shape[2]), **kw)
            if bug == "module_rope_attention_factor_once":  # the factor on the queries only
                kw["attention_factor"] = 1.0
            return q, apply_rotary(k, k_start + np.arange(k.shape[2]), **kw)

        def _names(self):  # the projections of the queries and of the keys
            return ("k_proj", "q_proj") if bug == "qk_swapped" else ("q_proj", "k_proj")

        def _attend(self, q, k, v, return_weights, **keywords):
            o = self.options  # the module's v2 settings, passed to every call
            ct = np.float64 if self.dtype == np.float64 else np.float32
            sinks = self.w.get("sinks") if bug != "module_sinks_ignored" else None
            slopes = np.array(alibi_slope_values(self.dims.H), ct) if o.alibi else None
            keywords |= dict(
                window=None if bug == "module_window_ignored" else o.window,
                softcap=None if bug == "module_softcap_ignored" else o.softcap,
                scale=None if bug == "module_scale_ignored" else o.scale,
                alibi_slopes=None if bug == "module_alibi_ignored" else slopes,
                sinks=sinks,
            )
            out = scaled_dot_product_attention(q, k, v, **keywords)  # (B, H, L, E)
            y = self._linear("o_proj", self._merge(out))  # (B, L, M)
            if not return_weights:
                return (y,)
            keywords.pop("v_descale", None)  # an fp8 cache's: the weights read no value
            w = attention_weights(q, k, **keywords)  # (B, H, L, S)
            if bug == "weights_averaged":
                w = w.mean(axis=1).astype(w.dtype)  # (B, L, S)
            return y, w

        def __call__(
            self,
            x,
            context=None,
            *,
            mask=None,
            bias=None,
            is_causal=False,
            causal_alignment="top_left",
            return_weights=False,
            q_segment_ids=None,
            kv_segment_ids=None,
        ):
            ids = dict(q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids)
            check_module_inputs(
                self.dims, self.dtype.name, x, context, mask=mask, bias=bias, is_causal=is_causal,
                causal_alignment=causal_alignment, return_weights=return_weights, **ids,
            )
            context = x if context is None else context
            q_name, k_name = self._names()
            q = self._split(self._linear(q_name, x), self.dims.H)  # (B, H, L, D)
            k = self._split(self._linear(k_name, context), self.dims.K)  # (B, K, S, D)
            v = self._split(self._linear("v_proj", context), self.dims.K)  # (B, K, S, E)
            offset = causal_offset(q.shape[2], k.shape[2], causal_alignment)
            q, k = self._rotate(q, k, offset, 0)
            result = self._attend(
                q, k, v, return_weights, mask=mask, bias=bias, is_causal=is_causal,
                causal_alignment=causal_alignment, **ids,
            )
            return result if return_weights else result[0]

        def init_cache(self, batch_size, max_len, *, rolling=False, page_size=None, dtype=None,
                       k_descale=None, v_descale=None):
            T = check_cache_size(
                batch_size, max_len, rolling=rolling, left=self.options.left, page_size=page_size
            )
            stored = check_cache_dtype(
                self.dims.K, self.dtype.name, dtype, k_descale=k_descale, v_descale=v_descale
            )
            dtype = np.dtype(getattr(ml_dtypes, stored)) if is_fp8(stored) else self.dtype
            K = self.dims.K
            descales = [None if d is None else np.broadcast_to(np.asarray(d, np.float32), (K,))
                        for d in (k_descale, v_descale)]
            B, D, E = batch_size, self.dims.D, self.dims.E
            if page_size is not None:
                P = B * pages_needed(max_len, page_size)
                with np.errstate(invalid="ignore"):  # NaN: a stray read shows (fp8: NaN too)
                    key = np.full((P, page_size, K, D), np.nan).astype(dtype)
                    value = np.full((P, page_size, K, E), np.nan).astype(dtype)
                return _PagedCache(key, value, ((),) * B, tuple(range(P)), max_len, 0, *descales)
            empty_k, empty_v = (
                np.zeros((B, K, 0, D), dtype),
                np.zeros((B, K, 0, E), dtype),
            )
            return _Cache(empty_k, empty_v, max_len, 0, T if rolling else None, *descales)

        def _decode_paged(self, x, cache, **refused):
            check_paged_decode_inputs(
                self.dims, self.dtype.name, x, key_pages=cache.key_pages,
                value_pages=cache.value_pages, batch_size=len(cache.pages),
                position=cache.position, max_len=cache.max_len, **refused,
            )
            q_name, k_name = self._names()
            q = self._split(self._linear(q_name, x), self.dims.H)  # (B, H, L, D)
            new_k = self._split(self._linear(k_name, x), self.dims.K)  # (B, K, L, D)
            new_v = self._split(self._linear("v_proj", x), self.dims.K)  # (B, K, L, E)
            q, new_k = self._rotate(q, new_k, cache.position, cache.position)
            cache, new_k, new_v = _fp8_write(cache, new_k, new_v, bug)
            cache = _paged_write(cache, new_k, new_v, bug)
            k, v = _paged_read(cache, bug)  # (B, K, S, D|E)
            fp8 = _fp8_keywords(cache, bug)
            if bug == "decode_fp8_cache_k_descale_by_query_head":
                k, v, fp8 = _by_query_head(k, v, fp8, self.dims.H)
            (y,) = self._attend(q, k, v, False, is_causal=True, causal_alignment="bottom_right",
                                **fp8)
            return y, cache

        def decode(self, x, cache, *, mask=None, bias=None, return_weights=False, **ids):
            if isinstance(cache, _PagedCache):
                return self._decode_paged(
                    x, cache, mask=mask, bias=bias, return_weights=return_weights, **ids
                )
            position, max_len = cache.position, cache.max_len
            if bug == "cache_no_overflow_check":
                max_len = max(max_len, position + x.shape[1])
            B, K, _, D = cache.key.shape
            T = cache.key.shape[2] if cache.slots is None else cache.slots  # the slots it checks
            check_decode_inputs(
                self.dims, self.dtype.name, x,
                cache_key=ArraySpec((B, K, T, D), cache.key.dtype.name),
                cache_value=ArraySpec((B, K, T, cache.value.shape[3]), cache.value.dtype.name),
                position=position, max_len=max_len, mask=mask, bias=bias,
                return_weights=return_weights, rolling=cache.slots is not None,
                left=self.options.left, **ids,
            )
            q_name, k_name = self._names()
            q = self._split(self._linear(q_name, x), self.dims.H)  # (B, H, L, D)
            new_k = self._split(self._linear(k_name, x), self.dims.K)  # (B, K, L, D)
            new_v = self._split(self._linear("v_proj", x), self.dims.K)  # (B, K, L, E)
            start = 0 if bug == "rope_decode_not_offset" else position
            q, new_k = self._rotate(q, new_k, start, start, decode=True)
            cache, new_k, new_v = _fp8_write(cache, new_k, new_v, bug)
            keep = cache.key.shape[2]  # a plain cache: every token so far
            if cache.slots is not None:  # a rolling cache: the window's last left tokens
                keep = min(position, cache.slots - 1)
                if bug == "rolling_cache_drops_key":
                    keep = max(keep - 1, 0)
            old_k = cache.key[:, :, cache.key.shape[2] - keep :]
            old_v = cache.value[:, :, cache.value.shape[2] - keep :]
            k = np.concatenate([old_k, new_k], axis=2)  # (B, K, S, D), S = keep + L
            v = np.concatenate([old_v, new_v], axis=2)  # (B, K, S, E)
            alignment = "top_left" if bug == "decode_top_left" else "bottom_right"
            fp8 = _fp8_keywords(cache, bug)
            if bug == "decode_fp8_cache_k_descale_by_query_head":
                k, v, fp8 = _by_query_head(k, v, fp8, self.dims.H)
            result = self._attend(
                q, k, v, return_weights, mask=mask, bias=bias, is_causal=True,
                causal_alignment=alignment, **ids, **fp8,
            )
            all_k = np.concatenate([cache.key, new_k], axis=2)
            all_v = np.concatenate([cache.value, new_v], axis=2)
            if cache.slots is not None:  # the ring keeps the last slots tokens only
                all_k, all_v = all_k[:, :, -cache.slots :], all_v[:, :, -cache.slots :]
            end = position + x.shape[1]
            return (*result, cache._replace(key=all_k, value=all_v, position=end))

    class MultiHeadAttention(GroupedQueryAttention):
        def __init__(self, d_model, n_heads, **keywords):
            super().__init__(d_model, n_heads, n_heads, **keywords)

        @classmethod
        def from_canonical(cls, weights, *, n_heads, n_kv_heads=None, dtype=None, **rope):
            n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads  # rope: every setting
            return GroupedQueryAttention.from_canonical(
                weights, n_heads=n_heads, n_kv_heads=n_kv_heads, dtype=dtype, **rope
            )

    return GroupedQueryAttention, MultiHeadAttention
