"""tinygrad's ``Tensor.scaled_dot_product_attention`` as a port.

Its deviations from the contract are measured in ``tinygrad_sdpa.xfails``. Install with the
``tinygrad`` extra (``pip install -e '.[tinygrad]'``: tinygrad alone, pure Python).

The device: tinygrad 0.14's ``CPU`` device compiles its own queue programs with clang when it
starts, whichever renderer is asked for (``DEV=CPU:X86`` and ``DEV=CPU:LLVM`` too: measured,
``FileNotFoundError: 'clang'`` without Debian's ``clang`` package), so this port runs on
tinygrad's ``PYTHON`` device, which interprets the same kernels and needs no compiler, unless
``TINYGRAD_PORT_DEVICE`` names another (the xfails were measured on ``PYTHON``); each call
runs under ``tinygrad.helpers.Context(DEV=...)``, so the process's own ``DEV`` is left alone.

The wrapper translates the contract's keywords into the kernel's arguments, never fixing
semantics:

- ``scale``: the kernel has none and divides by sqrt(D); the query is pre-multiplied by
  ``scale * sqrt(D)`` (a custom scale), or left alone (the default);
- ``is_causal`` is its ``is_causal`` (a ``tril`` of the score matrix: the top-left diagonal);
  ``causal_alignment`` is not passed (there is no such argument);
- ``mask`` and ``bias`` become one ``attn_mask`` (a boolean mask as it is; with a bias, the bias
  with -inf where the mask is False), as do packed segment ids (a mask) and ALiBi (a bias on the
  alignment's diagonal), built here from the contract's formulas;
- GQA through ``enable_gqa`` (``repeat_interleave``: contiguous groups) when K != H;
- ``window``, ``softcap``, ``sinks``: NotImplementedError (no such arguments);
- fp8 (contract v3): the fp8 arrays go to tinygrad as its ``fp8e4m3``/``fp8e5m2`` tensors (their
  bytes, bitcast), ``q_descale * k_descale`` folded into the scale (so into the query's factor
  above, in the query's dtype) where each is one number and the output times ``v_descale``
  (:mod:`conformance.ports.descales`); tinygrad computes on fp8 (measured in the xfails).

:func:`attention_weights` is the same call with the identity matrix as value. No causal-mask
function and no module.
"""

from __future__ import annotations

import math
import os
from typing import Any

import ml_dtypes
import numpy as np
from tinygrad import Tensor, dtypes
from tinygrad.helpers import Context

from conformance.ports.descales import numpy_output, takes_descales

__all__ = ["DEVICE", "attention_weights", "scaled_dot_product_attention"]

#: The tinygrad device the port runs on (see the module docstring). Each call runs under
#: ``Context(DEV=DEVICE)``, tinygrad's default device (its kernels' constants go there too).
DEVICE = os.environ.get("TINYGRAD_PORT_DEVICE", "PYTHON")

#: fp8 runs are held to the kernels' bound (``kernel_tolerance``, FORMAT.md "Bounds"): tinygrad
#: computes on the fp8 tensors, as a kernel would.
KERNEL_TOLERANCE = True

#: The fp8 formats: NumPy's (``ml_dtypes``) -> tinygrad's.
_FP8 = {
    np.dtype(ml_dtypes.float8_e4m3fn): dtypes.fp8e4m3,
    np.dtype(ml_dtypes.float8_e5m2): dtypes.fp8e5m2,
}


def _tensor(x: np.ndarray) -> Tensor:
    """A NumPy array on :data:`DEVICE` (bfloat16 through float32, fp8 through its bytes:
    tinygrad takes no ml_dtypes)."""
    if x.dtype == ml_dtypes.bfloat16:
        return Tensor(x.astype(np.float32), device=DEVICE).cast(dtypes.bfloat16)
    if x.dtype in _FP8:
        raw = np.ascontiguousarray(x).view(np.uint8)
        return Tensor(raw, device=DEVICE).bitcast(_FP8[x.dtype])
    return Tensor(np.ascontiguousarray(x), device=DEVICE)


