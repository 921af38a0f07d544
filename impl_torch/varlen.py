"""Variable-length (packed) attention in PyTorch: ``varlen_attention`` and its gradients.

The same steps, names and comments as ``impl_numpy/varlen.py`` and ``impl_jax/varlen.py``.
Token-major packed sequences, as flash-attn's ``flash_attn_varlen_func``: sequence n is query
rows ``[cu_q[n], cu_q[n+1])`` against key rows ``[cu_k[n], cu_k[n+1])`` and is exactly
``scaled_dot_product_attention`` of its own rows (SEMANTICS.md, Contract v3). Here the N
sequences are one heads-first call on the packed rows whose allowed rule is block-diagonal:
query row i may attend key j only in its own sequence, and the causal, window and ALiBi rules
read positions within the sequence, at the sequence's own diagonal (``S_n - L_n`` bottom-right,
0 top-left). No Python loop over sequences: the same text runs under ``jax.jit`` with traced
boundaries.

Shape letters: Tq packed query tokens, Tk packed key tokens, N sequences (L_n queries and S_n
keys each), H query heads, K key/value heads, G = H // K, D query/key head dim, E value head dim.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from attention_spec import (
    AttentionGrads,
    VarlenCall,
    check_varlen,
    check_varlen_grad_output,
    sequence_bounds,
    tiled_blocks,
)
from attention_spec.rules import alibi, causal, window
from impl_torch.flash import BAND_BLOCKS, flash_attention, flash_attention_vjp
from impl_torch.functional import (
    _as_tensors,
    _compute_dtype,
    _output_dtype,
    scaled_dot_product_attention,
    scaled_dot_product_attention_vjp,
)
from impl_torch.paged import _descaled

__all__ = [
    "varlen_attention", "varlen_attention_vjp", "varlen_flash_attention",
    "varlen_flash_attention_vjp",
]

#: The array arguments of varlen_attention, converted with ``torch.as_tensor`` (on one device).
_ARRAYS = ("query", "key", "value", "cu_seqlens_q", "cu_seqlens_k", "sinks", "alibi_slopes")
#: Its keywords, as check_varlen takes them (the descales as given: a number or an array;
#: varlen_attention_vjp has none, so it refuses fp8 inputs).
_KEYWORDS = (
    "is_causal", "causal_alignment", "window", "scale", "softcap", "sinks", "alibi_slopes",
    "q_descale", "k_descale", "v_descale",
)


def _validated(given: Mapping[str, object]) -> tuple[VarlenCall, dict]:
    """The call's arrays (``given``: the function's ``locals()``) converted once and
    validated by ``check_varlen`` (and ``grad_output``, when given) before any arithmetic."""
    names = (*_ARRAYS, "grad_output") if "grad_output" in given else _ARRAYS
    arrays = dict(zip(names, _as_tensors(*(given[name] for name in names))))
    keywords = {name: arrays.get(name, given[name]) for name in _KEYWORDS if name in given}
    varlen = check_varlen(
        arrays["query"], arrays["key"], arrays["value"], arrays["cu_seqlens_q"],
        arrays["cu_seqlens_k"], **keywords,
    )
    if "grad_output" in given:
        check_varlen_grad_output(varlen, arrays["grad_output"])
    return varlen, arrays


def _sequence_positions(
    cu: torch.Tensor, T: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For packed rows ``0 .. T-1`` and boundaries ``cu (N + 1,)``: each row's sequence
    ``(T,)``, its position within that sequence ``(T,)``, and the sequences' lengths ``(N,)``.
    A row belongs to the last n with ``cu[n] <= row`` (an empty sequence holds no row)."""
    cu = cu.to(torch.int64)  # (N + 1,)
    rows = torch.arange(T, device=cu.device)  # (T,)
    seq = torch.searchsorted(cu, rows, right=True) - 1  # (T,)
    return seq, rows - cu[seq], cu[1:] - cu[:-1]  # (T,), (T,), (N,)


