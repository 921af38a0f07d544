"""The GPU kernel ports on the CPU, in their interpreters: one run of every feature, and the
classic kernel bugs caught.

``conformance/ports/triton_flash.py`` (Triton, torch tensors) and ``pallas_flash.py`` (Pallas,
JAX arrays) are checked by the runner like any port. Interpreted, a run costs about a second
(Triton runs each program in Python; Pallas compiles each case), so the default test session
takes a fixed subset, :data:`FEATURE_RUNS`, one run of every feature and dtype the kernels
support; ``make conformance-kernels`` runs every fixture.

The broken kernels are the ports' own source with one line changed (:data:`KERNEL_BUGS`):
the module is compiled again from the edited text, so the bug is exactly the diff shown, and
an edit that no longer applies (the line was rewritten) fails loudly instead of testing the
unbroken kernel. Each must fail the run named for it, which the unbroken kernel passes.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import linecache
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

from conformance.runner import Outcome, Port, check, load_port, runs_for

#: kernel -> (its port module, the package it needs)
KERNELS: dict[str, tuple[str, str]] = {
    "triton": ("conformance.ports.triton_flash", "triton"),
    "pallas": ("conformance.ports.pallas_flash", "jax"),
}

#: One run of every feature, each dtype the kernels compute, the default (sdpa) and the
#: caller's (flash) block sizes, the kernel's weights, validation, and the one refusal.
FEATURE_RUNS: tuple[str, ...] = (
    "sdpa.basic.mha.float32",  # MHA; also the run the tail bug must fail
    "sdpa.gqa.h6_k2.float32",  # GQA; the run the h % K bug must fail
    "sdpa.causal.bottom_right.l9_s5.float32",  # L > S: the first rows see no key (zeros)
    "sdpa.mask.with_causal_bottom_right.float32",
    "sdpa.mask_broadcast.b11s.float16",  # a (B, 1, 1, S) padding mask
    "sdpa.bias.with_mask.bfloat16",
    "sdpa.fully_masked.neg_inf_bias_row.float32",
    "sdpa.softcap.cap30_neg_inf_bias.float32",  # softcap, with scale=8 given
    "sdpa.shapes.e_lt_d.float32",  # E != D
    "sdpa.shapes.s0.float32",  # no keys: zeros
    "sdpa.batch.broadcast.float32",  # two batch dims, broadcast in query, key, value and mask
    "flash.gqa.h6_k2.head_mask.float32",  # blocks of 2 x 3: ragged last blocks everywhere
    "flash.tiling.rising_max.l9_s40.float32",  # the run the missing rescale must fail
    "weights.causal.top_left.l7_s5.bfloat16",  # the kernel's own weights
    "sdpa.window.both.top_left.l7_s5.float32",  # v2: rows the window leaves keyless are zeros
    "sdpa.segments.with_window.float32",  # v2: segments, window and causal in one mask
    "flash.tiling.window_causal.l113_s203.float32",  # v2: key blocks outside the band skipped
    "sdpa.sinks.with_mask_and_softcap.float32",  # v2: the sink neither scaled nor capped
    "weights.alibi.bottom_right.causal.bfloat16",  # v2: ALiBi on the bottom-right diagonal
    "sdpa.garbage.padding.float32",  # v2: NaN and inf at padded keys never reach the output
    "sdpa.error.kv_length_mismatch.float32",  # validation before launch
    "sdpa.basic.mha.float64",  # refused: xfail
)

#: bug -> (what it does, the run that must catch it, {kernel: [(line as written, with the bug,
#: how many times the line occurs)]})
KERNEL_BUGS: dict[str, tuple[str, str, dict[str, list[tuple[str, str, int]]]]] = {
    "tail_off_by_one": (
        "the scores' tail mask lets key S through (j <= S): a key past the end, loaded or "
        "padded as zeros, gets score 0 instead of -inf",
        "sdpa.basic.mha.float32",
        {
            "triton": [("(cols[None, :] < S)", "(cols[None, :] <= S)", 1)],
            "pallas": [("(cols[None, :] < S)", "(cols[None, :] <= S)", 1)],
        },
    ),
    "gqa_tiling": (
        "query head h reads key/value head h % K (tiling) instead of h // G",
        "sdpa.gqa.h6_k2.float32",
        {
            "triton": [("kv = h // G", "kv = h % (H // G)", 2)],
            "pallas": [("h // G, 0, 0)", "h % (H // G), 0, 0)", 2)],
        },
    ),
    "no_rescale": (
        "the running row sum is not rescaled by exp(m_old - m_new) when the row max rises",
        "flash.tiling.rising_max.l9_s40.float32",
        {
            "triton": [("l = l * alpha + tl.sum(p, 1)", "l = l + tl.sum(p, 1)", 2)],
            "pallas": [("l = l * alpha + p.sum(axis=1)", "l = l + p.sum(axis=1)", 2)],
        },
    ),
    "window_band_from_last_row": (
        "the key blocks left of the window are skipped from the block's last row's band, not "
        "its first row's: the first rows lose keys they may attend",
        "flash.tiling.window_causal.l113_s203.float32",
        {
            "triton": [
                ("tl.maximum(0, i0 + offset - left)", "tl.maximum(0, i_last + offset - left)", 2)
            ],
            "pallas": [
                ("jnp.clip(i0 + offset - left, 0, S)", "jnp.clip(i_last + offset - left, 0, S)", 2)
            ],
        },
    ),
    "sink_scaled": (
        "the sink logit is multiplied by the score scale like a score",
        "sdpa.sinks.with_mask_and_softcap.float32",
        {
            "triton": [("sink = tl.load(Sinks + h)", "sink = tl.load(Sinks + h) * scale", 2)],
            "pallas": [("sink = sinks_ref[...]", "sink = sinks_ref[...] * scale", 1)],
        },
    ),
    "garbage_multiplied": (
        "value rows no query attends are multiplied by their zero weights instead of selected "
        "away: 0 * NaN = NaN reaches the output",
        "sdpa.garbage.padding.float32",
        {
            "triton": [
                ("v = tl.where(attended[:, None], v.to(DOT_DTYPE), 0.0)", "v = v.to(DOT_DTYPE)", 2)
            ],
            "pallas": [("v = jnp.where(attended[:, None], v, jnp.zeros_like(v))", "v = v", 1)],
        },
    ),
}
# (A triton line that occurs twice is in both of its kernels, _flash_forward_kernel and
# _token_major_kernel: the bug is in both, and the heads-first run named catches it. The same
# for a pallas line that occurs twice, but for gqa_tiling's, two BlockSpecs of one kernel.)

#: Contract v3's fp8 in the heads-first kernel (_flash_forward_kernel): GQA with per-(batch,
#: head) descales, all fp8 and an fp8 cache under a float query, and the kernel's own weights.
#: Interpreted, about 0.3 s a run (Triton).
HEADS_FIRST_FP8_RUNS: tuple[str, ...] = (
    "sdpa.fp8.all.per_head.float8_e4m3fn",  # H 4 : K 2, the run the descale bugs must fail
    "flash.fp8.kv_cache.bfloat16_query.causal_sinks.float8_e5m2",  # fp8 cache, bfloat16 query
    "weights.fp8.all.causal_window_softcap.float8_e4m3fn",  # the weights of an all-fp8 call
)

#: Contract v3 (varlen_attention, paged_attention, fp8 inputs): kernel -> the runs of its
#: token-major kernel, then its heads-first kernel's fp8 runs, that the default session takes
#: (a kernel without those functions has no entry). Interpreted, these take about 3 s together
#: (Triton, on a shared 2-core machine).
V3_RUNS: dict[str, tuple[str, ...]] = {
    "triton": (
        "paged.page3.decode_and_prefill.causal.float32",  # decode and chunked prefill, page 3
        "paged.decode.gqa_h8_k2.page16.bfloat16",  # GQA 8:2 decode, NaN in unused slots
        "paged.sinks.window.gpt_oss.float32",  # gpt-oss on a paged cache
        "paged.softcap.window.gemma.float32",  # Gemma on a paged cache
        "paged.alibi.causal.float32",
        "paged.empty_sequences.float32",  # seq_lens 0
        "paged.error.block_table_past_the_pool.float32",  # validation before launch
        "varlen.n3.mixed.float32",  # the run the cu_seqlens off-by-one bug must fail
        "varlen.n3.causal_bottom_right.bfloat16",  # each sequence's own diagonal
        "varlen.n5.empty_sequences.float16",  # L_n = 0 and S_n = 0
        "varlen.n5.window_across_boundaries.float32",
        "varlen.fp8.all.per_sequence.causal.float8_e5m2",  # fp8 loaded in the kernel
        "varlen.fp8.kv_cache.bfloat16_query.causal_sinks.float8_e4m3fn",  # an fp8 KV cache
        "paged.fp8.all.per_sequence.causal.float8_e4m3fn",  # fp8 pages, per-sequence descales
        "paged.fp8.kv_cache.float16_query.per_head.causal.float8_e5m2",  # e5m2 pages, NaN bytes
        "varlen.n1.l6_s6.float64",  # refused: xfail
        *HEADS_FIRST_FP8_RUNS,
    ),
    "pallas": (
        "paged.page3.decode_and_prefill.causal.float32",  # decode and chunked prefill, page 3
        "paged.decode.gqa_h8_k2.page16.bfloat16",  # GQA 8:2 decode, NaN in unused slots
        "paged.in_order.not_causal.float32",  # NaN past seq_lens in a page no rule masks
        "paged.sinks.window.gpt_oss.float32",  # gpt-oss on a paged cache
        "paged.softcap.window.gemma.float32",  # Gemma on a paged cache
        "paged.alibi.causal.float32",
        "paged.empty_sequences.float32",  # seq_lens 0
        "paged.error.block_table_past_the_pool.float32",  # validation before launch
        "varlen.n3.mixed.float32",  # the run the cu_seqlens off-by-one bug must fail
        "varlen.n3.causal_bottom_right.bfloat16",  # each sequence's own diagonal
        "varlen.n5.empty_sequences.float16",  # L_n = 0 and S_n = 0
        "varlen.n5.window_across_boundaries.float32",
        "varlen.fp8.all.per_sequence.causal.float8_e5m2",  # fp8 loaded in the kernel
        "varlen.fp8.kv_cache.bfloat16_query.causal_sinks.float8_e4m3fn",  # an fp8 KV cache
        "paged.fp8.all.per_sequence.causal.float8_e4m3fn",  # fp8 pages, per-sequence descales
        "paged.fp8.kv_cache.float16_query.per_head.causal.float8_e5m2",  # e5m2 pages, NaN bytes
        "varlen.n1.l6_s6.float64",  # refused: xfail
        *HEADS_FIRST_FP8_RUNS,
    ),
}

#: Contract v3 bugs in a kernel's token-major kernel: bug -> (what it does, the run that must
#: catch it, kernel, [(line as written, with the bug, how many times the line occurs)]).
V3_KERNEL_BUGS: dict[str, tuple[str, str, str, list[tuple[str, str, int]]]] = {
    "cu_seqlens_off_by_one": (
        "sequence n's keys start one packed row early: the previous document's last key leaks in",
        "varlen.n3.mixed.float32",
        "triton",
        [("k_start = tl.load(CuK + n)", "k_start = tl.maximum(tl.load(CuK + n) - 1, 0)", 1)],
    ),
    "previous_block_table_row": (
        "sequence n reads sequence n-1's block-table row",
        "paged.page3.decode_and_prefill.causal.float32",
        "triton",
        [("BlockTable + n * stride_bt", "BlockTable + tl.maximum(n - 1, 0) * stride_bt", 1)],
    ),
    "page_offset_from_block_start": (
        "the slot j % page_size is taken from the key block's start, not from key j",
        "paged.page3.decode_and_prefill.causal.float32",
        "triton",
        [("slot = cols % page_size", "slot = (j0 + cols * 0) % page_size", 1)],
    ),
    "v_descale_dropped": (
        "the value's fp8 descale is never applied",
        "varlen.fp8.kv_cache.bfloat16_query.causal_sinks.float8_e4m3fn",
        "triton",
        [("out = acc * v_descale / l[:, None]", "out = acc / l[:, None]", 1)],
    ),
    "fp8_k_descale_per_query_head": (
        "the heads-first kernel reads k_descale at the query head h, not at its key/value "
        "head h // G",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
        "triton",
        [("tl.load(KDs + b * K_heads + kv)", "tl.load(KDs + b * K_heads + h)", 1)],
    ),
    "fp8_v_descale_dropped": (
        "the heads-first kernel never applies the value's fp8 descale",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
        "triton",
        [("out = v_descale * acc / l[:, None]", "out = acc / l[:, None]", 1)],
    ),
    "fp8_q_descale_twice": (
        "the heads-first kernel multiplies the scores by q_descale twice",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
        "triton",
        [
            (
                "score_scale = scale * tl.load(QDs + b * H + h)",
                "score_scale = scale * tl.load(QDs + b * H + h) * tl.load(QDs + b * H + h)",
                1,
            )
        ],
    ),
    "pallas_cu_seqlens_off_by_one": (
        "sequence n's keys start one packed row early: the previous document's last key leaks in",
        "varlen.n3.mixed.float32",
        "pallas",
        [("k_start = cu_k_ref[n]", "k_start = jnp.maximum(cu_k_ref[n] - 1, 0)", 1)],
    ),
    "pallas_previous_block_table_row": (
        "sequence n reads sequence n-1's block-table row",
        "paged.page3.decode_and_prefill.causal.float32",
        "pallas",
        [("page = block_table_ref[n, b]", "page = block_table_ref[jnp.maximum(n - 1, 0), b]", 1)],
    ),
    "pallas_page_start_from_the_tile": (
        "key block b (page b of the sequence) starts at key b * tile_k, the padded tile, not "
        "b * page_size: past the first page, keys sit at the wrong positions",
        "paged.page3.decode_and_prefill.causal.float32",
        "pallas",
        [("j0 = b * block_k", "j0 = b * tile_k", 1)],
    ),
    "pallas_past_seq_lens": (
        "the keys' tail mask drops j < seq_lens[n]: the unused slots of the last page (NaN) "
        "are read",
        "paged.in_order.not_causal.float32",
        "pallas",
        [("col_ok = (lane_k < block_k) & (cols < S)", "col_ok = lane_k < block_k", 1)],
    ),
    "pallas_first_block_ignores_cu_seqlens": (
        "with 2-row query blocks (V3_SMALL_BLOCKS's edit), sequence n's first query block taken "
        "as block n, not cu_q[n] // block_q + n: its rows go to the wrong blocks or to none",
        "varlen.n3.mixed.float32",
        "pallas",
        [
            ("TOKEN_BLOCK: int = 16", "TOKEN_BLOCK: int = 2", 1),
            ("i0 = (g - (cu_q_ref[n] // block_q + n)) * block_q", "i0 = (g - n) * block_q", 1),
        ],
    ),
    "pallas_fp8_k_descale_per_query_head": (
        "the heads-first kernel reads k_descale at the query head h, not at its key/value "
        "head h // G",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
        "pallas",
        [
            (
                '("k_ds", k_descale, dims.K, lambda h: h // G)',
                '("k_ds", k_descale, dims.K, lambda h: h)',
                1,
            )
        ],
    ),
    "pallas_fp8_v_descale_dropped": (
        "the heads-first kernel never applies the value's fp8 descale",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
        "pallas",
        [("(v_descale * acc / l[:, None])", "(acc / l[:, None])", 1)],
    ),
    "pallas_fp8_q_descale_twice": (
        "the heads-first kernel multiplies the scores by q_descale twice",
        "sdpa.fp8.all.per_head.float8_e4m3fn",
        "pallas",
        [
            (
                "scale * q_ds_ref[...] * k_ds_ref[...]",
                "scale * q_ds_ref[...] ** 2 * k_ds_ref[...]",
                1,
            )
        ],
    ),
    "pallas_k_descale_dropped": (
        "the key's fp8 descale is never applied to the scores",
        "varlen.fp8.kv_cache.bfloat16_query.causal_sinks.float8_e4m3fn",
        "pallas",
        [("* q_ds_ref[n, h] * k_ds_ref[n, kv]", "* q_ds_ref[n, h]", 1)],
    ),
}

#: Contract v3 with small blocks: runs of the token-major kernels again with 2 query rows per
#: program (and 2 keys per varlen key block). The fixtures' sequences (L_n <= 12) fit one
#: 16-row block each; with 2-row blocks each takes several, and Pallas's blocks of a sequence
#: start at ``cu_q[n] // 2 + n``, not at ``n``.
_SMALL_BLOCK_RUNS: tuple[str, ...] = (
    "paged.page3.decode_and_prefill.causal.float32",  # a 4-row chunk: 2 blocks
    "paged.window.left3.causal.float32",
    "varlen.n3.mixed.float32",
    "varlen.n3.causal_bottom_right.bfloat16",
    "varlen.n5.empty_sequences.float16",
    "varlen.n5.window_across_boundaries.float32",
)
#: kernel -> (the edit that sets its token-major block sizes to 2, the runs checked so)
V3_SMALL_BLOCKS: dict[str, tuple[tuple[str, str, int], tuple[str, ...]]] = {
    "triton": (("block_q = block_k = 16  #", "block_q = block_k = 2  #", 1), _SMALL_BLOCK_RUNS),
    "pallas": (("TOKEN_BLOCK: int = 16", "TOKEN_BLOCK: int = 2", 1), _SMALL_BLOCK_RUNS),
}

_PORTS: dict[tuple[str, str | None], Port] = {}
_RUNS = {run.id: run for run in runs_for()}


def _kernel_module(kernel: str) -> types.ModuleType:
    module, needs = KERNELS[kernel]
    if importlib.util.find_spec(needs) is None:  # not importorskip: the Triton port must
        pytest.skip(f"{needs} is not installed")  # import triton itself (TRITON_INTERPRET)
    return importlib.import_module(module)


def broken_module(kernel: str, bug: str) -> types.ModuleType:
    """The kernel's port module compiled again from its source with ``bug``'s edits.

    The source is registered with ``linecache`` under its own name, because Triton (and
    ``inspect``) read a kernel's source back from its file name; ``__file__`` stays the real
    one, so the broken port has the real port's xfails.
    """
    edits = V3_KERNEL_BUGS[bug][3] if bug in V3_KERNEL_BUGS else KERNEL_BUGS[bug][2][kernel]
    return _edited_module(kernel, bug, edits)


def _edited_module(kernel: str, name: str, edits: list[tuple[str, str, int]]) -> types.ModuleType:
    """The kernel's port module compiled again from its source with ``edits`` (see
    :func:`broken_module`), as the module ``<port module>_<name>``."""
    original = _kernel_module(kernel)
    source = inspect.getsource(original)
    for old, new, count in edits:
        assert source.count(old) == count, f"{kernel}: {old!r} no longer in the kernel"
        source = source.replace(old, new)
    name = f"{original.__name__}_{name}"
    filename = f"<{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(name)
    module.__file__ = original.__file__
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def _port(kernel: str, bug: str | None = None) -> Port:
    if (kernel, bug) not in _PORTS:
        module = _kernel_module(kernel) if bug is None else broken_module(kernel, bug)
        _PORTS[kernel, bug] = load_port(module)
    return _PORTS[kernel, bug]


def _check(kernel: str, run_id: str, bug: str | None = None) -> Outcome:
    return check(_port(kernel, bug), _RUNS[run_id])


def _small_block_port(kernel: str) -> Port:
    if (kernel, "small_blocks") not in _PORTS:
        module = _edited_module(kernel, "small_blocks", [V3_SMALL_BLOCKS[kernel][0]])
        _PORTS[kernel, "small_blocks"] = load_port(module)
    return _PORTS[kernel, "small_blocks"]


def test_the_feature_runs_cover_every_feature_and_dtype() -> None:
    runs = [_RUNS[r] for r in FEATURE_RUNS]
    features = {r.case.feature for r in runs}
    assert features >= {
        "basic", "gqa", "causal", "mask", "mask_broadcast", "bias", "fully_masked", "softcap",
        "shapes", "batch", "tiling", "error", "window", "segments", "sinks", "alibi", "garbage",
    }
    assert {r.case.dtype for r in runs} == {"float64", "float32", "float16", "bfloat16"}
    assert {r.function for r in runs} == {"sdpa", "flash", "weights"}
    assert {KERNEL_BUGS[b][1] for b in KERNEL_BUGS} <= set(FEATURE_RUNS)


@pytest.mark.slow  # about 1 s a run interpreted (Triton), 2 s (Pallas: one XLA compilation)
@pytest.mark.parametrize("run_id", FEATURE_RUNS)
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_kernel_passes(kernel: str, run_id: str) -> None:
    outcome = _check(kernel, run_id)
    if run_id.endswith(".float64"):  # the kernels' one deliberate refusal, from their xfails
        assert outcome.status == "xfail", outcome.line()
        assert "DTypeError: [unsupported_dtype]" in outcome.message
    else:
        assert outcome.status == "pass", outcome.line()


@pytest.mark.slow
@pytest.mark.parametrize("bug", list(KERNEL_BUGS))
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_broken_kernel_is_caught(kernel: str, bug: str) -> None:
    what, run_id, _ = KERNEL_BUGS[bug]
    with warnings.catch_warnings():  # the interpreters' NumPy warns on NaN arithmetic; the
        warnings.simplefilter("ignore", RuntimeWarning)  # bug must show in the numbers
        outcome = _check(kernel, run_id, bug)
    assert outcome.status == "fail", f"{kernel} with {bug} ({what}) passed {run_id}"
    assert any(f"{what} max error" in outcome.message for what in ("output", "weights", "lse"))


@pytest.mark.slow  # about 0.15 s a run interpreted
@pytest.mark.parametrize(
    ("kernel", "run_id"), [(k, r) for k, runs in V3_RUNS.items() for r in runs]
)
def test_kernel_v3_passes(kernel: str, run_id: str) -> None:
    outcome = _check(kernel, run_id)
    if run_id.endswith(".float64"):
        assert outcome.status == "xfail", outcome.line()
        assert "DTypeError: [unsupported_dtype]" in outcome.message
    else:
        assert outcome.status == "pass", outcome.line()


@pytest.mark.slow  # about 2 s a run interpreted (Pallas), 0.5 s (Triton)
@pytest.mark.parametrize(
    ("kernel", "run_id"), [(k, r) for k, (_, runs) in V3_SMALL_BLOCKS.items() for r in runs]
)
def test_kernel_v3_passes_with_small_blocks(kernel: str, run_id: str) -> None:
    outcome = check(_small_block_port(kernel), _RUNS[run_id])
    assert outcome.status == "pass", outcome.line()


@pytest.mark.slow
@pytest.mark.parametrize("bug", list(V3_KERNEL_BUGS))
def test_broken_kernel_v3_is_caught(bug: str) -> None:
    what, run_id, kernel, _ = V3_KERNEL_BUGS[bug]
    assert run_id in V3_RUNS[kernel]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        outcome = _check(kernel, run_id, bug)
    assert outcome.status == "fail", f"{kernel} with {bug} ({what}) passed {run_id}"
    assert "output max error" in outcome.message


def _fenced_blocks(markdown: str) -> list[tuple[str, str]]:
    """``(language, body)`` of each fenced code block, in order."""
    blocks, language, body = [], None, []
    for line in markdown.splitlines(keepends=True):
        if language is None and line.startswith("```"):
            language, body = line[3:].strip(), []
        elif language is not None and line.rstrip() == "```":
            blocks.append((language, "".join(body)))
            language = None
        elif language is not None:
            body.append(line)
    return blocks


def test_porting_md_quotes_the_triton_port_as_it_is() -> None:
    """The code and the xfails quoted in PORTING.md's "Porting a kernel" are the port's own."""
    ports = Path(__file__).resolve().parent.parent / "ports"
    text = (ports.parent / "PORTING.md").read_text()
    blocks = _fenced_blocks(text[text.index("## Porting a kernel") : text.index("## Options")])
    source = (ports / "triton_flash.py").read_text()
    quoted = [body for language, body in blocks if language == "python"]
    assert len(quoted) == 2
    for body in quoted:
        assert body in source, body
    (xfails,) = [body for language, body in blocks if language == ""]
    listed = (ports / "triton_flash.xfails").read_text().splitlines()
    assert xfails.splitlines() == [line for line in listed if line and not line.startswith("#")]


#: Compiles the Triton kernel for an H100 (sm_90), every feature on, with the PTX assembler
#: Triton ships; run in a process of its own, where Triton compiles instead of interpreting.
_TRITON_COMPILE = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from conformance.ports import triton_flash

kernel = triton_flash._flash_forward_kernel
assert not triton_flash.INTERPRETED
constexprs = dict(
    TILE_Q=16, TILE_K=16, TILE_D=16, TILE_E=16, HAS_MASK=True, HAS_BIAS=True,
    HAS_SOFTCAP=True, IS_CAUSAL=True, HAS_LEFT=True, HAS_RIGHT=True, HAS_SEGMENTS=True,
    HAS_SINKS=True, HAS_ALIBI=True, HAS_DESCALE=False, DOT_DTYPE=tl.bfloat16,
    DOT_PRECISION="tf32", P_DTYPE=tl.bfloat16,
)
pointers = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Out": "*bf16", "Lse": "*fp32",
            "Mask": "*u8", "Bias": "*fp32", "QSeg": "*i64", "KVSeg": "*i64", "Sinks": "*fp32",
            "Slopes": "*fp32", "Offsets": "*i64", "QDs": "*fp32", "KDs": "*fp32",
            "VDs": "*fp32"}
scalars = {"scale": "fp32", "softcap": "fp32"}  # every other scalar is an int
signature = {
    n: "constexpr" if n in constexprs else pointers.get(n) or scalars.get(n, "i32")
    for n in kernel.arg_names
}
source = ASTSource(
    fn=kernel, signature=signature,
    constexprs={(kernel.arg_names.index(n),): v for n, v in constexprs.items()},
)
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
print("ptx", len(compiled.asm["ptx"]), "cubin", len(compiled.asm["cubin"]))
"""


