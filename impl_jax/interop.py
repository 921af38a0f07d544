"""Canonical weights to and from ``flax.nnx.MultiHeadAttention``.

flax keeps the heads as their own kernel axis: ``query.kernel (M, H, D)``, ``key.kernel
(M, K, D)``, ``value.kernel (M, K, D)``, ``out.kernel (H, D, M)``, biases ``(H, D)``, ``(K, D)``
and ``(M,)``. Reshaping a canonical ``(M, H*D)`` kernel row-major to ``(M, H, D)`` gives head h
the features ``[h*D:(h+1)*D]``, exactly the canonical rule; nothing is transposed. flax has one
head dim for q, k and v, so E = D (``attention_spec.modules.check_interop``); K < H needs a flax
whose ``MultiHeadAttention`` takes ``num_kv_heads`` (0.12 does; it groups heads like we do).

Where its contract differs from ours (SEMANTICS.md, last table): a query row whose mask allows no
key gets uniform weights (flax fills masked scores with the dtype's most negative finite number),
ours zeros; its ``is_causal`` is top-left only.

Shape letters (SEMANTICS.md): B batch, H query heads, K key/value heads, D head dim, M width.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_spec.errors import make_error
from attention_spec.modules import check_canonical, check_interop

__all__ = ["from_flax_multihead_attention", "to_flax_multihead_attention"]

_TARGET = "flax.nnx.MultiHeadAttention"

#: canonical projection -> flax submodule
_FLAX_NAMES = {"q_proj": "query", "k_proj": "key", "v_proj": "value", "o_proj": "out"}


def to_flax_multihead_attention(
    weights: Mapping[str, np.ndarray],
    *,
    n_heads: int,
    n_kv_heads: int | None = None,
    dtype: jnp.dtype | str | None = None,
) -> nnx.MultiHeadAttention:
    """An ``nnx.MultiHeadAttention`` holding canonical ``weights`` (E = D).

    ``n_kv_heads`` defaults to ``n_heads``; ``dtype`` to the weights' own dtype. The module
    computes its projections at ``Precision.HIGHEST``, like ours.
    """
    weights = {name: np.asarray(w) for name, w in weights.items()}
    dims = check_canonical(
        weights,
        n_heads=n_heads,
        n_kv_heads=n_heads if n_kv_heads is None else n_kv_heads,
    )
    check_interop(dims, _TARGET)
    M, H, K, D = dims.M, dims.H, dims.K, dims.D
    dtype = jnp.dtype(weights["q_proj.kernel"].dtype if dtype is None else dtype)
    # An abstract module (shapes only, no random init; how flax restores checkpoints), then the
    # weights, reshaped to flax's head axes.
    mha = nnx.eval_shape(
        lambda: nnx.MultiHeadAttention(
            num_heads=H,
            in_features=M,
            qkv_features=H * D,
            out_features=M,
            **({} if K == H else {"num_kv_heads": K}),
            use_bias=dims.bias,
            param_dtype=dtype,
            precision=jax.lax.Precision.HIGHEST,
            decode=False,
            rngs=nnx.Rngs(0),
        )
    )
    shapes = {  # canonical name -> flax shape (kernel, bias)
        "q_proj": ((M, H, D), (H, D)),
        "k_proj": ((M, K, D), (K, D)),
        "v_proj": ((M, K, D), (K, D)),
        "o_proj": ((H, D, M), (M,)),
    }
    for name, (kernel_shape, bias_shape) in shapes.items():
        proj = getattr(mha, _FLAX_NAMES[name])
        proj.kernel.set_value(jnp.asarray(weights[f"{name}.kernel"].reshape(kernel_shape), dtype))
        if dims.bias:
            proj.bias.set_value(jnp.asarray(weights[f"{name}.bias"].reshape(bias_shape), dtype))
    return mha


def from_flax_multihead_attention(mha: nnx.MultiHeadAttention) -> dict[str, np.ndarray]:
    """The canonical weights of an ``nnx.MultiHeadAttention`` (one input width, output width M,
    no query/key normalization)."""
    M = mha.in_features
    if mha.in_kv_features != M or mha.out_features != M or mha.normalize_qk:
        raise make_error(
            "weight_shape",
            f"{_TARGET} needs in_kv_features == out_features == in_features and "
            f"normalize_qk=False to have a canonical form; got in_features={M}, "
            f"in_kv_features={mha.in_kv_features}, out_features={mha.out_features}, "
            f"normalize_qk={mha.normalize_qk}",
            expected="in_kv_features == out_features == in_features, normalize_qk=False",
            actual=f"{mha.in_kv_features}, {mha.out_features}, {mha.normalize_qk}",
        )
    weights = {}
    for name, flax_name in _FLAX_NAMES.items():
        proj = getattr(mha, flax_name)
        kernel = np.array(proj.kernel[...])  # (M, H|K, D) or (H, D, M)
        n_in = M if name != "o_proj" else kernel.shape[0] * kernel.shape[1]
        weights[f"{name}.kernel"] = kernel.reshape(n_in, -1)  # (in, out)
        if proj.bias is not None:
            weights[f"{name}.bias"] = np.array(proj.bias[...]).reshape(-1)  # (out,)
    return weights
