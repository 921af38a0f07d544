"""Variable-length (packed) batches: ``varlen_attention`` (``varlen.*``), its gradients
(``varlen_grad.*``) and its errors (``varlen.error.*``). Contract v3.

Token-major packed sequences: query ``(Tq, H, D)``, key ``(Tk, K, D)``, value ``(Tk, K, E)``,
``cu_seqlens_q`` and ``cu_seqlens_k`` ``(N + 1,)`` (stored as int32). Sequence n is query rows
``[cu_q[n], cu_q[n+1])`` against key rows ``[cu_k[n], cu_k[n+1])``, and equals
``scaled_dot_product_attention`` of its own rows, its causal, window and ALiBi diagonal taken
from its own ``L_n`` and ``S_n``. The generator cross-checks every golden against the
contiguous oracle on each sequence's rows.

Sizes: H=6, K=2 (GQA 6:2) unless a case says otherwise, D=5, E=7; sequences short and of
pairwise different lengths, so a boundary read one row off, or a diagonal taken from the packed
row, changes some output row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from conformance.cases.base import F32, Zeros, case, normal, z

__all__ = ["Packed", "packed"]

#: Head counts and dims of the varlen cases.
VH, VK, VD, VE = 6, 2, 5, 7
#: The array keywords of a varlen call (stored in the case's dtype).
VARLEN_ARRAYS = ("sinks", "alibi_slopes")


@dataclass
class Packed:
    """The arguments of one ``varlen_attention`` call: float64 arrays (or :class:`Zeros` for
    an error case), the boundaries as integers, the keywords, and ``arrays``, the sinks and
    ALiBi slopes given. ``grad_output``: an error case of ``varlen_attention_vjp``'s.
    ``descales`` (an fp8 case, ``varlen.fp8.*``): name -> a float32 array ``(H|K,)`` or
    ``(N, H|K)``, a float, or None for an input that is not fp8; the float64 arrays are then
    the values *before* quantization, and ``query_dtype`` None (the query is fp8 too) or the
    float dtype of the query."""

    query: Any
    key: Any
    value: Any
    cu_seqlens_q: Any
    cu_seqlens_k: Any
    keywords: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, Any] = field(default_factory=dict)
    grad_output: Any = None
    descales: dict[str, Any] | None = None
    query_dtype: str | None = None


def packed(rng, q_lengths, k_lengths, *, h=VH, k=VK, d=VD, e=VE, **keywords) -> Packed:
    """A :class:`Packed` call of sequences with ``q_lengths`` queries and ``k_lengths`` keys;
    key/value heads made clearly different (value head n near 2n), and each sequence's keys
    shifted by 0.25 n, so a row that reads another sequence's keys shows."""
    cu_q, cu_k = np.cumsum([0, *q_lengths]), np.cumsum([0, *k_lengths])
    q = normal(rng, int(cu_q[-1]), h, d)
    kk = normal(rng, int(cu_k[-1]), k, d) + 0.5 * np.arange(k).reshape(1, k, 1)
    v = normal(rng, int(cu_k[-1]), k, e) + 2.0 * np.arange(k).reshape(1, k, 1)
    seq = np.repeat(np.arange(len(k_lengths)), k_lengths).reshape(-1, 1, 1)  # (Tk, 1, 1)
    v = v + 0.25 * seq
    arrays = {n: keywords.pop(n) for n in VARLEN_ARRAYS if keywords.get(n) is not None}
    return Packed(q, kk, v, cu_q, cu_k, keywords, arrays)


varlen_case = partial(case, "varlen", functions=("varlen", "varlen_flash"))
varlen_grad_case = partial(case, "varlen_grad", functions=("varlen_grad", "varlen_flash_grad"))


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------


@varlen_case("n1.l6_s6", ("float64", "float32", "float16", "bfloat16"))
def varlen_one(rng, dtype):
    """N = 1: one sequence of 6 queries and 6 keys, causal: exactly the contiguous call."""
    return packed(rng, [6], [6], is_causal=True)


