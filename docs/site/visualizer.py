"""The page's attention visualizer: the tiny trained model's heads, redrawn in the browser.

At build time the committed model (``notebooks/tiny_model``) runs in impl_numpy on a few
prompts, and each layer's queries and keys *after RoPE* (``q (H, N, D)``, ``k (K, N, D)``,
float32) are written into the page as JSON. ``visualizer.js`` then does, in float64, what
``impl_numpy.attention_weights`` does with ``scale = 1/sqrt(D) / tau`` (the temperature divides
the scores before the softmax): scores, the causal rule, a padding mask on the last keys, a
window ``(w, w)``, a stable softmax with a row of no allowed key left at zeros, and each row's
entropy. Nothing is fetched at view time.

:func:`reference` is the same thing in NumPy (``attention_weights`` on the exported values cast
to float64); the browser test checks that the drawn numbers equal it, and the unit tests that at
``tau = 1`` it equals the model's own weights.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass

import numpy as np

#: The temperature slider: integer positions, tau = 2 ** (position / STEPS_PER_OCTAVE).
SLIDER = (-12, 12)
STEPS_PER_OCTAVE = 4

#: The prompts: (seed of notebooks.tiny_model.make_batch, induction?). The last one is random
#: tokens with no repeat, where the induction head has nothing to find.
PROMPTS = ((11, True), (1, True), (4, True), (0, False))


def tau_of(position: int) -> float:
    """The temperature at a slider position (the page computes the same expression)."""
    return 2.0 ** (position / STEPS_PER_OCTAVE)


@dataclass(frozen=True)
class Prompt:
    """One prompt's tokens ``(N,)``, its copy length ``half`` (0: no repeat) and per layer the
    heads' queries ``(H, N, D)`` and keys ``(K, N, D)`` after RoPE, float32."""

    label: str
    tokens: np.ndarray
    half: int
    q: tuple[np.ndarray, ...]
    k: tuple[np.ndarray, ...]


def _tokens(seed: int, induction: bool) -> tuple[np.ndarray, int]:
    from notebooks.tiny_model import CONFIG, make_batch

    rng = np.random.default_rng(seed)
    if induction:
        tokens, half = make_batch(rng, 1)
        return tokens[0], int(half[0])
    return rng.permutation(CONFIG["vocab"])[: CONFIG["length"]].astype(np.int64), 0


