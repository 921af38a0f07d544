"""The frameworks' own kernels through the suite: their deviations are exactly their xfails.

``conformance/ports/torch_fused.xfails`` and ``jax_fused.xfails`` list, as globs over run ids,
where ``torch.nn.functional.scaled_dot_product_attention`` and ``jax.nn.dot_product_attention``
differ from the contract; ``mlx_fast.xfails``, ``keras_ops.xfails`` and
``keras_ops_torch.xfails`` do the same for ``mlx.core.fast.scaled_dot_product_attention`` and
``keras.ops.dot_product_attention`` (on JAX and on torch), when the ``frameworks`` extra is
installed. A run that fails without being listed, or a listed run that passes, fails these
tests, so the documented table (docs/CONFORMANCE.md) cannot go stale. The torch and JAX kernels
run every fixture here; the others a subset (one run per family and the pinned ones), and
every fixture in ``make conformance-frameworks``. Each pinned deviation has a test asserting its
numbers.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib.util
import json
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

from conformance import oracle
from conformance.runner import (
    FUNCTIONS,
    Outcome,
    Report,
    Xfails,
    check,
    load_port,
    run_suite,
    runs_for,
)

#: The required aliases: what a kernel port is run on (none of them has flash_attention).
_KERNEL_FUNCTIONS = [alias for alias, spec in FUNCTIONS.items() if spec.required]


#: Contract v3's packed functions, which these kernel ports express with the framework's kernel
#: (one call per sequence, or a padded batch) and run in their strict tests too.
_PACKED_FUNCTIONS = ["varlen", "paged"]


# JAX's run compiles a program per case (about 3 minutes cold): it runs in `make test-slow`.
@pytest.mark.parametrize("name", ["torch_fused", pytest.param("jax_fused", marks=pytest.mark.slow)])
def test_deviations_are_exactly_the_xfails(name: str) -> None:
    pytest.importorskip(name.split("_")[0])
    report = run_suite(name, functions=_KERNEL_FUNCTIONS + _PACKED_FUNCTIONS)
    print(report.table())
    assert report.ok, "\n".join(o.line() for o in report.failures)
    assert report.counts()["xfail"] > 0


#: The gradient runs the backward tests read by id, besides one per family.
_GRAD_PINNED = (
    "grad.basic.mha.float64",
    "grad.fully_masked.bool_row.float32",
    "grad.fully_masked.neg_inf_bias_row.float32",
    "grad.garbage.padding.float32",
)


def _grad_subset() -> list[str]:
    """One ``grad`` run per family (its float32 run, else its first) and :data:`_GRAD_PINNED`:
    each JAX run compiles a forward and a backward. ``make conformance-frameworks`` runs all."""
    chosen: dict[str, str] = {}
    for run in runs_for(functions=["grad"]):
        if run.family not in chosen or (
            run.case.dtype == "float32" and not chosen[run.family].endswith(".float32")
        ):
            chosen[run.family] = run.id
    return sorted(set(chosen.values()) | set(_GRAD_PINNED))


@pytest.mark.parametrize("name", ["torch_fused", "jax_fused"])
def test_backward_deviations_are_exactly_the_xfails(name: str) -> None:
    """The kernels' own backward (``torch.autograd.grad``, ``jax.vjp`` through the port's
    forward) against the oracle's gradients: torch's deviations are its forward's, JAX's add
    float32 gradients for float64 inputs and NaN from garbage at unattended keys."""
    pytest.importorskip(name.split("_")[0])
    subset = set(_grad_subset())
    report = run_suite(name, functions=["grad"], select=lambda run: run.id in subset)
    print(report.table())
    assert report.ok, "\n".join(o.line() for o in report.failures)
    assert len(report.outcomes) == len(subset)
    outcome = {o.run_id: o for o in report.outcomes}
    assert outcome["grad.fully_masked.bool_row.float32"].status == (
        "pass" if name == "torch_fused" else "xfail"
    )
    assert outcome["grad.garbage.padding.float32"].status == "xfail"
    assert outcome["grad.basic.mha.float64"].status == (
        "pass" if name == "torch_fused" else "xfail"
    )


def _outcome(name: str, run_id: str):
    port = load_port(name)
    (run,) = [r for r in runs_for() if r.id == run_id]
    return check(port, run)


def test_jax_fully_masked_rows_are_uniform_or_nan() -> None:
    """The two measured fully-masked-row behaviours of jax.nn.dot_product_attention."""
    pytest.importorskip("jax")
    uniform = _outcome("jax_fused", "weights.fully_masked.bool_row.float32")
    assert uniform.status == "xfail" and "expected 0.0, got 0.14285714" in uniform.message  # 1/S
    nan = _outcome("jax_fused", "weights.fully_masked.neg_inf_bias_row.float32")
    assert nan.status == "xfail" and "got nan" in nan.message


def test_torch_fully_masked_rows_are_zero() -> None:
    """torch's kernel agrees with the contract on fully masked rows (CPU)."""
    pytest.importorskip("torch")
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        for way in ("bool_row", "neg_inf_bias_row", "huge_negative_bias_row"):
            outcome = _outcome("torch_fused", f"sdpa.fully_masked.{way}.{dtype}")
            assert outcome.status == "pass", outcome.line()


