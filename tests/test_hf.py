"""Hugging Face transformers' attention layers against ours (impl_torch/hf.py), on CPU.

Nothing is downloaded: each family is a tiny config with random weights, built once per session.
The expected value of a layer is the float64 oracle of the conformance suite
(``conformance.oracle.module_forward``, with RoPE) and the bound is the fixture rule's float32
bound (2 x the plain float32 computation's error + the noise floor): Hugging Face's layer and
our module in NumPy, torch and JAX must each be within it. Where a family needs a module option
of contract v2 that the modules do not have yet (window, softcap, query pre-scale, sinks), the
converter must refuse, naming the option, and the converted settings are checked instead
against the same layer through the functional API, which has them (``apply_rotary``, then
``scaled_dot_product_attention`` with ``window``, ``scale``, ``softcap`` and ``sinks``).
"""

from __future__ import annotations

import copy
import functools
import importlib

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import impl_jax  # noqa: E402
import impl_numpy  # noqa: E402
import impl_torch  # noqa: E402
from conformance.oracle import assert_within, module_forward, tolerance_bound  # noqa: E402
from impl_torch.hf import (  # noqa: E402
    FAMILIES,
    attention_module,
    from_hf_attention,
    hf_state_dict,
    interleave_qk,
    load_hf_attention,
    module_options,
)
from tests.frameworks import FRAMEWORKS, assert_agree  # noqa: E402

IMPLS = {"numpy": impl_numpy, "torch": impl_torch, "jax": impl_jax}
B, L, M, H, K, D = 2, 6, 32, 4, 2, 8  # batch, tokens, width, heads, kv heads, head dim
SIZES = dict(hidden_size=M, num_attention_heads=H, num_key_value_heads=K, head_dim=D,
             num_hidden_layers=2, vocab_size=64, intermediate_size=48, max_position_embeddings=64,
             attn_implementation="eager")
ROPE = {"rope_type": "default", "rope_theta": 100.0}  # large angles at small positions


def _family_module(model_type: str):
    return importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


def _config(model_type: str, **extra):
    """A tiny config of the family; ``extra`` switches its own features on or off."""
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "gemma2": transformers.Gemma2Config}.get(model_type)
    if cls is None:
        cls = getattr(transformers, "GptOssConfig", None)
        if cls is None:
            pytest.skip(f"this transformers has no {model_type}")
        extra = {"num_local_experts": 2, "num_experts_per_tok": 1, **extra}
    return cls(**SIZES, rope_parameters=ROPE, **extra)


#: Configs whose layers our modules express today, and the same families with their own
#: features on (which need the v2 module options).
TODAY = {
    "llama": dict(attention_bias=True),
    "mistral": dict(sliding_window=None),
    "gemma2": dict(query_pre_attn_scalar=D, attn_logit_softcapping=None, sliding_window=None),
}
FEATURES = {
    "mistral": dict(sliding_window=3),
    "gemma2": dict(query_pre_attn_scalar=16, attn_logit_softcapping=2.0, sliding_window=3),
    "gpt_oss": dict(sliding_window=3),
}


@functools.cache
def _layer(model_type: str, features: bool, layer: int = 0):
    """One attention layer (random weights, float32) and the family's rotary embedding."""
    extra = (FEATURES if features else TODAY)[model_type]
    config = _config(model_type, **extra)
    modeling = _family_module(model_type)
    prefix = FAMILIES[model_type].attention.removesuffix("Attention")
    torch.manual_seed(len(model_type) + 10 * layer + 100 * features)
    attention = getattr(modeling, f"{prefix}Attention")(config, layer_idx=layer).eval()
    if hasattr(attention, "sinks"):  # torch.empty in the constructor
        torch.nn.init.normal_(attention.sinks, std=1.0)
    rotary = getattr(modeling, f"{prefix}RotaryEmbedding")(config)
    return config, attention, rotary


