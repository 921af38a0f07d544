"""From records to the report: derived numbers, goals, the JSON document and the rich table.

The document is built once, at the end of a run (:func:`build_results`, from the session's
records and the plan's goals); everything else here works on plain dicts (the records as stored
in results.json), so a saved run can be re-rendered or compared without re-running anything.

Derived per timed record:

- ``median_s``, ``iqr_s``: pytest-benchmark's median and inter-quartile range of one call;
- ``tflops``: useful FLOPs / median (causal: only allowed pairs count, see flops.py);
  ``tflops_dense``: dense FLOPs / median (the convention that credits masked work);
- ``frac_peak``: useful FLOP/s / the device's peak, the best ``n x n`` matmul of the same
  dtype measured in the same run by any of the frameworks;
- ``ratio``: median / the median of the row's ``ref`` (the framework's fused kernel; a sharded
  row's: the same framework's ring) on the same workload;
- ``sent_bytes`` (sharded rows only): the bytes one device sends per call by the formulas of
  docs/SHARDED.md (``bench.sharded.sent_bytes``), not a measurement: the record carries it
  from its call (``Record.derived``), and it is kept beside the numbers above.

Goals (``goals`` in results.json): each goal the plan resolved (``plan.PlannedGoal``), stated
from its goal record: its two calls timed interleaved in one process (``bench/goals.py``), the
median of the per-round ratios with its spread, and met / missed / unclear by where the IQR lies
against the limit. The ``x fused`` column's ratio of two rows timed minutes apart is kept next to
it as ``separate_ratio``.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.devices import peak_key
from bench.gate import gate_text
from bench.rows import ROWS, Row
from bench.sharded import USP_SIZES
from bench.workloads import MLA_GQA_GROUP, SHARDS

if TYPE_CHECKING:
    from bench.plan import PlannedGoal

__all__ = [
    "CONTENDED",
    "READABLE_SCHEMAS",
    "REPORT_WIDTH",
    "SCHEMA_VERSION",
    "build_results",
    "derive",
    "device_peaks",
    "evaluate_goals",
    "fmt_bytes",
    "fmt_seconds",
    "goal_measured",
    "load_results",
    "memory_text",
    "mla_cache_text",
    "render",
    "time_spent",
    "write_report",
]

SCHEMA_VERSION = 2
#: Schemas :func:`load_results` reads (1: goals from separately timed rows, no goal records).
READABLE_SCHEMAS = (1, 2)
#: A case timed while other processes used more than this share of the CPUs is starred.
CONTENDED = 0.10
#: The table's width in report.txt, and on a console that is not a terminal (a log, a pipe).
REPORT_WIDTH = 170


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


def memory_text(g: dict) -> str:
    """A memory goal's measurement (``Goal(kind="memory")``): ``24.1 MiB (numpy sdpa train:
    6.2 GiB)``; the plain path's cell says why it was not run when it was not."""
    plain = g.get("b_peak_bytes")
    beside = fmt_bytes(plain) if plain is not None else g.get("b_memory_method", "n/a")
    return f"{fmt_bytes(g.get('a_peak_bytes'))} ({g['b']['row']}: {beside})"


def device_peaks(records: list[dict]) -> dict[str, dict[str, Any]]:
    """``{"cpu/float32": {"flops": ..., "by": "torch", "n": 2048, "precision": "highest"}}``:
    the best matmul per device class and dtype (FLOPs / the fastest round). ``precision``:
    float32's matmul precision (``highest``: IEEE float32, the project's rows' own; ``tf32``
    under ``--tf32 on``), ``native`` for the 16-bit dtypes."""
    peaks: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["kind"] != "peak" or r["status"] != "ok" or not r.get("stats"):
            continue
        mm = r["matmul"]
        rate = mm["flops"] / r["stats"]["min"]
        key = f"{peak_key(r['device'])}/{mm['dtype']}"
        if key not in peaks or rate > peaks[key]["flops"]:
            precision = mm.get("precision", "unknown")
            peaks[key] = {"flops": rate, "by": r["framework"], "n": mm["n"], "precision": precision}
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
        d.update(r.get("derived") or {})  # what the record carries from its call (sent_bytes)
        r["derived"] = d


