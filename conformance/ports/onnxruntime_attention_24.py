"""The ONNX ``Attention`` operator at opset 24 on onnxruntime's CPU provider: the port of
:mod:`conformance.ports.onnxruntime_attention` with the node at opset 24 (no window
attributes: ``window`` raises NotImplementedError), varlen and paged included. Its deviations:
``onnxruntime_attention_24.xfails``."""

from __future__ import annotations

from conformance.ports.onnxruntime_attention import functions, packed_functions

__all__ = [
    "OPSET",
    "attention_weights",
    "paged_attention",
    "scaled_dot_product_attention",
    "varlen_attention",
]

#: The opset of this module's one-node models.
OPSET = 24

scaled_dot_product_attention, attention_weights = functions(OPSET)
varlen_attention, paged_attention = packed_functions(OPSET)
