"""Hugging Face's attention functions driven the way a transformers model drives them.

A decoder layer of transformers 5.x builds its mask once per forward with the builders of
``transformers.masking_utils`` (``eager_mask``: a float mask, 0 or ``finfo(dtype).min``;
``sdpa_mask``: a boolean one, or None where torch's ``is_causal`` can stand in for it;
``flex_attention_mask``: a ``BlockMask`` of the same ``mask_function``, built compiled), from a
``mask_function(batch_idx, head_idx, q_idx, kv_idx)`` and the 2-D padding mask, and then calls
the attention function of its ``config._attn_implementation`` as
``fn(module, query, key, value, attention_mask, dropout=0.0, scaling=module.scaling,
sliding_window=..., s_aux=module.sinks)`` on ``(B, N, T, X)`` tensors, getting back
``(B, L, H, E)`` and the weights (or None). :func:`call` does exactly that for the contract's
keywords, so a failure of these ports is a failure a model would have:

- the causal rule is ``causal_mask_function`` with the queries at positions
  ``q_offset + i``: ``q_offset = S - L`` for bottom_right (a KV cache, what every model does),
  0 for top_left; without ``is_causal`` the base is ``bidirectional_mask_function``;
- ``window=(left, 0)`` is the model's ``sliding_window = left + 1`` (``sliding_window_overlay``,
  ``kv_idx > q_idx - sliding_window``) and ``window=(W, W)`` the bidirectional overlay
  (``|q_idx - kv_idx| <= W``); any other pair has no Hugging Face form (NotImplementedError);
  ``sliding_window`` is also passed to the attention function, as models pass it;
- a mask that depends on the key only is the model's 2-D padding ``attention_mask``; any other
  (without a head axis: the builders make ``(B, 1, L, S)``) is one more ``mask_function``, and
  packed segment ids are one too (``q_ids[b, i] == kv_ids[b, j]``, the comparison of
  ``packed_sequence_mask_function``, which needs L = S);
- a bias and ALiBi (``-slope[h] * |i + offset - j|``) are what position-biased models add to the
  scores: added to the eager float mask, and sdpa's and flex's ``position_bias`` argument;
- softcap and sinks are the attention function's ``softcap`` and ``s_aux`` keywords, passed only
  where a model family passes them (``*_KEYWORDS`` of each port).

The ports' fp8 (contract v3): the fp8 tensors go to the function as they are, ``q_descale *
k_descale`` folded into the layer's ``scaling`` where each is one number and the output times
``v_descale`` (:mod:`conformance.ports.descales`, around each port's functions).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable

import torch
from transformers import masking_utils as mu

__all__ = ["call"]


def _batched(x: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    return x.expand(*batch, *x.shape[-3:]).reshape(math.prod(batch), *x.shape[-3:])


def _mask_function(is_causal, window, offset, dense_mask, q_ids, kv_ids) -> tuple[Callable, int]:
    """The layer's ``mask_function`` and its ``sliding_window`` (or None)."""
    functions = [mu.causal_mask_function if is_causal else mu.bidirectional_mask_function]
    sliding_window = None
    if window is not None:
        left, right = window
        if left is not None and right == 0:
            sliding_window = left + 1
            functions += [mu.sliding_window_overlay(sliding_window), mu.causal_mask_function]
        elif left is not None and left == right:
            functions.append(mu.sliding_window_bidirectional_overlay(left))
        else:
            raise NotImplementedError(f"Hugging Face has no window {window}: (W, 0) or (W, W)")
    if dense_mask is not None:  # (B, 1, L, S), read at the query's row, not its position
        functions.append(lambda b, h, q, kv: dense_mask[b, 0, q - offset, kv])
    if q_ids is not None:
        functions.append(lambda b, h, q, kv: q_ids[b, q - offset] == kv_ids[b, kv])
    return mu.and_masks(*functions), sliding_window


