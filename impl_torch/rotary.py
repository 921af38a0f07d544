"""Rotary position embedding (RoPE) in PyTorch: broadcasting over heads, unflatten for the pairs.

The same steps, names and comments as ``impl_numpy/rotary.py`` and ``impl_jax/rotary.py``; only
the idiom differs. SEMANTICS.md, "Rotary position embedding": pair p of token t turns by the
angle ``positions[..., t] * theta ** (-2p / rotary_dim)``::

    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)

with the pairs ``(x[p], x[p + R/2])`` (half-split, ``interleaved=False``: Llama, GPT-NeoX,
Hugging Face ``rotate_half``) or ``(x[2p], x[2p+1])`` (``interleaved=True``: GPT-J, RoFormer).
Angles, cos and sin are computed in float32 (float64 for float64 inputs); the result has the
input's dtype, and the features beyond ``rotary_dim`` pass through untouched. Everything stays
on x's device, and autograd flows through x.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, ``...``), L length, D head
dim, R = rotary_dim, P = R / 2 pairs; "heads" is H for queries, K for keys.
"""

from __future__ import annotations

import torch

from attention_spec import check_rotary
from impl_torch.functional import _as_tensors, _compute_dtype

__all__ = ["apply_rotary"]


def apply_rotary(
    x: torch.Tensor,
    positions: torch.Tensor,
    *,
    theta: float = 10000.0,
    rotary_dim: int | None = None,
    interleaved: bool = False,
    inv_freq: torch.Tensor | None = None,
    attention_factor: float = 1.0,
) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` features of ``x`` in pairs by angles of ``positions``.

    Args:
        x: ``(..., heads, L, D)``, queries or keys, in one of the four dtypes.
        positions: integers broadcastable to ``(..., L)``, x's batch dims without its heads
            axis: one position per token, shared by every head.
        theta: the base of the frequencies ``theta ** (-2p / rotary_dim)``.
        rotary_dim: R, the leading features rotated (even, <= D; default D).
        interleaved: pairs ``(x[2p], x[2p+1])`` instead of ``(x[p], x[p + R/2])``.
        inv_freq: ``(R/2,)`` floating, the frequencies to use instead of
            ``theta ** (-2p / R)`` (a converter's llama3 / YaRN / NTK scaling); theta is unused.
        attention_factor: multiplies cos and sin (YaRN's mscale); 1.0 is plain RoPE.

    Returns ``(..., heads, L, D)`` in x's dtype. Array-likes are converted with
    ``torch.as_tensor`` on x's device.
    """
    x, positions, inv_freq = _as_tensors(x, positions, inv_freq)
    dims = check_rotary(
        x, positions, theta=theta, rotary_dim=rotary_dim, interleaved=interleaved,
        inv_freq=inv_freq, attention_factor=attention_factor,
    )
    ct = _compute_dtype(x.dtype)
    R, P = dims.rotary_dim, dims.rotary_dim // 2

    # 1. frequencies: theta ** (-2p / R), float64 from attention_spec, or the caller's
    #    inv_freq; rounded once to ct.
    given = dims.frequencies if inv_freq is None else inv_freq.to(torch.float64)
    inv_freq = torch.as_tensor(given, dtype=torch.float64, device=x.device).to(ct)  # (P,)

    # 2. angles: position times frequency, one per token and pair, shared by the heads;
    #    cos and sin times the attention factor (1.0 for plain RoPE).
    pos = positions.to(x.device).expand(dims.positions_shape).to(ct)  # (..., L)
    angle = pos[..., None, :, None] * inv_freq  # (..., 1, L, P)
    cos, sin = angle.cos(), angle.sin()
    cos, sin = cos * dims.attention_factor, sin * dims.attention_factor  # (..., 1, L, P)

    # 3. pairs: half-split (x[p], x[p + P]) or interleaved (x[2p], x[2p + 1]).
    rotated = x[..., :R].to(ct)  # (..., heads, L, R)
    if dims.interleaved:
        x1, x2 = rotated.unflatten(-1, (P, 2)).unbind(-1)  # (..., heads, L, P) each
    else:
        x1, x2 = rotated.split(P, dim=-1)  # (..., heads, L, P) each

    # 4. rotation: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
    y1 = x1 * cos - x2 * sin  # (..., heads, L, P)
    y2 = x2 * cos + x1 * sin  # (..., heads, L, P)

    # 5. pairs back in their places, in the input dtype; features R..D-1 pass through.
    if dims.interleaved:
        y = torch.stack([y1, y2], dim=-1).flatten(-2)  # (..., heads, L, R)
    else:
        y = torch.cat([y1, y2], dim=-1)  # (..., heads, L, R)
    return torch.cat([y.to(x.dtype), x[..., R:]], dim=-1)  # (..., heads, L, D)
