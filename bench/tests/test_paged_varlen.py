"""The paged decode, fp8 cache and varlen rows (issues 27, 28): their wiring, goals and
workloads, the bytes read by formula, and the timed calls computing the float64 oracle's
``paged_attention`` / ``varlen_attention`` (conformance/oracle.py). No timing asserted."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from bench import preparers
from bench.plan import build_cases
from bench.report import _cache_note, fmt_bytes
from bench.rows import ROWS, row_by_name
from bench.workloads import (
    PAGE_SIZE,
    PAGED_FIXED_BLOCK_K,
    PAGED_GOAL_WORKLOAD,
    VARLEN_GOAL_WORKLOAD,
    Workload,
    grid,
    paged_lengths,
    varlen_lengths,
)
from conformance import oracle

from .helpers import assert_within_bound, goal_cases, machine, to_np

_FRAMEWORKS = ("numpy", "torch", "jax")


def test_the_rows_their_refs_gates_and_goals():
    for fw in _FRAMEWORKS:
        paged, contiguous = (
            row_by_name(f"{fw} paged decode"),
            row_by_name(f"{fw} contiguous decode"),
        )
        fp8 = row_by_name(f"{fw} paged decode fp8")
        fixed = row_by_name(f"{fw} paged decode 128-key blocks")
        varlen, padded = row_by_name(f"{fw} varlen"), row_by_name(f"{fw} varlen padded")
        tiled_paged = f"impl_{fw}.flash:paged_flash_attention"
        assert paged.target == fp8.target == fixed.target == tiled_paged
        assert contiguous.target == f"impl_{fw}.flash:flash_attention"
        assert varlen.target == f"impl_{fw}.varlen:varlen_flash_attention"
        assert padded.target == f"impl_{fw}.functional:scaled_dot_product_attention"
        assert (paged.ref, fp8.ref, fixed.ref, varlen.ref) == (
            contiguous.name, paged.name, paged.name, padded.name)
        rows = (paged, contiguous, fp8, fixed, varlen, padded)
        gates = [(r.gate_port, r.gate_alias) for r in rows]
        ops = ("paged_flash", "flash", "paged_flash", "paged_flash", "varlen_flash", "sdpa")
        assert gates == [(f"impl_{fw}", op) for op in ops]
        (g,) = paged.goals
        assert (g.kind, g.limit, g.ref, g.on) == ("ratio", 1.15, contiguous.name,
                                                 PAGED_GOAL_WORKLOAD)
        (g,) = varlen.goals
        assert (g.kind, g.limit, g.ref, g.on) == ("ratio", 0.6, padded.name, VARLEN_GOAL_WORKLOAD)
        assert g.met(0.6) and not g.met(0.61)
        assert g.text() == f"<= 0.6x {padded.name} (N=8 T=8192)"
        # the fp8 row only on the bfloat16 workloads: its ratio is against the bf16 cache
        bf16 = Workload("paged_decode", 8, 8, 2, 1, 1025, 64, 64, dtype="bfloat16")
        f32 = Workload("paged_decode", 8, 8, 2, 1, 1025, 64, 64)
        assert fp8.applies_to(bf16) and not fp8.applies_to(f32)
        assert fixed.applies_to(f32) and not fixed.applies_to(bf16)  # float32 only: memory
        assert paged.applies_to(bf16) and paged.applies_to(f32)
    paged_rows = {r.name for r in ROWS if r.workloads == "paged_decode"}
    assert len(paged_rows) == 12 + 4  # the three packages' four, the two kernel ports' two
    for r in ROWS:  # only the paged rows take the paged workloads, only varlen's the varlen ones
        takes_f32 = r.dtypes in (None, ("float32",))
        assert r.applies_to(PAGED_GOAL_WORKLOAD) == (r.name in paged_rows and takes_f32)
        assert r.applies_to(VARLEN_GOAL_WORKLOAD) == (r.workloads == "varlen")


def test_the_fixed_block_row_reads_8_pages_a_block_and_the_default_row_the_default():
    """The 128-key rows' memory is the tiled read's at a fixed block (issue 27: the same at
    every P): the step passes ``block_k=PAGED_FIXED_BLOCK_K``, 8 pages, shorter than every
    grid's longest sequence; the goal row passes no ``block_k``."""
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return args[0]

    assert PAGED_FIXED_BLOCK_K == 8 * PAGE_SIZE
    for w in (w for g in ("quick", "full") for w in grid("cpu", g) if w.op == "paged_decode"):
        assert max(w.lengths) > PAGED_FIXED_BLOCK_K, w.id
    for name in ("numpy paged decode 128-key blocks", "numpy paged decode"):
        preparers._prepare_paged_decode(row_by_name(name), spy, _WP, "cpu").call()
    assert seen == [{"block_k": PAGED_FIXED_BLOCK_K}, {}]


