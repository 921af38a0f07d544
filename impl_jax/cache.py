"""The KV cache of autoregressive decoding in JAX: the keys and values of the tokens so far.

The same class, methods and comments as ``impl_numpy/cache.py`` and ``impl_torch/cache.py``; only
the idiom differs: here the cache is a pytree, and ``write`` returns a new one (``.at[].set``)
and leaves the old one as it was.

A module makes the cache (``GroupedQueryAttention.init_cache`` in ``impl_jax/modules.py``) and
``decode`` appends to it; the checks of its sizes and of a cached forward's inputs are
``attention_spec.cache``'s.

Shape letters (SEMANTICS.md): B batch, K key/value heads, T cache slots, L new tokens, S keys
attended, D query/key head dim, E value head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["KVCache"]


@partial(
    jax.tree_util.register_dataclass,
    data_fields=["key", "value"],
    meta_fields=["position", "rolling_max_len"],
)
@dataclass(frozen=True)
class KVCache:
    """The keys and values of the tokens seen so far, for autoregressive decoding.

    ``key (B, K, T, D)`` and ``value (B, K, T, E)`` hold the K key/value heads, not the H query
    heads: a GQA cache is K/H the size of an MHA cache. ``position`` (a Python int, so an overflow
    is a Python error before any arithmetic) counts the tokens written.

    A plain cache has T = ``max_len`` slots and token p in slot p. A rolling cache
    (``rolling_max_len`` set: ``init_cache(..., rolling=True)`` of a module with
    ``window=(left, ...)``) has T = ``min(left + 1, max_len)`` slots used as a ring, token p in
    slot ``p % T`` (Mistral's rolling buffer): its memory does not grow with the sequence, and
    after each step it holds the window of the last token written.

    A pytree whose ``position`` is static: ``write`` returns a new cache (``.at[].set``) and
    leaves this one as it was. Under ``jax.jit`` each position compiles once.
    """

    key: jax.Array
    value: jax.Array
    position: int = 0
    rolling_max_len: int | None = None

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
        return self.key.nbytes + self.value.nbytes

    def _ring(self, start: int, stop: int) -> np.ndarray:
        """The slots of tokens ``start .. stop - 1`` (``p % T``), ``(stop - start,)``; static
        (NumPy), since the position is."""
        return np.arange(start, stop) % self.slots

    def write(self, k: jax.Array, v: jax.Array) -> KVCache:
        """Write ``k (B, K, L, D)`` and ``v (B, K, L, E)`` as the next L tokens (a rolling
        cache: the last ``min(L, T)`` of them, into their ring slots)."""
        end = self.position + k.shape[-2]
        if not self.rolling:
            key = self.key.at[:, :, self.position : end].set(k)  # (B, K, T, D)
            value = self.value.at[:, :, self.position : end].set(v)  # (B, K, T, E)
            return KVCache(key, value, end)
        n = min(k.shape[-2], self.slots)  # older tokens of a long chunk would be overwritten
        slots = self._ring(end - n, end)  # (n,), distinct
        key = self.key.at[:, :, slots].set(k[:, :, k.shape[-2] - n :])  # (B, K, T, D)
        value = self.value.at[:, :, slots].set(v[:, :, v.shape[-2] - n :])  # (B, K, T, E)
        return KVCache(key, value, end, self.rolling_max_len)

    def read(self) -> tuple[jax.Array, jax.Array]:
        """The keys ``(B, K, S, D)`` and values ``(B, K, S, E)`` new tokens attend besides
        themselves, oldest first: a plain cache's S = ``position`` written tokens; a rolling
        cache's last S = ``min(position, T - 1)`` (the ``left`` tokens a window reaches back)."""
        if not self.rolling:
            return self.key[:, :, : self.position], self.value[:, :, : self.position]
        slots = self._ring(self.position - min(self.position, self.slots - 1), self.position)
        return self.key[:, :, slots], self.value[:, :, slots]  # gathered, (B, K, S, D|E)

    def append(self, k: jax.Array, v: jax.Array) -> tuple[KVCache, jax.Array, jax.Array]:
        """Write the next L tokens ``k (B, K, L, D)``, ``v (B, K, L, E)``; return the new cache
        and the keys ``(B, K, S, D)`` and values ``(B, K, S, E)`` the new tokens attend: a plain
        cache's every token (S = position + L), a rolling cache's last ``min(position, T - 1)``
        then the L new ones (read before the ring is overwritten).
        """
        if not self.rolling:
            cache = self.write(k, v)
            return (cache, *cache.read())
        k_old, v_old = self.read()  # (B, K, S_old, D|E)
        cache = self.write(k, v)
        return cache, jnp.concatenate([k_old, k], axis=2), jnp.concatenate([v_old, v], axis=2)
