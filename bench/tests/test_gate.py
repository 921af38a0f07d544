"""The correctness gate (bench/gate.py): pass, fail, error, cached once; IEEE float32 and
x64 inside it whatever the run's settings; pinned rows gated on their own kernel."""

from __future__ import annotations

import sys

import pytest

from bench.gate import GateCache, gate_scope, gate_text, kernel_case, run_gate

from .helpers import stub


def test_gate_passes_fails_and_errors():
    qc, calls = stub(True, 8)
    g = run_gate("impl_numpy", "sdpa", "cpu", quick_check=qc)
    assert (g.status, g.ok, gate_text(g.to_dict())) == ("passed", True, "8/8 ok")
    assert calls == [("impl_numpy", "cpu", "sdpa", 8)]

    qc, _ = stub(False, 8, ["FAIL sdpa.gqa.h6_k2.float32 [cpu float32]: max error 0.3"])
    g = run_gate("impl_numpy", "sdpa", "cpu", quick_check=qc)
    assert (g.status, g.ok, g.n_failed) == ("failed", False, 1)
    assert "sdpa.gqa.h6_k2" in g.detail and gate_text(g.to_dict()) == "FAIL 1/8"

    qc, _ = stub(True, 0)  # a gate that checked nothing is not a pass
    assert run_gate("impl_numpy", "sdpa", "cpu", quick_check=qc).status == "error"
    qc, _ = stub(True, 8, raises=KeyError("manifest"))
    g = run_gate("impl_numpy", "sdpa", "cpu", quick_check=qc)
    assert g.status == "error" and "KeyError" in g.detail
    g = run_gate("impl_nowhere", "sdpa", "cpu", quick_check=stub(True, 8)[0])
    assert g.status == "error" and "impl_nowhere" in g.detail


def test_gate_cache_runs_once_per_port_op_device_and_pin():
    qc, calls = stub(True, 8)
    cache = GateCache(quick_check=qc)
    for _ in range(3):
        cache.check("impl_numpy", "sdpa", "cpu")
    cache.check("impl_numpy", "flash", "cpu")
    assert len(calls) == 2
    skip = GateCache(skip=True, quick_check=qc)
    assert gate_text(skip.check("impl_numpy", "sdpa", "cpu").to_dict()) == "ungated"
    assert skip.check("conformance.ports.torch_fused", "sdpa", "cpu", "flash").pin == "flash"
    assert len(calls) == 2


@pytest.fixture
def tf32_everywhere():
    """``--tf32 on`` in both frameworks, put back afterwards."""
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    from bench.devices import set_tf32

    saved = torch.get_float32_matmul_precision(), jax.config.jax_default_matmul_precision
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    set_tf32("on")
    yield torch, jax
    torch.set_float32_matmul_precision(saved[0])
    jax.config.update("jax_default_matmul_precision", saved[1])
    jax.config.update("jax_enable_x64", x64)


def test_the_gate_runs_in_ieee_float32_with_x64_whatever_the_run_says(tf32_everywhere):
    """Fix 1, 2 and 6 of issue 16: under ``--tf32 on`` the gate still sees torch's TF32 off
    and JAX at HIGHEST, and x64 on; after it, the run's own settings are back."""
    torch, jax = tf32_everywhere
    seen = {}

    def inside(port):
        seen["torch"] = torch.backends.cuda.matmul.fp32_precision
        seen["legacy"] = torch.get_float32_matmul_precision()  # never the mixed-API error
        seen["jax"] = jax.config.jax_default_matmul_precision
        seen["x64"] = jax.config.jax_enable_x64

    g = run_gate("impl_numpy", "sdpa", "cpu", quick_check=stub(True, 8, seen=inside)[0])
    assert g.ok
    assert seen == {"torch": "ieee", "legacy": "highest", "jax": "highest", "x64": True}
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.get_float32_matmul_precision() == "high"
    assert jax.config.jax_default_matmul_precision == "tensorfloat32"
    assert jax.config.jax_enable_x64 is False