def _numpy(t: Tensor) -> np.ndarray:
    if t.dtype == dtypes.bfloat16:
        return t.cast(dtypes.float32).numpy().astype(ml_dtypes.bfloat16)
    for numpy_dtype, fp8 in _FP8.items():  # exact: every fp8 value is a float32
        if t.dtype == fp8:
            return t.cast(dtypes.float32).numpy().astype(numpy_dtype)
    return t.numpy()


def _attn_mask(
    query: np.ndarray,
    key: np.ndarray,
    *,
    mask: np.ndarray | None,
    bias: np.ndarray | None,
    causal_alignment: str,
    q_segment_ids: np.ndarray | None,
    kv_segment_ids: np.ndarray | None,
    alibi_slopes: np.ndarray | None,
) -> np.ndarray | None:
    """The one ``attn_mask`` (broadcastable to (..., H, L, S)) a tinygrad user hands the
    kernel, or None."""
    L, S = query.shape[-2], key.shape[-2]
    if q_segment_ids is not None:
        same = (
            np.asarray(q_segment_ids)[..., None, :, None]
            == np.asarray(kv_segment_ids)[..., None, None, :]
        )  # (..., 1, L, S)
        mask = same if mask is None else np.asarray(mask) & same
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes)
        offset = S - L if causal_alignment == "bottom_right" else 0
        i, j = np.arange(L)[:, None], np.arange(S)[None, :]  # (L, 1), (1, S)
        alibi = -slopes[:, None, None] * np.abs(i + offset - j).astype(slopes.dtype)  # (H, L, S)
        bias = alibi if bias is None else np.asarray(bias) + alibi
    if bias is None:
        return None if mask is None else np.asarray(mask)
    bias = np.asarray(bias)
    return bias if mask is None else np.where(mask, bias, bias.dtype.type(-np.inf))


def _run(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    mask: np.ndarray | None,
    bias: np.ndarray | None,
    is_causal: bool,
    causal_alignment: str,
    scale: float | None,
    softcap: float | None,
    window: tuple[int | None, int | None] | None,
    q_segment_ids: np.ndarray | None,
    kv_segment_ids: np.ndarray | None,
    sinks: np.ndarray | None,
    alibi_slopes: np.ndarray | None,
) -> np.ndarray:
    """``Tensor.scaled_dot_product_attention``: (..., H, L, D), (..., K, S, D), (..., K, S, E)
    -> (..., H, L, E)."""
    for name, given in (("window", window), ("softcap", softcap), ("sinks", sinks)):
        if given is not None:
            raise NotImplementedError(f"tinygrad's scaled_dot_product_attention has no {name}")
    query, key, value = np.asarray(query), np.asarray(key), np.asarray(value)
    attn_mask = _attn_mask(
        query, key, mask=mask, bias=bias, causal_alignment=causal_alignment,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, alibi_slopes=alibi_slopes,
    )
    with Context(DEV=DEVICE):
        q = _tensor(query)
        if scale is not None:  # the kernel divides by sqrt(D): the query carries the rest
            q = q * (float(scale) * math.sqrt(query.shape[-1]))
        out = q.scaled_dot_product_attention(
            _tensor(key),
            _tensor(value),
            attn_mask=None if attn_mask is None else _tensor(attn_mask),
            is_causal=bool(is_causal),
            enable_gqa=query.shape[-3] != key.shape[-3],
        )
        return _numpy(out)


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "tinygrad's Tensor.scaled_dot_product_attention"


@takes_descales(_KERNEL, numpy_output)
def scaled_dot_product_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
) -> np.ndarray:
    """tinygrad's kernel on the contract's layout: query (..., H, L, D), key (..., K, S, D),
    value (..., K, S, E) -> (..., H, L, E)."""
    return _run(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes,
    )


@takes_descales(_KERNEL, numpy_output)
def attention_weights(query: np.ndarray, key: np.ndarray, **keywords: Any) -> np.ndarray:
    """The kernel's weights (..., H, L, S): the same call with the identity (K, S, S) as value."""
    key = np.asarray(key)
    S = key.shape[-2]
    value = np.broadcast_to(np.eye(S, dtype=key.dtype), (*key.shape[:-1], S))  # (..., K, S, S)
    return scaled_dot_product_attention(query, key, value, **keywords)
