"""Train the tiny induction model in PyTorch and write its weights next to this file.

    python -m notebooks.tiny_model.train            # writes layer0/layer1/embedding.safetensors
    python -m notebooks.tiny_model.train --out DIR  # elsewhere (the reproducibility test)

Seeded and single-threaded with deterministic algorithms: on one machine and one torch build a
rerun gives the same bytes. Across machines or torch versions the float32 reductions of the
matmuls may round differently, the differences grow over the steps, and the weights come out
different while the accuracy does not: which is why the test retrains and compares accuracy.
About 20-40 s on one CPU core.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file
from torch import nn

from impl_torch.modules import GroupedQueryAttention
from notebooks.tiny_model import CONFIG, HERE, SEED, accuracy, make_batch, scored

STEPS = 1500
BATCH = 64
LR = 3e-3
EVAL_SEED = 1  # the held-out batch's generator (training draws from SEED)


class TinyModel(nn.Module):
    """Embedding, two causal GQA layers with RoPE on a residual stream, unembedding."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        V, M = CONFIG["vocab"], CONFIG["d_model"]
        H, K, theta = CONFIG["n_heads"], CONFIG["n_kv_heads"], CONFIG["rope_theta"]
        self.embed = nn.Parameter(torch.randn(V, M, generator=generator) / M**0.5)  # (V, M)
        self.layers = nn.ModuleList(
            GroupedQueryAttention(M, H, K, rope_theta=theta, generator=generator) for _ in range(2)
        )
        self.unembed = nn.Parameter(torch.randn(M, V, generator=generator) / M**0.5)  # (M, V)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens (B, N)`` -> logits ``(B, N, V)``."""
        h = self.embed[tokens]  # (B, N, M)
        for layer in self.layers:
            h = h + layer(h, is_causal=True)
        return h @ self.unembed


def train(steps: int = STEPS) -> tuple[TinyModel, float]:
    """Train from :data:`SEED`; returns the model and its accuracy on a held-out batch."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    model = TinyModel(torch.Generator().manual_seed(SEED))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for _ in range(steps):
        tokens, half = make_batch(rng, BATCH)
        where = torch.from_numpy(scored(half)[:, :-1])  # (B, N-1): position t predicts t+1
        tokens = torch.from_numpy(tokens)
        logits = model(tokens)[:, :-1][where]  # (scored, V)
        loss = nn.functional.cross_entropy(logits, tokens[:, 1:][where])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, evaluate(model)


def evaluate(model: TinyModel) -> float:
    """Accuracy on the held-out batch (512 sequences from :data:`EVAL_SEED`)."""
    tokens, half = make_batch(np.random.default_rng(EVAL_SEED), 512)
    with torch.no_grad():
        return accuracy(model(torch.from_numpy(tokens)).numpy(), tokens, half)


def save(model: TinyModel, acc: float, out: Path) -> None:
    """The layers with the modules' own ``save``; embeddings and the record in a third file."""
    out.mkdir(parents=True, exist_ok=True)
    for i, layer in enumerate(model.layers):
        layer.save(out / f"layer{i}.safetensors")
    record = dict(CONFIG, seed=SEED, steps=STEPS, batch=BATCH, lr=LR, accuracy=round(acc, 4))
    tensors = {
        "embed": model.embed.detach().numpy().copy(),
        "unembed": model.unembed.detach().numpy().copy(),
    }
    save_file(tensors, str(out / "embedding.safetensors"), metadata={"record": json.dumps(record)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    start = time.perf_counter()
    model, acc = train(args.steps)
    save(model, acc, args.out)
    print(f"accuracy {acc:.4f} after {args.steps} steps, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
