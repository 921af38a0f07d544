"""MultiHeadLatentAttention (Contract v3) in the three implementations: the forward against the
float64 oracle's own MLA, both decodes (naive KV cache, absorbed latent cache) against the
forward's rows token by token and in chunks, weights and errors identical in all three, and
Hugging Face's ``DeepseekV3Attention`` on tiny random weights (skipped without transformers).

Sizes pairwise distinct: B=2, L=9, M=17, H=3, Q=7, R=11, Dn=5, Dr=4, E=6.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import impl_jax
import impl_numpy
import impl_torch
from attention_spec import AttentionError
from conformance.oracle import mla_forward, tolerance_bound
from tests.frameworks import NP_DTYPES

jax.config.update("jax_enable_x64", True)

B, L, M, H, Q, R, Dn, Dr, E = 2, 9, 17, 3, 7, 11, 5, 4, 6
SIZES = dict(kv_lora_rank=R, qk_nope_head_dim=Dn, qk_rope_head_dim=Dr, v_head_dim=E)
SINKS = np.array([0.5, -1.0, 0.25])


def _torch(a):
    return impl_torch.modules.tensor_from_numpy(np.asarray(a)) if a is not None else None


def _np(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return impl_torch.modules.tensor_to_numpy(t)
    return np.asarray(t)


#: framework -> (module class, array from NumPy)
FRAMEWORKS = {
    "numpy": (impl_numpy.MultiHeadLatentAttention, lambda a: a),
    "torch": (impl_torch.MultiHeadLatentAttention, _torch),
    "jax": (impl_jax.MultiHeadLatentAttention, lambda a: None if a is None else jnp.asarray(a)),
}


def _weights(q_lora: int | None, dtype: str, sinks: bool = False, seed: int = 0) -> dict:
    """Random canonical weights (norm weights away from 1, so a missing norm weight shows)."""
    made = impl_numpy.MultiHeadLatentAttention(
        M, H, **SIZES, q_lora_rank=q_lora, sinks=sinks, dtype="float64", rng=seed
    ).to_canonical()
    rng = np.random.default_rng(seed + 1)
    for name in made:
        if name.endswith("layernorm.weight"):
            made[name] = rng.uniform(0.5, 1.5, made[name].shape)
    if sinks:
        made["sinks"] = SINKS
    return {n: w.astype(NP_DTYPES[dtype]) for n, w in made.items()}


def _x(dtype: str, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((B, L, M)).astype(NP_DTYPES[dtype])


#: (name, q_lora_rank, settings, call keywords)
VARIANTS = [
    ("q_proj.causal", None, {}, {"is_causal": True}),
    ("q_lora.interleaved", Q, {"rope_interleaved": True}, {"is_causal": True}),
    ("yarn.window.sinks", Q,
     {"rope_inv_freq": np.array([1.0, 0.003]), "rope_attention_factor": 1.2, "window": (3, 0),
      "scale": 0.61}, {"is_causal": True}),
    ("softcap.mask.bottom_right", None, {"softcap": 4.0},
     {"mask": np.tril(np.ones((L, L), bool), 1), "causal_alignment": "bottom_right"}),
    ("segments", None, {}, {"q_segment_ids": np.array([0] * 4 + [1] * 5),
                            "kv_segment_ids": np.array([0] * 4 + [1] * 5)}),
]  # fmt: skip


def _module(fw: str, weights: dict, settings: dict, sinks: bool = False):
    cls, _ = FRAMEWORKS[fw]
    return cls.from_canonical(weights, n_heads=H, qk_rope_head_dim=Dr, **settings)


def _call_keywords(fw: str, call: dict) -> dict:
    convert = FRAMEWORKS[fw][1]
    return {k: convert(v) if isinstance(v, np.ndarray) else v for k, v in call.items()}


@pytest.mark.parametrize("fw", FRAMEWORKS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("variant", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_forward_and_weights_equal_the_oracle(fw, dtype, variant) -> None:
    name, q_lora, settings, call = variant
    sinks = "sinks" in name
    weights, x = _weights(q_lora, dtype, sinks), _x(dtype)
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}
    oracle_settings = {k: v for k, v in settings.items()}
    golden = mla_forward(w64, x.astype(np.float64), n_heads=H, qk_rope_head_dim=Dr,
                         **oracle_settings, **call)  # fmt: skip
    plain = golden
    if dtype != "float64":
        plain = mla_forward(w64, x.astype(np.float64), n_heads=H, qk_rope_head_dim=Dr,
                            **oracle_settings, **call, round_to=dtype)  # fmt: skip
    module = _module(fw, weights, settings, sinks)
    y, w = module(FRAMEWORKS[fw][1](x), **_call_keywords(fw, call), return_weights=True)
    for got, want, plain_want in ((y, golden.output, plain.output),
                                  (w, golden.weights, plain.weights)):  # fmt: skip
        bound = tolerance_bound(want, plain_want, dtype)
        assert np.max(np.abs(_np(got).astype(np.float64) - want)) <= bound


#: JAX's eager decode compiles each step's shapes (~10 s): slow; its absorbed decode also runs
#: in the Hugging Face test below, token by token.
DECODE_FRAMEWORKS = ["numpy", "torch", pytest.param("jax", marks=pytest.mark.slow)]


@pytest.mark.parametrize("fw", DECODE_FRAMEWORKS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("cache", ["naive", "latent"])
@pytest.mark.parametrize("q_lora", [None, Q])
def test_decode_equals_the_forward_token_by_token_and_in_chunks(fw, dtype, cache, q_lora) -> None:
    """Both caches give the causal forward's rows; the latent one holds R + Dr per token."""
    settings = {"rope_interleaved": q_lora is None, "window": (4, 0), "softcap": 9.0}
    weights, x = _weights(q_lora, dtype, sinks=True), _x(dtype)
    module = _module(fw, weights, settings, sinks=True)
    convert = FRAMEWORKS[fw][1]
    full = _np(module(convert(x), is_causal=True)).astype(np.float64)
    init, step = ((module.init_kv_cache, module.decode_naive) if cache == "naive"
                  else (module.init_cache, module.decode))  # fmt: skip
    tolerance = {"float64": 1e-12, "float32": 2e-5}[dtype]
    for chunks in ([1] * L, [3, 1, 5]):
        state, rows, start = init(B, L + 2), [], 0
        for n in chunks:
            y, state = step(convert(x[:, start : start + n]), state)
            rows.append(_np(y).astype(np.float64))
            start += n
        assert np.max(np.abs(np.concatenate(rows, 1) - full)) <= tolerance
    per_token = _np(state.key).shape[1] * (_np(state.key).shape[3] + _np(state.value).shape[3])
    assert per_token == (R + Dr if cache == "latent" else H * (Dn + Dr + E))


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_the_absorbed_step_returns_the_naive_weights(fw) -> None:
    weights, x = _weights(Q, "float64"), _x("float64")
    module = _module(fw, weights, {})
    convert = FRAMEWORKS[fw][1]
    _, w_full = module(convert(x), is_causal=True, return_weights=True)
    _, w, _ = module.decode(convert(x), module.init_cache(B, L), return_weights=True)
    assert np.max(np.abs(_np(w) - _np(w_full))) <= 1e-13


