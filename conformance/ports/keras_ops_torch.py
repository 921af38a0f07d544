"""``keras.ops.dot_product_attention`` on the torch backend as a port.

The same wrapper as :mod:`conformance.ports.keras_ops` (:mod:`conformance.ports.keras_common`)
with ``KERAS_BACKEND=torch``, set here before keras is first imported; keras picks its backend
once per process, so this port and ``keras_ops`` each need a process of their own
(``python -m conformance`` gives every port one). Its deviations are measured in
``keras_ops_torch.xfails``. Arrays are torch tensors (:mod:`conformance.ports.torch_adapter`).
"""

from __future__ import annotations

import os

os.environ["KERAS_BACKEND"] = "torch"  # read by keras once, at its first import

from conformance.ports import keras_common

keras_common.require_backend("torch")

from conformance.ports.keras_common import (  # noqa: E402
    attention_weights,
    scaled_dot_product_attention,
)
from conformance.ports.torch_adapter import from_numpy, to_numpy  # noqa: E402

__all__ = ["attention_weights", "from_numpy", "scaled_dot_product_attention", "to_numpy"]
