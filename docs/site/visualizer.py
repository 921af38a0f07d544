"""The page's attention visualizer: the tiny trained model's heads, computed in the browser.

At build time the committed model's float32 weights (``notebooks/tiny_model``: the embedding and
the two GQA layers' canonical projections) and a few prompts are written into the page as JSON.
``visualizer.js`` runs the model in float64 on the prompt shown (a preset or tokens the reader
types), as ``impl_numpy``'s modules do (projections, RoPE, causal attention, output projection,
residual), and then, for the picked head, what ``impl_numpy.attention_weights`` does with
``scale = 1/sqrt(D) / tau`` (the temperature divides the scores before the softmax): scores, the
causal rule, a padding mask on the last keys, a window ``(w, w)``, a stable softmax with a row
of no allowed key left at zeros, and each row's entropy. Nothing is fetched at view time.

:func:`reference` is the same thing in NumPy: the project's modules loaded in float64 from the
committed files, then ``attention_weights``. The browser test checks that the drawn numbers
equal it; the unit tests that at ``tau = 1`` it is the float32 model's own attention.
"""

from __future__ import annotations

import functools
import html
import json
import math
from dataclasses import dataclass

import numpy as np
from safetensors import safe_open

#: The temperature slider: integer positions, tau = 2 ** (position / STEPS_PER_OCTAVE).
SLIDER = (-12, 12)
STEPS_PER_OCTAVE = 4
#: The longest prompt a reader may type (the model was trained on 24 tokens).
MAX_TOKENS = 48

#: The prompts: (seed of notebooks.tiny_model.make_batch, induction?). The last one is random
#: tokens with no repeat, where the induction head has nothing to find.
PROMPTS = ((11, True), (1, True), (4, True), (0, False))


def tau_of(position: int) -> float:
    """The temperature at a slider position (the page computes the same expression)."""
    return 2.0 ** (position / STEPS_PER_OCTAVE)


@dataclass(frozen=True)
class Prompt:
    """One preset prompt: its label, tokens ``(N,)`` and copy length ``half`` (0: no repeat)."""

    label: str
    tokens: np.ndarray
    half: int


def _tokens(seed: int, induction: bool) -> tuple[np.ndarray, int]:
    from notebooks.tiny_model import CONFIG, make_batch

    rng = np.random.default_rng(seed)
    if induction:
        tokens, half = make_batch(rng, 1)
        return tokens[0], int(half[0])
    return rng.permutation(CONFIG["vocab"])[: CONFIG["length"]].astype(np.int64), 0


def prompts() -> list[Prompt]:
    """The page's preset prompts."""
    out = []
    for seed, induction in PROMPTS:
        tokens, half = _tokens(seed, induction)
        label = f"induction, T = {half} (seed {seed})" if half else "random tokens, no repeat"
        out.append(Prompt(label, tokens, half))
    return out


@functools.cache
def _model(dtype: str):
    """The committed model in impl_numpy, its weights cast to ``dtype``: ``embed (V, M)`` and
    the two GroupedQueryAttention layers."""
    from impl_numpy.modules import GroupedQueryAttention
    from notebooks.tiny_model import LAYER_FILES, load_embedding

    embed = load_embedding()[0].astype(dtype)
    return embed, [GroupedQueryAttention.load(path, dtype=dtype) for path in LAYER_FILES]