# ---------------------------------------------------------------------------------------------
# More frameworks' kernels (the `frameworks` extra): MLX's fast SDPA, keras.ops on JAX and torch
# ---------------------------------------------------------------------------------------------


def _subset(pinned: Iterable[str] = ()) -> list[str]:
    """The runs of the keras ports' strict tests (each run compiles under JAX): per family of
    ``sdpa``, ``causal_mask``, ``module`` and ``decode``, its float32 run (else its first), and
    the ``pinned`` runs. ``weights`` goes through the same kernel with the identity as value:
    its deviations are pinned by id. ``make conformance-frameworks`` runs them all."""
    chosen: dict[str, str] = {}
    for run in runs_for(functions=[a for a in _KERNEL_FUNCTIONS if a != "weights"]):
        if run.family not in chosen or (
            run.case.dtype == "float32" and not chosen[run.family].endswith(".float32")
        ):
            chosen[run.family] = run.id
    return sorted(set(chosen.values()) | set(pinned))


def _check_strict(report: Report) -> None:
    print(report.table())
    assert report.ok, "\n".join(o.line() for o in report.failures) or report.error
    counts = report.counts()
    assert counts["pass"] > 0 and counts["xfail"] > 0


# flax: nnx.dot_product_attention (nnx.MultiHeadAttention's attention_fn), which without dropout
# calls jax.nn.dot_product_attention with bias, mask and is_causal only.

_FLAX_PINNED = (
    "sdpa.window.both.bottom_right.float32",  # a window is a mask built here: either diagonal
    "sdpa.window.fully_masked_rows.l9_s5.float32",
    "sdpa.scale.custom.float32",  # no scale argument: the query carries it
    "sdpa.gqa.h6_k2.float32",  # E != D: zero columns, and the scale of the unpadded D
    "sdpa.alibi.pow2.h8.float32",
    "sdpa.segments.two_docs.float32",
    "sdpa.sinks.basic.float32",
)


@functools.cache
def _flax_report() -> Report:
    pytest.importorskip("flax")
    return run_suite("conformance.ports.flax_nnx", select=lambda run: run.id in _FLAX_RUNS)


_FLAX_RUNS = set(_subset(_FLAX_PINNED))


def test_flax_deviations_are_exactly_the_xfails() -> None:
    report = _flax_report()
    _check_strict(report)
    status = {o.run_id: o.status for o in report.outcomes}
    assert status["sdpa.window.both.bottom_right.float32"] == "pass"  # jax_fused: xfail
    assert status["sdpa.window.fully_masked_rows.l9_s5.float32"] == "xfail"  # uniform rows
    for run_id in ("sdpa.scale.custom.float32", "sdpa.gqa.h6_k2.float32"):
        assert status[run_id] == "pass"
    assert status["sdpa.sinks.basic.float32"] == "xfail"


# ONNX: the Attention operator (opset 25) on onnx's reference evaluator, every sdpa and weights
# run (NumPy underneath, seconds).


@functools.cache
def _onnx_report() -> Report:
    pytest.importorskip("onnx")
    return run_suite(
        "conformance.ports.onnx_ref", functions=["sdpa", "weights", *_PACKED_FUNCTIONS]
    )


