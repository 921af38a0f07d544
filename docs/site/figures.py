"""The figures of the README and the page: small PNGs in docs/figures/, made by ``make figures``.

Each figure is one entry of ``FIGURES``: a function that computes the data it plots (returned as
a dict, so a test can check the numbers rather than the pixels) and a function that draws that
data. The attention-weight heatmaps are built from ``PANELS``: a new mask is one more ``Panel``
whose keywords go to ``attention_weights`` (the v2 window, segments, sink and ALiBi are).

    python -m docs.site.figures [--out docs/figures] [NAME ...]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FIGURES_DIR = ROOT / "docs" / "figures"
SEED = 0
COLOURS = {"numpy": "#4c72b0", "torch": "#dd8452", "jax": "#55a868"}
NAMES = {"numpy": "NumPy", "torch": "PyTorch", "jax": "JAX"}


# ---------------------------------------------------------------------------------------------
# attention weights as heatmaps


@dataclass(frozen=True)
class Panel:
    """One heatmap: the weights ``(L, S)`` of one query head on seeded standard-normal q, k.

    ``keywords`` go to ``impl_numpy.attention_weights`` as they are; ``lengths`` (real keys per
    sequence) becomes ``mask=padding_mask(lengths, S)``.
    """

    figure: str  # the PNG it belongs to
    title: str
    L: int
    S: int
    keywords: dict[str, Any] = field(default_factory=dict)
    lengths: int | None = None


PANELS: tuple[Panel, ...] = (
    Panel("weights_causal", "causal, top_left: j <= i", 5, 8, {"is_causal": True}),
    Panel(
        "weights_causal",
        "causal, bottom_right: j <= i + S - L",
        5,
        8,
        {"is_causal": True, "causal_alignment": "bottom_right"},
    ),
    Panel("weights_masks", "bidirectional", 6, 6),
    Panel("weights_masks", "padding mask: 4 real keys of 6", 6, 6, lengths=4),
    Panel("weights_masks", "causal and padding", 6, 6, {"is_causal": True}, lengths=4),
    # contract v2, on the 6 x 8 grids of docs/SEMANTICS.md (bottom_right: row i's diagonal is
    # key i + 2)
    Panel("weights_v2", "window=(2, 0), bottom_right: 3 keys", 6, 8,
          {"window": (2, 0), "causal_alignment": "bottom_right"}),
    Panel("weights_v2", "segments 001112 / 00011112", 6, 8,
          {"q_segment_ids": np.array([0, 0, 1, 1, 1, 2]),
           "kv_segment_ids": np.array([0, 0, 0, 1, 1, 1, 1, 2])}),
    Panel("weights_v2", "causal + sink 1.0: rows sum < 1", 6, 8,
          {"is_causal": True, "causal_alignment": "bottom_right", "sinks": np.array([1.0])}),
    Panel("weights_v2", "causal + ALiBi slope 1/2", 6, 8,
          {"is_causal": True, "causal_alignment": "bottom_right", "alibi_slopes": np.array([0.5])}),
)
HEAD_DIM = 16  # D of the heatmaps' query and key


def panel_inputs(panel: Panel) -> dict[str, np.ndarray]:
    """The panel's query ``(1, 1, L, D)``, key ``(1, 1, S, D)`` and mask (or None), float64."""
    from impl_numpy import padding_mask

    rng = np.random.default_rng(SEED)
    q = rng.standard_normal((1, 1, panel.L, HEAD_DIM))
    k = rng.standard_normal((1, 1, panel.S, HEAD_DIM))
    mask = None if panel.lengths is None else padding_mask(np.array([panel.lengths]), panel.S)
    return {"query": q, "key": k, "mask": mask}


def heatmap_data(figure: str) -> dict[str, Any]:
    """``{"panels": [Panel, ...], "weights": [(L, S) arrays]}`` for one heatmap figure."""
    from impl_numpy import attention_weights

    panels = [p for p in PANELS if p.figure == figure]
    weights = []
    for p in panels:
        x = panel_inputs(p)
        w = attention_weights(x["query"], x["key"], mask=x["mask"], **p.keywords)
        weights.append(w[0, 0])  # (L, S)
    return {"panels": panels, "weights": weights}


