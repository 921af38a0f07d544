"""MultiHeadLatentAttention (Contract v3) in the three implementations: the forward against the
float64 oracle's own MLA, both decodes (naive KV cache, absorbed latent cache) against the
forward's rows token by token and in chunks, weights and errors identical in all three, and
Hugging Face's ``DeepseekV3Attention`` on tiny random weights (skipped without transformers).

Sizes pairwise distinct: B=2, L=9, M=17, H=3, Q=7, R=11, Dn=5, Dr=4, E=6.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import impl_jax
import impl_numpy
import impl_torch
from attention_spec import AttentionError
from conformance.oracle import assert_within, mla_forward, tolerance_bound
from impl_torch import hf
from tests.frameworks import NP_DTYPES, assert_agree

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


IMPLS = {"numpy": impl_numpy, "torch": impl_torch, "jax": impl_jax}

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
]


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
                         **oracle_settings, **call)
    plain = None
    if dtype != "float64":
        plain = mla_forward(w64, x.astype(np.float64), n_heads=H, qk_rope_head_dim=Dr,
                            **oracle_settings, **call, round_to=dtype)
    module = _module(fw, weights, settings, sinks)
    y, w = module(FRAMEWORKS[fw][1](x), **_call_keywords(fw, call), return_weights=True)
    plain_y, plain_w = (None, None) if plain is None else (plain.output, plain.weights)
    assert_within(_np(y), golden.output, dtype, plain_y, what="output: ")
    assert_within(_np(w), golden.weights, dtype, plain_w, what="weights: ")


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
                  else (module.init_cache, module.decode))
    for chunks in ([1] * L, [3, 1, 5]):
        state, rows, start = init(B, L + 2), [], 0
        for n in chunks:
            y, state = step(convert(x[:, start : start + n]), state)
            rows.append(_np(y).astype(np.float64))
            start += n
        assert_agree(np.concatenate(rows, 1), full, dtype, what=f"{chunks}: ")
    per_token = _np(state.key).shape[1] * (_np(state.key).shape[3] + _np(state.value).shape[3])
    assert per_token == (R + Dr if cache == "latent" else H * (Dn + Dr + E))


def _nan_pool(fw: str, cache):
    """The paged cache with every slot of its pool NaN: any read past a sequence's keys, or of
    another sequence's page, shows in the output."""
    convert = FRAMEWORKS[fw][1]
    nan = {name: convert(np.full(_np(getattr(cache, name)).shape, np.nan,
                                 _np(getattr(cache, name)).dtype))
           for name in ("key_pages", "value_pages")}
    return dataclasses.replace(cache, **nan)