def test_onnx_deviations_are_exactly_the_xfails() -> None:
    report = _onnx_report()
    _check_strict(report)
    status = {o.run_id: o.status for o in report.outcomes}
    assert status["sdpa.fully_masked.bool_row.float32"] == "pass"  # zeros, as the contract
    assert status["sdpa.window.left_only.float32"] == "pass"  # its own window attributes
    assert status["sdpa.window.both.bottom_right.float32"] == "xfail"  # top-left only
    assert status["sdpa.softcap.cap2_neg_inf_bias.float32"] == "pass"  # softcap before the mask


def test_onnx_applies_the_scale_as_its_square_root_on_query_and_key() -> None:
    """A negative scale is NaN in ONNX's reference (sqrt(scale) times Q and times K), where the
    contract negates the scores."""
    (outcome,) = [o for o in _onnx_report().outcomes if o.run_id == "sdpa.scale.negative.float32"]
    assert outcome.status == "xfail" and "got nan" in outcome.message


# MLX: mx.fast.scaled_dot_product_attention, in this process (MLX imports in a second).


def _mlx():
    return pytest.importorskip("mlx.core")


def _mlx_outcome(run_id: str) -> Outcome:
    _mlx()
    return _outcome("mlx_fast", run_id)


def test_mlx_fast_deviations_are_exactly_the_xfails() -> None:
    """Every fixture (under a second: MLX's CPU kernel on small tensors, no compilation)."""
    _mlx()
    _check_strict(run_suite("mlx_fast"))


def test_mlx_fast_causal_is_bottom_right_only() -> None:
    """MLX's mask="causal" lines the last query up with the last key (passes bottom_right);
    there is no top-left alignment."""
    mx = _mlx()
    assert _mlx_outcome("sdpa.causal.bottom_right.l5_s7.float32").status == "pass"
    assert _mlx_outcome("sdpa.mask.with_causal_bottom_right.float32").status == "pass"
    top_left = _mlx_outcome("sdpa.causal.top_left.l5_s7.float32")
    assert top_left.status == "xfail" and "bottom-right only" in top_left.message
    # The kernel itself: L = 2 queries, S = 4 keys, value = identity -> the weights. Row 0 sees
    # keys 0..2 (bottom-right: j <= i + S - L), not key 0 alone (top-left).
    q = mx.zeros((1, 1, 2, 3))
    weights = mx.fast.scaled_dot_product_attention(
        q, mx.zeros((1, 1, 4, 3)), mx.eye(4)[None, None], scale=1.0, mask="causal"
    )
    expected = np.tril(np.ones((2, 4)), k=2)
    expected /= expected.sum(-1, keepdims=True)  # 1/3 and 1/4 by hand: float32 to about an ulp
    np.testing.assert_allclose(np.array(weights)[0, 0], expected, rtol=1e-7)


def test_mlx_fast_rows_with_no_allowed_key_are_uniform_or_nan() -> None:
    """All-False mask rows (and bottom-right rows with L > S) get uniform weights 1/S, not
    zeros; a row whose bias is -inf everywhere gives NaN."""
    uniform = _mlx_outcome("weights.fully_masked.bool_row.float32")
    assert uniform.status == "xfail" and "expected 0.0, got 0.14285714" in uniform.message  # 1/7
    leading = _mlx_outcome("weights.causal.bottom_right.l9_s5.float32")  # L = 9 > S = 5
    assert leading.status == "xfail" and "expected 0.0, got 0.2000000" in leading.message  # 1/5
    nan = _mlx_outcome("weights.fully_masked.neg_inf_bias_row.float32")
    assert nan.status == "xfail" and "got nan" in nan.message


def test_mlx_fast_float64_is_computed_with_a_float32_accurate_exp() -> None:
    """float64 goes in and comes out (the dtype check passes), but with errors of float32 size:
    MLX's float64 exp has exactly the error of its float32 exp."""
    mx = _mlx()
    f64 = _mlx_outcome("weights.basic.mha.float64")
    assert f64.status == "xfail" and f64.message.startswith("weights max error")
    assert 1e-9 < f64.error < 1e-6 and f64.bound < 1e-11  # ~1.7e-8 against a bound of 1e-12
    assert _mlx_outcome("sdpa.scale.zero.float64").status == "pass"  # exp(0) = 1 exactly

    x = np.linspace(-20.0, 0.0, 20001).astype(np.float32).astype(np.float64)
    err64 = np.abs(np.array(mx.exp(mx.array(x, dtype=mx.float64))) / np.exp(x) - 1).max()
    err32 = np.abs(np.array(mx.exp(mx.array(x, dtype=mx.float32))) / np.exp(x) - 1).max()
    assert 1e-7 < err64 < 1e-5  # float64's own exp would be ~1e-16
    assert err64 == pytest.approx(err32, rel=0.05)


