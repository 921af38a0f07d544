"""Contract v3's packed rows for the framework ports whose kernels have no varlen or paged form.

A user of such a kernel (torch SDPA, ONNX Attention, MLX's fast SDPA) calls it once per
sequence: on sequence n's slice of the packed rows (varlen), or on its keys gathered from the
paged pool through ``block_table`` (paged). These helpers read the integer arguments on the
host, as that loop does, and hand back Python ints; each port slices and gathers its own arrays.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

__all__ = ["host_ints", "packed_rows", "page_slots"]


def host_ints(x: Any) -> np.ndarray:
    """An integer array of any framework (torch, NumPy, MLX: each has ``tolist``) as int64."""
    return np.asarray(x.tolist() if hasattr(x, "tolist") else x, np.int64)


def packed_rows(cu_seqlens: Any) -> list[tuple[int, int]]:
    """``cu_seqlens (N + 1,)`` -> sequence n's rows ``[start, end)`` of the packed axis, N pairs."""
    cu = host_ints(cu_seqlens)
    return [(int(a), int(b)) for a, b in itertools.pairwise(cu)]


def page_slots(block_table: Any, seq_lens: Any, page_size: int) -> list[np.ndarray]:
    """Per sequence n, the slots ``(seq_lens[n],)`` of its keys in the pool flattened to
    ``(P * page_size, ...)``: key j is slot ``block_table[n, j // page_size] * page_size +
    j % page_size``. Only the ``seq_lens[n]`` keys: no slot past them, no table entry past the
    sequence's pages, is read."""
    table, lens = host_ints(block_table), host_ints(seq_lens)
    slots = []
    for n, length in enumerate(lens.tolist()):
        j = np.arange(length)
        slots.append(table[n, j // page_size] * page_size + j % page_size)
    return slots
