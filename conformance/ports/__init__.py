"""Ports: how conformance finds a module's functions and moves arrays in and out of it.

A port is any importable module (or object) exposing the public names of SEMANTICS.md. A port
that takes and returns NumPy arrays needs nothing else. Any other array type plugs in through
two functions the port defines next to its attention functions::

    def from_numpy(array: numpy.ndarray, device: str) -> Tensor: ...
    def to_numpy(tensor: Tensor) -> numpy.ndarray: ...

The project's own PyTorch and JAX implementations stay free of conformance code: their two
functions live here, in :mod:`conformance.ports.torch_adapter` and
:mod:`conformance.ports.jax_adapter`, and :data:`BUILTIN_ADAPTERS` attaches them by module name.
The frameworks' own fused kernels are ports too (:mod:`conformance.ports.torch_fused`,
:mod:`conformance.ports.jax_fused`, and, with the ``frameworks`` extra,
:mod:`conformance.ports.mlx_fast`, :mod:`conformance.ports.keras_ops` and
:mod:`conformance.ports.keras_ops_torch`), flax's attention function
(:mod:`conformance.ports.flax_nnx`) and, with the ``onnx`` extra, the ONNX ``Attention``
operator on its reference evaluator (:mod:`conformance.ports.onnx_ref`), with their known
deviations from the contract in
``<name>.xfails`` next to them: any port's ``<module>.xfails`` file, beside its source, is its
list of known failures.
"""

from __future__ import annotations

__all__ = ["BUILTIN_ADAPTERS", "SHORT_NAMES"]

#: Adapter modules (defining ``from_numpy`` and ``to_numpy``) for ports that do not define
#: their own, by the port's module name.
BUILTIN_ADAPTERS: dict[str, str] = {
    "impl_torch": "conformance.ports.torch_adapter",
    "impl_jax": "conformance.ports.jax_adapter",
}

#: Names that ``--impl`` accepts for the built-in ports besides their module path.
SHORT_NAMES: dict[str, str] = {
    "torch_fused": "conformance.ports.torch_fused",
    "jax_fused": "conformance.ports.jax_fused",
    "mlx_fast": "conformance.ports.mlx_fast",
    "keras_ops": "conformance.ports.keras_ops",
    "keras_ops_torch": "conformance.ports.keras_ops_torch",
    "flax_nnx": "conformance.ports.flax_nnx",
    "onnx_ref": "conformance.ports.onnx_ref",
    # torch FlexAttention and Hugging Face's attention functions (issue 31)
    "torch_flex": "conformance.ports.torch_flex",
    "torch_flex_compiled": "conformance.ports.torch_flex_compiled",
    "hf_eager": "conformance.ports.hf_eager",
    "hf_sdpa": "conformance.ports.hf_sdpa",
    "hf_gpt_oss_eager": "conformance.ports.hf_gpt_oss_eager",
    "hf_flex": "conformance.ports.hf_flex",
    # onnxruntime's CPU provider (the onnxruntime extra)
    "onnxruntime_attention": "conformance.ports.onnxruntime_attention",
    "onnxruntime_attention_23": "conformance.ports.onnxruntime_attention_23",
    "onnxruntime_attention_24": "conformance.ports.onnxruntime_attention_24",
    "onnxruntime_gqa": "conformance.ports.onnxruntime_gqa",
    "tinygrad_sdpa": "conformance.ports.tinygrad_sdpa",  # the tinygrad extra
}