def test_the_workloads_lengths_and_grids():
    w = PAGED_GOAL_WORKLOAD
    assert (w.op, w.B, w.H, w.K, w.D, w.E, w.P, w.L) == ("paged_decode", 8, 8, 2, 64, 64, 4096, 1)
    assert paged_lengths(4096) == w.lengths and sum(w.lengths) == 4096
    assert len(set(w.lengths)) == 8  # eight different lengths
    assert varlen_lengths(8192) == (64, 128, 256, 576, 1024, 2048, 2048, 2048)
    assert sum(varlen_lengths(2048)) == 2048 and max(varlen_lengths(2048)) == 512
    v = VARLEN_GOAL_WORKLOAD
    assert (v.op, v.B, v.L, v.S, v.is_causal, v.lengths) == ("varlen", 8, 8192, 8192, True,
                                                             varlen_lengths(8192))

    def of(name: str, op: str) -> set[tuple[int, str]]:
        return {(x.P if op == "paged_decode" else x.L, x.dtype) for x in grid("cpu", name)
                if x.op == op}

    assert of("quick", "paged_decode") == {(1024, "float32"), (1024, "bfloat16")}
    assert of("full", "paged_decode") >= {(1024, "float32"), (8192, "float32"),
                                          (4096, "bfloat16")}
    assert of("quick", "varlen") == {(2048, "float32")}
    assert of("full", "varlen") == {(2048, "float32"), (8192, "float32")}
    for name in ("quick", "full"):
        for x in grid("cpu", name):
            if x.op in ("paged_decode", "varlen"):
                assert Workload.from_dict(x.to_dict()) == x
    full = goal_cases("cpu", grid("cpu", "full"), ROWS, resolve_error=lambda r: None)
    pairs = {c.row.name: (c.pair[1][0].name, c.workload) for c in full
             if c.workload.op in ("paged_decode", "varlen")}
    assert pairs == {
        **{f"{fw} paged decode": (f"{fw} contiguous decode", w) for fw in _FRAMEWORKS},
        **{f"{fw} varlen": (f"{fw} varlen padded", v) for fw in _FRAMEWORKS},
    }
    quick = goal_cases("cpu", grid("cpu", "quick"), ROWS, resolve_error=lambda r: None)
    assert not [c for c in quick if c.workload.op in ("paged_decode", "varlen")]


def test_the_bytes_read_are_the_formulas_and_fp8_reads_half():
    # lengths 6, 13, 21 (P = 40): 1 + 1 + 2 pages of 16
    w = Workload("paged_decode", 3, 4, 2, 1, 41, 8, 5, dtype="bfloat16")
    assert w.lengths == (6, 13, 21)
    assert w.cache_bytes() == 4 * PAGE_SIZE * 2 * (8 + 5) * 2
    assert w.padded_cache_bytes() == 3 * 2 * 21 * (8 + 5) * 2
    assert w.fp8_cache_bytes() * 2 == w.cache_bytes()  # e4m3: one byte, bfloat16: two
    g = PAGED_GOAL_WORKLOAD  # float32: a quarter; its bf16 twin: half
    assert g.fp8_cache_bytes() * 4 == g.cache_bytes()
    note = _cache_note(w.to_dict())
    assert f"paged {fmt_bytes(w.cache_bytes())} (whole pages)" in note
    assert note.endswith(f"fp8 e4m3 pages {fmt_bytes(w.fp8_cache_bytes())}")
    assert g.flops() == (2 * 8 * 4096 * 128,) * 2


# ------------------------------------------------------------------------ the timed calls

_WP = Workload("paged_decode", 3, 4, 2, 1, 41, 8, 5)  # lengths 6, 13, 21; a partial last page
_WV = Workload("varlen", 8, 4, 2, 256, 256, 8, 5, True)  # lengths 2..64