def test_mlx_fast_has_no_softcap_and_takes_4d_only() -> None:
    mx = _mlx()
    q = mx.zeros((1, 1, 2, 3))
    with pytest.raises(TypeError, match="incompatible function arguments"):
        mx.fast.scaled_dot_product_attention(q, q, q, scale=1.0, softcap=2.0)
    no_batch = _mlx_outcome("sdpa.shapes.no_batch.float32")
    assert no_batch.status == "xfail" and "expected to be rank 4" in no_batch.message


def test_mlx_fast_errors_are_plain_value_errors_and_masks_of_numbers_are_added() -> None:
    """Bad input raises a plain ValueError without a code; a float (or int) mask is not refused
    but added to the scores, exactly like a bias."""
    mx = _mlx()
    heads = _mlx_outcome("sdpa.error.heads_not_divisible.float32")
    assert heads.status == "xfail" and "raised ValueError[None]" in heads.message
    float_mask = _mlx_outcome("sdpa.error.mask_dtype_float.float32")
    assert float_mask.status == "xfail" and float_mask.message.startswith("no error raised")

    rng = np.random.default_rng(7)
    q, k = (mx.array(rng.standard_normal((1, 2, 3, 4)), dtype=mx.float32) for _ in range(2))
    v = mx.broadcast_to(mx.eye(3), (1, 2, 3, 3))  # value = identity: the output is the weights
    numbers = rng.integers(0, 2, size=(3, 3))  # 0/1: as a bool mask, 0 would mean "masked"
    sdpa = mx.fast.scaled_dot_product_attention
    as_int = np.array(sdpa(q, k, v, scale=0.5, mask=mx.array(numbers.astype(np.int32))))
    as_bias = np.array(sdpa(q, k, v, scale=0.5, mask=mx.array(numbers.astype(np.float32))))
    q64, k64 = (np.array(x).astype(np.float64) for x in (q, k))
    call = dict(bias=numbers.astype(np.float64), scale=0.5)
    expected = oracle.attention(q64, k64, **call).weights
    plain = oracle.attention(q64, k64, **call, round_to="float32").weights
    oracle.assert_within(as_int, expected, "float32", plain, what="an int mask: ")
    oracle.assert_within(as_bias, expected, "float32", plain, what="a float mask: ")


def test_mlx_fast_refuses_a_bias_wider_than_the_queries() -> None:
    """Contract: the bias may be any float dtype, independently of the query's. MLX refuses an
    additive mask that does not promote to the query dtype: a float32 bias with float16 or
    bfloat16 queries raises (so will the registry's mixed-dtype bias fixture)."""
    mx = _mlx()
    bias = mx.zeros((3, 5), dtype=mx.float32)
    for dtype, name in ((mx.float16, "float16"), (mx.bfloat16, "bfloat16")):
        q, k = mx.zeros((1, 2, 3, 4), dtype=dtype), mx.zeros((1, 2, 5, 4), dtype=dtype)
        with pytest.raises(ValueError, match=f"Mask type must promote to output type {name}"):
            mx.eval(mx.fast.scaled_dot_product_attention(q, k, k, scale=0.5, mask=bias))
    q, k = mx.zeros((1, 2, 3, 4)), mx.zeros((1, 2, 5, 4))  # float32: a narrower bias is taken
    out = mx.fast.scaled_dot_product_attention(q, k, k, scale=0.5, mask=bias.astype(mx.float16))
    assert out.dtype == mx.float32


