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
- the broadcasting of SEMANTICS.md without copies: mask, bias and segment ids become
  ``expand``ed views (stride 0 along every broadcast axis), and the leading batch dims, however
  many and however broadcast, become one table of element offsets per batch element
  (``(B, 8)`` int64, one column per tensor), so the kernel reads any layout through strides;
- the choice of how to run, made when triton is first imported: on a machine where torch
  sees no CUDA this module sets ``TRITON_INTERPRET=1`` before importing it, and the kernel
  runs in Triton's interpreter (the same code, executed with NumPy) on CPU tensors; with CUDA
  it is compiled (CPU tensors then need ``TRITON_INTERPRET=1`` set by the caller).

The steps and their numbers are the contract's (SEMANTICS.md, v2): 1. scores, 2. softcap, 3.
additive terms (bias, ALiBi computed per block), 4. allowed (mask, causal, window, segment ids;
key blocks outside the causal and window bands are never visited), 5. softmax with the sink in
the denominator and fully masked rows giving zeros, 6. output in the input dtype (value rows no
query of the block attends selected away, so NaN there never leaks), and the row log-sum-exp
for ``return_lse``. Scores, softmax and accumulator are float32; for float16/bfloat16 inputs
the dots take the input dtype with a float32 accumulator (products of 16-bit numbers are exact
in float32) and the weights are rounded to the input dtype before ``weights @ value``, as
FlashAttention does; float32 dots are IEEE (Triton's default would be TF32 on a GPU).

Functions the conformance runner calls: :func:`scaled_dot_product_attention`,
:func:`flash_attention` (the same kernel with the caller's block sizes) and
:func:`attention_weights` (the same kernel run with the identity as value, so the weights it
returns are the kernel's own), plus the torch adapters ``from_numpy`` and ``to_numpy``. It
has no ``causal_mask`` and no modules; its xfails file says so. Contract v3's
:func:`varlen_attention` and :func:`paged_attention` run a second kernel,
:func:`_token_major_kernel` (a program per query block and head of one sequence; paged, the
sequence's pages read through ``block_table`` inside the kernel, never a gathered copy). Both
kernels take contract v3's fp8 forms: fp8 key/value (and query) go into the kernel as fp8 and
are converted to float32 there, as FlashAttention 3 does; the descales enter as factors per
(batch element or sequence, head): ``q_descale * k_descale`` on the scores (query head h
reading the ``k_descale`` of its key/value head), ``v_descale`` on the output. Their weights
stay float32 before the value product (the strict bound's computation).

Why one file of ~890 lines, two kernels: the runner imports a port as one module, whose
xfails file is the module's, and the broken-kernel tests (``conformance/tests/
test_kernel_ports.py``) recompile this module's source with one edit each; the heads-first
kernel and the token-major one stay in the file they are patched in.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim; ``bq`` and ``bk`` the rows and keys of one block.
"""

from __future__ import annotations

import dataclasses
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

from attention_spec import (
    NO_VALUE,
    AttentionDims,
    causal_offset,
    check_attention,
    check_block_sizes,
    check_flag,
)
from attention_spec.errors import make_error
from conformance.ports.torch_adapter import from_numpy, to_numpy

__all__ = [
    "BLOCK_K",
    "BLOCK_Q",
    "attention_weights",
    "flash_attention",
    "from_numpy",
    "paged_attention",
    "scaled_dot_product_attention",
    "to_numpy",
    "varlen_attention",
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
    Q, K, V, Out, Lse, Mask, Bias, QSeg, KVSeg, Sinks, Slopes, Offsets, QDs, KDs, VDs,  # see below
    stride_qh, stride_ql, stride_qd,  # strides of query (..., H, L, D), in elements
    stride_kh, stride_ks, stride_kd,  # key (..., K, S, D)
    stride_vh, stride_vs, stride_ve,  # value (..., K, S, E)
    stride_oh, stride_ol, stride_oe,  # output (..., H, L, E)
    stride_mh, stride_ml, stride_ms,  # mask, expanded to (..., H, L, S): 0 where broadcast
    stride_bh, stride_bl, stride_bs,  # bias, likewise
    stride_ql_seg, stride_ks_seg,  # segment ids, expanded to (..., L) and (..., S)
    H, G, L, S, D, E,  # sizes; query head h reads key/value head h // G
    scale, softcap, offset,  # offset: the causal and window diagonal, key i + offset for row i
    left, right,  # window=(left, right): key j allowed iff i+offset-left <= j <= i+offset+right
    block_q, block_k,  # rows and keys per block, as asked (<= TILE_Q, TILE_K)
    TILE_Q: tl.constexpr, TILE_K: tl.constexpr, TILE_D: tl.constexpr, TILE_E: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SEGMENTS: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_DESCALE: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    P_DTYPE: tl.constexpr,
):
    # One program: block_q query rows (i0 .. i0 + block_q - 1) of query head h of batch
    # element b. The tiles are powers of two; lanes past block_q/block_k or past L/S are off.
    # Offsets: (B, 8) int64, the element offset of batch element b in query, key, value,
    # output, mask, bias, q and kv segment ids (see _batch_offsets). Lse: (B * H, L) float32.
    # Sinks and Slopes: (H,) float32. QDs (B, H), KDs and VDs (B, K): the fp8 descales per
    # batch element and head, float32 (unused pointers when not HAS_DESCALE).
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    i0 = tl.program_id(1) * block_q
    q_off = tl.load(Offsets + b * 8 + 0)
    k_off = tl.load(Offsets + b * 8 + 1)
    v_off = tl.load(Offsets + b * 8 + 2)
    o_off = tl.load(Offsets + b * 8 + 3)
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
    score_scale = scale
    v_descale = 1.0
    if HAS_DESCALE:  # 0. dequantize: an fp8 input is float(x) * descale, folded into the scale
        K_heads = H // G  # query head h's descale, and its key/value head kv's
        score_scale = scale * tl.load(QDs + b * H + h) * tl.load(KDs + b * K_heads + kv)
        v_descale = tl.load(VDs + b * K_heads + kv)

    # Pointers to the first key block; block j0 is these plus j0 keys along S.
    k_ptrs = K + k_off + kv * stride_kh + lane_k[:, None] * stride_ks + d[None, :] * stride_kd
    v_ptrs = V + v_off + kv * stride_vh + lane_k[:, None] * stride_vs + e[None, :] * stride_ve
    if HAS_BIAS:
        b_off = tl.load(Offsets + b * 8 + 5)
        b_ptrs = Bias + b_off + h * stride_bh + rows[:, None] * stride_bl
        b_ptrs += lane_k[None, :] * stride_bs  # (bq, bk)
    if HAS_MASK:
        m_off = tl.load(Offsets + b * 8 + 4)
        m_ptrs = Mask + m_off + h * stride_mh + rows[:, None] * stride_ml
        m_ptrs += lane_k[None, :] * stride_ms  # (bq, bk)
    if HAS_SEGMENTS:
        qs_off = tl.load(Offsets + b * 8 + 6)
        ks_off = tl.load(Offsets + b * 8 + 7)
        q_seg = tl.load(QSeg + qs_off + rows * stride_ql_seg, mask=row_ok, other=0)  # (bq,)
        kv_seg_ptrs = KVSeg + ks_off + lane_k * stride_ks_seg  # (bk,)
    if HAS_ALIBI:
        slope = tl.load(Slopes + h)  # this query head's ALiBi slope, float32

    m = tl.full((TILE_Q,), float("-inf"), tl.float32)  # running row max of the scores
    l = tl.full((TILE_Q,), 0.0, tl.float32)  # running row sum of exp(s - m)
    acc = tl.full((TILE_Q, TILE_E), 0.0, tl.float32)  # running sum of exp(s - m) @ value

    # 4. allowed, whole blocks: the keys outside the causal and window bands of these rows are
    #    masked for every row, so their blocks are never visited (causal costs about half, a
    #    window of W keys costs W, not S). The first row's band starts first, the last row's
    #    ends last; the loop starts on a block boundary, so the blocks are the caller's.
    i_last = tl.minimum(i0 + block_q, L) - 1
    j_start = 0
    j_end = S
    if IS_CAUSAL:
        j_end = tl.minimum(j_end, tl.maximum(0, i_last + offset + 1))
    if HAS_LEFT:
        j_start = tl.maximum(0, i0 + offset - left)
        j_start = tl.minimum(j_start, S)
        j_start -= j_start % block_k
    if HAS_RIGHT:
        j_end = tl.minimum(j_end, tl.maximum(0, i_last + offset + right + 1))
    for j0 in range(j_start, j_end, block_k):  # one block of keys at a time
        cols = j0 + lane_k  # (bk,) key positions j
        col_ok = (lane_k < block_k) & (cols < S)  # loads: this block's keys, none past S
        k = tl.load(k_ptrs + j0 * stride_ks, mask=col_ok[:, None] & d_ok, other=0.0)  # (bk, D)

        # 1. scores = (query @ key^T) * scale (times q_descale * k_descale), float32.
        s = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * score_scale

        # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask. tanh
        #    from exp, in float64 (Triton's interpreter has no tanh; float64 keeps float32
        #    accuracy).
        if HAS_SOFTCAP:
            t = tl.exp((2.0 * s / softcap).to(tl.float64))
            s = (softcap * (1.0 - 2.0 / (t + 1.0))).to(tl.float32)

        in_block = row_ok[:, None] & col_ok[None, :]  # (bq, bk) lanes that may be loaded
        # 3. additive terms: this block's slice of the bias (may hold -inf), then ALiBi's
        #    -slope[h] * |i + offset - j|, computed here for this block's rows and keys.
        if HAS_BIAS:
            bias = tl.load(b_ptrs + j0 * stride_bs, mask=in_block, other=0.0)  # (bq, bk)
            s += bias
        if HAS_ALIBI:
            distance = tl.abs(rows[:, None] + offset - cols[None, :]).to(tl.float32)
            s += -slope * distance

        # 4. allowed(i, j) = mask AND causal AND window AND same segment, and the lanes that
        #    are no position: a key past S was loaded as zeros, which makes its score 0, not
        #    -inf, so the ragged last block is masked here too. A -inf bias excludes its key
        #    as a False mask does (a NaN key's score plus -inf would be NaN, not -inf).
        allowed = row_ok[:, None] & (lane_k < block_k)[None, :] & (cols[None, :] < S)
        if HAS_MASK:
            allowed &= tl.load(m_ptrs + j0 * stride_ms, mask=in_block, other=0) != 0
        if HAS_BIAS:
            allowed &= bias != float("-inf")
        if IS_CAUSAL:
            allowed &= cols[None, :] <= rows[:, None] + offset
        if HAS_LEFT:
            allowed &= cols[None, :] >= rows[:, None] + offset - left
        if HAS_RIGHT:
            allowed &= cols[None, :] <= rows[:, None] + offset + right
        if HAS_SEGMENTS:
            kv_seg = tl.load(kv_seg_ptrs + j0 * stride_ks_seg, mask=col_ok, other=0)  # (bk,)
            allowed &= q_seg[:, None] == kv_seg[None, :]
        s = tl.where(allowed, s, float("-inf"))  # (bq, bk)

        # 5. online softmax: raise the running max, rescale what was summed under the old one
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

        # 6. output, accumulated: acc = alpha * acc + p @ value, the weights first rounded to
        #    P_DTYPE: the input dtype (FlashAttention's practice; exact for float32), float32
        #    for fp8 inputs (the strict bound's computation). A value row that
        #    no row of this block attends is selected away, not multiplied by its zero weight:
        #    NaN or inf there (padding, unused cache slots) never reaches the output.
        v = tl.load(v_ptrs + j0 * stride_vs, mask=col_ok[:, None] & e_ok, other=0.0)  # (bk, E)
        attended = tl.max(allowed.to(tl.int32), 0) != 0  # (bk,) keys some row here attends
        v = tl.where(attended[:, None], v.to(DOT_DTYPE), 0.0).to(DOT_DTYPE)
        p = p.to(P_DTYPE).to(DOT_DTYPE)
        pv = tl.dot(p, v, input_precision=DOT_PRECISION)  # (bq, E), float32
        acc = acc * alpha[:, None] + pv
        m = m_new

    # 5. (end) the sink joins the denominator once, as one more logit with no value, untouched
    #    by scale, softcap, bias, ALiBi and masks; then divide by the row sum once. A row with
    #    no allowed key has l = 0 and acc = 0: 0 / 1 = 0 (sink or not), never NaN, and its
    #    log-sum-exp is -inf.
    empty = l == 0.0  # (bq,) rows that saw no allowed key
    if HAS_SINKS:
        sink = tl.load(Sinks + h)  # float32
        m_sink = tl.maximum(m, sink)
        shift = tl.where(m_sink == float("-inf"), 0.0, m_sink)
        alpha = tl.exp(m - shift)
        l = l * alpha + tl.exp(tl.minimum(sink - shift, 0.0))
        acc = acc * alpha[:, None]
        m = m_sink
    l = tl.where(empty, 1.0, l)
    out = v_descale * acc / l[:, None]  # (bq, E), times the value's descale (1.0 if not fp8)
    lse = tl.where(empty, float("-inf"), m + tl.log(l))  # (bq,)
    tl.store(Lse + bh * L + rows, lse, mask=row_ok)
    # 6. (end) to the output dtype: the query's, bfloat16 for an fp8 query.
    o_ptrs = Out + o_off + h * stride_oh + rows[:, None] * stride_ol + e[None, :] * stride_oe
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & e_ok)


#: True when the kernel runs in Triton's interpreter (TRITON_INTERPRET=1 when triton was
#: imported): with NumPy on the host, for CPU tensors, and CUDA tensors copied there and back.
INTERPRETED: bool = isinstance(_flash_forward_kernel, InterpretedFunction)


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")  # torch.bfloat16 -> "bfloat16"


def _validate(query, key, value, **keywords) -> AttentionDims:
    """The contract's validation (attention_spec), then this kernel's own limit: no float64."""
    dims = check_attention(query, key, value, **keywords)  # value: NO_VALUE for weights
    # fp8 is taken, in the contract's combinations (check_attention refuses the others).
    if query.dtype not in KERNEL_DTYPES and query.dtype not in FP8_DTYPES:
        supported = ", ".join([*KERNEL_DTYPES.values(), "float8_e4m3fn", "float8_e5m2"])
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


def _batch_offsets(
    tensors: list[tuple[torch.Tensor | None, int]], batch: tuple[int, ...]
) -> torch.Tensor:
    """``(B, len(tensors))`` int64: the element offset of each flattened batch element in each
    tensor (0 for None). Each entry is a tensor ``(*batch_t, <core>)`` and the number of its
    core axes (3 for query ``(..., H, L, D)``, 1 for segment ids ``(..., L)``), with
    ``batch_t`` broadcastable to ``batch``; an axis it lacks or has of size 1 contributes
    nothing (stride 0)."""
    columns = []
    for t, core in tensors:
        offset = torch.zeros(batch, dtype=torch.int64)
        if t is not None:
            t_batch = t.shape[:-core]
            for axis in range(1, len(t_batch) + 1):  # right-aligned, as broadcasting is
                n, stride = t_batch[-axis], t.stride(-core - axis)
                if n > 1:
                    position = [1] * len(batch)
                    position[-axis] = n
                    offset = offset + torch.arange(n).view(position) * stride
        columns.append(offset.reshape(-1))
    return torch.stack(columns, dim=1)  # (B, 8)


def _per_batch_head(
    x: torch.Tensor | float | None, batch: tuple[int, ...], heads: int, device: torch.device
) -> torch.Tensor:
    """A heads-first descale (None, a number, or float32 broadcastable to ``(..., heads)``) as
    float32 ``(B, heads)``, contiguous: one factor per batch element and head."""
    x = 1.0 if x is None else x
    x = torch.as_tensor(x, dtype=torch.float32, device=device)
    return x.broadcast_to((*batch, heads)).reshape(math.prod(batch), heads).contiguous()


def _forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dims: AttentionDims,
    causal_alignment: str,
    mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    q_segment_ids: torch.Tensor | None,
    kv_segment_ids: torch.Tensor | None,
    sinks: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    block_q: int,
    block_k: int,
    q_descale: torch.Tensor | float | None = None,
    k_descale: torch.Tensor | float | None = None,
    v_descale: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel on validated inputs; returns the output ``(..., H, L, E)`` (the
    query's dtype, bfloat16 for an fp8 query) and the row log-sum-exp ``(..., H, L)``
    (float32). fp8 key/value (and query) go into the kernel as fp8, with their descales
    ``q_descale`` broadcastable to ``(..., H)`` and ``k_descale``/``v_descale`` to ``(..., K)``."""
    fp8 = key.dtype in FP8_DTYPES
    out_dtype = torch.bfloat16 if query.dtype in FP8_DTYPES else query.dtype
    out = torch.empty(dims.output_shape, dtype=out_dtype, device=query.device)
    lse = torch.full((*dims.batch, dims.H, dims.L), -math.inf, device=query.device)
    if out.numel() == 0:  # L = 0, E = 0 or an empty batch: nothing to launch
        return out, lse
    H, L, S = dims.H, dims.L, dims.S
    # Mask and bias as (..., H, L, S) views, segment ids as (..., L) and (..., S): stride 0
    # along every broadcast axis, no copy. bias, sinks and slopes are taken to float32, the
    # compute dtype, first (SEMANTICS.md v2); segment ids to int64, which holds any of them.
    scores = dims.scores_shape
    mask_v = None if mask is None else mask.view(torch.uint8).expand(scores)
    bias_v = None if bias is None else bias.to(torch.float32).expand(scores)
    q_seg = kv_seg = None
    if q_segment_ids is not None:
        q_seg = q_segment_ids.to(torch.int64).expand(*dims.batch, L)
        kv_seg = kv_segment_ids.to(torch.int64).expand(*dims.batch, S)
    sinks_f = None if sinks is None else sinks.to(torch.float32).contiguous()  # (H,)
    slopes_f = None if alibi_slopes is None else alibi_slopes.to(torch.float32).contiguous()
    operands = [(query, 3), (key, 3), (value, 3), (out, 3), (mask_v, 3), (bias_v, 3),
                (q_seg, 1), (kv_seg, 1)]
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
    # fp8 is converted to float32 in the kernel (exact), and the dots take float32.
    bf16_interpreted = INTERPRETED and query.dtype == torch.bfloat16
    dot_dtype = torch.float32 if bf16_interpreted or fp8 else query.dtype
    # Weights before the value product: rounded to the input dtype (FlashAttention's
    # practice); kept in float32 for fp8, as in the token-major kernel. FlashAttention 3
    # rounds them to the value's fp8 format, but before the division by the row sum; the
    # contract's kernel `bound` rounds the normalized weights, and that practice here failed
    # it (measured: sdpa.fp8.all.per_head.float8_e5m2 1.17x, sdpa.fp8.all.sinks.gqa.h8_k1
    # 1.13x), while float32 weights meet the strict bound on every fp8 run.
    p_dtype = tl.float32 if fp8 else _DOT_DTYPES[query.dtype]
    descales = [
        _per_batch_head(x, dims.batch, heads, query.device)
        for x, heads in ((q_descale, H), (k_descale, dims.K), (v_descale, dims.K))
    ]  # (B, H), (B, K), (B, K) float32
    left, right = dims.window if dims.window is not None else (None, None)
    _flash_forward_kernel[grid](
        query, key, value, out, lse,
        query if mask_v is None else mask_v,  # an unused pointer still needs a tensor
        query if bias_v is None else bias_v,
        offsets if q_seg is None else q_seg,
        offsets if kv_seg is None else kv_seg,
        lse if sinks_f is None else sinks_f,
        lse if slopes_f is None else slopes_f,
        offsets, *descales,
        *strides(query), *strides(key), *strides(value), *strides(out),
        *strides(mask_v), *strides(bias_v),
        0 if q_seg is None else q_seg.stride(-1), 0 if kv_seg is None else kv_seg.stride(-1),
        H, dims.G, L, S, dims.D, dims.E,
        dims.scale, 1.0 if dims.softcap is None else dims.softcap,
        causal_offset(L, S, causal_alignment),
        left or 0, right or 0,
        block_q, block_k,
        TILE_Q=_tile(block_q), TILE_K=_tile(block_k), TILE_D=_tile(dims.D), TILE_E=_tile(dims.E),
        HAS_MASK=mask is not None, HAS_BIAS=bias is not None,
        HAS_SOFTCAP=dims.softcap is not None, IS_CAUSAL=dims.is_causal,
        HAS_LEFT=left is not None, HAS_RIGHT=right is not None,
        HAS_SEGMENTS=q_seg is not None, HAS_SINKS=sinks is not None,
        HAS_ALIBI=alibi_slopes is not None, HAS_DESCALE=fp8,
        DOT_DTYPE=_DOT_DTYPES[dot_dtype],
        DOT_PRECISION="ieee" if dot_dtype == torch.float32 else "tf32", P_DTYPE=p_dtype,
    )
    return out, lse


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
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    q_descale: torch.Tensor | float | None = None,
    k_descale: torch.Tensor | float | None = None,
    v_descale: torch.Tensor | float | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The contract's attention output ``(..., H, L, E)``, computed by the Triton kernel.

    Args:
        query: ``(..., H, L, D)``; float32, float16 or bfloat16, on CUDA (compiled kernel) or
            on the CPU (Triton's interpreter); or fp8 (``float8_e4m3fn``/``float8_e5m2``) with
            fp8 key and value of the same format (FlashAttention 3's form).
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key, or key and value both fp8
            under a float query (an fp8 cache). fp8 is loaded and converted in the kernel.
        mask: boolean, broadcastable to ``(..., H, L, S)``; True = may attend.
        bias: floating, broadcastable to ``(..., H, L, S)``; added to the scores, may hold -inf.
        is_causal: apply the causal rule of ``causal_alignment`` ("top_left" | "bottom_right").
        scale: score scale, default ``1/sqrt(D)``.
        softcap: if given, scores become ``softcap * tanh(scores / softcap)`` before bias/mask.
        window: ``(left, right)``, each an int >= 0 or None (unbounded): query i sees keys
            ``i + offset - left .. i + offset + right``, on ``causal_alignment``'s diagonal.
        q_segment_ids, kv_segment_ids: integers broadcastable to ``(..., L)`` and ``(..., S)``;
            a query attends only keys of its own segment (packed documents).
        sinks: ``(H,)`` floating: one extra logit per query head in the softmax's denominator,
            with no value.
        alibi_slopes: ``(H,)`` floating: ``-slope[h] * |i + offset - j|`` added to the scores.
        q_descale: for an fp8 query, float32 broadcastable to ``(..., H)``; k_descale and
            v_descale: for fp8 key/value, broadcastable to ``(..., K)``. An fp8 x stands for
            ``float(x) * descale``: q_descale * k_descale multiply the scores (query head h
            reads the k_descale of its key/value head), v_descale the output.
        block_q: query rows per program (any integer >= 1; it need not divide L).
        block_k: keys per step of a program's loop (any integer >= 1; it need not divide S).
        return_lse: also return the row log-sum-exp of the final scores, the sink included,
            ``(..., H, L)`` float32; ``-inf`` for a row with no allowed key.

    Returns the output in the query's dtype (bfloat16 for an fp8 query; rows with no allowed
    key are zeros), or ``(output, lse)``.

    Raises the contract's errors (attention_spec) before any launch, ConfigError for a block
    size < 1, and DTypeError ``unsupported_dtype`` for float64.
    """
    dims = _validate(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale,
    )
    check_block_sizes(block_q, block_k)
    return_lse = check_flag("return_lse", return_lse)
    out, lse = _forward(
        query, key, value, dims, causal_alignment, mask, bias, q_segment_ids, kv_segment_ids,
        sinks, alibi_slopes, block_q, block_k, q_descale, k_descale, v_descale,
    )
    return (out, lse) if return_lse else out


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
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    q_descale: torch.Tensor | float | None = None,
    k_descale: torch.Tensor | float | None = None,
    v_descale: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """:func:`flash_attention` with the default blocks (``BLOCK_Q`` x ``BLOCK_K``)."""
    return flash_attention(
        query, key, value, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale,
    )


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
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    q_descale: torch.Tensor | float | None = None,
    k_descale: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """The weights ``(..., H, L, S)`` as the kernel computes them: the kernel run with the
    identity as value (E = S, one value column per key), so that output row i is weight row i.

    For checking the kernel weight by weight; it costs an ``(S, S)`` identity, shared by every
    head and batch element (stride 0). fp8 query/key with ``q_descale``/``k_descale`` as in
    :func:`flash_attention` (no value, no ``v_descale``): the identity is float32 then, so the
    weights are never rounded to fp8; bfloat16 for an fp8 query.
    """
    dims = _validate(
        query, key, NO_VALUE, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, scale=scale, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale,
    )
    K, S = dims.K, dims.S
    eye_dtype = torch.float32 if key.dtype in FP8_DTYPES else query.dtype
    identity = torch.eye(S, dtype=eye_dtype, device=query.device).expand(K, S, S)  # (K, S, E=S)
    dims = dataclasses.replace(dims, E=S)
    out, _ = _forward(
        query, key, identity, dims, causal_alignment, mask, bias, q_segment_ids,
        kv_segment_ids, sinks, alibi_slopes, BLOCK_Q, BLOCK_K, q_descale, k_descale,
    )
    return out


# -- contract v3: packed (varlen) rows and paged key/value caches, fp8 inputs -----------------


@triton.jit
def _token_major_kernel(
    Q, K, V, Out, CuQ, CuK, SeqLens, BlockTable, Sinks, Slopes, QDs, KDs, VDs,  # pointers
    stride_qt, stride_qh, stride_qd,  # query (T, H, D), in elements
    stride_kp, stride_kt, stride_kh, stride_kd,  # key: varlen (Tk, K, D), stride_kp = 0;
    stride_vp, stride_vt, stride_vh, stride_ve,  #      paged (P, page_size, K, D); value alike
    stride_ot, stride_oh, stride_oe,  # output (T, H, E)
    stride_bt,  # block_table (N, max_pages): its row stride
    H, K_heads, G, D, E, page_size,  # sizes; query head h reads key/value head h // G
    scale, softcap, left, right,  # window=(left, right) on the sequence's own diagonal
    block_q, block_k,
    TILE_Q: tl.constexpr, TILE_K: tl.constexpr, TILE_D: tl.constexpr, TILE_E: tl.constexpr,
    PAGED: tl.constexpr, BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SINKS: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DESCALE: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, P_DTYPE: tl.constexpr,
):
    # One program: block_q query rows (i0 .. i0 + block_q - 1, positions within the sequence)
    # of query head h of sequence n. Varlen: the sequence's query rows are cu_q[n] ..
    # cu_q[n+1] - 1 and its keys cu_k[n] .. cu_k[n+1] - 1 (no other sequence's key is ever
    # loaded). Paged: its L_n queries are its last positions (bottom-right) and key j is slot
    # j % page_size of page block_table[n, j // page_size], read here entry by entry.
    # QDs (N, H), KDs and VDs (N, K): the fp8 descales, float32 (1.0 when not fp8).
    nh = tl.program_id(0)
    n = nh // H
    h = nh % H
    i0 = tl.program_id(1) * block_q
    kv = h // G  # contiguous groups: heads kv*G .. kv*G + G - 1 share key/value head kv
    q_start = tl.load(CuQ + n)
    L = tl.load(CuQ + n + 1) - q_start  # L_n
    if PAGED:
        S = tl.load(SeqLens + n)  # S_n, the new tokens included
        k_start = 0
    else:
        k_start = tl.load(CuK + n)
        S = tl.load(CuK + n + 1) - k_start
    offset = 0
    if BOTTOM_RIGHT:
        offset = S - L  # key i + offset is row i's diagonal

    lane_q = tl.arange(0, TILE_Q)
    lane_k = tl.arange(0, TILE_K)
    d = tl.arange(0, TILE_D)
    e = tl.arange(0, TILE_E)
    rows = i0 + lane_q  # (bq,) positions i within the sequence
    row_ok = (lane_q < block_q) & (rows < L)
    d_ok = d[None, :] < D  # (1, D)
    e_ok = e[None, :] < E  # (1, E)
    q_rows = q_start + rows  # (bq,) packed rows
    q_ptrs = Q + h * stride_qh + q_rows[:, None] * stride_qt + d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok, other=0.0).to(DOT_DTYPE)  # (bq, D)
    score_scale = scale
    v_descale = 1.0
    if HAS_DESCALE:  # 0. dequantize: an fp8 input is float(x) * descale, folded into the scale
        score_scale = scale * tl.load(QDs + n * H + h) * tl.load(KDs + n * K_heads + kv)
        v_descale = tl.load(VDs + n * K_heads + kv)
    if HAS_ALIBI:
        slope = tl.load(Slopes + h)

    m = tl.full((TILE_Q,), float("-inf"), tl.float32)  # running row max of the scores
    l = tl.full((TILE_Q,), 0.0, tl.float32)  # running row sum of exp(s - m)
    acc = tl.full((TILE_Q, TILE_E), 0.0, tl.float32)  # running sum of exp(s - m) @ value

    # 4. allowed, whole blocks: only this sequence's S_n keys, and of those only the causal
    #    and window bands of these rows (no block at all for a program past L_n).
    i_last = tl.minimum(i0 + block_q, L) - 1
    j_start = 0
    j_end = tl.where(i0 < L, S, 0)
    if IS_CAUSAL:
        j_end = tl.minimum(j_end, tl.maximum(0, i_last + offset + 1))
    if HAS_LEFT:
        j_start = tl.maximum(0, i0 + offset - left)
        j_start = tl.minimum(j_start, S)
        j_start -= j_start % block_k
    if HAS_RIGHT:
        j_end = tl.minimum(j_end, tl.maximum(0, i_last + offset + right + 1))
    for j0 in range(j_start, j_end, block_k):  # one block of the sequence's keys at a time
        cols = j0 + lane_k  # (bk,) key positions j within the sequence
        col_ok = (lane_k < block_k) & (cols < S)  # never a key past S_n
        if PAGED:  # key j: page block_table[n, j // page_size], slot j % page_size
            page = tl.load(BlockTable + n * stride_bt + cols // page_size, mask=col_ok, other=0)
            slot = cols % page_size
        else:  # key j: packed row cu_k[n] + j
            page = cols * 0
            slot = k_start + cols
        k_rows = page.to(tl.int64) * stride_kp + slot * stride_kt  # (bk,)
        v_rows = page.to(tl.int64) * stride_vp + slot * stride_vt
        k_ptrs = K + kv * stride_kh + k_rows[:, None] + d[None, :] * stride_kd
        k = tl.load(k_ptrs, mask=col_ok[:, None] & d_ok, other=0.0)  # (bk, D)

        # 1. scores = (query @ key^T) * scale (times q_descale * k_descale), float32.
        s = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * score_scale

        # 2. softcap, from exp in float64 as in _flash_forward_kernel.
        if HAS_SOFTCAP:
            t = tl.exp((2.0 * s / softcap).to(tl.float64))
            s = (softcap * (1.0 - 2.0 / (t + 1.0))).to(tl.float32)

        # 3. ALiBi: -slope[h] * |i + offset - j| at positions within the sequence.
        if HAS_ALIBI:
            distance = tl.abs(rows[:, None] + offset - cols[None, :]).to(tl.float32)
            s += -slope * distance

        # 4. allowed(i, j) = the sequence's own keys AND causal AND window.
        allowed = row_ok[:, None] & col_ok[None, :]
        if IS_CAUSAL:
            allowed &= cols[None, :] <= rows[:, None] + offset
        if HAS_LEFT:
            allowed &= cols[None, :] >= rows[:, None] + offset - left
        if HAS_RIGHT:
            allowed &= cols[None, :] <= rows[:, None] + offset + right
        s = tl.where(allowed, s, float("-inf"))  # (bq, bk)

        # 5. online softmax, as in _flash_forward_kernel.
        m_new = tl.maximum(m, tl.max(s, 1))  # (bq,)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - shift)
        z = tl.minimum(s - shift[:, None], 0.0, propagate_nan=tl.PropagateNan.ALL)
        p = tl.exp(z)  # (bq, bk)
        l = l * alpha + tl.sum(p, 1)

        # 6. output, accumulated; value rows no row attends (unused slots: NaN) selected away.
        v_ptrs = V + kv * stride_vh + v_rows[:, None] + e[None, :] * stride_ve
        v = tl.load(v_ptrs, mask=col_ok[:, None] & e_ok, other=0.0)  # (bk, E)
        attended = tl.max(allowed.to(tl.int32), 0) != 0  # (bk,)
        v = tl.where(attended[:, None], v.to(DOT_DTYPE), 0.0).to(DOT_DTYPE)
        p = p.to(P_DTYPE).to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=DOT_PRECISION)
        m = m_new

    # 5. (end) the sink in the denominator (no descale, no scale); rows with no key give 0.
    empty = l == 0.0
    if HAS_SINKS:
        sink = tl.load(Sinks + h)
        m_sink = tl.maximum(m, sink)
        shift = tl.where(m_sink == float("-inf"), 0.0, m_sink)
        alpha = tl.exp(m - shift)
        l = l * alpha + tl.exp(tl.minimum(sink - shift, 0.0))
        acc = acc * alpha[:, None]
    l = tl.where(empty, 1.0, l)
    out = acc * v_descale / l[:, None]  # (bq, E)
    o_ptrs = Out + h * stride_oh + q_rows[:, None] * stride_ot + e[None, :] * stride_oe
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & e_ok)


#: The fp8 formats the token-major kernel loads and converts itself (contract v3).
FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)


def _check_token_major_dtype(query: torch.Tensor, key: torch.Tensor) -> None:
    """This kernel's limit after the contract's validation: no float64 (fp8 is taken)."""
    if query.dtype in KERNEL_DTYPES or query.dtype in FP8_DTYPES:
        return
    supported = ", ".join([*KERNEL_DTYPES.values(), "float8_e4m3fn", "float8_e5m2"])
    raise make_error(
        "unsupported_dtype",
        f"the Triton kernel computes {supported}; got {_dtype_name(query)} "
        "(impl_torch computes float64)",
        expected=" | ".join(KERNEL_DTYPES.values()),
        actual=_dtype_name(query),
    )


def _per_sequence(x, N: int, heads: int, device: torch.device) -> torch.Tensor:
    """A descale (None, a number, or float32 ``()``, ``(heads,)``, ``(N, heads)``) as float32
    ``(N, heads)``, contiguous."""
    x = 1.0 if x is None else x
    x = torch.as_tensor(x, dtype=torch.float32, device=device)
    return x.broadcast_to((N, heads)).contiguous()


def _token_major(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor | None,
    seq_lens: torch.Tensor | None,
    block_table: torch.Tensor | None,
    *,
    H: int, K: int, D: int, E: int, scale: float, softcap: float | None, is_causal: bool,
    bottom_right: bool, window, sinks, alibi_slopes, q_descale, k_descale, v_descale,
) -> torch.Tensor:
    """Launch :func:`_token_major_kernel` on validated inputs; returns ``(T, H, E)``.
    ``key``/``value``: packed ``(Tk, K, D|E)`` (varlen) or pages ``(P, page_size, K, D|E)``
    (paged, with ``seq_lens`` and ``block_table``)."""
    T, device = query.shape[0], query.device
    fp8 = key.dtype in FP8_DTYPES
    out_dtype = torch.bfloat16 if query.dtype in FP8_DTYPES else query.dtype
    out = torch.zeros((T, H, E), dtype=out_dtype, device=device)
    cu_q = cu_q.to(device=device, dtype=torch.int64).contiguous()
    N = cu_q.numel() - 1
    if out.numel() == 0 or N == 0:
        return out
    if query.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            "the Triton kernel compiles for CUDA tensors only; for CPU tensors set "
            "TRITON_INTERPRET=1 before triton is imported (it was imported without it)"
        )
    max_l = int((cu_q[1:] - cu_q[:-1]).max())
    paged = block_table is not None
    if paged:
        seq_lens = seq_lens.to(device=device, dtype=torch.int64).contiguous()
        block_table = block_table.to(device=device, dtype=torch.int64)
        cu_k = cu_q  # unused pointers
        page_size = key.shape[1]
        ks, vs = key.stride(), value.stride()
    else:
        cu_k = cu_k.to(device=device, dtype=torch.int64).contiguous()
        seq_lens = block_table = cu_q
        page_size = 1
        ks, vs = (0, *key.stride()), (0, *value.stride())
    # Dots: the input dtype with float32 accumulators; float32 for bfloat16 in the interpreter
    # (triton-lang/triton#11584) and for fp8 (converted in the kernel, exact in float32).
    bf16_interpreted = INTERPRETED and query.dtype == torch.bfloat16
    dot_dtype = torch.float32 if bf16_interpreted or fp8 else query.dtype
    # Weights before the value product: rounded to the input dtype (FlashAttention's
    # practice); kept in float32 for fp8 (the strict bound's computation).
    p_dtype = tl.float32 if fp8 else _DOT_DTYPES[query.dtype]
    left, right = window if window is not None else (None, None)
    sinks_f = None if sinks is None else sinks.to(device=device, dtype=torch.float32).contiguous()
    slopes_f = None if alibi_slopes is None else alibi_slopes.to(device=device, dtype=torch.float32)
    descales = [_per_sequence(x, N, heads, device) for x, heads in
                ((q_descale, H), (k_descale, K), (v_descale, K))]
    block_q = block_k = 16  # one tile: sequences are short in serving's decode and prefill
    grid = (N * H, max(1, triton.cdiv(max_l, block_q)))  # (sequence x head, query block)
    _token_major_kernel[grid](
        query, key, value, out, cu_q, cu_k, seq_lens, block_table,
        out if sinks_f is None else sinks_f, out if slopes_f is None else slopes_f.contiguous(),
        *descales,
        *query.stride(), *ks, *vs, *out.stride(),
        block_table.stride(0) if paged else 0,
        H, K, H // K, D, E, page_size,
        scale, 1.0 if softcap is None else softcap, left or 0, right or 0,
        block_q, block_k,
        TILE_Q=_tile(block_q), TILE_K=_tile(block_k), TILE_D=_tile(D), TILE_E=_tile(E),
        PAGED=paged, BOTTOM_RIGHT=bottom_right, HAS_SOFTCAP=softcap is not None,
        IS_CAUSAL=is_causal, HAS_LEFT=left is not None, HAS_RIGHT=right is not None,
        HAS_SINKS=sinks is not None, HAS_ALIBI=alibi_slopes is not None, HAS_DESCALE=fp8,
        DOT_DTYPE=_DOT_DTYPES[dot_dtype],
        DOT_PRECISION="ieee" if dot_dtype == torch.float32 else "tf32", P_DTYPE=p_dtype,
    )
    return out


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    q_descale: torch.Tensor | float | None = None,
    k_descale: torch.Tensor | float | None = None,
    v_descale: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Attention over N packed sequences ``(Tq, H, E)``, by :func:`_token_major_kernel`: one
    program per (query block, head) of one sequence, its key loop over that sequence's keys.

    Args:
        query: ``(Tq, H, D)``; key ``(Tk, K, D)``; value ``(Tk, K, E)``: float32, float16,
            bfloat16, or fp8 (``float8_e4m3fn``/``float8_e5m2``, loaded and converted in the
            kernel) as the contract allows.
        cu_seqlens_q, cu_seqlens_k: integer ``(N + 1,)``: sequence n is query rows
            ``[cu_q[n], cu_q[n+1])`` against key rows ``[cu_k[n], cu_k[n+1])``.
        is_causal, causal_alignment, window, scale, softcap, sinks, alibi_slopes: as in
            :func:`flash_attention`, on each sequence's own diagonal.
        q_descale, k_descale, v_descale: fp8 descales, ``()``, ``(H|K,)`` or ``(N, H|K)``.

    Returns the output in the query's dtype (bfloat16 for an fp8 query).
    """
    from attention_spec.varlen import check_varlen

    varlen = check_varlen(
        query, key, value, cu_seqlens_q, cu_seqlens_k, is_causal=is_causal,
        causal_alignment=causal_alignment, window=window, scale=scale, softcap=softcap,
        sinks=sinks, alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale,
    )
    _check_token_major_dtype(query, key)
    call = varlen.call
    return _token_major(
        query, key, value, cu_seqlens_q, cu_seqlens_k, None, None,
        H=varlen.H, K=varlen.K, D=varlen.D, E=varlen.E, scale=call.scale,
        softcap=call.softcap, is_causal=call.is_causal,
        bottom_right=call.causal_alignment == "bottom_right", window=call.window,
        sinks=sinks, alibi_slopes=alibi_slopes,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
    )


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    is_causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    q_descale: torch.Tensor | float | None = None,
    k_descale: torch.Tensor | float | None = None,
    v_descale: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Packed queries over a paged cache ``(T, H, E)``, by :func:`_token_major_kernel`: one
    program per (query block, head) of one sequence (a decode step: per query token), walking
    the sequence's pages through ``block_table`` inside the kernel (no gathered copy).

    Args:
        query: ``(T, H, D)``; sequence n's ``L_n`` queries are its last positions.
        key_cache: ``(P, page_size, K, D)``; value_cache: ``(P, page_size, K, E)``.
        block_table: integer ``(N, max_pages)``; entries past a sequence's pages never read.
        seq_lens: integer ``(N,)``; cu_seqlens_q: integer ``(N + 1,)``.
        is_causal, window, scale, softcap, sinks, alibi_slopes, q_descale, k_descale,
            v_descale: as in :func:`varlen_attention`, bottom-right.

    Returns the output in the query's dtype (bfloat16 for an fp8 query).
    """
    from attention_spec.paged import check_paged_attention

    call = check_paged_attention(
        query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, is_causal=is_causal,
        window=window, scale=scale, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
    )
    _check_token_major_dtype(query, key_cache)
    return _token_major(
        query, key_cache, value_cache, cu_seqlens_q, None, seq_lens, block_table,
        H=call.H, K=call.K, D=call.D, E=call.E, scale=call.scale, softcap=call.softcap,
        is_causal=call.is_causal, bottom_right=True, window=call.window, sinks=sinks,
        alibi_slopes=alibi_slopes, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
    )