def _oracle_paged(host: dict, query, key_cache, value_cache, **descales) -> np.ndarray:
    return oracle.paged_attention(
        to_np(query), to_np(key_cache), to_np(value_cache), host["block_table"],
        host["seq_lens"], host["cu_seqlens_q"], **descales,
    )


@pytest.mark.parametrize("fw", ["numpy", "torch", pytest.param("jax", marks=pytest.mark.slow)])
def test_the_timed_calls_are_the_float64_oracle(fw):
    """The paged step, the contiguous masked step, the fp8 cache's step (its pools dequantized
    by their descales) and the varlen prefill against the oracle; the padded batch's valid rows
    are the packed call's."""
    pytest.importorskip(fw)
    host = preparers.paged_inputs(_WP)
    for name in (f"{fw} paged decode", f"{fw} contiguous decode",
                 f"{fw} paged decode 128-key blocks"):
        p = preparers.prepare(row_by_name(name), _WP, "cpu")
        golden = _oracle_paged(host, host["query"], host["key_cache"], host["value_cache"])
        assert_within_bound(to_np(p.call()).reshape(golden.shape), golden, golden, "float32")
    wb = Workload(**{**_WP.__dict__, "dtype": "bfloat16"})
    p = preparers.prepare(row_by_name(f"{fw} paged decode fp8"), wb, "cpu")
    out = p.call()
    assert str(out.dtype).endswith("bfloat16")
    query, key_fp8, value_fp8 = p.inputs
    assert "float8_e4m3fn" in str(key_fp8.dtype) and "float8_e4m3fn" in str(value_fp8.dtype)
    # the step's descales, found again as quantize_fp8 makes them from the bfloat16 pools:
    # max |x| / 448 per key/value head, in float32
    k_d, v_d = (np.abs(host[k].astype(ml_dtypes.bfloat16)).max(axis=(0, 1, 3)).astype(np.float32)
                / np.float32(448) for k in ("key_cache", "value_cache"))
    golden = _oracle_paged(host, query, to_np(key_fp8) * k_d[:, None],
                           to_np(value_fp8) * v_d[:, None])
    assert_within_bound(out, golden, golden, "bfloat16")
    vhost = preparers.varlen_inputs(_WV)
    p = preparers.prepare(row_by_name(f"{fw} varlen"), _WV, "cpu")
    packed = to_np(p.call())
    golden = oracle.varlen_attention(
        vhost["query"],
        vhost["key"],
        vhost["value"],
        vhost["cu_seqlens"],
        vhost["cu_seqlens"],
        is_causal=True,
    )
    assert_within_bound(packed, golden, golden, "float32")
    padded = to_np(preparers.prepare(row_by_name(f"{fw} varlen padded"), _WV, "cpu").call())
    cu = vhost["cu_seqlens"]
    for b, n in enumerate(_WV.lengths):  # (H, n, E) of the padded batch, token-major
        rows = padded[b, :, :n].transpose(1, 0, 2)
        assert_within_bound(rows, golden[cu[b] : cu[b + 1]], golden[cu[b] : cu[b + 1]],
                            "float32")


# ------------------------------------------------------------ the kernel ports, on a GPU box

_KERNEL_PAGED = {"triton": "torch", "pallas": "jax"}


def test_the_kernel_ports_paged_rows_are_planned_for_cuda_only():
    """issues 27, 28 on a GPU: each kernel port's paged decode, and its fp8 e4m3 pools against
    it, on every GPU grid's bfloat16 paged workload (P = 4096), gated on the port's own
    ``paged`` fixtures; a CPU plan has none of them (there the kernels only interpret)."""
    names = {f"{k} paged decode{s}": fw for k, fw in _KERNEL_PAGED.items() for s in ("", " fp8")}
    for name, fw in names.items():
        row = row_by_name(name)
        port = f"conformance.ports.{name.split()[0]}_flash"
        assert (row.framework, row.gate_port, row.gate_alias, row.devices) == (
            fw, port, "paged", ("cuda",)
        )
        assert row.target == f"{port}:paged_attention"
        assert row.ref == (name.removesuffix(" fp8") if name.endswith(" fp8") else None)
    for size in ("small", "quick", "full"):
        cases = [c for c in build_cases(machine("cuda"), grid("cuda", size), ROWS,
                                        resolve_error=lambda r: None) if c.row]
        mine = {(c.row.name, c.workload.P, c.workload.dtype, c.fdevice) for c in cases
                if c.row.name in names}
        devices = {"torch": "cuda", "jax": "gpu"}
        assert {(n, 4096, "bfloat16", devices[fw]) for n, fw in names.items()} <= mine, size
        assert all(dtype == "bfloat16" for _, _, dtype, _ in mine)
    cpu = [c for c in build_cases(machine("cpu"), grid("cpu", "full"), ROWS,
                                  resolve_error=lambda r: None) if c.row]
    assert not [c for c in cpu if c.row.name in names]


