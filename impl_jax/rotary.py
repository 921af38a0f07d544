"""Rotary position embedding (RoPE) in JAX: a pure function, broadcasting over heads.

The same steps, names and comments as ``impl_numpy/rotary.py`` and ``impl_torch/rotary.py``;
only the idiom differs. SEMANTICS.md, "Rotary position embedding": pair p of token t turns by
the angle ``positions[..., t] * theta ** (-2p / rotary_dim)``::

    (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)

with the pairs ``(x[p], x[p + R/2])`` (half-split, ``interleaved=False``: Llama, GPT-NeoX,
Hugging Face ``rotate_half``) or ``(x[2p], x[2p+1])`` (``interleaved=True``: GPT-J, RoFormer).
Angles, cos and sin are computed in float32 (float64 for float64 inputs, which need
``jax_enable_x64``); the result has the input's dtype, and the features beyond ``rotary_dim``
pass through untouched. Jit it with the keywords static::

    rope = jax.jit(apply_rotary, static_argnames=ROTARY_STATIC_ARGNAMES)

Shape letters (SEMANTICS.md): B batch (any number of leading dims, ``...``), L length, D head
dim, R = rotary_dim, P = R / 2 pairs; "heads" is H for queries, K for keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attention_spec import check_rotary
from impl_jax.functional import _as_given, _asarray, _check_x64, _compute_dtype

__all__ = ["ROTARY_STATIC_ARGNAMES", "apply_rotary"]

#: The keywords to mark static under ``jax.jit``.
ROTARY_STATIC_ARGNAMES: tuple[str, ...] = ("theta", "rotary_dim", "interleaved", "attention_factor")


def apply_rotary(
    x: jax.Array,
    positions: jax.Array,
    *,
    theta: float = 10000.0,
    rotary_dim: int | None = None,
    interleaved: bool = False,
    inv_freq: jax.Array | None = None,
    attention_factor: float = 1.0,
) -> jax.Array:
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

    Returns ``(..., heads, L, D)`` in x's dtype. Array-likes are converted with ``jnp.asarray``
    (after validation, which reads a NumPy array's own dtype).
    """
    x, positions, inv_freq = _as_given(x), _as_given(positions), _as_given(inv_freq)
    dims = check_rotary(
        x, positions, theta=theta, rotary_dim=rotary_dim, interleaved=interleaved,
        inv_freq=inv_freq, attention_factor=attention_factor,
    )
    _check_x64(x.dtype)
    x, positions, inv_freq = _asarray(x), _asarray(positions), _asarray(inv_freq)
    ct = _compute_dtype(x.dtype)
    R, P = dims.rotary_dim, dims.rotary_dim // 2

    # 1. frequencies: theta ** (-2p / R), float64 from attention_spec, or the caller's
    #    inv_freq; rounded once to ct.
    given = dims.frequencies if inv_freq is None else inv_freq
    inv_freq = jnp.asarray(given, dtype=ct)  # (P,)

    # 2. angles: position times frequency, one per token and pair, shared by the heads;
    #    cos and sin times the attention factor (1.0 for plain RoPE).
    pos = jnp.broadcast_to(positions, dims.positions_shape).astype(ct)  # (..., L)
    angle = pos[..., None, :, None] * inv_freq  # (..., 1, L, P)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    cos, sin = cos * dims.attention_factor, sin * dims.attention_factor  # (..., 1, L, P)

    # 3. pairs: half-split (x[p], x[p + P]) or interleaved (x[2p], x[2p + 1]).
    rotated = x[..., :R].astype(ct)  # (..., heads, L, R)
    if dims.interleaved:
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]  # (..., heads, L, P) each
    else:
        x1, x2 = rotated[..., :P], rotated[..., P:]  # (..., heads, L, P) each

    # 4. rotation: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
    y1 = x1 * cos - x2 * sin  # (..., heads, L, P)
    y2 = x2 * cos + x1 * sin  # (..., heads, L, P)

    # 5. pairs back in their places, in the input dtype; features R..D-1 pass through.
    if dims.interleaved:
        y = jnp.stack([y1, y2], axis=-1).reshape(*y1.shape[:-1], R)  # (..., heads, L, R)
    else:
        y = jnp.concatenate([y1, y2], axis=-1)  # (..., heads, L, R)
    return jnp.concatenate([y.astype(x.dtype), x[..., R:]], axis=-1)  # (..., heads, L, D)
