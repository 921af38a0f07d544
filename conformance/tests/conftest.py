import os

# On the CPU unless asked otherwise, as in tests/conftest.py (JAX_PLATFORMS set before JAX starts).
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import torch

# One torch thread per pytest-xdist worker, as in tests/conftest.py; the JAX adapter
# (conformance/ports/jax_adapter.py) enables x64 itself.
torch.set_num_threads(1)

# Without CUDA the Triton kernel port (conformance/ports/triton_flash.py) runs in Triton's
# interpreter, which must be on before anything imports triton; torch.compile does (in tests/),
# and a worker may run that first. Conftests load at collection, before any test.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