@pytest.mark.parametrize("fw", DECODE_FRAMEWORKS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_paged_latent_decode_equals_the_contiguous_one_and_the_forward(fw, dtype) -> None:
    """FlashMLA's form: the absorbed step on a paged latent pool (key pages ``[c_kv, k_pe]``,
    value pages ``c_kv``), filled with NaN, written by ``paged_cache_write`` and read by
    ``paged_attention``, gives the contiguous absorbed decode's rows and the forward's, token by
    token and in chunks that straddle pages (page_size 4)."""
    settings = {"rope_interleaved": True, "window": (4, 0), "softcap": 9.0}
    weights, x = _weights(Q, dtype, sinks=True), _x(dtype)
    module = _module(fw, weights, settings, sinks=True)
    convert = FRAMEWORKS[fw][1]
    full = _np(module(convert(x), is_causal=True)).astype(np.float64)
    for chunks in ([1] * L, [3, 2, 4]):
        paged, contiguous, rows, plain, start = None, module.init_cache(B, L + 2), [], [], 0
        paged = _nan_pool(fw, module.init_cache(B, L + 2, page_size=4))
        for n in chunks:
            y, paged = module.decode(convert(x[:, start : start + n]), paged)
            y_plain, contiguous = module.decode(convert(x[:, start : start + n]), contiguous)
            rows.append(_np(y).astype(np.float64))
            plain.append(_np(y_plain).astype(np.float64))
            start += n
        rows, plain = np.concatenate(rows, 1), np.concatenate(plain, 1)
        assert_agree(rows, plain, dtype, what=f"paged against contiguous, {chunks}: ")
        assert_agree(rows, full, dtype, what=f"paged against the forward, {chunks}: ")
    assert _np(paged.key_pages).shape[2:] == (1, R + Dr)  # one head of [c_kv, k_pe]
    assert _np(paged.value_pages).shape[2:] == (1, R)  # c_kv
    assert [len(held) for held in paged.pages] == [3, 3]  # ceil(9 / 4) pages each


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_the_latent_cache_is_one_buffer_of_c_kv_and_the_rotated_k_pe(fw) -> None:
    """init_cache: key ``[c_kv, k_pe] (B, 1, T, R + Dr)``, a zero-width value, R + Dr numbers
    per token; after the steps, row p of the key is token p's normalised c_kv then its k_pe
    rotated at p (the forward's own projections), the rows not written still zero."""
    weights, x = _weights(Q, "float64"), _x("float64")
    module = _module(fw, weights, {"rope_interleaved": True})
    convert = FRAMEWORKS[fw][1]
    T, n = L + 2, 7
    cache = module.init_cache(B, T)
    assert _np(cache.key).shape == (B, 1, T, R + Dr) and _np(cache.value).shape == (B, 1, T, 0)
    assert cache.nbytes == B * T * (R + Dr) * 8  # float64
    for start, stop in ((0, 3), (3, 4), (4, n)):
        _, cache = module.decode(convert(x[:, start:stop]), cache)
    _, q_pe = module._project_query(convert(x[:, :n]))
    c_kv, k_pe = module._project_latent(convert(x[:, :n]))
    _, k_pe = module._rotate(q_pe, k_pe, 0)
    want = np.concatenate([_np(c_kv), _np(k_pe)], -1)  # (B, 1, n, R+Dr)
    assert np.max(np.abs(_np(cache.key)[:, :, :n] - want)) <= 1e-13
    assert not _np(cache.key)[:, :, n:].any() and cache.position == n


@pytest.mark.parametrize("fw", ["numpy", "torch"])
def test_the_absorbed_step_reads_the_latent_cache_in_place(fw) -> None:
    """The one MQA's keys are the cache's buffer and its values the keys' first R features:
    views of the buffer in NumPy and torch, no copy of the S cached tokens (JAX: slices)."""
    module = _module(fw, _weights(None, "float32"), {})
    seen = {}

    def attend(q, k, v, **keywords):
        seen.update(k=k, v=v)
        return type(module)._attend(module, q, k, v, **keywords)

    module._attend = attend
    cache = module.init_cache(B, L)
    _, cache = module.decode(FRAMEWORKS[fw][1](_x("float32")[:, :4]), cache)
    k, v, buffer = seen["k"], seen["v"], cache.key
    if fw == "numpy":
        assert np.shares_memory(k, buffer) and np.shares_memory(v, buffer)
    else:
        ptr = buffer.untyped_storage().data_ptr()
        assert k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr() == ptr
    assert tuple(k.shape) == (B, 1, 4, R + Dr) and tuple(v.shape) == (B, 1, 4, R)


def test_a_latent_cache_of_another_layout_is_refused_identically_in_all_three() -> None:
    """The two-buffer layout (key c_kv (B, 1, T, R), value k_pe (B, 1, T, Dr)) and a value that
    is not zero-width are ``cache_mismatch``, the same in the three, before any write."""
    raised = {}
    for fw, (cls, convert) in FRAMEWORKS.items():
        module, x = cls(M, H, **SIZES), convert(_x("float32")[:, :1])
        kv_cache = IMPLS[fw].KVCache
        two = kv_cache(convert(np.zeros((B, 1, 4, R), np.float32)),
                       convert(np.zeros((B, 1, 4, Dr), np.float32)))
        wide = dataclasses.replace(module.init_cache(B, 4), value=two.value)
        raised[fw] = tuple(_raised(lambda c=c, m=module, x=x: m.decode(x, c)) for c in (two, wide))
    assert len(set(raised.values())) == 1, raised
    (_, old, message), (_, value, value_message) = raised["numpy"]
    assert old == value == "cache_mismatch"
    assert f"D={R + Dr}" in message and "E=0" in value_message


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_the_absorbed_step_returns_the_naive_weights(fw) -> None:
    weights, x = _weights(Q, "float64"), _x("float64")
    module = _module(fw, weights, {})
    convert = FRAMEWORKS[fw][1]
    _, w_full = module(convert(x), is_causal=True, return_weights=True)
    _, w, _ = module.decode(convert(x), module.init_cache(B, L), return_weights=True)
    assert_within(_np(w), _np(w_full), "float64")


def test_save_and_load_across_the_three(tmp_path) -> None:
    settings = {"rope_inv_freq": np.array([0.9, 0.01]), "rope_attention_factor": 1.1,
                "window": (2, 1), "softcap": 7.0, "scale": 0.5, "rms_norm_eps": 1e-5}
    weights, x = _weights(Q, "float64", sinks=True), _x("float64")
    want = _np(_module("numpy", weights, settings, True)(x, is_causal=True))
    for writer in FRAMEWORKS:
        path = tmp_path / f"{writer}.safetensors"
        _module(writer, weights, settings, True).save(path)
        for reader, (cls, convert) in FRAMEWORKS.items():
            got = _np(cls.load(path)(convert(x), is_causal=True))
            assert_within(got, want, "float64", what=f"{writer}'s file in {reader}: ")


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
)
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
    paged = module.init_cache(B, 4, page_size=2)
    _, code, _ = _raised(lambda: module.decode(x, paged, return_weights=True))
    assert code == "paged_cache"


