import os

# Tests run on the CPU unless asked otherwise (JAX_PLATFORMS exported before pytest starts): on a
# GPU box each pytest-xdist worker would otherwise start JAX on the GPU and take its memory, and
# float32 comparisons against JAX's kernels would see TF32. Set before JAX starts.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest
import torch

from tests.frameworks import FRAMEWORKS  # also enables JAX x64: float64 is one of the dtypes

# One torch thread per pytest-xdist worker: with two workers on two cores, more threads only
# fight each other (a small call then takes a second instead of milliseconds).
torch.set_num_threads(1)


@pytest.fixture(params=list(FRAMEWORKS), ids=list(FRAMEWORKS))
def fw(request):
    """Each of the three implementations in turn, behind a NumPy-in, NumPy-out adapter."""
    return FRAMEWORKS[request.param]
