"""The ONNX ``Attention`` operator as a port, run by onnxruntime's CPU provider (opset 25).

The same one-node model as :mod:`conformance.ports.onnx_ref` (its graph building and keyword
translation, reused as they are), executed by an ``onnxruntime.InferenceSession`` on
``CPUExecutionProvider`` instead of ONNX's reference evaluator, so where the two ports' xfails
differ, onnxruntime's kernel differs from the operator's reference reading. This module is the
opset-25 port (``left_window_size``/``right_window_size``);
:mod:`conformance.ports.onnxruntime_attention_23` and ``..._24`` run the same node at opsets 23
and 24, which have no window attributes (``window``: NotImplementedError there). Install with
the ``onnxruntime`` extra (``pip install -e '.[onnxruntime]'``: onnx and onnxruntime).

:func:`attention_weights` reads the operator's ``qk_matmul_output`` with
``qk_matmul_output_mode=3`` (the weights after the softmax), as onnx_ref does. No causal-mask
function, no module. :func:`varlen_attention` and :func:`paged_attention` are onnx_ref's
(:func:`onnx_ref.packed_functions`: one node per sequence) on the session. fp8 (contract v3)
goes into the model as onnx_ref's does, the descales folded the same way
(:mod:`conformance.ports.descales`); what onnxruntime does with it is measured in the xfails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime

from conformance.ports import onnx_ref
from conformance.ports.descales import numpy_output, takes_descales

__all__ = [
    "OPSET",
    "attention_weights",
    "functions",
    "paged_attention",
    "scaled_dot_product_attention",
    "varlen_attention",
]

#: The opset of this module's one-node models.
OPSET = 25

#: The opsets that have ``left_window_size``/``right_window_size``.
_WINDOW_OPSET = 25


onnxruntime.set_default_logger_severity(4)  # its kernels log their own errors: they are measured


def _session(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[Any]:
    """The model's outputs on onnxruntime's CPU provider (its log silenced: level 4, fatal only)."""
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def _checked(opset: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The keywords of :func:`onnx_ref._run` at ``opset`` on onnxruntime (a window refused
    below opset 25)."""

    def check(keywords: dict[str, Any]) -> dict[str, Any]:
        if keywords.get("window") is not None and opset < _WINDOW_OPSET:
            raise NotImplementedError(f"ONNX Attention has no window attributes at opset {opset}")
        return keywords | {"opset": opset, "evaluate": _session}

    return check


def packed_functions(opset: int) -> tuple[Callable[..., np.ndarray], Callable[..., np.ndarray]]:
    """``(varlen_attention, paged_attention)`` of the node at ``opset``: onnx_ref's, one node
    per sequence (paged: the sequence's first ``S_n - L_n`` keys as the node's KV cache), on
    onnxruntime."""
    return onnx_ref.packed_functions(
        f"ONNX Attention (opset {opset}) on onnxruntime", _checked(opset)
    )


def functions(opset: int) -> tuple[Callable[..., np.ndarray], Callable[..., np.ndarray]]:
    """``(scaled_dot_product_attention, attention_weights)`` of the node at ``opset``."""

    check = _checked(opset)

    @takes_descales(f"ONNX Attention (opset {opset}) on onnxruntime", numpy_output)
    def scaled_dot_product_attention(
        query: np.ndarray, key: np.ndarray, value: np.ndarray, **keywords: Any
    ) -> np.ndarray:
        """ONNX ``Attention`` on onnxruntime, the contract's layout: query (..., H, L, D), key
        (..., K, S, D), value (..., K, S, E) -> (..., H, L, E)."""
        call = onnx_ref._defaults(keywords)
        return onnx_ref._run(query, key, value, weights=False, **check(call))

    @takes_descales(f"ONNX Attention (opset {opset}) on onnxruntime", numpy_output)
    def attention_weights(query: np.ndarray, key: np.ndarray, **keywords: Any) -> np.ndarray:
        """onnxruntime's own weights (..., H, L, S): ``qk_matmul_output`` in mode 3, of a call
        whose value is zeros (K, S, 1)."""
        key = np.asarray(key)
        value = np.zeros((*key.shape[:-1], 1), key.dtype)  # (..., K, S, 1)
        call = onnx_ref._defaults(keywords)
        return onnx_ref._run(query, key, value, weights=True, **check(call))

    return scaled_dot_product_attention, attention_weights


scaled_dot_product_attention, attention_weights = functions(OPSET)
varlen_attention, paged_attention = packed_functions(OPSET)
