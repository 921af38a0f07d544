"""``keras.ops.dot_product_attention`` on the JAX backend as a port.

Run through the same fixtures as the implementations, its failures are a measured list of
where keras's attention op, on JAX, differs from the contract (``keras_ops.xfails``, and the
table in docs/CONFORMANCE.md). The wrapper is :mod:`conformance.ports.keras_common`; this
module only picks the backend, which keras reads from ``KERAS_BACKEND`` when it is first
imported (so before that import, here), and the JAX arrays' adapters. The torch backend is
:mod:`conformance.ports.keras_ops_torch`; each needs a process of its own.

Arrays are JAX arrays (:mod:`conformance.ports.jax_adapter`, which turns on ``jax_enable_x64``:
what keras then does with float64 is what is measured). :func:`prepare` jits like every JAX port,
and falls back to eager execution where XLA:CPU refuses JAX's float16 dot precision under jit,
as :mod:`conformance.ports.jax_fused` does.
"""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "jax"  # read by keras once, at its first import

from conformance.ports import keras_common

keras_common.require_backend("jax")

from conformance.ports.jax_adapter import from_numpy, to_numpy  # noqa: E402
from conformance.ports.jax_fused import prepare  # noqa: E402
from conformance.ports.keras_common import (  # noqa: E402
    attention_weights,
    scaled_dot_product_attention,
)

__all__ = ["attention_weights", "from_numpy", "prepare", "scaled_dot_product_attention", "to_numpy"]
