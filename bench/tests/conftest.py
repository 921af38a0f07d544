"""The benchmark harness's tests run on the CPU unless asked otherwise (``JAX_PLATFORMS``
exported before pytest starts): on a GPU box each pytest-xdist worker would otherwise start
JAX on the GPU and take its memory, and float32 comparisons would see TF32."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
