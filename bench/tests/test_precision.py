"""IEEE float32 where the gate checks (conformance/ports/precision.py and the two fused ports):
the settings inside and after each scope, read back from the frameworks, with TF32 allowed
globally. TF32 itself only exists on a GPU; what is shown here is that the flags the GPU
kernels read are IEEE, and that JAX traces HIGHEST precision into the port's matmuls."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

from conformance.ports.precision import (  # noqa: E402
    ieee_float32,
    set_float32_matmul,
    torch_float32_state,
    torch_ieee_float32,
)


@pytest.fixture(autouse=True)
def _restore():
    saved = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.fp32_precision
    mkl = torch.backends.mkldnn.matmul.fp32_precision
    jsaved = jax.config.jax_default_matmul_precision
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cuda.matmul.fp32_precision = saved[1]
    torch.backends.mkldnn.matmul.fp32_precision = mkl
    jax.config.update("jax_default_matmul_precision", jsaved)


@pytest.mark.parametrize(
    "setup",
    [
        lambda: None,
        lambda: set_float32_matmul("on"),
        lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),  # legacy API
        lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", "tf32"),  # mixed APIs
    ],
    ids=["default", "tf32-on", "legacy-allow-tf32", "mixed-apis"],
)
def test_torch_scope_is_ieee_inside_and_restores_exactly(setup):
    setup()
    before = torch_float32_state(torch)
    with torch_ieee_float32():
        inside = torch_float32_state(torch)
    assert inside["torch.backends.cuda.matmul.fp32_precision"] == "ieee"
    assert inside["torch.get_float32_matmul_precision"] == "highest"  # consistent: no error
    assert inside["torch.backends.cuda.matmul.allow_tf32"] is False
    assert torch_float32_state(torch) == before


def test_ieee_float32_covers_jax_too():
    set_float32_matmul("on")
    with ieee_float32():
        assert jax.config.jax_default_matmul_precision == "highest"
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
    assert jax.config.jax_default_matmul_precision == "tensorfloat32"


def test_the_jax_port_traces_highest_precision_whatever_the_default():
    """Fix 1 of issue 16: jax_fused calls jax.nn.dot_product_attention with the HIGHEST
    precision in force while it is traced, so its float32 matmuls are IEEE on a GPU even under
    JAX's DEFAULT (TF32) or --tf32 on; the kernel called plainly gets no precision."""
    from conformance.ports import jax_fused

    set_float32_matmul("on")
    q = jax.numpy.ones((2, 3, 5, 8), jax.numpy.float32)
    k = jax.numpy.ones((2, 3, 7, 8), jax.numpy.float32)
    traced = str(jax.make_jaxpr(jax_fused.scaled_dot_product_attention)(q, k, k))
    assert traced.count("dot_general") == 2
    assert traced.count("precision=(Precision.HIGHEST, Precision.HIGHEST)") == 2
    plain = str(
        jax.make_jaxpr(jax.nn.dot_product_attention)(*(x.swapaxes(1, 2) for x in (q, k, k)))
    )
    assert "Precision.HIGHEST" not in plain


def test_the_torch_port_calls_sdpa_with_tf32_off(monkeypatch):
    from conformance.ports import torch_fused

    set_float32_matmul("on")
    seen = []
    real = torch_fused.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(torch.backends.cuda.matmul.fp32_precision)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_fused.F, "scaled_dot_product_attention", spy)
    q = torch.ones(2, 3, 5, 8)
    torch_fused.scaled_dot_product_attention(q, q, q)
    assert seen == ["ieee"]
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"  # the run's setting is back


def test_pinned_ports_keep_their_port_s_adapters_and_xfails():
    from conformance.ports import jax_fused, torch_fused
    from conformance.runner import load_port

    for module, pin in ((torch_fused, "flash"), (jax_fused, "cudnn")):
        port = load_port(module.pinned(pin))
        assert port.name == f"{module.__name__}[{pin}]"
        assert not port.numpy_native and port.from_numpy is module.from_numpy
        assert port.xfails.reason("sdpa.softcap.cap2_neg_inf_bias.float32", "cuda")
    with pytest.raises(ValueError, match="no SDPA backend"):
        torch_fused.pinned("tensor_cores")