#: The heads-first kernel again with fp8 (e4m3) query, key and value and their descales,
#: converted in the kernel, float32 dots and weights, a bfloat16 output (contract v3).
_TRITON_FP8_COMPILE = (
    _TRITON_COMPILE.replace('"Q": "*bf16", "K": "*bf16", "V": "*bf16"',
                            '"Q": "*fp8e4nv", "K": "*fp8e4nv", "V": "*fp8e4nv"')
    .replace("HAS_DESCALE=False, DOT_DTYPE=tl.bfloat16", "HAS_DESCALE=True, DOT_DTYPE=tl.float32")
    .replace('"tf32", P_DTYPE=tl.bfloat16', '"ieee", P_DTYPE=tl.float32')
)

#: The same for the token-major kernel (varlen_attention, paged_attention), every feature on:
#: paged, with fp8 pages and a bfloat16 query (fp8 loaded and converted in the kernel).
_TRITON_TOKEN_MAJOR_COMPILE = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from conformance.ports import triton_flash

kernel = triton_flash._token_major_kernel
assert not triton_flash.INTERPRETED
constexprs = dict(
    TILE_Q=16, TILE_K=16, TILE_D=16, TILE_E=16, PAGED=True, BOTTOM_RIGHT=True,
    HAS_SOFTCAP=True, IS_CAUSAL=True, HAS_LEFT=True, HAS_RIGHT=True, HAS_SINKS=True,
    HAS_ALIBI=True, HAS_DESCALE=True, DOT_DTYPE=tl.float32, DOT_PRECISION="ieee",
    P_DTYPE=tl.float32,
)
pointers = {"Q": "*bf16", "K": "*fp8e4nv", "V": "*fp8e4nv", "Out": "*bf16", "CuQ": "*i64",
            "CuK": "*i64", "SeqLens": "*i64", "BlockTable": "*i64", "Sinks": "*fp32",
            "Slopes": "*fp32", "QDs": "*fp32", "KDs": "*fp32", "VDs": "*fp32"}