def call(
    function: Callable,
    kind: str,
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
    keywords: tuple[str, ...] = (),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(output (..., H, L, E), weights (..., H, L, S) or None) of the attention ``function``
    with a ``kind`` ("eager", "sdpa" or "flex") mask; ``keywords`` are those of ``softcap`` and
    ``s_aux`` that the model family passes (others given: NotImplementedError)."""
    if softcap is not None and "softcap" not in keywords:
        raise NotImplementedError("this model family's attention takes no softcap")
    if sinks is not None and "s_aux" not in keywords:
        raise NotImplementedError("this model family's attention takes no sinks (s_aux)")
    if causal_alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"no causal alignment {causal_alignment!r}")
    H, L, D = query.shape[-3:]
    K, S = key.shape[-3], key.shape[-2]
    batch = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    B = math.prod(batch)
    q, k, v = (_batched(x, batch) for x in (query, key, value))
    offset = 0 if causal_alignment == "top_left" else S - L

    padding = dense_mask = None
    if mask is not None:
        shape = torch.broadcast_shapes(mask.shape, (*batch, 1, 1, 1))
        if shape[-3] != 1:
            raise NotImplementedError("Hugging Face's masks have no head axis: (B, 1, L, S)")
        if shape[-2] == 1:  # a key-only mask: the model's 2-D attention_mask
            padding = mask.expand(*batch, 1, 1, S).reshape(B, S)
        else:
            dense_mask = mask.expand(*batch, 1, L, S).reshape(B, 1, L, S)
    q_ids = kv_ids = None
    if q_segment_ids is not None:
        q_ids = q_segment_ids.expand(*batch, L).reshape(B, L)
        kv_ids = kv_segment_ids.expand(*batch, S).reshape(B, S)
    mask_function, sliding_window = _mask_function(
        is_causal, window, offset, dense_mask, q_ids, kv_ids
    )
    pure_causal = is_causal and window is None and dense_mask is None and q_ids is None
    position_bias = None
    if bias is not None:
        position_bias = bias.expand(*batch, H, L, S).reshape(B, H, L, S)
    if alibi_slopes is not None:
        rows = torch.arange(L)[:, None] + offset
        alibi = -alibi_slopes[:, None, None] * (rows - torch.arange(S)[None, :]).abs()
        alibi = alibi.expand(B, H, L, S)  # a model's position bias is (B, H, L, S)
        position_bias = alibi if position_bias is None else position_bias + alibi

    build = dict(batch_size=B, q_length=L, kv_length=S, q_offset=offset,
                 mask_function=mask_function, attention_mask=padding)
    extra = {}
    if kind == "eager":
        attention_mask = mu.eager_mask(**build, dtype=query.dtype)
        if position_bias is not None:
            attention_mask = attention_mask + position_bias.to(query.dtype)
    elif kind == "flex":
        attention_mask = mu.flex_attention_mask(**build, device=query.device)
        if position_bias is not None:
            extra["position_bias"] = position_bias.to(query.dtype)
    else:
        attention_mask = mu.sdpa_mask(**build, allow_is_causal_skip=pure_causal,
                                      local_size=sliding_window)
        if position_bias is not None:
            extra["position_bias"] = position_bias.to(query.dtype)
    if "softcap" in keywords:
        extra["softcap"] = softcap
    module = types.SimpleNamespace(
        num_key_value_groups=H // K, training=False, is_causal=is_causal,
        scaling=D**-0.5 if scale is None else scale, sinks=sinks,
    )
    if "s_aux" in keywords:
        extra["s_aux"] = sinks
    out, weights = function(
        module, q, k, v, attention_mask, dropout=0.0, scaling=module.scaling,
        sliding_window=sliding_window, **extra,
    )
    out = out.transpose(1, 2).reshape(*batch, H, L, out.shape[-1])
    if weights is not None and kind != "flex":  # flex's second output is the lse (or None)
        weights = weights.reshape(*batch, H, L, S)
    return out, weights