def evaluate_goals(
    records: list[dict], device: str, goals: Sequence[PlannedGoal] = ()
) -> list[dict]:
    """Each goal of the plan (``plan.PlannedGoal``), from this run's goal records: ``met`` /
    ``missed`` / ``unclear`` (the IQR of the interleaved per-round ratios against the limit),
    else ``not measured`` with the reason; a goal this run's grid does not hold but another CPU
    grid does (``PlannedGoal.elsewhere``: the L = S = 8192 goals, quick against full) is ``not
    run (full grid)``, never met. Goals are stated for CPU float32 (issue 5); on other devices
    they are ``not evaluated``."""
    goal_records = {
        (r["row"], r["goal"]["text"]): r for r in records if r["kind"] == "goal" and r.get("goal")
    }
    median = {
        (r["row"], r["workload"]["id"]): r["stats"]["median"]
        for r in records
        if r["kind"] == "row" and r["status"] == "ok" and r.get("stats")
    }
    in_grid = {r["workload"]["id"] for r in records if r.get("workload")}
    out = []
    for planned in goals:
        row, goal, w = planned.row, planned.goal, planned.workload
        entry: dict[str, Any] = {
            "row": row.name,
            "goal": planned.text,
            "kind": goal.kind,
            "workload": w.label,
            "limit": goal.limit,
        }
        if device != "cpu":
            out.append({**entry, "status": "not evaluated", "detail": "goals are for CPU"})
            continue
        if goal.kind in ("causal", "rolling"):
            pair = (row.name, w.id), (row.name, planned.baseline.id)
        elif goal.kind == "memory":
            pair = ()  # bytes, not a ratio of two rows' times
        else:
            pair = (row.name, w.id), (goal.ref, w.id)
        if pair and all(p in median for p in pair):
            entry["separate_ratio"] = median[pair[0]] / median[pair[1]]
        rec = goal_records.get((row.name, planned.text))
        if rec is None and planned.elsewhere:
            where = planned.elsewhere[0]
            detail = f"{w.label}: in the {where} grid (make bench BENCH={where})"
            out.append({**entry, "status": f"not run ({where} grid)", "detail": detail})
        elif rec is None:
            detail = (
                f"{w.label} is not in this grid"
                if w.id not in in_grid
                else "not in this run (its rows were not selected)"
            )
            out.append({**entry, "status": "not measured", "detail": detail})
        elif rec["status"] != "ok":
            out.append({**entry, "status": "not measured",
                        "detail": f"{rec['status']}: {rec['reason']}"})
        elif goal.kind == "memory":
            g = rec["goal"]
            keep = ("a_peak_bytes", "a_memory_method", "b_peak_bytes", "b_memory_method")
            out.append({**entry, "status": g["status"], "method": "one call each",
                        "detail": memory_text(g), "ref": goal.ref,
                        **{k: g.get(k) for k in keep}})
        else:
            g = rec["goal"]
            spread = {k: g["ratio"][k] for k in ("min", "q1", "q3", "max")}
            out.append(
                {
                    **entry,
                    "status": g["status"],
                    "ratio": g["ratio"]["median"],
                    "spread": spread,
                    "rounds": g["rounds"],
                    "method": "interleaved",
                    "contention": rec.get("contention"),
                }
            )
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
    goals: Sequence[PlannedGoal] = (),
    pytest_options: dict | None = None,
    contention: float | None = None,
) -> dict:
    """The results.json document: ``records`` with their derived numbers (:func:`derive`,
    ``rows``: the run's), the ``goals`` the plan resolved, stated (:func:`evaluate_goals`).
    ``contention``: the share of the CPUs other processes used during the whole run (each
    record has its own, for its timing)."""
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
        "goals": evaluate_goals(records, device, goals),
        "records": records,
    }


