"""``torch.nn.attention.flex_attention`` (eager, CPU) as a port: torch's programmable kernel.

FlexAttention takes the rules of an attention variant as two small functions instead of
arguments: a ``score_mod(score, b, h, q_idx, kv_idx)`` that rewrites one score, and a
``mask_mod(b, h, q_idx, kv_idx)`` that says whether a key is attended, turned into a
``BlockMask`` by ``create_block_mask``. This port writes each contract rule the way a
FlexAttention user writes it, and never fixes semantics:

- 4-D ``(B, H, L, D)`` inputs: the leading batch dims of query, key and value are broadcast to
  one shape and flattened into B (none: B = 1); GQA is ``enable_gqa=True``;
- ``score_mod``: the softcap (``softcap * tanh(score / softcap)``), then the bias read at
  ``bias[b, h, q_idx, kv_idx]`` and ALiBi, ``-slope[h] * |q_idx + offset - kv_idx|``;
- ``mask_mod``: the boolean mask read at ``mask[b, h, q_idx, kv_idx]``, the causal rule on
  either diagonal (``kv_idx <= q_idx + offset``), the window band and packed segments
  (``q_ids[b, q_idx] == kv_ids[b, kv_idx]``), joined by ``and_masks``;
- ``sinks`` through ``return_aux=AuxRequest(lse=True)`` (torch >= 2.9): each row's
  log-sum-exp is all a sink needs, ``out * exp(lse) / (exp(lse) + exp(sinks[h]))`` (a fully
  masked row, lse = -inf, stays zero).

Eager FlexAttention runs torch's reference implementation (a dense ``score_mod`` over the
(L, S) scores, the ``BlockMask`` applied as a mask); torch warns that it is not the fused kernel,
which only ``torch.compile`` gives. :func:`attention_weights` runs the same call with the
identity as value (one value column per key), so the output *is* the weight matrix.

fp8 (contract v3): the fp8 tensors go to flex_attention as they are, ``q_descale * k_descale``
folded into ``scale`` where each is one number and the output times ``v_descale``
(:mod:`conformance.ports.descales`; :func:`varlen_attention` too, token-major); on CPU eager
FlexAttention refuses fp8 (measured in the xfails).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch.nn.attention.experimental._paged_attention import PagedAttention
from torch.nn.attention.flex_attention import (
    AuxRequest,
    and_masks,
    create_block_mask,
    flex_attention,
)

from conformance.ports.descales import takes_descales, torch_output
from conformance.ports.precision import torch_ieee_float32
from conformance.ports.torch_adapter import from_numpy, to_numpy

__all__ = [
    "attention_weights",
    "from_numpy",
    "paged_attention",
    "scaled_dot_product_attention",
    "to_numpy",
    "varlen_attention",
]


def _batched(x: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """``(..., N, T, X)`` broadcast to ``batch`` and flattened: ``(B, N, T, X)``."""
    return x.expand(*batch, *x.shape[-3:]).reshape(math.prod(batch), *x.shape[-3:])


def _per_score(x: torch.Tensor, batch: tuple[int, ...], H: int, L: int, S: int) -> torch.Tensor:
    """A mask or bias broadcastable to ``(..., H, L, S)`` as ``(B, H, L, S)``."""
    return x.expand(*batch, H, L, S).reshape(math.prod(batch), H, L, S)


def _mods(
    batch, H, L, S, *, mask, bias, is_causal, causal_alignment, softcap, window,
    q_segment_ids, kv_segment_ids, alibi_slopes,
):
    """(score_mod or None, mask_mod or None): the contract's rules as FlexAttention's mods."""
    if causal_alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"no causal alignment {causal_alignment!r}")
    offset = 0 if causal_alignment == "top_left" else S - L

    scorers = []
    if softcap is not None:
        scorers.append(lambda score, b, h, q, kv: softcap * torch.tanh(score / softcap))
    if bias is not None:
        dense_bias = _per_score(bias, batch, H, L, S)
        scorers.append(lambda score, b, h, q, kv: score + dense_bias[b, h, q, kv])
    if alibi_slopes is not None:
        slopes = alibi_slopes

        def alibi(score, b, h, q, kv):
            return score - slopes[h] * (q + offset - kv).abs().to(slopes.dtype)

        scorers.append(alibi)

    def score_mod(score, b, h, q, kv):
        for scorer in scorers:
            score = scorer(score, b, h, q, kv)
        return score

    masks = []
    if mask is not None:
        dense_mask = _per_score(mask, batch, H, L, S)
        masks.append(lambda b, h, q, kv: dense_mask[b, h, q, kv])
    if is_causal:
        masks.append(lambda b, h, q, kv: kv <= q + offset)
    if window is not None:
        left, right = window
        if left is not None:
            masks.append(lambda b, h, q, kv: kv >= q + offset - left)
        if right is not None:
            masks.append(lambda b, h, q, kv: kv <= q + offset + right)
    if q_segment_ids is not None:
        n = math.prod(batch)
        q_ids = q_segment_ids.expand(*batch, L).reshape(n, L)
        kv_ids = kv_segment_ids.expand(*batch, S).reshape(n, S)
        masks.append(lambda b, h, q, kv: q_ids[b, q] == kv_ids[b, kv])

    return (score_mod if scorers else None), (and_masks(*masks) if masks else None)


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "torch's flex_attention"


@takes_descales(_KERNEL, torch_output)
def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """FlexAttention on the contract's layout: query (..., H, L, D), key (..., K, S, D),
    value (..., K, S, E) -> (..., H, L, E)."""
    H, L = query.shape[-3], query.shape[-2]
    S = key.shape[-2]
    batch = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    q, k, v = (_batched(x, batch) for x in (query, key, value))
    score_mod, mask_mod = _mods(
        batch, H, L, S, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, alibi_slopes=alibi_slopes,
    )
    block_mask = None
    if mask_mod is not None:
        block_mask = _block_mask(mask_mod, q.shape[0], H, L, S, device=str(query.device))
    out = _flex(q, k, v, score_mod, block_mask, scale, sinks)
    return out.reshape(*batch, H, L, out.shape[-1])


def _block_mask(mask_mod, B, H, L, S, **keywords: Any):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return create_block_mask(mask_mod, B, H, L, S, **keywords)


def _flex(q, k, v, score_mod, block_mask, scale, sinks) -> torch.Tensor:
    """(B, H, L, E): eager flex_attention, and the sinks from each row's log-sum-exp."""
    with warnings.catch_warnings(), torch_ieee_float32():
        warnings.simplefilter("ignore", UserWarning)  # "flex_attention called without compile"
        out, aux = flex_attention(
            q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
            enable_gqa=q.shape[1] != k.shape[1], return_aux=AuxRequest(lse=True),
        )
    lse = aux.lse  # (B, H, L): the natural log of each row's sum of exp(score)
    if sinks is not None:  # the sink's exp(sinks[h]) joins each row's denominator
        sink = sinks.to(lse.dtype)[None, :, None]  # (1, H, 1)
        kept = torch.sigmoid(lse - sink)  # exp(lse) / (exp(lse) + exp(sink))
        out = (out * kept[..., None].to(out.dtype)).to(out.dtype)
    return out


