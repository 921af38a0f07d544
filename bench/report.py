"""From records to the report: derived numbers, goals, the JSON document and the rich table.

Everything here works on plain dicts (the records as stored in results.json), so a saved run
can be re-rendered or compared without re-running anything.

Derived per timed record:

- ``median_s``, ``iqr_s``: pytest-benchmark's median and inter-quartile range of one call;
- ``tflops``: useful FLOPs / median (causal: only allowed pairs count, see workloads.py);
  ``tflops_dense``: dense FLOPs / median (the convention that credits masked work);
- ``frac_peak``: useful FLOP/s / the device's peak, the best ``n x n`` matmul of the same
  dtype measured in the same run by any of the frameworks;
- ``ratio``: median / the median of the row's ``ref`` (the framework's fused kernel) on the
  same workload.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from bench.rows import ROWS, Row
from bench.session import peak_key

__all__ = [
    "CONTENDED",
    "SCHEMA_VERSION",
    "build_results",
    "derive",
    "device_peaks",
    "evaluate_goals",
    "fmt_bytes",
    "fmt_seconds",
    "load_results",
    "render",
]

SCHEMA_VERSION = 1
#: A case timed while other processes used more than this share of the CPUs is starred.
CONTENDED = 0.10


def fmt_seconds(s: float | None) -> str:
    """``0.0123`` -> ``12.3 ms``; three significant digits, s/ms/µs."""
    if s is None or not math.isfinite(s):
        return "—"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= scale or unit == "µs":
            v = s / scale
            return f"{v:.3g} {unit}" if v < 1000 else f"{v:.0f} {unit}"
    raise AssertionError("unreachable")


def fmt_bytes(n: int | None) -> str:
    """``3 * 2**20`` -> ``3.00 MiB``."""
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def device_peaks(records: list[dict]) -> dict[str, dict[str, Any]]:
    """``{"cpu/float32": {"flops": ..., "by": "torch", "n": 2048}}``: the best matmul per
    device class and dtype (FLOPs / the fastest round)."""
    peaks: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["kind"] != "peak" or r["status"] != "ok" or not r.get("stats"):
            continue
        mm = r["matmul"]
        rate = mm["flops"] / r["stats"]["min"]
        key = f"{peak_key(r['device'])}/{mm['dtype']}"
        if key not in peaks or rate > peaks[key]["flops"]:
            peaks[key] = {"flops": rate, "by": r["framework"], "n": mm["n"]}
    return peaks


def derive(records: list[dict], rows: tuple[Row, ...] = ROWS) -> None:
    """Add ``derived`` numbers to every timed row record, in place (module docstring)."""
    peaks = device_peaks(records)
    refs = {r.name: r.ref for r in rows}
    by_key = {
        (r["row"], r["workload"]["id"]): r for r in records if r["kind"] == "row" and r["workload"]
    }
    for r in records:
        if r["kind"] != "row" or r["status"] != "ok" or not r.get("stats"):
            continue
        w, st = r["workload"], r["stats"]
        med = st["median"]
        peak = peaks.get(f"{peak_key(r['device'])}/{w['dtype']}")
        d: dict[str, Any] = {
            "median_s": med,
            "iqr_s": st["iqr"],
            "min_s": st["min"],
            "max_s": st["max"],
            "tflops": w["flops_useful"] / med / 1e12,
            "tflops_dense": w["flops_dense"] / med / 1e12,
            "frac_peak": (w["flops_useful"] / med / peak["flops"]) if peak else None,
            "ref": refs.get(r["row"]),
            "ratio": None,
        }
        ref = by_key.get((d["ref"], w["id"])) if d["ref"] else None
        if ref is not None and ref["status"] == "ok" and ref.get("stats"):
            d["ratio"] = med / ref["stats"]["median"]
        r["derived"] = d


def evaluate_goals(records: list[dict], device: str, rows: tuple[Row, ...] = ROWS) -> list[dict]:
    """Each registered goal, measured in this run: ``met`` / ``missed`` / ``not measured``.

    Goals are stated for CPU float32 (issue 5); on other devices they are listed as
    ``not evaluated``.
    """
    median = {
        (r["row"], r["workload"]["id"]): r["stats"]["median"]
        for r in records
        if r["kind"] == "row" and r["status"] == "ok" and r.get("stats")
    }
    status_of = {(r["row"], r["workload"]["id"]): r for r in records if r["kind"] == "row"}
    out = []
    for row in rows:
        for goal in row.goals:
            w = goal.workload()
            entry = {
                "row": row.name,
                "goal": goal.text(),
                "kind": goal.kind,
                "workload": w.label,
                "limit": goal.limit,
            }
            if device != "cpu":
                out.append({**entry, "status": "not evaluated", "detail": "goals are for CPU"})
                continue
            if goal.kind == "causal":
                base = dataclasses.replace(w, is_causal=False)
                pair = ((row.name, w.id), (row.name, base.id))
            else:
                pair = ((row.name, w.id), (goal.ref, w.id))
            if all(p in median for p in pair):
                ratio = median[pair[0]] / median[pair[1]]
                met = goal.met(ratio)
                out.append({**entry, "ratio": ratio, "status": "met" if met else "missed"})
            else:
                why = [
                    f"{p[0]}: {status_of[p]['status']}" if p in status_of else f"{p[0]}: not run"
                    for p in dict.fromkeys(pair)
                    if p not in median
                ]
                if not any(p in status_of for p in pair):
                    why = [f"{w.label} is not in this grid"]
                out.append({**entry, "status": "not measured", "detail": "; ".join(why)})
    return out


def build_results(
    *,
    device: str,
    grid: str,
    environment: dict,
    records: list[dict],
    gates: list[dict],
    wall_s: float,
    rows: tuple[Row, ...] = ROWS,
    pytest_options: dict | None = None,
    contention: float | None = None,
) -> dict:
    """The results.json document. ``contention``: the share of the CPUs other processes used
    during the whole run (each record has its own, for its timing)."""
    derive(records, rows)
    return {
        "schema": SCHEMA_VERSION,
        "device": device,
        "grid": grid,
        "wall_s": wall_s,
        "contention": contention,
        "environment": environment,
        "pytest_benchmark_options": pytest_options or {},
        "peaks": device_peaks(records),
        "gates": gates,
        "goals": evaluate_goals(records, device, rows),
        "records": records,
    }


def load_results(path: str | Path) -> dict:
    """A results.json, given the file or the run folder holding it."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    data = json.loads(p.read_text())
    if data.get("schema") != SCHEMA_VERSION:
        raise ValueError(f"{p}: schema {data.get('schema')!r}, expected {SCHEMA_VERSION}")
    return data


