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
side by side and gives the measured memory and time. Each step makes a new block tensor (a step
works in place only on a tensor it has just made and autograd does not keep: the scaled scores,
the exponentials), so autograd differentiates through the loops; it then keeps each block's
intermediates for the backward pass, so the memory saving is the forward's (inference,
``torch.no_grad()``): a backward that recomputes blocks from the returned ``lse`` is what
FlashAttention adds on top, and is not here.

Shape letters (SEMANTICS.md): B batch (any number of leading dims, written ``...``),
H query heads, K key/value heads, G = H // K, L query length, S key/value length,
D query/key head dim, E value head dim; ``bq`` and ``bk`` are the rows and keys of one block
(``block_q``/``block_k``, or fewer in the last block).
"""

from __future__ import annotations

import torch

from attention_spec import (
    BLOCK_K,
    BLOCK_Q,
    causal_offset,
    check_attention,
    check_block_sizes,
    check_flag,
)
from attention_spec.rules import alibi, block_rules, key_band
from impl_torch.functional import (
    _allowed,
    _as_tensors,
    _attended,
    _cast,
    _compute_dtype,
    _unattended_zeroed,
)

__all__ = ["BLOCK_K", "BLOCK_Q", "flash_attention"]


def _block(x: torch.Tensor | None, axis: int, start: int, stop: int) -> torch.Tensor | None:
    """``x[start:stop]`` along ``axis`` (-2: L, -1: S) of a mask or bias, which broadcasts to
    ``(..., H, L, S)`` (or of segment ids, ``(..., L)``, ``(..., S)``): an axis of size 1, or one
    it lacks, is left as it is and broadcasts."""
    if x is None or x.dim() < -axis or x.shape[axis] == 1:
        return x
    return x.narrow(axis, start, stop - start)


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
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``scaled_dot_product_attention`` computed block by block, shape ``(..., H, L, E)``.

    Args:
        query: ``(..., H, L, D)``.
        key: ``(..., K, S, D)``; K divides H, query head h reads key head ``h // (H // K)``.
        value: ``(..., K, S, E)``; the same dtype as query and key.
        mask, bias, is_causal, causal_alignment, scale, softcap, window, q_segment_ids,
            kv_segment_ids, sinks, alibi_slopes: as in
            :func:`impl_torch.functional.attention_weights`.
        block_q: query rows per block (any integer >= 1; it need not divide L, and may exceed it).
        block_k: keys per block (likewise for S).
        return_lse: also return the row log-sum-exp of the final scores (after softcap, the
            additive terms and every rule, the sink included), ``lse = log(sum_j exp(s_ij)
            [+ exp(sink)])`` of shape ``(..., H, L)`` in the compute dtype (float64 for float64
            input, else float32); ``-inf`` for a row with no allowed key. It is what a backward
            pass needs to rebuild the weights: ``exp(s - lse)``.

    Returns the output in the query's dtype (rows with no allowed key are zeros, with zero
    gradient), or ``(output, lse)`` when ``return_lse``. Key blocks outside the causal and
    window bands are never visited, blocks whose segments cannot meet are skipped, and only the
    blocks a rule's boundary crosses are masked elementwise.

    Raises the errors of ``scaled_dot_product_attention``, and ConfigError for a block size < 1.
    """
    query, key, value, mask, bias, q_ids, kv_ids, sinks, slopes = _as_tensors(
        query, key, value, mask, bias, q_segment_ids, kv_segment_ids, sinks, alibi_slopes
    )
    dims = check_attention(
        query,
        key,
        value,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
        window=window,
        q_segment_ids=q_ids,
        kv_segment_ids=kv_ids,
        sinks=sinks,
        alibi_slopes=slopes,
    )
    check_block_sizes(block_q, block_k)
    return_lse = check_flag("return_lse", return_lse)
    ct = _compute_dtype(query.dtype)
    H, K, G, L, S, E = dims.H, dims.K, dims.G, dims.L, dims.S, dims.E
    offset = causal_offset(L, S, causal_alignment)  # query i sees key j iff j <= i + offset
    device = query.device

    q = query.to(ct)  # (..., H, L, D)
    k = key.to(ct)  # (..., K, S, D)
    v = value.to(ct)  # (..., K, S, E)
    bias, sinks, slopes = _cast(bias, ct), _cast(sinks, ct), _cast(slopes, ct)

    outs = [q.new_zeros((*dims.batch, H, 0, E))]  # an empty first piece: L = 0 needs no case
    lses = [q.new_zeros((*dims.batch, H, 0))]
    for i0 in range(0, L, block_q):  # one block of query rows at a time
        i1 = min(i0 + block_q, L)
        bq = i1 - i0
        m = q.new_full((*dims.batch, H, bq, 1), float("-inf"))  # running row max of the scores
        l = q.new_zeros((*dims.batch, H, bq, 1))  # running row sum of exp(s - m)
        acc = q.new_zeros((*dims.batch, H, bq, E))  # running sum of exp(s - m) @ value
        i = torch.arange(i0, i1, device=device)[:, None]  # (bq, 1)
        q_ids_rows = _block(q_ids, -1, i0, i1)  # (..., bq): this block's rows' segments

        # 4. allowed, whole blocks: the keys outside the causal and window bands of these rows
        #    are masked for every row, so their blocks are never visited (a window of W keys
        #    costs W, not S); a block whose segments cannot meet is skipped. The key blocks
        #    start at the band's first key, so a band of block_k keys is one block, not two.
        lo, hi = key_band(dims.is_causal, dims.window, offset, i0, i1, S)
        for j0 in range(lo, hi, block_k):  # one block of keys at a time
            j1 = min(j0 + block_k, S)
            bk = j1 - j0
            kv_ids_blk = _block(kv_ids, -1, j0, j1)  # (..., bk)
            some, every = block_rules(dims.is_causal, dims.window, offset, i0, i1, j0, j1,
                                      q_ids_rows, kv_ids_blk)  # fmt: skip
            if not some:
                continue

            # 4. allowed, this block: the rules a boundary crosses, elementwise (mask AND
            #    causal AND window AND segment); a block inside every band needs none of them.
            j = torch.arange(j0, j1, device=device)[None, :]  # (1, bk)
            mask_blk = _block(_block(mask, -2, i0, i1), -1, j0, j1)
            if every:
                allowed = mask_blk  # (..., bq|1, bk|1) or None
            else:
                allowed = _allowed(dims, offset, i, j, mask_blk, q_ids_rows, kv_ids_blk)
            bias_blk = _block(_block(bias, -2, i0, i1), -1, j0, j1)
            attended = _attended(allowed, bias_blk, (*dims.batch, H, bq, bk), K)  # (..., K, bk)
            k_blk = _unattended_zeroed(k[..., j0:j1, :], attended)  # (..., K, bk, D)
            v_blk = _unattended_zeroed(v[..., j0:j1, :], attended)  # (..., K, bk, E)

            # 1. scores = (query @ key^T) * scale; query head h reads key/value head h // G.
            q_blk = q[..., i0:i1, :]  # (..., H, bq, D)
            k_blk = k_blk.repeat_interleave(G, dim=-3)  # (..., H, bk, D); h reads kv h // G
            s = (q_blk @ k_blk.transpose(-2, -1)).mul_(dims.scale)  # (..., H, bq, bk)

            # 2. softcap: s = softcap * tanh(s / softcap), before any additive term or mask.
            if dims.softcap is not None:
                s = dims.softcap * torch.tanh(s / dims.softcap)

            # 3. additive terms: this block's slice of the bias, may hold -inf, and ALiBi's
            #    -slope[h] * |i + offset - j| at this block's rows and keys.
            if bias_blk is not None:
                s = s + bias_blk
            if slopes is not None:
                s = s + alibi(slopes[:, None, None], i, j, offset)  # (H, bq, bk)

            # 4. allowed: s = -inf where allowed(i, j) is False, in this block.
            if allowed is not None:
                s = torch.where(allowed, s, float("-inf"))

            # 5. online softmax: raise the running max, rescale what was summed under the old
            #    one by exp(m_old - m_new), add this block's exp(s - m_new).
            m_new = torch.maximum(m, s.detach().amax(dim=-1, keepdim=True))  # (..., H, bq, 1)
            shift = torch.where(torch.isfinite(m_new), m_new, 0.0)  # nothing allowed yet: not NaN
            alpha = torch.exp(m - shift)  # (..., H, bq, 1); 0 while m is still -inf
            p = (s - shift).clamp_(max=0.0).exp_()  # (..., H, bq, bk); exp(s - max) <= 1
            l = alpha * l + p.sum(dim=-1, keepdim=True)

            # 6. output, accumulated: acc = alpha * acc + p @ value.
            v_blk = v_blk.repeat_interleave(G, dim=-3)  # (..., H, bk, E)
            acc = alpha * acc + p @ v_blk  # (..., H, bq, E)
            m = m_new
            del s, p  # this block's scores go before the next block's are made

        # 5. (end) the sink joins the denominator once, as one more logit with no value; then
        #    divide by the row sum once, after the last key block. A row with no allowed key
        #    has l = 0 and acc = 0: 0 / 1 = 0 (sink or not), and its log-sum-exp is -inf.
        empty = l == 0.0  # (..., H, bq, 1): rows that saw no allowed key
        if sinks is not None:
            m_sink = torch.maximum(m, sinks.detach()[:, None, None])  # (..., H, bq, 1)
            shift = torch.where(torch.isfinite(m_sink), m_sink, 0.0)
            alpha = torch.exp(m - shift)
            l = alpha * l + (sinks[:, None, None] - shift).clamp(max=0.0).exp()
            acc, m = alpha * acc, m_sink
        l = torch.where(empty, 1.0, l)
        outs.append(acc / l)  # (..., H, bq, E)
        lses.append(torch.where(empty, float("-inf"), m + torch.log(l)).squeeze(-1))  # (..., H, bq)

    out = torch.cat(outs, dim=-2).to(query.dtype)  # (..., H, L, E)
    lse = torch.cat(lses, dim=-1)  # (..., H, L) in the compute dtype
    return (out, lse) if return_lse else out
