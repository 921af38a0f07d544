"""The fixtures themselves: integrity, determinism, size, and coverage of the contract."""

from __future__ import annotations

import json
import re

import ml_dtypes
import numpy as np
import pytest

from attention_spec import (
    ERROR_CODES,
    MODULE_ERROR_CODES,
    PAGED_ERROR_CODES,
    ROTARY_ERROR_CODES,
    SHARDED_ERROR_CODES,
    VARLEN_ERROR_CODES,
)
from attention_spec.mla import check_mla_canonical
from conformance import cases as C
from conformance import oracle
from conformance.fixtures import FIXTURES_DIR, load_manifest, sha256_of
from conformance.generate import check

MANIFEST = load_manifest()
BY_ID = MANIFEST.by_id()
DTYPE = "(float64|float32|float16|bfloat16|bool|int32|float8_e4m3fn|float8_e5m2)"
ID = re.compile(rf"^[a-z_]+\.[a-z_0-9]+(\.[a-z_0-9]+)*\.{DTYPE}$")


def test_ids_are_unique_and_readable() -> None:
    ids = [c.id for c in MANIFEST.cases]
    assert len(ids) == len(set(ids))
    bad = [i for i in ids if not ID.match(i)]
    assert not bad


def test_every_file_matches_its_sha256_and_nothing_else_is_there() -> None:
    files = {c.entry["file"] for c in MANIFEST.cases if c.kind == "values"}
    on_disk = {p.name for p in FIXTURES_DIR.glob("*.safetensors")}
    assert files == on_disk
    for case in MANIFEST.cases:
        if case.kind == "values":
            data = (FIXTURES_DIR / case.entry["file"]).read_bytes()
            assert sha256_of(data) == case.entry["sha256"], case.id


def test_fixtures_are_small() -> None:
    total = sum(p.stat().st_size for p in FIXTURES_DIR.iterdir())
    assert total < 20e6


def test_low_precision_inputs_are_stored_in_their_dtype_and_goldens_in_float64() -> None:
    t = BY_ID["sdpa.gqa.h6_k2.bfloat16"].tensors()
    assert t["query"].dtype == ml_dtypes.bfloat16 and t["bias" if "bias" in t else "key"].dtype
    assert t["output"].dtype == np.float64 and t["weights"].dtype == np.float64
    assert BY_ID["sdpa.gqa.h6_k2.float16"].tensors()["value"].dtype == np.float16
    assert BY_ID["sdpa.mask.random.float16"].tensors()["mask"].dtype == np.bool_


def test_every_value_case_has_positive_bounds_for_output_and_weights() -> None:
    for case in MANIFEST.cases:
        if case.kind == "values" and case.op == "sdpa":
            tol = case.tolerance
            assert tol["output"] > 0 and tol["weights"] > 0, case.id
            assert case.entry["seed"] is not None and case.entry["doc"], case.id


def test_manifest_records_versions_and_a_cross_check_verdict_per_case() -> None:
    record = MANIFEST.data["cross_check"]
    assert set(record["versions"]) >= {"numpy", "torch", "jax"}
    assert MANIFEST.data["generator_version"]
    for case in MANIFEST.cases:
        if case.kind == "values" and case.op in ("sdpa", "flash"):
            assert set(record["cases"][case.id]) == {"torch", "jax"}
    assert record["cases"]["flash.tiling.ragged.l113_s203.float32"] == {
        "torch": "agree",
        "jax": "agree",
    }


def _codes(ops: tuple[str, ...]) -> set[str]:
    errors = [c for c in MANIFEST.cases if c.kind == "error" and c.op in ops]
    return {c.entry["expected_error"]["code"] for c in errors}


def test_error_cases_cover_every_functional_rule_of_the_taxonomy() -> None:
    # SHARDED_ERROR_CODES: no ring fixtures yet (conformance/ring_cases.py); tests/test_sharded.py
    functional = set(ERROR_CODES) - MODULE_ERROR_CODES - SHARDED_ERROR_CODES - ROTARY_ERROR_CODES
    functional -= {"axes_value", "fp8_nonfinite"}  # quantize_fp8's own: quantize.error.*
    functional -= VARLEN_ERROR_CODES  # varlen.error.*: below
    functional -= PAGED_ERROR_CODES  # the paged.error.* and paged_write.error.* fixtures
    assert _codes(("sdpa", "causal_mask", "grad")) == functional  # grad: grad_output_shape
    assert _codes(("quantize",)) >= {"axes_value", "fp8_nonfinite", "descale_value"}
    assert _codes(("rope",)) >= ROTARY_ERROR_CODES  # and rank, not_a_bool, ... of x and keywords
    for case in MANIFEST.cases:
        if case.kind == "error":
            want = case.entry["expected_error"]
            assert ERROR_CODES[want["code"]][0].__name__ == want["class"], case.id