# ------------------------------------------------------------------------------------ the table

_STATUS_STYLE = {
    "ok": "green",
    "failed": "bold red",
    "error": "red",
    "oom": "yellow",
    "unsupported": "dim",
    "skipped": "dim",
    "n/a": "dim",
}


def _cache_note(w: dict) -> str:
    """A decode step's KV cache for its section line, e.g. ``KV cache 4 MiB (K/H = 2/8 of
    MHA's)``; empty for the other workloads."""
    if not w.get("cache_bytes"):
        return ""
    share = "" if w["K"] == w["H"] else f" (K/H = {w['K']}/{w['H']} of MHA's)"
    return f"KV cache {fmt_bytes(w['cache_bytes'])}{share}"


def _gflop(w: dict) -> str:
    useful, dense = w["flops_useful"] / 1e9, w["flops_dense"] / 1e9
    return f"{useful:.3g}" if useful == dense else f"{useful:.3g}/{dense:.3g}"


def _masked(r: dict) -> str:
    if not r["workload"]["is_causal"]:
        return ""
    return {True: "skips", False: "computes", None: "?"}[r.get("skips_masked")]


def _goal_cell(r: dict, goals: list[dict], esc: Any) -> str:
    cells = []
    for g in goals:
        if g["row"] != r["row"] or g["workload"] != r["workload"]["label"] or "ratio" not in g:
            continue
        mark = "[green]met[/]" if g["status"] == "met" else "[red]missed[/]"
        op = "<" if g["kind"] == "faster" else "<="
        of = " of full" if g["kind"] == "causal" else ""
        cells.append(f"{g['ratio']:.2f}x{of} (goal {op} {g['limit']:g}x) {mark}")
    return "; ".join(cells)