def test_save_and_load_across_the_three(tmp_path) -> None:
    settings = {"rope_inv_freq": np.array([0.9, 0.01]), "rope_attention_factor": 1.1,
                "window": (2, 1), "softcap": 7.0, "scale": 0.5, "rms_norm_eps": 1e-5}  # fmt: skip
    weights, x = _weights(Q, "float64", sinks=True), _x("float64")
    want = _np(_module("numpy", weights, settings, True)(x, is_causal=True))
    for writer in FRAMEWORKS:
        path = tmp_path / f"{writer}.safetensors"
        _module(writer, weights, settings, True).save(path)
        for reader, (cls, convert) in FRAMEWORKS.items():
            got = _np(cls.load(path)(convert(x), is_causal=True))
            assert np.max(np.abs(got - want)) <= 1e-13, (writer, reader)


def _raised(fn) -> tuple[str, str, str]:
    with pytest.raises(AttentionError) as info:
        fn()
    return type(info.value).__name__, info.value.code, str(info.value)


@pytest.mark.parametrize(
    "build, code",
    [
        (lambda cls: cls(M, H, **(SIZES | {"qk_rope_head_dim": 5})), "mla_dims"),
        (lambda cls: cls(M, H, **(SIZES | {"kv_lora_rank": 0})), "mla_dims"),
        (lambda cls: cls(M, H, **SIZES, q_lora_rank=-2), "mla_dims"),
        (lambda cls: cls(M, H, **SIZES, rms_norm_eps=0.0), "mla_dims"),
        (lambda cls: cls(M, H, **SIZES, rope_inv_freq=np.ones(3)), "inv_freq_shape"),
        (lambda cls: cls(M, H, **SIZES, rope_attention_factor=-1.0), "attention_factor"),
        (lambda cls: cls.from_canonical(
            {**_weights(None, "float32"),
             "kv_b_proj.kernel": _weights(None, "float32")["kv_b_proj.kernel"].T},
            n_heads=H, qk_rope_head_dim=Dr), "weight_shape"),
        (lambda cls: cls.from_canonical(
            {k: v for k, v in _weights(Q, "float32").items() if k != "q_a_layernorm.weight"},
            n_heads=H, qk_rope_head_dim=Dr), "weight_shape"),
    ],
)  # fmt: skip
def test_errors_are_identical_in_all_three(build, code) -> None:
    raised = {fw: _raised(lambda c=cls: build(c)) for fw, (cls, _) in FRAMEWORKS.items()}
    assert len(set(raised.values())) == 1, raised
    assert raised["numpy"][1] == code