def load_results(path: str | Path) -> dict:
    """A results.json, given the file or the run folder holding it."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    data = json.loads(p.read_text())
    if data.get("schema") not in READABLE_SCHEMAS:
        raise ValueError(f"{p}: schema {data.get('schema')!r}, expected one of {READABLE_SCHEMAS}")
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
_GOAL_STYLE = {"met": "green", "missed": "red", "unclear": "yellow"}


def goal_measured(g: dict) -> str:
    """``2.41x (IQR 2.30-2.52, 9 rounds)``; a schema-1 goal has no spread: ``2.41x``."""
    if "ratio" not in g:
        return g.get("detail", "")
    text = f"{g['ratio']:.2f}x"
    if "spread" in g:
        s = g["spread"]
        text += f" (IQR {s['q1']:.2f}-{s['q3']:.2f}, {g['rounds']} rounds)"
    return text


def _cache_note(w: dict) -> str:
    """A decode step's KV cache for its section line, e.g. ``KV cache 4 MiB (K/H = 2/8 of
    MHA's)``; empty for the other workloads."""
    if w["op"] == "sharded":
        u, r = USP_SIZES.values()
        return (f"{SHARDS} devices (JAX: simulated CPU devices, torch: gloo processes); "
                f"USP u={u} x r={r}; x fused: against the framework's ring")
    if w["op"] == "paged_decode":  # bytes read by formula (bench/workloads.py)
        return (f"{len(w['lengths'])} sequences of {min(w['lengths'])}-{max(w['lengths'])} "
                f"keys; read: paged {fmt_bytes(w['cache_bytes'])} (whole pages), contiguous "
                f"padded {fmt_bytes(w['padded_cache_bytes'])}, fp8 e4m3 pages "
                f"{fmt_bytes(w['fp8_cache_bytes'])}")
    if w["op"] == "varlen":
        return f"{len(w['lengths'])} sequences of {min(w['lengths'])}-{max(w['lengths'])} tokens"
    if not w.get("cache_bytes"):
        return ""
    if w.get("cache_bytes_per_token"):  # an MLA decode step: bytes per token, vs MHA and GQA
        return "cache per token: " + mla_cache_text(w)
    share = "" if w["K"] == w["H"] else f" (K/H = {w['K']}/{w['H']} of MHA's)"
    return f"KV cache {fmt_bytes(w['cache_bytes'])}{share}"


def mla_cache_text(w: dict) -> str:
    """An MLA decode workload's cache bytes per token against MHA's and GQA's, e.g. ``latent
    2.2 KiB (R + Dr), naive 20 KiB (H (Dn + Dr + E)), MHA 16 KiB (2 H D), GQA 16:4 4 KiB
    (2 K D)``; the numbers are :meth:`Workload.cache_bytes_per_token`'s."""
    per = w["cache_bytes_per_token"]
    k = w["H"] // MLA_GQA_GROUP
    return (
        f"latent {fmt_bytes(per['MLA latent'])} (R + Dr), "
        f"naive {fmt_bytes(per['MLA naive'])} (H (Dn + Dr + E)), "
        f"MHA {fmt_bytes(per['MHA'])} (2 H D), GQA {w['H']}:{k} {fmt_bytes(per['GQA'])} (2 K D)"
    )


def _gflop(w: dict) -> str:
    useful, dense = w["flops_useful"] / 1e9, w["flops_dense"] / 1e9
    return f"{useful:.3g}" if useful == dense else f"{useful:.3g}/{dense:.3g}"


def _masked(r: dict) -> str:
    if not r["workload"]["is_causal"]:
        return ""
    return {True: "skips", False: "computes", None: "?"}[r.get("skips_masked")]


def _sent_cell(d: dict) -> str:
    """A sharded row's bytes per device and call, by the formula (its last column)."""
    n = d.get("sent_bytes")
    return "" if n is None else f"sends {fmt_bytes(n)}/device (formula)"


