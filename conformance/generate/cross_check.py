"""The generator's cross-check: each golden against the frameworks' own kernels (the forward:
output and weights on rows with an allowed key) and their autograd (the gradients, with central
finite differences of the oracle's forward on small cases). A disagreement beyond the case's bound
stops the generator, unless :data:`KNOWN_DEVIATIONS` lists it."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import math
from typing import Any

import numpy as np

from conformance.fixtures import ARRAY_KEYWORDS
from conformance.oracle import Golden, GoldenGrads, attention

#: Where a kernel is known to compute differently from the contract on rows that do have an
#: allowed key: (kernel, glob over case ids, why). These are recorded, not refused.
KNOWN_DEVIATIONS: list[tuple[str, str, str]] = [
    *(
        (
            "jax",
            f"{op}.*.float64",
            "jax.nn.dot_product_attention always computes the softmax in "
            "float32 (float64 logits are cast down; a float64 bias below -3.4e38 becomes -inf)",
        )
        for op in ("sdpa", "ring")
    ),
    *(
        (kernel, "sdpa.garbage.*", "NaN or inf at keys no query attends leaks into the output "
         "(0 * NaN in weights @ value)")
        for kernel in ("torch", "jax")
    ),
    *(
        (kernel, pattern, "NaN or inf at keys no query attends leaks")
        for kernel in ("torch", "jax")
        for pattern in ("flash.tiling.garbage*", "ring.garbage.*", "grad.garbage.*")
    ),
    # The kernels' own backward (their ports' scaled_dot_product_attention_vjp): JAX's float32
    # softmax, and its rows with no allowed key (uniform weights or NaN), which dK, dV and dbias
    # sum over, so no row can be left out of the comparison as in the forward's.
    ("jax", "grad.*.float64", "jax.nn's softmax is float32, and so is its backward"),
    *(
        ("jax", pattern, "rows with no allowed key are uniform or NaN, and dK, dV sum over them")
        for pattern in ("grad.fully_masked.*", "grad.mask_broadcast.l1.*", "grad.segments.no_key.*")
    ),
]

#: (golden name in the fixture, field of AttentionGrads / GoldenGrads, the input it belongs to)
GRAD_NAMES: tuple[tuple[str, str], ...] = (
    ("dq", "query"),
    ("dk", "key"),
    ("dv", "value"),
    ("dbias", "bias"),
    ("dsinks", "sinks"),
)
#: Finite differences check this many entries of each differentiated input, of a case whose
#: scores have at most :data:`FD_MAX_SCORES` entries (the oracle's forward is a Python loop).
FD_SAMPLES, FD_MAX_SCORES = 4, 2000


def load_kernels(modules: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The framework ports of ``modules`` (name -> port module) that import here, and the
    versions (or why not) of each."""
    from conformance.runner import load_port

    kernels, versions = {}, {"numpy": np.__version__}
    for name, module in modules.items():
        try:
            kernels[name] = load_port(module)
        except ImportError as exc:
            versions[name] = f"not checked: {exc}"
            continue
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "unknown"
    return kernels, versions


def known_deviation(kernel: str, case_id: str) -> str | None:
    for name, pattern, why in KNOWN_DEVIATIONS:
        if name == kernel and fnmatch.fnmatchcase(case_id, pattern):
            return why
    return None