@takes_descales(_KERNEL, torch_output)
def attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    **keywords: Any,
) -> torch.Tensor:
    """The weights (..., H, L, S) from the same call with value = identity (S x S)."""
    K, S = key.shape[-3], key.shape[-2]
    identity = torch.eye(S, dtype=query.dtype, device=query.device)  # (S, E=S)
    identity = identity.expand(*key.shape[:-3], K, S, S)  # (..., K, S, S)
    return scaled_dot_product_attention(query, key, identity, **keywords)


# ---------------------------------------------------------------------------------------------
# Contract v3: varlen (a document mask over the packed tokens) and paged caches (PagedAttention)
# ---------------------------------------------------------------------------------------------


def _sequences(cu_seqlens: torch.Tensor, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per packed token (T,): its sequence and its index within the sequence."""
    tokens = torch.arange(T, device=cu_seqlens.device)
    sequence = torch.searchsorted(cu_seqlens[1:].to(torch.int64), tokens, right=True)
    return sequence, tokens - cu_seqlens.to(torch.int64)[sequence]


def _rules(
    row, kv, h, *, is_causal, window, softcap, alibi_slopes
):
    """(score rule, key rule) of one query position ``row`` against key position ``kv``
    (tensors of the mods' indices), the contract's causal, window, softcap and ALiBi."""

    def score_rule(score):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if alibi_slopes is not None:
            score = score - alibi_slopes[h] * (row - kv).abs().to(alibi_slopes.dtype)
        return score

    keep = torch.ones_like(kv, dtype=torch.bool) if not is_causal else kv <= row
    if window is not None:
        left, right = window
        if left is not None:
            keep = keep & (kv >= row - left)
        if right is not None:
            keep = keep & (kv <= row + right)
    return score_rule, keep


@takes_descales(_KERNEL, torch_output, token_major=True)
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
) -> torch.Tensor:
    """Packed sequences as FlexAttention's document mask: query (Tq, H, D), key (Tk, K, D),
    value (Tk, K, E), ``cu_seqlens_q``/``cu_seqlens_k`` (N + 1,) -> (Tq, H, E). One batch row
    of all the tokens; ``mask_mod`` keeps a key of the query's own sequence only, and the rules
    read each token's index within its sequence (the offset S_n - L_n for bottom_right)."""
    if causal_alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"no causal alignment {causal_alignment!r}")
    Tq, Tk = query.shape[0], key.shape[0]
    q_seq, q_local = _sequences(cu_seqlens_q, Tq)
    kv_seq, kv_local = _sequences(cu_seqlens_k, Tk)
    lengths_q = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(torch.int64)
    lengths_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int64)
    offset = lengths_k - lengths_q if causal_alignment == "bottom_right" else 0 * lengths_q
    q_row = q_local + offset[q_seq]  # each query's position among its sequence's keys
    rules = dict(is_causal=is_causal, window=window, softcap=softcap, alibi_slopes=alibi_slopes)

    def score_mod(score, b, h, q, kv):
        return _rules(q_row[q], kv_local[kv], h, **rules)[0](score)

    def mask_mod(b, h, q, kv):
        return (q_seq[q] == kv_seq[kv]) & _rules(q_row[q], kv_local[kv], h, **rules)[1]

    q, k, v = (x.transpose(0, 1)[None] for x in (query, key, value))  # (1, N, T, X)
    block_mask = _block_mask(mask_mod, 1, None, Tq, Tk, device=str(query.device))
    out = _flex(q, k, v, score_mod, block_mask, scale, sinks)
    return out[0].transpose(0, 1)  # (Tq, H, E)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    is_causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Through torch's ``PagedAttention``: query (T, H, D), key_cache (P, page, K, D),
    value_cache (P, page, K, E), block_table (N, max_pages), seq_lens (N,), cu_seqlens_q
    (N + 1,) -> (T, H, E). The pool is one (1, K, P * page, X) cache; the port fills the page
    table and its physical-to-logical map from ``block_table`` (the pages each sequence needs),
    writes the rules on logical positions (query row i of sequence n at
    ``seq_lens[n] - L_n + i``) and lets ``convert_logical_block_mask``/``get_score_mod`` turn
    them into physical ones; the queries are padded into (N, H, max L_n, D)."""
    T, H, D = query.shape
    P, page, K, _ = key_cache.shape
    N = seq_lens.shape[0]
    lengths = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(torch.int64)
    seq_lens = seq_lens.to(torch.int64)
    L = max(int(lengths.max()) if N else 0, 1)
    device = str(query.device)

    paged = PagedAttention(P, page, N, device=device)
    for n in range(N):
        for j in range(-(-int(seq_lens[n]) // page)):  # only the pages the sequence needs
            physical = int(block_table[n, j])
            paged.page_table[n, j] = physical
            paged.physical_to_logical[n, physical] = j
    pages = -(-max(int(seq_lens.max()) if N else 0, 1) // page)

    q = query.new_zeros(N, H, L, D)
    for n in range(N):
        q[n, :, : lengths[n]] = query[cu_seqlens_q[n] : cu_seqlens_q[n + 1]].transpose(0, 1)
    first = seq_lens - lengths  # the position of each sequence's first query
    rules = dict(is_causal=is_causal, window=window, softcap=softcap, alibi_slopes=alibi_slopes)

    def score_mod(score, b, h, q, kv):
        return _rules(first[b] + q, kv, h, **rules)[0](score)

    def mask_mod(b, h, q, kv):
        return (kv < seq_lens[b]) & _rules(first[b] + q, kv, h, **rules)[1]

    logical = _block_mask(mask_mod, N, None, L, pages * page, device=device, BLOCK_SIZE=page)
    block_mask = paged.convert_logical_block_mask(logical, kv_len=seq_lens)
    k = key_cache.reshape(P * page, K, D).transpose(0, 1)[None].expand(N, -1, -1, -1)
    v = value_cache.reshape(P * page, K, -1).transpose(0, 1)[None].expand(N, -1, -1, -1)
    out = _flex(q, k, v, paged.get_score_mod(score_mod, seq_lens), block_mask, scale, sinks)
    rows = [out[n, :, : lengths[n]].transpose(0, 1) for n in range(N)]  # (L_n, H, E) each
    return torch.cat(rows) if rows else out.new_zeros(T, H, value_cache.shape[-1])
