"""The runs of the sharded tests: the conformance runner's own runs, chosen per framework.

A run is one fixture (a ``ring.*``, ``sdpa`` or ``module`` fixture) through one sharded alias
of the conformance runner with n shards (:class:`conformance.runner.Run`; ids such as
``ring_zigzag.n4.causal.top_left.l64_s64.float32``), judged by the runner's own ``check``:
the golden's shape, the input dtype, the fixture's bound. The lists are shared by
``tests/test_sharded.py`` and ``tests/sharded_worker.py`` (which runs JAX on simulated devices
and torch in gloo processes, in subprocesses). This module imports neither JAX nor torch.

- NumPy runs every sharded run in ``conformance/tests/test_conformance.py`` (the runner's
  default shard counts, 2 and 4) and here with 1, 3 and 8 shards.
- torch runs every sharded run for 2 and 4 processes: each of the processes of one gloo group
  runs the runner's checks (as under ``torchrun``), once per group size.
- JAX compiles a program per run (about a second each on this machine), so it runs a chosen
  list, :data:`JAX_RUNS`, that covers 2, 3, 4 and 8 devices, both layouts, both alignments,
  L != S, GQA, masks, bias and softcap, fully masked rows, garbage keys, 16-bit inputs,
  head-parallel and the module.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from conformance.fixtures import ARRAY_KEYWORDS
from conformance.runner import SHARDED_ALIASES, Run, runs_for
from conformance.runner.functions import FUNCTIONS

#: The alias of the head-parallel module forward (module fixtures; n must divide K).
MODULE_ALIAS = "head_parallel_gqa"

#: torch process counts and JAX device counts the tests use.
TORCH_WORLDS = (2, 4)
JAX_DEVICES = 8


@functools.cache
def sharded_runs(n_shards: int) -> tuple[Run, ...]:
    """Every run of the sharded aliases with ``n_shards`` shards (error runs: with n = 2)."""
    runs = runs_for(functions=SHARDED_ALIASES, shards=(n_shards,))
    return tuple(r for r in runs if r.shards is not None or n_shards == 2)


@functools.cache
def runs_by_id() -> dict[str, Run]:
    return {r.id: r for n in (1, 2, 3, 4, 8) for r in sharded_runs(n)}


def torch_runs(world: int) -> tuple[Run, ...]:
    """What each of ``world`` gloo processes runs: the runs with ``world`` shards (errors: in
    the group of 2; they raise before any process is asked for)."""
    return sharded_runs(world)


#: JAX's runs. Each is one compiled program (one to two seconds here): 2, 3, 4 and 8 devices in
#: both layouts, both alignments, L != S, masks with fully masked rows, bias with softcap,
#: garbage keys, float64, float32 and both 16-bit types, head-parallel and the module; and
#: contract v2 across shards (window, segments, sinks, ALiBi).
JAX_RUN_IDS: tuple[str, ...] = (
    "ring.n2.causal.top_left.l64_s64.float32",
    "ring_zigzag.n8.causal.top_left.l64_s64.float32",
    "ring_zigzag.n2.causal.top_left.l64_s64.bfloat16",
    "ring_zigzag.n4.causal.bottom_right.l64_s96.float64",
    "ring.n4.causal.bottom_right.l96_s64.float64",
    "ring_zigzag.n4.mask.random_causal.l64_s64.float32",
    "ring.n8.fully_masked.rows.l64_s64.float64",
    "ring.n4.bias.softcap.l32_s32.float32",
    "ring_zigzag.n2.large_logits.shifted.l64_s64.float16",
    "ring.n4.garbage.padding.l32_s64.bfloat16",
    "head_parallel.n2.gqa.h6_k2.head_mask.float32",
    "head_parallel.n3.full.gqa.h6_k3.l96_s96.float64",
    f"{MODULE_ALIAS}.n2.padding.b11s.float32",
    # contract v2 across shards
    "ring_zigzag.n4.window.causal.l32_s32.float32",
    "ring.n4.segments.packed.causal.l32_s32.float32",
    "ring_zigzag.n2.sinks.padding.l32_s32.float32",
    "ring.n2.alibi.causal.bottom_right.l32_s48.float32",
    "head_parallel.n2.sinks.basic.float32",
)


def jax_runs() -> list[Run]:
    return [runs_by_id()[run_id] for run_id in JAX_RUN_IDS]


#: The per-device memory probe (compiled, not run): B=1, H=4, K=2, L=S=1024, D=E=64, float32,
#: causal, contiguous, with 4 and 8 devices; docs/SHARDED.md, "Memory", quotes the numbers.
MEMORY_PROBE = {"B": 1, "H": 4, "K": 2, "L": 1024, "D": 64, "E": 64, "shards": (4, 8)}

#: The JAX gradient check (its own subprocess, marked slow: differentiating the ring compiles
#: forward and backward of both branches of every causal cond, about ten seconds here):
#: gradients through zigzag, causal, mask and bias, with fully masked rows, against jax.grad of
#: impl_jax.scaled_dot_product_attention, float64; and a causal float32 run, jitted in float32
#: as training runs it, against the float64 oracle's gradients (the ring block's clamp of
#: ``s - max`` at 0 must pass the gradient wherever XLA rounds it above 0; on this CPU it does
#: not, so that clamp's regression is not caught here: test_sharded says what was tried).
JAX_GRAD_RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ring_zigzag.n4.fully_masked.rows.l64_s64.float64", ("query", "key", "value", "bias")),
    ("ring_zigzag.n4.causal.top_left.l64_s64.float32", ("query", "key", "value")),
)


def run_inputs(run: Run) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The run's arrays (NumPy, in the fixture's dtypes) and keywords (without
    return_weights)."""
    tensors = {n: np.array(a) for n, a in run.case.tensors().items()}
    keywords = {k: v for k, v in run.case.keywords.items() if k != "return_weights"}
    return tensors, keywords


def call(module: Any, run: Run, arrays: dict[str, Any], keywords: dict[str, Any],
         **extra: Any) -> Any:
    """Call the framework ``module`` (``impl_*.sharded``) for ``run`` on framework arrays
    (query, key, value and the array keywords: mask, bias, segment ids, sinks, ALiBi slopes);
    ``extra`` goes to the function (``stats``)."""
    kw = dict(keywords, n_shards=run.shards)
    for name in ARRAY_KEYWORDS:
        if name in arrays:
            kw[name] = arrays[name]
    q, k, v = arrays["query"], arrays["key"], arrays["value"]
    if run.function == "head_parallel":
        return module.head_parallel_attention(q, k, v, **kw, **extra)
    if run.function == "ulysses":
        return module.ulysses_attention(q, k, v, **kw, **extra)
    if run.function == "usp":  # the runner's group sizes for n devices, its zigzag ring
        spec = FUNCTIONS["usp"]
        kw = {k: v for k, v in kw.items() if k != "n_shards"} | spec.shard_keywords(run.shards)
        return module.usp_attention(q, k, v, **spec.defaults, **kw, **extra)
    layout = "zigzag" if run.function == "ring_zigzag" else "contiguous"
    return module.ring_attention(q, k, v, layout=layout, **kw, **extra)