def cross_check_case(
    kernels: dict[str, Any],
    case_id: str,
    inputs: dict[str, np.ndarray],
    keywords: dict[str, Any],
    golden: Golden,
    bounds: dict[str, float],
) -> tuple[dict[str, str], list[str]]:
    """What each kernel says about one case (``agree``, ``n/a: why``, ``known deviation``),
    and the disagreements that must stop the generator."""
    said, disagreements = {}, []
    rows = golden.allowed.any(axis=-1)  # (..., H, L): rows with at least one allowed key
    skipped = int(rows.size - rows.sum())
    for name, port in kernels.items():
        convert = {k: port.from_numpy(v, "cpu") for k, v in inputs.items()}
        extra = {k: convert[k] for k in ARRAY_KEYWORDS if k in convert}
        try:
            out = port.function("sdpa")(
                convert["query"], convert["key"], convert["value"], **extra, **keywords
            )
            weights = port.function("weights")(
                convert["query"], convert["key"], **extra, **keywords
            )
            out, weights = port.to_numpy(out), port.to_numpy(weights)
        except Exception as exc:  # the framework cannot express this case
            first = str(exc).splitlines()[0] if str(exc) else ""
            said[name] = f"n/a: {type(exc).__name__}: {first[:120]}"
            continue
        worst = {}
        for what, got, want in (
            ("output", out, golden.output),
            ("weights", weights, golden.weights),
        ):
            sel = np.broadcast_to(rows, want.shape[:-1])
            with np.errstate(invalid="ignore"):
                diff = np.abs(got.astype(np.float64)[sel] - want[sel])
            diff[np.isnan(want[sel]) & np.isnan(got.astype(np.float64)[sel])] = 0.0  # NaN met
            err = float(np.max(diff, initial=0.0)) if not np.isnan(diff).any() else float("nan")
            worst[what] = err
        known = known_deviation(name, case_id)
        beyond = [w for w in worst if not worst[w] <= bounds[w]]
        if beyond and known:
            said[name] = f"known deviation: {known}"
            continue
        for what in beyond:
            disagreements.append(
                f"{name} {what}: max error {worst[what]:.3g} > bound {bounds[what]:.3g}"
            )
        note = f" ({skipped} rows with no allowed key not compared)" if skipped else ""
        said[name] = "agree" + note
    return said, disagreements


def grad_errors(got: dict[str, np.ndarray], golden: GoldenGrads) -> dict[str, float]:
    """Max |got - golden| per gradient (NaN counts as NaN)."""
    worst = {}
    for name, field in GRAD_NAMES:
        want = getattr(golden, field)
        if want is None or want.size == 0:
            continue
        with np.errstate(invalid="ignore"):
            diff = np.abs(np.asarray(got[name], np.float64) - want)
        worst[name] = float(np.max(diff)) if not np.isnan(diff).any() else float("nan")
    return worst


def finite_differences(case_seed: int, as64: dict[str, np.ndarray], semantics: dict,
                        golden: GoldenGrads) -> list[str]:
    """Central differences of ``sum(attention(...).output * grad_output)`` (the oracle's
    forward, float64) at :data:`FD_SAMPLES` finite entries of each differentiated input,
    against the oracle's backward: they must agree to 1e-6 of the gradient's scale."""
    rng = np.random.default_rng(case_seed)
    forward = {k: v for k, v in as64.items() if k != "grad_output"}
    do = as64["grad_output"]

    def loss(**changed: np.ndarray) -> float:
        out = attention(**{**forward, **changed}, **semantics).output
        return math.fsum((out * do).ravel().tolist())

    problems = []
    for name, field in GRAD_NAMES:
        want = getattr(golden, field)
        if want is None or want.size == 0:
            continue
        x = forward[field]
        finite = np.flatnonzero(np.isfinite(x))
        scale = max(1.0, float(np.max(np.abs(want))))
        for flat in rng.choice(finite, size=min(FD_SAMPLES, finite.size), replace=False):
            index = np.unravel_index(flat, x.shape)
            eps = 1e-6 * max(1.0, abs(float(x[index])))
            up, down = x.copy(), x.copy()
            up[index] += eps
            down[index] -= eps
            fd = (loss(**{field: up}) - loss(**{field: down})) / (2 * eps)
            if not abs(fd - want[index]) <= 1e-6 * scale:
                problems.append(
                    f"finite differences {name}{tuple(int(i) for i in index)}: {fd!r} against "
                    f"the oracle's {float(want[index])!r}"
                )
    return problems