def test_decode_naive_refuses_a_paged_cache_identically_in_all_three() -> None:
    """The naive decode has no paged form: a paged latent cache is a taxonomy error, the same
    in the three (it was an AttributeError on the pool's missing ``key``)."""
    raised = {}
    for fw, (cls, convert) in FRAMEWORKS.items():
        module = cls(M, H, **SIZES)
        paged = module.init_cache(B, 4, page_size=2)
        x = convert(_x("float32")[:, :1])
        raised[fw] = _raised(lambda m=module, x=x, c=paged: m.decode_naive(x, c))
    assert len(set(raised.values())) == 1, raised
    assert raised["numpy"][:2] == ("ConfigError", "paged_cache")


# -- Hugging Face's DeepseekV3Attention ----------------------------------------------------------


def _config(q_lora, interleave: bool, yarn: bool, **extra):
    transformers = pytest.importorskip("transformers")
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if yarn:
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 0.707,
                "mscale_all_dim": 0.707, "original_max_position_embeddings": 16,
                "beta_fast": 32.0, "beta_slow": 1.0}
    extra = {"attention_bias": False, **extra}
    return transformers.DeepseekV3Config(
        hidden_size=M, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=q_lora,
        kv_lora_rank=R, qk_nope_head_dim=Dn, qk_rope_head_dim=Dr, v_head_dim=E,
        rope_interleave=interleave, rope_parameters=rope, max_position_embeddings=64,
        rms_norm_eps=1e-6, **extra,
    )


def _hf_layer(q_lora, interleave: bool, yarn: bool):
    config = _config(q_lora, interleave, yarn)
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as modeling

    config._attn_implementation = "sdpa"  # eager runs its softmax in float32
    torch.manual_seed(0)
    layer = modeling.DeepseekV3Attention(config, layer_idx=0).double().eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.endswith("layernorm.weight"):
                p.uniform_(0.5, 1.5)
    for norm in (layer.q_a_layernorm, layer.kv_a_layernorm):
        if norm is not None:  # HF's norm runs in float32 even for float64: its formula in float64
            norm.forward = _float64_norm(norm)
    return config, layer, modeling.DeepseekV3RotaryEmbedding(config).double()


def _float64_norm(norm):
    def forward(h: torch.Tensor) -> torch.Tensor:
        return norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))

    return forward


def _ours_from_hf(layer, rotary) -> tuple[dict, dict]:
    """The converter's canonical weights and settings of the HF layer, its frequencies and
    factor checked against the layer's rotary module (float32 frequencies: 4 ulps)."""
    weights, options = hf.from_hf_attention(layer), hf.module_options(layer.config)
    inv_freq, factor = _frequencies(options)
    want = rotary.inv_freq.double().numpy()
    assert np.max(np.abs(inv_freq - want) / want) <= 4 * 2.0**-24
    assert abs(factor - float(rotary.attention_scaling)) <= 1e-15  # one formula: an ulp
    return weights, options


def _frequencies(options: dict) -> tuple[np.ndarray, float]:
    """``inv_freq (Dr/2,)`` in float64 and the cos/sin factor of the converter's settings."""
    inv_freq = options.get("rope_inv_freq")
    if inv_freq is None:
        inv_freq = options["rope_theta"] ** (-np.arange(0, Dr, 2) / Dr)
    return np.asarray(inv_freq, np.float64), float(options.get("rope_attention_factor", 1.0))


