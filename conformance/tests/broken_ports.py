"""Deliberately broken ports: the suite must catch every one of them.

:func:`make_port` builds a small, self-contained NumPy port of the contract (validation through
``attention_spec``, the same as any port would), functions and modules with a KV cache (the
modules in ``module_broken.py``), with one named bug switched on. With no bug it passes the
whole suite (a test asserts that), so every failure of a broken port is the bug's. The
``flash_*`` bugs give the port a ``flash_attention``: the broken tiled versions of
``flash_broken.py`` (the classic online-softmax bugs, and two of the fp8 dequantize, the
``flash_fp8_*`` bugs); its unbroken version (the same code with
no bug) passes every flash run. The ``grad_*`` bugs give it the two ``*_vjp`` functions of
``grad_broken.py`` (the backward pass's bugs), whose unbroken version passes every grad and
flash_grad run. The ``paged_*`` bugs give it ``paged_attention`` and ``paged_cache_write`` of
``paged_broken.py``; the ``paged_flash_*`` bugs a ``paged_flash_attention``, impl_numpy's tiled
paged read with one line of its block walk broken (``flash_broken.PAGED_BROKEN``).

Each bug is a mistake seen in real attention code; :data:`BUGS` says what it does and names one
run that must catch it.

Why one file of ~800 lines: more than half of it is the :data:`BUGS` table (every bug of the
project's functions, what it does and the run that catches it, in one list a reader scans); the
rest is the one small port those bugs switch on, read top to bottom.
"""

from __future__ import annotations

from types import SimpleNamespace

import ml_dtypes  # noqa: F401  (np.dtype("bfloat16"))
import numpy as np

from attention_spec import (
    NO_VALUE,
    AttentionError,
    causal_offset,
    check_attention,
    check_causal_mask_args,
    check_rotary,
    is_fp8,
)
from conformance.tests.fp8_broken import (
    broken_quantize,
    dequantized,
    key_by_query_head,
    result_dtype,
)
from conformance.tests.module_broken import broken_modules

