"""From records to the report (bench/report.py, compare.py, plots.py): derived numbers, goals
from their interleaved records, the JSON schema, the table, comparisons, plots."""

from __future__ import annotations

import io
import json

import pytest

from bench.compare import compare, compare_goals, env_differences
from bench.plots import plot_results, series_table
from bench.report import (
    SCHEMA_VERSION,
    build_results,
    device_peaks,
    evaluate_goals,
    fmt_bytes,
    fmt_seconds,
    load_results,
    render,
    time_spent,
)
from bench.rows import ROWS, Goal
from bench.workloads import GOAL_WORKLOAD, Workload

from .helpers import goal_rec, planned_goals, rec, results_of


def _text(res: dict) -> str:
    from rich.console import Console

    console = Console(record=True, width=220, file=io.StringIO())
    render(res, console)
    return console.export_text()


def test_derived_numbers_are_flops_over_the_median():
    res = results_of()
    by = {(r["row"], r["workload"]["is_causal"]): r for r in res["records"] if r["workload"]}
    d = by[("numpy sdpa", False)]["derived"]
    dense, useful = GOAL_WORKLOAD.flops()
    assert dense == useful == 4 * 8 * 2048 * 2048 * 64
    assert d["tflops"] == pytest.approx(useful / 0.25 / 1e12)
    assert d["ratio"] == pytest.approx(2.5)
    peak = 2 * 2048**3 / (0.05 * 0.9)  # FLOPs over the fastest round
    assert res["peaks"]["cpu/float32"]["flops"] == pytest.approx(peak)
    assert res["peaks"]["cpu/float32"]["precision"] == "highest"
    assert d["frac_peak"] == pytest.approx(useful / 0.25 / peak)
    c = by[("torch F.sdpa", True)]["derived"]
    assert c["tflops"] < c["tflops_dense"]  # causal: useful counts about half
    assert "derived" not in by[("jax sdpa", False)]  # failed rows have no numbers


def test_goals_come_from_their_interleaved_records():
    text = Goal("ratio", 2.5, "torch F.sdpa").text()
    met = goal_rec("numpy sdpa", text, [2.1, 2.2, 2.3, 2.4, 2.45], "met")
    res = results_of(numpy_med=0.34, goals=[met])  # the table's rows, minutes apart: 3.4x
    goals = {(g["row"], g["kind"]): g for g in res["goals"]}
    g = goals[("numpy sdpa", "ratio")]
    assert (g["status"], g["method"], g["rounds"]) == ("met", "interleaved", 5)
    assert g["ratio"] == pytest.approx(2.3)
    assert g["spread"] == {"min": 2.1, "q1": 2.2, "q3": 2.4, "max": 2.45}
    assert g["separate_ratio"] == pytest.approx(3.4)  # kept next to it, not used to decide
    assert goals[("jax sdpa", "faster")]["status"] == "not measured"
    assert "not in this run" in goals[("jax sdpa", "faster")]["detail"]
    gpu = results_of(device="cuda")["goals"]
    assert {x["status"] for x in gpu} == {"not evaluated"}
    assert evaluate_goals(results_of()["records"], "cpu", ())[:1] == []


def test_the_full_grid_s_goals_read_not_run_in_a_quick_run_never_met():
    """The L = S = 8192 goals (the flash rows' window, the training steps' memory) belong to the
    full grid: a quick run reports them "not run (full grid)", a full run without their
    record "not measured", and bench-compare lines a quick run up against a full one."""
    quick = {(g["row"], g["kind"]): g for g in results_of()["goals"]}
    heavy = [k for k in quick if k[1] in ("window", "memory")]
    assert len(heavy) == 6
    for key in heavy:
        assert quick[key]["status"] == "not run (full grid)", key
        assert "L=S=8192" in quick[key]["detail"] and "BENCH=full" in quick[key]["detail"]
    assert quick[("numpy sdpa", "ratio")]["status"] == "not measured"  # quick's own goal
    assert "not run (full grid)" in _text(results_of())
    recs = results_of()["records"]
    goals = evaluate_goals(recs, "cpu", planned_goals("cpu", "full"))
    full = {(g["row"], g["kind"]): g for g in goals}
    assert {full[k]["status"] for k in heavy} == {"not measured"}
    text = Goal("window", 0.15).text()
    measured = goal_rec("numpy flash", text, [0.11, 0.12, 0.12, 0.13, 0.14], "met")
    a, b = results_of(), results_of(goals=[measured])
    (g,) = [g for g in compare_goals(a, b) if g["row"] == "numpy flash" and g["b"]["ratio"]]
    assert (g["a_status"], g["b_status"], g["change"]) == ("not run (full grid)", "met", "n/a")


def test_the_report_says_where_the_time_went():
    res = results_of()
    assert time_spent(res) == ""  # a run saved before the cases recorded their seconds
    for r, s in zip(res["records"], (2.0, 30.0, 1.0, 4.0, 3.0)):
        r["wall_s"] = s
    res["gates"] = [{"seconds": 12.0}]
    line = time_spent(res, longest=2)
    assert line.startswith("time: 40 s of the run's 1 s in 5 cases (rows 38 s, the gates' 12 s")
    causal = GOAL_WORKLOAD.id.replace(".full", ".causal")
    assert "peaks 2 s" in line and line.endswith(
        f"longest: numpy sdpa|{GOAL_WORKLOAD.id} 30 s, numpy sdpa|{causal} 4 s"
    )


