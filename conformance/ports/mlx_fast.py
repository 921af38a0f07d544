"""``mlx.core.fast.scaled_dot_product_attention`` as a port: MLX's own kernel.

Run through the same fixtures as the implementations, its failures are a measured list of
where MLX's kernel differs from the contract (``mlx_fast.xfails``, and the table in
docs/CONFORMANCE.md). On Linux it runs with the CPU build (``pip install "mlx[cpu]"``).

The wrapper only translates the contract's keywords into MLX's, and never fixes semantics:

- MLX has no default scale (``scale`` is required): the wrapper passes the contract's default
  ``1/sqrt(D)`` when the caller gives none (inf for D = 0, so the kernel, not the wrapper, meets
  that input);
- ``mask`` and ``bias`` become MLX's one ``mask`` argument: a bool mask alone, else the bias with
  -inf where the mask is False. MLX reads any non-boolean mask as additive, so a float or an
  integer ``mask`` reaches the kernel as it is, and is added;
- ``is_causal`` with bottom_right alone is MLX's ``mask="causal"`` (lower-right aligned);
  together with a mask or bias (MLX takes one mask) the same rule is folded into that mask.
  top_left does not exist in MLX: NotImplementedError, never a mask built in its place;
- ``softcap`` does not exist in MLX: NotImplementedError;
- ``sinks`` is MLX's own ``sinks`` argument (one logit per query head), passed as given;
- the other v2 rules are what an MLX user hands the kernel: a ``window`` (placed on the
  diagonal of ``causal_alignment``, both alignments, since it is a mask built here) and packed
  ``q_segment_ids``/``kv_segment_ids`` as a boolean mask, ``alibi_slopes`` as an additive one,
  ``-slope[h] * |i + offset - j|`` in the slopes' dtype, all built here from the contract's
  formulas and folded into the one ``mask`` like the v1 mask and bias;
- shapes are passed as they are (MLX takes exactly 4-D query, key and value with equal batch
  sizes; it does GQA itself and allows E != D).

fp8 (contract v3): MLX has no float8 dtype (``mx.to_fp8`` packs e4m3 into ``uint8`` codes, which
the kernel refuses: "Received unsupported type uint8", measured with MLX 0.32.4), so an fp8 array
cannot reach the kernel as it is: :func:`from_numpy` raises TypeError for one, and the functions
take no descales.

Contract v3's packed rows (the kernel has no varlen or paged form): :func:`varlen_attention`
calls it once per sequence on its slice of the packed rows, :func:`paged_attention` once per
sequence on its keys gathered from the pool through ``block_table``, each a (1, N, T, X) call
with :func:`scaled_dot_product_attention`'s translation.

MLX is lazy: each function evaluates its result (``mx.eval``) before returning, so an error of
the kernel surfaces in the call and not later inside ``to_numpy``.

:func:`attention_weights` runs the same kernel with the identity as value (one value column per
key), so the output *is* the weight matrix. There is no public causal-mask function, so this
port has no ``causal_mask``.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import mlx.core as mx
import numpy as np

from conformance.ports.packed import packed_rows, page_slots

__all__ = [
    "attention_weights",
    "from_numpy",
    "paged_attention",
    "scaled_dot_product_attention",
    "to_numpy",
    "varlen_attention",
]

#: conformance's device names -> MLX devices (MLX arrays live in unified memory; the device is
#: where the kernel runs, MLX's default device).
_DEVICES = {"cpu": mx.cpu, "gpu": mx.gpu, "metal": mx.gpu, "mps": mx.gpu}


def from_numpy(array: np.ndarray, device: str = "cpu") -> mx.array:
    """An MLX array equal to ``array``, of the same dtype; MLX then computes on ``device``.

    ``mx.array(x)`` silently turns float64 into float32: the dtype is always passed explicitly.
    bfloat16 goes through float32, which is exact. fp8: TypeError (MLX has no float8 dtype).
    """
    mx.set_default_device(_DEVICES[device.partition(":")[0]])
    array = np.asarray(array)
    if array.dtype.name in ("float8_e4m3fn", "float8_e5m2"):
        raise TypeError(
            f"MLX has no {array.dtype.name} dtype: mx.to_fp8 packs e4m3 into uint8 codes, which "
            "mx.fast.scaled_dot_product_attention refuses (unsupported type uint8)"
        )
    if array.dtype == ml_dtypes.bfloat16:
        return mx.array(array.astype(np.float32)).astype(mx.bfloat16)
    dtype = getattr(mx, array.dtype.name, None)
    return mx.array(array) if dtype is None else mx.array(array, dtype=dtype)


def to_numpy(array: mx.array) -> np.ndarray:
    """The array as a NumPy array of the same dtype (bfloat16 as ``ml_dtypes.bfloat16``: NumPy
    cannot read MLX's bfloat16 buffer, so it goes through float32, which is exact)."""
    if array.dtype == mx.bfloat16:
        return np.array(array.astype(mx.float32)).astype(ml_dtypes.bfloat16)
    return np.array(array)


def scaled_dot_product_attention(
    query: mx.array,
    key: mx.array,
    value: mx.array,
    *,
    mask: mx.array | None = None,
    bias: mx.array | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: mx.array | None = None,
    kv_segment_ids: mx.array | None = None,
    sinks: mx.array | None = None,
    alibi_slopes: mx.array | None = None,
) -> mx.array:
    """MLX's fast SDPA on the contract's layout: query (B, H, L, D), key (B, K, S, D),
    value (B, K, S, E) -> (B, H, L, E)."""
    if softcap is not None:
        raise NotImplementedError("mx.fast.scaled_dot_product_attention has no softcap")
    if is_causal and causal_alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"MLX has no causal alignment {causal_alignment!r}")
    if is_causal and causal_alignment == "top_left":
        raise NotImplementedError(
            "mx.fast.scaled_dot_product_attention's causal mask is bottom-right only"
        )
    L, D = query.shape[-2], query.shape[-1]
    S = key.shape[-2]
    if scale is None:  # 1/sqrt(D), and inf for D = 0 (what the kernel then does is measured)
        scale = 1.0 / math.sqrt(D) if D > 0 else math.inf

    mask, bias = _extra_as_mask_and_bias(
        mask, bias, L, S, causal_alignment, window, q_segment_ids, kv_segment_ids, alibi_slopes
    )

    attn_mask: mx.array | str | None = None
    if bias is not None:
        attn_mask = bias if mask is None else mx.where(mask, bias, -math.inf)
    elif mask is not None:
        attn_mask = mask
    if is_causal:
        if attn_mask is None:
            attn_mask = "causal"
        else:  # MLX takes one mask: the same lower-right rule, folded into it
            allowed = mx.tril(mx.ones((L, S), dtype=mx.bool_), k=S - L)
            if attn_mask.dtype == mx.bool_:
                attn_mask = mx.logical_and(attn_mask, allowed)
            else:
                attn_mask = mx.where(allowed, attn_mask, -math.inf)

    out = mx.fast.scaled_dot_product_attention(
        query, key, value, scale=scale, mask=attn_mask, sinks=sinks
    )
    mx.eval(out)
    return out


