"""FLOP counts (bench/flops.py) and grids (bench/workloads.py): hand arithmetic and brute force,
no timing."""

from __future__ import annotations

import pytest

from bench.flops import allowed_pairs, attention_flops, decode_flops, module_flops, train_flops
from bench.workloads import GOAL_WORKLOAD, TRAIN_GOAL_WORKLOAD, Workload, grid

from .helpers import B, D, E, H, K, L, M, S


def _pairs_by_mask(L: int, S: int, offset: int) -> int:
    """Count of (i, j) with j <= i + offset, by brute force over the full grid."""
    return sum(1 for i in range(L) for j in range(S) if j <= i + offset)


@pytest.mark.parametrize("L_, S_", [(5, 7), (7, 5), (1, 9), (9, 1), (6, 6), (3, 17), (17, 3)])
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_allowed_pairs_matches_brute_force(L_, S_, alignment):
    offset = 0 if alignment == "top_left" else S_ - L_
    got = allowed_pairs(L_, S_, is_causal=True, alignment=alignment)
    assert got == _pairs_by_mask(L_, S_, offset)


def test_allowed_pairs_hand_values():
    assert allowed_pairs(4, 4, is_causal=True) == 10  # 1 + 2 + 3 + 4
    assert allowed_pairs(5, 7, is_causal=False) == 35
    # bottom_right with L > S: the first L - S rows see nothing
    assert allowed_pairs(4, 2, is_causal=True, alignment="bottom_right") == 0 + 0 + 1 + 2


def test_attention_flops_count_both_matmuls():
    dense, useful = attention_flops(B, H, L, S, D, E)
    assert dense == useful == 2 * B * H * L * S * D + 2 * B * H * L * S * E
    dense_c, useful_c = attention_flops(B, H, L, S, D, E, is_causal=True)
    pairs = _pairs_by_mask(L, S, 0)  # 15 of 35
    assert pairs == 15
    assert dense_c == dense
    assert useful_c == 2 * B * H * pairs * (D + E)


def test_module_flops_add_the_four_projections():
    dense, useful = module_flops(B, H, K, L, S, D, E, M, is_causal=True)
    proj = 2 * B * (L * M * H * D + S * M * K * D + S * M * K * E + L * H * E * M)
    a_dense, a_useful = attention_flops(B, H, L, S, D, E, is_causal=True)
    assert (dense, useful) == (proj + a_dense, proj + a_useful)


def test_a_training_step_counts_six_matmuls_and_its_gradients():
    """Forward: q k^T and w v; backward: dV = P^T dO, dP = dO V^T (L*S*E each), dQ = dS K and
    dK = dS^T Q (L*S*D each); the tiled backward's recomputed q k^T is not counted."""
    dense, useful = train_flops(B, H, L, S, D, E, is_causal=True)
    assert dense == 2 * B * H * L * S * (D + E) + 2 * B * H * L * S * (2 * D + 2 * E)
    assert useful == 3 * 2 * B * H * 15 * (D + E)  # 15 allowed pairs, as in the forward
    w = Workload("train", B, H, K, L, S, D, E, True)
    assert w.flops() == (dense, useful)
    assert w.id == "train.gqa.b2.h6.k2.l5.s7.d11.e13.f32.causal"
    assert w.label.startswith("train GQA 6:2") and w.series.startswith("train ")
    grads = B * H * L * D + B * K * S * (D + E)  # dQ, dK, dV
    assert w.result_bytes() == (grads + B * H * L * E) * 4  # and the output
    fwd = Workload("attention", B, H, K, L, S, D, E, True)
    assert w.input_bytes() == fwd.input_bytes() + (B * H * L * E + grads + B * H * L * E) * 4
    assert fwd.result_bytes() == 0


def test_workload_fields_and_ids():
    w = Workload("attention", B, H, K, L, S, D, E, True, "bfloat16")
    assert w.variant == "GQA 6:2"
    assert w.id == "attention.gqa.b2.h6.k2.l5.s7.d11.e13.bf16.causal"
    assert w.score_bytes() == B * H * L * S * 4
    assert w.input_bytes() == (B * H * L * D + B * K * S * (D + E) + B * H * L * E) * 2
    assert Workload.from_dict(w.to_dict()) == w
    assert Workload("attention", 1, 8, 1, 4, 4, 2, 2).variant == "MQA"


def test_decode_flops_by_hand():
    # B=2, H=6, K=3, P=7 cached tokens, D=5, E=4, M=30: one new token, S = 8 keys
    q_proj = 2 * 2 * 30 * (6 * 5)  # 3600
    k_proj = 2 * 2 * 30 * (3 * 5)  # 1800
    v_proj = 2 * 2 * 30 * (3 * 4)  # 1440
    o_proj = 2 * 2 * (6 * 4) * 30  # 2880
    attention = 2 * 2 * 6 * 8 * 5 + 2 * 2 * 6 * 8 * 4  # q.k over 8 keys, weights.v: 1728
    assert (
        decode_flops(2, 6, 3, 7, 5, 4, 30)
        == 11448
        == (q_proj + k_proj + v_proj + o_proj + attention)
    )
    w = Workload("decode", 2, 6, 3, 1, 8, 5, 5)  # M = H * D = 30, E = D = 5
    dense, useful = w.flops()
    assert dense == useful == 3600 + 1800 + 1800 + 3600 + 2 * 2 * 6 * 8 * (5 + 5)