#: bug -> (what it does, a run id that must fail because of it)
BUGS: dict[str, tuple[str, str]] = {
    "scale_missing": (
        "no 1/sqrt(D): the default scale is 1",
        "sdpa.saturation.default_scale.float32",
    ),
    "scale_one_over_d": ("default scale 1/D instead of 1/sqrt(D)", "sdpa.gqa.h6_k2.float32"),
    "scale_uses_e": ("default scale 1/sqrt(E), the value head dim", "sdpa.gqa.h6_k2.float32"),
    "gqa_tiling": ("query head h reads key/value head h % K (tiling)", "sdpa.gqa.h6_k2.float32"),
    "mask_fill_minus_1e9": (
        "masked positions get -1e9 instead of -inf: fully masked rows turn uniform",
        "sdpa.fully_masked.bool_row.float32",
    ),
    "nan_on_fully_masked": (
        "no guard for rows with no allowed key: exp(-inf - (-inf)) = NaN",
        "sdpa.fully_masked.neg_inf_bias_row.float32",
    ),
    "threshold_fully_masked": (
        "a row whose max score is below -1e30 is treated as fully masked (zeros)",
        "sdpa.fully_masked.huge_negative_bias_row.float32",
    ),
    "always_top_left": (
        "causal_alignment ignored: always top_left",
        "sdpa.causal.bottom_right.l5_s7.float32",
    ),
    "causal_off_by_one": (
        "causal rule j < i + offset (the diagonal is masked)",
        "sdpa.causal.top_left.l5_s7.float32",
    ),
    "softcap_after_mask": (
        "softcap applied after bias and mask: -inf becomes -softcap",
        "sdpa.softcap.cap2_neg_inf_bias.float32",
    ),
    "softmax_wrong_axis": ("softmax over the query axis L", "sdpa.gqa.h6_k2.float32"),
    "shift_guard_nonfinite": (
        "the guard for rows with no allowed key replaces any non-finite row max by 0, not "
        "only -inf: a +inf bias at an allowed position gives a finite, wrong row, not NaN",
        "sdpa.bias.pos_inf.float32",
    ),
    "no_max_subtraction": (
        "exp(scores) without subtracting the row max: overflow",
        "sdpa.large_logits.shifted.float32",
    ),
    "mask_inverted": (
        "True means masked out (torch.nn.MultiheadAttention's polarity)",
        "sdpa.mask.random.float32",
    ),
    "bias_ignored": ("bias never added", "sdpa.bias.full.float32"),
    "output_not_cast": (
        "result returned in the float32 compute dtype, not the input dtype",
        "sdpa.gqa.h6_k2.float16",
    ),
    "wrong_error_class": (
        "bad input raises a plain ValueError without the taxonomy's class and code",
        "sdpa.error.heads_not_divisible.float32",
    ),
    "no_validation": (
        "no validation: mismatched key/value lengths are silently accepted",
        "sdpa.error.kv_length_mismatch.float32",
    ),
    "low_precision_softmax": (
        "softmax computed in float16 itself, no upcast, no max subtraction",
        "sdpa.large_logits.shifted.float16",
    ),
    # -- contract v2: windows, segments, sinks, ALiBi ----------------------------------------
    "window_left_exclusive": (
        "window's left end exclusive: (W, 0) covers W keys, not W + 1",
        "sdpa.window.left_only.float32",
    ),
    "window_right_exclusive": (
        "window's right end exclusive: (L, 1) sees only the diagonal ahead",
        "sdpa.window.right_only.float32",
    ),
    "window_no_offset": (
        "window measured from i, never from the alignment's diagonal i + offset",
        "sdpa.window.causal.bottom_right.float32",
    ),
    "window_offset_only_if_causal": (
        "window placed on the bottom-right diagonal only when is_causal is set (top-left else)",
        "sdpa.window.both.bottom_right.float32",
    ),
    "segments_less_equal": (
        "segment ids compared with <=: a query also sees every earlier document",
        "sdpa.segments.two_docs.float32",
    ),
    "sink_scaled": (
        "the sink logit multiplied by the score scale",
        "sdpa.sinks.basic.float32",
    ),
    "sink_softcapped": (
        "the sink logit softcapped like a score",
        "sdpa.sinks.with_mask_and_softcap.float32",
    ),
    "sink_has_value": (
        "the sink attended as a real token with the first key's value (not a zero vector)",
        "sdpa.sinks.basic.float32",
    ),
    "sinks_dropped": ("sinks ignored (an eager path without them)", "sdpa.sinks.gqa.h8_k1.float32"),
    "alibi_reversed": (
        "ALiBi slopes applied in reverse head order",
        "sdpa.alibi.pow2.h8.float32",
    ),
    "alibi_sign_flipped": (
        "ALiBi added with the wrong sign: a bonus for distance",
        "sdpa.alibi.non_pow2.h6.float32",
    ),
    "alibi_no_offset": (
        "ALiBi distance |i - j|, without the alignment's offset",
        "sdpa.alibi.bottom_right.causal.float32",
    ),
    # -- modules and the KV cache -----------------------------------------------------------
    "o_proj_transposed": (
        "module: output projection applied as merged @ o_proj.kernel.T (torch's (out, in))",
        "module.mha.self.float32",
    ),
    "qk_swapped": ("module: q and k projections swapped", "module.mha.self.float32"),
    "heads_wrong_end": (
        "module: head h takes features h, h + H, ... (reshape (.., D, H)), not [h*D:(h+1)*D]",
        "module.gqa.h6_k2.float32",
    ),
    "bias_missing": ("module: the projections' biases never added", "module.cross.h6_k2.float32"),
    "weights_averaged": (
        "module: return_weights gives the head average (B, L, S), torch.nn.MultiheadAttention's "
        "default, not every head",
        "module.gqa.h6_k2.float32",
    ),
    "weights_not_checked": (
        "module: from_canonical loads any dict (a transposed o_proj.kernel is not refused)",
        "module.error.weights_transposed.float32",
    ),
    "decode_top_left": (
        "decode: new tokens attend with top_left alignment (see only the first cached keys)",
        "decode.gqa.h6_k2.tokens.float32",
    ),
    "cache_no_overflow_check": (
        "decode: no max_len check, the cache just grows (never the cache_overflow error)",
        "decode.error.cache_overflow.float32",
    ),
    # the modules' paged KV cache (init_cache(..., page_size=); contract v3)
    "decode_paged_contiguous_pages": (
        "paged decode: sequence b's pages read as b * max_pages + i, not its own block-table "
        "row (the pool hands pages out interleaved: another sequence's page, or a NaN one)",
        "decode.gqa.h6_k2.paged.tokens.float32",
    ),
    "decode_paged_offset_from_chunk": (
        "paged decode: a new token written at page offset i % page_size of its index in the "
        "chunk, not p % page_size of its position (it overwrites an earlier token)",
        "decode.v2.window_sinks_alibi_softcap.mha.paged.chunks_2_1_2.float32",
    ),
    # the modules' fp8 KV cache (init_cache(..., dtype="float8_*"); contract v3)
    "decode_fp8_cache_descale_per_write": (
        "fp8 cache: the descale recomputed from each write's keys and values, the old tokens "
        "(quantized at the old one) read with the new one",
        "decode.fp8_cache.e4m3fn.rope.gqa.dynamic.tokens.float32",
    ),
    "decode_fp8_cache_k_descale_by_query_head": (
        "fp8 cache: k_descale indexed by the query head h (h % K), not by its key/value head "
        "h // G",
        "decode.fp8_cache.e4m3fn.gqa.static.tokens.float32",
    ),
    "decode_fp8_cache_not_saturating": (
        "fp8 cache: later tokens past the first write's range cast unclipped (e4m3fn NaN)",
        "decode.fp8_cache.e4m3fn.gqa.saturate.tokens.float32",
    ),
    "decode_fp8_cache_descale_dropped": (
        "fp8 cache: keys and values quantized on write, but the descales not passed to the "
        "attention (read as 1.0)",
        "decode.fp8_cache.e5m2.gqa.static.chunks_2_1_2.float32",
    ),
    # -- rotary position embedding ---------------------------------------------------------
    "rope_pairs_swapped": (
        "rope: interleaved pairs (x[2p], x[2p+1]) where half-split (x[p], x[p + R/2]) is asked, "
        "and the other way round",
        "rope.half.d12.float32",
    ),
    "rope_exponent_halved": (
        "rope: frequencies theta ** (-p / R), the exponent off by a factor 2",
        "rope.theta.small.float32",
    ),
    "rope_angles_low_precision": (
        "rope: angles, cos and sin computed in the input dtype (bfloat16), not float32",
        "rope.positions.large_1e5.bfloat16",
    ),
    # -- scaled rotary frequencies (Contract v3) ------------------------------------------
    "rope_inv_freq_ignored": (
        "rope: inv_freq= accepted but theta's frequencies used (a llama3-scaled model run as "
        "plain RoPE)",
        "rope.inv_freq.llama3.half.d12.float32",
    ),
    "rope_attention_factor_cos_only": (
        "rope: attention_factor multiplies cos but not sin",
        "rope.attention_factor.d12.float32",
    ),
    "rope_attention_factor_squared": (
        "rope: YaRN's attention factor applied squared on cos and sin (the mscale ratio of the "
        "softmax scale, mscale ** 2, taken for the rotary's)",
        "rope.inv_freq.yarn.interleaved.r8_d12.float32",
    ),
    "rope_interleave_over_d": (
        "rope: interleaved pairs reshaped over all D features, not the first rotary_dim (a "
        "partial rotary head run as a full one)",
        "rope.inv_freq.yarn.interleaved.r8_d12.float64",
    ),
    # -- multi-head latent attention (Contract v3; mla_broken.py) ------------------------
    "mla_absorbed_scale_latent": (
        "mla: the absorbed decode's MQA call left at its default scale, (R + Dr) ** -0.5 of the "
        "latent width, not (Dn + Dr) ** -0.5",
        "decode.mla.q_lora.tokens.float32",
    ),
    "mla_mscale_twice": (
        "mla: YaRN's attention factor (the mscale ratio) applied to cos and sin and again, "
        "squared, to the softmax scale",
        "module.mla.yarn.causal.float32",
    ),
    "mla_k_pe_not_shared": (
        "mla: the rotary key k_pe given to head 0 only, not shared by every head",
        "module.mla.q_proj.causal.float32",
    ),
    "mla_kv_norm_missing": (
        "mla: c_kv used without its RMSNorm (kv_a_layernorm)",
        "module.mla.q_lora.interleaved.causal.float32",
    ),
    "mla_cache_k_pe_unrotated": (
        "mla: the latent cache stores k_pe before rotation (the new tokens attend their rotated "
        "key once, later steps the unrotated one)",
        "decode.mla.q_lora.tokens.float32",
    ),
    "mla_rope_on_nope": (
        "mla: RoPE applied to the nope part too (q_nope and k_nope rotated over their first Dr "
        "features, as a port rotating the whole head would)",
        "module.mla.q_proj.causal.float32",
    ),
    "mla_rope_pairs_other": (
        "mla: q_pe and k_pe rotated with the rope pairs of the other convention (rope_interleave "
        "read inverted: half-split for interleaved, interleaved for half-split)",
        "module.mla.q_lora.interleaved.causal.float32",
    ),
    "mla_absorb_uk_uv_swapped": (
        "mla: W_UK and W_UV swapped in the absorption (each head's kv_b_proj columns read as "
        "value then key: W_UV = [:E], W_UK = [E:])",
        "decode.mla.q_lora.tokens.float32",
    ),
    # the absorbed decode on a paged latent cache (one head: key pages [c_kv, k_pe], value
    # pages c_kv)
    "mla_paged_k_pe_unrotated": (
        "mla paged: the latent pool's key pages store k_pe before rotation (the contiguous "
        "latent cache right)",
        "decode.mla.q_lora.paged.tokens.float32",
    ),
    "mla_paged_value_from_key_tail": (
        "mla paged: the values read as the key pages' last R features ([c_kv, k_pe][Dr:]) "
        "instead of c_kv, the first R (FlashMLA's one-pool form taken from the wrong end)",
        "decode.mla.q_proj.yarn.sinks.paged.chunks_2_1_2.float32",
    ),
    "mla_q_norm_missing": (
        "mla: the query latent used without its RMSNorm (q_a_layernorm)",
        "module.mla.q_lora.interleaved.causal.float32",
    ),
    "rolling_cache_drops_key": (
        "rolling KV cache: a chunk attends the last left - 1 kept tokens, not left (the ring's "
        "oldest key of the window is dropped)",
        "decode.v2.window.gqa.rolling.tokens.float32",
    ),
    "module_sinks_ignored": (
        "module: the learned sinks weight is loaded but never passed to the attention",
        "module.v2.sinks.gqa.padding.float32",
    ),
    "module_window_ignored": (
        "module: window= is validated and stored but never passed to the attention",
        "module.v2.window.causal.gqa.float32",
    ),
    "module_alibi_ignored": (
        "module: alibi=True is accepted but no slopes are passed to the attention",
        "module.v2.alibi.mha.causal.float32",
    ),
    "module_softcap_ignored": (
        "module: softcap= is accepted but the scores are never capped",
        "module.v2.softcap.gqa.float32",
    ),
    "module_scale_ignored": (
        "module: scale= is accepted but the attention uses the default 1/sqrt(D)",
        "module.v2.scale.gqa.float32",
    ),
    "rope_decode_not_offset": (
        "decode: new tokens rotated at 0 .. L-1, not cache.position + 0 .. L-1",
        "decode.rope.gqa.h6_k2.tokens.float32",
    ),
    # -- modules with scaled rotary frequencies (rope_inv_freq=, rope_attention_factor=) -
    "module_rope_inv_freq_ignored": (
        "module: rope_inv_freq accepted but theta's frequencies used (a llama3-scaled Llama "
        "3.1 layer run with its plain rope_theta)",
        "module.rope_scaled.llama3.gqa.h6_k2.float32",
    ),
    "module_rope_attention_factor_once": (
        "module: rope_attention_factor on the queries' cos and sin only, not the keys' (the "
        "scores scaled by the factor, not its square)",
        "module.rope_scaled.yarn.mha.interleaved.r4.float32",
    ),
    "decode_rope_inv_freq_ignored": (
        "decode: the forward rotates with rope_inv_freq, decode with theta's frequencies",
        "decode.rope_scaled.gqa.h6_k2.tokens.float32",
    ),
    # -- flash_attention: flash_broken.py ---------------------------------------------
    "flash_no_rescale": (
        "flash: the accumulator and running sum are not rescaled when the row max grows",
        "flash.tiling.rising_max.l9_s40.float32",
    ),
    "flash_early_normalize": (
        "flash: the accumulator is divided by the running sum after every key block",
        "flash.tiling.ragged.l113_s203.float32",
    ),
    "flash_skip_partial_block": (
        "flash: under causal masking, key blocks the diagonal crosses are skipped too",
        "flash.tiling.causal_top_left.l113_s203.float32",
    ),
    "flash_unguarded_max": (
        "flash: a running max of -inf is used as the shift: NaN where a block has no allowed key",
        "flash.tiling.left_padding.l17_s203.float32",
    ),
    "flash_fp8_v_descale_dropped": (
        "flash fp8: v_descale dropped in the tiled path's dequantize (query's and key's applied)",
        "flash.fp8.all.per_head.float8_e4m3fn",
    ),
    "flash_fp8_k_descale_twice": (
        "flash fp8: k_descale multiplied in twice in the tiled path's dequantize",
        "flash.fp8.kv_cache.bfloat16_query.causal_sinks.float8_e5m2",
    ),
    # -- the backward pass: grad_broken.py ----------------------------------------------
    "grad_kv_not_summed": (
        "grad: dK and dV of a key/value head are its group's first query head's, not summed",
        "grad.gqa.h6_k2.float32",
    ),
    "grad_kv_summed_tiling": (
        "grad: dK and dV summed over the query heads h % K == n (tiling), not h // G == n",
        "grad.gqa.h6_k2.float32",
    ),
    "grad_softcap_factor_missing": (
        "grad: the softcap's factor 1 - tanh^2(s / softcap) left out of dS",
        "grad.softcap.cap30.float32",
    ),
    "grad_delta_missing": (
        "grad: dS = P * dP, without the - rowsum(dO * O) term of the softmax backward",
        "grad.basic.mha.float32",
    ),
    "grad_nan_fully_masked": (
        "grad: P = exp(S - lse) unguarded: NaN in rows with no allowed key (lse = -inf)",
        "grad.fully_masked.bool_row.float32",
    ),
    "grad_dbias_not_reduced": (
        "grad: dbias returned at (..., H, L, S), not summed to the bias's broadcast shape",
        "grad.bias_broadcast.ls.float32",
    ),
    "grad_scale_twice": ("grad: dQ multiplied by the scale twice", "grad.scale.custom.float32"),
    "grad_lse_offset": (
        "grad, tiled: a block's weights rebuilt with the lse rows at the key block's offset",
        "flash_grad.tiling.lse_rows.l113_s203.float32",
    ),
    "grad_skip_diagonal_block": (
        "grad, tiled: under causal masking, the key blocks the diagonal crosses are skipped",
        "flash_grad.tiling.blocks_7.causal.l113_s203.float32",
    ),
    # -- paged key/value caches (Contract v3): paged_broken.py ---------------------------
    "paged_causal_top_left": (
        "paged: causal aligned top-left (query row i at position i, not seq_lens[n] - L_n + i)",
        "paged.page3.decode_and_prefill.causal.float32",
    ),
    "paged_offset_from_block_start": (
        "paged: the page offset taken from the key block's start j0, (j - j0) % page_size",
        "paged.page3.decode_and_prefill.causal.float32",
    ),
    "paged_previous_row": (
        "paged: sequence n reads sequence n-1's block-table row (sequence 0 the last one)",
        "paged.page3.decode_and_prefill.causal.float32",
    ),
    "paged_reads_max_len": (
        "paged: keys read and attended up to max_pages * page_size, not seq_lens[n]: NaN leaks "
        "(causal alone hides it: every key past seq_lens[n] is after the last query)",
        "paged.in_order.not_causal.float32",
    ),
    "paged_minus_one_last_page": (
        "paged: every block-table entry read, -1 as the last page, and the keys past seq_lens "
        "masked in the scores only: 0 * NaN leaks from the pages and slots no sequence holds",
        "paged.in_order.not_causal.float32",
    ),
    "paged_gqa_tiling": (
        "paged: query head h reads key/value head h % K (tiling)",
        "paged.page3.decode_and_prefill.causal.float32",
    ),
    "paged_write_minus_one_last_slot": (
        "paged_cache_write: a slot of -1 written as an index, to the pool's last slot",
        "paged_write.padding_slots.float32",
    ),
    # the fp8 cache (paged.fp8.*): paged_broken.py's dequantize-as-read, fp8 calls only
    "paged_fp8_descale_sequence_0": (
        "paged fp8: sequence 0's descale row applied to every sequence's query, keys and values",
        "paged.fp8.all.per_sequence.causal.float8_e4m3fn",
    ),
    "paged_fp8_k_descale_query_head": (
        "paged fp8: k_descale indexed by query head (h % K), not by its key/value head h // G",
        "paged.fp8.all.per_head.window_sinks.float8_e4m3fn",
    ),
    "paged_fp8_nan_times_zero_weight": (
        "paged fp8: the last page read whole, its NaN tail dequantized and multiplied by a zero "
        "weight (0 * NaN) instead of masked before the value product",
        "paged.fp8.kv_cache.bfloat16_query.per_sequence.window.float8_e4m3fn",
    ),
    "paged_fp8_v_descale_on_scores": (
        "paged fp8: v_descale multiplied into the scores instead of the values (the output)",
        "paged.fp8.kv_cache.float16_query.per_head.causal.float8_e5m2",
    ),
    # the tiled paged read's block walk (paged_flash.*): flash_broken.py's PAGED_BUGS, caught
    # at the default block size by the fixtures whose blocks hold several pages (or, with a
    # window, start past a sequence's first page)
    "paged_flash_page_offsets_from_block_start": (
        "paged tiled read: every page of a block numbered as the block's first page (positions "
        "and the j < seq_lens mask right only for a block of one page)",
        "paged_flash.page3.decode_and_prefill.causal.float32",
    ),
    "paged_flash_pages_from_row_start": (
        "paged tiled read: each block gathers the first pages of the sequence's block-table row "
        "(the block's first page p0 dropped from the gather, kept in the keys' positions)",
        "paged_flash.window.left3.causal.float32",
    ),
    "paged_flash_tail_values_kept": (
        "paged tiled read: the last page's slots past seq_lens masked in the scores only, their "
        "values kept: a zero weight meets NaN (0 * NaN)",
        "paged_flash.page3.decode_and_prefill.causal.float32",
    ),
    # -- fp8 inputs and quantize_fp8 (Contract v3): fp8_broken.py ---------------------------
    "fp8_descale_ignored": (
        "fp8: the descales ignored, the fp8 values attended as they are",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
    ),
    "fp8_descale_twice": (
        "fp8: each descale multiplied in twice (float(x) * d * d)",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
    ),
    "fp8_q_descale_dropped": (
        "fp8: q_descale dropped (the key's and the value's applied)",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
    ),
    "fp8_sink_times_k_descale": (
        "fp8: the sink logit multiplied by k_descale, as if it were a dequantized score",
        "sdpa.fp8.all.sinks.gqa.h8_k1.float8_e4m3fn",
    ),
    "fp8_value_with_k_descale": (
        "fp8: the value dequantized with k_descale (v_descale misread)",
        "sdpa.fp8.kv_cache.float32_query.decode.float8_e4m3fn",
    ),
    "fp8_output_in_fp8": (
        "fp8: the output cast to the query's fp8 dtype, not bfloat16",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
    ),
    "fp8_descale_in_fp8": (
        "fp8: the descale applied before the widening, x * d rounded back to fp8 (saturating)",
        "sdpa.fp8.all.per_head.float8_e5m2",
    ),
    "fp8_v_descale_dropped": (
        "fp8: v_descale dropped (the query's and the key's applied)",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
    ),
    "fp8_k_descale_twice": (
        "fp8: k_descale multiplied in twice (float(k) * d * d), the others once",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
    ),
    "fp8_k_descale_by_query_head": (
        "fp8: k_descale indexed by the query head h (h % K), not by its key/value head h // G",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
    ),
    "fp8_e5m2_rounding_for_e4m3": (
        "fp8: e4m3 data rounded to e5m2 (2 mantissa bits, not 3) before the descale",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
    ),
    "fp8_quantize_not_saturating": (
        "quantize_fp8: the quotient cast unclipped (e4m3fn NaN, e5m2 inf past the max)",
        "quantize.saturation.e4m3.float32",
    ),
    "fp8_quantize_round_toward_zero": (
        "quantize_fp8: the quotient truncated toward zero, not rounded to nearest even",
        "quantize.ties_to_even.e5m2.float32",
    ),
}


