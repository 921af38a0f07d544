"""The preparers (bench/preparers.py): each call style's wiring against the float64 oracle
(``conformance/oracle.py``) under its tolerance rule, the decode and training steps, and the
kernels' "not supported" (bench/errors.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bench import errors, frameworks, preparers
from bench.gate import GateCache
from bench.plan import Plan, build_cases
from bench.rows import ROWS, Row, row_by_name
from bench.session import BenchSession
from bench.workloads import Workload
from conformance.oracle import attention, attention_vjp, linear, module_forward

from .helpers import B, D, E, FakeBenchmark, H, K, L, S, assert_within_bound, machine, stub, to_np


def _assert_sdpa(out, q, k, v, *, is_causal: bool) -> None:
    """A float32 row's ``out (B, H, L, E)`` of heads-first ``q, k, v``: the oracle's attention
    of its inputs, within the float32 bound."""
    q, k, v = to_np(q), to_np(k), to_np(v)
    golden = attention(q, k, v, is_causal=is_causal).output
    plain = attention(q, k, v, is_causal=is_causal, round_to="float32").output
    assert_within_bound(out, golden, plain, "float32")


def test_every_call_style_has_a_preparer():
    assert {r.call for r in ROWS} <= set(preparers.PREPARERS)
    ghost = Row("numpy ghost", "impl_numpy.functional:scaled_dot_product_attention", "nope")
    with pytest.raises(ValueError, match="unknown call style 'nope'"):
        preparers.prepare(ghost, Workload("attention", B, H, K, L, S, D, E), "cpu")


# the CPU rows, and torch's math and flash SDPA backends, which torch also has on CPU
_FUNCTIONAL = [
    r.name
    for r in ROWS
    if r.workloads == "attention"
    and ("cpu" in r.devices or (r.call == "torch_sdpa" and r.backend in ("math", "flash")))
]


@pytest.mark.parametrize("name", _FUNCTIONAL)
def test_runner_wiring_matches_the_oracle(name):
    row = row_by_name(name)
    if row.framework in ("torch", "jax"):
        pytest.importorskip(row.framework)
    # jax.nn.dot_product_attention and torch's pinned CPU flash kernel need E == D
    e = D if row.call == "jax_dpa" or row.backend else E
    w = Workload("attention", B, H, K, L, S, D, e, True, "float32")
    p = preparers.prepare(row, w, "cpu")
    out = to_np(p.call())
    q, k, v = p.inputs
    if p.layout == "heads_second":  # (B, L, H, D) -> (B, H, L, D)
        q, k, v = (np.swapaxes(to_np(x), 1, 2) for x in (q, k, v))
        out = np.swapaxes(out, 1, 2)
    assert out.shape == (B, H, L, e)
    _assert_sdpa(out, q, k, v, is_causal=True)


@pytest.mark.parametrize("name", ["triton flash", "pallas flash"])
def test_kernel_port_rows_are_wired_under_the_cpu_interpreter(name):
    """The CUDA-only kernel rows, prepared here on a CPU with a tiny workload (Triton's
    interpreter on torch tensors, Pallas's on JAX arrays under jit): the runner builds their
    inputs in the kernel's framework and its callable computes causal GQA attention."""
    row = row_by_name(name)
    pytest.importorskip("triton" if row.framework == "torch" else "jax")
    w = Workload("attention", B, H, K, L, S, D, E, True, "float32")
    p = preparers.prepare(row, w, "cpu")
    q, k, v = p.inputs
    framework = pytest.importorskip(row.framework)
    array = framework.Tensor if row.framework == "torch" else framework.Array
    assert all(isinstance(x, array) for x in (q, k, v))
    assert p.layout == "heads_first" and (p.compile_s is None) == (row.framework == "torch")
    _assert_sdpa(p.call(), q, k, v, is_causal=True)


_MODULES = [r.name for r in ROWS if r.workloads == "module" and "cpu" in r.devices]


@pytest.mark.parametrize("name", _MODULES)
def test_module_rows_are_causal_when_asked(name):
    """Changing the last position's input changes no earlier output under is_causal, to the
    bit: a masked key's weight is exactly zero."""
    row = row_by_name(name)
    pytest.importorskip(row.framework)
    w = Workload("module", 2, 6, 3 if "GQA" in row.variants else 6, 5, 5, 7, 7, True)
    p = preparers.prepare(row, w, "cpu")
    before = to_np(p.call())
    assert before.shape == (w.B, w.L, w.M) and np.isfinite(before).all()
    x = p.inputs[-1]
    if hasattr(x, "at"):  # jax: replace the array the compiled call reads
        p.inputs[-1] = x.at[:, -1].add(1.0)
    else:
        x[:, -1] += 1.0
    after = to_np(p.call())
    np.testing.assert_array_equal(after[:, :-1], before[:, :-1])
    assert np.abs(after[:, -1] - before[:, -1]).max() > 1e-4


@pytest.mark.parametrize("name", [n for n in _MODULES if row_by_name(n).kind == "impl"])
def test_project_module_rows_compute_the_oracle_s_module(name):
    """The project's module rows, from the module's canonical weights: the oracle's causal
    module (``module_forward``) within the float32 bound, MHA and GQA 6:3."""
    row = row_by_name(name)
    pytest.importorskip(row.framework)
    n_kv = 3 if "GQA" in row.variants else 6
    w = Workload("module", 2, 6, n_kv, 5, 5, 7, 7, True)
    p = preparers.prepare(row, w, "cpu")
    weights = {k: to_np(a) for k, a in p.module.to_canonical().items()}
    x = to_np(p.inputs[-1])  # (B, L, M)
    golden, plain = (
        module_forward(weights, x, n_heads=6, n_kv_heads=n_kv, is_causal=True, round_to=dtype)
        for dtype in (None, "float32")
    )
    assert_within_bound(p.call(), golden.output, plain.output, "float32")


def test_torch_nn_mha_runs_fused_sdpa_with_is_causal_never_a_masked_softmax(monkeypatch):
    """Fix 5 of issue 16: the row is registered as skipping masked blocks and not building the
    scores; its call must then reach F.sdpa with is_causal=True and no mask, not the fast
    path's _masked_softmax over full (B, H, L, S) scores."""
    torch = pytest.importorskip("torch")
    from torch.profiler import profile

    row = row_by_name("torch nn.MHA")
    assert row.skips_masked and not row.materializes
    w = Workload("module", 1, 4, 4, 64, 64, 8, 8, True)
    p = preparers.prepare(row, w, "cpu")
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *args, **kwargs):
        calls.append((attn_mask, is_causal))
        return real(q, k, v, attn_mask, dropout_p, is_causal, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    p.call()
    assert calls == [(None, True)]
    assert torch.backends.mha.get_fastpath_enabled()  # the global switch is put back
    monkeypatch.undo()
    with profile() as prof:
        p.call()
    names = {e.name for e in prof.events()}
    assert "aten::scaled_dot_product_attention" in names
    assert not {"aten::_masked_softmax", "aten::_native_multi_head_attention"} & names


# ----------------------------------------------------------------------------------- decode


def _numpy_of(x) -> np.ndarray:
    return np.array(to_np(x))  # a copy: the JAX step donates (deletes) the arrays it is given


def _last_token(module, x: np.ndarray, **options) -> np.ndarray:
    """The oracle's causal self-attention module (``module_forward``) from ``module``'s
    canonical weights, on ``x (B, P + 1, M)``: its last token's output ``(B, 1, M)``."""
    weights = {name: to_np(a) for name, a in module.to_canonical().items()}
    golden = module_forward(weights, x, n_heads=_DH, n_kv_heads=_DK, is_causal=True, **options)
    return golden.output[:, -1:]


def _assert_float64(got, golden: np.ndarray) -> None:
    """A float64 step against the oracle: the float64 bound (its plain computation is the
    oracle itself, so the bound is the noise floor)."""
    assert_within_bound(got, golden, golden, "float64")


_DECODE_ROWS = [r.name for r in ROWS if r.workloads == "decode"]
_DECODE_IMPL = [n for n in _DECODE_ROWS if row_by_name(n).kind == "impl"]
# decode sizes, pairwise distinct: B=2, H=6, K=3, P=7 cached tokens (S=8), D=E=5, M=30
_DB, _DH, _DK, _DP, _DD = 2, 6, 3, 7, 5


def _decode_row(name: str, dtype: str = "float32") -> tuple[Row, Workload]:
    row = row_by_name(name)
    pytest.importorskip(row.framework)
    return row, Workload("decode", _DB, _DH, _DK, 1, _DP + 1, _DD, _DD, False, dtype)


@pytest.fixture
def x64():
    """JAX computes float64 only with x64 on (the benchmark's own rows never need it)."""
    jax = pytest.importorskip("jax")
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


@pytest.mark.parametrize("name", _DECODE_IMPL)
def test_decode_row_is_the_last_row_of_the_causal_forward(name, x64):
    """The timed decode step, from a cache prefilled with P tokens, gives the last row of the
    oracle's float64 causal module over the P + 1 tokens (from the module's canonical weights);
    repeated rounds are the same step at the same position."""
    row, w = _decode_row(name, "float64")
    p = preparers.prepare(row, w, "cpu")
    m, x_new = p.module, p.inputs[-2]
    prefix = np.random.default_rng(3).standard_normal((_DB, _DP, w.M))  # (B, P, M) float64
    if row.framework == "torch":
        import torch

        with torch.no_grad():
            _, cache = m.decode(torch.from_numpy(prefix), m.init_cache(_DB, _DP + 1))
    else:
        to = np.asarray if row.framework == "numpy" else __import__("jax.numpy").numpy.asarray
        _, cache = m.decode(to(prefix), m.init_cache(_DB, _DP + 1))
    assert cache.position == _DP
    p.inputs[-1] = cache  # the call reads its cache from its inputs
    cached = _numpy_of(cache.key)[:, :, :_DP]
    expected = _last_token(m, np.concatenate([prefix, to_np(x_new)], axis=1))  # (B, 1, M)
    outs = [_numpy_of(p.call()) for _ in range(3)]
    assert outs[0].shape == (_DB, 1, w.M)
    _assert_float64(outs[0], expected)
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])  # the same step, bit for bit
    after = p.inputs[-1]
    assert after.position == _DP  # never advanced by the timed calls
    np.testing.assert_array_equal(_numpy_of(after.key)[:, :, :_DP], cached)