def _heatmap(ax, w: np.ndarray, title: str) -> None:
    L, S = w.shape
    ax.imshow(w, cmap="Blues", vmin=0.0, vmax=1.0)
    for i in range(L):
        for j in range(S):
            text = "0" if w[i, j] == 0.0 else f"{w[i, j]:.2f}"[1:] if w[i, j] < 1 else "1"
            colour = "white" if w[i, j] > 0.6 else ("#999999" if w[i, j] == 0.0 else "black")
            ax.text(j, i, text, ha="center", va="center", fontsize=6.5, color=colour)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(f"key j (S = {S})", fontsize=8)
    ax.set_ylabel(f"query i (L = {L})", fontsize=8)
    ax.set_xticks(range(S))
    ax.set_yticks(range(L))
    ax.tick_params(labelsize=7)


def heatmap_plot(data: dict[str, Any]):
    import matplotlib.pyplot as plt

    n = len(data["panels"])
    widths = [p.S for p in data["panels"]]
    fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 2.9), gridspec_kw={"width_ratios": widths})
    for ax, p, w in zip(np.atleast_1d(axes), data["panels"], data["weights"]):
        _heatmap(ax, w, p.title)
    return fig


GQA = {"d_model": 24, "n_heads": 6, "n_kv_heads": 2, "L": 7}


