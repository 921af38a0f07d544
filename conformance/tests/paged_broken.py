"""A small NumPy port of the paged key/value cache calls, with the paged bugs seen in real
kernels switched in one at a time (broken_ports.BUGS, the ``paged_*`` entries).

It reads the cache as a kernel does: sequence by sequence, key blocks of :data:`BLOCK` keys,
each key's page looked up in the sequence's block-table row. An fp8 query, key and value (the
``paged.fp8.*`` runs) are dequantized as read, in float32, each with its sequence's descale row
(``(N, H|K)``, or the per-head or per-tensor form broadcast to it), as impl_numpy/paged.py's
step 2. With no bug it passes every ``paged`` and ``paged_write`` run (test_broken_ports.py
asserts that); the ``fp8_*`` bugs change fp8 calls only.
"""

from __future__ import annotations

import numpy as np

from attention_spec import (
    check_paged_attention,
    check_paged_cache_write,
    dtype_name,
    is_fp8,
    output_dtype,
)
from conformance.fixtures import NP_DTYPES

#: The key block of the port's loop: 4 keys, a multiple of no page size but 1, 2 and 4.
BLOCK = 4

#: The bugs of this file (broken_ports.BUGS says what each does and which run catches it).
PAGED_BUGS = (
    "causal_top_left",
    "offset_from_block_start",
    "previous_row",
    "reads_max_len",
    "minus_one_last_page",
    "gqa_tiling",
    "write_minus_one_last_slot",
    "fp8_descale_sequence_0",
    "fp8_k_descale_query_head",
    "fp8_nan_times_zero_weight",
    "fp8_v_descale_on_scores",
)


def _descale_rows(checked, given, n: int, heads: int) -> np.ndarray:
    """A token-major descale as one row per sequence, ``(N, H|K)`` float32 (``checked``:
    check_paged_attention's, None for 1.0 or a float; ``given``: the array passed)."""
    if checked is None:
        return np.ones((n, heads), np.float32)
    d = np.asarray(checked if isinstance(checked, float) else given, np.float32)
    return np.broadcast_to(d, (n, heads))