def test_mlx_fast_zero_kv_heads_kill_the_process_with_sigfpe() -> None:
    """Why zero_heads is a `skip:` line: run anyway (a `!` line lifts the skip), it crashes the
    worker with SIGFPE, and the runner reports the crash and carries on."""
    _mlx()
    if platform.machine().lower() not in ("x86_64", "amd64", "i686"):
        pytest.skip("an integer division by zero traps (SIGFPE) on x86 only")
    run_id = "sdpa.error.zero_heads.float32"
    assert _mlx_outcome(run_id).status == "skip"
    report = run_suite("mlx_fast", isolate=True, pattern=run_id, xfails=Xfails.parse(f"!{run_id}"))
    (outcome,) = report.outcomes
    assert outcome.status == "crash" and "SIGFPE" in outcome.message and report.complete


# keras.ops.dot_product_attention: keras picks its backend once per process, so each backend's
# port runs in a child process of its own, once per port (the runs each test reads are in it).

_KERAS_PINNED = {
    "keras_ops": (
        "weights.basic.mha.float64",
        "weights.fully_masked.bool_row.float32",
        "weights.fully_masked.neg_inf_bias_row.float32",
        "sdpa.causal.top_left.l5_s7.float32",
        "sdpa.softcap.cap2_neg_inf_bias.float32",
    ),
    "keras_ops_torch": (
        "weights.basic.mha.float64",
        "weights.fully_masked.bool_row.float32",
        "weights.fully_masked.bool_row.float16",
        "weights.fully_masked.neg_inf_bias_row.float32",
        "sdpa.bias.with_mask.float32",
        "sdpa.mask_broadcast.s.float32",
    ),
}

_CHILD = """
import json, sys
from conformance.runner import run_suite
port, ids_file, out_file = sys.argv[1:]
ids = set(json.load(open(ids_file)))
report = run_suite(port, select=lambda run: run.id in ids)
json.dump(report.to_json(), open(out_file, "w"))
"""


