"""The canonical weights: the one format every module loads and exports, and its checks.

The canonical weights are a flat dict::

    q_proj.kernel (M, H*D)   q_proj.bias (H*D,)
    k_proj.kernel (M, K*D)   k_proj.bias (K*D,)
    v_proj.kernel (M, K*E)   v_proj.bias (K*E,)
    o_proj.kernel (H*E, M)   o_proj.bias (M,)

A kernel is ``(in, out)``: ``y = x @ kernel + bias``. Head h owns features ``[h*D:(h+1)*D]`` of
the query projection (``[h*E:(h+1)*E]`` of the output projection's input); key/value head k
owns ``[k*D:(k+1)*D]`` and ``[k*E:(k+1)*E]``. The biases are all present or all absent.
A module built with ``sinks=True`` has one more weight, ``sinks (H,)``: the learned sink logit of
each query head (SEMANTICS.md v2, step 5). :meth:`ModuleDims.canonical_shapes` lists them.

A weight file is safetensors with one metadata key (:func:`weights_metadata`); the interop rules
say which of them a framework's own attention module can hold (:func:`check_interop`).

Shape letters: H query heads, K key/value heads, D query/key head dim, E value head dim,
M model width (d_model).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from attention_spec.arrays import check_dtype, describe
from attention_spec.deprecated import spec_1_0, warn_1_0
from attention_spec.errors import make_error
from attention_spec.keywords import check_flag, check_size
from attention_spec.modules import AttentionOptions, ModuleDims, check_module_config
from attention_spec.rotary import RopeConfig

__all__ = [
    "CANONICAL_FORMAT",
    "METADATA_KEY",
    "PROJECTIONS",
    "check_canonical",
    "check_interop",
    "heads_from_metadata",
    "options_from_metadata",
    "weights_metadata",
]

#: The four projections, in the order of the forward pass.
PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

#: The safetensors metadata key of a weight file, and the format its JSON value names.
METADATA_KEY = "rosetta_attention"
CANONICAL_FORMAT = "canonical-v1"


def _dims_from_shapes(
    shapes: Mapping[str, tuple[int, ...]], n_heads: int, n_kv_heads: int
) -> ModuleDims:
    """M, D, E and bias read from ``q_proj.kernel (M, H*D)`` and ``v_proj.kernel (M, K*E)``."""
    check_size("n_heads (H)", n_heads)
    check_size("n_kv_heads (K)", n_kv_heads)
    H, K = n_heads, n_kv_heads
    for name in ("q_proj.kernel", "v_proj.kernel"):
        if name not in shapes:
            raise make_error(
                "weight_shape",
                f"canonical weights have no {name}; got keys {sorted(shapes)}",
                expected=name,
                actual=str(sorted(shapes)),
            )
    q_shape, v_shape = shapes["q_proj.kernel"], shapes["v_proj.kernel"]
    for name, shape, heads, letter in (("q_proj.kernel", q_shape, H, "H*D"),
                                       ("v_proj.kernel", v_shape, K, "K*E")):
        if len(shape) != 2 or shape[1] % heads or shape[1] == 0:
            raise make_error(
                "weight_shape",
                f"{name} must be (M, {letter}) with {letter[0]}={heads}; got {shape}",
                expected=f"(M, {letter})",
                actual=str(shape),
            )
    return check_module_config(
        q_shape[0], H, K, q_shape[1] // H, v_shape[1] // K, bias="q_proj.bias" in shapes,
        sinks="sinks" in shapes,
    )


def check_canonical(
    weights: Mapping[str, Any],
    *dtypes_1_0: Mapping[str, str],
    n_heads: int,
    n_kv_heads: int,
    expected: ModuleDims | None = None,
    sinks: object = None,
) -> ModuleDims:
    """Validate canonical weights (a mapping of names to arrays) and return the sizes.

    M, D and E are read from the shapes: ``q_proj.kernel (M, H*D)``, ``v_proj.kernel (M, K*E)``;
    whether the module has sinks from the presence of ``sinks (H,)``; every other weight must then
    have its canonical shape. All weights share one supported dtype. With ``expected`` (loading
    into an existing module), every shape must be that module's. ``sinks`` (``from_canonical``'s
    keyword; None: whatever the weights say) True or False must agree with the weights.

    Deprecated (API 1.0, removed in 2.0 at the earliest): ``check_canonical(shapes, dtypes,
    *, n_heads, n_kv_heads, expected=None)``, the weights' shapes and dtype names by name; it
    warns (``DeprecationWarning``) and returns what the 1.1 form returns.

    Raises:
        the errors of :func:`check_module_config` for ``n_heads``/``n_kv_heads``;
        DimensionMismatchError ``weight_shape``: a missing, unexpected or misshaped weight;
        DTypeError ``dtype_mismatch``, ``unsupported_dtype``.
    """
    if dtypes_1_0:
        warn_1_0(
            "check_canonical(shapes, dtypes, ...)",
            "pass the weights themselves (arrays, "
            "or ArraySpecs): check_canonical(weights, n_heads=..., n_kv_heads=...)",
            3,
        )
        (dtypes,) = dtypes_1_0
        weights = {name: spec_1_0(shape, dtypes[name]) for name, shape in weights.items()}
    specs = {name: describe(w) for name, w in weights.items()}
    shapes = {name: spec.shape for name, spec in specs.items()}
    dtypes = {name: spec.dtype for name, spec in specs.items()}
    dims = expected if expected is not None else _dims_from_shapes(shapes, n_heads, n_kv_heads)
    if sinks is not None and check_flag("sinks", sinks) != dims.sinks:
        raise make_error(
            "weight_shape",
            f"sinks={sinks} was asked, but the canonical weights "
            f"{'hold' if dims.sinks else 'have no'} a sinks (H,) weight; a module's sinks are "
            "learned weights: give them (a module made with sinks=True exports them) or leave "
            "sinks=None to follow the weights",
            expected=f"sinks ({dims.H},)" if sinks else "no sinks weight",
            actual=f"sinks {shapes['sinks']}" if dims.sinks else "no sinks weight",
        )
    canonical = dims.canonical_shapes()
    for name in [*canonical, *(n for n in shapes if n not in canonical)]:
        if shapes.get(name) != canonical.get(name):
            got = "missing" if name not in shapes else shapes[name]
            want = "absent" if name not in canonical else canonical[name]
            raise make_error(
                "weight_shape",
                f"canonical weight {name} must be {want} for {dims} "
                f"({'with' if dims.bias else 'without'} biases); got {got}",
                expected=str(want),
                actual=str(got),
            )
    names = list(canonical)
    check_dtype(names[0], str(dtypes[names[0]]))
    if len({str(dtypes[n]) for n in names}) > 1:
        listing = ", ".join(f"{n}={dtypes[n]}" for n in names)
        raise make_error(
            "dtype_mismatch",
            f"canonical weights must share one dtype; got {listing}",
            expected="one dtype",
            actual=listing,
        )
    return dims


def weights_metadata(
    dims: ModuleDims, rope: RopeConfig | None = None, options: AttentionOptions | None = None
) -> dict[str, str]:
    """The safetensors metadata of a weight file: the format, the head counts H and K, and the
    module's RoPE settings when it has them (``rope_theta``, ``rope_interleaved``,
    ``rotary_dim``) and its attention settings that are not at their default (``window``, ``alibi``,
    ``softcap``, ``scale``): :func:`options_from_metadata` gives them back to ``load``. The
    sinks are a weight of the file.

    The head counts are not recoverable from the shapes (``H*D`` does not say H); M, D, E and the
    biases are. One key holding sorted JSON, because safetensors writes several metadata keys in
    a random order, and one file should have one sha256.
    """
    config = {"format": CANONICAL_FORMAT, "n_heads": dims.H, "n_kv_heads": dims.K}
    if rope is not None:
        config |= rope.module_keywords()
    if options is not None:
        config |= options.module_keywords()
    return {METADATA_KEY: json.dumps(config, sort_keys=True)}


def options_from_metadata(metadata: Mapping[str, str] | None) -> dict[str, Any]:
    """The module settings a weight file written by :func:`weights_metadata` carries besides
    the head counts, as keywords of ``from_canonical`` (``{}`` for a v1 module without RoPE)."""
    config = json.loads(dict(metadata or {}).get(METADATA_KEY, "{}"))
    return {k: v for k, v in config.items() if k not in ("format", "n_heads", "n_kv_heads")}


def heads_from_metadata(metadata: Mapping[str, str] | None) -> tuple[int, int]:
    """``(H, K)`` from a weight file's metadata written by :func:`weights_metadata`."""
    try:
        config = json.loads((metadata or {})[METADATA_KEY])
        if config["format"] != CANONICAL_FORMAT:
            raise ValueError(config["format"])
        return int(config["n_heads"]), int(config["n_kv_heads"])
    except (KeyError, TypeError, ValueError):
        raise make_error(
            "weight_shape",
            f"a weight file needs the metadata {METADATA_KEY!r} (format {CANONICAL_FORMAT!r}, "
            f"n_heads, n_kv_heads); got {dict(metadata or {})}. Load the tensors yourself and "
            "call from_canonical(weights, n_heads=..., n_kv_heads=...)",
            expected=f"{METADATA_KEY}: format={CANONICAL_FORMAT}, n_heads, n_kv_heads",
            actual=str(dict(metadata or {})),
        ) from None