def _goal_cell(r: dict, goals: list[dict], esc: Any) -> str:
    cells = []
    for g in goals:
        if g["row"] != r["row"] or g["workload"] != r["workload"]["label"] or "ratio" not in g:
            continue
        mark = f"[{_GOAL_STYLE.get(g['status'], 'dim')}]{g['status']}[/]"
        op = "<" if g["kind"] == "faster" else "<="
        of = " of full" if g["kind"] == "causal" else ""
        spread = ""
        if "spread" in g:
            spread = f" IQR {g['spread']['q1']:.2f}-{g['spread']['q3']:.2f}"
        cells.append(f"{g['ratio']:.2f}x{of}{spread} (goal {op} {g['limit']:g}x) {mark}")
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
    ):
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
            gate_cell = gate_text(gate) if gate else ""
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
                f"[{style}]{gate_cell}[/]" if gate_cell else "",
                _gflop(r["workload"]),
                *cells,
                fmt_bytes(r.get("memory_bytes")) if r["status"] == "ok" else "",
                _masked(r),
                f"{r['compile_s']:.2f} s" if r.get("compile_s") is not None else "",
                _goal_cell(r, goals, esc) or _sent_cell(d),
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
            + ", ".join(esc(_peak_text(k, v)) for k, v in peaks.items())
        )
    if goals:
        g = Table(
            title="performance goals (issues 5, 10, 11; reported, not asserted): each time "
            "goal's two calls timed interleaved in one process, median of the per-round ratios; "
            "a memory goal: one call's peak extra bytes",
            title_justify="left",
        )
        for name in ("row", "goal", "measured", "min-max", "x fused (table)", "status"):
            g.add_column(name)
        for x in goals:
            st = x["status"]
            colour = _GOAL_STYLE.get(st, "dim")
            minmax = f"{x['spread']['min']:.2f}-{x['spread']['max']:.2f}" if "spread" in x else ""
            sep = f"{x['separate_ratio']:.2f}x" if "separate_ratio" in x else ""
            g.add_row(esc(x["row"]), esc(x["goal"]), esc(goal_measured(x)), minmax, sep,
                      f"[{colour}]{st}[/]")
        console.print(g)
        console.print(
            "[dim]met / missed: the whole IQR of the per-round ratios is within / beyond the "
            "limit; unclear: the IQR straddles it (rerun on a quiet machine).[/dim]"
        )
    spent = time_spent(results)
    if spent:
        console.print(esc(spent), style="dim")
    if absent:
        console.print("[dim]not available (skipped, visible):[/dim]")
        for name, reason in absent.items():
            console.print(f"[dim]  {esc(name)}: {esc(reason)}[/dim]")
    console.print(
        "[dim]median and IQR of one call (pytest-benchmark); TFLOP/s and % peak count useful "
        "FLOPs (causal: allowed pairs only), % peak against the same dtype's best matmul "
        "(float32: at the precision named on the peak line); GFLOP useful/dense for causal; "
        "x fused = median / the framework's fused kernel on the same workload; peak mem = extra "
        "bytes of one call (method per row in results.json); causal: whether the kernel skips "
        "masked blocks; decode: one token after P cached ones, projections + attention over "
        "P + 1 keys, the cache an input (its size on the workload's line).[/dim]"
    )


def write_report(results: dict, out_dir: Path, console: Any) -> None:
    """Write ``results.json`` and ``report.txt`` (the table at :data:`REPORT_WIDTH`) into
    ``out_dir``, and print the table to ``console``."""
    from rich.console import Console

    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    recorded = Console(record=True, width=REPORT_WIDTH, file=io.StringIO())
    render(results, recorded)
    (out_dir / "report.txt").write_text(recorded.export_text())
    render(results, console)


def time_spent(results: dict, longest: int = 5) -> str:
    """Where a run's time went, from the records' ``wall_s`` (each case's own seconds; a gate
    counts in the first case that uses it): ``time: 250 s of the run's 260 s in 120 cases
    (rows 150 s, the gates' 40 s within them; goals 60 s; peaks 40 s); longest: ...``. Empty
    for runs that did not record it."""
    timed = [r for r in results["records"] if r.get("wall_s") is not None]
    if not timed:
        return ""
    gates = sum(g.get("seconds", 0.0) for g in results.get("gates", []))
    by_kind: dict[str, float] = {}
    for r in timed:
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0.0) + r["wall_s"]
    total = sum(by_kind.values())
    parts = [f"{k}s {v:.0f} s" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])]
    parts = [p + (f", the gates' {gates:.0f} s within them" if p.startswith("rows") else "")
             for p in parts]
    top = sorted(timed, key=lambda r: -r["wall_s"])[:longest]
    names = ", ".join(f"{r['case_id']} {r['wall_s']:.0f} s" for r in top)
    wall = results.get("wall_s")
    whole = f" of the run's {wall:.0f} s" if wall else ""
    head = f"time: {total:.0f} s{whole} in {len(timed)} cases"
    return f"{head} ({'; '.join(parts)}); longest: {names}"


#: How the float32 peak's matmul precision reads in the table.
_PRECISION = {"highest": "IEEE float32 matmul", "tf32": "TF32 matmul"}


def _peak_text(key: str, peak: dict) -> str:
    """``cuda/float32 60 TFLOP/s (torch, n=8192, IEEE float32 matmul)``."""
    how = f"{peak['by']}, n={peak['n']}"
    if key.endswith("/float32") and "precision" in peak:
        how += f", {_PRECISION.get(peak['precision'], peak['precision'])}"
    return f"{key} {peak['flops'] / 1e12:.3g} TFLOP/s ({how})"
