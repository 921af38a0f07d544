"""Repository-root conftest: the top-level packages import from here without installing.

Test-session settings that every test directory shares:
- JAX computes float64 (one of the contract's four dtypes) only with x64 enabled;
- torch uses one thread per pytest worker: with xdist's two workers on two cores, more threads
  only fight each other (a small call then takes a second instead of milliseconds).
"""

import jax
import torch

jax.config.update("jax_enable_x64", True)
torch.set_num_threads(1)
