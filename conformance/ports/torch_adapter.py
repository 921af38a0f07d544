"""NumPy <-> torch for conformance: the two adapter functions of any torch port.

``impl_torch`` gets these through :data:`conformance.ports.BUILTIN_ADAPTERS`; a torch port of
your own can import them (``from conformance.ports.torch_adapter import from_numpy, to_numpy``).
NumPy has no native bfloat16 (it comes from ``ml_dtypes``) and ``torch.from_numpy`` does not
take it, so bfloat16 goes through float32, which is exact in both directions.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

__all__ = ["from_numpy", "to_numpy"]


def from_numpy(array: np.ndarray, device: str = "cpu") -> torch.Tensor:
    """A torch tensor on ``device`` ("cpu", "cuda", "cuda:1", ...) equal to ``array``."""
    array = np.asarray(array)
    if array.dtype == ml_dtypes.bfloat16:
        tensor = torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    else:
        tensor = torch.from_numpy(np.array(array))  # a writable, contiguous copy
    return tensor.to(device)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """The tensor as a NumPy array of the same dtype (bfloat16 as ``ml_dtypes.bfloat16``)."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.float().numpy().astype(ml_dtypes.bfloat16)
    return tensor.numpy()
