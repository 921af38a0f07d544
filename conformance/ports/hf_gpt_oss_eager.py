"""gpt-oss's ``eager_attention_forward`` (transformers 5.x) as a port: Hugging Face's sinks path.

A gpt-oss layer holds one learned sink logit per query head (``module.sinks``, shape (H,)); its
eager function concatenates it to every row of scores, subtracts the row max, takes the softmax
in the scores' dtype and drops the sink's column. The port sets ``module.sinks`` to the call's
``sinks``, and to -inf when the call has none (a sink that takes no share: the contract without
sinks), and drives the function as :func:`conformance.ports.hf_common.call` says (the eager
float mask, ``scaling``, ``sliding_window``, ``s_aux``). With an fp8 query that -inf sink is
bfloat16, the model's dtype then (e4m3fn has no -inf). Install with the ``hf`` extra.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

from conformance.ports.descales import is_fp8, takes_descales, torch_output
from conformance.ports.hf_common import call
from conformance.ports.torch_adapter import from_numpy, to_numpy

__all__ = ["attention_weights", "from_numpy", "scaled_dot_product_attention", "to_numpy"]


def _call(query, key, value, sinks=None, **keywords):
    if sinks is None:
        dtype = torch.bfloat16 if is_fp8(query.dtype) else query.dtype  # a model's dtype
        sinks = torch.full(query.shape[-3:-2], -torch.inf, dtype=dtype)
    return call(eager_attention_forward, "eager", query, key, value, sinks=sinks,
                keywords=("s_aux",), **keywords)


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "gpt-oss's eager_attention_forward"


@takes_descales(_KERNEL, torch_output)
def scaled_dot_product_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **keywords: Any
) -> torch.Tensor:
    """(..., H, L, D), (..., K, S, D), (..., K, S, E) -> (..., H, L, E)."""
    return _call(query, key, value, **keywords)[0]


@takes_descales(_KERNEL, torch_output)
def attention_weights(query: torch.Tensor, key: torch.Tensor, **keywords: Any) -> torch.Tensor:
    """The weights (..., H, L, S) the eager function returns (the sink's column dropped)."""
    return _call(query, key, key, **keywords)[1]
