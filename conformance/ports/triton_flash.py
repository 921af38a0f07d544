"""A Triton flash-attention kernel as a port: the contract's forward pass for torch tensors.

Checked like any other port (``python -m conformance --impl conformance.ports.triton_flash``)
and the worked example of conformance/PORTING.md, "Porting a kernel". One kernel,
:func:`_flash_forward_kernel`, does all the arithmetic: one program takes ``block_q`` query
rows of one query head of one batch element, walks the keys ``block_k`` at a time with the
online softmax (a running row max ``m``, a running row sum ``l`` and an output accumulator
``acc``, rescaled by ``exp(m_old - m_new)`` whenever the max rises), and divides by ``l``
once at the end. Everything around it is Python that runs before the launch:

- validation through ``attention_spec.check_attention`` (the same call, errors and messages as
  impl_numpy, impl_torch and impl_jax), then this kernel's own limits: float32, float16 and
  bfloat16 only (a float64 input is ``DTypeError`` ``unsupported_dtype``);
- the broadcasting of SEMANTICS.md without copies: mask and bias become ``expand``ed views
  (stride 0 along every broadcast axis), and the leading batch dims, however many and however
  broadcast, become one table of element offsets per batch element (``(B, 6)`` int64, one
  column per tensor), so the kernel reads any layout through strides;
- the choice of how to run, made when triton is first imported: on a machine where torch
  sees no CUDA this module sets ``TRITON_INTERPRET=1`` before importing it, and the kernel
  runs in Triton's interpreter (the same code, executed with NumPy) on CPU tensors; with CUDA
  it is compiled (CPU tensors then need ``TRITON_INTERPRET=1`` set by the caller).

The steps and their numbers are the contract's (SEMANTICS.md): 1. scores, 2. softcap,
3. bias, 4. mask, 5. causal, 6. softmax with fully masked rows giving zeros, 7. output in the
input dtype. Scores, softmax and accumulator are float32; for float16/bfloat16 inputs the dots
take the input dtype with a float32 accumulator (products of 16-bit numbers are exact in
float32) and the weights are rounded to the input dtype before ``weights @ value``, as
FlashAttention does; float32 dots are IEEE (Triton's default would be TF32 on a GPU).

Functions the conformance runner calls: :func:`scaled_dot_product_attention`,
:func:`flash_attention` (the same kernel with the caller's block sizes) and
:func:`attention_weights` (the same kernel run with the identity as value, so the weights it
returns are the kernel's own), plus the torch adapters ``from_numpy`` and ``to_numpy``. It
has no ``causal_mask`` and no modules; its xfails file says so.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim; ``bq`` and ``bk`` the rows and keys of one block.
"""

from __future__ import annotations

import math
import os

import torch

# Without CUDA, Triton can only interpret: switch its interpreter on before triton is imported
# (its standard library, tl.sum, tl.max, ..., is compiled or interpreted at import time).
# Set TRITON_INTERPRET yourself to choose either way.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from attention_spec import AttentionDims, causal_offset, check_attention, check_block_sizes
from attention_spec.errors import make_error
from conformance.ports.torch_adapter import from_numpy, to_numpy

__all__ = [
    "BLOCK_K",
    "BLOCK_Q",
    "attention_weights",
    "flash_attention",
    "from_numpy",
    "scaled_dot_product_attention",
    "to_numpy",
]

#: Default rows and keys per block of ``scaled_dot_product_attention`` (and of
#: ``flash_attention`` when not given): FlashAttention-2's usual tile for head dims up to 128.
BLOCK_Q: int = 64
BLOCK_K: int = 64

#: The input dtypes this kernel computes (the contract's four, less float64).
KERNEL_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}

#: The Triton dtype of each torch dtype the kernel's dots take.
_DOT_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}

#: tl.dot wants every side of a tile to be a power of two and, on NVIDIA GPUs, at least 16.
_MIN_TILE = 16