def test_a_goal_whose_spread_straddles_the_limit_reads_unclear():
    text = Goal("ratio", 2.5, "torch F.sdpa").text()
    unclear = goal_rec("numpy sdpa", text, [2.2, 2.4, 2.5, 2.6, 2.8], "unclear")
    res = results_of(goals=[unclear])
    out = _text(res)
    assert "unclear" in out and "2.50x (IQR 2.40-2.60, 5 rounds)" in out
    assert "2.20-2.80" in out  # min-max


def test_results_json_schema_round_trips(tmp_path):
    res = results_of()
    for key in ("schema", "device", "grid", "environment", "peaks", "gates", "goals", "records"):
        assert key in res
    assert res["schema"] == SCHEMA_VERSION == 2
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(res))
    assert load_results(run) == json.loads(json.dumps(res))
    (run / "results.json").write_text(json.dumps({**res, "schema": 1}))
    assert load_results(run)["schema"] == 1  # runs saved before the interleaved goals
    (run / "results.json").write_text(json.dumps({**res, "schema": 0}))
    with pytest.raises(ValueError, match="schema"):
        load_results(run)


def test_render_prints_rows_status_goals_and_absent_rows():
    text = Goal("ratio", 2.5, "torch F.sdpa").text()
    res = results_of(goals=[goal_rec("numpy sdpa", text, [2.3, 2.35, 2.4, 2.45, 2.5], "met")])
    res["records"][1]["contention"] = 0.4  # numpy sdpa timed on a busy machine
    out = _text(res)
    assert "numpy sdpa" in out and "torch F.sdpa" in out
    assert "failed (1)" in out and "(1) because" in out
    assert "not available" in out and "numpy flash" in out
    assert "2.40x IQR 2.35-2.45 (goal <= 2.5x) met" in out
    assert "cpu/float32" in out and "IEEE float32 matmul" in out
    assert "250 ms *" in out and "other processes used more than 10%" in out
    assert "100 ms *" not in out


def test_formatting():
    assert fmt_seconds(0.0123) == "12.3 ms"
    assert fmt_seconds(2.5) == "2.5 s"
    assert fmt_seconds(4.2e-6) == "4.2 µs"
    assert fmt_bytes(3 * 2**20) == "3 MiB"
    assert fmt_bytes(None) == "n/a"
    assert device_peaks([]) == {}


# ----------------------------------------------------------------------------------- compare


def test_compare_matches_cases_and_flags_changes():
    a, b = results_of(numpy_med=0.25), results_of(numpy_med=0.125)
    b["records"][5]["status"] = "ok"  # jax sdpa failed in A
    b["environment"]["versions"]["t"] = 2
    res = compare(a, b)
    pair = {p["case_id"]: p for p in res["pairs"]}
    numpy_full = f"numpy sdpa|{GOAL_WORKLOAD.id}"
    assert pair[numpy_full]["ratio"] == pytest.approx(0.5)
    assert pair[numpy_full]["change"] == "faster"
    torch_full = f"torch F.sdpa|{GOAL_WORKLOAD.id}"
    assert pair[torch_full]["change"] == "same"
    assert res["per_row"]["numpy sdpa"] == pytest.approx(0.5)
    assert [(s["a"], s["b"]) for s in res["status_changes"]] == [("failed", "ok")]
    assert env_differences(a, b) == [("versions.t", 1, 2)]


def test_compare_reads_goals_by_their_spreads():
    """Two runs' goals differ only when their IQRs do not overlap; a run without spreads
    (schema 1) is compared as n/a."""
    text = Goal("ratio", 2.5, "torch F.sdpa").text()
    a = results_of(goals=[goal_rec("numpy sdpa", text, [2.3, 2.4, 2.5, 2.6, 2.7], "unclear")])
    b = results_of(goals=[goal_rec("numpy sdpa", text, [2.4, 2.5, 2.55, 2.6, 2.8], "unclear")])
    c = results_of(goals=[goal_rec("numpy sdpa", text, [1.9, 2.0, 2.05, 2.1, 2.2], "met")])
    (ab,) = [g for g in compare_goals(a, b) if g["row"] == "numpy sdpa" and g["a"]["ratio"]]
    assert ab["change"] == "within spread"
    (ac,) = [g for g in compare_goals(a, c) if g["row"] == "numpy sdpa" and g["a"]["ratio"]]
    assert (ac["change"], ac["a_status"], ac["b_status"]) == ("lower", "unclear", "met")
    assert compare_goals(c, a)[0]["change"] == "higher"
    old = {**a, "goals": [{k: v for k, v in g.items() if k != "spread"} for g in a["goals"]]}
    assert {g["change"] for g in compare_goals(old, c)} == {"n/a"}


