"""onnxruntime's ``com.microsoft.GroupQueryAttention`` as a port, on its CPU provider.

The contrib operator that onnxruntime's exported decoders (Phi, Llama, Mistral, gpt-oss, Qwen)
call, and the closest ONNX has to a KV-cache decode: new keys go in as ``key``/``value`` and
the earlier ones as ``past_key``/``past_value``, with ``seqlens_k`` (the total length - 1 per
batch row) and ``total_sequence_length``. Its deviations from the contract are measured in
``onnxruntime_gqa.xfails``. Install with the ``onnxruntime`` extra.

The wrapper translates the contract's keywords into the operator's attributes and inputs,
never fixing semantics:

- query (..., H, L, D) becomes (B, L, H * P), key and value (..., K, S, X) (B, S, K * P): the
  leading batch dims broadcast and flattened into one, and D and E padded with zero columns to
  P, the next multiple of 8 (the CPU kernel wants ``head_size % 8 == 0`` and one head size for
  key and value); the default scale is passed as 1/sqrt(D) of the unpadded D, and the padded
  output columns are dropped;
- with S > L the first S - L keys are the past cache (BNSH) and the last L the new ones: the
  operator places query row i at absolute position S - L + i, so its causal mask and window are
  bottom-right. With S = L there is no cache; with S < L the call goes in as it is (the operator
  refuses it). ``causal_alignment`` is not passed: there is no such attribute;
- ``is_causal`` is ``causal``; ``window`` (left, right) is ``local_window_size`` = left (-1:
  unbounded), documented as "left_window_size for causal local attention", with ``causal=1``:
  the operator's window is causal only, so a window whose right bound is neither 0 nor cut by
  ``is_causal`` raises NotImplementedError;
- ``mask``, ``bias``, packed segment ids and ALiBi become one float ``attention_bias`` (B, H, L,
  S) (onnx_ref's :func:`~conformance.ports.onnx_ref.attention_mask`, a False mask as -inf);
- ``scale`` and ``softcap`` are its attributes; ``sinks`` is ``head_sink`` (H,);
- :func:`attention_weights` reads ``output_qk`` with ``qk_output=2`` (after the softmax).

:func:`apply_rotary` is ``do_rotary=1``: the operator rotates the new keys (and queries) with
the ``cos_cache``/``sin_cache`` rows of each token's position before it stores them, so the
rotated x is ``present_key``'s new rows. The wrapper builds the caches as exporters do (row p:
``cos(p * inv_freq)``, ``sin(p * inv_freq)``, in float32, times ``attention_factor``, cast to
the operator's type T) and passes the positions as ``position_ids`` behind a past cache of one
zero key (without a past the kernel reads only ``position_ids[0]`` and counts up from it). The
CPU kernel wants ``cos_cache`` C = a multiple of 8 columns (C <= head_size / 2) and a head size
that is a multiple of 16, so the wrapper lays x out on the operator's pairs: the contract's
pair p (features p and p + R/2, or 2p and 2p + 1 interleaved) on the operator's pair p (p and
p + C, or 2p and 2p + 1), pairs R/2..C-1 with cos 1 and sin 0 (unrotated zeros), the R..D-1
features that pass through after 2C, zero-padded to the head size.

fp8 (contract v3): the fp8 arrays go into the model as they are, ``q_descale * k_descale``
folded into ``scale`` where each is one number and the output times ``v_descale``
(:mod:`conformance.ports.descales`); what onnxruntime does with them is measured in the xfails.

Not mapped: the quantized caches, ``smooth_softmax`` (``head_sink`` with zeros).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import onnxruntime
from onnx import helper

from conformance.ports import onnx_ref
from conformance.ports.descales import numpy_output, takes_descales

__all__ = ["apply_rotary", "attention_weights", "scaled_dot_product_attention"]

#: The CPU kernel's head size must be a multiple of this.
_HEAD_MULTIPLE = 8

#: GroupQueryAttention's inputs, in order (empty names skip the optional ones).
_INPUTS = (
    "query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
    "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink",
)

#: The inputs with a batch axis (the first).
_BATCHED = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "attention_bias")

onnxruntime.set_default_logger_severity(4)  # its kernels log their own errors: they are measured


def _heads_last(x: np.ndarray, batch: tuple[int, ...], width: int) -> np.ndarray:
    """(..., N, T, X) -> (B, N, T, width): broadcast to ``batch``, flattened, zero-padded."""
    N, T, X = x.shape[-3:]
    x = np.broadcast_to(x, (*batch, N, T, X)).reshape(math.prod(batch), N, T, X)
    return np.pad(x, ((0, 0), (0, 0), (0, 0), (0, width - X)))


def _bsh(x: np.ndarray) -> np.ndarray:
    """(B, N, T, P) -> (B, T, N * P), the operator's layout of query, key and value."""
    B, N, T, P = x.shape
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(B, T, N * P))