@triton.jit
def _flash_forward_kernel(
    Q, K, V, Out, Mask, Bias, Offsets,  # pointers; Offsets: (B, 6) int64, see _batch_offsets
    stride_qh, stride_ql, stride_qd,  # strides of query (..., H, L, D), in elements
    stride_kh, stride_ks, stride_kd,  # key (..., K, S, D)
    stride_vh, stride_vs, stride_ve,  # value (..., K, S, E)
    stride_oh, stride_ol, stride_oe,  # output (..., H, L, E)
    stride_mh, stride_ml, stride_ms,  # mask, expanded to (..., H, L, S): 0 where broadcast
    stride_bh, stride_bl, stride_bs,  # bias, likewise
    H, G, L, S, D, E,  # sizes; query head h reads key/value head h // G
    scale, softcap, offset,  # offset: the causal diagonal, key j allowed iff j <= i + offset
    block_q, block_k,  # rows and keys per block, as asked (<= TILE_Q, TILE_K)
    TILE_Q: tl.constexpr, TILE_K: tl.constexpr, TILE_D: tl.constexpr, TILE_E: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    # One program: block_q query rows (i0 .. i0 + block_q - 1) of query head h of batch
    # element b. The tiles are powers of two; lanes past block_q/block_k or past L/S are off.
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    i0 = tl.program_id(1) * block_q
    q_off = tl.load(Offsets + b * 6 + 0)
    k_off = tl.load(Offsets + b * 6 + 1)
    v_off = tl.load(Offsets + b * 6 + 2)
    o_off = tl.load(Offsets + b * 6 + 3)
    kv = h // G  # contiguous groups: heads kv*G .. kv*G + G - 1 share key/value head kv

    lane_q = tl.arange(0, TILE_Q)
    lane_k = tl.arange(0, TILE_K)
    d = tl.arange(0, TILE_D)
    e = tl.arange(0, TILE_E)
    rows = i0 + lane_q  # (bq,) query positions i
    row_ok = (lane_q < block_q) & (rows < L)
    d_ok = d[None, :] < D  # (1, D) real features of the padded tiles
    e_ok = e[None, :] < E  # (1, E)

    q_ptrs = Q + q_off + h * stride_qh + rows[:, None] * stride_ql + d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok, other=0.0).to(DOT_DTYPE)  # (bq, D)

    # Pointers to the first key block; block j0 is these plus j0 keys along S.
    k_ptrs = K + k_off + kv * stride_kh + lane_k[:, None] * stride_ks + d[None, :] * stride_kd
    v_ptrs = V + v_off + kv * stride_vh + lane_k[:, None] * stride_vs + e[None, :] * stride_ve
    if HAS_BIAS:
        b_off = tl.load(Offsets + b * 6 + 5)
        b_ptrs = Bias + b_off + h * stride_bh + rows[:, None] * stride_bl
        b_ptrs += lane_k[None, :] * stride_bs  # (bq, bk)
    if HAS_MASK:
        m_off = tl.load(Offsets + b * 6 + 4)
        m_ptrs = Mask + m_off + h * stride_mh + rows[:, None] * stride_ml
        m_ptrs += lane_k[None, :] * stride_ms  # (bq, bk)

    m = tl.full((TILE_Q,), float("-inf"), tl.float32)  # running row max of the scores
    l = tl.full((TILE_Q,), 0.0, tl.float32)  # running row sum of exp(s - m)
    acc = tl.full((TILE_Q, TILE_E), 0.0, tl.float32)  # running sum of exp(s - m) @ value

    # 5. causal, whole blocks: no row of this block sees a key j > i_last + offset, so the
    #    key blocks from there on are never visited (causal costs about half).
    j_end = S
    if IS_CAUSAL:
        i_last = tl.minimum(i0 + block_q, L) - 1
        j_end = tl.minimum(S, tl.maximum(0, i_last + offset + 1))
    for j0 in range(0, j_end, block_k):  # one block of keys at a time
        cols = j0 + lane_k  # (bk,) key positions j
        col_ok = (lane_k < block_k) & (cols < S)  # loads: this block's keys, none past S
        k = tl.load(k_ptrs + j0 * stride_ks, mask=col_ok[:, None] & d_ok, other=0.0)  # (bk, D)

        # 1. scores = (query @ key^T) * scale, float32.
        s = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * scale

        # 2. softcap: s = softcap * tanh(s / softcap), before any bias or mask. tanh from exp,
        #    in float64 (Triton's interpreter has no tanh; float64 keeps float32 accuracy).
        if HAS_SOFTCAP:
            t = tl.exp((2.0 * s / softcap).to(tl.float64))
            s = (softcap * (1.0 - 2.0 / (t + 1.0))).to(tl.float32)

        in_block = row_ok[:, None] & col_ok[None, :]  # (bq, bk) lanes that may be loaded
        # 3. bias: this block's slice of it is added, may hold -inf.
        if HAS_BIAS:
            s += tl.load(b_ptrs + j0 * stride_bs, mask=in_block, other=0.0)

        # 4. mask: False -> -inf, together with 5. and with the lanes that are no position:
        #    a key past S was loaded as zeros, which makes its score 0, not -inf, so the
        #    ragged last block is masked here too.
        allowed = row_ok[:, None] & (lane_k < block_k)[None, :] & (cols[None, :] < S)
        if HAS_MASK:
            allowed &= tl.load(m_ptrs + j0 * stride_ms, mask=in_block, other=0) != 0

        # 5. causal, inside the block: query i sees key j iff j <= i + offset.
        if IS_CAUSAL:
            allowed &= cols[None, :] <= rows[:, None] + offset
        s = tl.where(allowed, s, float("-inf"))  # (bq, bk)

        # 6. online softmax: raise the running max, rescale what was summed under the old one
        #    by exp(m_old - m_new), add this block's exp(s - m_new). Nothing allowed yet: the
        #    max is -inf, and the shift 0 keeps exp(-inf - shift) = 0 instead of NaN. The
        #    exponent is clamped at 0: compiled, s - shift may be fused with the scaling into
        #    one FMA that rounds differently from the max (SEMANTICS.md v2); NaN stays NaN.
        m_new = tl.maximum(m, tl.max(s, 1))  # (bq,)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - shift)  # (bq,); 0 while m is still -inf
        z = tl.minimum(s - shift[:, None], 0.0, propagate_nan=tl.PropagateNan.ALL)
        p = tl.exp(z)  # (bq, bk), unnormalized weights
        l = l * alpha + tl.sum(p, 1)

        # 7. output, accumulated: acc = alpha * acc + p @ value, the weights first rounded to
        #    the input dtype (FlashAttention's practice; exact for float32).
        v = tl.load(v_ptrs + j0 * stride_vs, mask=col_ok[:, None] & e_ok, other=0.0)  # (bk, E)
        p = p.to(v.dtype).to(DOT_DTYPE)
        pv = tl.dot(p, v.to(DOT_DTYPE), input_precision=DOT_PRECISION)  # (bq, E), float32
        acc = acc * alpha[:, None] + pv
        m = m_new

    # 6. (end) divide by the row sum once; a row with no allowed key has l = 0 and acc = 0:
    #    0 / 1 = 0, never NaN and never uniform.
    l = tl.where(l == 0.0, 1.0, l)
    out = acc / l[:, None]  # (bq, E)
    # 7. (end) back to the input dtype.
    o_ptrs = Out + o_off + h * stride_oh + rows[:, None] * stride_ol + e[None, :] * stride_oe
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & e_ok)