def grad_cross_check(kernels: dict[str, Any], case_id: str, seed: int,
                      as64: dict[str, np.ndarray], semantics: dict, golden: GoldenGrads,
                      bounds: dict[str, float]) -> tuple[dict[str, str], list[str]]:
    """What each kernel's autograd says about one gradient case, computed in float64 from the
    case's (rounded) inputs, within the case's bounds; and, on small cases, central finite
    differences of the oracle's own forward (recorded as ``finite_differences``)."""
    said, disagreements = {}, []
    n_scores = golden.query.size // max(1, golden.query.shape[-1]) * as64["key"].shape[-2]
    if n_scores <= FD_MAX_SCORES:
        bad = finite_differences(seed, as64, semantics, golden)
        said["finite_differences"] = "agree" if not bad else "disagree"
        disagreements += bad
    else:
        said["finite_differences"] = f"not run: more than {FD_MAX_SCORES} scores"
    for name, port in kernels.items():
        vjp = getattr(port.module, "scaled_dot_product_attention_vjp", None)
        if vjp is None:
            said[name] = "n/a: the port has no scaled_dot_product_attention_vjp"
            continue
        convert = {k: port.from_numpy(v, "cpu") for k, v in as64.items()}
        extra = {k: convert[k] for k in ARRAY_KEYWORDS if k in convert}
        try:
            grads = vjp(convert["query"], convert["key"], convert["value"],
                        convert["grad_output"], **extra, **semantics)
            got = {n: port.to_numpy(grads[i]) for i, (n, f) in enumerate(GRAD_NAMES)
                   if getattr(golden, f) is not None}
        except Exception as exc:  # the framework cannot express this case
            first = str(exc).splitlines()[0] if str(exc) else ""
            said[name] = f"n/a: {type(exc).__name__}: {first[:120]}"
            continue
        worst = grad_errors(got, golden)
        beyond = [w for w in worst if not worst[w] <= bounds[w]]
        known = known_deviation(name, case_id)
        if beyond and known:
            said[name] = f"known deviation: {known}"
            continue
        disagreements += [f"{name} {w}: max error {worst[w]:.3g} > bound {bounds[w]:.3g}"
                          for w in beyond]
        said[name] = "agree"
    return said, disagreements


#: Hugging Face computes its rotary frequencies in float32: a case's float64 frequencies agree
#: with them to a few float32 ulps, relative (measured 2.6 ulps on the llama3 case).
HF_ROPE_RELATIVE_BOUND = 4 * 2.0**-23


def hf_rope_cross_check(parameters: dict[str, Any], rotary_dim: int, inv_freq: np.ndarray,
                        attention_factor: float) -> tuple[dict[str, str], list[str]]:
    """What transformers' ``ROPE_INIT_FUNCTIONS[rope_type]`` says about a case's scaled
    frequencies ``inv_freq (rotary_dim/2,)`` and attention factor, written from the published
    formulas (conformance/cases/rope.py): ``({"transformers": verdict}, disagreements)``;
    "n/a" when transformers is not installed."""
    try:
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError as exc:
        return {"transformers": f"n/a: {type(exc).__name__}"}, []
    factor = parameters.get("factor", 1.0)
    config = LlamaConfig(
        hidden_size=2 * rotary_dim, num_attention_heads=2, head_dim=rotary_dim,
        max_position_embeddings=int(factor * parameters["original_max_position_embeddings"]),
        rope_parameters=dict(parameters),
    )
    theirs, their_factor = ROPE_INIT_FUNCTIONS[parameters["rope_type"]](config)
    theirs = theirs.double().numpy()
    bad = []
    if theirs.shape != inv_freq.shape:
        bad.append(f"transformers inv_freq shape {theirs.shape} != {inv_freq.shape}")
    else:
        worst = float(np.max(np.abs(theirs / inv_freq - 1.0)))
        if not worst <= HF_ROPE_RELATIVE_BOUND:
            bad.append(f"transformers inv_freq relative error {worst:.3g}")
    if not abs(float(their_factor) - attention_factor) <= 1e-12:
        bad.append(f"transformers attention_factor {their_factor!r} != {attention_factor!r}")
    return {"transformers": "agree" if not bad else "disagree"}, bad
