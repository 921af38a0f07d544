"""The runs of the sharded tests: what each framework runs, with which inputs, against what.

A run is one fixture (a v1 ``sdpa`` or ``module`` fixture) or one ``ring.*`` case
(``conformance/ring_cases.py``) through one sharded alias with n shards
(:class:`conformance.ring_cases.ShardedRun`). The lists are shared by ``tests/test_sharded.py``
(which runs NumPy in-process and compares every framework's results with the goldens) and
``tests/sharded_worker.py`` (which runs JAX on simulated devices and torch in gloo processes, in
subprocesses, and hands back their outputs). This module imports neither JAX nor torch.

- NumPy, the specification, runs everything: every ring case with each of its shard counts and
  both layouts, every fixture with 1, 2 and 3 shards wherever they fit.
- torch runs the same for its process counts (2 and 4).
- JAX compiles a program per run (about a second each on this machine), so it runs a chosen
  list, :data:`JAX_RUNS`, that covers 2, 4 and 8 devices, both layouts, both alignments, L != S,
  GQA, masks, bias and softcap, fully masked rows, and 16-bit inputs.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from conformance.fixtures import load_manifest
from conformance.ring_cases import (
    RING_CASES,
    RingCase,
    ShardedRun,
    golden,
    inputs,
    sharded_runs,
)

#: The alias of the head-parallel module forward (module fixtures; n must divide K).
MODULE_ALIAS = "head_parallel_gqa"

#: torch process counts and JAX device counts the tests use.
TORCH_WORLDS = (2, 4)
JAX_DEVICES = 8


@functools.cache
def ring_cases() -> dict[str, RingCase]:
    """Ring case id -> case (one id per dtype)."""
    return {case.id(dtype): case for case in RING_CASES for dtype in case.dtypes}


def _dtype_of(case_id: str) -> str:
    return case_id.rsplit(".", 1)[1]


def sdpa_fixtures() -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """(id, query shape, key shape) of every v1 ``sdpa`` values fixture."""
    return [
        (c.id, tuple(c.entry["shapes"]["query"]), tuple(c.entry["shapes"]["key"]))
        for c in load_manifest().cases
        if c.op == "sdpa" and c.kind == "values"
    ]


def module_fixtures() -> list[tuple[str, int]]:
    """(id, K) of every v1 ``module`` values fixture."""
    out = []
    for c in load_manifest().cases:
        if c.op == "module" and c.kind == "values":
            spec = c.entry["module"]
            out.append((c.id, spec.get("n_kv_heads", spec["n_heads"])))
    return out


@functools.cache
def _ring_case_shapes() -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    shapes = {}
    for case_id, case in ring_cases().items():
        arrays, _ = inputs(case, _dtype_of(case_id))
        shapes[case_id] = (arrays["query"].shape, arrays["key"].shape)
    return shapes


def ring_case_runs(n_shards: int) -> list[ShardedRun]:
    """Every run of the ring cases written for ``n_shards`` (their ``shards`` list)."""
    cases = [
        (case_id, *_ring_case_shapes()[case_id])
        for case_id, case in ring_cases().items()
        if n_shards in case.shards
    ]
    return sharded_runs(cases, n_shards)


def module_runs(n_shards: int) -> list[ShardedRun]:
    return [
        ShardedRun(MODULE_ALIAS, n_shards, case_id)
        for case_id, K in module_fixtures()
        if K % n_shards == 0
    ]


@functools.cache
def numpy_runs() -> list[ShardedRun]:
    runs = []
    for n in sorted({n for case in RING_CASES for n in case.shards}):
        runs += ring_case_runs(n)
    for n in (1, 2, 3):
        runs += sharded_runs(sdpa_fixtures(), n) + module_runs(n)
    return runs


@functools.cache
def torch_runs(world: int) -> list[ShardedRun]:
    return ring_case_runs(world) + sharded_runs(sdpa_fixtures(), world) + module_runs(world)


#: JAX's runs: (alias, n, case id). Each is one compiled program (one to two seconds here):
#: 2, 4 and 8 devices in both layouts, both alignments, L != S, masks with fully masked rows,
#: bias with softcap, float64, float32 and both 16-bit types, head-parallel and the module.
JAX_RUNS: list[ShardedRun] = [
    ShardedRun(*r)
    for r in [
        ("ring", 2, "ring.causal.top_left.l64_s64.float32"),
        ("ring_zigzag", 8, "ring.causal.top_left.l64_s64.float32"),
        ("ring_zigzag", 2, "ring.causal.top_left.l64_s64.bfloat16"),
        ("ring_zigzag", 4, "ring.causal.bottom_right.l64_s96.float64"),
        ("ring", 4, "ring.causal.bottom_right.l96_s64.float64"),
        ("ring_zigzag", 4, "ring.mask.random_causal.l64_s64.float32"),
        ("ring", 8, "ring.fully_masked.rows.l64_s64.float64"),
        ("ring", 4, "ring.bias.softcap.l64_s64.float32"),
        ("ring_zigzag", 2, "ring.large_logits.shifted.l64_s64.float16"),
        ("head_parallel", 2, "sdpa.gqa.h6_k2.head_mask.float32"),
        ("head_parallel", 3, "ring.full.gqa.h6_k3.l96_s96.float64"),
        (MODULE_ALIAS, 2, "module.padding.b11s.float32"),
    ]
]

#: The per-device memory probe (compiled, not run): B=1, H=4, K=2, L=S=1024, D=E=64, float32,
#: causal, contiguous, with 4 and 8 devices; docs/SHARDED.md, "Memory", quotes the numbers.
MEMORY_PROBE = {"B": 1, "H": 4, "K": 2, "L": 1024, "D": 64, "E": 64, "shards": (4, 8)}

#: The JAX gradient check (its own subprocess, marked slow: differentiating the ring compiles
#: forward and backward of both branches of every causal cond, about ten seconds here):
#: gradients through zigzag, causal, mask and bias, with fully masked rows, against jax.grad of
#: impl_jax.scaled_dot_product_attention, float64.
JAX_GRAD_RUNS: list[tuple[ShardedRun, tuple[str, ...]]] = [
    (ShardedRun("ring_zigzag", 4, "ring.fully_masked.rows.l64_s64.float64"),
     ("query", "key", "value", "bias")),
]  # fmt: skip


def run_inputs(run: ShardedRun) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The run's arrays (NumPy, in the case's dtype) and keywords (without return_weights)."""
    if run.case_id.startswith("ring."):
        return inputs(ring_cases()[run.case_id], _dtype_of(run.case_id))
    case = load_manifest().by_id()[run.case_id]
    tensors = {n: np.array(a) for n, a in case.tensors().items()}
    keywords = {k: v for k, v in case.keywords.items() if k != "return_weights"}
    return tensors, keywords