def paged_pair(bug: str = "none"):
    """``(paged_attention, paged_cache_write)`` with ``bug`` (one of :data:`PAGED_BUGS`, or
    ``"none"``)."""
    if bug != "none" and bug not in PAGED_BUGS:
        raise KeyError(bug)

    def gather(cache, row, n_keys, page_size):
        """The first ``n_keys`` rows ``(n_keys, K, X)`` of a sequence, block by block."""
        rows = np.zeros((n_keys, *cache.shape[2:]), cache.dtype)
        for j0 in range(0, n_keys, BLOCK):
            for j in range(j0, min(j0 + BLOCK, n_keys)):
                offset = (j - j0) % page_size if bug == "offset_from_block_start" else j % page_size
                rows[j] = cache[int(row[j // page_size]), offset]  # -1: the last page (Python)
        return rows

    def paged_attention(query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, *,
                        is_causal=False, window=None, scale=None, softcap=None, sinks=None,
                        alibi_slopes=None, q_descale=None, k_descale=None,
                        v_descale=None):
        call = check_paged_attention(
            query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q,
            is_causal=is_causal, window=window, scale=scale, softcap=softcap, sinks=sinks,
            alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale,
            v_descale=v_descale,
        )
        ct = np.float64 if query.dtype == np.float64 else np.float32
        H, K, G, page_size = call.H, call.K, call.G, call.page_size
        heads = np.arange(H) % K if bug == "gqa_tiling" else np.arange(H) // G
        fp8_cache = is_fp8(dtype_name(key_cache.dtype))
        qd = _descale_rows(call.q_descale, q_descale, call.N, H)  # (N, H)
        kd = _descale_rows(call.k_descale, k_descale, call.N, K)  # (N, K)
        vd = _descale_rows(call.v_descale, v_descale, call.N, K)  # (N, K)
        k_heads = np.arange(H) % K if bug == "fp8_k_descale_query_head" else heads
        out = np.zeros((call.T, H, call.E), ct)
        cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
        for n in range(call.N):
            row = block_table[n - 1 if bug == "previous_row" else n]  # n = 0: the last row
            S, first, last = lens[n], cu[n], cu[n + 1]
            wide = bug in ("reads_max_len", "minus_one_last_page")
            n_keys = call.max_len if wide else S  # the whole row, -1 entries included
            if bug == "fp8_nan_times_zero_weight" and fp8_cache:  # the last page's tail too
                n_keys = -(-S // page_size) * page_size
            m = 0 if bug == "fp8_descale_sequence_0" else n  # the descale row read
            k = gather(key_cache, row, n_keys, page_size).astype(ct)  # (n_keys, K, D)
            v = gather(value_cache, row, n_keys, page_size).astype(ct)  # (n_keys, K, E)
            if fp8_cache:  # dequantized as read: float32 times the sequence's descale
                k = k[:, heads] * kd[m][k_heads][None, :, None]  # (n_keys, H, D)
                if bug != "fp8_v_descale_on_scores":
                    v = v * vd[m][None, :, None]
            else:
                k = k[:, heads]  # (n_keys, H, D)
            j = np.arange(n_keys)[None, :]  # (1, n_keys)
            p = np.arange(last - first)[:, None]  # (L, 1): row i ...
            if bug != "causal_top_left":
                p = p + S - (last - first)  # ... at position S - L + i
            allowed = j < (n_keys if bug == "reads_max_len" else S)
            if call.is_causal:
                allowed = allowed & (j <= p)
            if call.window is not None:
                left, right = call.window
                if left is not None:
                    allowed = allowed & (j >= p - left)
                if right is not None:
                    allowed = allowed & (j <= p + right)
            q = query[first:last].astype(ct)  # (L, H, D)
            if is_fp8(dtype_name(query.dtype)):
                q = q * qd[m][None, :, None]
            with np.errstate(all="ignore"):
                s = np.einsum("lhd,jhd->hlj", q, k) * call.scale  # (H, L, n_keys)
                if bug == "fp8_v_descale_on_scores" and fp8_cache:
                    s = s * vd[m][heads][:, None, None]
                if call.softcap is not None:
                    s = call.softcap * np.tanh(s / call.softcap)
                if alibi_slopes is not None:
                    s = s - alibi_slopes.astype(ct)[:, None, None] * np.abs(p - j)
                s = np.where(allowed, s, -np.inf)
                m = s.max(axis=-1, keepdims=True, initial=-np.inf)
                if sinks is not None:
                    m = np.maximum(m, sinks.astype(ct)[:, None, None])
                m = np.where(m == -np.inf, 0.0, m)
                e = np.exp(s - m)
                z = e.sum(axis=-1, keepdims=True)
                if sinks is not None:
                    z = z + np.where(z == 0, 0.0, np.exp(sinks.astype(ct)[:, None, None] - m))
                w = e / np.where(z == 0, 1.0, z)  # (H, L, n_keys)
                if bug not in ("minus_one_last_page", "fp8_nan_times_zero_weight"):
                    # a key no row attends: zeroed, never 0 * NaN
                    seen = np.broadcast_to(allowed, (last - first, n_keys)).any(axis=0)
                    v = np.where(seen[:, None, None], v, 0.0)
                out[first:last] = np.einsum("hlj,jhe->lhe", w, v[:, heads])
        return out.astype(NP_DTYPES[output_dtype(dtype_name(query.dtype))])

    def paged_cache_write(key_cache, value_cache, key, value, slot_mapping):
        check_paged_cache_write(key_cache, value_cache, key, value, slot_mapping)
        page_size = key_cache.shape[1]
        for t, slot in enumerate(slot_mapping.tolist()):
            if slot == -1 and bug != "write_minus_one_last_slot":
                continue
            key_cache[slot // page_size, slot % page_size] = key[t]  # -1: the last slot
            value_cache[slot // page_size, slot % page_size] = value[t]
        return key_cache, value_cache

    return paged_attention, paged_cache_write
