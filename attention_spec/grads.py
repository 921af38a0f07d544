"""What the backward pass shares: the named tuple of gradients and the check of ``grad_output``.

``scaled_dot_product_attention_vjp`` and ``flash_attention_vjp`` (in ``impl_numpy``,
``impl_torch`` and ``impl_jax``) take the forward's arguments plus ``grad_output``, the
cotangent of the output ``(..., H, L, E)``, and return :class:`AttentionGrads`: one gradient per
differentiable input, of that input's shape and dtype, or None for an input that was not given.
Mask, segment ids, window, scale, softcap and ALiBi slopes are not differentiated.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from attention_spec.arrays import batch_letters, check_dtype, describe, format_dims
from attention_spec.call import AttentionDims
from attention_spec.errors import make_error

__all__ = ["AttentionGrads", "check_grad_output"]


class AttentionGrads(NamedTuple):
    """The gradients of one attention call, each of its input's shape and dtype.

    query ``(..., H, L, D)``, key ``(..., K, S, D)``, value ``(..., K, S, E)``: the key/value
    gradients sum over the G query heads of their group; bias: the bias's own shape (summed over
    the axes it was broadcast along), None when no bias was given; sinks ``(H,)``, None when no
    sinks were given.
    """

    query: Any
    key: Any
    value: Any
    bias: Any = None
    sinks: Any = None


def check_grad_output(dims: AttentionDims, grad_output: Any) -> None:
    """``grad_output`` is an array of one of the four float dtypes (DTypeError
    ``not_an_array`` / ``unsupported_dtype``) with exactly the output's shape ``(..., H, L, E)``
    (DimensionMismatchError ``grad_output_shape``; it is not broadcast). Checked after every
    rule of the forward call, so a bad forward argument is reported first."""
    if grad_output is None:
        raise make_error(
            "not_an_array",
            "grad_output must be an array (the cotangent of the output); got None",
            expected="array",
            actual="None",
        )
    spec = describe(grad_output)
    check_dtype("grad_output", spec.dtype)
    want = dims.output_shape
    if spec.shape != want:
        text = format_dims([*batch_letters(len(dims.batch)), "H", "L", "E"], want)
        raise make_error(
            "grad_output_shape",
            f"grad_output must have the output's shape {text}; got {spec.shape}",
            expected=text,
            actual=str(spec.shape),
        )
