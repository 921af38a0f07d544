"""The benchmark harness's tests run on the CPU unless asked otherwise (``JAX_PLATFORMS``
exported before pytest starts): on a GPU box each pytest-xdist worker would otherwise start
JAX on the GPU and take its memory, and float32 comparisons would see TF32."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The CUDA-only kernel rows are wired here on the CPU (test_preparers.py), where the Triton port
# runs in Triton's interpreter, which must be on before anything imports triton (torch may);
# as in conformance/tests/conftest.py. Never on a CUDA box, where triton compiles.
try:
    import torch
except ImportError:  # pragma: no cover - torch is part of the test environment
    torch = None
if torch is not None and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