def _extra_as_mask_and_bias(mask, bias, L, S, alignment, window, q_ids, kv_ids, slopes):
    """The window and segments folded into the boolean mask, ALiBi into the bias."""
    offset = 0 if alignment == "top_left" else S - L
    rows = mx.arange(L)[:, None] + offset  # (L, 1): each row's diagonal key
    keys = mx.arange(S)[None, :]  # (1, S)
    extra = []
    if window is not None:
        left, right = window
        if left is not None:
            extra.append(keys >= rows - left)
        if right is not None:
            extra.append(keys <= rows + right)
    if q_ids is not None:
        extra.append(q_ids[..., None, :, None] == kv_ids[..., None, None, :])  # (..., 1, L, S)
    for allowed in extra:
        mask = allowed if mask is None else mx.logical_and(mask, allowed)
    if slopes is not None:
        distance = mx.abs(rows - keys).astype(slopes.dtype)  # (L, S)
        alibi = -slopes[:, None, None] * distance  # (H, L, S)
        bias = alibi if bias is None else bias + alibi
    return mask, bias


def attention_weights(
    query: mx.array,
    key: mx.array,
    *,
    mask: mx.array | None = None,
    bias: mx.array | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    **extra: Any,  # window, segment ids, sinks, ALiBi slopes
) -> mx.array:
    """The weights (B, H, L, S) from MLX's kernel: SDPA with value = identity (S x S)."""
    K, S = key.shape[-3], key.shape[-2]
    identity = mx.broadcast_to(mx.eye(S, dtype=query.dtype), (*key.shape[:-3], K, S, S))
    return scaled_dot_product_attention(
        query,
        key,
        identity,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
        **extra,
    )


# ---------------------------------------------------------------------------------------------
# Contract v3: varlen and paged, one kernel call per sequence (the kernel has neither form)
# ---------------------------------------------------------------------------------------------


