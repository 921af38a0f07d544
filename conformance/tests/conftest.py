import os

# On the CPU unless asked otherwise, as in tests/conftest.py (JAX_PLATFORMS set before JAX starts).
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch

# One torch thread per pytest-xdist worker, as in tests/conftest.py; the JAX adapter
# (conformance/ports/jax_adapter.py) enables x64 itself.
torch.set_num_threads(1)
