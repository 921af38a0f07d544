"""Tiled online-softmax ("flash") attention in PyTorch: tensor ops per block, autograd through it.

The contract of :func:`impl_torch.functional.scaled_dot_product_attention` (same keywords, same
validation and errors, fully masked rows are zeros), computed without ever holding the
``(..., H, L, S)`` scores: one block of ``block_q`` query rows meets one block of ``block_k`` keys
at a time, and a running row max ``m``, a running row sum ``l`` and an output accumulator ``acc``
carry what the earlier key blocks contributed (the online softmax). When a new block raises the
row max, what was summed under the old max is rescaled by ``exp(m_old - m_new)``; the division by
the row sum happens once, after the last key block. Under causal masking, key blocks that lie
entirely above the diagonal are never visited, so causal attention costs about half; only the
blocks a rule's boundary crosses are masked elementwise, and in those, key and value rows that
no row of the block may attend are zeroed (garbage there never reaches the output).

The same steps, numbers, names and comments as ``impl_torch/functional.py`` (steps 1-6) and as
``impl_numpy/flash.py`` and ``impl_jax/flash.py``; docs/FLASH.md puts the plain and tiled paths
side by side and gives the measured memory and time.

Training goes through a ``torch.autograd.Function`` (:class:`FlashAttention`): its forward runs
the tiled loops outside autograd and saves only the inputs, the output and the row
log-sum-exp ``lse``; its backward is FlashAttention-2's (Algorithm 2, in the forward's loop
order), which visits the blocks the forward visits, rebuilds each block's weights as
``P = exp(S - lse)`` and accumulates ``dQ``, ``dK`` and ``dV`` block by block. Autograd keeps
no block alive, so a training step needs O(L + S) memory beyond inputs, output and gradients
(plus one block). Inside the Function nothing is tracked, so the steps work in place, as in
NumPy.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim; ``bq`` and ``bk`` are the rows and keys of one block
(``block_q``/``block_k``, or fewer in the last block).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import NamedTuple

import torch

from attention_spec import (
    BLOCK_K,
    BLOCK_Q,
    AttentionCall,
    AttentionGrads,
    check_attention,
    check_flag,
    check_paged_attention,
    sequence_pages,
    tiled_blocks,
)
from attention_spec.rules import alibi, block_rules, causal, key_band
from attention_spec.rules import window as window_rule
from impl_torch.functional import (
    _allowed,
    _as_tensors,
    _attended,
    _cast,
    _compute_dtype,
    _converted,
    _dequantized,
    _output_dtype,
    _unattended_zeroed,
    _vjp_by_autograd,
)
from impl_torch.paged import _descaled

__all__ = [
    "BLOCK_K",
    "BLOCK_Q",
    "FlashAttention",
    "flash_attention",
    "flash_attention_vjp",
    "paged_flash_attention",
]

#: The blocks of a narrow band, ``(rows, widest)``, for ``attention_spec.tiled_blocks``: a call
#: whose causal and window bands leave each query row at most ``left + 1 + right`` keys, with
#: ``128 + left + right <= 512``, is tiled in blocks of 128 rows and their band's keys, so a
#: block computes few scores outside the band (the timings: docs/FLASH.md, "Block sizes").
BAND_BLOCKS: tuple[int, int] = (128, 512)


def _block(x: torch.Tensor | None, axis: int, start: int, stop: int) -> torch.Tensor | None:
    """``x[start:stop]`` along ``axis`` (-2: L, -1: S) of a mask or bias, which broadcasts to
    ``(..., H, L, S)`` (or of segment ids, ``(..., L)``, ``(..., S)``): an axis of size 1, or one
    it lacks, is left as it is and broadcasts."""
    if x is None or x.dim() < -axis or x.shape[axis] == 1:
        return x
    return x.narrow(axis, start, stop - start)


class _Blocks:
    """The tiling of one call, shared by the forward and the backward: which key blocks each
    block of query rows visits, and each visited block's steps 1-4.

    Built from the validated call and its arrays as :func:`_in_compute_dtype` makes them:
    ``q (..., H, L, D)``, ``k (..., K, S, D)``, ``v (..., K, S, E)``; mask, bias, segment ids,
    sinks and slopes (bias, sinks and slopes in the compute dtype).
    """

    def __init__(self, call: AttentionCall, x: _Arrays, block_q: int, block_k: int):
        self.call = call
        self.q, self.k, self.v = x.query, x.key, x.value
        self.mask, self.bias, self.sinks = x.mask, x.bias, x.sinks
        self.q_ids, self.kv_ids, self.slopes = x.q_ids, x.kv_ids, x.slopes
        self.block_q, self.block_k = block_q, block_k

    def query_blocks(self):
        """``(i0, i1)`` of each block of query rows, in order."""
        for i0 in range(0, self.call.L, self.block_q):
            yield i0, min(i0 + self.block_q, self.call.L)

    def key_blocks(self, i0: int, i1: int):
        """The key blocks rows ``[i0, i1)`` visit, ``(j0, j1, every)``. ``every``: every
        position of the block is allowed by causal, window and segments (only the mask remains).
        """
        call, offset = self.call, self.call.offset
        q_ids_rows = _block(self.q_ids, -1, i0, i1)  # (..., bq): this block's rows' segments
        # 4. allowed, whole blocks: the keys outside the causal and window bands of these rows
        #    are masked for every row, so their blocks are never visited (a window of W keys
        #    costs W, not S); a block whose segments cannot meet is skipped. The key blocks
        #    start at the band's first key, so a band of block_k keys is one block, not two,
        #    and the last one ends at the band's last key (past the diagonal, nothing is
        #    computed): every key of a block is allowed to some row by causal and window.
        lo, hi = key_band(call.is_causal, call.window, offset, i0, i1, call.S)
        for j0 in range(lo, hi, self.block_k):
            j1 = min(j0 + self.block_k, hi)
            kv_ids_blk = _block(self.kv_ids, -1, j0, j1)  # (..., bk)
            some, every = block_rules(
                call.is_causal, call.window, offset, i0, i1, j0, j1, q_ids_rows, kv_ids_blk
            )
            if some:
                yield j0, j1, bool(every)

    def scores(self, i0: int, i1: int, j0: int, j1: int, every: bool):
        """Steps 1-4 on the block of rows ``[i0, i1)`` and keys ``[j0, j1)``.

        Returns ``s (..., H, bq, bk)`` (-inf where not allowed), the block's key and value rows
        ``(..., K, bk, D|E)`` with the rows no row of the block attends zeroed, the bias block
        (or None) and, with softcap, ``tanh(s1 / softcap)`` of the step-1 scores ``s1`` (what
        the backward's softcap factor needs; None without softcap).
        """
        call, offset = self.call, self.call.offset
        H, K, G, D, bq, bk = call.H, call.K, call.G, call.D, i1 - i0, j1 - j0
        device = self.q.device
        i = torch.arange(i0, i1, device=device)[:, None]  # (bq, 1)
        j = torch.arange(j0, j1, device=device)[None, :]  # (1, bk)

        # 4. allowed, this block: the rules a boundary crosses, elementwise (mask AND causal AND
        #    window AND segment); a block inside every band needs none of them.
        mask_blk = _block(_block(self.mask, -2, i0, i1), -1, j0, j1)
        if every:
            allowed = mask_blk  # (..., bq|1, bk|1) or None
        else:
            q_ids_rows = _block(self.q_ids, -1, i0, i1)
            kv_ids_blk = _block(self.kv_ids, -1, j0, j1)
            allowed = _allowed(call, offset, i, j, mask_blk, q_ids_rows, kv_ids_blk)
        bias_blk = _block(_block(self.bias, -2, i0, i1), -1, j0, j1)
        #    Which key rows some row of the block attends: inside the band every key is
        #    attended as far as causal and window go, so only mask, segments and bias decide.
        banded = mask_blk is None and self.q_ids is None  # allowed is causal and window only
        attended = _attended(None if banded else allowed, bias_blk, (*call.batch, H, bq, bk), K)
        k_blk = _unattended_zeroed(self.k[..., j0:j1, :], attended)  # (..., K, bk, D)
        v_blk = _unattended_zeroed(self.v[..., j0:j1, :], attended)  # (..., K, bk, E)

        # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G: the G
        #    query heads of a group are G * bq rows against their one key head (no copy of the
        #    keys per query head).
        q_blk = self.q[..., i0:i1, :]  # (..., H, bq, D)
        q_blk = q_blk.reshape(*q_blk.shape[:-3], K, G * bq, D)  # (..., K, G*bq, D)
        s = q_blk @ k_blk.transpose(-2, -1)  # (..., K, G*bq, bk)
        s = s.view(*s.shape[:-3], H, bq, bk).mul_(call.scale)  # (..., H, bq, bk)
        if s.shape[:-3] != call.batch:  # a value with more batch than query and key
            s = s.expand(*call.batch, H, bq, bk).clone()

        # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
        tanh = None
        if call.softcap is not None:
            tanh = s.div_(call.softcap).tanh_()
            s = tanh * call.softcap

        # 3. additive terms: this block's slice of the bias, may hold -inf, and ALiBi's
        #    -slope[h] * |i + offset - j| at this block's rows and keys.
        if bias_blk is not None:
            s.add_(bias_blk)
        if self.slopes is not None:
            s.add_(alibi(self.slopes[:, None, None], i, j, offset))  # (H, bq, bk)

        # 4. allowed: s = -inf where allowed(i, j) is False, in this block.
        if allowed is not None:
            s.masked_fill_(~allowed, float("-inf"))
        return s, k_blk, v_blk, bias_blk, tanh


def _forward(blocks: _Blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """The tiled forward: ``(output (..., H, L, E), lse (..., H, L))`` in the compute dtype."""
    call, q, sinks = blocks.call, blocks.q, blocks.sinks
    H, K, G, L, E = call.H, call.K, call.G, call.L, call.E
    out = q.new_empty((*call.batch, H, L, E))  # (..., H, L, E), one query block at a time
    lse = q.new_empty((*call.batch, H, L))  # (..., H, L)
    for i0, i1 in blocks.query_blocks():  # one block of query rows at a time
        bq = i1 - i0
        m = q.new_full((*call.batch, H, bq, 1), float("-inf"))  # running row max of the scores
        l = q.new_zeros((*call.batch, H, bq, 1))  # running row sum of exp(s - m)
        acc = q.new_zeros((*call.batch, H, bq, E))  # running sum of exp(s - m) @ value
        for j0, j1, every in blocks.key_blocks(i0, i1):  # one block of keys at a time
            # 1.-4. this block's scores (blocks.scores: the steps written out, as in sdpa)
            s, _, v_blk, _, _ = blocks.scores(i0, i1, j0, j1, every)  # (..., H, bq, bk)

            # 5. online softmax: raise the running max, rescale what was summed under the old
            #    one by exp(m_old - m_new), add this block's exp(s - m_new).
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (..., H, bq, 1)
            shift = torch.where(m_new == float("-inf"), 0.0, m_new)  # nothing allowed yet: not NaN
            alpha = torch.exp(m - shift)  # (..., H, bq, 1); 0 while m is still -inf
            p = s.sub_(shift).clamp_(max=0.0).exp_()  # (..., H, bq, bk); exp(s - max) <= 1
            l = alpha * l + p.sum(dim=-1, keepdim=True)

            # 6. output, accumulated: acc = alpha * acc + p @ value, per group (G * bq rows).
            pv = p.reshape(*p.shape[:-3], K, G * bq, j1 - j0) @ v_blk  # (..., K, G*bq, E)
            acc = acc.mul_(alpha).add_(pv.view(*pv.shape[:-3], H, bq, E))  # (..., H, bq, E)
            m = m_new
            del s, p  # this block's scores go before the next block's are made

        # 5. (end) the sink joins the denominator once, as one more logit with no value; then
        #    divide by the row sum once, after the last key block. A row with no allowed key
        #    has l = 0 and acc = 0: 0 / 1 = 0 (sink or not), and its log-sum-exp is -inf.
        empty = l == 0.0  # (..., H, bq, 1): rows that saw no allowed key
        if sinks is not None:
            m_sink = torch.maximum(m, sinks[:, None, None])  # (..., H, bq, 1)
            shift = torch.where(m_sink == float("-inf"), 0.0, m_sink)
            alpha = torch.exp(m - shift)
            l = alpha * l + (sinks[:, None, None] - shift).clamp(max=0.0).exp()
            acc, m = alpha * acc, m_sink
        l = torch.where(empty, 1.0, l)
        out[..., i0:i1, :] = acc / l  # (..., H, bq, E)
        lse[..., i0:i1] = torch.where(empty, float("-inf"), m + torch.log(l)).squeeze(-1)
    return out, lse


def _backward(blocks: _Blocks, out, lse, do):
    """The tiled backward (FlashAttention-2, Algorithm 2, in the forward's loop order):
    ``(dQ, dK, dV, dbias, dsinks)`` in the compute dtype, dQ ``(..., H, L, D)``, dK and dV
    ``(..., K, S, D|E)`` at the call's batch, dbias of the bias's shape (or None), dsinks
    ``(H,)`` (or None).

    ``out (..., H, L, E)`` and ``lse (..., H, L)`` are the forward's, ``do (..., H, L, E)``
    the cotangent of the output. For each block of query rows, ``D_i = rowsum(dO_i * O_i)``;
    for each key block the forward visited, its weights are rebuilt from the row log-sum-exp,
    ``P = exp(S - lse)``, and the steps of the plain backward run on the block: ``dV += P^T dO``,
    ``dP = dO V^T``, ``dS = P * (dP - D)``, ``dQ += dS K``, ``dK += dS^T Q``.
    """
    call, q, sinks = blocks.call, blocks.q, blocks.sinks
    H, K, G, L, S, D, E = call.H, call.K, call.G, call.L, call.S, call.D, call.E
    dq = q.new_zeros((*call.batch, H, L, D))  # (..., H, L, D), one query block at a time
    dk = q.new_zeros((*call.batch, K, S, D))  # (..., K, S, D), accumulated over query blocks
    dv = q.new_zeros((*call.batch, K, S, E))  # (..., K, S, E), likewise
    dbias = None if blocks.bias is None else torch.zeros_like(blocks.bias)  # the bias's shape
    dsinks = None if sinks is None else q.new_zeros((*call.batch, H, L))  # per row, summed last
    for i0, i1 in blocks.query_blocks():  # one block of query rows at a time
        bq = i1 - i0
        #    Grouped as the forward's matmuls are: the G * bq rows of a group's query heads
        #    against their one key/value head, (..., K, G*bq, .).
        do_blk = do[..., i0:i1, :].reshape(*call.batch, K, G * bq, E)  # (..., K, G*bq, E)
        o_blk = out[..., i0:i1, :].reshape(*call.batch, K, G * bq, E)
        delta = (do_blk * o_blk).sum(dim=-1, keepdim=True)  # (..., K, G*bq, 1): dO_i . O_i
        row_lse = lse[..., i0:i1, None]  # (..., H, bq, 1)
        shift = torch.where(row_lse == float("-inf"), 0.0, row_lse)  # a row with no key: P = 0
        q_blk = q[..., i0:i1, :]  # (..., H, bq, D)
        q_blk = q_blk.reshape(*q_blk.shape[:-3], K, G * bq, D)  # (..., K, G*bq, D)

        # 5. (end) the sink: dsink_h = -sum_i w_sink,i (dO_i . O_i), w_sink,i = exp(sink - lse_i).
        if sinks is not None:
            w_sink = (sinks[:, None, None] - shift).clamp(max=0.0).exp()  # (..., H, bq, 1)
            dsinks[..., i0:i1] = -(w_sink * delta.view(w_sink.shape)).squeeze(-1)

        for j0, j1, every in blocks.key_blocks(i0, i1):  # the blocks the forward visited
            s, k_blk, v_blk, bias_blk, tanh = blocks.scores(i0, i1, j0, j1, every)
            bk = j1 - j0

            # 5. the block's weights, rebuilt from the row log-sum-exp: P = exp(S - lse).
            p = s.sub_(shift).clamp_(max=0.0).exp_()  # (..., H, bq, bk); P <= 1
            p = p.view(*call.batch, K, G * bq, bk)  # (..., K, G*bq, bk)

            # 6. output:  dV += P^T dO (summed over the group);  dP = dO V^T.
            dv[..., j0:j1, :] += p.transpose(-2, -1) @ do_blk  # (..., K, bk, E): G*bq rows summed
            dp = do_blk @ v_blk.transpose(-2, -1)  # (..., K, G*bq, bk)

            # 5. softmax:  dS = P * (dP - D); zero wherever P is (masked, -inf bias, no key).
            ds = dp.sub_(delta).mul_(p)  # (..., K, G*bq, bk)

            # 3. additive terms:  dbias += dS, summed to the bias block's shape.
            if dbias is not None:
                ds_h = ds.view(*call.batch, H, bq, bk)  # (..., H, bq, bk)
                _block(_block(dbias, -2, i0, i1), -1, j0, j1).add_(ds_h.sum_to_size(bias_blk.shape))

            # 2. softcap:  dS *= 1 - tanh^2(s / softcap).
            if tanh is not None:
                ds = ds * (1.0 - tanh * tanh).view(*tanh.shape[:-3], K, G * bq, bk)

            # 1. scores:  dQ += dS K * scale;  dK += dS^T Q * scale (summed over the group).
            dq_blk = (ds @ k_blk).mul_(call.scale)  # (..., K, G*bq, D)
            dq[..., i0:i1, :] += dq_blk.view(*dq_blk.shape[:-3], H, bq, D)  # (..., H, bq, D)
            dk[..., j0:j1, :] += (ds.transpose(-2, -1) @ q_blk).mul_(call.scale)  # (..., K, bk, D)
            del s, p, dp, ds  # this block's tensors go before the next block's are made

    if dsinks is not None:  # (..., H, L) -> (H,); L may be 0
        dsinks = dsinks.sum(dim=(*range(len(call.batch)), -1))
    return dq, dk, dv, dbias, dsinks


class _Arrays(NamedTuple):
    """The arrays of one tiled call (None where not given): ``query (..., H, L, D)``,
    ``key (..., K, S, D)``, ``value (..., K, S, E)``, ``bias`` (broadcastable to
    ``(..., H, L, S)``) and ``sinks (H,)``, the differentiated ones; ``mask``, the segment ids
    ``q_ids (..., L)`` and ``kv_ids (..., S)``, and ALiBi's ``slopes (H,)``."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    bias: torch.Tensor | None
    sinks: torch.Tensor | None
    mask: torch.Tensor | None
    q_ids: torch.Tensor | None
    kv_ids: torch.Tensor | None
    slopes: torch.Tensor | None


def _arrays(query, key, value, keywords: Mapping[str, torch.Tensor | None]) -> _Arrays:
    """The :class:`_Arrays` of a call: query, key, value and its array ``keywords`` by name."""
    return _Arrays(
        query, key, value, keywords["bias"], keywords["sinks"], keywords["mask"],
        keywords["q_segment_ids"], keywords["kv_segment_ids"], keywords["alibi_slopes"],
    )


def _in_compute_dtype(x: _Arrays, call: AttentionCall) -> _Arrays:
    """``x`` as the loops read it: query, key, value, bias, sinks and slopes in the compute
    dtype (mask and segment ids as they are)."""
    ct = _compute_dtype(x.query.dtype)
    return x._replace(
        query=x.query.to(ct), key=x.key.to(ct), value=x.value.to(ct), bias=_cast(x.bias, ct),
        sinks=_cast(x.sinks, ct), slopes=_cast(x.slopes, ct),
    )


class _Tiling(NamedTuple):
    """What the loops need besides the arrays: the validated call (its sizes, causal offset
    and keywords) and the block sizes."""

    call: AttentionCall
    block_q: int
    block_k: int

    @property
    def blocks(self) -> tuple[int, int]:
        """``(block_q, block_k)``."""
        return self.block_q, self.block_k


class FlashAttention(torch.autograd.Function):
    """The tiled attention as one autograd node: the forward saves the inputs, the output and
    ``lse`` only; the backward recomputes every block it needs (:func:`_backward`).

    ``apply(query, key, value, bias, sinks, mask, q_ids, kv_ids, slopes, tiling)`` (the fields
    of :class:`_Arrays`, then a :class:`_Tiling`) returns ``(output in the input dtype, lse in
    the compute dtype)``. Differentiable: query, key, value, bias, sinks.
    """

    @staticmethod
    def forward(ctx, query, key, value, bias, sinks, mask, q_ids, kv_ids, slopes, tiling):
        x = _Arrays(query, key, value, bias, sinks, mask, q_ids, kv_ids, slopes)
        blocks = _Blocks(tiling.call, _in_compute_dtype(x, tiling.call), *tiling.blocks)
        out, lse = _forward(blocks)  # (..., H, L, E), (..., H, L), compute dtype
        ctx.save_for_backward(*x, out, lse)
        ctx.tiling = tiling
        ctx.mark_non_differentiable(lse)
        return out.to(query.dtype), lse

    @staticmethod
    def backward(ctx, grad_output, _grad_lse):
        *arrays, out, lse = ctx.saved_tensors
        x, tiling = _Arrays(*arrays), ctx.tiling
        blocks = _Blocks(tiling.call, _in_compute_dtype(x, tiling.call), *tiling.blocks)
        do = grad_output.to(out.dtype)  # (..., H, L, E) in the compute dtype
        dq, dk, dv, dbias, dsinks = _backward(blocks, out, lse, do)

        # The gradient of a broadcast input is summed over its broadcast axes; each in its dtype.
        def back(grad, given):
            return None if given is None else grad.sum_to_size(given.shape).to(given.dtype)

        grads = (back(dq, x.query), back(dk, x.key), back(dv, x.value), back(dbias, x.bias),
                 back(dsinks, x.sinks))
        return (*grads, None, None, None, None, None)  # mask, segment ids, slopes, tiling


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
    block_q: int | None = None,
    block_k: int | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``scaled_dot_product_attention`` computed block by block, shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes, q_descale, k_descale, v_descale: as in
            :func:`impl_torch.functional.scaled_dot_product_attention` (fp8 inputs,
            Contract v3: dequantized first, step 0; the output of an fp8 query is bfloat16).
        block_q: query rows per block (any integer >= 1; it need not divide L, and may exceed it);
            None: the default, ``attention_spec.tiled_blocks``: ``BLOCK_Q``, or fewer rows
            under a narrow window (``BAND_BLOCKS``).
        block_k: keys per block (likewise for S); None: ``BLOCK_K``, or a narrow window's band.
        return_lse: also return the row log-sum-exp of the final scores (after softcap, the
            additive terms and every rule, the sink included), ``lse = log(sum_j exp(s_ij)
            [+ exp(sink)])`` of shape ``(..., H, L)`` in the compute dtype (float64 for float64
            input, else float32); ``-inf`` for a row with no allowed key. It is what a backward
            pass needs to rebuild the weights: ``exp(s - lse)``.

    Returns the output in the query's dtype (rows with no allowed key are zeros, with zero
    gradient), or ``(output, lse)`` when ``return_lse``. Key blocks outside the causal and
    window bands are never visited, blocks whose segments cannot meet are skipped, and only the
    blocks a rule's boundary crosses are masked elementwise. Differentiable in query, key,
    value, bias and sinks through :class:`FlashAttention`, in O(L + S) memory.

    Raises the errors of ``scaled_dot_product_attention``, and ConfigError for a block size < 1.
    """
    query, key, value, kw = _converted(query, key, value, given=locals())
    call = check_attention(query, key, value, **kw)
    block_q, block_k = tiled_blocks(BAND_BLOCKS, block_q, block_k, call.is_causal, call.window)
    return_lse = check_flag("return_lse", return_lse)
    # 0. dequantize: an fp8 input is float32 times its descale (the contract's float(x) * d);
    #    the steps below then run in float32, and the result is bfloat16 for an fp8 query.
    out_dtype = _output_dtype(query.dtype)
    query = _dequantized(query, "q_descale", call, kw)
    key, value = (
        _dequantized(key, "k_descale", call, kw),
        _dequantized(value, "v_descale", call, kw),
    )
    x = _arrays(query, key, value, kw)
    out, lse = FlashAttention.apply(*x, _Tiling(call, block_q, block_k))
    out = out.to(out_dtype)  # the input dtype (bfloat16 for fp8)
    return (out, lse) if return_lse else out  # lse: (..., H, L) in the compute dtype


def flash_attention_vjp(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    grad_output: torch.Tensor,
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
    block_q: int | None = None,
    block_k: int | None = None,
) -> AttentionGrads:
    """The gradients of ``<flash_attention(...), grad_output>``, by autograd through
    :class:`FlashAttention` (whose backward is the tiled one).

    Args: those of :func:`flash_attention` (without ``return_lse``), and ``grad_output``
        ``(..., H, L, E)``, the cotangent ``dO`` of the output (its exact shape).

    Returns ``AttentionGrads(query, key, value, bias, sinks)`` as
    :func:`impl_torch.functional.scaled_dot_product_attention_vjp` does.
    """
    tiled = functools.partial(flash_attention, block_q=block_q, block_k=block_k)
    return _vjp_by_autograd(
        tiled, given=locals(),
        # the block sizes are checked before grad_output, as NumPy's flash_attention_vjp does
        checks=(lambda: tiled_blocks(BAND_BLOCKS, block_q, block_k, False, None),),
    )


# ---------------------------------------------------------------------------------------------
# Paged key/value caches (Contract v3): the tiled read, each sequence's own pages in blocks
# ---------------------------------------------------------------------------------------------


def paged_flash_attention(
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
    block_k: int | None = None,
) -> torch.Tensor:
    """:func:`impl_torch.paged.paged_attention`, read block by block: ``(T, H, E)``; each
    sequence reads its own pages, a block of whole pages at a time, and an fp8 cache is
    dequantized as it is read.

    The schedule is made on the host, as :func:`impl_torch.varlen.varlen_flash_attention`'s
    (``attention_spec.sequence_pages``, from the concrete ``cu_seqlens_q`` and ``seq_lens``):
    for each sequence n with ``L_n >= 1`` queries, the blocks of its pages that hold keys its
    queries may attend (``j < seq_lens[n]``, inside the causal and window bands). A block is
    ``key_cache[block_table[n, p0:p1]]`` (``(bk, K, D|E)``, ``bk = (p1 - p0) * page_size``),
    folded into the running max, sum and accumulator of the sequence's ``L_n`` rows (the online
    softmax of :func:`flash_attention`); the keys ``>= seq_lens[n]`` of its last page are
    masked, and their values zeroed. No contiguous copy of a sequence's keys, or of the pool, is
    ever made, and no page past a sequence's keys is read: the memory beyond inputs and output
    is one block of one sequence, ``O(H * L_n * bk)`` scores and ``O(bk * K * (D + E))`` keys
    and values, whatever P and max_pages are.

    Args: those of ``paged_attention``, ``seq_lens`` and ``cu_seqlens_q`` concrete (the blocks
        are scheduled from them on the host), and
        block_k: keys per block (any integer >= 1); None: ``attention_spec.paged_block_k``'s
            default for each sequence's query rows (2048 keys decoding, 512 for 256 rows or
            more). A block is ``max(1, block_k // page_size)`` whole pages.

    Returns what ``paged_attention`` returns. Raises its errors, ConfigError for a block size
    < 1, and ConfigError ``cu_seqlens_value`` / ``seq_lens_value`` for a ``cu_seqlens_q`` /
    ``seq_lens`` that is not concrete (traced, under ``jax.jit``).
    """
    query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, sinks, alibi_slopes = (
        _as_tensors(query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, sinks,
                    alibi_slopes)
    )
    call = check_paged_attention(
        query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, is_causal=is_causal,
        window=window, scale=scale, softcap=softcap, sinks=sinks, alibi_slopes=alibi_slopes,
        q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
    )
    schedule = sequence_pages(call, block_k)  # [(n, q0, q1, S, blocks)], Python ints
    ct, device = _compute_dtype(query.dtype), query.device
    H, K, G, D, E, page_size = call.H, call.K, call.G, call.D, call.E, call.page_size
    slopes = None if alibi_slopes is None else alibi_slopes.to(ct).reshape(K, G, 1, 1)
    table = block_table.long()  # page ids as an index
    like = dict(dtype=ct, device=device)
    rows = [torch.zeros((0, H, E), **like)]  # then (L_n, H, E) per sequence (N may be 0)
    for n, q0, q1, S, blocks in schedule:  # one sequence at a time: its queries, its pages
        L = q1 - q0
        at_n = torch.tensor([n], device=device)  # (1,): sequence n, for its descale row
        # Its queries, grouped by key/value head, at positions S - L + i (bottom-right).
        q = _descaled(query[q0:q1], call.q_descale, q_descale, at_n).to(ct)
        q = q.reshape(L, K, G, D).permute(1, 2, 0, 3).reshape(K, G * L, D)  # (K, G * L, D)
        i = S - L + torch.arange(L, device=device)[:, None]  # (L, 1)
        m = torch.full((K, G, L, 1), -torch.inf, **like)  # running row max of the scores
        l = torch.zeros((K, G, L, 1), **like)  # running row sum of exp(s - m)
        acc = torch.zeros((K, G, L, E), **like)  # running sum of exp(s - m) @ value
        for p0, p1 in blocks:  # one block of the sequence's pages at a time
            # 0. the block: pages block_table[n, p0:p1], keys j = p0 * page_size + 0 .. bk - 1;
            #    only j < S exists (the last page's tail is masked, its values zeroed). An fp8
            #    page is dequantized as it is read: float32 times the sequence's descale.
            pages = table[n, p0:p1]  # (p1 - p0,)
            j = p0 * page_size + torch.arange((p1 - p0) * page_size, device=device)  # (bk,)
            exists = j < S  # (bk,)
            k = _descaled(key_cache[pages], call.k_descale, k_descale, at_n)  # (p1-p0, ps, K, D)
            v = _descaled(value_cache[pages], call.v_descale, v_descale, at_n)  # (.., ps, K, E)
            k = k.to(ct).reshape(-1, K, D).permute(1, 2, 0)  # (K, D, bk)
            v = v.to(ct).reshape(-1, K, E)  # (bk, K, E)
            v[S - p0 * page_size :] = 0.0  # the last page's slots past S, in the block's copy
            v = v.permute(1, 0, 2)  # (K, bk, E); no 0*NaN meets a weight

            # 1. scores = (query . key) * scale; query head h = k * G + g reads key/value head k.
            s = q @ k  # (K, G * L, bk)
            s = s.reshape(K, G, L, -1) * call.scale  # (K, G, L, bk)
            # 2. softcap
            if call.softcap is not None:
                s = call.softcap * torch.tanh(s / call.softcap)
            # 3. ALiBi, -slope[h] * |i - j|
            if slopes is not None:
                s = s + alibi(slopes, i, j, 0)
            # 4. allowed: the key exists (j < S), causal and window on the positions i
            allowed = exists
            if call.is_causal:
                allowed = allowed & causal(i, j, 0)
            if call.window is not None:
                allowed = allowed & window_rule(i, j, 0, call.window)
            s = torch.where(allowed, s, -torch.inf)  # (K, G, L, bk)

            # 5. online softmax, as flash_attention's: raise the max, rescale, add exp(s - m_new).
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))  # (K, G, L, 1)
            shift = torch.where(m_new == -torch.inf, 0.0, m_new)  # nothing allowed yet: not NaN
            alpha = torch.exp(m - shift)
            e = torch.exp((s - shift).clamp(max=0.0))  # (K, G, L, bk); 0 where not allowed
            l = alpha * l + e.sum(dim=-1, keepdim=True)

            # 6. output, accumulated: acc = alpha * acc + e @ value, per group.
            pv = e.reshape(K, G * L, -1) @ v  # (K, G * L, E)
            acc = alpha * acc + pv.reshape(K, G, L, E)  # (K, G, L, E)
            m = m_new

        # 5. (end) the sink joins the denominator once; a row with no key is 0 / 1 = 0.
        empty = l == 0.0
        if sinks is not None:
            sink = sinks.to(ct).reshape(K, G, 1, 1)
            m_sink = torch.maximum(m, sink)
            shift = torch.where(m_sink == -torch.inf, 0.0, m_sink)
            alpha = torch.exp(m - shift)
            l = alpha * l + torch.exp((sink - shift).clamp(max=0.0))
            acc = alpha * acc
        out = acc / torch.where(empty, 1.0, l)  # (K, G, L, E)
        rows.append(out.permute(2, 0, 1, 3).reshape(L, H, E))  # (L, H, E)

    return torch.cat(rows).to(_output_dtype(query.dtype))  # (T, H, E): the rows in order
