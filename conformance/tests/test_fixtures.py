"""The fixtures themselves: integrity, determinism, size, and coverage of the contract."""

from __future__ import annotations

import json
import re

import ml_dtypes
import numpy as np
import pytest

from attention_spec import ERROR_CODES, MODULE_ERROR_CODES
from conformance import cases as C
from conformance.fixtures import FIXTURES_DIR, load_manifest, read_tensors, sha256_of
from conformance.generate import check, generate

MANIFEST = load_manifest()
BY_ID = MANIFEST.by_id()
DTYPE = "(float64|float32|float16|bfloat16|bool|int32)"
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
        if case.kind == "values" and case.op == "sdpa":
            assert set(record["cases"][case.id]) == {"torch", "jax"}


def test_error_cases_cover_every_functional_rule_of_the_taxonomy() -> None:
    covered = {c.entry["expected_error"]["code"] for c in MANIFEST.cases if c.kind == "error"}
    assert covered == set(ERROR_CODES) - MODULE_ERROR_CODES
    for case in MANIFEST.cases:
        if case.kind == "error":
            want = case.entry["expected_error"]
            assert ERROR_CODES[want["code"]][0].__name__ == want["class"], case.id


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
        np.testing.assert_allclose(w[..., 3, :], 1 / 7, rtol=1e-12)


def test_saturation_collapses_without_the_scale() -> None:
    spread = BY_ID["sdpa.saturation.default_scale.float32"].tensors()["weights"].max(-1)
    peaked = BY_ID["sdpa.saturation.scale_one.float32"].tensors()["weights"].max(-1)
    assert spread.max() < 0.7 and spread.mean() < 0.5
    assert peaked.mean() > 0.9 and np.mean(peaked > 0.95) >= 0.5


def test_regenerating_is_byte_identical() -> None:
    """What `make fixtures-check` does in CI (without the cross-check)."""
    assert check(FIXTURES_DIR) == []


def test_generation_is_deterministic(tmp_path) -> None:
    a = generate(tmp_path / "a", cross_check=False)
    b = generate(tmp_path / "b", cross_check=False)
    assert a == b
    for case in a["cases"]:
        if "file" in case:
            assert (tmp_path / "a" / case["file"]).read_bytes() == (
                tmp_path / "b" / case["file"]
            ).read_bytes()
    one = a["cases"][0]["file"]
    assert read_tensors((tmp_path / "a" / one).read_bytes()).keys() >= {"query", "output"}


def test_without_the_frameworks_the_generator_records_not_checked(tmp_path, monkeypatch) -> None:
    import conformance.generate as G

    monkeypatch.setattr(G, "KERNELS", {"torch": "no_such_framework_port"})
    manifest = G.generate(tmp_path, cross_check=True)
    assert manifest["cross_check"]["versions"]["torch"].startswith("not checked")
    assert manifest["cross_check"]["cases"]["sdpa.gqa.h6_k2.float32"] == {"torch": "not checked"}
    assert check(tmp_path) == []  # the fixtures themselves are the same
    assert (tmp_path / "sdpa.gqa.h6_k2.float32.safetensors").read_bytes() == (
        FIXTURES_DIR / "sdpa.gqa.h6_k2.float32.safetensors"
    ).read_bytes()


def test_the_generator_refuses_a_golden_a_kernel_disagrees_with(tmp_path, monkeypatch) -> None:
    import conformance.generate as G

    monkeypatch.setattr(G, "KERNELS", {"broken": "conformance.tests.broken_ports:scale_missing"})
    with pytest.raises(SystemExit, match="refusing to write fixtures") as refused:
        G.generate(tmp_path / "out", cross_check=True)
    assert "sdpa.saturation.default_scale.float32: broken output" in str(refused.value)
    assert not (tmp_path / "out").exists()
