"""The ONNX ``Attention`` operator as a port, run by ONNX's reference evaluator.

``onnx.reference.ReferenceEvaluator`` executes a one-node model, ``Attention`` at opset 25 (the
opset-23 op plus ``left_window_size``/``right_window_size``), so this port measures the
operator's specification as ONNX's own NumPy code reads it; a runtime (onnxruntime, TensorRT)
is checked by swapping the evaluator. Its failures are a measured list of where the operator
differs from the contract (``onnx_ref.xfails``, and the v2 table in docs/CONFORMANCE.md).
Install with the ``onnx`` extra (``pip install -e '.[onnx]'``: onnx alone, no runtime).

The wrapper translates the contract's keywords into the operator's attributes and inputs,
never fixing semantics:

- 4-D ``(B, N, T, X)`` heads-first inputs, the leading batch dims flattened into one (a call
  with no batch dim gets one of size 1); query, key and value keep their own batch (ONNX does
  not broadcast them); the operator does GQA itself and allows E != D;
- ``mask`` (True: attend) is the boolean ``attn_mask``; with a ``bias`` the two become one
  float ``attn_mask`` (the bias, -inf where the mask is False); both broadcast to
  ``(B, H, L, S)``;
- ``is_causal``, ``scale`` and ``softcap`` are the operator's attributes; ``window`` is
  ``left_window_size``/``right_window_size`` (-1: unbounded). Without a KV cache the operator
  puts both on the top-left diagonal, whatever ``causal_alignment`` says (it is not passed:
  there is no such attribute);
- packed ``q_segment_ids``/``kv_segment_ids`` and ``alibi_slopes`` are what an ONNX user
  hands it: a boolean mask and an additive bias ``-slope[h] * |i + offset - j|`` on the
  alignment's diagonal, built here from the contract's formulas and folded into ``attn_mask``;
- ``sinks``: NotImplementedError (no such input);
- fp8 (contract v3): the fp8 arrays go into the model as they are (ONNX's FLOAT8E4M3FN and
  FLOAT8E5M2 element types), ``q_descale * k_descale`` folded into ``scale`` where each is one
  number and the output times ``v_descale`` (:mod:`conformance.ports.descales`). The
  operator's type constraints have no fp8, but the reference evaluator does not check them: it
  computes in NumPy on the fp8 arrays (measured in the xfails).

Contract v3's packed rows (the operator has no varlen or paged form): :func:`varlen_attention`
runs one node per sequence on its slice of the packed rows (is_causal and the window on the
top-left diagonal, as above); :func:`paged_attention` one node per sequence on its keys gathered
from the pool through ``block_table``, all but the last L_n fed as the operator's
``past_key``/``past_value``, so its is_causal and window sit on the contract's bottom-right
diagonal.

:func:`attention_weights` reads the operator's own ``qk_matmul_output`` with
``qk_matmul_output_mode=3`` (the weights after the softmax). There is no causal-mask function
and no module, so this port has neither.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from conformance.ports.descales import numpy_output, takes_descales
from conformance.ports.packed import packed_rows, page_slots

__all__ = [
    "OPSET",
    "attention_mask",
    "attention_weights",
    "packed_functions",
    "paged_attention",
    "scaled_dot_product_attention",
    "varlen_attention",
]

#: The opset of the one-node models: Attention with left_window_size / right_window_size.
OPSET = 25

#: fp8 runs are held to the kernels' bound (``kernel_tolerance``, FORMAT.md "Bounds"): the
#: evaluator computes on the fp8 arrays, as a kernel would.
KERNEL_TOLERANCE = True

_ELEM = {
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
    np.dtype(bool): TensorProto.BOOL,
}


def _elem(x: np.ndarray) -> int:
    """The ONNX element type of ``x`` (KeyError names a dtype ONNX's Attention has no T for)."""
    return _ELEM[x.dtype] if x.dtype in _ELEM else helper.np_dtype_to_tensor_dtype(x.dtype)


def _four_d(x: np.ndarray) -> np.ndarray:
    """``(..., N, T, X)`` -> ``(B, N, T, X)``, the leading dims flattened (none: B = 1)."""
    return x.reshape(math.prod(x.shape[:-3]), *x.shape[-3:])


def attention_mask(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    mask: np.ndarray | None,
    bias: np.ndarray | None,
    causal_alignment: str,
    q_segment_ids: np.ndarray | None,
    kv_segment_ids: np.ndarray | None,
    alibi_slopes: np.ndarray | None,
) -> np.ndarray | None:
    """The one ``attn_mask`` (B, H, L, S) an ONNX user hands the operator, or None: the boolean
    mask (and the segment ids' mask), or, with a bias (and ALiBi's, on the alignment's
    diagonal), the bias with -inf where the mask is False. (onnxruntime_gqa uses it too.)"""
    H, L, _ = query.shape[-3:]
    S = key.shape[-2]
    batch = np.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    offset = S - L if causal_alignment == "bottom_right" else 0
    i, j = np.arange(L)[:, None], np.arange(S)[None, :]  # (L, 1), (1, S)
    if q_segment_ids is not None:
        same = (
            np.asarray(q_segment_ids)[..., None, :, None]
            == np.asarray(kv_segment_ids)[..., None, None, :]
        )  # (..., 1, L, S)
        mask = same if mask is None else np.asarray(mask) & same
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes)
        alibi = -slopes[:, None, None] * np.abs(i + offset - j).astype(slopes.dtype)  # (H, L, S)
        bias = alibi if bias is None else np.asarray(bias) + alibi

    def scores(x: np.ndarray) -> np.ndarray:  # (..., H, L, S)-broadcastable -> (B, H, L, S)
        return _four_d(np.broadcast_to(x, (*batch, H, L, S)))

    attn_mask = None
    if bias is not None:
        bias = np.asarray(bias)
        attn_mask = bias if mask is None else np.where(mask, bias, bias.dtype.type(-np.inf))
        attn_mask = scores(attn_mask)
    elif mask is not None:
        attn_mask = scores(np.asarray(mask))
    return attn_mask