@pytest.mark.parametrize("name", _DECODE_IMPL)
def test_rolling_decode_row_steps_a_ring_of_the_window(name, x64):
    """A decode workload with a window W: the module has ``window=(W, 0)``, its cache is a
    rolling ring of W + 1 slots at position P (whatever P), and the timed step, from a ring
    prefilled with P tokens, gives the last row of the oracle's windowed causal module over the
    P + 1 tokens; repeated rounds are the same step at the same position."""
    row, plain = _decode_row(name, "float64")
    w = dataclasses.replace(plain, window=2)
    assert w.slots == 3 and w.cache_bytes() == 3 / (_DP + 1) * plain.cache_bytes()
    p = preparers.prepare(row, w, "cpu")
    m, x_new, ring = p.module, p.inputs[-2], p.inputs[-1]
    assert ring.rolling and ring.slots == 3 and ring.position == _DP
    prefix = np.random.default_rng(4).standard_normal((_DB, _DP, w.M))  # (B, P, M) float64
    full = np.concatenate([prefix, to_np(x_new)], axis=1)  # (B, P + 1, M)
    if row.framework == "torch":
        import torch

        with torch.no_grad():
            _, cache = m.decode(torch.from_numpy(prefix), m.init_cache(_DB, _DP + 1, rolling=True))
    else:
        to = np.asarray if row.framework == "numpy" else __import__("jax.numpy").numpy.asarray
        _, cache = m.decode(to(prefix), m.init_cache(_DB, _DP + 1, rolling=True))
    assert cache.position == _DP and cache.slots == 3
    p.inputs[-1] = cache  # the call reads its cache from its inputs
    outs = [_numpy_of(p.call()) for _ in range(3)]
    _assert_float64(outs[0], _last_token(m, full, window=(2, 0)))
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])  # the same step, bit for bit
    assert p.inputs[-1].position == _DP