def test_decode_workload_fields():
    w = Workload("decode", 2, 6, 3, 1, 8, 5, 5, False, "bfloat16")
    assert (w.P, w.seq, w.M) == (7, 7, 30)
    assert w.id == "decode.gqa.b2.h6.k3.p7.d5.e5.bf16"
    assert w.label == "decode GQA 6:3 B2 H6 P=7 D5 bf16"
    assert w.series == "decode GQA 6:3 B2 H6 D5 bf16"
    assert w.cache_bytes() == 2 * 3 * 8 * (5 + 5) * 2  # K heads, S = P + 1 tokens, 2 bytes
    mha = Workload("decode", 2, 6, 6, 1, 8, 5, 5, False, "bfloat16")
    assert w.cache_bytes() * 6 == mha.cache_bytes() * 3  # K/H of MHA's
    assert w.input_bytes() == 2 * 2 * 30 * 2 + w.cache_bytes()  # x, y and the cache
    d = w.to_dict()
    assert (d["seq"], d["cache_bytes"]) == (7, w.cache_bytes())
    assert Workload.from_dict(d) == w
    assert GOAL_WORKLOAD.cache_bytes() == 0 and GOAL_WORKLOAD.seq == GOAL_WORKLOAD.L


# ----------------------------------------------------------------------------------- grids


def test_quick_cpu_grid_holds_the_goal_workloads():
    ws = grid("cpu", "quick")
    assert GOAL_WORKLOAD in ws
    assert Workload(**{**GOAL_WORKLOAD.__dict__, "is_causal": True}) in ws
    assert TRAIN_GOAL_WORKLOAD in ws and {w.L for w in grid("cpu", "full") if w.op == "train"} >= {
        2048, 8192,
    }
    lengths = {w.L for w in ws if w.op == "attention"}
    assert min(lengths) == 256 and max(lengths) == 2048  # 4096 and 8192: the full grid
    assert max(w.L for w in ws if w.op != "decode") == 2048  # minutes, not half an hour
    assert {4096, 8192} <= {w.L for w in grid("cpu", "full") if w.op == "attention"}
    assert {w.variant.split()[0] for w in ws} == {"MHA", "GQA", "MQA", "MLA"}
    assert {w.dtype for w in ws if w.op != "paged_decode"} == {"float32"}  # fp8's bf16 twin
    assert len({w.id for w in ws}) == len(ws)


def test_decode_steps_are_in_every_grid():
    quick = [w for w in grid("cpu", "quick") if w.op == "decode"]
    assert {(w.variant, w.P) for w in quick} == {
        (v, p) for v in ("MHA", "GQA 8:2") for p in (1024, 4096)
    }
    assert all((w.L, w.H * w.D, w.dtype) == (1, 512, "float32") for w in quick)  # module M
    cuda = [w for w in grid("cuda", "quick") if w.op == "decode"]
    assert {"bfloat16", "float16", "float32"} == {w.dtype for w in cuda}
    assert {w.variant.split()[0] for w in grid("cuda", "full") if w.op == "decode"} == {
        "MHA",
        "GQA",
        "MQA",
    }
    assert [w for w in grid("tpu", "quick") if w.op == "decode"]


def test_gpu_grids_are_low_precision_and_long():
    quick, full = grid("cuda", "quick"), grid("cuda", "full")
    assert {"bfloat16", "float16", "float32"} <= {w.dtype for w in quick}
    assert max(w.L for w in full) >= 32768
    assert any(w.is_causal for w in full) and any(not w.is_causal for w in full)
    assert "float16" not in {w.dtype for w in grid("tpu", "full")}
    for ws in (quick, full):
        assert len({w.id for w in ws}) == len(ws)


def test_unknown_grid_is_an_error():
    with pytest.raises(ValueError, match="no grid 'huge'"):
        grid("cpu", "huge")


def test_the_small_cuda_grid_gives_every_row_a_workload():
    """``make gpu-check``'s grid: a few workloads, yet every CUDA row has at least one (a row
    left out would never be timed by the check)."""
    from bench.rows import ROWS

    small = grid("cuda", "small")
    # 16, and contract v3's: paged decode (8 sequences, P = 4096: milliseconds), varlen prefill
    # (8192 tokens), an MLA decode step and an MLA prefill
    assert len(small) <= 20 and len({w.id for w in small}) == len(small)
    assert {w.op for w in small} == {"attention", "module", "decode", "train", "paged_decode",
                                     "varlen", "mla_decode", "mla_prefill"}
    assert {"bfloat16", "float16", "float32"} <= {w.dtype for w in small}
    assert max(w.L * w.S for w in small if w.op == "attention") <= 4096 * 4096
    for row in ROWS:
        if "cuda" in row.devices:
            assert any(row.applies_to(w) for w in small), row.name