def _run(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    mask: np.ndarray | None,
    bias: np.ndarray | None,
    is_causal: bool,
    causal_alignment: str,
    scale: float | None,
    softcap: float | None,
    window: tuple[int | None, int | None] | None,
    q_segment_ids: np.ndarray | None,
    kv_segment_ids: np.ndarray | None,
    sinks: np.ndarray | None,
    alibi_slopes: np.ndarray | None,
    weights: bool,
    opset: int = OPSET,
    evaluate: Callable[[onnx.ModelProto, dict[str, np.ndarray]], list[Any]] | None = None,
    past: int = 0,
) -> np.ndarray:
    """One ``Attention`` node at ``opset`` on ``evaluate(model, feeds)`` (the reference
    evaluator when None; onnxruntime_attention passes its session): the output (..., H, L, E),
    or with ``weights`` its ``qk_matmul_output`` after the softmax (..., H, L, S). ``past`` > 0
    feeds the first ``past`` keys and values as the operator's KV cache (``past_key``,
    ``past_value``), the rest as K and V: its is_causal and window then sit on the diagonal
    ``past`` (bottom-right for ``past = S - L``)."""
    if sinks is not None:
        raise NotImplementedError("ONNX Attention has no sinks input")
    query, key, value = np.asarray(query), np.asarray(key), np.asarray(value)
    batch = np.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    attn_mask = attention_mask(
        query, key, value, mask=mask, bias=bias, causal_alignment=causal_alignment,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, alibi_slopes=alibi_slopes,
    )

    feeds = {"Q": _four_d(query), "K": _four_d(key), "V": _four_d(value)}
    if attn_mask is not None:
        feeds["attn_mask"] = attn_mask
    if past > 0:  # the cache: keys [0, past); K and V: the keys after it
        feeds["past_key"], feeds["K"] = feeds["K"][:, :, :past], feeds["K"][:, :, past:]
        feeds["past_value"], feeds["V"] = feeds["V"][:, :, :past], feeds["V"][:, :, past:]
    attributes: dict[str, Any] = {"is_causal": int(bool(is_causal))}
    if scale is not None:
        attributes["scale"] = float(scale)
    if softcap is not None:
        attributes["softcap"] = float(softcap)
    if window is not None:
        left, right = window
        attributes["left_window_size"] = -1 if left is None else int(left)
        attributes["right_window_size"] = -1 if right is None else int(right)
    outputs = ["Y", "", "", "W"] if weights else ["Y"]
    if past > 0:  # the updated cache comes back too (onnxruntime refuses a past without it)
        outputs[1:3] = ["present_key", "present_value"]
    if weights:
        attributes["qk_matmul_output_mode"] = 3  # the weights after the softmax
    order = ["Q", "K", "V", "attn_mask", "past_key", "past_value"]
    inputs = [name if name in feeds else "" for name in order]
    while inputs[-1] == "":  # the optional inputs given, in the operator's positions
        inputs.pop()
    node = helper.make_node("Attention", inputs, outputs, **attributes)
    graph = helper.make_graph(
        [node],
        "attention",
        [helper.make_tensor_value_info(n, _elem(x), x.shape) for n, x in feeds.items()],
        [helper.make_tensor_value_info(o, _elem(feeds["Q"]), None) for o in outputs if o],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = onnx.IR_VERSION
    with np.errstate(all="ignore"):  # NaN and inf are results here, measured, not warnings
        result = (evaluate or _reference)(model, feeds)
    out = result[-1] if weights else result[0]  # (B, H, L, E) or (B, H, L, S)
    return np.asarray(out).reshape(*batch, *out.shape[1:])


def _reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[Any]:
    """The model's outputs on ONNX's reference evaluator."""
    return ReferenceEvaluator(model).run(None, feeds)


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "ONNX Attention"


@takes_descales(_KERNEL, numpy_output)
def scaled_dot_product_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
) -> np.ndarray:
    """ONNX ``Attention`` on the contract's layout: query (..., H, L, D), key (..., K, S, D),
    value (..., K, S, E) -> (..., H, L, E)."""
    return _run(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes, weights=False,
    )


