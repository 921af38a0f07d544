"""Llama's ``eager_attention_forward`` (transformers 5.x) as a port, driven as a Llama layer
drives it: the float mask of ``masking_utils.eager_mask`` (0 or ``finfo(dtype).min``), the
layer's ``scaling``, its ``sliding_window``, through :func:`conformance.ports.hf_common.call`.

The function is what most decoder families copy (Llama, Mistral, Qwen2, ...): ``repeat_kv``
for GQA, ``query @ key^T * scaling + attention_mask``, a float32 softmax cast back to the input
dtype, ``weights @ value``. It returns the weights, which :func:`attention_weights` reads. It
has no softcap and no sinks (NotImplementedError); ``hf_gpt_oss_eager`` is the sinks path.
Install with the ``hf`` extra.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.models.llama.modeling_llama import eager_attention_forward

from conformance.ports.descales import takes_descales, torch_output
from conformance.ports.hf_common import call
from conformance.ports.torch_adapter import from_numpy, to_numpy

__all__ = ["attention_weights", "from_numpy", "scaled_dot_product_attention", "to_numpy"]


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "Llama's eager_attention_forward"


@takes_descales(_KERNEL, torch_output)
def scaled_dot_product_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **keywords: Any
) -> torch.Tensor:
    """(..., H, L, D), (..., K, S, D), (..., K, S, E) -> (..., H, L, E)."""
    return call(eager_attention_forward, "eager", query, key, value, **keywords)[0]


@takes_descales(_KERNEL, torch_output)
def attention_weights(query: torch.Tensor, key: torch.Tensor, **keywords: Any) -> torch.Tensor:
    """The weights (..., H, L, S) the eager function returns (with value = key)."""
    return call(eager_attention_forward, "eager", query, key, key, **keywords)[1]