@varlen_case("n1.decode_l1_s9")
def varlen_one_decode(rng, dtype):
    """N = 1, one query against 9 keys, causal bottom-right: the query sees every key (with
    top-left it would see only the first)."""
    return packed(rng, [1], [9], is_causal=True, causal_alignment="bottom_right")


@varlen_case("n3.mixed", ("float64", "float32", "float16", "bfloat16"))
def varlen_three(rng, dtype):
    """N = 3 sequences with L_n != S_n ([3, 5, 2] queries, [7, 5, 1] keys), no mask: every
    query sees exactly its own sequence's keys, so a boundary read one row off changes rows."""
    return packed(rng, [3, 5, 2], [7, 5, 1])


@varlen_case("n3.causal_top_left")
def varlen_causal_top_left(rng, dtype):
    """Causal, top-left per sequence: query i of a sequence sees its keys 0..i, counted from
    the sequence's own first key (not the packed row)."""
    return packed(rng, [3, 5, 2], [7, 5, 1], is_causal=True)


@varlen_case("n3.causal_bottom_right", ("float64", "float32", "bfloat16"))
def varlen_causal_bottom_right(rng, dtype):
    """Causal, bottom-right per sequence: the diagonal of sequence n is S_n - L_n (4, 0 and -1
    here: the last sequence's first query sees nothing, zeros)."""
    return packed(rng, [3, 5, 2], [7, 5, 1], is_causal=True, causal_alignment="bottom_right")


@varlen_case("n5.empty_sequences", ("float64", "float32", "float16", "bfloat16"))
def varlen_empty(rng, dtype):
    """N = 5 with empty sequences: L_n = 0 (sequence 1), S_n = 0 (sequence 2: its queries are
    zeros), both (sequence 4); causal bottom-right."""
    return packed(rng, [2, 0, 4, 3, 0], [5, 3, 0, 3, 0], is_causal=True,
                  causal_alignment="bottom_right")


@varlen_case("n5.window_across_boundaries")
def varlen_window(rng, dtype):
    """A window (2, 1) bottom-right on five short sequences: in the packed rows the band would
    reach into the neighbouring sequences; per sequence it stops at the boundary, and its
    diagonal is S_n - L_n, not the packed row's."""
    return packed(rng, [2, 3, 1, 4, 2], [4, 3, 5, 2, 6], window=(2, 1),
                  causal_alignment="bottom_right")


@varlen_case("n3.window_causal_top_left")
def varlen_window_causal(rng, dtype):
    """A window (1, 0) with causal, top-left: each query sees its diagonal key and the one
    before, within its own sequence."""
    return packed(rng, [4, 3, 5], [4, 6, 5], window=(1, 0), is_causal=True)


@varlen_case("n3.sink_logits", ("float64", "float32", "bfloat16"))
def varlen_sinks(rng, dtype):
    """A sink logit per head (gpt-oss), causal bottom-right: every row's denominator gains
    exp(sink_h); rows with no key (the last sequence has S_n = 0) stay zeros."""
    return packed(rng, [3, 4, 2], [5, 4, 0], is_causal=True, causal_alignment="bottom_right",
                  sinks=normal(rng, VH))


@varlen_case("n3.linear_biases")
def varlen_alibi(rng, dtype):
    """ALiBi slopes, bottom-right: the distance is |i + S_n - L_n - j| within the sequence."""
    slopes = 0.5 ** np.arange(1, VH + 1)
    return packed(rng, [3, 4, 2], [6, 4, 5], causal_alignment="bottom_right",
                  alibi_slopes=slopes)


@varlen_case("n3.softcap_scale")
def varlen_softcap(rng, dtype):
    """softcap 2.5 (Gemma 2) and scale 0.9, causal top-left, on scores scaled up by 3."""
    c = packed(rng, [3, 4, 2], [3, 6, 2], is_causal=True, softcap=2.5, scale=0.9)
    c.query = 3.0 * c.query
    return c


@varlen_case("n3.gqa_h8_k1")
def varlen_mqa(rng, dtype):
    """GQA 8:1 (multi-query): eight query heads read the one key/value head."""
    return packed(rng, [3, 4, 2], [5, 4, 3], h=8, k=1, is_causal=True,
                  causal_alignment="bottom_right")