def test_compare_cli_prints_the_goals(tmp_path, capsys):
    from bench.compare import main

    text = Goal("ratio", 2.5, "torch F.sdpa").text()
    for name, ratios in (("a", [2.3, 2.4, 2.5, 2.6, 2.7]), ("b", [1.9, 2.0, 2.05, 2.1, 2.2])):
        (tmp_path / name).mkdir()
        res = results_of(goals=[goal_rec("numpy sdpa", text, ratios, "met")])
        (tmp_path / name / "results.json").write_text(json.dumps(res))
    assert main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "2.50x [2.40-2.60]" in out and "2.05x [2.00-2.10]" in out and "lower" in out


# ----------------------------------------------------------------------------------- plots


def test_plot_colours_follow_the_framework():
    from bench.plots import colour

    assert colour("numpy sdpa") // 2 == colour("numpy flash") // 2  # one hue, dark and light
    assert colour("numpy sdpa") != colour("numpy flash")
    assert len({colour(n) // 2 for n in ("numpy sdpa", "torch sdpa", "jax sdpa")}) == 3
    torch_panel = [r.name for r in ROWS if r.call == "torch_sdpa"] + ["torch sdpa", "torch flash"]
    assert len({colour(n) for n in torch_panel}) == len(torch_panel)


def test_plots_are_written_per_series(tmp_path):
    res = results_of()
    w2 = Workload(**{**GOAL_WORKLOAD.__dict__, "L": 4096, "S": 4096})
    res["records"].append(rec("numpy sdpa", w2, 1.0))
    build = build_results(device="cpu", grid="quick", environment=res["environment"],
                          records=res["records"], gates=[], wall_s=1.0)
    table = series_table(build, "time")
    assert list(table) == [GOAL_WORKLOAD.series]  # causal series has one length: no panel
    assert table[GOAL_WORKLOAD.series]["numpy sdpa"] == [(2048, 0.25), (4096, 1.0)]
    paths = plot_results(build, tmp_path)
    assert [p.name for p in paths] == ["time_vs_seq.png", "memory_vs_seq.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_decode_rows_are_reported_with_their_cache_and_plotted_against_p(tmp_path):
    ws = [Workload("decode", 1, 8, k, 1, p + 1, 64, 64) for k in (8, 2) for p in (1024, 4096)]
    rows = (("numpy decode", 2e-6), ("torch F.sdpa decode", 1e-6))  # seconds per cached token
    records = [rec(name, w, per_token * w.P) for w in ws for name, per_token in rows]
    res = build_results(device="cpu", grid="quick", environment={}, records=records, gates=[],
                        wall_s=1.0)
    ratios = [r["derived"]["ratio"] for r in res["records"] if r["row"] == "numpy decode"]
    assert ratios == [pytest.approx(2.0)] * 4  # against the same step around torch's F.sdpa
    table = series_table(res, "time")
    assert table["decode MHA B1 H8 D64 f32"]["numpy decode"] == [(1024, 2048e-6), (4096, 8192e-6)]
    out = _text(res)
    assert "decode GQA 8:2 B1 H8 P=4096 D64 f32" in out
    assert "KV cache 16 MiB" in out  # MHA at P=4096: 8 heads x 4097 tokens x 128 x 4 bytes
    assert "KV cache 4 MiB (K/H = 2/8 of MHA's)" in out
    assert [p.name for p in plot_results(res, tmp_path)] == ["time_vs_seq.png", "memory_vs_seq.png"]


def test_a_memory_goal_is_reported_in_bytes_with_the_plain_path_beside_it():
    from bench.records import Record
    from bench.rows import row_by_name
    from bench.workloads import TRAIN_MEMORY_WORKLOAD

    goal = next(g for g in row_by_name("numpy flash train").goals if g.kind == "memory")
    info = {"kind": "memory", "limit": goal.limit, "ref": goal.ref, "text": goal.text(),
            "a": {"row": "numpy flash train"}, "b": {"row": "numpy sdpa train"},
            "a_peak_bytes": 14 * 2**20, "a_memory_method": "tracemalloc - O, grads",
            "b_peak_bytes": 6 * 2**30, "b_memory_method": "tracemalloc - O, grads",
            "status": "met"}
    r = Record(case_id="goal|m", kind="goal", row="numpy flash train", row_kind="impl",
               framework="numpy", device="cpu", status="ok",
               workload=TRAIN_MEMORY_WORKLOAD.to_dict(), goal=info).to_dict()
    res = results_of(goals=[r])
    g = next(x for x in res["goals"] if x["row"] == "numpy flash train" and x["kind"] == "memory")
    assert (g["status"], g["a_peak_bytes"], g["b_peak_bytes"]) == ("met", 14 * 2**20, 6 * 2**30)
    assert "ratio" not in g and g["detail"] == "14 MiB (numpy sdpa train: 6 GiB)"
    text = _text(res)
    assert "peak extra < 64 MiB at L=S=8192" in text and "14 MiB (numpy sdpa train: 6 GiB)" in text
    time_goal = next(x for x in res["goals"] if x["row"] == "torch flash train")
    assert time_goal["status"] == "not measured"  # no record: stated on train L=S=2048
    assert time_goal["workload"] == "train MHA B1 H8 L=S=2048 D64 f32"