@functools.cache
def _keras_report(port: str) -> Report:
    """The strict subset and the pinned runs of a keras port, run in a child process."""
    if importlib.util.find_spec("keras") is None:  # not imported here: it would fix a backend
        pytest.skip("keras is not installed (the frameworks extra)")
    with tempfile.TemporaryDirectory() as tmp:
        ids_file, out_file = Path(tmp, "ids.json"), Path(tmp, "report.json")
        ids_file.write_text(json.dumps(_subset(_KERAS_PINNED[port])))
        subprocess.run(
            [sys.executable, "-c", _CHILD, port, str(ids_file), str(out_file)],
            check=True,
            cwd=Path(__file__).resolve().parents[2],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        data = json.loads(out_file.read_text())
    outcomes = [Outcome(**o) for o in data.pop("outcomes")]
    return Report(data["port"], data["device"], outcomes, data["seconds"], data["error"])


def _keras_outcome(port: str, run_id: str) -> Outcome:
    (outcome,) = [o for o in _keras_report(port).outcomes if o.run_id == run_id]
    return outcome


@pytest.mark.parametrize("port", ["keras_ops", "keras_ops_torch"])
def test_keras_deviations_are_exactly_the_xfails(port: str) -> None:
    _check_strict(_keras_report(port))


@pytest.mark.parametrize("port", ["keras_ops", "keras_ops_torch"])
def test_keras_computes_float64_in_float32(port: str) -> None:
    """keras's dtype promotion maps float64 to float32 (outside TensorFlow): a float64 call
    returns float32."""
    outcome = _keras_outcome(port, "weights.basic.mha.float64")
    assert outcome.status == "xfail"
    assert outcome.message.startswith("weights dtype float32, expected float64")


def test_keras_on_jax_fully_masked_rows_are_uniform_or_nan_and_softcap_is_tpu_only() -> None:
    port = "keras_ops"
    uniform = _keras_outcome(port, "weights.fully_masked.bool_row.float32")
    assert uniform.status == "xfail" and "expected 0.0, got 0.14285714" in uniform.message  # 1/S
    nan = _keras_outcome(port, "weights.fully_masked.neg_inf_bias_row.float32")
    assert nan.status == "xfail" and "got nan" in nan.message
    assert _keras_outcome(port, "sdpa.causal.top_left.l5_s7.float32").status == "pass"
    softcap = _keras_outcome(port, "sdpa.softcap.cap2_neg_inf_bias.float32")
    assert softcap.status == "xfail" and "only supported for JAX on TPU" in softcap.message


def test_keras_on_torch_masks_by_a_large_negative_bias_and_refuses_mask_with_bias() -> None:
    """The torch backend turns the mask into a bias of -0.7 x the dtype's max: a fully masked
    row is uniform in float32 and, in float16 (-45850 on a grid of 32), follows how the scores
    round; a -inf bias row goes to torch's kernel as it is, and gives its zeros."""
    port = "keras_ops_torch"
    uniform = _keras_outcome(port, "weights.fully_masked.bool_row.float32")
    assert uniform.status == "xfail" and "expected 0.0, got 0.14285714" in uniform.message
    half = _keras_outcome(port, "weights.fully_masked.bool_row.float16")
    assert half.status == "xfail" and "expected 0.0, got 0.749" in half.message  # not 1/7
    assert _keras_outcome(port, "weights.fully_masked.neg_inf_bias_row.float32").status == "pass"
    both = _keras_outcome(port, "sdpa.bias.with_mask.float32")
    assert both.status == "xfail" and "Only one of `bias` and `mask`" in both.message
    one_d = _keras_outcome(port, "sdpa.mask_broadcast.s.float32")
    assert one_d.status == "xfail" and "raised IndexError" in one_d.message


# ---------------------------------------------------------------------------------------------
# docs/CONFORMANCE.md's contract v2 table, read from the xfails files
# ---------------------------------------------------------------------------------------------

#: The built-in ports of the v2 table, in its column order, and the functions each is run on
#: (the kernel ports also have flash_attention). Module and decode runs are left out: none of
#: these ports is a module.
_FAMILY_TABLE_PORTS: dict[str, tuple[str, ...]] = {
    "torch_fused": ("sdpa", "weights"),
    "jax_fused": ("sdpa", "weights"),
    "flax_nnx": ("sdpa", "weights"),
    "onnx_ref": ("sdpa", "weights"),
    "onnxruntime_attention_23": ("sdpa", "weights"),
    "onnxruntime_attention_24": ("sdpa", "weights"),
    "onnxruntime_attention": ("sdpa", "weights"),
    "onnxruntime_gqa": ("sdpa", "weights"),
    "tinygrad_sdpa": ("sdpa", "weights"),
    "mlx_fast": ("sdpa", "weights"),
    "keras_ops": ("sdpa", "weights"),
    "keras_ops_torch": ("sdpa", "weights"),
    # issue 31: torch FlexAttention and Hugging Face's attention functions
    "torch_flex": ("sdpa", "weights"),
    "torch_flex_compiled": ("sdpa", "weights"),  # measured on every sdpa and weights run
    "hf_eager": ("sdpa", "weights"),
    "hf_sdpa": ("sdpa", "weights"),
    "hf_gpt_oss_eager": ("sdpa", "weights"),
    "hf_flex": ("sdpa", "weights"),  # measured on every sdpa and weights run
    "triton_flash": ("sdpa", "weights", "flash"),
    "pallas_flash": ("sdpa", "weights", "flash"),
}
_FAMILY_TABLE_FAMILIES = ("window", "segments", "sinks", "alibi", "garbage")
#: Contract v3's token-major functions, a column each (every run of the alias), for the ports
#: that express them; the others show "-".
_V3_TABLE_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "torch_fused": ("varlen", "paged"),
    "jax_fused": ("varlen", "paged"),
    "onnx_ref": ("varlen", "paged"),
    "onnxruntime_attention_23": ("varlen", "paged"),
    "onnxruntime_attention_24": ("varlen", "paged"),
    "onnxruntime_attention": ("varlen", "paged"),
    "mlx_fast": ("varlen", "paged"),
    "torch_flex": ("varlen", "paged"),
    "triton_flash": ("varlen", "paged"),
    "pallas_flash": ("varlen", "paged"),
}
_V3_TABLE_COLUMNS = ("varlen", "paged")
#: Contract v3's fp8 column: every ``*.fp8.*`` run of the port's functions in the table (sdpa,
#: weights, and flash or varlen where the port has them).
_FP8_COLUMN = "fp8"
_PORTS_DIR = Path(__file__).resolve().parents[1] / "ports"
_DOCS = Path(__file__).resolve().parents[2] / "docs" / "CONFORMANCE.md"