def heads(tokens: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Run the committed model (impl_numpy) on ``tokens (N,)``: per layer ``q (H, N, D)`` and
    ``k (K, N, D)`` after RoPE, and the layer's own attention weights ``(H, N, N)``."""
    from impl_numpy.modules import GroupedQueryAttention
    from notebooks.tiny_model import LAYER_FILES, load_embedding

    embed, _, _ = load_embedding()
    h = embed[np.asarray(tokens)[None, :]]  # (1, N, M)
    qs, ks, ws = [], [], []
    for path in LAYER_FILES:
        module = GroupedQueryAttention.load(path)
        q = module._project_query(h)  # (1, H, N, D)
        k, _ = module._project_key_value(h)  # (1, K, N, D)
        q, k = module._rotate(q, k, 0, 0)  # self-attention: query i and key j at i and j
        y, w = module(h, is_causal=True, return_weights=True)
        qs.append(q[0])
        ks.append(k[0])
        ws.append(np.asarray(w)[0])
        h = h + y
    return qs, ks, ws


def prompts() -> list[Prompt]:
    """The page's prompts, run through the model."""
    out = []
    for seed, induction in PROMPTS:
        tokens, half = _tokens(seed, induction)
        label = f"induction, T = {half} (seed {seed})" if half else "random tokens, no repeat"
        q, k, _ = heads(tokens)
        out.append(Prompt(label, tokens, half, tuple(q), tuple(k)))
    return out


def settings_mask(n: int, *, causal: bool, padding: int, window: int | None) -> dict[str, object]:
    """The functional API's keywords for the page's toggles on an ``(n, n)`` self-attention:
    ``is_causal``, ``mask`` (the last ``padding`` keys are padding) and ``window=(w, w)``."""
    keywords: dict[str, object] = {"is_causal": causal}
    if padding:
        keywords["mask"] = np.arange(n)[None, None, None, :] < n - padding  # (1, 1, 1, S)
    if window is not None:
        keywords["window"] = (window, window)
    return keywords


def reference(
    prompt: Prompt,
    layer: int,
    head: int,
    tau: float,
    *,
    causal: bool = True,
    padding: int = 0,
    window: int | None = None,
) -> np.ndarray:
    """``(N, N)`` float64: impl_numpy's ``attention_weights`` of one head at temperature
    ``tau`` (scale ``1/sqrt(D) / tau``) on the exported float32 queries and keys."""
    from impl_numpy import attention_weights

    q = prompt.q[layer].astype(np.float64)[None]  # (1, H, N, D)
    k = prompt.k[layer].astype(np.float64)[None]  # (1, K, N, D)
    n, d = q.shape[2], q.shape[3]
    w = attention_weights(
        q,
        k,
        scale=(1.0 / math.sqrt(d)) / tau,
        **settings_mask(n, causal=causal, padding=padding, window=window),
    )
    return np.asarray(w)[0, head]


def entropy(weights: np.ndarray) -> np.ndarray:
    """Per row of ``weights (N, S)``, ``-sum w log w`` in nats (0 for a row of zeros)."""
    w = np.asarray(weights, np.float64)
    logs = np.log(np.where(w > 0, w, 1.0))
    return -(w * logs).sum(-1)


def _float32_text(x: np.ndarray) -> list:
    """Nested lists of the shortest decimals that read back (double, then float32: the page's
    ``Math.fround(Number(s))``) as exactly ``x``; raises if one would not."""
    flat = np.asarray(x, np.float32).ravel()
    texts = [np.format_float_positional(v, unique=True, trim="-") for v in flat]
    back = np.array([np.float32(float(t)) for t in texts], np.float32)
    if not np.array_equal(back, flat):
        raise ValueError("a float32 value does not survive its decimal text")
    numbers = [float(t) for t in texts]
    return np.array(numbers, dtype=object).reshape(np.shape(x)).tolist()


def export(found: list[Prompt]) -> dict:
    """The JSON the page reads: sizes, the default scale, the slider and every prompt."""
    first = found[0]
    H, _, D = first.q[0].shape
    K = first.k[0].shape[0]
    return {
        "heads": int(H),
        "kvHeads": int(K),
        "layers": len(first.q),
        "headDim": int(D),
        "scale": 1.0 / math.sqrt(D),
        "slider": {"min": SLIDER[0], "max": SLIDER[1], "stepsPerOctave": STEPS_PER_OCTAVE},
        "prompts": [
            {
                "label": p.label,
                "tokens": [int(t) for t in p.tokens],
                "half": p.half,
                "q": [_float32_text(q) for q in p.q],
                "k": [_float32_text(k) for k in p.k],
            }
            for p in found
        ],
    }


def section_html(data: dict, induction_head: tuple[int, int] | None = None) -> str:
    """The page's Visualizer section: the controls, an empty heatmap ``visualizer.js`` fills,
    and the data. ``induction_head``: (layer, head) selected first."""
    layer0, head0 = induction_head or (data["layers"] - 1, 0)
    heads = "\n".join(
        f'<option value="{layer}:{head}"{" selected" if (layer, head) == (layer0, head0) else ""}>'
        f"layer {layer + 1}, head {head}</option>"
        for layer in range(data["layers"])
        for head in range(data["heads"])
    )
    prompts_html = "\n".join(
        f'<option value="{i}">{html.escape(p["label"])}</option>'
        for i, p in enumerate(data["prompts"])
    )
    n = len(data["prompts"][0]["tokens"])
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    lo, hi = data["slider"]["min"], data["slider"]["max"]
    return f"""<section id="visualizer" class="visualizer">
<h2>Attention visualizer <small>the tiny trained model, notebooks/tiny_model</small></h2>
<p>The two-layer attention-only model of <code>notebooks/tiny_model</code>, trained on induction
(a run of tokens, then the same run again): in the second copy, layer 2's induction head looks
at the token <em>after</em> the previous occurrence of the current one (the outlined cells);
layer 1 has a previous-token head. Pick a head, drag the temperature (the scores are divided
by &tau; before the softmax) and watch the rows sharpen or melt. The queries and keys were
exported by <code>make docs</code>; the softmax runs here, in the page, and equals
<code>impl_numpy.attention_weights(q, k, scale=1/sqrt(D)/&tau;, ...)</code>.</p>
<form class="viz-controls" onsubmit="return false">
<label>prompt <select id="viz-prompt">{prompts_html}</select></label>
<label>head <select id="viz-head">{heads}</select></label>
<label>&tau; <input id="viz-tau" type="range" min="{lo}" max="{hi}" step="1" value="0">
<output id="viz-tau-value" data-tau="1">1.000</output></label>
<label><input id="viz-causal" type="checkbox" checked> causal</label>
<label>padding: last <input id="viz-padding" type="number" min="0" max="{n}" value="0"> keys
</label>
<label>window &plusmn;<input id="viz-window" type="number" min="0" max="{n}" value=""
placeholder="off"></label>
</form>
<p id="viz-summary" class="viz-summary"></p>
<div class="viz-wrap"><table id="viz-heatmap" class="heatmap"></table></div>
<script type="application/json" id="viz-data">{payload}</script>
<script src="visualizer.js"></script>
</section>"""
