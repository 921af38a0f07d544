"""The tiny induction model (notebooks/tiny_model): committed weights, three frameworks, a head
that does what the task says, and a retraining that reaches the committed accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from notebooks.tiny_model import (
    CONFIG,
    FORWARDS,
    accuracy,
    induction_weight,
    load_embedding,
    make_batch,
)
from tests.frameworks import assert_agree

HELD_OUT_SEED = 2  # neither training's (0) nor the recorded evaluation's (1)


@pytest.fixture(scope="module")
def runs():
    tokens, half = make_batch(np.random.default_rng(HELD_OUT_SEED), 256)
    return tokens, half, {name: forward(tokens) for name, forward in FORWARDS.items()}


def test_three_frameworks_agree(runs):
    _, _, out = runs
    logits, weights = out["numpy"]
    for name in ("torch", "jax"):
        other_logits, other_weights = out[name]
        # float32 through two layers and an unembedding of logits of size ~10: measured 1e-4
        # (a whole model's drift, not one call: no plain computation to bound it by).
        np.testing.assert_allclose(other_logits, logits, atol=1e-3, rtol=1e-4, err_msg=name)
        for layer, (w, ow) in enumerate(zip(weights, other_weights)):
            assert w.dtype == np.float32, w.dtype
            assert_agree(ow, w, "float32", what=f"{name} layer {layer}")


@pytest.mark.parametrize("framework", sorted(FORWARDS))
def test_reaches_the_recorded_accuracy(runs, framework):
    tokens, half, out = runs
    recorded = load_embedding()[2]["accuracy"]
    assert recorded >= 0.95, recorded  # the model learned the task
    assert accuracy(out[framework][0], tokens, half) >= recorded - 0.01


def test_the_heads_are_where_the_task_says(runs):
    _, half, out = runs
    layer0, layer1 = out["numpy"][1]
    # Layer 2 (index 1): the best head puts most of its weight on the induction target, the
    # token after the previous occurrence of the query's token.
    assert induction_weight(layer1, half).max() > 0.5
    # Layer 1 (index 0): a previous-token head (query t on key t - 1), the half it composes
    # with; on the induction target it puts almost nothing.
    N = CONFIG["length"]
    previous = layer0[:, :, np.arange(1, N), np.arange(N - 1)].mean(axis=(0, 2))  # (H,)
    assert previous.max() > 0.5
    assert induction_weight(layer0, half).max() < 0.1


@pytest.mark.slow
def test_retraining_from_the_seed_reaches_the_committed_accuracy(tmp_path):
    # Accuracy, not bytes: the same seed gives the same bytes on one machine and torch build, but
    # float32 matmul reductions may round differently elsewhere (other CPU kernels, another
    # torch), and 1500 Adam steps carry the difference into every weight.
    from notebooks.tiny_model.train import evaluate, train

    model, acc = train()
    assert acc == evaluate(model)
    assert acc >= load_embedding()[2]["accuracy"] - 0.01