@pytest.mark.parametrize("name", [n for n in _DECODE_ROWS if n not in _DECODE_IMPL])
def test_decode_baselines_match_a_float64_step(name):
    """The framework decode step (projections, cache write at P, fused attention of one query
    over the S = P + 1 keys, output projection) against the oracle's projections
    (``oracle.linear``) and attention, within the float32 bound of the same steps rounded to
    float32."""
    row, w = _decode_row(name)
    p = preparers.prepare(row, w, "cpu")
    params, x, ck, cv = p.inputs
    x, ck, cv = _numpy_of(x), _numpy_of(ck), _numpy_of(cv)
    wq, bq, wk, bk, wv, bv, wo, bo = (to_np(a) for a in params)
    if p.layout == "decode_heads_second":  # (B, S, K, D) -> (B, K, S, D)
        ck, cv = np.swapaxes(ck, 1, 2), np.swapaxes(cv, 1, 2)

    def heads(y, n):  # (B, 1, n*D) -> (B, n, 1, D)
        return y.reshape(_DB, 1, n, _DD).transpose(0, 2, 1, 3)

    def step(round_to):  # -> (B, 1, M)
        k = np.concatenate([ck[:, :, :_DP], heads(linear(x, wk, bk, round_to), _DK)], axis=2)
        v = np.concatenate([cv[:, :, :_DP], heads(linear(x, wv, bv, round_to), _DK)], axis=2)
        q = heads(linear(x, wq, bq, round_to), _DH)  # (B, H, 1, D) against (B, K, S, D)
        out = attention(q, k, v, round_to=round_to).output  # (B, H, 1, E)
        return linear(out.transpose(0, 2, 1, 3).reshape(_DB, 1, _DH * _DD), wo, bo, round_to)

    outs = [_numpy_of(p.call()) for _ in range(3)]
    assert_within_bound(outs[0], step(None), step("float32"), "float32")
    for y in outs[1:]:
        np.testing.assert_array_equal(y, outs[0])