def gqa_heads_data() -> dict[str, Any]:
    """Every head's causal weights ``(H, L, L)`` of a seeded GQA layer, with its canonical
    weights and input, and the key/value head each query head reads."""
    from impl_numpy import GroupedQueryAttention

    H, K, M, L = GQA["n_heads"], GQA["n_kv_heads"], GQA["d_model"], GQA["L"]
    layer = GroupedQueryAttention(M, H, K, dtype=np.float64, rng=SEED)
    x = np.random.default_rng(SEED + 1).standard_normal((1, L, M))  # (B, L, M)
    _, w = layer(x, is_causal=True, return_weights=True)  # (B, H, L, S)
    return {
        "weights": w[0],
        "kv_head": [h // (H // K) for h in range(H)],
        "x": x,
        "canonical": layer.to_canonical(),
        "n_heads": H,
        "n_kv_heads": K,
    }


def gqa_heads_plot(data: dict[str, Any]):
    import matplotlib.pyplot as plt

    H, K = data["n_heads"], data["n_kv_heads"]
    G = H // K
    fig, axes = plt.subplots(K, G, figsize=(2.5 * G, 2.5 * K), squeeze=False)
    for h in range(H):
        ax = axes[data["kv_head"][h], h % G]
        _heatmap(ax, data["weights"][h], f"query head {h} → kv head {data['kv_head'][h]}")
        ax.set_xlabel("")
        ax.set_ylabel("")
    fig.supxlabel("key j", fontsize=9)
    fig.supylabel("one row per key/value head; query i", fontsize=9)
    return fig


# ---------------------------------------------------------------------------------------------
# the softmax temperature


def temperature_data(L: int = 32, S: int = 32, D: int = 16, n: int = 41) -> dict[str, Any]:
    """Mean entropy (nats) and mean largest weight of the rows, against the scale.

    The scale runs from 0 to 4/sqrt(D) (``ratio`` = scale * sqrt(D), 1 = the default).
    """
    from impl_numpy import attention_weights

    rng = np.random.default_rng(SEED)
    q = rng.standard_normal((1, 1, L, D))
    k = rng.standard_normal((1, 1, S, D))
    ratio = np.linspace(0.0, 4.0, n)
    entropy, largest = [], []
    for r in ratio:
        w = attention_weights(q, k, scale=float(r) / math.sqrt(D))[0, 0]  # (L, S)
        logw = np.log(w, out=np.zeros_like(w), where=w > 0)
        entropy.append(float(-(w * logw).sum(-1).mean()))
        largest.append(float(w.max(-1).mean()))
    return {
        "ratio": ratio,
        "scale": ratio / math.sqrt(D),
        "entropy": np.array(entropy),
        "largest": np.array(largest),
        "query": q,
        "key": k,
        "S": S,
    }


def temperature_plot(data: dict[str, Any]):
    import matplotlib.pyplot as plt

    S = data["S"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
    a.plot(data["ratio"], data["entropy"], color="#4c72b0")
    a.axhline(math.log(S), ls=":", color="grey", label=f"uniform: log S = {math.log(S):.2f}")
    a.set_ylabel("entropy of a row (nats)")
    b.plot(data["ratio"], data["largest"], color="#dd8452")
    b.axhline(1.0 / S, ls=":", color="grey", label=f"uniform: 1/S = {1 / S:.3f}")
    b.axhline(1.0, ls="--", color="grey", lw=0.8, label="one-hot: 1")
    b.set_ylabel("largest weight of a row")
    for ax in (a, b):
        ax.axvline(1.0, color="black", lw=0.6)
        ax.set_xlabel("scale × √D  (1 = the default 1/√D)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Softmax temperature (L = S = {S}, standard-normal q, k)", fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------------
# the missing scale


def query_gradient(q: np.ndarray, k: np.ndarray, v: np.ndarray, do: np.ndarray, scale: float):
    """``d<sdpa(q, k, v), do> / dq``, shape of q (float64), from NumPy's hand-written backward
    (``scaled_dot_product_attention_vjp``; the test checks it against finite differences)."""
    from impl_numpy import scaled_dot_product_attention_vjp

    return scaled_dot_product_attention_vjp(q, k, v, do, scale=scale).query


GRADIENT_SOURCE = "impl_numpy.scaled_dot_product_attention_vjp, the hand-written backward"


def missing_scale_data(
    dims: tuple[int, ...] = (4, 8, 16, 32, 64, 128, 256, 512, 1024),
    L: int = 64,
    S: int = 64,
    E: int = 16,
) -> dict[str, Any]:
    """Against D: the variance of the scores ``q . k`` (entries standard normal) unscaled and
    scaled by 1/sqrt(D); and the query gradient of ``<sdpa(q, k, v), do>`` with scale 1 and with
    1/sqrt(D): per query row ``|dq_i|``, its median and its 10th and 90th percentiles."""
    out: dict[str, Any] = {"D": np.array(dims), "L": L, "S": S, "E": E, "inputs": {}}
    series: dict[str, list[float]] = {}
    for D in dims:
        rng = np.random.default_rng([SEED, D])
        q = rng.standard_normal((1, 1, L, D))  # (B, H, L, D)
        k = rng.standard_normal((1, 1, S, D))  # (B, K, S, D)
        v = rng.standard_normal((1, 1, S, E))  # (B, K, S, E)
        do = rng.standard_normal((1, 1, L, E))  # (B, H, L, E)
        scores = (q @ np.swapaxes(k, -1, -2))[0, 0]  # (L, S), unscaled
        series.setdefault("var_plain", []).append(float(scores.var()))
        series.setdefault("var_scaled", []).append(float((scores / math.sqrt(D)).var()))
        for name, scale in (("grad_plain", 1.0), ("grad_scaled", 1.0 / math.sqrt(D))):
            rows = np.linalg.norm(query_gradient(q, k, v, do, scale)[0, 0], axis=-1)  # (L,)
            lo, median, hi = np.percentile(rows, [10, 50, 90])
            series.setdefault(name, []).append(float(median))
            series.setdefault(f"{name}_lo", []).append(float(lo))
            series.setdefault(f"{name}_hi", []).append(float(hi))
        out["inputs"][D] = {"query": q, "key": k, "value": v, "grad_output": do}
    out.update({key: np.array(val) for key, val in series.items()})
    return out


#: The head dims of the missing-scale table (docs/SEMANTICS.md, "The default scale, measured").
SCALE_TABLE_DIMS = (16, 32, 64, 128, 256)
#: A row is saturated when its largest weight exceeds this.
SATURATED = 0.99
#: A row's query gradient has vanished when its norm is below this share of the scaled run's
#: median row norm at the same D.
VANISHED = 1e-3


def missing_scale_table(
    dims: tuple[int, ...] = SCALE_TABLE_DIMS, H: int = 8, L: int = 128, S: int = 128, E: int = 64
) -> dict[str, Any]:
    """The missing scale, measured (issue 10, item 6): for each D, seeded standard-normal
    ``q (1, H, L, D)``, ``k (1, H, S, D)``, ``v (1, H, S, E)`` and ``grad_output (1, H, L, E)``,
    with scale 1 (``plain``) and ``1/sqrt(D)`` (``scaled``):

    - ``var``: the variance of the scores ``s = q . k * scale``;
    - ``saturated``: the share of rows whose largest weight is above :data:`SATURATED`;
    - ``ds_median``: the median row norm ``|dS_i|`` of the gradient at the scores (what the
      softmax passes back, ``dS = W * (dW - rowsum(dO * O))``, before the factor ``scale * K``);
    - ``dq_median``: the median row norm ``|dQ_i|``; ``dq_rms``: the RMS of all of dQ;
    - ``vanished``: the share of rows with ``|dQ_i| < VANISHED x`` the scaled run's
      ``dq_median`` at this D;
    - ``dk_nonmax``: the median ``|dK_j|`` of the keys that are no row's argmax, over the median
      ``|dK_j|`` of those that are (per head): how much of the key gradient reaches the keys
      the softmax did not pick.

    The gradients are ``impl_numpy.scaled_dot_product_attention_vjp``'s (checked against the
    float64 oracle by the conformance fixtures); the weights ``impl_numpy.attention_weights``.
    """
    from impl_numpy import attention_weights, scaled_dot_product_attention_vjp

    out: dict[str, Any] = {"D": np.array(dims), "H": H, "L": L, "S": S, "E": E}
    cols: dict[str, list[float]] = {}
    for D in dims:
        rng = np.random.default_rng([SEED, D])
        q = rng.standard_normal((1, H, L, D))  # (B, H, L, D)
        k = rng.standard_normal((1, H, S, D))  # (B, K, S, D)
        v = rng.standard_normal((1, H, S, E))  # (B, K, S, E)
        do = rng.standard_normal((1, H, L, E))  # (B, H, L, E)
        dq_rows = {}
        for run, scale in (("plain", 1.0), ("scaled", 1.0 / math.sqrt(D))):
            w = attention_weights(q, k, scale=scale)  # (1, H, L, S)
            grads = scaled_dot_product_attention_vjp(q, k, v, do, scale=scale)
            o = w @ v  # (1, H, L, E)
            ds = w * (do @ np.swapaxes(v, -1, -2) - (do * o).sum(axis=-1, keepdims=True))
            dq_rows[run] = np.linalg.norm(grads.query, axis=-1)  # (1, H, L)
            picked = np.zeros((1, H, S), bool)  # key j of head h is some row's argmax
            np.put_along_axis(picked, w.argmax(axis=-1), True, axis=-1)
            dk = np.linalg.norm(grads.key, axis=-1)  # (1, H, S)
            scores = (q @ np.swapaxes(k, -1, -2)) * scale
            for name, value in (
                ("var", scores.var()),
                ("saturated", (w.max(axis=-1) > SATURATED).mean()),
                ("ds_median", np.median(np.linalg.norm(ds, axis=-1))),
                ("dq_median", np.median(dq_rows[run])),
                ("dq_rms", np.sqrt((grads.query**2).mean())),
                ("dk_nonmax", np.median(dk[~picked]) / np.median(dk[picked])),
            ):
                cols.setdefault(f"{name}_{run}", []).append(float(value))
        for run in ("plain", "scaled"):
            vanished = (dq_rows[run] < VANISHED * np.median(dq_rows["scaled"])).mean()
            cols.setdefault(f"vanished_{run}", []).append(float(vanished))
    out.update({name: np.array(col) for name, col in cols.items()})
    return out


def missing_scale_markdown(data: dict[str, Any] | None = None) -> str:
    """:func:`missing_scale_table` as the Markdown table of docs/SEMANTICS.md (``python -m
    docs.site.figures --scale-table`` prints it): each cell ``with 1/sqrt(D) / without``."""
    data = missing_scale_table() if data is None else data

    def pct(x: float) -> str:
        return f"{100 * x:.1f}%"

    columns = (
        ("Var(s)", "var", "{:.3g}".format),
        (f"rows max w > {SATURATED}", "saturated", pct),
        ("median row abs(dS_i)", "ds_median", "{:.3g}".format),
        (f"rows abs(dQ_i) < {VANISHED:g} x scaled median", "vanished", pct),
        ("median row abs(dQ_i)", "dq_median", "{:.3g}".format),
        ("RMS of dQ", "dq_rms", "{:.3g}".format),
        ("non-argmax / argmax keys' abs(dK_j)", "dk_nonmax", "{:.2f}".format),
    )
    head = "| D | " + " | ".join(title for title, _, _ in columns) + " |"
    lines = [head, "|" + "---|" * (len(columns) + 1)]
    for n, D in enumerate(data["D"]):
        cells = [f"{fmt(data[f'{key}_scaled'][n])} / {fmt(data[f'{key}_plain'][n])}"
                 for _, key, fmt in columns]
        lines.append(f"| {D} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def missing_scale_plot(data: dict[str, Any]):
    import matplotlib.pyplot as plt

    D = data["D"]
    red, blue = "#c44e52", "#4c72b0"
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.4, 3.2))
    a.loglog(D, data["var_plain"], "o-", color=red, label="q·k  (no scale)")
    a.loglog(D, data["var_scaled"], "o-", color=blue, label="q·k / √D")
    a.loglog(D, D, ":", color="grey", label="D")
    a.set_ylabel("variance of the scores")
    for name, colour, label in (
        ("grad_plain", red, "scale 1"),
        ("grad_scaled", blue, "scale 1/√D"),
    ):
        b.loglog(D, data[name], "o-", color=colour, label=f"{label}: median row")
        b.fill_between(D, data[f"{name}_lo"], data[f"{name}_hi"], color=colour, alpha=0.2)
    b.set_ylabel("|dL/dq_i| of a query row\n(median; band: 10th-90th percentile)")
    for ax in (a, b):
        ax.set_xlabel("head dim D")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(
        f"The missing 1/√D (L = S = {data['L']}, E = {data['E']}): the scores' variance grows "
        "as D, the softmax saturates, most rows' gradients vanish",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# the memory wall


def _measure(framework: str, fn: Callable, q, k, v, **keywords) -> int:
    """Peak extra bytes of one call, measured as bench/ measures it (bench/frameworks.py)."""
    from bench.frameworks import peak_memory_numpy, peak_memory_torch_cpu, xla_memory

    if framework == "numpy":
        return peak_memory_numpy(lambda: fn(q, k, v, **keywords))[0]
    if framework == "torch":
        import torch

        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))

        def call():
            with torch.inference_mode():
                return fn(tq, tk, tv, **keywords)

        return peak_memory_torch_cpu(call)[0]
    import jax

    compiled = jax.jit(lambda a, b, c: fn(a, b, c, **keywords)).lower(q, k, v).compile()
    return xla_memory(compiled)[0]  # from the compiled program: nothing is run


def memory_wall_data(
    lengths: tuple[int, ...] = (256, 512, 1024, 2048),
    H: int = 2,
    D: int = 32,
    blocks: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Peak extra memory (bytes) of ``scaled_dot_product_attention`` and ``flash_attention``
    against L = S, float32, B = 1, in the three frameworks, and the (H, L, S) scores' bytes.

    NumPy: tracemalloc; torch: the profiler's CPU allocations; JAX: XLA's memory analysis of the
    compiled program. ``blocks``: ``block_q``/``block_k`` for flash (default: each one's own).
    """
    import impl_jax
    import impl_numpy
    import impl_torch

    modules = {"numpy": impl_numpy, "torch": impl_torch, "jax": impl_jax}
    out: dict[str, Any] = {"L": np.array(lengths), "H": H, "D": D, "itemsize": 4}
    for fw, module in modules.items():
        plain, tiled = [], []
        for L in lengths:
            rng = np.random.default_rng(SEED)
            q = rng.standard_normal((1, H, L, D), dtype=np.float32)  # (B, H, L, D)
            k = rng.standard_normal((1, H, L, D), dtype=np.float32)  # (B, K, S, D), K = H
            v = rng.standard_normal((1, H, L, D), dtype=np.float32)  # (B, K, S, E)
            plain.append(_measure(fw, module.scaled_dot_product_attention, q, k, v))
            tiled.append(_measure(fw, module.flash_attention, q, k, v, **(blocks or {})))
        out[fw] = {"plain": np.array(plain), "tiled": np.array(tiled)}
    out["scores"] = np.array([H * L * L * 4 for L in lengths])  # (H, L, S) float32 bytes
    return out


def memory_wall_plot(data: dict[str, Any]):
    import matplotlib.pyplot as plt

    MiB = 2**20
    L = data["L"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.loglog(L, data["scores"] / MiB, ":", color="black", lw=2, label="the (H, L, S) scores")
    for fw, marker, size in (("jax", "s", 8), ("torch", "^", 6), ("numpy", "o", 5)):
        c = COLOURS[fw]
        ax.loglog(L, data[fw]["plain"] / MiB, "-", marker=marker, ms=size, color=c,
                  label=f"{NAMES[fw]} plain")
        ax.loglog(L, data[fw]["tiled"] / MiB, "--", marker=marker, ms=size, color=c,
                  mfc="white", label=f"{NAMES[fw]} tiled")
    ax.set_xlabel("sequence length L = S")
    ax.set_ylabel("peak extra memory (MiB)")
    ax.set_xticks(L, [str(x) for x in L])
    ax.set_xticks([], minor=True)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(
        f"The memory wall: plain attention holds the scores, tiled does not "
        f"(H = {data['H']}, D = {data['D']}, float32)",
        fontsize=9,
    )
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# the table


@dataclass(frozen=True)
class Figure:
    name: str  # docs/figures/<name>.png
    title: str
    caption: str  # `code` spans allowed
    data: Callable[[], dict[str, Any]]
    plot: Callable[[dict[str, Any]], Any]


FIGURES: tuple[Figure, ...] = (
    Figure(
        "weights_causal",
        "Causal attention weights, top_left and bottom_right (L = 5 < S = 8)",
        "`top_left` lines query 0 up with key 0; `bottom_right` lines the last query up with the "
        "last key, as a KV cache needs (the new tokens see every cached one). Zeros are masked.",
        lambda: heatmap_data("weights_causal"),
        heatmap_plot,
    ),
    Figure(
        "weights_masks",
        "Bidirectional, padding-masked and causal-and-padded weights (L = S = 6)",
        "A padding mask (`padding_mask(lengths, S)`) removes the padded keys from every row; "
        "each row still sums to 1 over the keys it may see.",
        lambda: heatmap_data("weights_masks"),
        heatmap_plot,
    ),
    Figure(
        "weights_v2",
        "Contract v2: a sliding window, packed segments, a sink and ALiBi (L = 6 < S = 8)",
        "`window=(2, 0)` sees the diagonal and the two keys before it; segment ids keep each "
        "packed document to itself; a sink takes a share of each row's weight and brings no "
        "value, so rows sum to less than 1; ALiBi lowers far keys' weights by distance to the "
        "diagonal. All bottom_right: row i's diagonal is key i + 2.",
        lambda: heatmap_data("weights_v2"),
        heatmap_plot,
    ),
    Figure(
        "weights_gqa_heads",
        "All heads of a GQA layer (H = 6, K = 2), grouped by key/value head",
        "Causal self-attention of a seeded `GroupedQueryAttention(24, 6, 2)`: the three query "
        "heads of a row share one key/value head (its keys and values are stored once), yet "
        "each has its own queries and so its own weights.",
        gqa_heads_data,
        gqa_heads_plot,
    ),
    Figure(
        "softmax_temperature",
        "The softmax temperature: entropy and largest weight against the scale",
        "At scale 0 every row is uniform (entropy log S, largest weight 1/S); as the scale grows "
        "the rows approach one-hot. The default 1/√D sits in between.",
        temperature_data,
        temperature_plot,
    ),
    Figure(
        "missing_scale",
        "The missing scale: score variance and query-gradient norm against D",
        "Without 1/√D the scores' variance grows as D and the softmax saturates: most rows' "
        "query gradients vanish while the few near-ties blow up; with it both stay flat. "
        f"Gradients: {GRADIENT_SOURCE}.",
        missing_scale_data,
        missing_scale_plot,
    ),
    Figure(
        "memory_wall",
        "The memory wall: peak extra memory of plain and tiled attention against L",
        "Measured here (CPU; NumPy by tracemalloc, torch by its profiler, JAX by XLA's memory "
        "analysis): the plain path holds the (H, L, S) scores and grows as L²; "
        "`flash_attention` holds one block.",
        memory_wall_data,
        memory_wall_plot,
    ),
)


def make(figure: Figure, out: Path) -> Path:
    """Compute the figure's data, draw it, write ``out/<name>.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = figure.plot(figure.data())
    path = out / f"{figure.name}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.site.figures", description=__doc__)
    parser.add_argument("--out", type=Path, default=FIGURES_DIR)
    parser.add_argument("names", nargs="*", help="only these figures (default: all)")
    parser.add_argument(
        "--scale-table",
        action="store_true",
        help="print the missing-scale table of docs/SEMANTICS.md and exit",
    )
    args = parser.parse_args(argv)
    if args.scale_table:
        print(missing_scale_markdown())
        return 0
    unknown = set(args.names) - {f.name for f in FIGURES}
    if unknown:
        parser.error(f"no figure {sorted(unknown)}; the figures are {[f.name for f in FIGURES]}")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    made = 0
    for f in FIGURES:
        if args.names and f.name not in args.names:
            continue
        t1 = time.perf_counter()
        path = make(f, args.out)
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        kib = path.stat().st_size / 1024
        print(f"{where}: {kib:.0f} KiB, {time.perf_counter() - t1:.1f} s", flush=True)
        made += 1
    print(f"{made} figures in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