_V3_ROWS = ("paged decode", "contiguous decode", "paged decode fp8", "varlen", "varlen padded",
            "MLA decode", "MLA naive decode", "MLA prefill", "GQA prefill (MLA size)")


def test_every_gpu_grid_times_the_v3_rows_on_the_gpu():
    """issue 33: a GPU run times what contract v3 added on the GPU, the first run included
    (``make gpu-check``'s small grid): torch's and JAX's paged, fp8, varlen and MLA rows on the
    framework's GPU device, the kernel ports' varlen next to them on the bfloat16 varlen
    workload; NumPy's stay on the host, skipped by its rule where the workload is not float32."""
    devices = {"torch": "cuda", "jax": "gpu"}
    for size in ("small", "quick", "full"):
        cases = [c for c in build_cases(machine("cuda"), grid("cuda", size), ROWS,
                                        resolve_error=lambda r: None) if c.row]
        timed = {(c.row.name, c.fdevice) for c in cases if c.skip is None}
        for fw, device in devices.items():
            for name in _V3_ROWS:
                assert (f"{fw} {name}", device) in timed, (size, fw, name)
        varlen = {(c.row.name, c.workload.dtype, c.fdevice) for c in cases
                  if c.skip is None and c.workload.op == "varlen"}
        kernels = {("triton varlen", "bfloat16", "cuda"), ("pallas varlen", "bfloat16", "gpu")}
        assert kernels <= varlen
        assert not [c for c in cases if c.row.name.startswith("numpy") and c.skip is None
                    and c.workload.dtype != "float32"]


@pytest.mark.parametrize("kernel", list(_KERNEL_PAGED))
def test_the_kernel_ports_paged_rows_compute_the_oracle_under_the_cpu_interpreter(kernel):
    """The CUDA-only rows prepared on a CPU (Triton's interpreter on torch tensors, Pallas's on
    JAX arrays): the bf16 step and the fp8 pools' step are the float64 oracle's paged
    attention, the fp8 one on the pools dequantized by the descales quantize_fp8 made; the
    varlen prefill is the oracle's varlen attention."""
    fw = _KERNEL_PAGED[kernel]
    pytest.importorskip("triton" if fw == "torch" else "jax")
    host = preparers.paged_inputs(_WP)
    p = preparers.prepare(row_by_name(f"{kernel} paged decode"), _WP, "cpu")
    golden = _oracle_paged(host, host["query"], host["key_cache"], host["value_cache"])
    assert_within_bound(to_np(p.call()).reshape(golden.shape), golden, golden, "float32")
    wb = Workload(**{**_WP.__dict__, "dtype": "bfloat16"})
    p = preparers.prepare(row_by_name(f"{kernel} paged decode fp8"), wb, "cpu")
    out = p.call()
    assert str(out.dtype).endswith("bfloat16")
    query, key_fp8, value_fp8 = p.inputs
    assert "float8_e4m3fn" in str(key_fp8.dtype) and "float8_e4m3fn" in str(value_fp8.dtype)
    k_d, v_d = (np.abs(host[k].astype(ml_dtypes.bfloat16)).max(axis=(0, 1, 3)).astype(np.float32)
                / np.float32(448) for k in ("key_cache", "value_cache"))
    golden = _oracle_paged(host, query, to_np(key_fp8) * k_d[:, None],
                           to_np(value_fp8) * v_d[:, None])
    assert_within_bound(to_np(out), golden, golden, "bfloat16")
    vhost = preparers.varlen_inputs(_WV)
    p = preparers.prepare(row_by_name(f"{kernel} varlen"), _WV, "cpu")
    golden = oracle.varlen_attention(vhost["query"], vhost["key"], vhost["value"],
                                     vhost["cu_seqlens"], vhost["cu_seqlens"], is_causal=True)
    assert_within_bound(to_np(p.call()), golden, golden, "float32")