def heads(
    tokens, dtype: str = "float64"
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Run the committed model (impl_numpy, weights cast to ``dtype``) on ``tokens (N,)``: per
    layer ``q (H, N, D)`` and ``k (K, N, D)`` after RoPE and the layer's own attention weights
    ``(H, N, N)`` (causal, scale 1/sqrt(D))."""
    embed, layers = _model(dtype)
    h = embed[np.asarray(tokens, np.int64)[None, :]]  # (1, N, M)
    qs, ks, ws = [], [], []
    for module in layers:
        q = module._project_query(h)  # (1, H, N, D)
        k, _ = module._project_key_value(h)  # (1, K, N, D)
        q, k = module._rotate(q, k, 0, 0)  # self-attention: query i and key j at i and j
        y, w = module(h, is_causal=True, return_weights=True)
        qs.append(q[0])
        ks.append(k[0])
        ws.append(np.asarray(w)[0])
        h = h + y
    return qs, ks, ws


def induction_targets(tokens) -> np.ndarray:
    """``(N,)``: per query i, the key just after the previous occurrence of its token
    (``j + 1`` for the last ``j < i`` with the same token), -1 if it has none: where an
    induction head looks (the page outlines these cells in layer 2)."""
    tokens = np.asarray(tokens)
    out = np.full(len(tokens), -1)
    for i, t in enumerate(tokens):
        before = np.nonzero(tokens[:i] == t)[0]
        if len(before):
            out[i] = before[-1] + 1
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
    tokens,
    layer: int,
    head: int,
    tau: float,
    *,
    causal: bool = True,
    padding: int = 0,
    window: int | None = None,
) -> np.ndarray:
    """``(N, N)`` float64: impl_numpy's ``attention_weights`` of one head at temperature
    ``tau`` (scale ``1/sqrt(D) / tau``) on the float64 model's queries and keys of
    ``tokens``."""
    from impl_numpy import attention_weights

    q, k, _ = heads(tokens)
    q, k = q[layer][None], k[layer][None]  # (1, H, N, D), (1, K, N, D)
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
    """The JSON the page reads: sizes, the default scale, the slider, the float32 weights as
    decimals and the preset prompts."""
    from notebooks.tiny_model import CONFIG, LAYER_FILES, load_embedding

    embed = load_embedding()[0]
    layers = []
    for path in LAYER_FILES:
        with safe_open(str(path), framework="numpy") as f:
            layers.append({name: _float32_text(f.get_tensor(name)) for name in f.keys()})
    H, K, M = CONFIG["n_heads"], CONFIG["n_kv_heads"], CONFIG["d_model"]
    D = M // H
    return {
        "vocab": CONFIG["vocab"],
        "heads": H,
        "kvHeads": K,
        "headDim": D,
        "layers": len(layers),
        "ropeTheta": CONFIG["rope_theta"],
        "scale": 1.0 / math.sqrt(D),
        "slider": {"min": SLIDER[0], "max": SLIDER[1], "stepsPerOctave": STEPS_PER_OCTAVE},
        "maxTokens": MAX_TOKENS,
        "embed": _float32_text(embed),
        "weights": layers,
        "prompts": [
            {"label": p.label, "tokens": [int(t) for t in p.tokens], "half": p.half} for p in found
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
    n = data["maxTokens"]
    first = " ".join(map(str, data["prompts"][0]["tokens"]))
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    lo, hi = data["slider"]["min"], data["slider"]["max"]
    return f"""<section id="visualizer" class="visualizer">
<h2>Attention visualizer <small>the tiny trained model, notebooks/tiny_model</small></h2>
<p>The two-layer attention-only model of <code>notebooks/tiny_model</code>, trained on induction
(a run of tokens, then the same run again): in the second copy, layer 2's induction heads look
at the token <em>after</em> the previous occurrence of the current one (the outlined cells);
layer 1 has a previous-token head (head 2). Pick a prompt or type tokens (0 to
{data["vocab"] - 1}, up to {n}), pick a head, drag the temperature (the scores are divided by
&tau; before the softmax) and watch the rows sharpen or melt. The model's weights were exported
by <code>make docs</code>; the model and the softmax run here, in the page, and the weights
drawn equal <code>impl_numpy.attention_weights(q, k, scale=1/sqrt(D)/&tau;, ...)</code> on the
queries and keys of impl_numpy's modules.</p>
<form class="viz-controls" onsubmit="return false">
<label>prompt <select id="viz-prompt">{prompts_html}</select></label>
<label>tokens <input id="viz-tokens" type="text" size="60" value="{first}"
spellcheck="false"></label>
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