def varlen_attention(
    query: mx.array,
    key: mx.array,
    value: mx.array,
    cu_seqlens_q: mx.array,
    cu_seqlens_k: mx.array,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: mx.array | None = None,
    alibi_slopes: mx.array | None = None,
) -> mx.array:
    """Packed sequences as one kernel call per sequence: query (Tq, H, D), key (Tk, K, D),
    value (Tk, K, E), ``cu_seqlens_q``/``cu_seqlens_k`` (N + 1,) -> (Tq, H, E).

    Sequence n is the kernel on its slices (1, H, L_n, D) and (1, K, S_n, D|E), the loop an
    MLX user writes (the kernel takes 4-D arrays of one length each and no document mask):
    bottom-right ``is_causal`` is ``mask="causal"`` on the sequence's own (L_n, S_n), top-left
    is NotImplementedError (as in :func:`scaled_dot_product_attention`), the window and ALiBi
    are masks on the sequence's positions, sinks MLX's own. No softcap: NotImplementedError."""
    if softcap is not None:
        raise NotImplementedError("mx.fast.scaled_dot_product_attention has no softcap")
    rows = []
    for (q0, q1), (k0, k1) in zip(packed_rows(cu_seqlens_q), packed_rows(cu_seqlens_k)):
        if q1 == q0:  # a sequence without queries needs no call
            continue
        q, k, v = (mx.swapaxes(x, 0, 1)[None] for x in (query[q0:q1], key[k0:k1], value[k0:k1]))
        out = scaled_dot_product_attention(
            q, k, v, is_causal=is_causal, causal_alignment=causal_alignment, window=window,
            scale=scale, sinks=sinks, alibi_slopes=alibi_slopes,
        )  # (1, H, L_n, E)
        rows.append(mx.swapaxes(out[0], 0, 1))  # (L_n, H, E)
    out = (
        mx.concatenate(rows)
        if rows
        else mx.zeros((0, query.shape[1], value.shape[-1]), query.dtype)
    )
    mx.eval(out)
    return out


def paged_attention(
    query: mx.array,
    key_cache: mx.array,
    value_cache: mx.array,
    block_table: mx.array,
    seq_lens: mx.array,
    cu_seqlens_q: mx.array,
    *,
    is_causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: mx.array | None = None,
    alibi_slopes: mx.array | None = None,
) -> mx.array:
    """A paged cache as one kernel call per sequence: query (T, H, D), key_cache
    (P, page, K, D), value_cache (P, page, K, E), block_table (N, max_pages), seq_lens (N,),
    cu_seqlens_q (N + 1,) -> (T, H, E).

    The wrapper gathers sequence n's ``seq_lens[n]`` keys and values through ``block_table``
    into a contiguous (1, K, S_n, D|E) (no slot past ``seq_lens[n]`` is read), then the kernel
    on its queries (1, H, L_n, D), the last L_n positions: the contract's bottom-right diagonal
    is MLX's own ``mask="causal"``; the window and ALiBi are masks on it, sinks MLX's own.
    No softcap: NotImplementedError."""
    if softcap is not None:
        raise NotImplementedError("mx.fast.scaled_dot_product_attention has no softcap")
    P, page, K, _ = key_cache.shape
    keys = key_cache.reshape(P * page, K, key_cache.shape[-1])  # (P * page, K, D)
    values = value_cache.reshape(P * page, K, value_cache.shape[-1])  # (P * page, K, E)
    rows = []
    for (q0, q1), slots in zip(packed_rows(cu_seqlens_q), page_slots(block_table, seq_lens, page)):
        if q1 == q0:  # a sequence without queries needs no call
            continue
        index = mx.array(slots.astype(np.int32))  # (S_n,)
        q = mx.swapaxes(query[q0:q1], 0, 1)[None]  # (1, H, L_n, D)
        k, v = (mx.swapaxes(x[index], 0, 1)[None] for x in (keys, values))  # (1, K, S_n, D|E)
        out = scaled_dot_product_attention(
            q, k, v, is_causal=is_causal, causal_alignment="bottom_right", window=window,
            scale=scale, sinks=sinks, alibi_slopes=alibi_slopes,
        )  # (1, H, L_n, E)
        rows.append(mx.swapaxes(out[0], 0, 1))  # (L_n, H, E)
    out = (
        mx.concatenate(rows)
        if rows
        else mx.zeros((0, query.shape[1], value_cache.shape[-1]), query.dtype)
    )
    mx.eval(out)
    return out
