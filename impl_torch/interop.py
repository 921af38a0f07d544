"""Canonical weights to and from ``torch.nn.MultiheadAttention``, and its mask polarity.

``nn.MultiheadAttention`` packs the three input projections into one ``in_proj_weight
(3*M, M)``, rows ``q | k | v``, each block an ``nn.Linear``-style ``(out, in)`` matrix, and one
``in_proj_bias (3*M,)``; the output projection is an ``nn.Linear`` ``out_proj``. It can only hold
MHA weights with one head dim that tile the model width: K = H, E = D and H*D = M
(``attention_spec.modules.check_interop`` says so, with the numbers, before anything is built).

Where its contract differs from ours (SEMANTICS.md, last table):

- boolean masks have the opposite polarity: True = masked *out* (ours: True = may attend);
  :func:`to_torch_attn_mask` and :func:`to_torch_key_padding_mask` convert;
- ``attn_mask`` is ``(L, S)`` or ``(B*H, L, S)``, key padding is a separate ``(B, S)`` mask;
- a query row with no allowed key gives NaN (with the default ``need_weights=True``), ours zeros;
- layout is ``(L, B, M)`` unless ``batch_first=True`` (the default here, like our modules).

Shape letters (SEMANTICS.md): B batch, H heads, L query length, S key length, D head dim, M width.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from attention_spec.errors import make_error
from attention_spec.modules import PROJECTIONS, check_canonical, check_interop
from impl_torch.modules import _torch_dtype, linear_weight, tensor_from_numpy, tensor_to_numpy

__all__ = [
    "from_torch_multihead_attention",
    "to_torch_attn_mask",
    "to_torch_key_padding_mask",
    "to_torch_multihead_attention",
]

_TARGET = "torch.nn.MultiheadAttention"


def to_torch_multihead_attention(
    weights: Mapping[str, np.ndarray],
    *,
    n_heads: int,
    n_kv_heads: int | None = None,
    batch_first: bool = True,
    dtype: torch.dtype | str | None = None,
    device: torch.device | str | None = None,
) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention`` holding canonical ``weights`` (K = H, E = D, H*D = M).

    ``n_kv_heads`` defaults to ``n_heads``; give it for GQA weights to be told why they do not fit.
    ``dtype`` defaults to the weights' own dtype.
    """
    weights = {name: np.asarray(w) for name, w in weights.items()}
    dims = check_canonical(
        weights,
        n_heads=n_heads,
        n_kv_heads=n_heads if n_kv_heads is None else n_kv_heads,
    )
    check_interop(dims, _TARGET)
    dtype = _torch_dtype(weights["q_proj.kernel"].dtype if dtype is None else dtype)
    mha = nn.MultiheadAttention(
        dims.M, dims.H, bias=dims.bias, batch_first=batch_first, dtype=dtype, device=device
    )
    w = {name: tensor_from_numpy(a, dtype=dtype, device=device) for name, a in weights.items()}
    with torch.no_grad():
        # in_proj_weight rows: q (H*D of them), then k, then v; each block (out, in).
        mha.in_proj_weight.copy_(
            torch.cat([linear_weight(w[f"{n}.kernel"]) for n in PROJECTIONS[:3]], dim=0)
        )  # (3*M, M)
        mha.out_proj.weight.copy_(linear_weight(w["o_proj.kernel"]))  # (M, H*E)
        if dims.bias:
            mha.in_proj_bias.copy_(torch.cat([w[f"{n}.bias"] for n in PROJECTIONS[:3]]))  # (3*M,)
            mha.out_proj.bias.copy_(w["o_proj.bias"])  # (M,)
    return mha


def from_torch_multihead_attention(mha: nn.MultiheadAttention) -> dict[str, np.ndarray]:
    """The canonical weights of an ``nn.MultiheadAttention`` (one input width, no bias_k/bias_v)."""
    if not mha._qkv_same_embed_dim or mha.bias_k is not None:
        raise make_error(
            "weight_shape",
            f"{_TARGET} with kdim/vdim different from embed_dim or add_bias_kv=True has no "
            f"canonical form; got embed_dim={mha.embed_dim}, kdim={mha.kdim}, vdim={mha.vdim}, "
            f"add_bias_kv={mha.bias_k is not None}",
            expected="kdim == vdim == embed_dim, add_bias_kv=False",
            actual=f"kdim={mha.kdim}, vdim={mha.vdim}, add_bias_kv={mha.bias_k is not None}",
        )
    q, k, v = mha.in_proj_weight.chunk(3, dim=0)  # 3 x (M, M), each (out, in)
    kernels = [q, k, v, mha.out_proj.weight]
    weights = {}
    for i, name in enumerate(PROJECTIONS):
        weights[f"{name}.kernel"] = tensor_to_numpy(linear_weight(kernels[i]))  # (in, out)
        if mha.in_proj_bias is not None:
            bias = mha.out_proj.bias if name == "o_proj" else mha.in_proj_bias.chunk(3)[i]
            weights[f"{name}.bias"] = tensor_to_numpy(bias)  # (out,)
    return weights


def to_torch_attn_mask(mask: torch.Tensor, shape: tuple[int, int, int, int]) -> torch.Tensor:
    """Our boolean mask (True = may attend), broadcastable to ``shape = (B, H, L, S)``, as
    ``nn.MultiheadAttention``'s ``attn_mask`` (True = masked out): ``(L, S)`` when ``mask`` has
    no batch or head axis, else ``(B*H, L, S)``."""
    B, H, L, S = shape
    if mask.ndim <= 2:
        return ~mask.expand(L, S)  # (L, S)
    return ~mask.expand(B, H, L, S).reshape(B * H, L, S)  # (B*H, L, S)


def to_torch_key_padding_mask(mask: torch.Tensor) -> torch.Tensor:
    """A ``padding_mask`` ``(B, 1, 1, S)`` (True = real key) as ``key_padding_mask`` ``(B, S)``
    (True = padding, ignored)."""
    if mask.ndim != 4 or mask.shape[1:3] != (1, 1):
        raise make_error(
            "mask_shape",
            f"key padding mask must be (B, 1, 1, S) as padding_mask makes; got {tuple(mask.shape)}",
            expected="(B, 1, 1, S)",
            actual=str(tuple(mask.shape)),
        )
    return ~mask[:, 0, 0, :]  # (B, S)