def case_dtype(run: ShardedRun) -> str:
    return _dtype_of(run.case_id)


def fixture_golden(case_id: str) -> tuple[np.ndarray, float]:
    """A v1 fixture's golden output and bound, from the manifest."""
    case = load_manifest().by_id()[case_id]
    return np.asarray(case.tensors()["output"], np.float64), case.tolerance["output"]


def compute_golden(case_id: str) -> tuple[np.ndarray, float]:
    """The golden output and bound of a fixture (stored) or a ring case (the oracle, now)."""
    if case_id.startswith("ring."):
        return golden(ring_cases()[case_id], _dtype_of(case_id))
    return fixture_golden(case_id)


def call(module: Any, run: ShardedRun, arrays: dict[str, Any], keywords: dict[str, Any],
         **extra: Any) -> Any:  # fmt: skip
    """Call the framework ``module`` (``impl_*.sharded``) for ``run`` on framework arrays.

    ``arrays`` holds query/key/value/mask/bias (attention runs) or the module (``"module"``),
    x, context, mask, bias (module runs); ``extra`` goes to the function (torch's ``stats``).
    """
    kw = dict(keywords)
    for name in ("mask", "bias"):
        if name in arrays:
            kw[name] = arrays[name]
    if run.alias == MODULE_ALIAS:
        return module.head_parallel_gqa(
            arrays["module"], arrays["x"], arrays.get("context"), n_shards=run.n_shards,
            **kw, **extra,
        )  # fmt: skip
    q, k, v = arrays["query"], arrays["key"], arrays["value"]
    if run.alias == "head_parallel":
        return module.head_parallel_attention(q, k, v, n_shards=run.n_shards, **kw, **extra)
    return module.ring_attention(q, k, v, n_shards=run.n_shards, layout=run.layout, **kw, **extra)


def canonical_weights(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {n: a for n, a in tensors.items() if n.endswith((".kernel", ".bias"))}


def module_spec(case_id: str) -> dict[str, Any]:
    """The module fixture's class and head counts: ``{"class": ..., "n_heads": ..., ...}``."""
    return dict(load_manifest().by_id()[case_id].entry["module"])
