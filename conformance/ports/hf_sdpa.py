"""Hugging Face's ``sdpa_attention_forward`` (transformers 5.x) as a port, driven as a model
layer drives it: the boolean mask of ``masking_utils.sdpa_mask`` (None where a purely causal
mask may be left to torch's ``is_causal``), the layer's ``scaling``, ``sliding_window``, a bias
as its ``position_bias``, and the ``softcap`` and ``s_aux`` keywords Gemma 2 and gpt-oss layers
pass (:func:`conformance.ports.hf_common.call`). Under it is
``torch.nn.functional.scaled_dot_product_attention``. It returns no weights, so
:func:`attention_weights` runs the same call with the identity as value. Install with the
``hf`` extra.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from conformance.ports.descales import takes_descales, torch_output
from conformance.ports.hf_common import call
from conformance.ports.precision import torch_ieee_float32
from conformance.ports.torch_adapter import from_numpy, to_numpy

__all__ = ["attention_weights", "from_numpy", "scaled_dot_product_attention", "to_numpy"]

#: What the model families that run on sdpa pass: Gemma 2's softcap, gpt-oss's sinks.
_KEYWORDS = ("softcap", "s_aux")


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "Hugging Face's sdpa_attention_forward"


@takes_descales(_KERNEL, torch_output)
def scaled_dot_product_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **keywords: Any
) -> torch.Tensor:
    """(..., H, L, D), (..., K, S, D), (..., K, S, E) -> (..., H, L, E)."""
    with torch_ieee_float32():
        return call(sdpa_attention_forward, "sdpa", query, key, value, keywords=_KEYWORDS,
                    **keywords)[0]


@takes_descales(_KERNEL, torch_output)
def attention_weights(query: torch.Tensor, key: torch.Tensor, **keywords: Any) -> torch.Tensor:
    """The weights (..., H, L, S): the same call with value = identity (S x S)."""
    K, S = key.shape[-3], key.shape[-2]
    identity = torch.eye(S, dtype=query.dtype, device=query.device)
    identity = identity.expand(*key.shape[:-3], K, S, S)
    return scaled_dot_product_attention(query, key, identity, **keywords)
