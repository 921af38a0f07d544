"""The KV cache of autoregressive decoding in PyTorch: the keys and values of the tokens so far.

The same class, methods and comments as ``impl_numpy/cache.py`` and ``impl_jax/cache.py``; only
the idiom differs: here ``write`` stores the new tokens into the buffers in place, on their
device, and returns a cache sharing them (the same API shape as JAX's pure version).

A module makes the cache (``GroupedQueryAttention.init_cache`` in ``impl_torch/modules.py``) and
``decode`` appends to it; the checks of its sizes and of a cached forward's inputs are
``attention_spec.cache``'s. ``init_cache(..., dtype="float8_e4m3fn")`` (or ``"float8_e5m2"``)
stores the keys and values in fp8 with one descale per key/value head for the cache's life
(:meth:`KVCache.quantize`; SEMANTICS.md of the project, "FP8 KV cache").
``init_cache(..., page_size=)`` makes a :class:`PagedKVCache` instead: a pool of pages that
the sequences take as they grow, read by ``paged_attention``.

Shape letters (SEMANTICS.md): B batch, K key/value heads, T cache slots, L new tokens, S keys
attended, D query/key head dim, E value head dim, P pages.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from attention_spec import dtype_name, is_fp8
from attention_spec.paged import pages_needed
from impl_torch.fp8 import quantize_fp8
from impl_torch.paged import paged_cache_write

__all__ = ["KVCache", "PagedKVCache"]


def _quantized(
    stored: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_descale: torch.Tensor | None,
    v_descale: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """New tokens ``k (B, K, L, D)``, ``v (B, K, L, E)`` in the dtype of the buffer ``stored``,
    with the descales ``(K,)`` they were quantized with: unchanged (descales None) unless the
    buffer is fp8; then ``quantize_fp8`` over (B, L, D) at the given descales (static form), or
    at descales computed from k and v (dynamic form: the cache's first write when none was
    given), saturating at the format's max (never NaN)."""
    fmt = dtype_name(stored.dtype)
    if not is_fp8(fmt):
        return k, v, None, None
    k, k_descale = quantize_fp8(k, fmt, axes=(0, 2, 3), descale=k_descale)  # (B, K, L, D), (K,)
    v, v_descale = quantize_fp8(v, fmt, axes=(0, 2, 3), descale=v_descale)  # (B, K, L, E), (K,)
    return k, v, k_descale, v_descale


