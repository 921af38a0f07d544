"""The visualizer's data and its NumPy reference (the browser half is in test_site_browser.py).

The page runs the tiny model on the prompt and draws, for a head and a temperature tau,
impl_numpy's attention_weights of its queries and keys with scale 1/sqrt(D)/tau; here: that
reference (the modules in float64) is the float32 model's own attention at tau = 1, the
exported decimals are the committed float32 weights, the weights sharpen as tau falls, and the
page carries exactly the exported data.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from safetensors import safe_open

from conformance.oracle import assert_within
from docs.site import visualizer
from docs.site.page import build
from notebooks.tiny_model import EMBEDDING_FILE, LAYER_FILES
from tests.frameworks import assert_agree


@pytest.fixture(scope="module")
def prompts():
    return visualizer.prompts()


def test_the_reference_at_tau_1_is_the_float32_models_own_attention(prompts):
    for tokens in [p.tokens for p in prompts] + [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]:
        _, _, model = visualizer.heads(tokens, "float32")  # (H, N, N) per layer
        for layer, w in enumerate(model):
            assert w.dtype == np.float32
            for head in range(w.shape[0]):
                ref = visualizer.reference(tokens, layer, head, 1.0)
                assert ref.dtype == np.float64
                assert_agree(w[head], ref, "float32", what=f"layer {layer} head {head}: ")


def test_the_prompts_show_what_the_page_says(prompts):
    induction = [p for p in prompts if p.half]
    assert len(induction) == 3 and not prompts[-1].half  # and one random prompt
    for p in induction:
        T = p.half
        assert (p.tokens[:T] == p.tokens[T : 2 * T]).all()
        w = visualizer.reference(p.tokens, 1, 0, 1.0)  # the head the page selects first
        t = np.arange(T, 2 * T - 1)
        target = visualizer.induction_targets(p.tokens)
        assert (target[t] == t - T + 1).all()  # the outlined cells
        assert w[t, target[t]].mean() > 0.8, p.label
    w = visualizer.reference(prompts[0].tokens, 0, 2, 1.0)  # layer 1 head 2: the previous token
    assert np.diagonal(w, -1).mean() > 0.9
    assert visualizer.induction_targets([5, 7, 5, 5, 2, 7]).tolist() == [-1, -1, 1, 3, -1, 2]


def test_a_lower_temperature_sharpens_every_head(prompts):
    tokens = prompts[0].tokens
    for layer in range(2):
        for head in range(4):
            ws = [visualizer.reference(tokens, layer, head, tau) for tau in (0.25, 1.0, 4.0)]
            for w in ws:
                assert_within(w.sum(-1), 1.0, "float64")
            top = [w.max(-1).mean() for w in ws]
            spread = [visualizer.entropy(w).mean() for w in ws]
            assert top[0] > top[1] > top[2] and spread[0] < spread[1] < spread[2], (layer, head)


def test_the_toggles_are_the_functional_apis_keywords(prompts):
    tokens = prompts[0].tokens
    w = visualizer.reference(tokens, 0, 2, 1.0, causal=True, padding=6, window=2)
    assert (w[:, 18:] == 0).all()  # padded keys get nothing
    assert (w.sum(-1)[20:] == 0).all()  # a query whose window holds only padding: zeros
    assert_within(w.sum(-1)[:20], 1.0, "float64")
    assert (np.triu(w, 1) == 0).all() and (np.tril(w, -3) == 0).all()  # causal, window 2
    open_ = visualizer.reference(tokens, 0, 2, 1.0, causal=False)
    assert (np.triu(open_, 1) > 0).any()
    assert visualizer.entropy(np.zeros((1, 4))).tolist() == [0.0]


def test_the_exported_decimals_are_the_committed_float32_weights(prompts):
    data = visualizer.export(prompts)
    assert (data["heads"], data["kvHeads"], data["layers"], data["headDim"]) == (4, 2, 2, 8)

    def read(x):  # what the page does: Number(text), then Math.fround
        return np.array(x, np.float64).astype(np.float32)

    with safe_open(str(EMBEDDING_FILE), framework="numpy") as f:
        assert np.array_equal(read(data["embed"]), f.get_tensor("embed"))
    for path, exported in zip(LAYER_FILES, data["weights"]):
        with safe_open(str(path), framework="numpy") as f:
            assert sorted(exported) == sorted(f.keys())
            for name in f.keys():
                assert np.array_equal(read(exported[name]), f.get_tensor(name)), name
    for p, e in zip(prompts, data["prompts"]):
        assert e == {"label": p.label, "tokens": p.tokens.tolist(), "half": p.half}


def test_the_page_carries_the_data_and_the_script(tmp_path, prompts):
    built = build(tmp_path / "site")
    page = built.index.read_text()
    found = re.search(r'<script type="application/json" id="viz-data">(.*?)</script>', page, re.S)
    assert json.loads(found.group(1)) == json.loads(json.dumps(visualizer.export(prompts)))
    assert '<script src="visualizer.js"></script>' in page
    assert (built.index.parent / "visualizer.js").read_text().startswith("// The attention")
    assert 'href="#visualizer"' in page and "http" not in found.group(1)  # nothing to fetch
    assert visualizer.tau_of(-8) == 0.25 and visualizer.tau_of(8) == 4.0