def _hf_forward(attention, rotary, x: np.ndarray) -> np.ndarray:
    """Hugging Face's layer on ``x (B, L, M)`` at positions 0..L-1, with the additive mask
    Hugging Face's own mask functions give it: causal, or causal and sliding for a layer with a
    sliding window (the eager path reads the window from the mask alone)."""
    from transformers import masking_utils

    xt = torch.from_numpy(x)
    positions = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
    cos, sin = rotary(xt, positions)
    W = getattr(attention, "sliding_window", getattr(attention.config, "sliding_window", None))
    rule = (masking_utils.causal_mask_function if W is None
            else masking_utils.sliding_window_causal_mask_function(W))
    n = torch.arange(x.shape[1])
    allowed = np.array([[bool(rule(0, 0, i, j)) for j in n] for i in n])  # (L, S)
    mask = torch.from_numpy(np.where(allowed, 0.0, -np.inf)).to(xt.dtype)[None, None]
    with torch.no_grad():
        out, _ = attention(hidden_states=xt, position_embeddings=(cos, sin), attention_mask=mask)
    return out.numpy()


def _ours(name: str, module, x: np.ndarray) -> np.ndarray:
    fw = FRAMEWORKS[name]
    return fw.to_numpy(module(fw.asarray(x), is_causal=True))