def _hf_rope(options: dict, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's ``(cos, sin)`` in float64 from the converter's frequencies and factor (checked
    against the layer's own in :func:`_ours_from_hf`; HF's rotary module computes the angles in
    float32, a 1e-7 difference that is not MLA's)."""
    inv_freq, factor = _frequencies(options)
    freqs = positions[..., None].double() * torch.tensor(inv_freq)  # (B, L, Dr/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (B, L, Dr)
    return emb.cos() * factor, emb.sin() * factor


def _disagreement(q_lora, interleave: bool, yarn: bool, frameworks=tuple(FRAMEWORKS)):
    """The HF layer in float64, causal, against our modules converted from it: the largest
    difference of the forward and of a generation of L steps, HF's cache against our absorbed
    decode, per framework (and HF's own cache against its forward, ``"hf"``); and the tolerance
    rule's float64 bound of the layer's output (HF's float64 result as the golden)."""
    config, layer, rotary = _hf_layer(q_lora, interleave, yarn)
    weights, options = _ours_from_hf(layer, rotary)
    x = _x("float64")
    xt = torch.tensor(x)
    positions = torch.arange(L)[None].expand(B, L)
    causal = torch.full((L, L), -torch.inf, dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        want, _ = layer(xt, _hf_rope(options, positions), causal)
        from transformers import DynamicCache

        hf_cache, steps = DynamicCache(config=config), []
        for t in range(L):
            out, _ = layer(xt[:, t : t + 1], _hf_rope(options, positions[:, t : t + 1]), None,
                           cache=hf_cache)
            steps.append(out.numpy())
    want, hf_steps = want.numpy(), np.concatenate(steps, 1)
    errors = {"hf": np.max(np.abs(hf_steps - want)),  # HF's own cache against its forward
              "scale": abs(options["scale"] - layer.scaling)}
    for fw in frameworks:
        module = hf.attention_module(IMPLS[fw], weights, options)
        convert = FRAMEWORKS[fw][1]
        forward = np.max(np.abs(_np(module(convert(x), is_causal=True)) - want))
        cache, ours = module.init_cache(B, L), []
        for t in range(L):
            y, cache = module.decode(convert(x[:, t : t + 1]), cache)
            ours.append(_np(y))
        errors[fw] = max(forward, np.max(np.abs(np.concatenate(ours, 1) - hf_steps)))
    return errors, tolerance_bound(want, want, "float64")


@pytest.mark.parametrize("q_lora", [None, Q])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("yarn", [False, True])
def test_hugging_face_deepseek_v3_attention_agrees(q_lora, interleave, yarn) -> None:
    """impl_torch.hf's converter: the HF layer and our three modules agree in float64, forward
    and a generation of several steps with HF's cache against our absorbed decode."""
    errors, bound = _disagreement(q_lora, interleave, yarn)
    assert all(e <= bound for e in errors.values()), (errors, bound)


def test_the_yarn_mscale_applied_once_in_the_converter_fails_the_agreement(monkeypatch) -> None:
    """A converter scaling by ``m(mscale_all_dim)`` once instead of squared is caught."""
    pytest.importorskip("transformers")

    def once(config) -> float:
        rope = hf._rope_parameters(config)
        return (Dn + Dr) ** -0.5 * hf.yarn_mscale(rope["factor"], rope["mscale_all_dim"])

    right, bound = _disagreement(Q, True, True, frameworks=("numpy",))
    monkeypatch.setattr(hf, "mla_softmax_scale", once)
    wrong, _ = _disagreement(Q, True, True, frameworks=("numpy",))
    assert right["numpy"] <= bound and wrong["numpy"] > 1e-3, (right, wrong, bound)


def test_attention_bias_is_refused_with_the_taxonomy_error() -> None:
    config = _config(Q, True, False, attention_bias=True)
    with pytest.raises(AttentionError) as info:
        hf.module_options(config)
    assert info.value.code == "weight_shape" and "attention_bias=True" in str(info.value)
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as modeling

    with pytest.raises(AttentionError, match="attention_bias=True"):
        hf.from_hf_attention(modeling.DeepseekV3Attention(config, layer_idx=0))


def test_layer_n_of_a_save_pretrained_checkpoint_is_the_models_layer(tmp_path) -> None:
    """A two-layer DeepSeek-V3 (YaRN, q_lora_rank set) saved in shards: layer 1 read alone
    gives the weights and settings of the model's layer 1, and our module its output."""
    transformers = pytest.importorskip("transformers")
    config = _config(Q, True, True, num_hidden_layers=2, vocab_size=32, intermediate_size=8,
                     moe_intermediate_size=4, n_routed_experts=2, num_experts_per_tok=1,
                     n_group=1, topk_group=1, first_k_dense_replace=1)
    torch.manual_seed(1)
    model = transformers.DeepseekV3ForCausalLM(config).eval()
    model.save_pretrained(tmp_path, max_shard_size="4KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    weights, options = hf.load_hf_attention(tmp_path, 1)
    layer = model.model.layers[1].self_attn
    want = hf.from_hf_attention(layer)
    assert weights.keys() == want.keys() and "q_a_layernorm.weight" in weights
    assert all(np.array_equal(weights[n], want[n]) for n in want)
    assert options.keys() == hf.module_options(config).keys()
    assert np.array_equal(options["rope_inv_freq"], hf.module_options(config)["rope_inv_freq"])
    assert abs(options["scale"] - layer.scaling) <= 1e-15  # one formula: an ulp
    module = hf.attention_module(impl_numpy, weights, options)
    x = _x("float32")
    rotary = model.model.rotary_emb
    positions = torch.arange(L)[None].expand(B, L)
    causal = torch.full((L, L), -torch.inf).triu(1)[None, None]
    with torch.no_grad():
        hf_y, _ = layer(torch.tensor(x), rotary(torch.tensor(x), positions), causal)
    assert_agree(module(x, is_causal=True), hf_y.numpy(), "float32")  # ours against the layer