@takes_descales(_KERNEL, numpy_output)
def attention_weights(query: np.ndarray, key: np.ndarray, **keywords: Any) -> np.ndarray:
    """The operator's own weights (..., H, L, S): ``qk_matmul_output`` in mode 3, of a call
    whose value is zeros (K, S, 1)."""
    key = np.asarray(key)
    value = np.zeros((*key.shape[:-1], 1), key.dtype)  # (..., K, S, 1)
    return _run(query, key, value, weights=True, **_defaults(keywords))


def _defaults(keywords: dict[str, Any]) -> dict[str, Any]:
    names = ("mask", "bias", "scale", "softcap", "window", "q_segment_ids", "kv_segment_ids",
             "sinks", "alibi_slopes")
    out = dict.fromkeys(names) | {"is_causal": False, "causal_alignment": "top_left"}
    return out | keywords


# ---------------------------------------------------------------------------------------------
# Contract v3: varlen and paged, one node per sequence (the operator has neither form)
# ---------------------------------------------------------------------------------------------


def packed_functions(
    kernel: str, node: Callable[[dict[str, Any]], dict[str, Any]]
) -> tuple[Callable[..., np.ndarray], Callable[..., np.ndarray]]:
    """``(varlen_attention, paged_attention)`` running one node per sequence through
    :func:`_run` with the keywords ``node(call)`` (this port: the call as it is;
    onnxruntime_attention adds its opset and session). ``kernel`` names the operator in the
    fp8 descales' error."""

    @takes_descales(kernel, numpy_output, token_major=True)
    def varlen_attention(
        query: np.ndarray,
        key: np.ndarray,
        value: np.ndarray,
        cu_seqlens_q: np.ndarray,
        cu_seqlens_k: np.ndarray,
        *,
        is_causal: bool = False,
        causal_alignment: str = "top_left",
        window: tuple[int | None, int | None] | None = None,
        scale: float | None = None,
        softcap: float | None = None,
        sinks: np.ndarray | None = None,
        alibi_slopes: np.ndarray | None = None,
    ) -> np.ndarray:
        """Packed sequences as one Attention node per sequence: query (Tq, H, D), key
        (Tk, K, D), value (Tk, K, E), ``cu_seqlens_q``/``cu_seqlens_k`` (N + 1,) ->
        (Tq, H, E). Sequence n is the node on its slices (1, H, L_n, D) and (1, K, S_n, D|E):
        is_causal, the window and softcap as the node's attributes, on its top-left diagonal
        (the operator has no alignment without a cache; ``causal_alignment`` only places
        ALiBi's bias). The loop, not one node on the packed rows with a block-diagonal
        ``attn_mask``, keeps the rules the operator's own attributes. No sinks:
        NotImplementedError."""
        if sinks is not None:
            raise NotImplementedError("ONNX Attention has no sinks input")
        query, key, value = np.asarray(query), np.asarray(key), np.asarray(value)
        call = node(_defaults(dict(
            is_causal=is_causal, causal_alignment=causal_alignment, window=window, scale=scale,
            softcap=softcap, alibi_slopes=alibi_slopes,
        )))
        rows = []
        for (q0, q1), (k0, k1) in zip(packed_rows(cu_seqlens_q), packed_rows(cu_seqlens_k)):
            if q1 == q0:  # a sequence without queries needs no node
                continue
            q, k, v = (np.swapaxes(x, 0, 1)[None] for x in (query[q0:q1], key[k0:k1], value[k0:k1]))
            out = _run(q, k, v, weights=False, **call)  # (1, H, L_n, E)
            rows.append(np.swapaxes(out[0], 0, 1))  # (L_n, H, E)
        empty = np.zeros((0, query.shape[1], value.shape[-1]), query.dtype)
        return np.concatenate(rows) if rows else empty

    @takes_descales(kernel, numpy_output, token_major=True)
    def paged_attention(
        query: np.ndarray,
        key_cache: np.ndarray,
        value_cache: np.ndarray,
        block_table: np.ndarray,
        seq_lens: np.ndarray,
        cu_seqlens_q: np.ndarray,
        *,
        is_causal: bool = False,
        window: tuple[int | None, int | None] | None = None,
        scale: float | None = None,
        softcap: float | None = None,
        sinks: np.ndarray | None = None,
        alibi_slopes: np.ndarray | None = None,
    ) -> np.ndarray:
        """A paged cache as one Attention node per sequence: query (T, H, D), key_cache
        (P, page, K, D), value_cache (P, page, K, E), block_table (N, max_pages), seq_lens
        (N,), cu_seqlens_q (N + 1,) -> (T, H, E). The wrapper gathers sequence n's
        ``seq_lens[n]`` keys and values through ``block_table`` (no slot past them is read);
        the first ``S_n - L_n`` go to the node as its KV cache (``past_key``/``past_value``),
        the last L_n as K and V, so the node's is_causal and window sit on the contract's
        bottom-right diagonal. No sinks: NotImplementedError."""
        if sinks is not None:
            raise NotImplementedError("ONNX Attention has no sinks input")
        query, key_cache, value_cache = (np.asarray(x) for x in (query, key_cache, value_cache))
        P, page, K, _ = key_cache.shape
        keys = key_cache.reshape(P * page, K, key_cache.shape[-1])  # (P * page, K, D)
        values = value_cache.reshape(P * page, K, value_cache.shape[-1])  # (P * page, K, E)
        call = node(_defaults(dict(
            is_causal=is_causal, causal_alignment="bottom_right", window=window, scale=scale,
            softcap=softcap, alibi_slopes=alibi_slopes,
        )))
        rows = []
        for (q0, q1), slots in zip(
            packed_rows(cu_seqlens_q), page_slots(block_table, seq_lens, page)
        ):
            if q1 == q0:  # a sequence without queries needs no node
                continue
            q = np.swapaxes(query[q0:q1], 0, 1)[None]  # (1, H, L_n, D)
            k, v = (np.swapaxes(x[slots], 0, 1)[None] for x in (keys, values))  # (1, K, S_n, X)
            past = max(len(slots) - (q1 - q0), 0)  # the cached keys before the L_n new ones
            out = _run(q, k, v, weights=False, past=past, **call)  # (1, H, L_n, E)
            rows.append(np.swapaxes(out[0], 0, 1))  # (L_n, H, E)
        empty = np.zeros((0, query.shape[1], value_cache.shape[-1]), query.dtype)
        return np.concatenate(rows) if rows else empty

    return varlen_attention, paged_attention


varlen_attention, paged_attention = packed_functions(_KERNEL, lambda call: call)
