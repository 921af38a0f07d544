"""Attention over a paged key/value cache in NumPy (Contract v3, "Paged key/value caches").

The same steps, names and comments as ``impl_torch/paged.py`` and ``impl_jax/paged.py``; only
the idiom differs. The cache is a pool of P pages; sequence n's key j lives in page
``block_table[n, j // page_size]`` at offset ``j % page_size``. ``paged_attention`` gathers each
sequence's keys by that rule and runs the contract's steps 1-6 on every query token's row
(:func:`~impl_numpy.functional.scaled_dot_product_attention`, one row per token), with the
causal, window and ALiBi diagonal bottom-right: a sequence's queries are its last positions.

Shape letters (SEMANTICS.md): T packed query tokens, N sequences, P pages, H query heads,
K key/value heads, G = H // K, D query/key head dim, E value head dim; ``Smax = max_pages *
page_size``, the most keys a block-table row holds.
"""

from __future__ import annotations

import numpy as np

from attention_spec import check_paged_attention, check_paged_cache_write, dtype_name, is_fp8
from attention_spec.rules import alibi, causal
from attention_spec.rules import window as window_rule
from impl_numpy.functional import _output_dtype, scaled_dot_product_attention

__all__ = ["paged_attention", "paged_cache_write"]


def _asarray(x: object) -> np.ndarray | None:
    """An array-like as a NumPy array (``np.asarray``: an array stays itself); None stays None."""
    return None if x is None else np.asarray(x)


def _descaled(x: np.ndarray, checked: object, given: object, rows: np.ndarray) -> np.ndarray:
    """Step 2's dequantization: an fp8 ``x`` ``(R, ..., H|K, D|E)`` as float32 times its
    descale (``checked``, validation's: None is 1.0, a float, or the spec of the array
    ``given``: ``()``, ``(H|K,)``, or ``(N, H|K)`` taken at ``rows (R,)``, each row's
    sequence); any other ``x`` as given."""
    if not is_fp8(dtype_name(x.dtype)):
        return x
    x = x.astype(np.float32)
    if checked is None:
        return x
    d = np.asarray(checked if isinstance(checked, float) else given, np.float32)
    if d.ndim == 2:  # per sequence: (N, H|K) -> (R, 1.., H|K)
        d = d[rows].reshape(rows.shape[0], *(1,) * (x.ndim - 3), d.shape[1])
    return x * d[..., None]  # broadcast over the head dim