def _sequence_rules(varlen: VarlenCall, arrays: Mapping[str, torch.Tensor | None]):
    """Steps 1-3: the packed call's allowed rule ``(Tq, Tk)`` and its ALiBi bias
    ``(H, Tq, Tk)`` in the compute dtype (None without slopes), at positions within each
    sequence."""
    call = varlen.call

    # 1. each packed row's sequence and its position there: query row r is position pos_q[r]
    #    of sequence seq_q[r]; key row c is position pos_k[c] of sequence seq_k[c].
    seq_q, pos_q, len_q = _sequence_positions(arrays["cu_seqlens_q"], varlen.Tq)  # (Tq,)x2, (N,)
    seq_k, pos_k, len_k = _sequence_positions(arrays["cu_seqlens_k"], varlen.Tk)  # (Tk,)x2, (N,)

    # 2. each sequence's diagonal, from its own L_n and S_n: 0 top-left, S_n - L_n
    #    bottom-right; a query row takes its sequence's.
    offsets = len_k - len_q if call.causal_alignment == "bottom_right" else len_q * 0  # (N,)
    offset = offsets[seq_q][:, None]  # (Tq, 1)
    i, j = pos_q[:, None], pos_k[None, :]  # (Tq, 1), (1, Tk)

    # 3. allowed(i, j) = same sequence AND causal AND window, at the positions within the
    #    sequence; ALiBi's -slope[h] * |i + offset - j| at the same positions, as a bias.
    allowed = seq_q[:, None] == seq_k[None, :]  # (Tq, Tk)
    if call.is_causal:
        allowed = allowed & causal(i, j, offset)  # (Tq, Tk)
    if call.window is not None:
        allowed = allowed & window(i, j, offset, call.window)  # (Tq, Tk)
    bias = None
    if arrays["alibi_slopes"] is not None:
        slopes = arrays["alibi_slopes"].to(_compute_dtype(arrays["query"].dtype))  # (H,)
        bias = alibi(slopes[:, None, None], i, j, offset)  # (H, Tq, Tk)
    return allowed, bias


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """Token-major ``(T, H|K, D|E)`` -> heads-first ``(H|K, T, D|E)`` (a view)."""
    return x.transpose(0, 1)


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    q_descale: torch.Tensor | float | None = None,
    k_descale: torch.Tensor | float | None = None,
    v_descale: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Attention over N packed sequences, shape ``(Tq, H, E)``: each sequence is
    ``scaled_dot_product_attention`` of its own rows; no token sees another sequence's keys.

    Args:
        query: ``(Tq, H, D)``, the N sequences' queries one after another.
        key: ``(Tk, K, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(Tk, K, E)``; the same dtype as query and key.
        cu_seqlens_q, cu_seqlens_k: integer ``(N + 1,)``, from 0, non-decreasing, to Tq / Tk:
            sequence n is query rows ``[cu_q[n], cu_q[n+1])`` (L_n of them, maybe 0) against
            key rows ``[cu_k[n], cu_k[n+1])`` (S_n, maybe 0).
        is_causal, causal_alignment, window, scale, softcap, sinks, alibi_slopes: as in
            ``scaled_dot_product_attention``, per sequence: the diagonal of
            ``causal_alignment`` is each sequence's own (``S_n - L_n`` bottom-right).
        q_descale, k_descale, v_descale: for fp8 key and value (``float8_e4m3fn``,
            ``float8_e5m2``) with a float query, or all three fp8: a number, or float32 of
            shape ``()``, ``(H|K,)`` or per sequence ``(N, H|K)`` (paged_attention's forms);
            None is 1.0.

    Returns the output in the query's dtype (bfloat16 for an fp8 query); rows of a sequence
    with no allowed key are zeros.
    """
    varlen, arrays = _validated(locals())
    # 0. dequantize: an fp8 input is float32 times its descale (the contract's float(x) * d);
    #    the steps below then run in float32, and the result is bfloat16 for an fp8 query.
    #    Token-major: a per-sequence descale (N, H|K) is taken at each row's sequence.
    out_dtype = _output_dtype(arrays["query"].dtype)  # the query's, or bfloat16 for fp8
    seq_q = _sequence_positions(arrays["cu_seqlens_q"], varlen.Tq)[0]  # (Tq,)
    seq_k = _sequence_positions(arrays["cu_seqlens_k"], varlen.Tk)[0]  # (Tk,)
    arrays = {
        **arrays,
        "query": _descaled(arrays["query"], varlen.q_descale, q_descale, seq_q),
        "key": _descaled(arrays["key"], varlen.k_descale, k_descale, seq_k),
        "value": _descaled(arrays["value"], varlen.v_descale, v_descale, seq_k),
    }
    if arrays["key"].dtype != arrays["query"].dtype:  # an fp8 cache with a float16/bf16 query
        arrays["query"] = arrays["query"].to(torch.float32)
    allowed, bias = _sequence_rules(varlen, arrays)
    call = varlen.call

    # 4. the packed call, heads-first: query (H, Tq, D), key (K, Tk, D), value (K, Tk, E);
    #    scaled_dot_product_attention's steps 1-6 with the rule and the bias of steps 1-3
    #    (softcap, sinks and GQA as there).
    out = scaled_dot_product_attention(
        _heads_first(arrays["query"]), _heads_first(arrays["key"]),
        _heads_first(arrays["value"]), mask=allowed, bias=bias, scale=call.scale,
        softcap=call.softcap, sinks=arrays["sinks"],
    )  # (H, Tq, E)

    # 5. back to token-major.
    return out.to(out_dtype).transpose(0, 1).contiguous()  # (Tq, H, E)


def varlen_attention_vjp(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    grad_output: torch.Tensor,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> AttentionGrads:
    """The gradients of ``<varlen_attention(...), grad_output>``.

    Args:
        query, key, value, cu_seqlens_q, cu_seqlens_k, is_causal, causal_alignment, window,
            scale, softcap, sinks, alibi_slopes: as in :func:`varlen_attention`.
        grad_output: ``(Tq, H, E)``, the cotangent ``dO`` of the output (its exact shape).

    Returns ``AttentionGrads(query, key, value, None, sinks)``: ``dQ (Tq, H, D)``,
    ``dK (Tk, K, D)``, ``dV (Tk, K, E)`` (each key row's gradient summed over its own
    sequence's queries only, and over the G query heads of its group), ``dsinks (H,)`` (None
    without sinks), each in its input's dtype. The same steps as the forward, then
    ``scaled_dot_product_attention_vjp`` of the packed call (autograd through it).
    """
    varlen, arrays = _validated(locals())
    allowed, bias = _sequence_rules(varlen, arrays)
    call = varlen.call

    # 4. the packed call's gradients, heads-first: dQ (H, Tq, D), dK (K, Tk, D), dV (K, Tk, E)
    #    (the ALiBi bias is not differentiated).
    grads = scaled_dot_product_attention_vjp(
        _heads_first(arrays["query"]), _heads_first(arrays["key"]),
        _heads_first(arrays["value"]), _heads_first(arrays["grad_output"]), mask=allowed,
        bias=bias, scale=call.scale, softcap=call.softcap, sinks=arrays["sinks"],
    )

    # 5. back to token-major.
    return AttentionGrads(
        query=grads.query.transpose(0, 1).contiguous(),  # (Tq, H, D)
        key=grads.key.transpose(0, 1).contiguous(),  # (Tk, K, D)
        value=grads.value.transpose(0, 1).contiguous(),  # (Tk, K, E)
        sinks=grads.sinks,  # (H,)
    )


# ---------------------------------------------------------------------------------------------
# The tiled path: each sequence's own blocks (Contract v3, issue 27 build item 2)
# ---------------------------------------------------------------------------------------------


def _tiled_keywords(
    varlen: VarlenCall, arrays: Mapping[str, torch.Tensor | None], block_q: int, block_k: int
) -> dict:
    """The keywords of each sequence's flash_attention call: the validated call's rules and
    scalars, the sinks and ALiBi slopes, and the tiling's block sizes (the same for every
    sequence)."""
    call = varlen.call
    return {
        "is_causal": call.is_causal, "causal_alignment": call.causal_alignment,
        "window": call.window, "scale": call.scale, "softcap": call.softcap,
        "sinks": arrays["sinks"], "alibi_slopes": arrays["alibi_slopes"],
        "block_q": block_q, "block_k": block_k,
    }


def varlen_flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    q_descale: torch.Tensor | float | None = None,
    k_descale: torch.Tensor | float | None = None,
    v_descale: torch.Tensor | float | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
) -> torch.Tensor:
    """:func:`varlen_attention`, tiled: ``(Tq, H, E)``, each sequence its own tiled call.

    Sequence n's ``L_n`` query rows are tiled in blocks of ``block_q`` rows and its ``S_n``
    keys in blocks of ``block_k`` keys, as :func:`impl_torch.flash.flash_attention` tiles one
    ``(L, S)`` call, so the blocks visited are only the (query block, key block) pairs inside
    one sequence: no block straddles two sequences, and none needs a sequence mask. (The other
    way, blocks of the packed rows with a sequence mask where a block straddles a boundary,
    computes scores of key blocks that are mostly another sequence's and needs a sequence rule
    per block; tiling each sequence on its own makes the work ``sum_n L_n * S_n``, half under
    causal, and the rules those of flash_attention at the sequence's own ``L_n`` and ``S_n``.)

    Args: those of :func:`varlen_attention`, the boundaries concrete (the blocks are scheduled
        from them on the host: ``attention_spec.sequence_bounds``), and
        block_q, block_k: as in ``flash_attention``; None: ``attention_spec.tiled_blocks``'s
            default for this call's causal and window bands, the same for every sequence.

    Returns what :func:`varlen_attention` returns. Raises its errors, ConfigError for a block
    size < 1, and ConfigError ``cu_seqlens_value`` for boundaries that are not concrete.
    """
    varlen, arrays = _validated(locals())
    call = varlen.call
    block_q, block_k = tiled_blocks(BAND_BLOCKS, block_q, block_k, call.is_causal, call.window)
    bounds = sequence_bounds(varlen)  # [(q0, q1, k0, k1)] per sequence, Python ints
    # 0. dequantize: an fp8 input is float32 times its descale (the contract's float(x) * d);
    #    the steps below then run in float32, and the result is bfloat16 for an fp8 query.
    #    Token-major: a per-sequence descale (N, H|K) is taken at each row's sequence.
    out_dtype = _output_dtype(arrays["query"].dtype)  # the query's, or bfloat16 for fp8
    seq_q = _sequence_positions(arrays["cu_seqlens_q"], varlen.Tq)[0]  # (Tq,)
    seq_k = _sequence_positions(arrays["cu_seqlens_k"], varlen.Tk)[0]  # (Tk,)
    arrays = {
        **arrays,
        "query": _descaled(arrays["query"], varlen.q_descale, q_descale, seq_q),
        "key": _descaled(arrays["key"], varlen.k_descale, k_descale, seq_k),
        "value": _descaled(arrays["value"], varlen.v_descale, v_descale, seq_k),
    }
    if arrays["key"].dtype != arrays["query"].dtype:  # an fp8 cache with a float16/bf16 query
        arrays["query"] = arrays["query"].to(torch.float32)
    q, k, v = (_heads_first(arrays[name]) for name in ("query", "key", "value"))

    # 1. each sequence alone, tiled: flash_attention of its heads-first rows, query
    #    (H, L_n, D), key (K, S_n, D), value (K, S_n, E), whose causal, window and ALiBi
    #    offsets are then the sequence's own (S_n - L_n bottom-right, 0 top-left).
    tiled = _tiled_keywords(varlen, arrays, block_q, block_k)
    outs = [
        flash_attention(q[:, q0:q1], k[:, k0:k1], v[:, k0:k1], **tiled)  # (H, L_n, E)
        for q0, q1, k0, k1 in bounds
    ]

    # 2. back to token-major, the sequences one after another.
    out = torch.cat(outs, dim=1).to(out_dtype)  # (H, Tq, E)
    return out.transpose(0, 1).contiguous()  # (Tq, H, E)


def varlen_flash_attention_vjp(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    grad_output: torch.Tensor,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
) -> AttentionGrads:
    """The gradients of ``<varlen_flash_attention(...), grad_output>``, each sequence by
    :func:`impl_torch.flash.flash_attention_vjp` (FlashAttention-2's tiled backward) on its
    own blocks: the memory beyond inputs, outputs and gradients is O(Tq + Tk) plus one block.

    Args: those of :func:`varlen_attention_vjp`, and ``block_q``, ``block_k`` as in
        :func:`varlen_flash_attention`.

    Returns what :func:`varlen_attention_vjp` returns: a key row's gradient sums over its own
    sequence's queries only (no block holds another sequence's), ``dsinks`` over every
    sequence's rows.
    """
    varlen, arrays = _validated(locals())
    call = varlen.call
    block_q, block_k = tiled_blocks(BAND_BLOCKS, block_q, block_k, call.is_causal, call.window)
    bounds = sequence_bounds(varlen)  # [(q0, q1, k0, k1)] per sequence, Python ints
    q, k, v, do = (_heads_first(arrays[name]) for name in ("query", "key", "value", "grad_output"))

    # 1. each sequence alone, tiled: flash_attention_vjp of its heads-first rows, dQ
    #    (H, L_n, D), dK (K, S_n, D), dV (K, S_n, E), dsinks (H,).
    tiled = _tiled_keywords(varlen, arrays, block_q, block_k)
    grads = [
        flash_attention_vjp(q[:, q0:q1], k[:, k0:k1], v[:, k0:k1], do[:, q0:q1], **tiled)
        for q0, q1, k0, k1 in bounds
    ]

    # 2. back to token-major, the sequences one after another; each key row is one sequence's,
    #    so nothing is summed across sequences but the sinks' gradient.
    dsinks = None if arrays["sinks"] is None else sum(g.sinks for g in grads)  # (H,)
    return AttentionGrads(
        query=torch.cat([g.query for g in grads], 1).transpose(0, 1).contiguous(),  # (Tq, H, D)
        key=torch.cat([g.key for g in grads], 1).transpose(0, 1).contiguous(),  # (Tk, K, D)
        value=torch.cat([g.value for g in grads], 1).transpose(0, 1).contiguous(),  # (Tk, K, E)
        sinks=dsinks,
    )
