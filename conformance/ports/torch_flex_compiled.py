"""``torch.compile(flex_attention)`` on CPU as a port: FlexAttention's fused kernel, measured.

The eager port (:mod:`conformance.ports.torch_flex`) builds the mods a case needs; compiled,
every new ``score_mod``/``mask_mod`` is a new graph (about 6 s on top of a first compile of
about 20 s), and after ``torch._dynamo.config.recompile_limit`` (8) graphs of one frame torch
*silently* runs the rest uncompiled. So this port is data-driven: ONE ``score_mod`` and ONE
``mask_mod`` whose code never changes and which read every rule from captured tensors
(a feature that is off reads a neutral value), so cases of one shape and dtype share a graph:

- ``score_mod``: ``where(use_softcap, softcap * tanh(score / softcap), score)``, plus
  ``bias[b, h, q, kv]`` (zeros without a bias), minus ``slopes[h] * |q + offset - kv|``
  (zero slopes without ALiBi), and the sink column's score ``sinks[h]`` (below);
- ``mask_mod``: ``mask[b, h, q, kv]`` (all true without a mask), ``kv <= q + offset`` unless
  the causal switch is off, the window band ``q + offset - left <= kv <= q + offset + right``
  (bounds past the ends without a window) and ``q_ids[b, q] == kv_ids[b, kv]`` (zeros
  without segments); the sink column is always attended.

Sinks: compiled FlexAttention on CPU refuses ``return_aux``/``return_lse`` (the eager port's
route), so a sink is one extra key column whose score is ``sinks[h]`` and whose value is zero:
it joins every row's softmax denominator and adds nothing to the output.

Each call counts, from ``torch._dynamo.utils.counters``, the graphs compiled
(``stats.unique_graphs``) and the graph breaks (``graph_break``) it caused; :data:`RUN_STATS`
keeps them per run (the runner's ``begin_run`` names it), and ``ROSETTA_FLEX_STATS=<file>``
appends one JSON line per call. Before a call that could be the frame's ``recompile_limit``-th
graph, the port starts torch's compile cache afresh (``torch._dynamo.reset()``), so a run is
compiled as a program with fewer shapes would be; if torch still ran the call uncompiled
(flex_attention's Python body ran and gave its "called without torch.compile()" warning,
which compiled code never runs; torch shows it once a process, so the port re-arms it before
each call), the call raises ``fell back to eager`` instead of passing as compiled.

fp8 (contract v3): the fp8 tensors go to the compiled call as they are, ``q_descale *
k_descale`` folded into ``scale`` where each is one number and the output times ``v_descale``
(:mod:`conformance.ports.descales`); on CPU inductor refuses to lower fp8 FlexAttention
(measured in the xfails).
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from typing import Any

import torch
import torch._dynamo
import torch.nn.attention.flex_attention as flex_module
from torch._dynamo.utils import counters
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from conformance.ports.descales import takes_descales, torch_output
from conformance.ports.precision import torch_ieee_float32
from conformance.ports.torch_adapter import from_numpy, to_numpy

__all__ = [
    "RUN_STATS",
    "attention_weights",
    "begin_run",
    "from_numpy",
    "scaled_dot_product_attention",
    "to_numpy",
]

_COMPILED = torch.compile(flex_attention, dynamic=False)  # dynamic shapes fail to build on CPU

#: Per run id: {"calls", "graphs" (compiled), "graph_breaks", "resets", "seconds"}.
RUN_STATS: dict[str, dict[str, float]] = {}
_run = {"id": None}
_since_reset = {"graphs": 0}
_EAGER_WARNING = "flex_attention called without torch.compile()"  # what only eager says


def begin_run(run_id: str) -> None:
    """The runner names the run before its calls: its counts go under ``run_id``."""
    _run["id"] = run_id


def _graphs() -> int:
    return counters["stats"]["unique_graphs"]


def _graph_breaks() -> int:
    return sum(counters["graph_break"].values())


def _batched(x: torch.Tensor, batch: tuple[int, ...]) -> torch.Tensor:
    """``(..., N, T, X)`` broadcast to ``batch`` and flattened: ``(B, N, T, X)``."""
    return x.expand(*batch, *x.shape[-3:]).reshape(math.prod(batch), *x.shape[-3:])


def _per_score(x: torch.Tensor, batch: tuple[int, ...], H: int, L: int, S: int) -> torch.Tensor:
    """A mask or bias broadcastable to ``(..., H, L, S)`` as ``(B, H, L, S)``."""
    return x.expand(*batch, H, L, S).reshape(math.prod(batch), H, L, S)


def _mods(
    batch, H, L, S, columns, dtype, *, mask, bias, is_causal, causal_alignment, softcap,
    window, q_segment_ids, kv_segment_ids, sinks, alibi_slopes,
):
    """(score_mod, mask_mod): one code for every case, the case's rules in captured tensors
    over ``columns`` keys (S, or S + 1 with the sink column at index S)."""
    if causal_alignment not in ("top_left", "bottom_right"):
        raise ValueError(f"no causal alignment {causal_alignment!r}")
    n = math.prod(batch)
    offset = torch.tensor(0 if causal_alignment == "top_left" else S - L)
    sink_at = torch.tensor(S if sinks is not None else columns)  # past the end: no sink
    rows, cols = max(L, 1), max(columns, 1)  # never empty: a traced read of one is an error
    dense_bias = torch.zeros(n, H, rows, cols, dtype=dtype)
    if bias is not None:
        dense_bias[..., :L, :S] = _per_score(bias, batch, H, L, S)
    use_cap = torch.tensor(softcap is not None)
    cap = torch.tensor(1.0 if softcap is None else softcap, dtype=torch.float32)
    slopes = torch.zeros(H, dtype=torch.float32) if alibi_slopes is None else alibi_slopes
    sink = torch.zeros(H, dtype=torch.float32) if sinks is None else sinks
    dense_mask = torch.ones(n, H, rows, cols, dtype=torch.bool)
    if mask is not None:
        dense_mask[..., :L, :S] = _per_score(mask, batch, H, L, S)
    causal = torch.tensor(bool(is_causal))
    left, right = window if window is not None else (None, None)
    low = torch.tensor(L + S if left is None else left)  # kv >= q + offset - low
    high = torch.tensor(L + S if right is None else right)  # kv <= q + offset + high
    q_ids = torch.zeros(n, rows, dtype=torch.int64)
    kv_ids = torch.zeros(n, cols, dtype=torch.int64)  # the sink column's id: never read
    if q_segment_ids is not None:
        q_ids[:, :L] = q_segment_ids.expand(*batch, L).reshape(n, L)
        kv_ids[:, :S] = kv_segment_ids.expand(*batch, S).reshape(n, S)

    def score_mod(score, b, h, q, kv):
        score = torch.where(use_cap, cap * torch.tanh(score / cap), score)
        score = score + dense_bias[b, h, q, kv]
        score = score - slopes[h] * (q + offset - kv).abs().to(slopes.dtype)
        return torch.where(kv == sink_at, sink[h].to(score.dtype), score)

    def mask_mod(b, h, q, kv):
        diagonal = q + offset
        keep = dense_mask[b, h, q, kv] & ((kv <= diagonal) | ~causal)
        keep = keep & (kv >= diagonal - low) & (kv <= diagonal + high)
        keep = keep & (q_ids[b, q] == kv_ids[b, kv])
        return keep | (kv == sink_at)

    return score_mod, mask_mod


def _record(stats: dict[str, float]) -> None:
    mine = RUN_STATS.setdefault(
        str(_run["id"]), dict(calls=0, graphs=0, graph_breaks=0, resets=0, seconds=0.0)
    )
    for name, value in stats.items():
        mine[name] += value
    path = os.environ.get("ROSETTA_FLEX_STATS")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"run": _run["id"], **stats}) + "\n")


def _compiled_call(q, k, v, score_mod, block_mask, scale, enable_gqa) -> torch.Tensor:
    """One compiled flex_attention call, counted; raises if torch ran it uncompiled."""
    resets = 0
    if _since_reset["graphs"] >= torch._dynamo.config.recompile_limit - 1:
        torch._dynamo.reset()  # the next graph would be the frame's last compiled one
        _since_reset["graphs"], resets = 0, 1
    graphs, breaks, start = _graphs(), _graph_breaks(), time.perf_counter()
    flex_module._WARNINGS_SHOWN.discard("flex_attention_performance")  # warn every time
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = _COMPILED(
                q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                enable_gqa=enable_gqa,
            )
    finally:  # a call torch refuses (float64: at lowering) is counted too
        new = _graphs() - graphs
        _since_reset["graphs"] += new
        _record(
            dict(calls=1, graphs=new, graph_breaks=_graph_breaks() - breaks, resets=resets,
                 seconds=time.perf_counter() - start)
        )
    if any(_EAGER_WARNING in str(w.message) for w in caught):
        raise RuntimeError(
            "fell back to eager: torch ran flex_attention uncompiled (its unfused-path "
            f"warning; recompile_limit {torch._dynamo.config.recompile_limit})"
        )
    return out


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "torch's compiled flex_attention"


@takes_descales(_KERNEL, torch_output)
def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Compiled FlexAttention on the contract's layout: query (..., H, L, D), key
    (..., K, S, D), value (..., K, S, E) -> (..., H, L, E)."""
    H, L = query.shape[-3], query.shape[-2]
    K, S = key.shape[-3], key.shape[-2]
    batch = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    q, k, v = (_batched(x, batch) for x in (query, key, value))
    columns = S + (sinks is not None)
    if sinks is not None:  # the sink column: a zero key and a zero value
        k = torch.nn.functional.pad(k, (0, 0, 0, 1))
        v = torch.nn.functional.pad(v, (0, 0, 0, 1))
    score_mod, mask_mod = _mods(
        batch, H, L, S, columns, query.dtype, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, softcap=softcap, window=window,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, sinks=sinks,
        alibi_slopes=alibi_slopes,
    )
    with warnings.catch_warnings(), torch_ieee_float32():
        warnings.simplefilter("ignore", UserWarning)
        block_mask = create_block_mask(mask_mod, q.shape[0], H, L, columns, device="cpu")
        out = _compiled_call(q, k, v, score_mod, block_mask, scale, H != K)
    return out.reshape(*batch, H, L, out.shape[-1])


@takes_descales(_KERNEL, torch_output)
def attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    **keywords: Any,
) -> torch.Tensor:
    """The weights (..., H, L, S) from the same call with value = identity (S x S)."""
    K, S = key.shape[-3], key.shape[-2]
    identity = torch.eye(S, dtype=query.dtype, device=query.device)  # (S, E=S)
    identity = identity.expand(*key.shape[:-3], K, S, S)  # (..., K, S, S)
    return scaled_dot_product_attention(query, key, identity, **keywords)
