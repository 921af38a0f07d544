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
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch.nn.attention.flex_attention import (
    AuxRequest,
    and_masks,
    create_block_mask,
    flex_attention,
)

from conformance.ports.precision import torch_ieee_float32
from conformance.ports.torch_adapter import from_numpy, to_numpy

__all__ = ["attention_weights", "from_numpy", "scaled_dot_product_attention", "to_numpy"]


def _batched(x: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """``(..., N, T, X)`` broadcast to ``batch`` and flattened: ``(B, N, T, X)``."""
    return x.expand(*batch, *x.shape[-3:]).reshape(math.prod(batch), *x.shape[-3:])


def _per_score(x: torch.Tensor, batch: tuple[int, ...], H: int, L: int, S: int) -> torch.Tensor:
    """A mask or bias broadcastable to ``(..., H, L, S)`` as ``(B, H, L, S)``."""
    return x.expand(*batch, H, L, S).reshape(math.prod(batch), H, L, S)


def _mods(
    batch, H, L, S, *, mask, bias, is_causal, causal_alignment, softcap, window,
    q_segment_ids, kv_segment_ids, alibi_slopes,
):  # fmt: skip
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
    K, S = key.shape[-3], key.shape[-2]
    batch = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    q, k, v = (_batched(x, batch) for x in (query, key, value))
    score_mod, mask_mod = _mods(
        batch, H, L, S, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, alibi_slopes=alibi_slopes,
    )  # fmt: skip
    with warnings.catch_warnings(), torch_ieee_float32():
        warnings.simplefilter("ignore", UserWarning)  # "flex_attention called without compile"
        block_mask = None
        if mask_mod is not None:
            block_mask = create_block_mask(mask_mod, q.shape[0], H, L, S, device=str(query.device))
        out, aux = flex_attention(
            q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
            enable_gqa=H != K, return_aux=AuxRequest(lse=True),
        )  # fmt: skip
    lse = aux.lse  # (B, H, L): the natural log of each row's sum of exp(score)
    if sinks is not None:  # the sink's exp(sinks[h]) joins each row's denominator
        sink = sinks.to(lse.dtype)[None, :, None]  # (1, H, 1)
        kept = torch.sigmoid(lse - sink)  # exp(lse) / (exp(lse) + exp(sink))
        out = (out * kept[..., None].to(out.dtype)).to(out.dtype)
    return out.reshape(*batch, H, L, out.shape[-1])


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