def test_a_cache_of_the_other_kind_is_refused() -> None:
    module = impl_numpy.MultiHeadLatentAttention(M, H, **SIZES)
    x = _x("float32")[:, :1]
    _, code, message = _raised(lambda: module.decode(x, module.init_kv_cache(B, 4)))
    assert code == "cache_mismatch" and "K=1" in message
    _, code, _ = _raised(lambda: module.decode_naive(x, module.init_cache(B, 4)))
    assert code == "cache_mismatch"
    _, code, _ = _raised(lambda: module.decode(_x("float32")[:, :5], module.init_cache(B, 4)))
    assert code == "cache_overflow"


# -- Hugging Face's DeepseekV3Attention ----------------------------------------------------------


def _hf_layer(q_lora, interleave: bool, yarn: bool):
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if yarn:
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.707,
                "mscale_all_dim": 0.707, "original_max_position_embeddings": 4,
                "beta_fast": 32.0, "beta_slow": 1.0}  # fmt: skip
    config = transformers.DeepseekV3Config(
        hidden_size=M, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=q_lora,
        kv_lora_rank=R, qk_nope_head_dim=Dn, qk_rope_head_dim=Dr, v_head_dim=E,
        rope_interleave=interleave, rope_parameters=rope, attention_bias=False,
        max_position_embeddings=64, rms_norm_eps=1e-6,
    )  # fmt: skip
    config._attn_implementation = "sdpa"  # eager runs its softmax in float32
    torch.manual_seed(0)
    layer = hf.DeepseekV3Attention(config, layer_idx=0).double().eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("layernorm.weight"):
                p.uniform_(0.5, 1.5)
    for norm in (layer.q_a_layernorm, layer.kv_a_layernorm):
        if norm is not None:  # HF's norm runs in float32 even for float64: its formula in float64
            norm.forward = _float64_norm(norm)
    return config, layer, hf.DeepseekV3RotaryEmbedding(config).double()


def _float64_norm(norm):
    def forward(h: torch.Tensor) -> torch.Tensor:
        return norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))

    return forward


def _from_hf(layer, rotary, yarn: bool) -> tuple[dict, dict]:
    """Canonical weights ((in, out) kernels) and the module settings of a HF layer, the scale
    from the contract's formula (checked against the layer's own)."""
    weights = {}
    for name, p in layer.state_dict().items():
        key = name.replace(".weight", ".kernel") if "layernorm" not in name else name
        weights[key] = p.detach().numpy().T.copy() if key.endswith(".kernel") else p.numpy()
    settings = {"rope_interleaved": layer.config.rope_interleave,
                "rope_inv_freq": rotary.inv_freq.double().numpy(),
                "rope_attention_factor": float(rotary.attention_scaling)}  # fmt: skip
    if yarn:
        mscale = 0.1 * 0.707 * math.log(4.0) + 1.0
        settings["scale"] = (Dn + Dr) ** -0.5 * mscale**2
        assert abs(settings["scale"] - layer.scaling) <= 1e-15
    return weights, settings


def _hf_rope(rotary, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``(cos, sin)`` in float64 from the layer's own ``inv_freq`` and attention scaling
    (its rotary module computes the angles in float32, a 1e-7 difference that is not MLA's)."""
    freqs = positions[..., None].double() * rotary.inv_freq.double()  # (B, L, Dr/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (B, L, Dr)
    return emb.cos() * rotary.attention_scaling, emb.sin() * rotary.attention_scaling


@pytest.mark.parametrize("q_lora", [None, Q])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("yarn", [False, True])
def test_hugging_face_deepseek_v3_attention_agrees(q_lora, interleave, yarn) -> None:
    """The HF layer in float64, causal, and our three modules from its weights: forward, and a
    generation of several steps with HF's cache against our absorbed decode."""
    config, layer, rotary = _hf_layer(q_lora, interleave, yarn)
    weights, settings = _from_hf(layer, rotary, yarn)
    x = _x("float64")
    xt = torch.tensor(x)
    positions = torch.arange(L)[None].expand(B, L)
    causal = torch.full((L, L), -torch.inf, dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        want, _ = layer(xt, _hf_rope(rotary, positions), causal)
        from transformers import DynamicCache

        hf_cache, steps = DynamicCache(config=config), []
        for t in range(L):
            out, _ = layer(xt[:, t : t + 1], _hf_rope(rotary, positions[:, t : t + 1]), None,
                           cache=hf_cache)  # fmt: skip
            steps.append(out.numpy())
    want, hf_steps = want.numpy(), np.concatenate(steps, 1)
    assert np.max(np.abs(hf_steps - want)) <= 1e-12  # HF's own cache against its forward
    for fw, (cls, convert) in FRAMEWORKS.items():
        module = cls.from_canonical(weights, n_heads=H, qk_rope_head_dim=Dr, **settings)
        assert np.max(np.abs(_np(module(convert(x), is_causal=True)) - want)) <= 1e-12, fw
        cache, ours = module.init_cache(B, L), []
        for t in range(L):
            y, cache = module.decode(convert(x[:, t : t + 1]), cache)
            ours.append(_np(y))
        assert np.max(np.abs(np.concatenate(ours, 1) - hf_steps)) <= 1e-12, fw
