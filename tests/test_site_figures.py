"""The figures' data (docs/site/figures.py), checked against numbers computed another way: the
float64 oracle, finite differences, sums by hand, the known values at the ends of a curve.
Pixels are not checked; the PNGs are remade by ``make figures``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from conformance import oracle
from docs.site import figures

ROOT = Path(__file__).resolve().parents[1]


def test_every_figure_is_committed_and_named_once():
    names = [f.name for f in figures.FIGURES]
    assert len(names) == len(set(names))
    assert {p.figure for p in figures.PANELS} <= set(names)
    for name in names:
        assert (ROOT / "docs" / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG", name


@pytest.mark.parametrize("figure", sorted({p.figure for p in figures.PANELS}))
def test_heatmaps_are_the_oracles_weights(figure):
    data = figures.heatmap_data(figure)
    assert len(data["panels"]) >= 2
    for panel, w in zip(data["panels"], data["weights"]):
        x = figures.panel_inputs(panel)
        golden = oracle.attention(x["query"], x["key"], mask=x["mask"], **panel.keywords)
        oracle.assert_within(w, golden.weights[0, 0], "float64", what=f"{panel.title}: ")
        # where the rule says no, exactly zero; every row sums to one
        L, S, kw = panel.L, panel.S, panel.keywords
        i, j = np.arange(L)[:, None], np.arange(S)[None, :]
        offset = S - L if kw.get("causal_alignment") == "bottom_right" else 0
        allowed = np.ones((L, S), bool)
        if kw.get("is_causal"):
            allowed &= j <= i + offset
        if "window" in kw:
            left, right = kw["window"]
            allowed &= (j >= i + offset - left) & (j <= i + offset + right)
        if "q_segment_ids" in kw:
            allowed &= kw["q_segment_ids"][:, None] == kw["kv_segment_ids"][None, :]
        if panel.lengths is not None:
            allowed &= j < panel.lengths
        assert np.array_equal(w > 0, allowed), panel.title
        if "sinks" in kw:  # the sink's share: sum_j e^s / (sum_j e^s + e^sink) < 1, by row
            assert (w.sum(-1) < 1.0 - 1e-3).all()
        else:
            oracle.assert_within(w.sum(-1), 1.0, "float64", what=f"{panel.title} row sums: ")


def test_the_causal_figure_shows_both_alignments_with_L_unlike_S():
    panels = figures.heatmap_data("weights_causal")["panels"]
    alignments = {p.keywords.get("causal_alignment", "top_left") for p in panels}
    assert alignments == {"top_left", "bottom_right"} and all(p.L != p.S for p in panels)


def test_gqa_heads_are_the_oracles_module_weights_grouped_by_kv_head():
    data = figures.gqa_heads_data()
    H, K = data["n_heads"], data["n_kv_heads"]
    golden = oracle.module_forward(
        data["canonical"], data["x"], n_heads=H, n_kv_heads=K, is_causal=True
    )
    oracle.assert_within(data["weights"], golden.weights[0], "float64")
    assert data["kv_head"] == [0, 0, 0, 1, 1, 1]  # H = 6, K = 2: contiguous groups of 3


def test_softmax_temperature_runs_from_uniform_towards_one_hot():
    data = figures.temperature_data(L=6, S=9, D=4, n=9)
    S = 9
    assert data["scale"][0] == 0.0
    oracle.assert_within(data["entropy"][0], math.log(S), "float64")  # uniform rows
    oracle.assert_within(data["largest"][0], 1 / S, "float64")
    assert np.all(np.diff(data["entropy"]) < 0) and np.all(np.diff(data["largest"]) > 0)
    i = 5  # one point, recomputed from the oracle's weights
    w = oracle.attention(data["query"], data["key"], scale=float(data["scale"][i])).weights[0, 0]
    entropy = np.mean([-math.fsum(p * math.log(p) for p in row if p > 0) for row in w])
    oracle.assert_within(data["entropy"][i], entropy, "float64")
    oracle.assert_within(data["largest"][i], w.max(-1).mean(), "float64")


def _finite_difference_query_gradient(q, k, v, do, scale, eps=1e-6):
    """d<oracle(q, k, v), do>/dq by central differences, one element of q at a time."""

    def f(q_):
        return float((oracle.attention(q_, k, v, scale=scale).output * do).sum())

    grad = np.zeros_like(q)
    for index in np.ndindex(q.shape):
        step = np.zeros_like(q)
        step[index] = eps
        grad[index] = (f(q + step) - f(q - step)) / (2 * eps)
    return grad


def test_missing_scale_variance_and_gradients():
    dims = (4, 8)
    data = figures.missing_scale_data(dims, L=5, S=6, E=3)
    for n, D in enumerate(dims):
        x = data["inputs"][D]
        q, k = x["query"][0, 0], x["key"][0, 0]
        scores = [math.fsum(a * b for a, b in zip(qi, kj)) for qi in q for kj in k]  # L * S
        mean = math.fsum(scores) / len(scores)
        var = math.fsum((s - mean) ** 2 for s in scores) / len(scores)
        oracle.assert_within(data["var_plain"][n], var, "float64")
        oracle.assert_within(data["var_scaled"][n], var / D, "float64")
        for name, scale in (("grad_plain", 1.0), ("grad_scaled", 1 / math.sqrt(D))):
            fd = _finite_difference_query_gradient(
                x["query"], x["key"], x["value"], x["grad_output"], scale
            )
            rows = np.linalg.norm(fd[0, 0], axis=-1)
            expected = np.percentile(rows, [10, 50, 90])
            got = [data[f"{name}_lo"][n], data[name][n], data[f"{name}_hi"][n]]
            np.testing.assert_allclose(got, expected, rtol=1e-6)  # eps^2 and rounding / eps


def test_missing_scale_figure_shows_variance_growing_as_D():
    # The figure's own data: with standard-normal entries Var(q . k) = D. The estimate over
    # L * S scores has a relative standard deviation of about sqrt(2 (1 + 2 (L - 1) / D) / (L S))
    # (scores sharing a query or a key are correlated, 1/D); allow five of those.
    data = figures.missing_scale_data(dims=(4, 64, 1024))
    L, S = data["L"], data["S"]
    for D, plain, scaled in zip(data["D"], data["var_plain"], data["var_scaled"]):
        tolerance = 5 * math.sqrt(2 * (1 + 2 * (L - 1) / D) / (L * S))
        assert plain / D == pytest.approx(1, abs=tolerance), D
        oracle.assert_within(scaled, plain / D, "float64")
    # saturation: without the scale, the median row's gradient at D = 1024 is a small fraction
    # of what it is with the scale, which stays within a factor of two across D
    assert data["grad_plain"][-1] < 0.2 * data["grad_scaled"][-1]
    assert max(data["grad_scaled"]) < 2 * min(data["grad_scaled"])


def test_missing_scale_table_shows_saturation_and_vanishing_score_gradients():
    """The table of docs/SEMANTICS.md (issue 10, item 6), D = 16 .. 256, 1024 rows each: with
    1/sqrt(D) the scores keep unit variance, no row saturates and the gradient at the scores
    stays flat; without it the variance is D, saturated rows and rows whose query gradient has
    vanished grow with D, the score gradient shrinks and the key gradient concentrates on each
    row's argmax. The raw size of the unscaled dQ is larger (its keys are not scaled down):
    asserted too, since the docs say so."""
    t = figures.missing_scale_table()
    D = t["D"]
    assert list(D) == [16, 32, 64, 128, 256]
    # statistical: sample variances of 1024 rows and a median, not a rounding
    np.testing.assert_allclose(t["var_plain"] / D, 1.0, atol=0.1)  # Var(q . k) = D
    np.testing.assert_allclose(t["var_scaled"], 1.0, atol=0.1)
    assert (t["saturated_scaled"] < 0.01).all() and (t["vanished_scaled"] == 0).all()
    assert (np.diff(t["saturated_plain"]) > 0).all() and t["saturated_plain"][-1] > 0.3
    assert (np.diff(t["vanished_plain"]) >= 0).all() and t["vanished_plain"][-1] > 0.05
    np.testing.assert_allclose(t["ds_median_scaled"], 1.0, atol=0.2)  # flat across D
    assert (np.diff(t["ds_median_plain"]) < 0).all()
    assert t["ds_median_plain"][-1] < 0.25 * t["ds_median_scaled"][-1]
    assert (t["dk_nonmax_plain"] < 0.5 * t["dk_nonmax_scaled"]).all()
    assert (t["dk_nonmax_scaled"] > 0.6).all() and t["dk_nonmax_plain"][-1] < 0.25
    assert (t["dq_median_plain"] > t["dq_median_scaled"]).all()  # the honest caveat
    assert (t["dq_rms_plain"] > t["dq_rms_scaled"]).all()
    table = figures.missing_scale_markdown(t)
    lines = table.splitlines()
    assert len(lines) == 2 + len(D) and lines[-1].startswith("| 256 | ")
    assert all(line.count(" / ") == 7 for line in lines[2:])  # scaled / plain, each column


@pytest.mark.slow  # about 5 s: torch's profiler starts, JAX compiles four programs
def test_memory_wall_measures_the_scores_the_plain_path_holds():
    lengths, H, D = (128, 256), 2, 16
    data = figures.memory_wall_data(lengths, H=H, D=D, blocks={"block_q": 64, "block_k": 64})
    assert list(data["scores"]) == [H * L * L * 4 for L in lengths]  # (H, L, S) float32 bytes
    for fw in ("numpy", "torch", "jax"):
        plain, tiled = data[fw]["plain"], data[fw]["tiled"]
        assert np.all(plain >= data["scores"]), fw  # the plain path materializes the scores
        assert plain[1] > 3 * plain[0], fw  # and they grow as L^2
        assert tiled[1] < plain[1] / 4, fw  # the tiled path holds one block