def _x(seed: int = 0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((B, L, M)).astype(dtype)


# ---------------------------------------------------------------------------------------------
# The layers our modules express today: Hugging Face and ours against the oracle
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", list(TODAY))
def test_hf_layer_and_our_three_modules_agree_within_the_float32_bound(model_type):
    config, attention, rotary = _layer(model_type, features=False)
    weights = from_hf_attention(attention)  # float32, canonical
    options = module_options(config, 0)
    x = _x()
    w64 = {n: a.astype(np.float64) for n, a in weights.items()}
    rope = {k: options[k] for k in ("rope_theta", "rope_interleaved")}
    kw = dict(n_heads=H, n_kv_heads=K, is_causal=True, **rope)
    golden = module_forward(w64, x.astype(np.float64), **kw).output
    plain = module_forward(w64, x.astype(np.float64), **kw, round_to="float32").output
    bound = tolerance_bound(golden, plain, "float32")
    results = {"hf": _hf_forward(attention, rotary, x)}
    for name, impl in IMPLS.items():
        results[name] = _ours(name, attention_module(impl, weights, options), x)
    for name, y in results.items():
        assert_within(y, golden, "float32", plain, what=f"{name}: ")
    rope_off = attention_module(impl_numpy, weights, options | {"rope_theta": None})
    assert np.abs(_ours("numpy", rope_off, x) - golden).max() > 100 * bound  # RoPE matters


class _Float64Rotary(torch.nn.Module):
    """A Hugging Face rotary embedding computing cos and sin in float64: theirs computes them
    in float32 whatever the model's dtype (``position_ids.float() * inv_freq``), then casts.
    ``inv_freq`` and ``factor``: a scaled rope's frequencies and cos/sin factor."""

    def __init__(self, theta: float, dim: int, inv_freq=None, factor: float = 1.0) -> None:
        super().__init__()
        frequencies = [theta ** (-2 * p / dim) for p in range(dim // 2)]
        given = frequencies if inv_freq is None else inv_freq
        self.inv_freq = torch.tensor(np.asarray(given), dtype=torch.float64)
        self.factor = factor

    def forward(self, x, position_ids):
        freqs = position_ids[..., None].double() * self.inv_freq  # (B, L, D/2)
        angle = torch.cat([freqs, freqs], dim=-1)  # rotate_half's layout: (B, L, D)
        cos, sin = angle.cos() * self.factor, angle.sin() * self.factor
        return cos.to(x.dtype), sin.to(x.dtype)


def _float64(module):
    """A float64 copy of a Hugging Face layer or model on its ``sdpa`` path: the ``eager`` path
    computes the softmax in float32 whatever the dtype (``softmax(..., dtype=torch.float32)``)."""
    module = copy.deepcopy(module).double()
    module.config._attn_implementation = "sdpa"
    return module


def test_float64_layers_agree_to_rounding_given_float64_angles():
    """In float64 Hugging Face's layer and ours agree to 1e-12 once its cos and sin and its
    softmax are float64 too; with its own rotary embedding (float32 angles) they differ by
    float32 angle errors."""
    config, attention, rotary = _layer("llama", features=False)
    attention64 = _float64(attention)
    weights, options = from_hf_attention(attention64), module_options(config, 0)
    x = _x(1, np.float64)
    hf = _hf_forward(attention64, _Float64Rotary(options["rope_theta"], D), x)
    for name, impl in IMPLS.items():
        got = _ours(name, attention_module(impl, weights, options), x)
        assert_within(got, hf, "float64", what=f"{name}: ")
    float32_angles = np.abs(_hf_forward(attention64, rotary, x) - hf).max()
    assert 1e-10 < float32_angles < 1e-6  # measured: float32 angle errors, far above float64's


#: Scaled ropes of the tiny Llama (theta 100, D = 8, positions 0..5), so every pair's frequency
#: changes: llama3 with original 16 blends pair 0 and divides pairs 1..3 by 4; YaRN kept pair 0,
#: divides pairs 1..3 by 4 and puts 0.1 ln 4 + 1 on cos and sin.
SCALED = {
    "llama3": {"rope_type": "llama3", "rope_theta": 100.0, "factor": 4.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0,
             "original_max_position_embeddings": 16},
}


def _scaled_expected(rope_type: str) -> tuple[np.ndarray, float]:
    """The frequencies and cos/sin factor of :data:`SCALED` from the conformance cases' own
    formulas (written apart from impl_torch/hf.py and from transformers)."""
    from conformance.cases.rope import llama3_inv_freq, yarn_inv_freq

    if rope_type == "llama3":
        return llama3_inv_freq(100.0, D, 4.0, 1.0, 4.0, 16), 1.0
    return yarn_inv_freq(100.0, D, 4.0, 16)


@pytest.mark.parametrize("rope_type", list(SCALED))
def test_scaled_rope_llama_layers_agree_in_float32_and_float64(rope_type):
    """A Llama 3.1 (``llama3``) or YaRN-scaled LlamaAttention: the converter's rope_inv_freq and
    rope_attention_factor make our three modules agree with Hugging Face's layer (its own
    rotary embedding) within the float32 bound of the oracle, and to 1e-12 in float64 given
    float64 angles; the same layer run with theta's frequencies is far off."""
    config = transformers.LlamaConfig(**SIZES, rope_parameters=dict(SCALED[rope_type]))
    modeling = _family_module("llama")
    torch.manual_seed(7)
    attention = modeling.LlamaAttention(config, layer_idx=0).eval()
    rotary = modeling.LlamaRotaryEmbedding(config)
    weights, options = from_hf_attention(attention), module_options(config, 0)
    inv_freq, factor = _scaled_expected(rope_type)
    x = _x(2)
    w64 = {n: a.astype(np.float64) for n, a in weights.items()}
    kw = dict(n_heads=H, n_kv_heads=K, is_causal=True, rope_theta=100.0, rope_inv_freq=inv_freq,
              rope_attention_factor=factor)
    golden = module_forward(w64, x.astype(np.float64), **kw).output
    plain = module_forward(w64, x.astype(np.float64), **kw, round_to="float32").output
    bound = tolerance_bound(golden, plain, "float32")
    results = {"hf": _hf_forward(attention, rotary, x)}
    for name, impl in IMPLS.items():
        results[name] = _ours(name, attention_module(impl, weights, options), x)
    for name, y in results.items():
        assert_within(y, golden, "float32", plain, what=f"{name}: ")
    unscaled = {k: v for k, v in options.items() if not k.startswith("rope_") or k == "rope_theta"}
    plain_rope = _ours("numpy", attention_module(impl_numpy, weights, unscaled), x)
    assert np.abs(plain_rope - golden).max() > 100 * bound  # the scaling matters
    attention64 = _float64(attention)
    x64 = _x(3, np.float64)
    hf64 = _hf_forward(attention64, _Float64Rotary(100.0, D, inv_freq, factor), x64)
    weights64 = from_hf_attention(attention64)
    for name, impl in IMPLS.items():
        got = _ours(name, attention_module(impl, weights64, options), x64)
        assert_within(got, hf64, "float64", what=f"{name}: ")


def test_the_interleaved_layout_is_a_permutation_of_the_qk_features():
    """Meta's Llama layout: the q/k features of each head reordered so that pairs are
    (2p, 2p+1); with rope_interleaved=True our module computes Hugging Face's layer."""
    config, attention, rotary = _layer("llama", features=False)
    weights, options = from_hf_attention(attention), module_options(config, 0)
    x = _x(2)
    hf = _hf_forward(attention, rotary, x)
    permuted = interleave_qk(weights, n_heads=H, n_kv_heads=K)
    module = attention_module(impl_numpy, permuted, options | {"rope_interleaved": True})
    assert_agree(_ours("numpy", module, x), hf, "float32")  # float32, ours against the layer
    unpermuted = attention_module(impl_numpy, weights, options | {"rope_interleaved": True})
    assert np.abs(_ours("numpy", unpermuted, x) - hf).max() > 1e-2


@pytest.mark.parametrize("model_type", ["llama", "mistral", "gemma2", "gpt_oss"])
def test_weights_round_trip_through_the_canonical_format(model_type):
    _, attention, _ = _layer(model_type, features=True if model_type == "gpt_oss" else False)
    weights = from_hf_attention(attention)
    assert weights["q_proj.kernel"].shape == (M, H * D)  # (in, out)
    assert weights["k_proj.kernel"].shape == (M, K * D)
    assert ("sinks" in weights) == (model_type == "gpt_oss")
    state = hf_state_dict(weights)
    assert state.keys() == attention.state_dict().keys()
    for name, tensor in attention.state_dict().items():
        assert torch.equal(state[name], tensor), name


# ---------------------------------------------------------------------------------------------
# A checkpoint written by save_pretrained, and generation with a KV cache
# ---------------------------------------------------------------------------------------------


@functools.cache
def _llama_model():
    config = _config("llama", attention_bias=True, initializer_range=0.3)
    config.tie_word_embeddings = False
    torch.manual_seed(7)
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # generate exactly the tokens asked
    model.generation_config.pad_token_id = 0
    return model


def test_layer_n_of_a_sharded_checkpoint_loads_as_the_models_layer(tmp_path):
    model = _llama_model()
    model.save_pretrained(tmp_path, max_shard_size="40KB")  # several shards and an index
    assert (tmp_path / "model.safetensors.index.json").is_file()
    for layer in (0, 1):
        weights, options = load_hf_attention(tmp_path, layer)
        want = from_hf_attention(model.model.layers[layer].self_attn)
        assert weights.keys() == want.keys()
        assert all(np.array_equal(weights[n], want[n]) for n in want)
        assert options == module_options(model.config, layer)


@functools.cache
def _jax_decode():
    from flax import nnx

    return nnx.jit(lambda module, x, cache: module.decode(x, cache))


class _OurAttention(torch.nn.Module):
    """Our module (any framework) in place of a Hugging Face attention layer: it ignores the
    model's cos/sin and mask and decodes with its own KV cache (RoPE at cache.position)."""

    def __init__(self, name: str, module, max_len: int) -> None:
        super().__init__()
        self.fw, self.module, self.max_len, self.cache = FRAMEWORKS[name], module, max_len, None
        self.decode = module.decode
        if name == "jax":  # one compilation per step, shared by the layers (same structure)
            self.decode = functools.partial(_jax_decode(), module)

    def forward(self, hidden_states, **_):
        x = self.fw.asarray(hidden_states.detach().numpy())
        if self.cache is None:
            self.cache = self.module.init_cache(x.shape[0], self.max_len)
        y, self.cache = self.decode(x, self.cache)
        return torch.from_numpy(np.array(self.fw.to_numpy(y))), None


def _generate_with_ours(model, name: str, prompt: torch.Tensor, steps: int, dtype: str):
    """Greedy decoding of ``steps`` tokens with every attention layer replaced by ours: the
    prompt as one prefill chunk, then one token at a time (no Hugging Face cache at all)."""
    ours = copy.deepcopy(model)
    for i, layer in enumerate(ours.model.layers):
        weights, options = from_hf_attention(layer.self_attn), module_options(model.config, i)
        module = attention_module(IMPLS[name], weights, options, dtype=dtype)
        layer.self_attn = _OurAttention(name, module, prompt.shape[1] + steps)
    ids, logits = prompt, []
    with torch.no_grad():
        new = prompt
        for _ in range(steps):
            step = ours(new, use_cache=False).logits[:, -1]  # (B, vocab)
            logits.append(step.numpy())
            new = step.argmax(-1, keepdim=True)
            ids = torch.cat([ids, new], dim=1)
    return ids, np.stack(logits, axis=1)


def _generate_with_hf(model, prompt: torch.Tensor, steps: int):
    out = model.generate(prompt, max_new_tokens=steps, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
    return out.sequences, np.stack([s.numpy() for s in out.logits], axis=1)


@pytest.mark.parametrize("name", list(IMPLS))
def test_generation_with_hf_cache_and_with_our_decode_agree_step_by_step(name):
    """Six greedy tokens after a prompt of four: the same tokens, and at every step logits
    within the fixture rule's float32 bound, whose plain float32 computation is Hugging Face's
    own float32 model (generate's logits) against one float64 forward of its twin over the
    generated tokens (float64 cos, sin and softmax). In float64 ours agrees to rounding."""
    model = _llama_model()
    prompt, steps = torch.tensor([[5, 17, 3, 42], [9, 9, 60, 1]]), 6
    hf_ids, hf32 = _generate_with_hf(model, prompt, steps)
    model64 = _float64(model)
    model64.model.rotary_emb = _Float64Rotary(ROPE["rope_theta"], D)
    with torch.no_grad():  # the golden: one float64 forward over the tokens, no cache
        hf64 = model64(hf_ids[:, :-1]).logits[:, prompt.shape[1] - 1 :].numpy()  # (B, steps, V)
    ids, ours32 = _generate_with_ours(model, name, prompt, steps, "float32")
    assert torch.equal(ids, hf_ids)
    for step in range(steps):
        assert_within(ours32[:, step], hf64[:, step], "float32", hf32[:, step], what=f"{step}: ")
    _, ours64 = _generate_with_ours(model64, name, prompt, steps, "float64")
    assert_within(ours64, hf64, "float64")


# ---------------------------------------------------------------------------------------------
# Window, softcap, query pre-scale, sinks: converted, refused by the modules until v2
# ---------------------------------------------------------------------------------------------


def test_hf_sliding_window_of_w_keys_is_our_window_w_minus_1():
    """Hugging Face's own mask function against our conversion, on every (i, j)."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    W = 3
    (left, right) = module_options(_config("mistral", sliding_window=W))["window"]
    hf = sliding_window_causal_mask_function(W)
    for i in range(8):
        for j in range(8):
            assert bool(hf(0, 0, torch.tensor(i), torch.tensor(j))) == (i - left <= j <= i + right)


def test_module_options_of_each_family():
    assert module_options(_config("mistral", sliding_window=3))["window"] == (2, 0)
    gemma = _config("gemma2", **FEATURES["gemma2"])
    assert module_options(gemma, 0) == {
        "d_model": M, "n_heads": H, "n_kv_heads": K, "head_dim": D, "bias": False,
        "rope_theta": 100.0, "rope_interleaved": False, "window": (2, 0), "scale": 0.25,
        "softcap": 2.0,
    }
    assert "window" not in module_options(gemma, 1)  # layer 1 is a full-attention layer
    options = module_options(_config("gpt_oss", sliding_window=3), 0)
    assert options["sinks"] is True and options["bias"] is True and options["window"] == (2, 0)
    dynamic = {"rope_type": "dynamic", "rope_theta": 100.0, "factor": 2.0}
    with pytest.raises(NotImplementedError, match=r"rope_type 'dynamic'.*sequence length"):
        module_options({**_config("llama").to_dict(), "rope_parameters": dynamic})
    with pytest.raises(NotImplementedError, match="rope_type 'longrope'"):
        module_options({**_config("llama").to_dict(), "rope_parameters": {"rope_type": "longrope"}})
    linear = module_options({**_config("llama").to_dict(), "rope_parameters": {
        "rope_type": "linear", "rope_theta": 100.0, "factor": 4.0}})
    want = [100 ** (-p / 4) / 4 for p in range(4)]  # by hand: exact to an ulp
    np.testing.assert_allclose(linear["rope_inv_freq"], want, rtol=1e-15)
    with pytest.raises(NotImplementedError, match="no converter for model_type 'gpt2'"):
        module_options({"model_type": "gpt2"})


def _functional_reference(weights, options, x: np.ndarray) -> np.ndarray:
    """What our module will compute with the v2 options, through impl_numpy's functional API in
    float64: the projections, ``apply_rotary``, then ``scaled_dot_product_attention`` with
    ``is_causal`` and the options ``window``, ``scale``, ``softcap`` and ``sinks``."""
    w = {n: a.astype(np.float64) for n, a in weights.items()}
    n_batch, n = x.shape[:2]

    def heads(name, count):  # (B, L, M) -> (B, count, L, D)
        y = x @ w[f"{name}.kernel"] + w.get(f"{name}.bias", 0.0)
        return y.reshape(n_batch, n, count, -1).transpose(0, 2, 1, 3)

    rope = {"theta": options["rope_theta"], "interleaved": options["rope_interleaved"]}
    q = impl_numpy.apply_rotary(heads("q_proj", H), np.arange(n), **rope)
    k = impl_numpy.apply_rotary(heads("k_proj", K), np.arange(n), **rope)
    kw = {name: options[name] for name in ("window", "scale", "softcap") if name in options}
    if options.get("sinks"):
        kw["sinks"] = w["sinks"]  # (H,): one more logit per row, with no value
    out = impl_numpy.scaled_dot_product_attention(q, k, heads("v_proj", K), is_causal=True, **kw)
    merged = out.transpose(0, 2, 1, 3).reshape(n_batch, n, H * D)
    return merged @ w["o_proj.kernel"] + w.get("o_proj.bias", 0.0)


#: Each v2 option of a family, set wrong as a port could (Hugging Face's W for our left
#: bound, the default scale, no softcap, no sinks): the reference must then disagree.
WRONG = {"window": lambda o: o | {"window": (o["window"][0] + 1, 0)},
         "scale": lambda o: {k: v for k, v in o.items() if k != "scale"},
         "softcap": lambda o: {k: v for k, v in o.items() if k != "softcap"},
         "sinks": lambda o: o | {"sinks": False}}


@pytest.mark.parametrize("model_type", list(FEATURES))
def test_family_features_are_converted_right_and_reproduced_by_the_modules(model_type):
    """The converted settings reproduce the layer through the functional API and through the
    three modules (window, scale, softcap, sinks per layer), and each of them matters. Hugging
    Face's float64 eager layer computes its softmax in float32 (softcap and sinks exist on that
    path only), hence 1e-6; a wrong conversion is off by more than 1e-3."""
    config, attention, rotary = _layer(model_type, features=True)
    attention64 = copy.deepcopy(attention).double()
    weights, options = from_hf_attention(attention64), module_options(config, 0)
    x = _x(3, np.float64)
    hf = _hf_forward(attention64, rotary, x)
    # measured: Hugging Face's float32 softmax in its float64 layer (the docstring)
    assert np.abs(_functional_reference(weights, options, x) - hf).max() < 1e-6
    converted = [k for k in WRONG if k in options]
    assert converted, options
    for k in converted:
        wrong = _functional_reference(weights, WRONG[k](options), x)
        assert np.abs(wrong - hf).max() > 1e-3, k
    for name, impl in IMPLS.items():  # the modules take every v2 option of the family
        module = attention_module(impl, weights, options)
        np.testing.assert_allclose(_ours(name, module, x), hf, atol=1e-6)  # the same, measured