def test_importing_the_jax_adapter_in_a_gate_leaves_the_rows_x64_alone():
    """conformance's JAX adapter turns x64 on when imported; a real gate that imports it
    (jax_fused) hands the rows back the x64 state the run started with."""
    jax = pytest.importorskip("jax")
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        g = run_gate("conformance.ports.jax_fused", "sdpa", "cpu", n_cases=2)
        assert g.status == "passed" and g.n_run == 2
        assert jax.config.jax_enable_x64 is False
    finally:
        jax.config.update("jax_enable_x64", before)


def test_gate_scope_without_jax_pins_torch_and_leaves_jax_alone(monkeypatch):
    """Where JAX does not import, the gate's scope leaves x64 alone (it cannot see it) and
    still runs torch's float32 matmuls in IEEE inside the block, the run's setting back after."""
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    saved = torch.get_float32_matmul_precision(), jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    torch.set_float32_matmul_precision("high")  # --tf32 on
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` now raises ImportError
    try:
        with gate_scope():
            inside = torch.get_float32_matmul_precision(), jax.config.jax_enable_x64
        after = torch.get_float32_matmul_precision()
    finally:
        torch.set_float32_matmul_precision(saved[0])
        jax.config.update("jax_enable_x64", saved[1])
    assert inside == ("highest", False) and after == "high"


def test_the_kernel_fixtures_reach_the_fused_kernels_and_the_smallest_do_not():
    """The 8 smallest fixtures (the default gate) are float32/float64 with D = 11 or 2: none
    is a case a GPU fused kernel takes; the kernel fixtures are, in float16 and bfloat16."""
    from conformance import load_manifest

    cases = load_manifest().cases
    chosen = [c for c in cases if kernel_case(c)]
    assert {c.dtype for c in chosen} == {"float16", "bfloat16"}
    assert {c.feature for c in chosen} == {"kernel"} and len(chosen) == 6
    for c in chosen:
        q, v = c.entry["shapes"]["query"], c.entry["shapes"]["value"]
        assert q[-1] == v[-1] and q[-1] % 8 == 0
    values = [c for c in cases if c.kind == "values" and "sdpa" in c.functions]
    nonempty = [c for c in values if c.entry["shapes"]["output"][-2] > 0]
    smallest = sorted(nonempty, key=lambda c: c.n_elements)[:8]
    assert not any(kernel_case(c) for c in smallest)


@pytest.mark.parametrize(
    ("pin", "status"),
    [
        ("flash", "passed"),
        ("math", "passed"),
        ("efficient", "unsupported"),
        ("cudnn", "unsupported"),
    ],
)
def test_a_pinned_torch_backend_is_gated_on_its_own_kernel(pin, status, monkeypatch):
    """On CPU torch has flash and math kernels, and none for efficient or cuDNN: a pinned gate
    passes on the first two and is *unsupported* (torch's own "no kernel"), not failed, on
    the others. Every call of the pinned port ran under sdpa_kernel([that backend])."""
    pytest.importorskip("torch")
    from torch.nn.attention import _cur_sdpa_kernel_backends

    from conformance.ports import torch_fused

    backends = []
    real = torch_fused.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        backends.append(tuple(_cur_sdpa_kernel_backends()))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_fused.F, "scaled_dot_product_attention", spy)
    g = run_gate("conformance.ports.torch_fused", "sdpa", "cpu", pin=pin)
    assert (g.status, g.pin, g.n_run) == (status, pin, 6)
    assert g.n_failed == 0
    assert backends and set(backends) == {(torch_fused.BACKENDS[pin],)}
    if status == "unsupported":
        assert g.n_unsupported == 6 and gate_text(g.to_dict()) == "unsupported" and not g.ok


def test_jax_cudnn_s_failures_that_are_not_its_own_no_are_failures():
    """JAX's cuDNN attention on a machine without cuDNN raises "cuDNN is not detected": not
    one of JAX's own "not supported" checks, so the pinned gate fails instead of hiding it."""
    pytest.importorskip("jax")
    g = run_gate("conformance.ports.jax_fused", "sdpa", "cpu", pin="cudnn")
    assert g.status == "failed" and g.n_failed == g.n_run == 6
    assert "cuDNN is not detected" in g.detail
