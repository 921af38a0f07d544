"""The device's peak: an ``(n, n) @ (n, n)`` matmul per framework and dtype, timed in the run.

The best of them is the device's peak FLOP/s for that dtype, the denominator of the table's
``% peak`` (``report.device_peaks``). float32's matmul runs in IEEE float32 (torch with TF32
off, JAX at HIGHEST), the precision the project's rows pin, unless the run asked for TF32
(``--tf32 on``); the 16-bit dtypes run natively.
"""

from __future__ import annotations

from typing import Any

from bench.devices import float32_precision
from bench.frameworks import FRAMEWORKS, Prepared

__all__ = ["PEAK_N", "matmul_precision", "prepare_matmul"]

#: Matmul size for the device's peak FLOP/s, by device class.
PEAK_N = {"cpu": 2048, "cuda": 8192, "tpu": 8192}


def matmul_precision(dtype: str, tf32: str) -> str:
    """The precision of the peak matmul of ``dtype`` under the run's ``--tf32``: ``highest`` or
    ``tf32`` for float32 (``devices.float32_precision``), ``native`` otherwise."""
    return float32_precision(tf32) if dtype == "float32" else "native"


def prepare_matmul(
    framework: str, dtype: str, n: int, fdevice: str, tf32: str = "default"
) -> tuple[Prepared, dict[str, Any]]:
    """The matmul in ``framework``, ready to time, and its record's ``matmul`` field: ``n``,
    ``dtype``, ``flops`` (``2 n^3``) and ``precision`` (:func:`matmul_precision`)."""
    fw = FRAMEWORKS[framework]
    precision = matmul_precision(dtype, tf32)
    a, b = fw.arrays([(n, n), (n, n)], dtype, fdevice)
    prepared = fw.prepare(fw.matmul(precision), [a, b], fdevice)
    return prepared, {"n": n, "dtype": dtype, "flops": 2 * n**3, "precision": precision}
