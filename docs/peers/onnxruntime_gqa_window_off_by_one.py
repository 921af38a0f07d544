"""onnxruntime: GroupQueryAttention's local_window_size=W keeps W keys; Attention's
left_window_size=W (opset 25) keeps W + 1.

``com.microsoft.GroupQueryAttention`` documents ``local_window_size`` as "left_window_size for
causal local attention (like Mistral)". The standard ONNX ``Attention`` operator at opset 25
defines ``left_window_size`` as the number of keys a query may attend to on its left, so with
causal attention and left_window_size=W the query at position i sees keys i - W .. i: W + 1
keys (ONNX's reference evaluator and onnxruntime agree on that). GroupQueryAttention, given the
same W, lets query i see keys i - W + 1 .. i: W keys, one fewer; W = 0 leaves the row no key.

Run: python docs/peers/onnxruntime_gqa_window_off_by_one.py (needs numpy, onnx, onnxruntime;
measured with onnxruntime 1.32.0, onnx 1.23.2). It prints the keys the last query attends to
under each operator and exits 1 while they differ.
"""

import sys

import numpy as np
import onnxruntime
from onnx import TensorProto, helper

L = 6  # one sequence of 6 tokens, one head, head size 8 (GroupQueryAttention's CPU kernel
D = 8  # wants a multiple of 8); the value is the identity, padded to 8 columns: output = weights
rng = np.random.default_rng(0)
q = rng.standard_normal((1, L, D)).astype(np.float32)  # (B, S, hidden), one head
k = rng.standard_normal((1, L, D)).astype(np.float32)
v = np.eye(L, D, dtype=np.float32)[None]


def run(node: helper.NodeProto, feeds: dict, opsets: list) -> np.ndarray:
    inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
        for n, x in feeds.items()
    ]
    outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in node.output]
    model = helper.make_model(helper.make_graph([node], "g", inputs, outputs), opset_imports=opsets)
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)[0]


def gqa_keys(window: int) -> list[int]:
    feeds = {
        "query": q, "key": k, "value": v,
        "seqlens_k": np.array([L - 1], np.int32), "total_sequence_length": np.array(L, np.int32),
    }
    node = helper.make_node(
        "GroupQueryAttention",
        ["query", "key", "value", "", "", "seqlens_k", "total_sequence_length"],
        ["output", "present_key", "present_value"],
        domain="com.microsoft", num_heads=1, kv_num_heads=1, local_window_size=window,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    weights = run(node, feeds, opsets)[0, L - 1, :L]  # the last query's row
    return np.flatnonzero(weights > 1e-6).tolist()


def attention_keys(window: int) -> list[int]:
    feeds = {"Q": q[:, None], "K": k[:, None], "V": v[:, None]}  # (B, H, S, D)
    node = helper.make_node(
        "Attention", ["Q", "K", "V"], ["Y"], is_causal=1, left_window_size=window
    )
    weights = run(node, feeds, [helper.make_opsetid("", 25)])[0, 0, L - 1, :L]
    return np.flatnonzero(weights > 1e-6).tolist()


differ = False
for window in (0, 1, 2, 3):
    gqa, attention = gqa_keys(window), attention_keys(window)
    print(f"W = {window}: GroupQueryAttention keys {gqa}, Attention (opset 25) keys {attention}")
    differ |= gqa != attention
sys.exit(1 if differ else 0)