def test_paged_error_cases_cover_every_paged_rule_of_the_taxonomy() -> None:
    """Every paged code has a fixture, its integer inputs with their values (FORMAT.md)."""
    assert _codes(("paged", "paged_write")) >= PAGED_ERROR_CODES
    entry = BY_ID["paged.error.block_table_past_the_pool.float32"].entry
    assert entry["inputs"]["block_table"] == {"shape": [2, 2], "dtype": "int32",
                                              "values": [0, 1, 2, 4]}
    assert entry["inputs"]["query"] == {"shape": [3, 6, 11], "dtype": "float32"}


def test_module_error_cases_cover_every_module_rule_of_the_taxonomy() -> None:
    """Every code only the modules raise, and the functional rules a module call reaches."""
    covered = _codes(("module", "decode"))
    assert covered >= MODULE_ERROR_CODES
    assert covered >= {"heads_not_divisible", "non_positive_size", "rank", "dtype_mismatch",
                       "unsupported_dtype", "batch_not_broadcastable", "mask_kv_heads",
                       "mask_dtype", "mask_shape", "unknown_alignment"}
    errors = [c for c in MANIFEST.cases if c.kind == "error" and c.op in ("module", "decode")]
    calls = {c.entry["call"] for c in errors}
    assert calls >= {"construct", "load", "forward", "decode"}
    d_model = BY_ID["module.error.d_model_not_divisible.float32"].entry
    assert d_model["module"] == {
        "class": "MultiHeadAttention",
        "arguments": {"d_model": 16, "n_heads": 5},
    }
    assert BY_ID["decode.error.cache_overflow.float32"].entry["expected_error"] == {
        "class": "ConfigError",
        "code": "cache_overflow",
    }