@dataclass(frozen=True)
class KVCache:
    """The keys and values of the tokens seen so far, for autoregressive decoding.

    ``key (B, K, T, D)`` and ``value (B, K, T, E)`` hold the K key/value heads, not the H query
    heads: a GQA cache is K/H the size of an MHA cache. ``position`` (a Python int, so an overflow
    is a Python error before any arithmetic) counts the tokens written. E may be 0: the latent
    cache of ``MultiHeadLatentAttention.init_cache`` holds its values as its keys' first
    features and a zero-width ``value``, which every method moves like any other.

    A plain cache has T = ``max_len`` slots and token p in slot p. A rolling cache
    (``rolling_max_len`` set: ``init_cache(..., rolling=True)`` of a module with
    ``window=(left, ...)``) has T = ``min(left + 1, max_len)`` slots used as a ring, token p in
    slot ``p % T`` (Mistral's rolling buffer): its memory does not grow with the sequence, and
    after each step it holds the window of the last token written.

    An fp8 cache (``init_cache(..., dtype="float8_e4m3fn")``: the buffers in that format) holds
    ``k_descale (K,)`` and ``v_descale (K,)``, float32: key ``[b, h, t]`` stands for
    ``float(key[b, h, t]) * k_descale[h]``. They are the caller's (``init_cache(...,
    k_descale=)``), or None until the first write computes them from its keys and values; then
    fixed (:meth:`quantize`). A cache of the module's dtype has None.

    ``write`` stores new tokens into the buffers in place and returns a cache with the position
    advanced, sharing the buffers (the same API shape as JAX's pure version).
    """

    key: torch.Tensor
    value: torch.Tensor
    position: int = 0
    rolling_max_len: int | None = None
    k_descale: torch.Tensor | None = None
    v_descale: torch.Tensor | None = None

    @property
    def rolling(self) -> bool:
        """Whether the cache is a ring of the window's size (``init_cache(..., rolling=True)``)."""
        return self.rolling_max_len is not None

    @property
    def max_len(self) -> int:
        """The most tokens the cache accepts (a rolling cache: ``init_cache``'s max_len)."""
        return self.key.shape[-2] if self.rolling_max_len is None else self.rolling_max_len

    @property
    def slots(self) -> int:
        """T, the buffers' length: ``max_len``, or a rolling cache's ``min(left + 1, max_len)``."""
        return self.key.shape[-2]

    @property
    def nbytes(self) -> int:
        """Bytes of the key and value buffers: ``B * K * T * (D + E) * itemsize``."""
        return sum(t.numel() * t.element_size() for t in (self.key, self.value))

    def _ring(self, start: int, stop: int) -> torch.Tensor:
        """The slots of tokens ``start .. stop - 1`` (``p % T``), ``(stop - start,)``."""
        return torch.arange(start, stop, device=self.key.device) % self.slots

    def quantize(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[KVCache, torch.Tensor, torch.Tensor]:
        """New tokens ``k (B, K, L, D)``, ``v (B, K, L, E)`` in the buffers' dtype, and the cache
        holding the descales they were quantized with: a cache of the module's dtype returns
        them unchanged; an fp8 cache quantizes them with ``quantize_fp8`` at its ``k_descale``
        and ``v_descale`` (static form), which its first write computes from that write's keys
        and values when none was given (dynamic form over (B, L, D)) and which stay fixed:
        later tokens beyond that range saturate at the format's max."""
        k, v, k_descale, v_descale = _quantized(self.key, k, v, self.k_descale, self.v_descale)
        return replace(self, k_descale=k_descale, v_descale=v_descale), k, v

    def write(self, k: torch.Tensor, v: torch.Tensor) -> KVCache:
        """Write ``k (B, K, L, D)`` and ``v (B, K, L, E)`` as the next L tokens (a rolling
        cache: the last ``min(L, T)`` of them, into their ring slots; an fp8 cache: quantized
        first, :meth:`quantize`)."""
        cache, k, v = self.quantize(k, v)
        return cache._put(k, v)

    def _put(self, k: torch.Tensor, v: torch.Tensor) -> KVCache:
        """Store ``k (B, K, L, D)`` and ``v (B, K, L, E)``, already in the buffers' dtype, as
        the next L tokens (a rolling cache: the last ``min(L, T)`` of them, into their ring
        slots)."""
        end = self.position + k.shape[-2]
        if not self.rolling:
            self.key[:, :, self.position : end] = k  # (B, K, T, D)
            self.value[:, :, self.position : end] = v  # (B, K, T, E)
            return replace(self, position=end)
        n = min(k.shape[-2], self.slots)  # older tokens of a long chunk would be overwritten
        slots = self._ring(end - n, end)  # (n,), distinct
        self.key[:, :, slots] = k[:, :, k.shape[-2] - n :]  # (B, K, T, D)
        self.value[:, :, slots] = v[:, :, v.shape[-2] - n :]  # (B, K, T, E)
        return replace(self, position=end)

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys ``(B, K, S, D)`` and values ``(B, K, S, E)`` new tokens attend besides
        themselves, oldest first: a plain cache's S = ``position`` written tokens; a rolling
        cache's last S = ``min(position, T - 1)`` (the ``left`` tokens a window reaches back)."""
        if not self.rolling:
            return self.key[:, :, : self.position], self.value[:, :, : self.position]
        slots = self._ring(self.position - min(self.position, self.slots - 1), self.position)
        return self.key[:, :, slots], self.value[:, :, slots]  # gathered copies, (B, K, S, D|E)

    def append(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[KVCache, torch.Tensor, torch.Tensor]:
        """Write the next L tokens ``k (B, K, L, D)``, ``v (B, K, L, E)``; return the new cache
        and the keys ``(B, K, S, D)`` and values ``(B, K, S, E)`` the new tokens attend: a plain
        cache's every token (S = position + L, views of the buffers, no copy), a rolling cache's
        last ``min(position, T - 1)`` then the L new ones (read before the ring is overwritten);
        an fp8 cache's in fp8 (:meth:`quantize`), to be read with its descales.
        """
        cache, k, v = self.quantize(k, v)  # in the buffers' dtype (an fp8 cache: quantized)
        if not self.rolling:
            cache = cache._put(k, v)
            return (cache, *cache.read())
        k_old, v_old = cache.read()  # (B, K, S_old, D|E), copies
        cache = cache._put(k, v)
        return cache, torch.cat([k_old, k], dim=2), torch.cat([v_old, v], dim=2)


@dataclass(frozen=True)
class PagedKVCache:
    """A paged KV cache: a pool of P pages of ``page_size`` slots, taken by the B sequences as
    they grow (vLLM's block manager, in one cache).

    ``key_pages (P, page_size, K, D)`` and ``value_pages (P, page_size, K, E)`` are the pool;
    ``pages[b]`` lists the pages sequence b holds, in order (its key p is slot
    ``p % page_size`` of page ``pages[b][p // page_size]``); ``free`` lists the pages no
    sequence holds, taken first to last. ``position`` (a Python int) counts the tokens written
    to every sequence. The pool and the bookkeeping belong to this cache: they are freed with it.

    ``write`` gives each sequence the pages its new tokens need (page index by page index, the
    sequences in turn, so a sequence's pages are not contiguous in the pool), stores the tokens
    with ``paged_cache_write`` in place, and returns a cache sharing the pool, on its device.

    An fp8 pool (``init_cache(..., page_size=, dtype="float8_e4m3fn")``) holds ``k_descale
    (K,)`` and ``v_descale (K,)`` as :class:`KVCache` does, fixed at the first write.
    """

    key_pages: torch.Tensor
    value_pages: torch.Tensor
    pages: tuple[tuple[int, ...], ...]
    free: tuple[int, ...]
    max_len: int
    position: int = 0
    k_descale: torch.Tensor | None = None
    v_descale: torch.Tensor | None = None

    @property
    def page_size(self) -> int:
        """The slots of one page."""
        return self.key_pages.shape[1]

    @property
    def max_pages(self) -> int:
        """The pages one sequence of ``max_len`` tokens holds: ``ceil(max_len / page_size)``."""
        return pages_needed(self.max_len, self.page_size)

    @property
    def nbytes(self) -> int:
        """Bytes of the pool: ``P * page_size * K * (D + E) * itemsize``."""
        return sum(t.numel() * t.element_size() for t in (self.key_pages, self.value_pages))

    def block_table(self) -> torch.Tensor:
        """``(B, max_pages)`` int32: row b is ``pages[b]``, then -1 (pages not taken)."""
        table = np.full((len(self.pages), self.max_pages), -1, np.int32)  # (B, max_pages)
        for b, held in enumerate(self.pages):
            table[b, : len(held)] = held
        return torch.from_numpy(table).to(self.key_pages.device)

    def _grow(self, end: int) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
        """The pages and free list once every sequence holds ``ceil(end / page_size)`` pages:
        page index by page index, sequence by sequence, each from the front of ``free``."""
        pages, free = [list(held) for held in self.pages], list(self.free)
        for _ in range(len(pages[0]), pages_needed(end, self.page_size)):
            for held in pages:
                held.append(free.pop(0))  # the pool holds B * max_pages: never empty here
        return tuple(tuple(held) for held in pages), tuple(free)

    def quantize(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[PagedKVCache, torch.Tensor, torch.Tensor]:
        """As :meth:`KVCache.quantize`: the new tokens in the pool's dtype and the cache holding
        their descales (an fp8 pool's, fixed at its first write)."""
        k, v, k_descale, v_descale = _quantized(self.key_pages, k, v, self.k_descale,
                                                self.v_descale)
        return replace(self, k_descale=k_descale, v_descale=v_descale), k, v

    def write(self, k: torch.Tensor, v: torch.Tensor) -> PagedKVCache:
        """Write ``k (B, K, L, D)`` and ``v (B, K, L, E)`` as the next L tokens of every
        sequence: token p of sequence b into slot ``page * page_size + p % page_size`` of its
        page ``pages[b][p // page_size]`` (an fp8 pool: quantized first, :meth:`quantize`)."""
        cache, k, v = self.quantize(k, v)
        B, K, L, _ = k.shape
        end = self.position + L
        pages, free = self._grow(end)
        p = np.arange(self.position, end)  # (L,), the new positions
        held = np.asarray(pages, np.int64)  # (B, pages held)
        slots = held[:, p // self.page_size] * self.page_size + p % self.page_size  # (B, L)
        slots = torch.from_numpy(slots.reshape(B * L)).to(self.key_pages.device)  # (B*L,)
        paged_cache_write(
            self.key_pages, self.value_pages, k.transpose(1, 2).reshape(B * L, K, -1),
            v.transpose(1, 2).reshape(B * L, K, -1), slots,
        )
        return replace(cache, pages=pages, free=free, position=end)