def test_timed_decode_rounds_leave_the_cache_at_its_position(monkeypatch):
    """Through the session (warm-up, memory, pytest-benchmark rounds): every round decodes
    at position P, and the cache the call holds is still at P afterwards."""
    row, w = _decode_row("numpy decode")
    prepared = []
    real = preparers.prepare
    monkeypatch.setattr(preparers, "prepare", lambda *a: prepared.append(real(*a)) or prepared[-1])
    cases = build_cases(machine("cpu"), [w], (row,))
    gates = GateCache(quick_check=stub(True, 8)[0])
    session = BenchSession(Plan(machine("cpu"), "test", [w], (row,), cases), gates=gates)
    (case,) = [c for c in cases if c.kind == "row"]
    p_seen = []
    decode = row.resolve().decode
    monkeypatch.setattr(
        row.resolve(), "decode", lambda self, x, cache: p_seen.append(cache.position)
        or decode(self, x, cache)
    )
    bench = FakeBenchmark(min_rounds=4)
    session.run_case(case, bench)
    assert session.records[case.id].status == "ok" and bench.calls == 4
    assert p_seen == [_DP] * (1 + 4)  # the memory call (the host warm-up) and four rounds
    assert prepared[0].inputs[-1].position == _DP


# ----------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("name", ["torch F.sdpa[efficient]", "torch F.sdpa[cudnn]"])
def test_a_backend_without_a_kernel_is_unsupported_not_failed(name):
    pytest.importorskip("torch")
    w = Workload("attention", B, H, K, L, S, D, E, True)
    with pytest.raises(errors.UnsupportedError):  # torch has no such kernel on CPU
        preparers.prepare(row_by_name(name), w, "cpu")


def test_errors_are_unsupported_only_in_the_kernel_s_own_words():
    """Fix 8 of issue 16: only the kernel's own "not supported" is unsupported; a cuDNN
    library failure, or anything from a row that is not pinned to a kernel, is an error."""
    c = errors.classify_error
    assert c(errors.UnsupportedError("no kernel")) == "unsupported"
    assert c(MemoryError()) == "oom"
    assert c(RuntimeError("CUDA out of memory. Tried to")) == "oom"
    assert c(RuntimeError("RESOURCE_EXHAUSTED: while")) == "oom"
    assert c(ValueError("bad")) == "error"
    no_kernel = RuntimeError("No available kernel. Aborting execution.")
    no_plan = RuntimeError(
        "cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph."
    )
    assert c(no_kernel, "torch_sdpa") == c(no_plan, "torch_sdpa") == "unsupported"
    assert c(RuntimeError("No valid execution plans built."), "torch_sdpa") == "unsupported"
    assert c(no_kernel) == "error"  # torch's own dispatch always has a kernel
    head_dim = NotImplementedError("The head dim must be <= 256 and a multiple of 8, but got 12.")
    dtype = NotImplementedError("Q must be fp16/bf16/fp8_e4m3fn/fp8_e5m2, got float32")
    assert c(head_dim, "jax_cudnn") == c(dtype, "jax_cudnn") == "unsupported"
    for broken in (
        RuntimeError("cuDNN is not detected."),
        RuntimeError("INTERNAL: CUDNN_STATUS_EXECUTION_FAILED"),
        ValueError("The number of query heads must be a multiple of key/value heads"),
    ):
        assert c(broken, "jax_cudnn") == "error"
    assert c(head_dim, "torch_sdpa") == "error"  # another kernel's words are not this one's


