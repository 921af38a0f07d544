"""PNG plots of a run: time and peak memory against sequence length, one line per row.

One panel per series (every workload field but the sequence length) that has at least two
lengths. Project rows are solid, framework baselines dashed. The memory plot carries the size
of one float32 ``(B, H, L, S)`` score tensor as a grey reference: rows that materialize the
scores climb along it (the quadratic wall); a tiled or fused kernel stays near its inputs.
Decode series put the cached context P on the x axis (one new token attends over P + 1 keys).
"""

from __future__ import annotations

import math
from pathlib import Path

__all__ = ["colour", "plot_results", "series_table"]


def series_table(results: dict, metric: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{series: {row: [(L, value), ...]}}`` (decode series: P, the cached tokens, for L) for
    ``metric`` ``"time"`` (median seconds) or ``"memory"`` (peak bytes), keeping only series
    with at least two lengths."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for r in results["records"]:
        if r["kind"] != "row" or r["status"] != "ok" or not r.get("derived"):
            continue
        value = r["derived"]["median_s"] if metric == "time" else r.get("memory_bytes")
        if value is None:
            continue
        w = r["workload"]
        out.setdefault(w["series"], {}).setdefault(r["row"], []).append((_seq(w), value))
    for series in list(out):
        for pts in out[series].values():
            pts.sort()
        if len({L for pts in out[series].values() for L, _ in pts}) < 2:
            del out[series]
    return out


#: tab20 colour pairs (dark, light): the project's rows by framework, sdpa/MHA dark and
#: flash/GQA light; the frameworks' kernels each their own.
_FRAMEWORK_PAIR = {"numpy": 0, "torch": 6, "jax": 4}
_BASELINE = {
    "torch F.sdpa": 8, "torch F.sdpa[math]": 9, "torch F.sdpa[flash]": 10,
    "torch F.sdpa[efficient]": 11, "torch F.sdpa[cudnn]": 12, "torch nn.MHA": 8,
    "jax.nn.dpa[xla]": 2, "jax.nn.dpa[cudnn]": 3, "flax nnx.MHA": 2,
    "torch F.sdpa decode": 8, "jax.nn.dpa decode": 2,
    "torch F.sdpa train": 8, "jax.nn.dpa[xla] train": 2,
}


def colour(row: str) -> int:
    """A row's tab20 colour index, fixed per row so it keeps its colour across panels, figures
    and runs: numpy blue, torch red, jax green (light for the tiled path and GQA modules)."""
    from bench.rows import row_by_name

    if row in _BASELINE:
        return _BASELINE[row]
    try:
        r = row_by_name(row)
    except KeyError:
        return 14 + sum(map(ord, row)) % 6
    light = "flash" in r.target or "GroupedQuery" in r.target
    return _FRAMEWORK_PAIR.get(r.framework, 14) + int(light)


def _seq(w: dict) -> int:
    """The x of a workload: L (= S), or the cached context P of a decode step."""
    return w.get("seq", w["L"])


def _score_bytes(results: dict, series: str) -> list[tuple[int, int]]:
    pts = {}
    for r in results["records"]:
        w = r.get("workload")
        if w and w["series"] == series:
            pts[_seq(w)] = w["B"] * w["H"] * w["L"] * w["S"] * 4
    return sorted(pts.items())


def plot_results(
    results: dict, out_dir: str | Path, *, baselines: set[str] | None = None
) -> list[Path]:
    """Write ``time_vs_seq.png`` and ``memory_vs_seq.png`` into ``out_dir``; returns the paths
    written (none when no series has two lengths)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if baselines is None:
        baselines = {r["row"] for r in results["records"] if r.get("row_kind") == "baseline"}
    env = results["environment"]
    where = f"{env.get('device_name', results['device'])} · {env.get('timestamp', '')[:10]}"
    written = []
    for metric, fname, ylabel in (
        ("time", "time_vs_seq.png", "median time per call (s)"),
        ("memory", "memory_vs_seq.png", "peak extra memory per call (bytes)"),
    ):
        table = series_table(results, metric)
        if not table:
            continue
        cmap = plt.get_cmap("tab20")
        n = len(table)
        ncols = min(n, 2)
        nrows = math.ceil(n / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(7.5 * ncols, 5 * nrows), squeeze=False)
        for ax, (series, by_row) in zip(axes.flat, table.items()):
            for row, pts in by_row.items():
                xs, ys = zip(*pts)
                style = "--" if row in baselines else "-"
                ax.plot(xs, ys, style, marker="o", ms=4, color=cmap(colour(row) % 20), label=row)
            if metric == "memory":
                xs, ys = zip(*_score_bytes(results, series))
                ax.plot(xs, ys, ":", color="grey", lw=2, label="one f32 (B,H,L,S) score tensor")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            decode = series.startswith("decode ")
            ax.set_xlabel("cached tokens P (one new token)" if decode else "sequence length L = S")
            ax.set_ylabel(ylabel)
            ax.set_title(series, fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        for ax in list(axes.flat)[n:]:
            ax.set_visible(False)
        title = "time" if metric == "time" else "peak memory"
        fig.suptitle(f"Rosetta Attention: {title} vs sequence length · {where}", fontsize=11)
        fig.tight_layout()
        path = Path(out_dir) / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