def render(results: dict, console: Any) -> None:
    """Print the run's table, the goals and the rows that were not available to ``console``."""
    from rich.markup import escape as esc
    from rich.table import Table

    records, goals = results["records"], results["goals"]
    env = results["environment"]
    title = (
        f"Rosetta Attention bench · {env.get('device_name')} · {results['device']} "
        f"· grid {results['grid']} · {env.get('timestamp', '')[:10]}"
    )
    t = Table(title=title, title_justify="left", show_lines=False, pad_edge=False)
    for name, just in (
        ("row", "left"), ("device", "left"), ("gate", "left"), ("GFLOP", "right"),
        ("median", "right"), ("IQR", "right"), ("TFLOP/s", "right"), ("% peak", "right"),
        ("x fused", "right"), ("peak mem", "right"), ("causal", "left"),
        ("compile", "right"), ("goal", "left"),
    ):  # fmt: skip
        t.add_column(name, justify=just, no_wrap=name in ("row", "median"))

    notes: dict[str, int] = {}  # reason -> footnote number
    starred = False
    rows_by_workload: dict[str, list[dict]] = {}
    labels: dict[str, str] = {}
    cache_notes: dict[str, str] = {}
    absent: dict[str, str] = {}
    for r in records:
        if r["kind"] != "row":
            continue
        if r["status"] == "n/a":
            absent.setdefault(r["row"], r["reason"])
            continue
        rows_by_workload.setdefault(r["workload"]["id"], []).append(r)
        labels[r["workload"]["id"]] = r["workload"]["label"]
        cache_notes[r["workload"]["id"]] = _cache_note(r["workload"])
    for wid, rs in rows_by_workload.items():
        t.add_section()
        # a decode step's cache size goes in the last (wrapping) column, not the label's width
        t.add_row(f"[bold]{esc(labels[wid])}[/bold]", *[""] * 11, cache_notes[wid])
        for r in rs:
            d = r.get("derived") or {}
            gate = r.get("gate") or {}
            gate_text = _gate_text(gate) if gate else ""
            style = _STATUS_STYLE.get(r["status"], "")
            if r["status"] == "ok" and d:
                busy = (r.get("contention") or 0.0) > CONTENDED
                starred = starred or busy
                cells = [
                    fmt_seconds(d["median_s"]) + (" *" if busy else ""),
                    f"{100 * d['iqr_s'] / d['median_s']:.1f}%",
                    f"{d['tflops']:.3g}",
                    f"{100 * d['frac_peak']:.0f}%" if d.get("frac_peak") else "—",
                    f"{d['ratio']:.3g}x" if d.get("ratio") else "—",
                ]
            elif r["status"] == "ok":  # ran once, not timed (--benchmark-disable)
                cells = ["not timed", "", "", "", ""]
            else:
                n = notes.setdefault(r["reason"], len(notes) + 1)
                cells = [f"[{style}]{r['status']}[/] ({n})", "", "", "", ""]
            t.add_row(
                f"  {esc(r['row'])}",
                r["device"] or "—",
                f"[{style}]{gate_text}[/]" if gate_text else "",
                _gflop(r["workload"]),
                *cells,
                fmt_bytes(r.get("memory_bytes")) if r["status"] == "ok" else "",
                _masked(r),
                f"{r['compile_s']:.2f} s" if r.get("compile_s") is not None else "",
                _goal_cell(r, goals, esc),
            )
    console.print(t)
    for reason, n in notes.items():
        console.print(f"  ({n}) {esc(reason)}", style="dim")
    if starred:
        console.print(
            f"  * other processes used more than {CONTENDED:.0%} of the CPUs while this case was "
            "timed: the number is not a quiet machine's (results.json: contention)",
            style="yellow",
        )
    run_share = results.get("contention")
    if run_share is not None and run_share > CONTENDED:
        console.print(
            f"  other processes used {run_share:.0%} of the CPUs during this run", style="yellow"
        )

    peaks = results.get("peaks", {})
    if peaks:
        console.print(
            "device peak (best n x n matmul this run): "
            + ", ".join(
                esc(f"{k} {v['flops'] / 1e12:.3g} TFLOP/s ({v['by']}, n={v['n']})")
                for k, v in peaks.items()
            )
        )
    if goals:
        g = Table(title="performance goals (issue 5; reported, not asserted)", title_justify="left")
        for name in ("row", "goal", "measured", "status"):
            g.add_column(name)
        for x in goals:
            st = x["status"]
            colour = {"met": "green", "missed": "red"}.get(st, "dim")
            measured = f"{x['ratio']:.2f}x" if "ratio" in x else x.get("detail", "")
            g.add_row(esc(x["row"]), esc(x["goal"]), esc(measured), f"[{colour}]{st}[/]")
        console.print(g)
    if absent:
        console.print("[dim]not available (skipped, visible):[/dim]")
        for name, reason in absent.items():
            console.print(f"[dim]  {esc(name)}: {esc(reason)}[/dim]")
    console.print(
        "[dim]median and IQR of one call (pytest-benchmark); TFLOP/s and % peak count useful "
        "FLOPs (causal: allowed pairs only); GFLOP useful/dense for causal; x fused = median / "
        "the framework's fused kernel on the same workload; peak mem = extra bytes of one call "
        "(method per row in results.json); causal: whether the kernel skips masked blocks; "
        "decode: one token after P cached ones, projections + attention over P + 1 keys, the "
        "cache an input (its size on the workload's line).[/dim]"
    )


def _gate_text(gate: dict) -> str:
    if gate["status"] == "passed":
        return f"{gate['n_run']}/{gate['n_run']} ok"
    if gate["status"] == "failed":
        return f"FAIL {gate['n_failed']}/{gate['n_run']}"
    return "ungated" if gate["status"] == "skipped" else "error"