def _session(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[Any]:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


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
) -> np.ndarray:
    """One GroupQueryAttention node: the output (..., H, L, E), or with ``weights`` its
    ``output_qk`` after the softmax (..., H, L, S)."""
    query, key, value = np.asarray(query), np.asarray(key), np.asarray(value)
    H, L, D = query.shape[-3:]
    K, S, _ = key.shape[-3:]
    E = value.shape[-1]
    batch = np.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    width = max(_HEAD_MULTIPLE, -(-max(D, E) // _HEAD_MULTIPLE) * _HEAD_MULTIPLE)
    causal = bool(is_causal)
    local = -1
    if window is not None:
        left, right = window
        if not (causal or right == 0):
            raise NotImplementedError("GroupQueryAttention's window is causal: no right bound")
        causal, local = True, -1 if left is None else int(left)
    attention_bias = onnx_ref.attention_mask(
        query, key, value, mask=mask, bias=bias, causal_alignment=causal_alignment,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, alibi_slopes=alibi_slopes,
    )
    if attention_bias is not None and attention_bias.dtype == bool:
        attention_bias = np.where(attention_bias, 0.0, -np.inf).astype(query.dtype)

    q = _heads_last(query, batch, width)  # (B, H, L, P)
    k, v = _heads_last(key, batch, width), _heads_last(value, batch, width)  # (B, K, S, P)
    past = S - L if S > L else 0
    B = math.prod(batch)
    feeds = {"query": _bsh(q), "key": _bsh(k[:, :, past:]), "value": _bsh(v[:, :, past:])}
    if past:
        feeds["past_key"] = np.ascontiguousarray(k[:, :, :past])
        feeds["past_value"] = np.ascontiguousarray(v[:, :, :past])
    feeds["seqlens_k"] = np.full((B,), S - 1, np.int32)
    feeds["total_sequence_length"] = np.array(S, np.int32)
    if attention_bias is not None:
        feeds["attention_bias"] = np.ascontiguousarray(attention_bias)
    if sinks is not None:
        feeds["head_sink"] = np.asarray(sinks)

    attributes: dict[str, Any] = {
        "num_heads": int(H),
        "kv_num_heads": int(K),
        "causal": int(causal),
        "local_window_size": local,
        "scale": float(1 / math.sqrt(D) if scale is None else scale),
    }
    if softcap is not None:
        attributes["softcap"] = float(softcap)
    if weights:
        attributes["qk_output"] = 2  # the weights after the softmax
    used = max(i for i, name in enumerate(_INPUTS) if name in feeds)
    inputs = [name if name in feeds else "" for name in _INPUTS[: used + 1]]
    outputs = ["output", "present_key", "present_value"] + (["output_qk"] if weights else [])
    node = helper.make_node(
        "GroupQueryAttention", inputs, outputs, domain="com.microsoft", **attributes
    )
    # The CPU kernel refuses a batch of more than one multi-token chunk with a past cache
    # ("batch_size must be 1 when sequence_length > 1 and past context"): one row per run then.
    rows = [feeds]
    if past and L > 1 and B > 1:
        rows = [
            {n: x[b : b + 1] if n in _BATCHED else x for n, x in feeds.items()} for b in range(B)
        ]
    feeds = rows[0]  # the shapes the graph declares
    elem = onnx_ref._elem(query)
    graph = helper.make_graph(
        [node],
        "group_query_attention",
        [helper.make_tensor_value_info(n, onnx_ref._elem(x), x.shape) for n, x in feeds.items()],
        [helper.make_tensor_value_info(o, elem, None) for o in outputs],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    results = [_session(model, one) for one in rows]
    if weights:
        out = np.concatenate([np.asarray(r[3]) for r in results])  # (B, H, L, S)
        return out.reshape(*batch, *out.shape[1:])
    out = np.concatenate([np.asarray(r[0]) for r in results])  # (B, L, H * P)
    out = out.reshape(B, L, H, width).transpose(0, 2, 1, 3)[..., :E]
    return out.reshape(*batch, H, L, E)


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "onnxruntime's GroupQueryAttention"


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
    """GroupQueryAttention on the contract's layout: query (..., H, L, D), key (..., K, S, D),
    value (..., K, S, E) -> (..., H, L, E)."""
    return _run(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes, weights=False,
    )


@takes_descales(_KERNEL, numpy_output)
def attention_weights(query: np.ndarray, key: np.ndarray, **keywords: Any) -> np.ndarray:
    """The operator's own weights (..., H, L, S): ``output_qk`` with ``qk_output=2``, of a call
    whose value is zeros (K, S, 1)."""
    key = np.asarray(key)
    value = np.zeros((*key.shape[:-1], 1), key.dtype)  # (..., K, S, 1)
    return _run(query, key, value, weights=True, **onnx_ref._defaults(keywords))


#: With ``do_rotary`` the CPU kernel's head size must be a multiple of this.
_ROTARY_HEAD_MULTIPLE = 16


def _rotary_layout(D: int, R: int, C: int, interleaved: bool) -> np.ndarray:
    """Per contract feature (D,), its column in the operator's head (R rotated, C cache
    columns): pair p on the operator's pair p, the unrotated features after 2C."""
    half = np.arange(R // 2)
    if interleaved:
        rotated = np.arange(R)  # pairs (2p, 2p + 1) on both sides
    else:
        rotated = np.concatenate([half, C + half])  # (p, p + R/2) -> (p, p + C)
    return np.concatenate([rotated, 2 * C + np.arange(D - R)])


def apply_rotary(
    x: np.ndarray,
    positions: np.ndarray,
    *,
    theta: float = 10000.0,
    rotary_dim: int | None = None,
    interleaved: bool = False,
    inv_freq: np.ndarray | None = None,
    attention_factor: float = 1.0,
) -> np.ndarray:
    """x (..., K, L, D) rotated at integer ``positions`` (broadcastable to (..., L)) by
    GroupQueryAttention's ``do_rotary``: its ``present_key`` rows of x as the new keys."""
    x, positions = np.asarray(x), np.asarray(positions)
    K, L, D = x.shape[-3:]
    R = D if rotary_dim is None else int(rotary_dim)
    batch = x.shape[:-3]
    B = math.prod(batch)
    C = max(_HEAD_MULTIPLE, -(-(R // 2) // _HEAD_MULTIPLE) * _HEAD_MULTIPLE)
    width = -(-max(2 * C, 2 * C + D - R) // _ROTARY_HEAD_MULTIPLE) * _ROTARY_HEAD_MULTIPLE
    columns = _rotary_layout(D, R, C, interleaved)

    if inv_freq is None:
        inv_freq = np.float32(theta) ** (-np.arange(0, R, 2, dtype=np.float32) / np.float32(R))
    rows = max(int(positions.max(initial=0)) + 1, L + 1)  # positions 0..max, >= the total length
    angles = np.arange(rows, dtype=np.float32)[:, None] * np.asarray(inv_freq, np.float32)
    cos = np.ones((rows, C), np.float32)
    sin = np.zeros((rows, C), np.float32)
    cos[:, : R // 2] = np.cos(angles) * np.float32(attention_factor)
    sin[:, : R // 2] = np.sin(angles) * np.float32(attention_factor)

    keys = np.zeros((B, K, L, width), x.dtype)
    keys[..., columns] = x.reshape(B, K, L, D)
    ids = np.broadcast_to(positions, (*batch, L)).reshape(B, L).astype(np.int64)
    past = np.zeros((1, K, 1, width), x.dtype)  # one zero key: position_ids read per token
    names = _INPUTS[:10]  # up to position_ids
    node = helper.make_node(
        "GroupQueryAttention", list(names), ["output", "present_key", "present_value"],
        domain="com.microsoft", num_heads=int(K), kv_num_heads=int(K), do_rotary=1,
        rotary_interleaved=int(bool(interleaved)),
    )
    rotated = []
    for b in range(B):  # a multi-token chunk after a past cache: one batch row per call
        new = _bsh(keys[b : b + 1])
        feeds = {
            "query": new, "key": new, "value": new, "past_key": past, "past_value": past,
            "seqlens_k": np.array([L], np.int32),
            "total_sequence_length": np.array(L + 1, np.int32),
            "cos_cache": cos.astype(x.dtype), "sin_cache": sin.astype(x.dtype),
            "position_ids": ids[b : b + 1],
        }
        elem = onnx_ref._elem(x)
        graph = helper.make_graph(
            [node],
            "group_query_attention_rotary",
            [
                helper.make_tensor_value_info(n, onnx_ref._elem(v), v.shape)
                for n, v in feeds.items()
            ],
            [helper.make_tensor_value_info(o, elem, None) for o in node.output],
        )
        opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
        present_key = _session(helper.make_model(graph, opset_imports=opsets), feeds)[1]
        rotated.append(np.asarray(present_key)[:, :, 1:, columns])  # (1, K, L, D)
    return np.concatenate(rotated).reshape(*batch, K, L, D)