def test_jax_cudnn_is_unsupported_only_where_jax_s_own_checks_say_so(monkeypatch):
    """With cuDNN's version check stood in for, JAX's real applicability checks run on this
    CPU: float32 is refused by them (unsupported); bfloat16 at D = 16 passes them and then
    fails to compile on a machine without cuDNN, which is an error, not unsupported."""
    pytest.importorskip("jax")
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa
    except ImportError:
        pytest.skip("this JAX has no jax._src.cudnn.fused_attention_stablehlo")
    if not hasattr(fa, "check_cudnn_version"):
        pytest.skip("this JAX checks cuDNN differently")
    monkeypatch.setattr(fa, "check_cudnn_version", lambda: 91000)
    row = row_by_name("jax.nn.dpa[cudnn]")
    f32 = Workload("attention", 1, 2, 2, 8, 8, 16, 16, False, "float32")
    with pytest.raises(errors.UnsupportedError, match="fp16/bf16"):
        preparers.prepare(row, f32, "cpu")
    bf16 = Workload("attention", 1, 2, 2, 8, 8, 16, 16, False, "bfloat16")
    with pytest.raises(Exception) as info:
        preparers.prepare(row, bf16, "cpu")
    assert not isinstance(info.value, errors.UnsupportedError)
    assert errors.classify_error(info.value, row.kernel) == "error"


# ------------------------------------------------------------------------------ training steps

_TRAIN = [r.name for r in ROWS if r.workloads == "train" and "cpu" in r.devices]


@pytest.mark.parametrize("name", _TRAIN)
def test_training_step_rows_return_the_oracle_s_gradients(name):
    """Each training-step row returns (dQ, dK, dV) of its own inputs and grad_output, as the
    float64 oracle's backward derives them (GQA 6:2, causal, D != E where the kernel allows),
    within the float32 bound of the oracle's backward rounded to float32."""
    row = row_by_name(name)
    if row.framework in ("torch", "jax"):
        pytest.importorskip(row.framework)
    e = D if row.call in ("jax_dpa_train", "torch_sdpa_train") else E
    w = Workload("train", 1, H, K, L, S, D, e, True, "float32")
    p = preparers.prepare(row, w, "cpu")
    grads = [to_np(g) for g in p.call()[:3]]
    q, k, v, do = (to_np(x) for x in p.inputs)
    if p.layout == "train_heads_second":  # (B, L, H, D) -> (B, H, L, D)
        q, k, v, do, *grads = (np.swapaxes(x, 1, 2) for x in (q, k, v, do, *grads))
    golden = attention_vjp(q, k, v, do, is_causal=True)
    plain = attention_vjp(q, k, v, do, is_causal=True, round_to="float32")
    for field in ("query", "key", "value"):
        assert_within_bound(grads.pop(0), getattr(golden, field), getattr(plain, field), "float32")


def test_training_step_memory_is_counted_beyond_output_and_gradients(monkeypatch):
    """The probe's peak less the bytes of O, dQ, dK, dV (Workload.result_bytes)."""
    w = Workload("train", 1, H, K, L, S, D, E)
    n = B * H * L * (D + E) + B * K * S * (D + E)
    assert w.result_bytes() == (H * L * (D + E) + K * S * (D + E)) * 4 != n * 4
    monkeypatch.setattr(frameworks, "peak_memory_numpy", lambda fn: (w.result_bytes() + 123, "t"))
    p = preparers.prepare(row_by_name("numpy flash train"), w, "cpu")
    assert p.memory() == (123, "t - O, grads")