def port_family_table() -> str:
    """The built-in ports (rows) against the v2 families, contract v3's ``varlen`` and
    ``paged`` functions (columns, "-" where the port has no such function) and its fp8 runs
    (``*.fp8.*`` of every function in the row): per cell, how many of the column's runs on CPU
    pass and which xfails globs list the others, with how many runs each (the reasons are in the
    port's ``.xfails`` file). A v2 rule inside another family's case
    (``flash.tiling.window_causal``) counts in that family, not here."""
    columns = (*_FAMILY_TABLE_FAMILIES, *_V3_TABLE_COLUMNS, _FP8_COLUMN)
    lines = [
        "| port | " + " | ".join(f"`{family}`" for family in columns) + " |",
        "| --- |" + " --- |" * len(columns),
    ]
    for port, functions in _FAMILY_TABLE_PORTS.items():
        v3 = _V3_TABLE_FUNCTIONS.get(port, ())
        runs = runs_for(functions=functions + v3)
        xfails = Xfails.from_file(_PORTS_DIR / f"{port}.xfails")
        cells = []
        for family in columns:
            if family in _V3_TABLE_COLUMNS and family not in v3:
                cells.append("-")
                continue
            if family == _FP8_COLUMN:
                mine = [r for r in runs if fnmatch.fnmatchcase(r.id, "*.fp8.*")]
            elif family in _V3_TABLE_COLUMNS:
                mine = [r for r in runs if r.id.startswith(f"{family}.")]
            else:
                mine = [r for r in runs if r.case.feature == family and r.function in functions]
            listed: dict[str, int] = {}
            for run in mine:
                entry = xfails.lookup(run.id, "cpu")
                if entry is not None:
                    listed[entry.pattern] = listed.get(entry.pattern, 0) + 1
            cell = f"{len(mine) - sum(listed.values())}/{len(mine)}"
            if listed:
                cell += ": " + ", ".join(f"`{p}` {n}" for p, n in listed.items())
            cells.append(cell)
        lines.append(f"| `{port}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_conformance_md_shows_the_port_family_table_of_the_xfails() -> None:
    """The table in docs/CONFORMANCE.md is :func:`port_family_table` of the xfails files (which
    the strict tests above and test_kernel_ports.py hold to the measured failures)."""
    table = port_family_table()
    assert table in _DOCS.read_text(), f"paste this table into docs/CONFORMANCE.md:\n{table}"


#: What each cheap framework port's kernel does with fp8 on CPU, measured (the xfails reasons
#: and CONFORMANCE.md's fp8 paragraph): a piece of the per-tensor run's failure. ``pip install``
#: name of the framework, then the text.
_FP8_MEASURED: dict[str, tuple[str, str]] = {
    "torch_fused": ("torch", "\"mul_cpu_reduced_float\" not implemented for 'Float8_e4m3fn'"),
    "jax_fused": ("jax", "8-bit floats do not support implicit promotion"),
    "onnx_ref": ("onnx", "> bound"),  # computed in fp8, past the kernels' bound
    "onnxruntime_attention": ("onnxruntime", "INVALID_GRAPH"),
    "tinygrad_sdpa": ("tinygrad", "> bound"),  # computed in fp8, past the kernels' bound
    "mlx_fast": ("mlx", "MLX has no float8_e4m3fn dtype"),
}


@pytest.mark.parametrize("port", sorted(_FP8_MEASURED))
def test_framework_kernels_meet_fp8_as_measured(port: str) -> None:
    """A per-tensor fp8 run reaches the kernel and fails as CONFORMANCE.md says (a kernel that
    starts taking fp8 changes the message, or XPASSes); a per-head one cannot be folded into the
    kernel's one-number scale, before the kernel."""
    framework, text = _FP8_MEASURED[port]
    pytest.importorskip(framework)
    per_tensor = "sdpa.fp8.all.scalar_descales.float8_e4m3fn"
    per_head = "sdpa.fp8.all.per_head.float8_e4m3fn"
    report = run_suite(
        f"conformance.ports.{port}", select=lambda run: run.id in (per_tensor, per_head)
    )
    status = {o.run_id: o for o in report.outcomes}
    assert status[per_tensor].status == "xfail" and text in status[per_tensor].message
    folded = "cannot be folded" if port != "mlx_fast" else text
    assert status[per_head].status == "xfail" and folded in status[per_head].message


# ---------------------------------------------------------------------------------------------
# What the frameworks' kernels get wrong, for porters (PORTING.md), from the same xfails files
# ---------------------------------------------------------------------------------------------

#: What each family of deviations means for a porter: one sentence, shown next to its count.
#: A run listed by a ``float64`` glob counts as ``float64`` (the dtype, not the case's family).
_DEVIATION_MEANING: dict[str, str] = {
    "error": "bad input answered with the framework's own exception or a silent result, not the "
    "taxonomy's error before any arithmetic: validate with `attention_spec`",
    "garbage": "NaN or inf at a key no query attends leaks into the output (`0 * inf`); select "
    "the allowed values, do not multiply by a zero weight",
    "sinks": "the per-head sink logit missing, or dropped silently; it joins each row's softmax "
    "denominator and adds no value",
    "alibi": "ALiBi's distance taken from the top-left diagonal, or the bias built in a lower "
    "precision than the scores",
    "float64": "float64 computed (or its softmax) in float32: errors near 1e-7 against a 1e-12 "
    "bound; list `*.float64`, never loosen the bound",
    "softcap": "no `tanh` soft cap of the scores (or only on some backends)",
    "causal": "one causal alignment only (top-left or bottom-right), so L != S cases fail",
    "window": "the sliding window only one-sided, off by one, or on the other diagonal",
    "mask": "a boolean mask read as a bias (or a float mask as boolean)",
    "mask_broadcast": "a mask of fewer dims than the scores not broadcast as the contract says",
    "fully_masked": "a row with no allowed key comes out uniform or NaN instead of zeros",
    "segments": "segment ids not expressible, or a query with no key of its segment not zeroed",
    "batch": "batch dims other than exactly one refused or not broadcast",
    "shapes": "E != D, L = 0 or S = 0 refused or mishandled",
    "bias": "a bias of the contract's broadcast shapes or dtypes refused",
    "hand": "a hand-computed case (scores known exactly) off",
    "gqa": "grouped heads paired `h % K` instead of in contiguous groups",
    "scale": "a zero, negative or default scale taken differently",
    "kernel": "the kernel's own tiling cases",
    "basic": "the plain call itself",
    "large_logits": "large logits overflow without the max shift",
    "saturation": "a saturated softmax (one huge score) off",
}


def deviation_counts() -> list[tuple[str, int, int]]:
    """``(family, ports, runs)`` over the ports of :data:`_FAMILY_TABLE_PORTS`: how many ports
    list at least one run of the family in their xfails (on CPU), and how many runs they list in
    all, most ports first (ties: most runs)."""
    ports: dict[str, int] = {}
    runs: dict[str, int] = {}
    for port, functions in _FAMILY_TABLE_PORTS.items():
        xfails = Xfails.from_file(_PORTS_DIR / f"{port}.xfails")
        seen = set()
        for run in runs_for(functions=functions):
            if "fp8" in run.id:  # contract v3's fp8: the table's own column, not a v2 family
                continue
            entry = xfails.lookup(run.id, "cpu")
            if entry is not None:
                family = "float64" if "float64" in entry.pattern else run.case.feature
                seen.add(family)
                runs[family] = runs.get(family, 0) + 1
        for family in seen:
            ports[family] = ports.get(family, 0) + 1
    return sorted(((f, n, runs[f]) for f, n in ports.items()), key=lambda t: (-t[1], -t[2]))


def common_deviations(top: int = 5) -> str:
    """PORTING.md's list of the ``top`` families most ports deviate in, with its counts."""
    total = len(_FAMILY_TABLE_PORTS)
    lines = []
    for i, (family, n_ports, n_runs) in enumerate(deviation_counts()[:top], 1):
        meaning = _DEVIATION_MEANING[family]
        lines.append(f"{i}. **`{family}`**, {n_ports} of {total} ports ({n_runs} runs): {meaning}.")
    return "\n".join(lines)


def test_porting_md_lists_the_most_common_deviations_of_the_xfails() -> None:
    """PORTING.md's "What the frameworks' kernels get wrong" is :func:`common_deviations` of
    the xfails files, so it changes when a port's measured deviations do."""
    assert set(_DEVIATION_MEANING) >= {f for f, _, _ in deviation_counts()}
    text = common_deviations()
    porting = (_DOCS.parents[1] / "conformance" / "PORTING.md").read_text()
    assert text in porting, f"paste this list into conformance/PORTING.md:\n{text}"
