"""Hugging Face's ``flex_attention_forward`` (transformers 5.x) as a port, driven as a model
layer drives it: the ``BlockMask`` of ``masking_utils.flex_attention_mask`` (the layer's
``mask_function`` and 2-D padding mask, built by ``create_block_mask(..., _compile=True)``),
the layer's ``scaling``, ``sliding_window``, a bias as its ``position_bias``, and the
``softcap`` and ``s_aux`` keywords Gemma 2 and gpt-oss layers pass
(:func:`conformance.ports.hf_common.call`).

It is the function behind ``ALL_ATTENTION_FUNCTIONS["flex_attention"]``: Hugging Face wraps
``flex_attention`` in ``torch.compile`` (its ``WrappedFlexAttention``, default options), so on
CPU every call runs inductor's fused kernel (tens of seconds cold, a few seconds from
inductor's on-disk cache). That wrapper compiles with torch's default ``dynamic=None``: in one
process the second shape makes dynamo recompile the frame with dynamic sizes, which inductor's
CPU flex kernel then often fails to build (CppCompileError), and past ``torch._dynamo.config.
recompile_limit`` graphs torch would silently run the rest uncompiled, so a run's outcome would
depend on the runs before it. The port starts torch's compile cache afresh before every call
(``torch._dynamo.reset()``): each run is compiled as a process that sees only its own shapes
compiles it, with static sizes. A call torch still ran uncompiled (flex_attention's "called
without torch.compile()" warning, re-armed before each call) raises ``fell back to eager``
instead of passing. On CPU it refuses sinks
(``s_aux``: no log-sum-exp there). It returns no weights, so :func:`attention_weights` runs
the same call with the identity as value. Install with the ``hf`` extra; the runner's child
processes isolate it.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch._dynamo
import torch.nn.attention.flex_attention as flex_module
from transformers.integrations.flex_attention import flex_attention_forward

from conformance.ports.descales import takes_descales, torch_output
from conformance.ports.hf_common import call
from conformance.ports.precision import torch_ieee_float32
from conformance.ports.torch_adapter import from_numpy, to_numpy

__all__ = ["attention_weights", "from_numpy", "scaled_dot_product_attention", "to_numpy"]

#: What the model families that run on flex pass: Gemma 2's softcap, gpt-oss's sinks.
_KEYWORDS = ("softcap", "s_aux")
_EAGER_WARNING = "flex_attention called without torch.compile()"  # what only eager says


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "Hugging Face's flex_attention_forward"


@takes_descales(_KERNEL, torch_output)
def scaled_dot_product_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **keywords: Any
) -> torch.Tensor:
    """(..., H, L, D), (..., K, S, D), (..., K, S, E) -> (..., H, L, E)."""
    torch._dynamo.reset()  # each call compiled as a fresh process compiles it (see above)
    flex_module._WARNINGS_SHOWN.discard("flex_attention_performance")  # warn every time
    with torch_ieee_float32(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = call(flex_attention_forward, "flex", query, key, value, keywords=_KEYWORDS,
                   **keywords)[0]
    if any(_EAGER_WARNING in str(w.message) for w in caught):
        raise RuntimeError(
            "fell back to eager: torch ran Hugging Face's compiled flex_attention uncompiled "
            f"(recompile_limit {torch._dynamo.config.recompile_limit})"
        )
    return out


@takes_descales(_KERNEL, torch_output)
def attention_weights(query: torch.Tensor, key: torch.Tensor, **keywords: Any) -> torch.Tensor:
    """The weights (..., H, L, S): the same call with value = identity (S x S)."""
    K, S = key.shape[-3], key.shape[-2]
    identity = torch.eye(S, dtype=query.dtype, device=query.device)
    identity = identity.expand(*key.shape[:-3], K, S, S)
    return scaled_dot_product_attention(query, key, identity, **keywords)