#: True when the kernel runs in Triton's interpreter (TRITON_INTERPRET=1 when triton was
#: imported): with NumPy on the host, for CPU tensors, and CUDA tensors copied there and back.
INTERPRETED: bool = isinstance(_flash_forward_kernel, InterpretedFunction)


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")  # torch.bfloat16 -> "bfloat16"


def _validate(query, key, value, mask, bias, causal_alignment, scale, softcap) -> AttentionDims:
    """The contract's validation (attention_spec), then this kernel's own limit: no float64."""
    dims = check_attention(
        query.shape, _dtype_name(query),
        key.shape, _dtype_name(key),
        None if value is None else value.shape,
        None if value is None else _dtype_name(value),
        mask_shape=None if mask is None else mask.shape,
        mask_dtype=None if mask is None else _dtype_name(mask),
        bias_shape=None if bias is None else bias.shape,
        bias_dtype=None if bias is None else _dtype_name(bias),
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
    )  # fmt: skip
    if query.dtype not in KERNEL_DTYPES:
        supported = ", ".join(KERNEL_DTYPES.values())
        raise make_error(
            "unsupported_dtype",
            f"the Triton kernel computes {supported}; got {_dtype_name(query)} "
            "(impl_torch computes float64)",
            expected=" | ".join(KERNEL_DTYPES.values()),
            actual=_dtype_name(query),
        )
    return dims


