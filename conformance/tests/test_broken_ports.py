"""Proof of power: every deliberately broken port fails the suite.

The unbroken version of the same small port passes every run (with its tiled ``flash_attention``
too), so each failure below is caused by its bug; each bug also fails the one run named for it in
``broken_ports.BUGS``: functional bugs, module and KV-cache bugs, and the classic online-softmax
bugs of ``flash_broken.py``. The sharded ports of ``sharded_broken.py`` (ring and head-parallel
mistakes around the real block) are run through the runner's sharded aliases the same way, and
the packed variable-length ports of ``varlen_broken.py`` through ``varlen`` and ``varlen_grad``.

Two tiers. ``make test`` runs every unbroken suite whole and, for each bug, the runs a test names
(``run_suite(only=...)``: the named run fails, the named neighbours pass or fail as stated): a
few milliseconds a bug. The tests marked ``slow`` (``make test-slow``, which CI also runs) run
each broken port through its whole suite, about 5 s a bug, and check *where* it fails: that a
module bug leaves every functional run alone, a window bug every v1 run, and so on.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from conformance.runner import SHARDED_ALIASES, Outcome, Report, run_suite
from conformance.tests import sharded_broken, varlen_broken
from conformance.tests.broken_ports import BUGS, make_port
from conformance.tests.fp8_table import TABLE_BUGS, bounds_table

_REPORTS: dict[str | None, Report] = {}
MODULE_BUGS = [b for b in BUGS if BUGS[b][1].startswith(("module.", "decode."))]
FLASH_BUGS = [b for b in BUGS if b.startswith("flash_") and not b.startswith("flash_fp8_")]
#: The tiled path's fp8 bugs (flash_broken.py's step 0), run on the flash alias alone.
FLASH_FP8_BUGS = [b for b in BUGS if b.startswith("flash_fp8_")]
#: The families of the keywords contract v2 added: window, segment ids, sinks, ALiBi slopes.
EXTRA_FAMILIES = ("window", "segments", "sinks", "alibi")
#: (Not the tiled paged read's bugs: a block walk's bug that a window shows is no window bug.)
EXTRA_BUGS = [
    b for b in BUGS
    if BUGS[b][1].split(".")[1] in EXTRA_FAMILIES and not b.startswith("paged_flash_")
]


GRAD_BUGS = [b for b in BUGS if b.startswith("grad_")]
GRAD_FUNCTIONS = ("grad", "flash_grad")
#: The paged key/value cache bugs (paged_broken.py) and the aliases they are run on; the fp8
#: cache's bugs (``paged_fp8_*``) change fp8 calls only. The tiled read's block-walk bugs
#: (``paged_flash_*``, flash_broken.py's PAGED_BUGS) are run on its alias alone.
PAGED_FLASH_BUGS = [b for b in BUGS if b.startswith("paged_flash_")]
PAGED_BUGS = [b for b in BUGS if b.startswith("paged_") and b not in PAGED_FLASH_BUGS]
PAGED_FP8_BUGS = [b for b in PAGED_BUGS if b.startswith("paged_fp8_")]
PAGED_FUNCTIONS = ("paged", "paged_write")
#: The fp8 bugs (fp8_broken.py: dequantize, result dtype, quantize_fp8) and their aliases.
FP8_BUGS = [b for b in BUGS if b.startswith("fp8_")]
FP8_FUNCTIONS = ("sdpa", "weights", "quantize")


def _report(bug: str | None) -> Report:
    """The whole suite for a bug; the gradient runs alone for a backward bug (the forward is
    the unbroken port's, which the first test proves)."""
    if bug not in _REPORTS:
        _REPORTS[bug] = run_suite(make_port(bug), functions=_functions(bug))
    return _REPORTS[bug]


def _functions(bug: str | None) -> tuple[str, ...] | None:
    """The aliases a bug's port is run on: the gradient, paged or fp8 ones alone for those bugs
    (the rest of the port is the unbroken one, which the first tests prove), else all."""
    if bug is not None and bug.startswith("grad_"):
        return GRAD_FUNCTIONS
    if bug is not None and bug.startswith("paged_flash_"):
        return ("paged_flash",)
    if bug is not None and bug.startswith("paged_"):
        return PAGED_FUNCTIONS
    if bug is not None and bug.startswith("fp8_"):
        return FP8_FUNCTIONS
    if bug is not None and bug.startswith("flash_fp8_"):
        return ("flash",)
    return None


def _named(bug: str, run_ids: Iterable[str], port=None, functions=None) -> dict[str, Outcome]:
    """The outcomes of just ``run_ids`` for ``bug``'s port, by run id; every id must be a run."""
    wanted = set(run_ids)
    port = make_port(bug) if port is None else port
    functions = _functions(bug) if functions is None else functions
    outcomes = run_suite(port, functions=functions, only=wanted).outcomes
    missing = wanted - {o.run_id for o in outcomes}
    assert not missing, f"no such runs: {sorted(missing)}"
    return {o.run_id: o for o in outcomes}


def _failed_of(bug: str, run_ids: Iterable[str], **kw) -> set[str]:
    return {r for r, o in _named(bug, run_ids, **kw).items() if not o.ok}


def test_the_unbroken_port_passes_everything() -> None:
    report = run_suite(make_port(None, flash=True))
    assert report.ok, "\n".join(o.line() for o in report.failures)
    assert report.counts()["pass"] == len(report.outcomes) > 400
    ran = {o.run_id.split(".")[0] for o in report.outcomes}
    assert ran == {
        "sdpa",
        "weights",
        "causal_mask",
        "flash",
        "module",
        "decode",
        "rope",
        "quantize",
    }


def test_the_unbroken_backward_passes_every_gradient_run() -> None:
    report = run_suite(make_port(None, grad=True), functions=GRAD_FUNCTIONS)
    assert report.ok, "\n".join(o.line() for o in report.failures)
    assert report.counts()["pass"] == len(report.outcomes) > 150
    assert {o.run_id.split(".")[0] for o in report.outcomes} == set(GRAD_FUNCTIONS)


@pytest.mark.parametrize("bug", list(BUGS))
def test_broken_port_is_caught(bug: str) -> None:
    what, must_fail = BUGS[bug]
    assert _failed_of(bug, [must_fail]) == {must_fail}, f"{bug} ({what}) passed {must_fail}"


@pytest.mark.slow
def test_every_broken_port_is_caught_and_counted(capsys: pytest.CaptureFixture) -> None:
    caught = {bug: len(_report(bug).failures) for bug in BUGS}
    with capsys.disabled():
        print(f"\nbroken ports caught: {sum(n > 0 for n in caught.values())} of {len(BUGS)}")
        for bug, n in caught.items():
            print(f"  {bug:<26} {n:>4} failing runs  ({BUGS[bug][0]})")
    assert len(BUGS) >= 12 + 12 + 5 + 4  # functional v1 and v2, module and decode, flash
    assert len(MODULE_BUGS) >= 5 and len(FLASH_BUGS) == 4 and len(EXTRA_BUGS) >= 12
    assert len(GRAD_BUGS) >= 9
    assert all(n > 0 for n in caught.values())


def test_tiling_is_told_apart_from_contiguous_groups() -> None:
    """GQA 6:2 and 6:3 fail for a tiling port in every dtype; with K = 1 (MQA 8:1) tiling and
    contiguous groups are the same mapping (h % 1 == h // 8 == 0), so it passes there."""
    dtypes = ("float64", "float32", "float16", "bfloat16")
    told = [f"{r}.{d}" for r in ("sdpa.gqa.h6_k2", "module.gqa.h6_k2") for d in dtypes]
    same = [f"{r}.{d}" for r in ("sdpa.gqa.h8_k1", "module.mqa.h6_k1") for d in dtypes]
    told += ["sdpa.gqa.h6_k3.float32", "weights.gqa.h6_k2.head_mask.float32"]
    # the module runs on the port's SDPA, so it is told apart too
    assert _failed_of("gqa_tiling", told + same) == set(told)


@pytest.mark.slow
@pytest.mark.parametrize("bug", MODULE_BUGS)
def test_module_bugs_leave_the_functional_runs_alone(bug: str) -> None:
    """A bug in the module or the cache fails module or decode runs only: the suite says where."""
    failed = {o.run_id.split(".")[0] for o in _report(bug).failures}
    assert failed <= {"module", "decode"}, failed


def test_module_bugs_fail_in_every_dtype() -> None:
    dtypes = ("float64", "float32", "float16", "bfloat16")
    runs = [f"{r}.{d}" for r in ("module.mha.self", "decode.mha.h6.tokens") for d in dtypes]
    for bug in ("o_proj_transposed", "qk_swapped", "heads_wrong_end", "bias_missing"):
        assert _failed_of(bug, runs) == set(runs), bug


#: The modules' fp8 KV cache bugs (module_broken.py) and the module-dtype decode runs they
#: leave alone: a plain, a paged and a rolling cache.
FP8_CACHE_BUGS = [b for b in BUGS if b.startswith("decode_fp8_cache_")]
CACHE_RUNS = (
    "decode.gqa.h6_k2.tokens.float32",
    "decode.gqa.h6_k2.paged.tokens.float32",
    "decode.v2.window.gqa.rolling.chunks_2_1_2.float32",
)


@pytest.mark.parametrize("bug", FP8_CACHE_BUGS)
def test_fp8_cache_bugs_fail_their_run_and_leave_the_other_caches_alone(bug: str) -> None:
    """Each fp8 cache bug fails the decode.fp8_cache run named for it (the descale recomputed
    at every write; k_descale per query head; no saturation on write; the descale dropped on
    read); a cache of the module's dtype, plain, paged or rolling, still passes."""
    named = BUGS[bug][1]
    assert _failed_of(bug, [named, *CACHE_RUNS], functions=("decode",)) == {named}


def test_top_left_decoding_is_caught_token_by_token_and_in_chunks() -> None:
    """The first prefill (L = S) is the same under both alignments; the next steps are not."""
    layouts, chunkings = ("mha.h6", "gqa.h6_k2", "mqa.h6_k1"), ("tokens", "chunks_2_1_2")
    runs = [f"decode.{lay}.{ch}.float32" for lay in layouts for ch in chunkings]
    forward = [f"module.{lay}.float32" for lay in ("mha.self", "gqa.h6_k2", "mqa.h6_k1")]
    outcomes = _named("decode_top_left", runs + forward)
    assert {r for r, o in outcomes.items() if not o.ok} == set(runs)  # the forward is right
    message = outcomes["decode.gqa.h6_k2.chunks_2_1_2.float32"].message
    assert message.startswith("decode step 2 of 3 (tokens 2..2): ")


@pytest.mark.slow
@pytest.mark.parametrize("bug", EXTRA_BUGS)
def test_extra_keyword_bugs_fail_only_their_families(bug: str) -> None:
    """A window, segment, sink or ALiBi bug changes nothing a v1 case asks (those cases give no
    window, segments, sinks or slopes), so a port with one still passes all of v1."""
    families = {o.run_id.split(".")[1] for o in _report(bug).failures}
    # module.v2.* and decode.v2.*: the modules' own v2 settings (window, sinks, ALiBi, ...)
    # mla.*: latent attention with its window or sinks, on the port's functional API
    # fp8.*: the fp8 cases with a window or sinks (sdpa.fp8.all.sinks.*, ...)
    # fp8_cache.*: the modules' fp8 KV cache with a window (decode.fp8_cache.*.window.*)
    assert families and families <= {*EXTRA_FAMILIES, "v2", "mla", "fp8", "fp8_cache"}, (
        f"{bug} failed {families}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("bug", FP8_BUGS)
def test_fp8_bugs_fail_only_fp8_runs(bug: str) -> None:
    """A dequantize, result-dtype or quantize_fp8 bug fails fp8 runs only (every other case
    has no fp8 input), each the run named for it (test_broken_port_is_caught)."""
    failed = {o.run_id for o in _report(bug).failures}
    quantize = "quantize" in bug
    assert failed and all(
        r.startswith("quantize.") if quantize else ".fp8." in r for r in failed
    ), failed


@pytest.mark.slow
@pytest.mark.parametrize("bug", FLASH_BUGS)
def test_flash_bugs_fail_flash_runs_only(bug: str) -> None:
    failed = {o.run_id for o in _report(bug).failures}
    assert all(r.startswith("flash.") for r in failed)
    assert any(r.startswith("flash.tiling.") for r in failed)


@pytest.mark.slow
@pytest.mark.parametrize("bug", FLASH_FP8_BUGS)
def test_flash_fp8_bugs_fail_flash_fp8_runs_only(bug: str) -> None:
    """A dequantize bug of the tiled path fails its fp8 runs and no other flash run."""
    failed = {o.run_id for o in _report(bug).failures}
    assert failed and all(r.startswith("flash.fp8.") for r in failed), failed


def test_a_failure_names_case_index_error_bound_device_and_dtype() -> None:
    run_id = "sdpa.saturation.default_scale.bfloat16"
    line = _named("scale_missing", [run_id])[run_id].line()
    assert line.startswith("FAIL sdpa.saturation.default_scale.bfloat16 [cpu bfloat16]: ")
    assert "output max error" in line and " at (" in line and "> bound" in line


# ---------------------------------------------------------------------------------------------
# Sharded ports: ring and head-parallel
# ---------------------------------------------------------------------------------------------

_SHARDED_REPORTS: dict[str | None, Report] = {}


def _sharded_report(bug: str | None) -> Report:
    if bug not in _SHARDED_REPORTS:
        port = sharded_broken.make_port(bug)
        _SHARDED_REPORTS[bug] = run_suite(port, functions=SHARDED_ALIASES)
    return _SHARDED_REPORTS[bug]


def test_the_unbroken_sharded_port_passes_every_sharded_run() -> None:
    report = _sharded_report(None)
    assert report.ok, "\n".join(o.line() for o in report.failures)
    assert {o.run_id.split(".")[0] for o in report.outcomes} == set(SHARDED_ALIASES)
    assert len(report.outcomes) > 200


@pytest.mark.parametrize("bug", list(sharded_broken.BUGS))
def test_broken_sharded_port_is_caught(bug: str) -> None:
    what, must_fail = sharded_broken.BUGS[bug]
    port, functions = sharded_broken.make_port(bug), SHARDED_ALIASES
    failed = _failed_of(bug, [must_fail], port=port, functions=functions)
    assert failed == {must_fail}, f"{bug} ({what}) passed {must_fail}"


@pytest.mark.slow
def test_every_broken_sharded_port_is_caught_and_counted(capsys: pytest.CaptureFixture) -> None:
    bugs = sharded_broken.BUGS
    caught = {bug: len(_sharded_report(bug).failures) for bug in bugs}
    with capsys.disabled():
        n_caught = sum(n > 0 for n in caught.values())
        print(f"\nbroken sharded ports caught: {n_caught} of {len(bugs)}")
        for bug, n in caught.items():
            print(f"  {bug:<24} {n:>4} failing runs  ({bugs[bug][0]})")
    assert len(bugs) >= 8 and all(n > 0 for n in caught.values())


ROPE_BUGS = [b for b in BUGS if b.startswith("rope_")]


def _rope_run(run_id: str) -> bool:
    """rope.*, module.rope.*, decode.rope.*, and a v2 module that rotates (``.rope_window_..``)."""
    mla = ".mla." in run_id  # latent attention rotates q_pe and k_pe in every run
    return run_id.startswith("rope.") or ".rope." in run_id or ".rope_" in run_id or mla


@pytest.mark.slow
@pytest.mark.parametrize("bug", ROPE_BUGS)
def test_rope_bugs_fail_rope_runs_only(bug: str) -> None:
    """A RoPE bug fails rope.*, module.rope.* or decode.rope.* runs and nothing the unbroken
    port passes; the decode-offset bug fails decoding only, from its second step on."""
    passing = {o.run_id for o in _report(None).outcomes if o.ok}
    failed = {o.run_id: o for o in _report(bug).failures if o.run_id in passing}
    assert failed and all(_rope_run(r) for r in failed), sorted(failed)
    if bug == "rope_decode_not_offset":
        # decode.fp8_cache.*.rope.*: the fp8 KV cache's decodes with RoPE
        decodes = ("decode.rope.", "decode.rope_scaled.", "decode.fp8_cache.")
        assert all(r.startswith(decodes) for r in failed), sorted(failed)
        message = failed["decode.rope.gqa.h6_k2.chunks_2_1_2.float32"].message
        assert message.startswith("decode step 2 of 3 (tokens 2..2): ")
    if bug == "rope_angles_low_precision":  # float32 angles are what the bound allows, no more
        # only half-precision runs at long positions: 1e5, and up to 30000 (rope.inv_freq.*)
        assert {f"rope.positions.large_1e5.{d}" for d in ("float16", "bfloat16")} <= set(failed)
        assert all(r.endswith(("float16", "bfloat16")) for r in failed), sorted(failed)


def test_gradient_tiling_is_told_apart_from_contiguous_groups() -> None:
    """dK and dV summed over h % K: GQA 6:2 fails in every dtype, MQA 8:1 (one key/value head,
    where both mappings agree) passes; not summing at all fails 6:2 and 8:1."""
    grouped = [f"grad.gqa.h6_k2.{d}" for d in ("float64", "float32", "float16", "bfloat16")]
    mqa, mha = "grad.gqa.h8_k1.float32", "grad.basic.mha.float32"  # mha: G = 1, nothing to sum
    runs = [*grouped, mqa, mha]
    assert _failed_of("grad_kv_summed_tiling", runs) == set(grouped)
    assert _failed_of("grad_kv_not_summed", runs) == {*grouped, mqa}


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["grad_lse_offset"])
def test_tiled_backward_bugs_fail_only_the_tiled_runs(bug: str) -> None:
    """With one block the key block's offset is the query block's: only flash_grad sees it."""
    failed = {o.run_id.split(".")[0] for o in _report(bug).failures}
    assert failed == {"flash_grad"}


# ---------------------------------------------------------------------------------------------
# Variable-length batches (contract v3): varlen_broken.py
# ---------------------------------------------------------------------------------------------

VARLEN_FUNCTIONS = ("varlen", "varlen_grad")
_VARLEN_REPORTS: dict[str | None, Report] = {}


def _varlen_report(bug: str | None) -> Report:
    if bug not in _VARLEN_REPORTS:
        port = varlen_broken.make_port(bug)
        _VARLEN_REPORTS[bug] = run_suite(port, functions=VARLEN_FUNCTIONS)
    return _VARLEN_REPORTS[bug]


def test_the_unbroken_varlen_port_passes_every_varlen_run() -> None:
    report = _varlen_report(None)
    assert report.ok, "\n".join(o.line() for o in report.failures)
    assert {o.run_id.split(".")[0] for o in report.outcomes} == set(VARLEN_FUNCTIONS)
    assert len(report.outcomes) >= 30


@pytest.mark.parametrize("bug", list(varlen_broken.BUGS))
def test_broken_varlen_port_is_caught(bug: str) -> None:
    what, must_fail = varlen_broken.BUGS[bug]
    failed = {o.run_id for o in _varlen_report(bug).failures}
    assert must_fail in failed, f"{bug} ({what}) passed {must_fail}"
    if bug.startswith("grad_"):  # a backward bug leaves every forward run alone
        assert all(r.startswith("varlen_grad.") for r in failed)


def test_the_unbroken_paged_port_passes_every_paged_run() -> None:
    report = run_suite(make_port(None, paged=True), functions=PAGED_FUNCTIONS)
    assert report.ok, "\n".join(o.line() for o in report.failures)
    assert report.counts()["pass"] == len(report.outcomes) > 40
    assert {o.run_id.split(".")[0] for o in report.outcomes} == set(PAGED_FUNCTIONS)


@pytest.mark.slow
@pytest.mark.parametrize("bug", PAGED_BUGS)
def test_paged_bugs_fail_in_their_aliases_only(bug: str) -> None:
    """A paged bug fails paged runs (the rest of the port is the unbroken one); every value
    bug of paged_attention fails in every dtype of the mixed decode and prefill case."""
    failed = {o.run_id for o in _report(bug).failures}
    assert {r.split(".")[0] for r in failed} <= set(PAGED_FUNCTIONS)
    if bug in PAGED_FP8_BUGS:  # the fp8 cache's bugs: paged.fp8.* runs only
        assert failed and all(".fp8." in r for r in failed), (bug, failed)
        return
    if bug not in ("paged_write_minus_one_last_slot", "paged_minus_one_last_page",
                   "paged_reads_max_len"):
        for dtype in ("float64", "float32", "float16", "bfloat16"):
            assert f"paged.page3.decode_and_prefill.causal.{dtype}" in failed, (bug, dtype)


def test_the_unbroken_tiled_paged_read_passes_every_paged_flash_run() -> None:
    """impl_numpy's tiled paged read, the code the ``paged_flash_*`` bugs break one line of."""
    import impl_numpy

    port = make_port(None, paged=True)
    port.paged_flash_attention = impl_numpy.paged_flash_attention
    report = run_suite(port, functions=("paged_flash",))
    assert report.ok, "\n".join(o.line() for o in report.failures)
    assert report.counts()["pass"] == len(report.outcomes) > 40


@pytest.mark.slow
@pytest.mark.parametrize("bug", PAGED_FLASH_BUGS)
def test_paged_flash_bugs_fail_every_dtype_of_the_mixed_case(bug: str) -> None:
    """A block-walk bug fails tiled paged runs only, and (but for the one a window shows) the
    mixed decode and prefill case in every dtype; the plain path's runs are the unbroken
    port's."""
    failed = {o.run_id for o in _report(bug).failures}
    assert failed and all(r.startswith("paged_flash.") for r in failed), (bug, failed)
    if bug != "paged_flash_pages_from_row_start":
        for dtype in ("float64", "float32", "float16", "bfloat16"):
            assert f"paged_flash.page3.decode_and_prefill.causal.{dtype}" in failed, (bug, dtype)


@pytest.mark.slow
@pytest.mark.parametrize(
    "bug",
    ["rope_inv_freq_ignored", "rope_attention_factor_cos_only", "rope_attention_factor_squared"],
)
def test_scaled_rotary_bugs_fail_only_contract_v3_runs(bug: str) -> None:
    """A port that mishandles inv_freq or attention_factor still passes every v1 and v2 run
    (none gives them): the suite says the bug is in the scaled frequencies."""
    failed = _report(bug).failures
    v3_modules = (".mla.", ".rope_scaled.")  # MLA's YaRN, the modules' rope_inv_freq: v3 too
    rope = [o.run_id for o in failed if not any(m in o.run_id for m in v3_modules)]
    assert rope and all(r.startswith("rope.") for r in rope)
    assert all(("inv_freq" in r) or ("attention_factor" in r) for r in rope)


MLA_BUGS = [b for b in BUGS if b.startswith("mla_")]


@pytest.mark.slow
@pytest.mark.parametrize("bug", MLA_BUGS)
def test_latent_attention_bugs_fail_only_mla_runs(bug: str) -> None:
    """An MLA bug leaves every GQA module and decode run passing: the suite says where it is."""
    failed = _report(bug).failures
    assert failed and all(".mla." in o.run_id for o in failed), [o.run_id for o in failed]


@pytest.mark.slow
def test_the_absorbed_scale_and_the_unrotated_cache_fail_decoding_only() -> None:
    """The decode bugs leave the forward right: module.mla.* all pass, decode.mla.* fail."""
    for bug in (
        "mla_absorbed_scale_latent",
        "mla_cache_k_pe_unrotated",
        "mla_absorb_uk_uv_swapped",
    ):
        failed = {o.run_id for o in _report(bug).failures}
        assert failed and all(r.startswith("decode.mla.") for r in failed), (bug, failed)
    assert len(MLA_BUGS) >= 9


def test_fp8_bounds_table_on_three_fixtures() -> None:
    """docs/SEMANTICS.md's fixture table (fp8_table.py): on each of its three fixtures the
    correct port is inside the strict bound, the kernels' bound is at least the strict one, and
    each of the four broken ports is outside both."""
    for row in bounds_table():
        assert row["kernel bound"] >= row["strict bound"] > row["correct port"], row
        for title in TABLE_BUGS:
            assert row[title] > row["kernel bound"], (row["fixture"], title)
