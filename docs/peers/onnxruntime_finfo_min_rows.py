"""onnxruntime: a float attn_mask of finfo.min across a row gives zeros at opsets 23/24, uniform
weights at opset 25.

The ONNX ``Attention`` operator adds a float ``attn_mask`` to the scores and takes the softmax
(opsets 23, 24 and 25 alike). A query row whose mask is ``finfo(float32).min`` at every key has
equal scores (each rounds to -3.4e38), so its softmax is uniform, 1/S per key: that is what
ONNX's reference evaluator returns at every opset, and what onnxruntime returns at opset 25.
onnxruntime's CPU kernel at opsets 23 and 24 returns zeros for that row instead (the same model,
only the opset differs). Hugging Face builds exactly such masks (``torch.finfo(dtype).min``) for
padded rows.

Run: python docs/peers/onnxruntime_finfo_min_rows.py (needs numpy, onnx, onnxruntime; measured
with onnxruntime 1.32.0, onnx 1.23.2). It prints the row's weights per opset and exits 1 while
the opsets disagree.
"""

import sys

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

S = 4
rng = np.random.default_rng(0)
q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)  # (B, H, L, D): two query rows
k = rng.standard_normal((1, 1, S, 8)).astype(np.float32)
v = np.eye(S, dtype=np.float32)[None, None]  # value = identity: the output is the weights
mask = np.zeros((1, 1, 2, S), np.float32)
mask[..., 0, :] = np.finfo(np.float32).min  # row 0: finfo.min at every key


def model(opset: int) -> onnx.ModelProto:
    node = helper.make_node("Attention", ["Q", "K", "V", "attn_mask"], ["Y"])
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, x.shape)
        for name, x in (("Q", q), ("K", k), ("V", v), ("attn_mask", mask))
    ]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    graph = helper.make_graph([node], "attention", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


feeds = {"Q": q, "K": k, "V": v, "attn_mask": mask}
rows = {}
for opset in (23, 24, 25):
    m = model(opset)
    session = onnxruntime.InferenceSession(
        m.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    rows[f"onnxruntime, opset {opset}"] = session.run(None, feeds)[0][0, 0, 0]
    rows[f"reference,   opset {opset}"] = ReferenceEvaluator(m).run(None, feeds)[0][0, 0, 0]
for name, row in rows.items():
    print(f"{name}: row 0 = {np.array2string(row, precision=4)}")
uniform = np.full(S, 1 / S, np.float32)
wrong = [name for name, row in rows.items() if not np.allclose(row, uniform)]
print("not uniform:", ", ".join(wrong) or "none")
sys.exit(1 if wrong else 0)