def _tile(n: int) -> int:
    """The kernel's tile side for ``n`` positions or features: a power of two, at least 16."""
    return max(_MIN_TILE, triton.next_power_of_2(n))


def _batch_offsets(tensors: list[torch.Tensor | None], batch: tuple[int, ...]) -> torch.Tensor:
    """``(B, len(tensors))`` int64: the element offset of each flattened batch element in each
    tensor (0 for None). Each tensor is ``(*batch_t, X, Y, Z)`` with ``batch_t`` broadcastable to
    ``batch``; an axis it lacks or has of size 1 contributes nothing (stride 0)."""
    columns = []
    for t in tensors:
        offset = torch.zeros(batch, dtype=torch.int64)
        if t is not None:
            t_batch = t.shape[:-3]
            for axis in range(1, len(t_batch) + 1):  # right-aligned, as broadcasting is
                n, stride = t_batch[-axis], t.stride(-3 - axis)
                if n > 1:
                    position = [1] * len(batch)
                    position[-axis] = n
                    offset = offset + torch.arange(n).view(position) * stride
        columns.append(offset.reshape(-1))
    return torch.stack(columns, dim=1)  # (B, 6)


def _forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dims: AttentionDims,
    mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    is_causal: bool,
    causal_alignment: str,
    softcap: float | None,
    block_q: int,
    block_k: int,
) -> torch.Tensor:
    """Launch the kernel on validated inputs; returns the output ``(..., H, L, E)``."""
    out = torch.empty(dims.output_shape, dtype=query.dtype, device=query.device)
    if out.numel() == 0:  # L = 0, E = 0 or an empty batch: nothing to launch
        return out
    H, L, S = dims.H, dims.L, dims.S
    # Mask and bias as (..., H, L, S) views: stride 0 along every broadcast axis, no copy.
    # bias is taken to float32, the compute dtype, first (SEMANTICS.md v2).
    scores = dims.scores_shape
    mask_v = None if mask is None else mask.view(torch.uint8).expand(scores)
    bias_v = None if bias is None else bias.to(torch.float32).expand(scores)
    operands = [query, key, value, out, mask_v, bias_v]
    offsets = _batch_offsets(operands, dims.batch).to(query.device)

    def strides(t: torch.Tensor | None) -> tuple[int, int, int]:
        return (0, 0, 0) if t is None else (t.stride(-3), t.stride(-2), t.stride(-1))

    n_batch = math.prod(dims.batch)
    grid = (n_batch * H, triton.cdiv(L, block_q))  # (batch element x head, query block)
    if query.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            "the Triton kernel compiles for CUDA tensors only; for CPU tensors set "
            "TRITON_INTERPRET=1 before triton is imported (it was imported without it)"
        )
    # The dots take the input dtype (float32 accumulators), except bfloat16 in the interpreter,
    # which holds bfloat16 as raw 16-bit integers and would multiply those
    # (triton-lang/triton#11584): it widens to float32 first, which is exact.
    bf16_interpreted = INTERPRETED and query.dtype == torch.bfloat16
    dot_dtype = torch.float32 if bf16_interpreted else query.dtype
    _flash_forward_kernel[grid](
        query, key, value, out,
        query if mask_v is None else mask_v,  # an unused pointer still needs a tensor
        query if bias_v is None else bias_v,
        offsets,
        *strides(query), *strides(key), *strides(value), *strides(out),
        *strides(mask_v), *strides(bias_v),
        H, dims.G, L, S, dims.D, dims.E,
        dims.scale, 1.0 if softcap is None else float(softcap),
        causal_offset(L, S, causal_alignment),
        block_q, block_k,
        TILE_Q=_tile(block_q), TILE_K=_tile(block_k), TILE_D=_tile(dims.D), TILE_E=_tile(dims.E),
        HAS_MASK=mask is not None, HAS_BIAS=bias is not None, HAS_SOFTCAP=softcap is not None,
        IS_CAUSAL=bool(is_causal),
        DOT_DTYPE=_DOT_DTYPES[dot_dtype],
        DOT_PRECISION="ieee" if dot_dtype == torch.float32 else "tf32",
    )  # fmt: skip
    return out


def flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> torch.Tensor:
    """The contract's attention output ``(..., H, L, E)``, computed by the Triton kernel.

    Args:
        query: ``(..., H, L, D)``; float32, float16 or bfloat16, on CUDA (compiled kernel) or
            on the CPU (Triton's interpreter).
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
        mask: boolean, broadcastable to ``(..., H, L, S)``; True = may attend.
        bias: floating, broadcastable to ``(..., H, L, S)``; added to the scores, may hold -inf.
        is_causal: apply the causal rule of ``causal_alignment`` ("top_left" | "bottom_right").
        scale: score scale, default ``1/sqrt(D)``.
        softcap: if given, scores become ``softcap * tanh(scores / softcap)`` before bias/mask.
        block_q: query rows per program (any integer >= 1; it need not divide L).
        block_k: keys per step of a program's loop (any integer >= 1; it need not divide S).

    Returns the output in the query's dtype; rows with no allowed key are zeros.

    Raises the contract's errors (attention_spec) before any launch, ConfigError for a block
    size < 1, and DTypeError ``unsupported_dtype`` for float64.
    """
    dims = _validate(query, key, value, mask, bias, causal_alignment, scale, softcap)
    check_block_sizes(block_q, block_k)
    return _forward(
        query, key, value, dims, mask, bias, is_causal, causal_alignment, softcap,
        block_q, block_k,
    )  # fmt: skip


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """:func:`flash_attention` with the default blocks (``BLOCK_Q`` x ``BLOCK_K``)."""
    return flash_attention(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap,
    )  # fmt: skip


def attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """The weights ``(..., H, L, S)`` as the kernel computes them: the kernel run with the
    identity as value (E = S, one value column per key), so that output row i is weight row i.

    For checking the kernel weight by weight; it costs an ``(S, S)`` identity, shared by every
    head and batch element (stride 0).
    """
    dims = _validate(query, key, None, mask, bias, causal_alignment, scale, softcap)
    K, S = dims.K, dims.S
    identity = torch.eye(S, dtype=query.dtype, device=query.device).expand(K, S, S)  # (K, S, E=S)
    dims = AttentionDims(dims.batch, dims.H, K, dims.L, S, dims.D, S, dims.scale)
    return _forward(
        query, key, identity, dims, mask, bias, is_causal, causal_alignment, softcap,
        BLOCK_Q, BLOCK_K,
    )  # fmt: skip
