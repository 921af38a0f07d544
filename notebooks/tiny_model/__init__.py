"""A two-layer attention-only model built from the project's GQA modules, trained on induction.

The task: ``T`` distinct random tokens, then the same ``T`` tokens again, then random filler up
to ``N`` tokens; ``T`` is drawn per sequence (so no head can find the answer at a fixed
distance: it has to match content). From the second copy on, the next token is predictable:
at position ``T + i`` (token ``x[i]``) the answer is ``x[i + 1]``, the token that followed the
previous occurrence of ``x[i]``. A two-layer model solves it with an *induction head*: layer 1
copies each token's predecessor into it (a previous-token head); layer 2's query at ``T + i``
then matches the key at ``i + 1`` (whose predecessor is ``x[i]``) and copies that token out. So
the layer-2 attention of query ``T + i`` belongs on key ``i + 1``: :func:`induction_targets`.

The model (every framework, the same numbers)::

    tokens (B, N)  --embed-->  h (B, N, M)
    h = h + layer0(h, is_causal=True)        GroupedQueryAttention with RoPE
    h = h + layer1(h, is_causal=True)
    logits = h @ unembed                     (B, N, V)

No MLP, no normalization: attention is all there is to look at. The weights are three
safetensors files next to this one: ``layer0.safetensors`` and ``layer1.safetensors`` written
by the modules' own ``save`` (canonical weights, RoPE and heads in the metadata, loadable by
``GroupedQueryAttention.load`` of any of the three implementations) and
``embedding.safetensors`` (``embed (V, M)``, ``unembed (M, V)``, the training's seed and the
accuracy it reached in the metadata). ``train.py`` makes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

HERE = Path(__file__).resolve().parent
LAYER_FILES = (HERE / "layer0.safetensors", HERE / "layer1.safetensors")
EMBEDDING_FILE = HERE / "embedding.safetensors"

#: Sizes: V tokens, N per sequence, T per copy in [T_min, T_max], M model width, H query heads
#: sharing K kv heads.
CONFIG = dict(
    vocab=32, length=24, half_min=5, half_max=12, d_model=32, n_heads=4, n_kv_heads=2,
    rope_theta=10000.0,
)
SEED = 0


def make_batch(rng: np.random.Generator, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """``tokens (batch, N)`` int64 and ``half (batch,)``: per row, T = half distinct random
    tokens, the same T again, then random filler."""
    V, N = CONFIG["vocab"], CONFIG["length"]
    half = rng.integers(CONFIG["half_min"], CONFIG["half_max"] + 1, size=batch)  # (B,)
    tokens = rng.integers(0, V, size=(batch, N))  # (B, N), the filler
    for b, T in enumerate(half):
        first = rng.permutation(V)[:T]  # distinct
        tokens[b, :T] = first
        tokens[b, T : 2 * T] = first
    return tokens.astype(np.int64), half.astype(np.int64)


def scored(half: np.ndarray) -> np.ndarray:
    """``(B, N)`` bool: the query positions whose next token the task determines,
    ``T .. 2T-2`` (the second copy but its last token)."""
    t = np.arange(CONFIG["length"])[None, :]  # (1, N)
    half = np.asarray(half)[:, None]  # (B, 1)
    return (t >= half) & (t <= 2 * half - 2)


def induction_targets(half: np.ndarray) -> np.ndarray:
    """``(B, N)`` int: for query position ``t = T + i``, the key the induction head should
    attend, ``i + 1 = t - T + 1`` (the token after the previous occurrence of the query's
    token); meaningful where :func:`scored` is True."""
    t = np.arange(CONFIG["length"])[None, :]
    return t - np.asarray(half)[:, None] + 1


def accuracy(logits: np.ndarray, tokens: np.ndarray, half: np.ndarray) -> float:
    """Fraction of scored positions whose argmax is the next token."""
    predicted = np.asarray(logits)[:, :-1].argmax(-1)  # (B, N-1), position t predicts t+1
    right = predicted == tokens[:, 1:]
    return float(right[scored(half)[:, :-1]].mean())


def induction_weight(weights: np.ndarray, half: np.ndarray) -> np.ndarray:
    """``(H,)``: per head of a layer's weights ``(B, H, N, N)``, the mean weight a scored query
    puts on its induction target."""
    w = np.asarray(weights)
    target = induction_targets(half)  # (B, N)
    mask = scored(half)  # (B, N)
    b, t = np.nonzero(mask)
    return w[b, :, t, target[b, t]].mean(axis=0)  # (H,)


def load_embedding() -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """``embed (V, M)``, ``unembed (M, V)`` float32 and the training record (metadata)."""
    with safe_open(str(EMBEDDING_FILE), framework="numpy") as f:
        record = json.loads(f.metadata()["record"])
        return f.get_tensor("embed"), f.get_tensor("unembed"), record


def forward_numpy(tokens: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The committed model in impl_numpy: logits ``(B, N, V)``, each layer's weights
    ``(B, H, N, N)``."""
    from impl_numpy.modules import GroupedQueryAttention

    embed, unembed, _ = load_embedding()
    h = embed[tokens]  # (B, N, M)
    weights = []
    for path in LAYER_FILES:
        y, w = GroupedQueryAttention.load(path)(h, is_causal=True, return_weights=True)
        h = h + y
        weights.append(np.asarray(w))
    return h @ unembed, weights


def forward_torch(tokens: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The committed model in impl_torch (as :func:`forward_numpy`)."""
    import torch

    from impl_torch.modules import GroupedQueryAttention

    embed, unembed, _ = load_embedding()
    h = torch.from_numpy(embed)[torch.from_numpy(tokens)]  # (B, N, M)
    weights = []
    with torch.no_grad():
        for path in LAYER_FILES:
            y, w = GroupedQueryAttention.load(path)(h, is_causal=True, return_weights=True)
            h = h + y
            weights.append(w.numpy())
        logits = h @ torch.from_numpy(unembed)
    return logits.numpy(), weights


def forward_jax(tokens: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The committed model in impl_jax (as :func:`forward_numpy`)."""
    import jax.numpy as jnp

    from impl_jax.modules import GroupedQueryAttention

    embed, unembed, _ = load_embedding()
    h = jnp.asarray(embed)[jnp.asarray(tokens)]  # (B, N, M)
    weights = []
    for path in LAYER_FILES:
        y, w = GroupedQueryAttention.load(path)(h, is_causal=True, return_weights=True)
        h = h + y
        weights.append(np.asarray(w))
    return np.asarray(h @ jnp.asarray(unembed)), weights


FORWARDS = {"numpy": forward_numpy, "torch": forward_torch, "jax": forward_jax}