def paged_attention(
    query: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_table: np.ndarray,
    seq_lens: np.ndarray,
    cu_seqlens_q: np.ndarray,
    *,
    is_causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    q_descale: np.ndarray | float | None = None,
    k_descale: np.ndarray | float | None = None,
    v_descale: np.ndarray | float | None = None,
) -> np.ndarray:
    """Attention of packed queries over a paged key/value cache, shape ``(T, H, E)``.

    Args:
        query: ``(T, H, D)``, sequence n's queries are rows ``cu_seqlens_q[n] ..
            cu_seqlens_q[n + 1] - 1``, its last ``L_n`` positions.
        key_cache: ``(P, page_size, K, D)``; value_cache: ``(P, page_size, K, E)``, the query's
            dtype; K divides H, query head h reads key/value head ``h // (H // K)``.
        block_table: integer ``(N, max_pages)``: the pages of sequence n, in order; entries past
            ``ceil(seq_lens[n] / page_size)`` are never read (-1 by convention).
        seq_lens: integer ``(N,)``, the keys of sequence n, its new tokens included.
        cu_seqlens_q: integer ``(N + 1,)``, from 0 to T, non-decreasing.
        is_causal, window, scale, softcap, sinks, alibi_slopes: as in
            :func:`~impl_numpy.functional.scaled_dot_product_attention`, with the diagonal
            bottom-right: query row i of sequence n sits at position ``seq_lens[n] - L_n + i``.
        q_descale, k_descale, v_descale: for an fp8 cache (``float8_e4m3fn``, ``float8_e5m2``)
            with a float query, or all three fp8: a number, or float32 of shape ``()``,
            ``(H|K,)`` or per sequence ``(N, H|K)``; None is 1.0. The output of an fp8 query is
            bfloat16.

    Slots past ``seq_lens[n]`` and pages no sequence reads may hold anything, NaN included: they
    never reach the output. Array-likes are converted with ``np.asarray``.
    """
    query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, sinks, alibi_slopes = (
        _asarray(x)
        for x in (query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, sinks,
                  alibi_slopes)
    )
    call = check_paged_attention(
        query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, is_causal=is_causal,
        window=window, scale=scale, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
    )
    T, page_size, Smax = call.T, call.page_size, call.max_len
    cu, lens = cu_seqlens_q.astype(np.int64), seq_lens.astype(np.int64)

    # 1. each query token's sequence and position: token t is row i = t - cu[n] of the
    #    sequence n with cu[n] <= t < cu[n + 1], at position seq_lens[n] - L_n + i.
    t = np.arange(T)  # (T,)
    seq = np.searchsorted(cu, t, side="right") - 1  # (T,): n_t
    q_lens = cu[1:] - cu[:-1]  # (N,): L_n
    pos = lens[seq] - q_lens[seq] + (t - cu[seq])  # (T,)

    # 2. each sequence's keys by the block table: key j of sequence n is slot j % page_size of
    #    page block_table[n, j // page_size]; only j < seq_lens[n] exists (an entry past its
    #    pages, -1 by convention, reads page 0 instead, and those keys are masked in step 4).
    j = np.arange(Smax)  # (Smax,)
    exists = j[None, :] < lens[:, None]  # (N, Smax)
    page = np.where(exists, block_table[:, j // page_size], 0)  # (N, Smax)
    keys = key_cache[page, j % page_size]  # (N, Smax, K, D)
    values = value_cache[page, j % page_size]  # (N, Smax, K, E)
    #    An fp8 cache is dequantized as it is read, float32 times k_descale / v_descale (per
    #    key/value head, or per sequence and head); an fp8 query times q_descale per token.
    out_dtype = _output_dtype(query.dtype)  # the query's, or bfloat16 for an fp8 query
    keys = _descaled(keys, call.k_descale, k_descale, np.arange(call.N))
    values = _descaled(values, call.v_descale, v_descale, np.arange(call.N))
    query = _descaled(query, call.q_descale, q_descale, seq)
    if keys.dtype != query.dtype:  # an fp8 cache with a float16/bfloat16 query: in float32
        query = query.astype(np.float32)

    # 3. each token's row against its sequence's keys, heads-first: one query row per token.
    q = query[:, :, None, :]  # (T, H, 1, D)
    k = keys[seq].transpose(0, 2, 1, 3)  # (T, K, Smax, D)
    v = values[seq].transpose(0, 2, 1, 3)  # (T, K, Smax, E)

    # 4. allowed(t, j) = j < seq_lens[n_t] AND causal (j <= pos_t) AND window, on the diagonal
    #    of the token's own position (bottom-right: offset 0 from pos_t).
    i, jj = pos[:, None], j[None, :]  # (T, 1), (1, Smax)
    allowed = exists[seq]  # (T, Smax)
    if call.is_causal:
        allowed = allowed & causal(i, jj, 0)
    if call.window is not None:
        allowed = allowed & window_rule(i, jj, 0, call.window)
    mask = allowed[:, None, None, :]  # (T, 1, 1, Smax)

    # 5. ALiBi, -slope[h] * |pos_t - j|, as the additive term of step 3 (T, H, 1, Smax).
    bias = None
    if alibi_slopes is not None:
        ct = np.float64 if query.dtype == np.float64 else np.float32
        slopes = alibi_slopes.astype(ct)[None, :, None, None]  # (1, H, 1, 1)
        bias = alibi(slopes, i[:, :, None, None], jj[:, None, None, :], 0).astype(ct)

    # 6. the contract's steps 1-6 on each token's row (scale, softcap, the sinks), then
    #    (T, H, E).
    out = scaled_dot_product_attention(
        q, k, v, mask=mask, bias=bias, scale=call.scale, softcap=call.softcap, sinks=sinks
    )  # (T, H, 1, E)
    return out[:, :, 0, :].astype(out_dtype)  # (T, H, E)


def paged_cache_write(
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    slot_mapping: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Write token t's key ``(K, D)`` and value ``(K, E)`` into slot ``slot_mapping[t] = page *
    page_size + offset`` of the caches ``(P, page_size, K, D|E)``, in place; a slot of -1 is a
    padding token, skipped. key ``(T, K, D)`` and value ``(T, K, E)`` have the cache's dtype.

    Returns ``(key_cache, value_cache)``, the arrays given (written in place).
    """
    key_cache, value_cache, key, value, slot_mapping = (
        _asarray(x) for x in (key_cache, value_cache, key, value, slot_mapping)
    )
    check_paged_cache_write(key_cache, value_cache, key, value, slot_mapping)
    page_size = key_cache.shape[1]

    # 1. the tokens written: a slot >= 0 (-1: a padding token, skipped).
    slots = slot_mapping.astype(np.int64)  # (T,)
    written = slots >= 0  # (T,)

    # 2. each written token's page and offset: slot = page * page_size + offset.
    page, offset = slots[written] // page_size, slots[written] % page_size  # (T',), (T',)

    # 3. the write, in place.
    key_cache[page, offset] = key[written]  # (T', K, D)
    value_cache[page, offset] = value[written]  # (T', K, E)
    return key_cache, value_cache
