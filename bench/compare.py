"""``python -m bench.compare A B``: compare two saved runs, case by case.

A and B are run folders (``results/bench-...``) or their ``results.json``. For every case
timed in both, prints A's and B's median and the ratio B / A (below 1: B is faster), marks
changes beyond ``--threshold``, lists cases whose status changed (e.g. a gate that now fails),
the geometric mean ratio per row, and the environment fields that differ (device, versions,
TF32, commit), since a comparison across those is not like for like.

Goals are compared on their interleaved measurements: A's and B's median per-round ratio with
their IQRs; a goal *changed* only when the two IQRs do not overlap (otherwise the difference is
within the runs' own spread), and a goal whose status changed (met, missed, unclear) is listed.

For pytest-benchmark's own comparison of every round:
``pytest-benchmark compare A/pytest-benchmark.json B/pytest-benchmark.json``.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from bench.report import fmt_seconds, load_results

__all__ = ["compare", "compare_goals", "env_differences", "main"]


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


_VOLATILE = ("timestamp", "command")


def env_differences(a: dict, b: dict) -> list[tuple[str, Any, Any]]:
    """``(field, A, B)`` for environment fields that differ (timestamps ignored)."""
    fa, fb = _flatten(a["environment"]), _flatten(b["environment"])
    keys = sorted(set(fa) | set(fb))
    keys = [k for k in keys if k not in _VOLATILE and fa.get(k) != fb.get(k)]
    return [(k, fa.get(k), fb.get(k)) for k in keys]


def compare(a: dict, b: dict, *, threshold: float = 0.05) -> dict[str, Any]:
    """Match records by case id. Returns ``{"pairs": [...], "status_changes": [...],
    "per_row": {row: geomean ratio}, "only_a": [...], "only_b": [...]}``; each pair has
    ``case_id, row, workload, a_s, b_s, ratio, change`` (``faster`` / ``slower`` / ``same``)."""
    ra = {r["case_id"]: r for r in a["records"] if r["kind"] == "row"}
    rb = {r["case_id"]: r for r in b["records"] if r["kind"] == "row"}
    pairs, changes = [], []
    for cid in [c for c in ra if c in rb]:
        x, y = ra[cid], rb[cid]
        if x["status"] != y["status"]:
            changes.append({"case_id": cid, "row": x["row"], "a": x["status"], "b": y["status"],
                            "reason_b": y.get("reason", "")})
        if x["status"] == "ok" == y["status"] and x.get("stats") and y.get("stats"):
            a_s, b_s = x["stats"]["median"], y["stats"]["median"]
            ratio = b_s / a_s
            change = "same"
            if ratio < 1 - threshold:
                change = "faster"
            elif ratio > 1 + threshold:
                change = "slower"
            pairs.append({"case_id": cid, "row": x["row"], "workload": x["workload"]["label"],
                          "a_s": a_s, "b_s": b_s, "ratio": ratio, "change": change})
    per_row: dict[str, list[float]] = {}
    for p in pairs:
        per_row.setdefault(p["row"], []).append(math.log(p["ratio"]))
    return {
        "pairs": pairs,
        "status_changes": changes,
        "per_row": {k: math.exp(sum(v) / len(v)) for k, v in per_row.items()},
        "only_a": sorted(set(ra) - set(rb)),
        "only_b": sorted(set(rb) - set(ra)),
    }


def compare_goals(a: dict, b: dict) -> list[dict[str, Any]]:
    """Goals measured in both runs: ``row, goal, a, b`` (each ``ratio`` and ``spread`` as in
    results.json, or None), ``a_status``, ``b_status`` and ``change``: ``lower`` / ``higher``
    when B's IQR lies wholly below / above A's, ``within spread`` when they overlap, ``n/a``
    when either run has no spread (schema 1) or no ratio."""
    ga = {(g["row"], g["goal"]): g for g in a.get("goals", [])}
    out = []
    for g in b.get("goals", []):
        key = (g["row"], g["goal"])
        if key not in ga:
            continue
        x, y = ga[key], g
        change = "n/a"
        if "spread" in x and "spread" in y:
            sa, sb = x["spread"], y["spread"]
            if sb["q3"] < sa["q1"]:
                change = "lower"
            elif sb["q1"] > sa["q3"]:
                change = "higher"
            else:
                change = "within spread"
        out.append({
            "row": key[0], "goal": key[1], "a_status": x["status"], "b_status": y["status"],
            "a": {k: x.get(k) for k in ("ratio", "spread")},
            "b": {k: y.get(k) for k in ("ratio", "spread")}, "change": change,
        })
    return out


def _goal_text(g: dict) -> str:
    if g.get("ratio") is None:
        return "—"
    if g.get("spread"):
        return f"{g['ratio']:.2f}x [{g['spread']['q1']:.2f}-{g['spread']['q3']:.2f}]"
    return f"{g['ratio']:.2f}x"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n")[0])
    p.add_argument("a", help="run folder or results.json (the baseline)")
    p.add_argument("b", help="run folder or results.json (the candidate)")
    p.add_argument("--threshold", type=float, default=0.05, help="relative change to flag")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    from rich.console import Console
    from rich.markup import escape as esc
    from rich.table import Table

    a, b = load_results(args.a), load_results(args.b)
    res = compare(a, b, threshold=args.threshold)
    # a terminal gets its own width; a log or pipe gets one wide enough for the tables
    console = Console(width=None if sys.stdout.isatty() else 160)
    t = Table(title=f"B / A   (A = {args.a}, B = {args.b})", title_justify="left")
    for col in ("row", "workload", "A median", "B median", "B / A"):
        t.add_column(col, justify="left" if col in ("row", "workload") else "right")
    colour = {"faster": "green", "slower": "red", "same": ""}
    for x in res["pairs"]:
        c = colour[x["change"]]
        ratio = f"[{c}]{x['ratio']:.2f}x[/]" if c else f"{x['ratio']:.2f}x"
        t.add_row(esc(x["row"]), x["workload"], fmt_seconds(x["a_s"]), fmt_seconds(x["b_s"]), ratio)
    console.print(t, width=max(console.width, 120))
    if res["per_row"]:
        per_row = ", ".join(f"{k} {v:.2f}x" for k, v in res["per_row"].items())
        console.print(esc(f"geometric mean B / A per row: {per_row}"))
    goals = [g for g in compare_goals(a, b) if g["a"]["ratio"] or g["b"]["ratio"]]
    if goals:
        g = Table(title="goals: median per-round ratio [IQR], interleaved timing",
                  title_justify="left")
        for col in ("row", "goal", "A", "B", "change", "status A -> B"):
            g.add_column(col)
        for x in goals:
            c = {"lower": "green", "higher": "red"}.get(x["change"], "")
            change = f"[{c}]{x['change']}[/]" if c else x["change"]
            g.add_row(esc(x["row"]), esc(x["goal"]), _goal_text(x["a"]), _goal_text(x["b"]),
                      change, f"{x['a_status']} -> {x['b_status']}")
        console.print(g, width=max(console.width, 120))
    for s in res["status_changes"]:
        line = f"status {s['case_id']}: {s['a']} -> {s['b']} {s['reason_b']}"
        console.print(f"[yellow]{esc(line)}[/yellow]")
    for side in ("only_a", "only_b"):
        if res[side]:
            console.print(f"[dim]{len(res[side])} cases only in {side[-1].upper()}[/dim]")
    diffs = env_differences(a, b)
    if diffs:
        console.print("[bold]environment differs[/bold] (not like for like):")
        for k, x, y in diffs:
            console.print(esc(f"  {k}: {x!r} -> {y!r}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
