"""Scaled dot-product attention in PyTorch: tensor ops, autograd, any device.

The same steps, names and comments as ``impl_numpy/functional.py`` and
``impl_jax/functional.py``; only the idiom differs. Here a step works in place (``mul_``,
``add_``, ``masked_fill_``, ``sub_``, ``exp_``) wherever autograd keeps nothing that the write
would spoil (softcap's ``tanh`` keeps its output, so it stays out of place): the
``(..., H, L, S)`` scores are the one large tensor, and each new copy of it costs a full pass and
an allocation. GQA shows torch's ``repeat_interleave``, and nothing leaves the device the
tensors are on.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim.
"""

from __future__ import annotations

import torch

from attention_spec import AttentionDims, causal_offset, check_attention, check_causal_mask_args

__all__ = ["attention_weights", "causal_mask", "scaled_dot_product_attention"]


def causal_mask(
    q_len: int,
    kv_len: int,
    *,
    alignment: str = "top_left",
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean ``(L, S)`` mask, True where query i may attend key j (``j <= i + offset``).

    ``alignment="top_left"``: offset 0. ``"bottom_right"``: offset ``S - L`` (KV-cache decoding).
    ``device`` is torch's addition: the mask is built where the scores live.
    """
    check_causal_mask_args(q_len, kv_len, alignment)
    offset = causal_offset(q_len, kv_len, alignment)
    i = torch.arange(q_len, device=device)[:, None]  # (L, 1)
    j = torch.arange(kv_len, device=device)[None, :]  # (1, S)
    return j <= i + offset  # (L, S)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; float32, float16 and bfloat16 are computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _weights(query, key, dims: AttentionDims, mask, bias, is_causal, causal_alignment, softcap):
    """Steps 1-6 of the contract; returns the weights ``(..., H, L, S)`` in the compute dtype."""
    ct = _compute_dtype(query.dtype)
    G, L, S = dims.G, dims.L, dims.S

    # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G.
    q = query.to(ct)  # (..., H, L, D)
    k = key.to(ct).repeat_interleave(G, dim=-3)  # (..., H, S, D): kv head k serves k*G .. k*G+G-1
    s = q @ k.transpose(-2, -1)  # (..., H, L, S)
    s.mul_(dims.scale)
    if s.shape != dims.scores_shape:  # a mask, bias or value with more batch than query and key
        s = s.expand(dims.scores_shape).clone()  # (..., H, L, S)

    # 2. softcap: s = softcap * tanh(s / softcap), before any bias or mask.
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)  # out of place: tanh keeps its output for backward

    # 3. bias: added, may hold -inf.
    if bias is not None:
        s.add_(bias.to(ct))

    # 4. mask: False -> -inf.
    if mask is not None:
        s.masked_fill_(~mask, float("-inf"))

    # 5. causal: query i sees key j iff j <= i + offset.
    if is_causal:
        allowed = causal_mask(L, S, alignment=causal_alignment, device=s.device)  # (L, S)
        s.masked_fill_(~allowed, float("-inf"))

    # 6. softmax over S, stable; a row with no allowed key (all -inf) gets all-zero weights.
    if S > 0:
        row_max = s.detach().amax(dim=-1, keepdim=True)  # (..., H, L, 1)
    else:
        row_max = s.new_zeros((*s.shape[:-1], 1))  # no keys at all: every row is fully masked
    row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)  # exp(-inf - 0) = 0, not NaN
    e = s.sub_(row_max).exp_()  # (..., H, L, S)
    row_sum = e.sum(dim=-1, keepdim=True)  # (..., H, L, 1)
    return e / torch.where(row_sum == 0.0, 1.0, row_sum)  # fully masked row: 0 / 1 = 0


def attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Attention weights ``softmax(scores)``, shape ``(..., H, L, S)``, in the query's dtype.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        mask: boolean, broadcastable to ``(..., H, L, S)``; True = may attend.
        bias: floating, broadcastable to ``(..., H, L, S)``; added to the scores, may hold -inf.
        is_causal: apply the causal rule of ``causal_alignment`` ("top_left" | "bottom_right").
        scale: score scale, default ``1/sqrt(D)``.
        softcap: if given, scores become ``softcap * tanh(scores / softcap)`` before bias/mask.

    Rows with no allowed key are all zeros, with zero gradient.
    """
    dims = check_attention(
        query,
        key,
        mask=mask,
        bias=bias,
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
    )
    weights = _weights(query, key, dims, mask, bias, is_causal, causal_alignment, softcap)
    return weights.to(query.dtype)


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
) -> torch.Tensor:
    """``softmax(query @ key^T * scale [+ bias] [masked]) @ value``, shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
        mask, bias, is_causal, causal_alignment, scale, softcap: see :func:`attention_weights`.

    Returns the output in the query's dtype; rows with no allowed key are zeros.
    """
    dims = check_attention(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
    )
    weights = _weights(query, key, dims, mask, bias, is_causal, causal_alignment, softcap)

    # 7. output = weights @ value, then back to the input dtype.
    v = value.to(weights.dtype).repeat_interleave(dims.G, dim=-3)  # (..., H, S, E)
    return (weights @ v).to(query.dtype)  # (..., H, L, E)
