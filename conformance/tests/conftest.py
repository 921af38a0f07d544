import torch

# One torch thread per pytest-xdist worker, as in tests/conftest.py; the JAX adapter
# (conformance/ports/jax_adapter.py) enables x64 itself.
torch.set_num_threads(1)
