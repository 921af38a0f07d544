"""A second float64 reference of the attention modules, written separately from the oracle.

The module of SEMANTICS.md written out in float64 with NumPy matmuls per head and a per-row
softmax, from the canonical weights only (no implementation, no reshapes of heads). The module
tests (tests/test_modules.py) use it as their expected value, and conformance/tests checks that
the oracle's module goldens agree with it.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["reference_forward"]


def reference_forward(
    weights: dict[str, np.ndarray],
    x: np.ndarray,
    context: np.ndarray | None,
    *,
    n_heads: int,
    n_kv_heads: int,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
) -> tuple[np.ndarray, np.ndarray]:
    """Output ``(B, L, M)`` and weights ``(B, H, L, S)`` in float64, one head and row at a time."""
    w = {n: a.astype(np.float64) for n, a in weights.items()}
    x = x.astype(np.float64)
    context = x if context is None else context.astype(np.float64)
    n_batch, q_len, _ = x.shape
    kv_len = context.shape[1]
    d = w["q_proj.kernel"].shape[1] // n_heads
    e = w["v_proj.kernel"].shape[1] // n_kv_heads
    group = n_heads // n_kv_heads

    def project(name, inp):
        out = inp @ w[f"{name}.kernel"]
        return out + w[f"{name}.bias"] if f"{name}.bias" in w else out

    q, k, v = project("q_proj", x), project("k_proj", context), project("v_proj", context)
    allowed = np.ones((n_batch, n_heads, q_len, kv_len), bool)
    if mask is not None:
        allowed &= np.broadcast_to(mask, allowed.shape)
    if is_causal:
        offset = 0 if causal_alignment == "top_left" else kv_len - q_len
        for i in range(q_len):
            allowed[..., i, :] &= np.arange(kv_len) <= i + offset
    add = np.zeros(allowed.shape) if bias is None else np.broadcast_to(bias, allowed.shape)

    out = np.zeros((n_batch, q_len, n_heads * e))
    probs = np.zeros((n_batch, n_heads, q_len, kv_len))
    for b in range(n_batch):
        for h in range(n_heads):
            kv = h // group  # contiguous groups: query head h reads key/value head h // G
            qh = q[b, :, h * d : (h + 1) * d]  # (L, D)
            kh = k[b, :, kv * d : (kv + 1) * d]  # (S, D)
            vh = v[b, :, kv * e : (kv + 1) * e]  # (S, E)
            for i in range(q_len):
                scores = qh[i] @ kh.T / math.sqrt(d) + add[b, h, i]  # (S,)
                keep = allowed[b, h, i] & (scores > -np.inf)
                if keep.any():
                    p = np.where(keep, np.exp(scores - scores[keep].max()), 0.0)
                    probs[b, h, i] = p / p.sum()
                out[b, i, h * e : (h + 1) * e] = probs[b, h, i] @ vh
    return project("o_proj", out), probs