@varlen_case("n3.garbage_in_unread_rows")
def varlen_garbage(rng, dtype):
    """NaN in the keys and values of a sequence with no queries (L_n = 0) and in those the
    causal rule leaves out of the last sequence: they never reach an output row."""
    c = packed(rng, [3, 0, 2], [4, 3, 4], is_causal=True)
    c.key[4:7] = np.nan
    c.value[4:7] = np.nan
    c.key[9:11] = np.nan  # the last sequence's keys 2 and 3: its 2 queries see keys 0, 1 only
    c.value[9:11] = np.nan
    return c


# ---------------------------------------------------------------------------------------------
# FP8 (Contract v3, "FP8 inputs and caches"): token-major descales, paged_attention's forms
# ---------------------------------------------------------------------------------------------

FP8 = ("float8_e4m3fn", "float8_e5m2")


def packed_fp8(rng, q_lengths, k_lengths, qd, kd, vd, query_dtype=None, **keywords) -> Packed:
    """A :class:`Packed` fp8 call (conformance/generate/varlen.py quantizes each fp8 input at
    its static descale, each row at its own sequence's): values of order 4 times the descale
    of the row's sequence, so a descale read from another sequence changes the answer."""
    c = packed(rng, q_lengths, k_lengths, **keywords)
    N = len(q_lengths)
    for name, cu, d in (("query", c.cu_seqlens_q, qd), ("key", c.cu_seqlens_k, kd),
                        ("value", c.cu_seqlens_k, vd)):
        x = getattr(c, name) * 4.0
        if d is not None:
            heads = x.shape[1]
            per_row = np.broadcast_to(np.asarray(d, np.float64), (N, heads))
            x = x * np.repeat(per_row, np.diff(cu), axis=0)[:, :, None]  # (T, H|K, 1)
        setattr(c, name, x)
    c.descales = {"q_descale": qd, "k_descale": kd, "v_descale": vd}
    c.query_dtype = query_dtype
    return c


#: Per-sequence descales ``(N=3, K=2)``, differing between sequences and within a GQA group.
_KD = np.array([[0.3, 0.07], [5.0, 5.0], [2.0, 90.0]], np.float32)
_VD = np.array([[1e-2, 3.0], [1.0, 1.0], [40.0, 0.5]], np.float32)