def make_port(
    bug: str | None = None, *, flash: bool = False, grad: bool = False, paged: bool = False
) -> SimpleNamespace:
    """A NumPy port of the contract with ``bug`` (a key of :data:`BUGS`) switched on.

    ``flash=True`` (implied by a ``flash_*`` bug) adds a ``flash_attention``: impl_numpy's
    tiled code with the bug of ``flash_broken.py`` switched in, or with none. ``grad=True``
    (implied by a ``grad_*`` bug) adds ``scaled_dot_product_attention_vjp`` and
    ``flash_attention_vjp``: the backward of ``grad_broken.py`` with that bug, or with none.
    ``paged=True`` (implied by a ``paged_*`` bug) adds ``paged_attention`` and
    ``paged_cache_write``: ``paged_broken.py`` with that bug, or with none.
    """
    if bug is not None and bug not in BUGS:
        raise KeyError(bug)

    def validate(query, key, value, mask, bias, is_causal, causal_alignment, scale, softcap, extra):
        if bug == "no_validation":
            H, L, D = query.shape[-3:]
            K, S = key.shape[-3], key.shape[-2]
            return SimpleNamespace(
                H=H, K=K, L=L, S=S, D=D, G=H // K, scale=D**-0.5 if scale is None else scale,
                window=extra.get("window"),
            )
        descales = {"q_descale": None, "k_descale": None}
        descales |= {} if value is NO_VALUE else {"v_descale": None}
        descales = {name: None for name in descales if name not in extra}
        try:
            dims = check_attention(
                query,
                key,
                value,  # NO_VALUE: attention_weights
                mask=mask,
                bias=bias,
                is_causal=is_causal,
                causal_alignment=causal_alignment,
                scale=scale,
                softcap=softcap,
                **descales,  # fp8 taken (contract v3): the descales, None included
                **extra,
            )
        except AttentionError as exc:
            if bug == "wrong_error_class":
                raise ValueError(str(exc)) from None
            raise
        if scale is None and bug == "scale_missing":
            return SimpleNamespace(**{**vars_of(dims), "scale": 1.0})
        if scale is None and bug == "scale_one_over_d":
            return SimpleNamespace(**{**vars_of(dims), "scale": 1.0 / dims.D})
        if scale is None and bug == "scale_uses_e" and value is not NO_VALUE:
            return SimpleNamespace(**{**vars_of(dims), "scale": dims.E**-0.5})
        return dims

    def causal_mask(q_len, kv_len, *, alignment="top_left"):
        check_causal_mask_args(q_len, kv_len, alignment)
        offset = causal_offset(q_len, kv_len, alignment)
        if bug == "always_top_left":
            offset = 0
        i, j = np.arange(q_len)[:, None], np.arange(kv_len)[None, :]
        return j < i + offset if bug == "causal_off_by_one" else j <= i + offset

    def allowed_positions(dims, mask, bias, is_causal, causal_alignment, q_ids, kv_ids):
        """(..., H|1, L, S) booleans: step 4's rule, and a -inf bias, which excludes its key."""
        offset = causal_offset(dims.L, dims.S, causal_alignment)
        i, j = np.arange(dims.L)[:, None], np.arange(dims.S)[None, :]
        allowed = np.ones((dims.L, dims.S), bool)
        if mask is not None:
            allowed = allowed & (~mask if bug == "mask_inverted" else mask)
        if is_causal:
            allowed = allowed & causal_mask(dims.L, dims.S, alignment=causal_alignment)
        if dims.window is not None:
            left, right = dims.window
            at = offset
            if bug == "window_no_offset" or (
                bug == "window_offset_only_if_causal" and not is_causal
            ):
                at = 0
            if left is not None:
                allowed = allowed & (
                    j > i + at - left if bug == "window_left_exclusive" else j >= i + at - left
                )
            if right is not None:
                allowed = allowed & (
                    j < i + at + right if bug == "window_right_exclusive" else j <= i + at + right
                )
        if q_ids is not None:
            q, kv = q_ids[..., None, :, None], kv_ids[..., None, None, :]  # (..., 1, L|1, 1|S)
            allowed = allowed & (kv <= q if bug == "segments_less_equal" else q == kv)
        if bias is not None and bug != "bias_ignored":
            allowed = allowed & (bias != -np.inf)
        return allowed, offset

    def weights(query, key, dims, allowed, offset, bias, softcap, sinks, slopes):
        low = bug == "low_precision_softmax" and query.dtype == np.float16
        ct = np.float16 if low else np.float64 if query.dtype == np.float64 else np.float32
        K, G = key.shape[-3], dims.H // key.shape[-3]
        heads = np.arange(dims.H) % K if bug == "gqa_tiling" else np.arange(dims.H) // G
        k = np.take(key.astype(ct), heads, axis=-3)  # (..., H, S, D)
        s = query.astype(ct) @ np.swapaxes(k, -1, -2) * ct(dims.scale)  # (..., H, L, S)
        if softcap is not None and bug != "softcap_after_mask":
            s = softcap * np.tanh(s / softcap)
        if bias is not None and bug != "bias_ignored":
            s = s + bias.astype(ct)
        if slopes is not None:
            slopes = slopes.astype(ct)[::-1] if bug == "alibi_reversed" else slopes.astype(ct)
            at = 0 if bug == "alibi_no_offset" else offset
            distance = np.abs(np.arange(dims.L)[:, None] + at - np.arange(dims.S)[None, :])
            sign = 1 if bug == "alibi_sign_flipped" else -1
            s = s + sign * slopes[:, None, None] * distance  # (H, L, S)
        fill = -1e9 if bug == "mask_fill_minus_1e9" else -np.inf
        s = np.where(allowed, s, fill)
        if bias is not None and bug != "bias_ignored":
            s = np.where(bias == -np.inf, -np.inf, s)  # -inf, even where a NaN key made NaN
        if softcap is not None and bug == "softcap_after_mask":
            s = softcap * np.tanh(s / softcap)
        sink = None
        if sinks is not None and bug != "sinks_dropped":
            sink = sinks.astype(ct)[:, None, None]  # (H, 1, 1)
            if bug == "sink_scaled":
                sink = sink * ct(dims.scale)
            if bug == "sink_softcapped" and softcap is not None:
                sink = softcap * np.tanh(sink / softcap)
        axis = -2 if bug == "softmax_wrong_axis" else -1
        if bug in ("no_max_subtraction", "low_precision_softmax"):
            m = 0.0
        else:
            m = np.max(s, axis=axis, keepdims=True, initial=-np.inf)
            if sink is not None:
                m = np.maximum(m, sink)
            if bug == "threshold_fully_masked":
                m = np.where(m < -1e30, np.inf, m)  # such rows come out as exp(-inf) = 0
            elif bug == "shift_guard_nonfinite":
                m = np.where(np.isfinite(m), m, 0.0)  # +inf too: exp(inf - 0) clamps to 1
            elif bug != "nan_on_fully_masked":
                m = np.where(m == -np.inf, 0.0, m)
        e = np.exp(s - m)
        if bug == "shift_guard_nonfinite":  # with the exponent clamped at 0, as real paths do
            e = np.exp(np.minimum(s - m, 0.0))  # exp(inf - 0) -> 1: a finite, wrong row
        z = e.sum(axis=axis, keepdims=True)
        w_sink = None
        if sink is not None:
            w_sink = np.exp(sink - m)
            w_sink = np.where(z == 0, 0.0, w_sink)  # a row with no key: zeros, sink or not
            z = z + w_sink
        if bug != "nan_on_fully_masked":
            z = np.where(z == 0, 1, z)
        return e / z, (None if w_sink is None else w_sink / z)

    def prepared(query, key, value, mask, bias, is_causal, causal_alignment, scale, softcap, extra):
        extra = {name: x for name, x in extra.items() if x is not None}
        dims = validate(
            query, key, value, mask, bias, is_causal, causal_alignment, scale, softcap, extra
        )
        q_descale = None if bug == "fp8_q_descale_dropped" else extra.get("q_descale")
        query = dequantized(query, q_descale, bug, "query")  # fp8: after validation
        if bug == "fp8_k_descale_by_query_head" and is_fp8(key.dtype.name):
            key = key_by_query_head(key, extra.get("k_descale"), dims.H)
        key = dequantized(key, extra.get("k_descale"), bug, "key")
        allowed, offset = allowed_positions(
            dims, mask, bias, is_causal, causal_alignment, extra.get("q_segment_ids"),
            extra.get("kv_segment_ids"),
        )
        sinks = extra.get("sinks")
        if bug == "fp8_sink_times_k_descale" and sinks is not None and "k_descale" in extra:
            d = np.asarray(extra["k_descale"], np.float32)  # one per key/value head, K = 1 here
            sinks = sinks * d.reshape(()) if d.size == 1 else sinks
        w, w_sink = weights(query, key, dims, allowed, offset, bias, softcap, sinks,
                            extra.get("alibi_slopes"))
        return dims, allowed, w, w_sink

    def attention_weights(
        query,
        key,
        *,
        mask=None,
        bias=None,
        is_causal=False,
        causal_alignment="top_left",
        scale=None,
        softcap=None,
        **extra,  # window, segment ids, sinks, ALiBi slopes
    ):
        with np.errstate(all="ignore"):  # the bugs make NaN and inf; the values must show it
            _, _, w, _ = prepared(
                query, key, NO_VALUE, mask, bias, is_causal, causal_alignment, scale, softcap, extra
            )
        return w if bug == "output_not_cast" else w.astype(result_dtype(query, bug))

    def scaled_dot_product_attention(
        query,
        key,
        value,
        *,
        mask=None,
        bias=None,
        is_causal=False,
        causal_alignment="top_left",
        scale=None,
        softcap=None,
        **extra,  # window, segment ids, sinks, ALiBi slopes
    ):
        with np.errstate(all="ignore"):
            dims, allowed, w, w_sink = prepared(
                query, key, value, mask, bias, is_causal, causal_alignment, scale, softcap, extra
            )
            v_descale = extra.get("k_descale" if bug == "fp8_value_with_k_descale" else "v_descale")
            value = dequantized(value, v_descale, bug, "value")
            K, H = value.shape[-3], dims.H
            heads = np.arange(H) % K if bug == "gqa_tiling" else np.arange(H) // (H // K)
            v = np.take(value.astype(w.dtype), heads, axis=-3)  # (..., H, S, E)
            # value rows no query attends are zeroed: NaN or inf there (padding) never leaks
            attended = np.broadcast_to(allowed, w.shape).any(axis=-2)  # (..., H, S)
            out = w @ np.where(attended[..., None], v, 0.0)  # (..., H, L, E)
            if w_sink is not None and bug == "sink_has_value":
                out = out + w_sink * v[..., :1, :]  # the first key's value row
        return out if bug == "output_not_cast" else out.astype(result_dtype(query, bug))

    def apply_rotary(x, positions, *, theta=10000.0, rotary_dim=None, interleaved=False,
                     inv_freq=None, attention_factor=1.0):
        dims = check_rotary(
            x, positions, theta=theta, rotary_dim=rotary_dim, interleaved=interleaved,
            inv_freq=inv_freq, attention_factor=attention_factor,
        )
        low = bug == "rope_angles_low_precision" and x.dtype != np.float64
        ct = np.float64 if x.dtype == np.float64 else np.float32
        R, P = dims.rotary_dim, dims.rotary_dim // 2
        if bug == "rope_interleave_over_d" and dims.interleaved:
            R, P = dims.D, dims.D // 2  # the pairs reshaped over all of D, not rotary_dim
        p = np.arange(P)
        exponent = -p / R if bug == "rope_exponent_halved" else -2 * p / R
        angle_dtype = x.dtype if low else ct
        scaled = inv_freq is not None and bug != "rope_inv_freq_ignored"
        with np.errstate(all="ignore"):  # float16 angles overflow at 1e5: the bug shows as NaN
            base = np.asarray(inv_freq, np.float64) if scaled else dims.theta**exponent
            inv_freq = np.resize(base, P).astype(angle_dtype)  # (P,)
            pos = np.broadcast_to(positions, dims.positions_shape).astype(angle_dtype)  # (.., L)
            angle = (pos[..., None, :, None] * inv_freq).astype(angle_dtype)  # (..., 1, L, P)
            cos, sin = np.cos(angle).astype(ct), np.sin(angle).astype(ct)
        factor = dims.attention_factor
        if bug == "rope_attention_factor_squared":
            factor = factor * factor  # the softmax scale's mscale ** 2 taken for the rotary's
        cos = cos * factor
        sin = sin * (1.0 if bug == "rope_attention_factor_cos_only" else factor)
        interleaved = dims.interleaved != (bug == "rope_pairs_swapped")
        idx1 = 2 * p if interleaved else p  # the features of each pair
        idx2 = 2 * p + 1 if interleaved else p + P
        xr = x.astype(ct)
        out = xr.copy()
        out[..., idx1] = xr[..., idx1] * cos - xr[..., idx2] * sin
        out[..., idx2] = xr[..., idx2] * cos + xr[..., idx1] * sin
        return out.astype(x.dtype)

    GroupedQueryAttention, MultiHeadAttention = broken_modules(
        bug, scaled_dot_product_attention, attention_weights, apply_rotary
    )
    from conformance.tests.mla_broken import broken_mla

    port = SimpleNamespace(
        __name__=f"broken_ports.{bug or 'correct'}",
        MultiHeadLatentAttention=broken_mla(
            bug, scaled_dot_product_attention, attention_weights, apply_rotary
        ),
        causal_mask=causal_mask,
        attention_weights=attention_weights,
        scaled_dot_product_attention=scaled_dot_product_attention,
        GroupedQueryAttention=GroupedQueryAttention,
        MultiHeadAttention=MultiHeadAttention,
        apply_rotary=apply_rotary,
        quantize_fp8=broken_quantize(bug),
    )
    if flash or (bug or "").startswith("flash_"):
        from conformance.tests import flash_broken

        flash_bug = bug.removeprefix("flash_") if bug else "none"
        port.flash_attention = flash_broken.broken_flash(flash_bug)
    if grad or (bug or "").startswith("grad_"):
        from conformance.tests.grad_broken import vjp_pair

        grad_bug = bug.removeprefix("grad_") if bug else "none"
        port.scaled_dot_product_attention_vjp, port.flash_attention_vjp = vjp_pair(grad_bug)
    if paged or (bug or "").startswith("paged_"):
        from conformance.tests.paged_broken import paged_pair

        tiled = (bug or "").startswith("paged_flash_")  # the tiled read's bug: paged is right
        paged_bug = bug.removeprefix("paged_") if bug and not tiled else "none"
        port.paged_attention, port.paged_cache_write = paged_pair(paged_bug)
    if (bug or "").startswith("paged_flash_"):
        from conformance.tests.flash_broken import PAGED_BROKEN

        port.paged_flash_attention = PAGED_BROKEN[bug.removeprefix("paged_flash_")]
    return port


def vars_of(dims) -> dict:
    """The fields of an ``AttentionDims`` (plus E) as a dict, to change one of them."""
    fields = ("batch", "H", "K", "L", "S", "D", "E", "scale", "window")
    return {f: getattr(dims, f) for f in fields} | {"G": dims.G}


#: One broken port as a module attribute, for the CLI:
#: ``python -m conformance --impl conformance.tests.broken_ports:scale_missing``.
scale_missing = make_port("scale_missing")