scalars = {"scale": "fp32", "softcap": "fp32"}  # every other scalar is an int
signature = {
    n: "constexpr" if n in constexprs else pointers.get(n) or scalars.get(n, "i32")
    for n in kernel.arg_names
}
source = ASTSource(
    fn=kernel, signature=signature,
    constexprs={(kernel.arg_names.index(n),): v for n, v in constexprs.items()},
)
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
print("ptx", len(compiled.asm["ptx"]), "cubin", len(compiled.asm["cubin"]))
"""


@pytest.mark.slow  # about 10 s each: a Python start and one compilation through ptxas
@pytest.mark.parametrize(
    "script",
    [_TRITON_COMPILE, _TRITON_FP8_COMPILE, _TRITON_TOKEN_MAJOR_COMPILE],
    ids=["flash", "flash_fp8", "token_major"],
)
def test_triton_kernel_compiles_for_cuda_without_a_gpu(script: str) -> None:
    """The code the interpreter runs is the code a GPU compiles: here, to a cubin for sm_90."""
    _kernel_module("triton")  # skips without triton
    repo = Path(__file__).resolve().parent.parent.parent
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env, cwd=repo, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ptx ") and "cubin 0" not in done.stdout


def test_pallas_kernel_lowers_for_cuda_through_triton() -> None:
    """On a GPU the pallas_call is compiled, not interpreted: lowered for CUDA here, every
    feature on, it becomes one Triton kernel call (Pallas's Triton lowering accepted it); once
    in bfloat16, once with fp8 query, key and value and their descales (contract v3)."""
    module = _kernel_module("pallas")
    import jax
    import jax.numpy as jnp

    def spec(*shape, dtype=jnp.bfloat16):
        return jax.ShapeDtypeStruct(shape, dtype)

    q, k, v = spec(2, 6, 5, 11), spec(2, 2, 7, 11), spec(2, 2, 7, 13)
    mask, bias = spec(2, 1, 1, 7, dtype=jnp.bool_), spec(6, 5, 7, dtype=jnp.float32)
    arrays = dict(
        mask=mask, bias=bias, q_segment_ids=spec(2, 5, dtype=jnp.int32),
        kv_segment_ids=spec(7, dtype=jnp.int32), sinks=spec(6), alibi_slopes=spec(6),
    )
    keywords = dict(is_causal=True, causal_alignment="bottom_right", softcap=30.0,
                    window=(2, 1), return_lse=True)
    flash = jax.jit(module.flash_attention, static_argnames=[*keywords, "block_q", "block_k"])
    traced = flash.trace(q, k, v, **arrays, block_q=2, block_k=3, **keywords)
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1
    # Contract v3: fp8 (e4m3) query, key and value with per-(batch, head) descales, loaded as
    # fp8 and converted in the kernel.
    fp8 = {n: spec(*x.shape, dtype=jnp.float8_e4m3fn) for n, x in (("q", q), ("k", k), ("v", v))}
    f32 = jnp.float32
    descales = dict(q_descale=spec(2, 6, dtype=f32), k_descale=spec(2, 2, dtype=f32),
                    v_descale=spec(2, dtype=f32))
    traced = flash.trace(*fp8.values(), **arrays, **descales, block_q=2, block_k=3, **keywords)
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1


def test_pallas_token_major_kernel_lowers_for_cuda_through_triton() -> None:
    """The same for varlen_attention and paged_attention (contract v3), every feature on: each
    becomes one Triton kernel call on CUDA, with fp8 pages (e4m3) under a bfloat16 query and an
    all-fp8 (e5m2) varlen call, fp8 loaded and converted in the kernel."""
    module = _kernel_module("pallas")
    import jax
    import jax.numpy as jnp

    def spec(*shape, dtype=jnp.float32):
        return jax.ShapeDtypeStruct(shape, dtype)

    arrays = dict(sinks=spec(6), alibi_slopes=spec(6), k_descale=spec(3, 2), v_descale=spec(2))
    keywords = dict(is_causal=True, softcap=30.0, window=(2, 1))
    e4m3, e5m2, i32 = jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int32
    paged = jax.jit(module.paged_attention, static_argnames=list(keywords))
    traced = paged.trace(
        spec(7, 6, 11, dtype=jnp.bfloat16), spec(9, 3, 2, 11, dtype=e4m3),
        spec(9, 3, 2, 13, dtype=e4m3), spec(3, 4, dtype=i32), spec(3, dtype=i32),
        spec(4, dtype=i32), **arrays, **keywords,
    )
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1
    varlen = jax.jit(module.varlen_attention, static_argnames=[*keywords, "causal_alignment"])
    traced = varlen.trace(
        spec(7, 6, 11, dtype=e5m2), spec(9, 2, 11, dtype=e5m2), spec(9, 2, 13, dtype=e5m2),
        spec(4, dtype=i32), spec(4, dtype=i32), q_descale=spec(3, 6), **arrays,
        causal_alignment="bottom_right", **keywords,
    )
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 1