#: What each framework's own attention module can hold, as (rule, test on ModuleDims).
_INTEROP_RULES = {
    "torch.nn.MultiheadAttention": (
        ("K == H (no grouped-query attention)", lambda d: d.K == d.H),
        ("E == D (one head dim)", lambda d: d.E == d.D),
        ("H*D == M (embed_dim = num_heads * head_dim)", lambda d: d.H * d.D == d.M),
        ("no sinks (it has no sink logits)", lambda d: not d.sinks),
    ),
    "flax.nnx.MultiHeadAttention": (
        ("E == D (one head dim)", lambda d: d.E == d.D),
        ("no sinks (it has no sink logits)", lambda d: not d.sinks),
    ),
}


def check_interop(dims: ModuleDims, target: str) -> None:
    """Raise ``weight_shape`` when ``target``'s own module cannot hold weights of ``dims``."""
    broken = [rule for rule, holds in _INTEROP_RULES[target] if not holds(dims)]
    if broken:
        raise make_error(
            "weight_shape",
            f"{target} can only hold weights with {'; '.join(r for r, _ in _INTEROP_RULES[target])}"
            f"; these weights have {dims}, breaking {'; '.join(broken)}",
            expected="; ".join(r for r, _ in _INTEROP_RULES[target]),
            actual=str(dims),
        )
