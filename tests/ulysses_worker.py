"""Run ``ulysses_attention`` of JAX or torch on several devices and save what it returned.

``python -m tests.ulysses_worker jax OUT``: 8 simulated CPU devices (started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``, tests/test_ulysses.py does this), every
call of tests/ulysses_calls.py jitted, and the gradients of one GQA causal call against the
unsharded ones. ``python -m tests.ulysses_worker torch OUT``: forks 2, then 4, gloo processes;
every rank runs every call that fits its world, and the gradients of :data:`TORCH_GRAD_CALLS`
against the unsharded ones. Outputs go to ``OUT/<which>[_<world>_<rank>].npz``;
nothing is judged here.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import numpy as np

from tests.ulysses_calls import (
    HEAD_PAIRS,
    SHARD_COUNTS,
    USP_CALLS,
    USP_CONFIGS,
    encoding_call,
    fits,
    random_calls,
    usp_fits,
)

#: The torch worlds (2 and 4 processes: enough to split, replicate and tear groups).
TORCH_WORLDS = (2, 4)


def _calls(shard_counts):
    """(name, arrays, keywords, n) of every call for these shard counts."""
    for H, K in HEAD_PAIRS:
        for n in shard_counts:
            if fits(H, K, n):
                arrays, kw = encoding_call(H, K)
                yield f"encoding.{H}_{K}.n{n}", arrays, kw, n
    for name, (arrays, kw, shards) in random_calls().items():
        for n in shards:
            if n in shard_counts:
                yield f"random.{name}.n{n}", arrays, kw, n


def _usp_calls(worlds):
    """(name, arrays, keywords, u, r, layout) of every USP call on u * r in ``worlds``."""
    for name in USP_CALLS:
        arrays, kw, _ = random_calls()[name]
        for u, r, layout in USP_CONFIGS:
            if u * r in worlds and usp_fits(arrays[0].shape[-3], arrays[1].shape[-3], u):
                yield f"usp.{name}.u{u}_r{r}_{layout}", arrays, kw, u, r, layout


def jax_main(out: Path) -> None:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import impl_jax
    from impl_jax.ulysses import (
        ULYSSES_STATIC_ARGNAMES,
        USP_STATIC_ARGNAMES,
        ulysses_attention,
        usp_attention,
    )

    results = {}
    fn = jax.jit(ulysses_attention, static_argnames=ULYSSES_STATIC_ARGNAMES)
    for name, arrays, kw, n in _calls(SHARD_COUNTS):
        static = {k: v for k, v in kw.items() if k in ULYSSES_STATIC_ARGNAMES}
        given = {k: jnp.asarray(v) for k, v in kw.items() if k not in ULYSSES_STATIC_ARGNAMES}
        results[name] = np.asarray(fn(*map(jnp.asarray, arrays), n_shards=n, **static, **given))
    usp = jax.jit(usp_attention, static_argnames=USP_STATIC_ARGNAMES)
    for name, arrays, kw, u, r, layout in _usp_calls((4, 8)):
        static = {k: v for k, v in kw.items() if k in USP_STATIC_ARGNAMES}
        given = {k: jnp.asarray(v) for k, v in kw.items() if k not in USP_STATIC_ARGNAMES}
        got = usp(*map(jnp.asarray, arrays), ulysses_shards=u, ring_shards=r, layout=layout,
                  **static, **given)
        results[name] = np.asarray(got)

    # gradients: GQA 8/2, causal, sinks and ALiBi, at n = 2 (key/value heads split) and n = 8
    # (each replicated to 4 devices), against the unsharded gradients.
    (q, k, v), kw, _ = random_calls()["sinks_alibi"]
    kw = {name: (jnp.asarray(a) if isinstance(a, np.ndarray) else a) for name, a in kw.items()}
    cot = jnp.asarray(np.random.default_rng(1).standard_normal((2, 8, 16, 3)))
    wrt = (0, 1, 2)

    def loss(f, **extra):
        return lambda q, k, v: jnp.sum(f(q, k, v, **kw, **extra) * cot)

    ref = jax.grad(loss(impl_jax.scaled_dot_product_attention), argnums=wrt)(q, k, v)
    for name, r in zip("qkv", ref, strict=True):
        results[f"grad.ref.{name}"] = np.asarray(r)
    for n in (2, 8):
        got = jax.grad(loss(ulysses_attention, n_shards=n), argnums=wrt)(q, k, v)
        for name, g in zip("qkv", got, strict=True):
            results[f"grad.n{n}.{name}"] = np.asarray(g)
    usp_loss = loss(usp_attention, ulysses_shards=4, ring_shards=2, layout="contiguous")
    for name, g in zip("qkv", jax.grad(usp_loss, argnums=wrt)(q, k, v), strict=True):
        results[f"grad.usp.{name}"] = np.asarray(g)  # u = 4: the kv heads replicated
    np.savez(out / "jax.npz", **results)


def _torch_rank(rank: int, world: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    from impl_torch.ulysses import ulysses_attention, usp_attention

    dist.init_process_group(
        "gloo", init_method=f"file://{out / f'rendezvous_{world}'}", rank=rank,
        world_size=world, timeout=timedelta(seconds=120),
    )
    results = {}
    for name, arrays, kw, n in _calls((world,)):
        given = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v)
                 for k, v in kw.items()}
        stats = []
        got = ulysses_attention(*map(torch.from_numpy, arrays), n_shards=n, stats=stats, **given)
        results[name] = got.numpy()
        results[f"{name}.bytes"] = np.array([s.bytes_sent for s in stats])
    for name, arrays, kw, u, r, layout in _usp_calls((world,)):
        given = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v)
                 for k, v in kw.items()}
        stats = []
        got = usp_attention(*map(torch.from_numpy, arrays), ulysses_shards=u, ring_shards=r,
                            layout=layout, stats=stats, **given)
        results[name] = got.numpy()
        results[f"{name}.bytes"] = np.array([s.bytes_sent for s in stats])
    results |= _torch_gradients(world)
    np.savez(out / f"torch_{world}_{rank}.npz", **results)
    dist.destroy_process_group()


#: The torch gradient calls: GQA 8/2 (key/value heads split at n = 2, each replicated to 2
#: ranks at n = 4), causal with sinks and ALiBi; a bias with a head axis and one of size 1
#: (every rank uses it whole) under softcap.
TORCH_GRAD_CALLS = ("sinks_alibi", "bias_with_heads_softcap", "bias_without_heads_softcap")


def _torch_gradients(world: int) -> dict[str, np.ndarray]:
    """``grad.<call>.<input>`` of ``sum(ulysses_attention(...) * cot)`` on this rank and
    ``grad.<call>.<input>.ref`` of the unsharded impl_torch call, by autograd, float64, for
    query, key, value and every float keyword."""
    import torch

    import impl_torch
    from impl_torch.ulysses import ulysses_attention

    results = {}
    for name in TORCH_GRAD_CALLS:
        (q, k, v), kw, _ = random_calls()[name.replace("without", "with")]
        if name == "bias_without_heads_softcap":
            kw = kw | {"bias": kw["bias"][:1]}  # (1, L, S)
        cot = torch.from_numpy(np.random.default_rng(1).standard_normal((*q.shape[:-1], 3)))
        for which, f in (
            ("", ulysses_attention),
            (".ref", impl_torch.scaled_dot_product_attention),
        ):
            leaves = {x: torch.tensor(a, requires_grad=True) for x, a in zip("qkv", (q, k, v))}
            given = {x: torch.tensor(a, requires_grad=a.dtype.kind == "f")
                     if isinstance(a, np.ndarray) else a for x, a in kw.items()}
            extra = {"n_shards": world} if f is ulysses_attention else {}
            (f(leaves["q"], leaves["k"], leaves["v"], **given, **extra) * cot).sum().backward()
            for x, t in (leaves | given).items():
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    results[f"grad.{name}.{x}{which}"] = t.grad.numpy()
    return results


def torch_main(out: Path) -> None:
    import torch.multiprocessing as mp

    for world in TORCH_WORLDS:
        mp.start_processes(_torch_rank, args=(world, out), nprocs=world, start_method="fork")


def main(argv: list[str]) -> int:
    which, out = argv[1], Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    (jax_main if which == "jax" else torch_main)(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