@varlen_case("fp8.all.per_sequence.causal", FP8)
def varlen_fp8_per_sequence(rng, dtype):
    """All fp8, N = 3 with an empty sequence in the middle, GQA 6:2, bottom_right causal;
    q_descale ``(N, H)`` one per group (FlashAttention 3's ``(B, K)`` with B the sequences),
    k_descale and v_descale ``(N, K)`` from 1e-2 to 90: sequence 0's descale applied to every
    sequence, or a dropped one, is far outside the bound. Output bfloat16."""
    qd = np.repeat(np.array([[0.02, 3.0], [7.0, 7.0], [0.5, 40.0]], np.float32), VH // VK, axis=1)
    return packed_fp8(rng, [3, 0, 4], [5, 0, 6], qd, _KD, _VD, is_causal=True,
                      causal_alignment="bottom_right")


@varlen_case("fp8.all.per_head.window_softcap", ("float8_e4m3fn",))
def varlen_fp8_per_head(rng, dtype):
    """All e4m3, the per-head and per-tensor forms: q_descale ``(H,)``, k_descale ``(K,)``,
    v_descale a scalar keyword; a window (2, 0) and softcap 20 on the dequantized scores."""
    qd = np.array([0.05, 0.5, 2.0, 8.0, 30.0, 0.01], np.float32)
    return packed_fp8(rng, [2, 5, 3], [4, 6, 3], qd, np.array([0.25, 6.0], np.float32),
                      float(np.float32(0.125)), window=(2, 0), softcap=20.0)


@varlen_case("fp8.kv_cache.bfloat16_query.causal_sinks", ("float8_e4m3fn",))
def varlen_fp8_cache(rng, dtype):
    """An e4m3 key/value cache with a bfloat16 query (no q_descale), per-sequence k_descale and
    v_descale ``(N, K)``, a sequence with keys and no query, causal with sinks: output
    bfloat16."""
    sinks = np.linspace(-1.0, 2.0, VH).astype(np.float32)
    return packed_fp8(rng, [3, 0, 2], [4, 3, 7], None, _KD, _VD, "bfloat16", is_causal=True,
                      causal_alignment="bottom_right", sinks=sinks)


# ---------------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------------


@varlen_grad_case("n3.causal_bottom_right", ("float64", "float32"))
def varlen_grad_causal(rng, dtype):
    """dQ, dK, dV of three sequences, causal bottom-right: each key's gradient sums over its
    own sequence's queries only."""
    return packed(rng, [3, 5, 2], [7, 5, 1], is_causal=True, causal_alignment="bottom_right")


@varlen_grad_case("n5.empty_sequences_sinks_alibi_softcap", ("float64", "float32"))
def varlen_grad_everything(rng, dtype):
    """Empty sequences (L_n = 0, S_n = 0), sinks, ALiBi and softcap, causal top-left: zero
    gradients for keys no query reads, dsinks summed over every sequence's rows."""
    return packed(rng, [2, 0, 4, 3], [5, 3, 0, 3], is_causal=True, softcap=3.0,
                  sinks=normal(rng, VH), alibi_slopes=0.5 ** np.arange(1, VH + 1))


# ---------------------------------------------------------------------------------------------
# Errors (the runner passes zeros of each input: boundaries of zeros end at 0)
# ---------------------------------------------------------------------------------------------


def _zeros(tq=9, tk=11, *, cu_q=(4,), cu_k=(4,), cu_dtype="int32", **keywords) -> Packed:
    """Zeros: query (Tq, 6, 5), key (Tk, 2, 5), value (Tk, 2, 7), cu_seqlens of ``cu_q`` and
    ``cu_k`` shapes."""
    return Packed(
        z(tq, VH, VD), z(tk, VK, VD), z(tk, VK, VE),
        Zeros(tuple(cu_q), cu_dtype), Zeros(tuple(cu_k), "int32"), keywords,
    )


@varlen_case("cu_seqlens_float", F32, error=("DTypeError", "cu_seqlens_dtype"))
def varlen_error_cu_float():
    """cu_seqlens_q of float32: the boundaries must be integers."""
    return _zeros(cu_dtype="float32")


@varlen_case("cu_seqlens_short_of_total", F32, error=("ConfigError", "cu_seqlens_value"))
def varlen_error_cu_total():
    """cu_seqlens_q of zeros with Tq = 9 packed queries: cu_q[N] = 0 is not Tq."""
    return _zeros()


@varlen_case("cu_seqlens_count", F32, error=("DimensionMismatchError", "cu_seqlens_count"))
def varlen_error_cu_count():
    """Tq = Tk = 0: cu_seqlens_q of 3 entries (N = 2) against cu_seqlens_k of 4 (N = 3)."""
    return _zeros(0, 0, cu_q=(3,), cu_k=(4,))


@varlen_case("cu_seqlens_2d", F32, error=("DimensionMismatchError", "cu_seqlens_count"))
def varlen_error_cu_2d():
    """cu_seqlens_q of shape (1, 4): the boundaries are one axis of N + 1 entries."""
    return _zeros(0, 0, cu_q=(1, 4))


@varlen_case("batch_axis", F32, error=("DimensionMismatchError", "rank"))
def varlen_error_rank():
    """A heads-first (H, L, D) query with a batch axis: varlen is token-major (Tq, H, D)."""
    c = _zeros(0, 0)
    c.query = z(1, 0, VH, VD)
    return c


@varlen_grad_case("grad_output_shape", F32, error=("DimensionMismatchError", "grad_output_shape"))
def varlen_grad_error_shape():
    """grad_output (Tq, H, D) instead of the output's (Tq, H, E)."""
    c = _zeros(0, 0)
    c.grad_output = z(0, VH, VD)
    return c