def test_non_finite_keywords_are_strict_json() -> None:
    text = (FIXTURES_DIR / "manifest.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert BY_ID["sdpa.error.scale_inf.float32"].keywords["scale"] == float("inf")


#: The points of the issue, each with the cases that pin it.
COVERAGE = {
    "causal top_left L < S and L > S": ["sdpa.causal.top_left.l5_s7", "sdpa.causal.top_left.l7_s5"],
    "causal bottom_right L < S and L > S": [
        "sdpa.causal.bottom_right.l5_s7",
        "sdpa.causal.bottom_right.l9_s5",
    ],
    "fully masked rows three ways": [
        "sdpa.fully_masked.bool_row",
        "sdpa.fully_masked.neg_inf_bias_row",
        "sdpa.fully_masked.huge_negative_bias_row",
    ],
    "GQA 6:2 and MQA 8:1, per-head mask": [
        "sdpa.gqa.h6_k2",
        "sdpa.gqa.h8_k1",
        "sdpa.gqa.h6_k2.head_mask",
    ],
    "mask broadcast shapes": [
        f"sdpa.mask_broadcast.{s}" for s in ("s", "1s", "l1", "b11s", "b1ls", "1hls", "hls")
    ],
    "mask AND causal; bias with mask; bias holding -inf": [
        "sdpa.mask.with_causal",
        "sdpa.bias.with_mask",
        "sdpa.bias.neg_inf",
    ],
    "scale default, custom, 0, negative": [
        "sdpa.basic.mha",
        "sdpa.scale.custom",
        "sdpa.scale.zero",
        "sdpa.scale.negative",
    ],
    "softcap 2 and 30 with -inf bias": [
        "sdpa.softcap.cap2_neg_inf_bias",
        "sdpa.softcap.cap30_neg_inf_bias",
    ],
    "E != D, L = 0, S = 0, length 1, many batch dims": [
        "sdpa.shapes.e_lt_d",
        "sdpa.shapes.l0",
        "sdpa.shapes.s0",
        "sdpa.shapes.l1_s1",
        "sdpa.batch.many_dims",
    ],
    "saturation": ["sdpa.saturation.default_scale", "sdpa.saturation.scale_one"],
}


@pytest.mark.parametrize("point", list(COVERAGE))
def test_the_cases_cover_the_contract(point: str) -> None:
    for name in COVERAGE[point]:
        assert any(i.startswith(name + ".") for i in BY_ID), f"{point}: no case {name}.*"


@pytest.mark.parametrize("dtype", C.ALL_DTYPES)
def test_main_cases_exist_in_every_dtype(dtype: str) -> None:
    for name in (
        "basic.mha",
        "gqa.h6_k2",
        "gqa.h8_k1",
        "causal.bottom_right.l9_s5",
        "fully_masked.bool_row",
        "fully_masked.neg_inf_bias_row",
        "fully_masked.huge_negative_bias_row",
        "mask.random",
        "bias.full",
        "softcap.cap2_neg_inf_bias",
        "large_logits.shifted",
    ):
        assert f"sdpa.{name}.{dtype}" in BY_ID


def test_gqa_key_value_heads_differ_clearly() -> None:
    t = BY_ID["sdpa.gqa.h6_k2.float32"].tensors()
    v = t["value"].astype(np.float64)  # (B, K, S, E)
    assert abs(v[:, 1].mean() - v[:, 0].mean()) > 1.0


def test_bottom_right_with_l_greater_than_s_has_leading_zero_rows() -> None:
    t = BY_ID["sdpa.causal.bottom_right.l9_s5.float32"].tensors()
    assert np.all(t["weights"][..., :4, :] == 0) and np.all(t["output"][..., :4, :] == 0)
    assert np.all(t["weights"][..., 4:, :].sum(-1) > 0.999)


def test_fully_masked_goldens_are_zero_and_huge_negative_is_uniform() -> None:
    for dtype in C.ALL_DTYPES:
        w = BY_ID[f"sdpa.fully_masked.bool_row.{dtype}"].tensors()["weights"]
        assert np.all(w[..., 2, :] == 0)
        w = BY_ID[f"sdpa.fully_masked.neg_inf_bias_row.{dtype}"].tensors()["weights"]
        assert np.all(w[..., 2, :] == 0)
        w = BY_ID[f"sdpa.fully_masked.huge_negative_bias_row.{dtype}"].tensors()["weights"]
        np.testing.assert_allclose(w[..., 3, :], 1 / 7, rtol=1e-12)  # by hand, stored as float64


def test_saturation_collapses_without_the_scale() -> None:
    spread = BY_ID["sdpa.saturation.default_scale.float32"].tensors()["weights"].max(-1)
    peaked = BY_ID["sdpa.saturation.scale_one.float32"].tensors()["weights"].max(-1)
    assert spread.max() < 0.7 and spread.mean() < 0.5
    assert peaked.mean() > 0.9 and np.mean(peaked > 0.95) >= 0.5


@pytest.mark.slow  # about 1 minute: a whole generation
def test_regenerating_is_byte_identical() -> None:
    """What `make fixtures-check` does in CI (without the cross-check): the fixtures made now,
    in this process, are byte for byte the ones committed, made in another process earlier."""
    assert check(FIXTURES_DIR) == []


def _only_sdpa_cases(case) -> bool:
    """Generate the functional cases only (the oracle's long flash cases and the modules take
    most of a generation; the cross-check logic under test is the same for every case)."""
    return case.op in ("sdpa", "causal_mask")


def test_without_the_frameworks_the_generator_records_not_checked(tmp_path, monkeypatch) -> None:
    import conformance.generate as G

    monkeypatch.setattr(G, "KERNELS", {"torch": "no_such_framework_port"})
    manifest = G.generate(tmp_path, cross_check=True, select=_only_sdpa_cases)
    assert manifest["cross_check"]["versions"]["torch"].startswith("not checked")
    assert manifest["cross_check"]["cases"]["sdpa.gqa.h6_k2.float32"] == {"torch": "not checked"}
    # The fixtures themselves are the committed ones, byte for byte, and so are their entries.
    committed = {c.id: c.entry for c in MANIFEST.cases}
    for case in manifest["cases"]:
        assert json.loads(G._dumps(case)) == committed[case["id"]], case["id"]
        if "file" in case:
            fresh = (tmp_path / case["file"]).read_bytes()
            assert fresh == (FIXTURES_DIR / case["file"]).read_bytes(), case["id"]
    assert len(manifest["cases"]) > 140


def test_the_generator_refuses_a_golden_a_kernel_disagrees_with(tmp_path, monkeypatch) -> None:
    import conformance.generate as G

    monkeypatch.setattr(G, "KERNELS", {"broken": "conformance.tests.broken_ports:scale_missing"})
    with pytest.raises(SystemExit, match="refusing to write fixtures") as refused:
        G.generate(tmp_path / "out", cross_check=True, select=_only_sdpa_cases)
    assert "sdpa.saturation.default_scale.float32: broken output" in str(refused.value)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# flash_attention, module and decode fixtures
# ---------------------------------------------------------------------------------------------


def _cases(op: str) -> list:
    return [c for c in MANIFEST.cases if c.op == op and c.kind == "values"]


def test_flash_cases_carry_awkward_block_sizes() -> None:
    """Blocks that divide neither L nor S, blocks larger than the sequence, blocks of one, and
    the L = 113, S = 203 of the issue; run against flash_attention alone, output and the row
    log-sum-exp (return_lse), no weights."""
    kinds = set()
    for case in _cases("flash"):
        kw, shapes = case.keywords, case.entry["shapes"]
        L, S = shapes["query"][-2], shapes["key"][-2]
        assert case.functions == ["flash"] and set(case.tolerance) == {"output", "lse"}, case.id
        assert "weights" not in shapes
        bq, bk = kw["block_q"], kw["block_k"]
        if L % bq and S % bk and bq < L and bk < S:
            kinds.add("ragged")
        if bq > L and bk > S:
            kinds.add("larger")
        if bq == bk == 1:
            kinds.add("one")
        if (L, S) == (113, 203):
            kinds.add("113x203")
    assert kinds == {"ragged", "larger", "one", "113x203"}
    tall = BY_ID["flash.tiling.causal_bottom_right.l203_s113.float32"].tensors()["output"]
    assert np.all(tall[..., :90, :] == 0) and np.all(np.abs(tall[..., 90:, :]).max(-1) > 0)


def test_module_fixtures_hold_canonical_weights_in_their_dtype() -> None:
    for case in _cases("module") + _cases("decode"):
        t, spec = case.tensors(), case.entry["module"]
        if spec["class"] == "MultiHeadLatentAttention":  # its own canonical weights
            weights = {n: w for n, w in t.items() if n.endswith((".kernel", ".weight"))}
            dims = check_mla_canonical(weights, n_heads=spec["n_heads"],
                                       qk_rope_head_dim=spec["qk_rope_head_dim"])
            assert t["o_proj.kernel"].dtype.name == t["x"].dtype.name == case.dtype, case.id
            assert t["output"].shape == (*t["x"].shape[:2], dims.M), case.id
            continue
        H = spec["n_heads"]
        K = spec.get("n_kv_heads", H)
        M, HD = t["q_proj.kernel"].shape
        D, E = HD // H, t["v_proj.kernel"].shape[1] // K
        assert t["k_proj.kernel"].shape == (M, K * D), case.id
        assert t["o_proj.kernel"].shape == (H * E, M), case.id
        assert t["q_proj.kernel"].dtype.name == t["x"].dtype.name == case.dtype, case.id
        assert t["output"].dtype == np.float64 and t["output"].shape == (*t["x"].shape[:2], M)
        if spec["class"] == "MultiHeadAttention":
            assert "n_kv_heads" not in spec  # MultiHeadAttention.from_canonical defaults K = H


#: The points of the issues on modules and decoding, each with the cases that pin it.
MODULE_COVERAGE = {
    "MHA, GQA 6:2, MQA": ["module.mha.self", "module.gqa.h6_k2", "module.mqa.h6_k1"],
    "self and cross attention": ["module.gqa.h6_k2", "module.cross.h6_k2"],
    "causal both alignments": ["module.causal.top_left.l5_s7", "module.causal.bottom_right.l5_s7"],
    "padding mask (B, 1, 1, S)": ["module.padding.b11s"],
    "decode MHA, GQA, MQA token by token": [
        f"decode.{m}.tokens" for m in ("mha.h6", "gqa.h6_k2", "mqa.h6_k1")
    ],
    "decode in uneven chunks": [
        f"decode.{m}.chunks_2_1_2" for m in ("mha.h6", "gqa.h6_k2", "mqa.h6_k1")
    ],
}


@pytest.mark.parametrize("point", list(MODULE_COVERAGE))
@pytest.mark.parametrize("dtype", C.ALL_DTYPES)
def test_module_cases_cover_the_issues_in_every_dtype(point: str, dtype: str) -> None:
    for name in MODULE_COVERAGE[point]:
        if name != "module.padding.b11s" or dtype != "float64":
            assert f"{name}.{dtype}" in BY_ID, f"{point}: no case {name}.{dtype}"


def test_padding_and_causal_module_goldens_hold_their_zeros() -> None:
    w = BY_ID["module.padding.b11s.float32"].tensors()["weights"]  # (B, H, L, S)
    assert np.all(w[1, ..., 4:] == 0) and np.all(w[0, ..., 4:].sum(-1) > 0)
    w = BY_ID["module.causal.top_left.l5_s7.float32"].tensors()["weights"]
    assert np.all(w[..., 5:] == 0) and np.all(np.triu(w[0, 0], k=1) == 0)
    w = BY_ID["module.causal.bottom_right.l5_s7.float32"].tensors()["weights"]
    assert np.all(w[..., 4, :] > 0) and np.all(np.triu(w[0, 0], k=3) == 0)


def test_module_goldens_are_the_oracles_attention_between_matmul_projections() -> None:
    """The module goldens, rebuilt from the oracle's attention alone: projections as NumPy
    matmuls (``x @ kernel + bias``), heads split and merged by reshapes (head h owns features
    ``[h*D:(h+1)*D]``), written here apart from the oracle's element loops of
    :func:`oracle.module_forward`."""
    for case_id in ("module.mha.self.float64", "module.mqa.h6_k1.bfloat16",
                    "module.causal.bottom_right.l5_s7.float16", "module.padding.b11s.float32",
                    "module.shapes.d5_e3_m17.float32", "module.bias.full.float32"):
        case = BY_ID[case_id]
        t, spec = case.tensors(), case.entry["module"]
        w = {n: a.astype(np.float64) for n, a in t.items() if n.endswith((".kernel", ".bias"))}
        H, K = spec["n_heads"], spec.get("n_kv_heads", spec["n_heads"])
        x = t["x"].astype(np.float64)  # (B, L, M)
        context = x if "context" not in t else t["context"].astype(np.float64)  # (B, S, M)

        def project(name, inp, n_heads, w=w):  # (B, T, M) -> (B, n, T, X)
            y = inp @ w[f"{name}.kernel"] + w.get(f"{name}.bias", 0.0)  # (B, T, n*X)
            return y.reshape(*y.shape[:2], n_heads, -1).transpose(0, 2, 1, 3)

        kw = {k: v for k, v in case.keywords.items() if k != "return_weights"}
        bias = None if "bias" not in t else t["bias"].astype(np.float64)
        golden = oracle.attention(
            project("q_proj", x, H), project("k_proj", context, K),
            project("v_proj", context, K), mask=t.get("mask"), bias=bias, **kw,
        )
        B, _, L, E = golden.output.shape
        merged = golden.output.transpose(0, 2, 1, 3).reshape(B, L, H * E)  # (B, L, H*E)
        out = merged @ w["o_proj.kernel"] + w.get("o_proj.bias", 0.0)  # (B, L, M)
        oracle.assert_within(t["output"], out, "float64", what=f"{case_id} output: ")
        if "weights" in t:
            oracle.assert_within(t["weights"], golden.weights, "float64", what=f"{case_id}: ")


def test_decode_goldens_are_one_causal_forward_fed_in_chunks_that_fit() -> None:
    for case in _cases("decode"):
        plan, t = case.entry["decode"], case.tensors()
        T = t["x"].shape[1]
        assert sum(plan["chunks"]) == T <= plan["max_len"], case.id
        if "weights" in t:  # (B, H, T, T): the lower triangle
            assert np.all(np.triu(t["weights"], k=1) == 0), case.id
    tokens = BY_ID["decode.gqa.h6_k2.tokens.float16"]
    assert tokens.entry["decode"] == {"max_len": 5, "chunks": [1, 1, 1, 1, 1]}  # fills it exactly
    chunks = BY_ID["decode.gqa.h6_k2.chunks_2_1_2.float16"].tensors()
    assert np.array_equal(chunks["output"], tokens.tensors()["output"])


def test_varlen_cases_cover_the_codes_and_the_contract_points() -> None:
    """Contract v3's varlen: every new code has an error fixture; N = 1, 3, 5, empty sequences,
    both alignments, windows, sinks, ALiBi, softcap, GQA 8:1 and the gradients exist; each
    case pins contract v3."""
    assert _codes(("varlen", "varlen_grad")) >= VARLEN_ERROR_CODES | {"grad_output_shape"}
    for name in ("n1.l6_s6", "n3.mixed", "n3.causal_bottom_right", "n5.empty_sequences",
                 "n5.window_across_boundaries", "n3.sink_logits", "n3.linear_biases",
                 "n3.softcap_scale", "n3.gqa_h8_k1", "n3.garbage_in_unread_rows"):
        assert f"varlen.{name}.float32" in BY_ID, name
    assert any(i.startswith("varlen_grad.") for i in BY_ID)
    for case in MANIFEST.cases:
        if case.op in ("varlen", "varlen_grad"):
            assert case.contract == "v3", case.id


def test_varlen_goldens_hold_the_zero_rows_of_sequences_without_keys() -> None:
    """Sequence 2 of n5.empty_sequences has S_n = 0: its 4 query rows are exactly zero."""
    t = BY_ID["varlen.n5.empty_sequences.float64"].tensors()
    cu_q = t["cu_seqlens_q"].tolist()
    assert cu_q == [0, 2, 2, 6, 9, 9]
    assert not t["output"][2:6].any() and t["output"][:2].all()


def test_the_varlen_flex_cross_check_refuses_a_wrong_golden() -> None:
    """The generator's FlexAttention check (conformance/generate/varlen.py) agrees with the
    golden of a bottom-right, windowed case and refuses it shifted by twice its bound."""
    pytest.importorskip("torch")
    from conformance.generate.varlen import _flex_verify

    case = BY_ID["varlen.n5.window_across_boundaries.float32"]
    t = case.tensors()
    as64 = {n: t[n] if t[n].dtype.kind == "i" else t[n].astype(np.float64) for n in
            ("query", "key", "value", "cu_seqlens_q", "cu_seqlens_k")}
    keywords, bound = case.keywords, case.tolerance["output"]
    said, bad = _flex_verify(as64, keywords, t["output"], bound)({"torch": None})
    assert said["torch"].startswith("agree") and not bad
    _, bad = _flex_verify(as64, keywords, t["output"] + 2 * bound, bound)({"torch": None})
    assert bad


def test_the_rope_cross_check_against_transformers_can_fail() -> None:
    """The generator's check of the scaled frequencies against transformers'
    ``ROPE_INIT_FUNCTIONS`` agrees on the cases' formulas and catches the two classic slips:
    llama3's band boundaries swapped, and YaRN's attention factor squared."""
    pytest.importorskip("transformers")
    from conformance.cases.rope import YARN_HF, llama3_inv_freq, yarn_inv_freq
    from conformance.generate.cross_check import hf_rope_cross_check

    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    right = llama3_inv_freq(500000.0, 12, 8.0, 1.0, 4.0, 8192)
    swapped = llama3_inv_freq(500000.0, 12, 8.0, 4.0, 1.0, 8192)
    assert hf_rope_cross_check(llama3, 12, right, 1.0) == ({"transformers": "agree"}, [])
    said, bad = hf_rope_cross_check(llama3, 12, swapped, 1.0)
    assert said == {"transformers": "disagree"} and "inv_freq relative error" in bad[0]
    inv_freq, factor = yarn_inv_freq(10000.0, 8, 4.0, 2048)
    assert hf_rope_cross_check(YARN_HF, 8, inv_freq, factor)[1] == []
    said, bad = hf_rope_cross_check(YARN_HF, 8, inv_freq, factor**2)
    assert said == {"transformers": "disagree"} and "attention_factor" in bad[0]
