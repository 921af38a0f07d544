"""Hugging Face transformers attention layers <-> our modules: canonical weights and settings.

The attention layers of Llama, Mistral, Gemma 2 and gpt-oss (``LlamaAttention``,
``MistralAttention``, ``Gemma2Attention``, ``GptOssAttention``) are a grouped-query attention
with rotary positions plus, depending on the family, a sliding window, a logit softcap, a query
pre-scale or attention sinks. This module is the one place that says how such a layer maps onto
``GroupedQueryAttention`` (in any of the three implementations):

- **weights** (:func:`from_hf_attention`, :func:`hf_state_dict`, :func:`load_hf_attention`):
  ``q_proj.weight (H*D, M)`` is an ``nn.Linear`` weight, ``(out, in)``; the canonical kernel is its
  transpose (``impl_torch.modules.linear_weight``, the project's one transpose). The head layout
  is already ours: query head h owns rows ``[h*D:(h+1)*D]`` (key/value head k rows
  ``[k*D:(k+1)*D]``), and inside a head the rotary pairs are half-split (``rotate_half``), so
  nothing is permuted and the module uses ``rope_interleaved=False``. (Meta's original Llama
  checkpoints pair features ``(2p, 2p+1)``; :func:`interleave_qk` gives the canonical weights
  of that layout, for ``rope_interleaved=True``.)
- **settings** (:func:`module_options`): from the config of a layer, the keywords of our
  constructor, converted where the family's semantics differ from ours (the table
  :data:`FAMILIES`). Differences, each converted here and nowhere else:

  =================== ======================================= ===================================
  family              Hugging Face                            ours
  =================== ======================================= ===================================
  all                 ``rope_parameters["rope_theta"]``,       ``rope_theta``, half-split pairs,
                      ``rotate_half``, cos/sin in float32      angles in float32 (the same)
                      then cast to the input dtype
  all                 ``attention_bias`` (one flag, q k v o)  ``bias`` (all four or none: same)
  Mistral, Gemma 2,   ``sliding_window=W``: key j visible     ``window=(W - 1, 0)`` (SEMANTICS v2:
  gpt-oss             when ``i - W < j <= i`` (W keys)         ``i - left <= j <= i``, W keys)
  Gemma 2             ``scaling = query_pre_attn_scalar       ``scale=query_pre_attn_scalar **
                      ** -0.5`` (not ``head_dim ** -0.5``)     -0.5`` (only when it differs)
  Gemma 2             ``attn_logit_softcapping``: after the   ``softcap`` (the same order: step 2,
                      scale, before the mask                   after the scale)
  gpt-oss             ``sinks (H,)``, a learned logit per      learned ``sinks`` (SEMANTICS v2,
                      head, concatenated to every row          step 5: the same formula)
  =================== ======================================= ===================================

  ``rope_type="default"`` is SEMANTICS.md's RoPE of ``rope_theta``. The static scalings become
  the module's ``rope_inv_freq`` / ``rope_attention_factor`` (Contract v3, "Scaled rotary
  frequencies"), computed here from the published formulas: ``"linear"`` (every frequency
  divided by ``factor``), Llama 3.1/3.2's ``"llama3"`` (:func:`llama3_frequencies`), and
  ``"yarn"`` (gpt-oss; :func:`yarn_frequencies`, its cos/sin factor too). ``"dynamic"`` (NTK
  theta recomputed from each forward's length) and the others are refused, named.

The window, softcap, scale and sinks module options are contract v2's, taken by the modules'
``from_canonical`` (sinks as the weight ``sinks (H,)``): :func:`attention_module` passes every
option the module's ``from_canonical`` takes and refuses, naming them, any it does not take. A
family is one row of :data:`FAMILIES`.

DeepSeek-V3's ``DeepseekV3Attention`` (``LATENT_FAMILIES``) is a multi-head latent attention:
:func:`module_options` gives :func:`mla_options` for it (``rope_interleave`` as
``rope_interleaved``, YaRN as ``rope_inv_freq`` / ``rope_attention_factor`` from transformers'
own rope function, ``scale`` with ``m(mscale_all_dim) ** 2``), :func:`from_hf_attention` and
:func:`load_hf_attention` its canonical weights, :func:`attention_module` a
``MultiHeadLatentAttention``; ``attention_bias=True`` is refused (``weight_shape``).

Works on a ``transformers`` config object or on the plain dict of a ``config.json``, so a
checkpoint can be read with safetensors alone; ``transformers`` is needed only for its layers.
Shape letters (SEMANTICS.md): M model width, H query heads, K key/value heads, D head dim.
"""

from __future__ import annotations

import inspect
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from attention_spec.errors import make_error
from attention_spec.modules import PROJECTIONS
from impl_torch.modules import linear_weight, tensor_from_numpy, tensor_to_numpy

__all__ = [
    "FAMILIES",
    "Family",
    "attention_module",
    "from_hf_attention",
    "hf_state_dict",
    "interleave_qk",
    "latent_attention_module",
    "llama3_frequencies",
    "load_hf_attention",
    "mla_options",
    "module_options",
    "yarn_frequencies",
]

#: The keys of the constructor's sizes among :func:`module_options`' result.
SIZE_KEYS = ("d_model", "n_heads", "n_kv_heads", "head_dim", "bias")


def _get(config: Any, name: str, default: Any = None) -> Any:
    """A config field, from a ``transformers`` config object or a ``config.json`` dict."""
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def _layer_type(config: Any, layer: int) -> str:
    types = _get(config, "layer_types")
    return "full_attention" if types is None else types[layer]


def _window(config: Any, layer: int) -> dict[str, Any]:
    """Hugging Face's sliding window of W keys (``i - W < j <= i``) is our ``(W - 1, 0)``."""
    W = _get(config, "sliding_window")
    if W is None or _layer_type(config, layer) != "sliding_attention":
        return {}
    return {"window": (int(W) - 1, 0)}


def _mistral_window(config: Any, layer: int) -> dict[str, Any]:
    """Mistral has no layer types: every layer slides when ``sliding_window`` is set."""
    W = _get(config, "sliding_window")
    return {} if W is None else {"window": (int(W) - 1, 0)}


def _gemma2(config: Any, layer: int) -> dict[str, Any]:
    options = _window(config, layer)
    if _get(config, "query_pre_attn_scalar") != _head_dim(config):
        options["scale"] = float(_get(config, "query_pre_attn_scalar")) ** -0.5
    if _get(config, "attn_logit_softcapping") is not None:
        options["softcap"] = float(_get(config, "attn_logit_softcapping"))
    return options


def _gpt_oss(config: Any, layer: int) -> dict[str, Any]:
    return {**_window(config, layer), "sinks": True}


@dataclass(frozen=True)
class Family:
    """How one Hugging Face family's attention layer maps onto our module.

    ``options(config, layer)`` gives the family's module options beyond Llama's (the attention ones:
    ``window``, ``scale``, ``softcap``, ``sinks``); ``extra_weights`` are parameters of the
    layer besides the four projections, copied under the same name into the canonical weights.
    """

    attention: str  # the transformers class, for messages and docs
    options: Callable[[Any, int], dict[str, Any]] = lambda config, layer: {}
    extra_weights: tuple[str, ...] = field(default=())


#: ``config.model_type`` -> :class:`Family`. A new family is a row here.
FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaAttention"),
    "mistral": Family("MistralAttention", _mistral_window),
    "gemma2": Family("Gemma2Attention", _gemma2),
    "gpt_oss": Family("GptOssAttention", _gpt_oss, extra_weights=("sinks",)),
}


def _family(config: Any) -> Family:
    model_type = _get(config, "model_type")
    if model_type not in FAMILIES:
        raise NotImplementedError(
            f"no converter for model_type {model_type!r}; known: {sorted(FAMILIES)} (add a row "
            "to impl_torch.hf.FAMILIES)"
        )
    return FAMILIES[model_type]


def _head_dim(config: Any) -> int:
    return int(
        _get(config, "head_dim")
        or _get(config, "hidden_size") // _get(config, "num_attention_heads")
    )


#: The ``rope_type`` values whose frequencies a module holds as ``rope_inv_freq`` (fixed at
#: construction); ``"default"`` is ``rope_theta`` alone.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def _theta_frequencies(theta: float, dim: int) -> np.ndarray:
    """``theta ** (-2p / dim)``, p = 0 .. dim/2 - 1, in float64 (SEMANTICS.md's RoPE)."""
    return np.array([theta ** (-2 * p / dim) for p in range(dim // 2)], np.float64)


def llama3_frequencies(rope: Mapping[str, Any], dim: int) -> np.ndarray:
    """Llama 3.1's ``"llama3"`` scaling, from Meta's published rule: a pair whose wavelength
    ``2 pi / f`` exceeds ``original_max_position_embeddings / low_freq_factor`` turns ``factor``
    times slower, one shorter than ``original / high_freq_factor`` is kept, and between the two
    ``f`` blends ``(1 - s) f / factor + s f`` with ``s = (original / wavelength - low) / (high -
    low)``. ``(dim/2,)`` float64."""
    base = _theta_frequencies(float(rope["rope_theta"]), dim)
    factor, original = float(rope["factor"]), float(rope["original_max_position_embeddings"])
    low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    wavelength = 2 * math.pi / base
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * base / factor + smooth * base
    slow, fast = wavelength > original / low, wavelength < original / high
    return np.where(slow, base / factor, np.where(fast, base, blended))


def yarn_frequencies(rope: Mapping[str, Any], dim: int, config: Any) -> tuple[np.ndarray, float]:
    """YaRN (Peng et al. 2023) as Hugging Face's layers run it: pairs turning fewer than
    ``beta_slow`` (1) times over ``original_max_position_embeddings`` are interpolated
    (``f / factor``), more than ``beta_fast`` (32) times kept, a linear ramp of the pair index
    between (its ends floored and ceiled unless ``truncate`` is false, gpt-oss). The cos/sin
    factor is ``attention_factor`` if given, else ``m(mscale) / m(mscale_all_dim)`` when both
    are set, else ``m(1)``, with :func:`yarn_mscale`. ``factor`` missing is
    ``max_position_embeddings / original``. Returns ``(inv_freq (dim/2,), attention_factor)``."""
    theta, original = float(rope["rope_theta"]), float(rope["original_max_position_embeddings"])
    factor = rope.get("factor") or float(_get(config, "max_position_embeddings")) / original
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    attention_factor = rope.get("attention_factor")
    if attention_factor is None and mscale and mscale_all_dim:
        attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    elif attention_factor is None:
        attention_factor = yarn_mscale(factor, 1.0)

    def pair_turning(turns: float) -> float:  # the (fractional) pair index turning `turns` times
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_turning(rope.get("beta_fast") or 32), pair_turning(rope.get("beta_slow") or 1)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = np.clip((np.arange(dim // 2) - low) / ((high - low) or 0.001), 0.0, 1.0)
    base = _theta_frequencies(theta, dim)
    return base / factor * ramp + base * (1 - ramp), float(attention_factor)


def _rope(config: Any) -> dict[str, Any]:
    """The module's RoPE keywords of a config's ``rope_parameters`` (transformers 5) or
    ``rope_scaling`` (4): ``rope_theta``, and for a static scaling (``linear``: every frequency
    divided by ``factor``; ``llama3``: :func:`llama3_frequencies`; ``yarn``:
    :func:`yarn_frequencies`) the frequencies ``rope_inv_freq (D/2,)`` float64 and
    ``rope_attention_factor``.

    Raises:
        NotImplementedError: ``dynamic`` (its frequencies change with the sequence length of
        each forward) or a rope_type without a static form here (``longrope``, ...).
    """
    rope = _rope_parameters(config)
    rope_type, theta, dim = rope["rope_type"], float(rope["rope_theta"]), _head_dim(config)
    if rope_type == "dynamic":
        raise NotImplementedError(
            "rope_type 'dynamic' (dynamic NTK) recomputes theta from the sequence length of every "
            "forward past max_position_embeddings: a module's rope_inv_freq is fixed at "
            "construction, so it has no static form (static scalings: "
            f"{', '.join(STATIC_ROPE_TYPES)})"
        )
    if rope_type not in STATIC_ROPE_TYPES:
        raise NotImplementedError(
            f"rope_type {rope_type!r} rescales the rotary frequencies in a way this converter "
            f"does not compute; the static scalings are {', '.join(STATIC_ROPE_TYPES)}"
        )
    options: dict[str, Any] = {"rope_theta": theta}
    if rope_type == "linear":
        options["rope_inv_freq"] = _theta_frequencies(theta, dim) / float(rope["factor"])
    elif rope_type == "llama3":
        options["rope_inv_freq"] = llama3_frequencies(rope, dim)
    elif rope_type == "yarn":
        inv_freq, factor = yarn_frequencies(rope, dim, config)
        options |= {"rope_inv_freq": inv_freq, "rope_attention_factor": factor}
    return options


def module_options(config: Any, layer: int = 0) -> dict[str, Any]:
    """The keywords of our ``GroupedQueryAttention`` that reproduce layer ``layer`` of a model.

    ``config`` is a ``transformers`` config or a ``config.json`` dict. The result holds the
    sizes (``d_model``, ``n_heads``, ``n_kv_heads``, ``head_dim``, ``bias``), the RoPE settings
    (``rope_theta``, ``rope_interleaved=False``; a static rope scaling as ``rope_inv_freq`` and
    ``rope_attention_factor``, see :func:`_rope`) and the family's attention options (``window``,
    ``scale``, ``softcap``, ``sinks``), already converted to our semantics.

    Raises:
        NotImplementedError: an unknown family, or a RoPE scaling SEMANTICS.md has no form for.
    """
    if _is_latent(config):
        return mla_options(config)
    family = _family(config)
    options = {
        "d_model": int(_get(config, "hidden_size")),
        "n_heads": int(_get(config, "num_attention_heads")),
        "n_kv_heads": int(
            _get(config, "num_key_value_heads") or _get(config, "num_attention_heads")
        ),
        "head_dim": _head_dim(config),
        "bias": bool(_get(config, "attention_bias", False)),
        **_rope(config),  # rope_theta, and rope_inv_freq / rope_attention_factor if scaled
        "rope_interleaved": False,  # rotate_half: pairs (x[p], x[p + D/2])
    }
    return options | family.options(config, layer)


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


def _canonical_from_state(state: Mapping[str, torch.Tensor], extras: tuple[str, ...]) -> dict:
    """Canonical weights from a layer's ``q_proj.weight (out, in)``, ... tensors."""
    weights = {}
    for name in PROJECTIONS:
        weights[f"{name}.kernel"] = tensor_to_numpy(linear_weight(state[f"{name}.weight"]))
        if f"{name}.bias" in state:
            weights[f"{name}.bias"] = tensor_to_numpy(state[f"{name}.bias"])  # (out,)
    for name in extras:
        weights[name] = tensor_to_numpy(state[name])  # sinks (H,)
    return weights


def from_hf_attention(attention: torch.nn.Module) -> dict[str, np.ndarray]:
    """The canonical weights of a Hugging Face attention layer (``LlamaAttention``, ...): the
    four kernels ``(in, out)``, their biases if it has them, and the family's extra weights
    (gpt-oss: ``sinks (H,)``), as NumPy arrays in the layer's dtype."""
    if _is_latent(attention.config):
        mla_options(attention.config)  # refuses attention_bias=True
        return _mla_canonical_from_state(dict(attention.state_dict()))
    family = _family(attention.config)
    return _canonical_from_state(dict(attention.state_dict()), family.extra_weights)


def hf_state_dict(weights: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Canonical weights as a Hugging Face attention layer's state dict (``q_proj.weight
    (out, in)``, ...; extra weights such as ``sinks`` as they are): ``load_state_dict`` it."""
    state = {}
    for name, array in weights.items():
        proj, _, kind = name.partition(".")
        tensor = tensor_from_numpy(array)
        state[f"{proj}.weight" if kind == "kernel" else name] = (
            linear_weight(tensor) if kind == "kernel" else tensor
        )
    return state


def _checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint: a file, or a ``save_pretrained`` folder (one
    ``model.safetensors`` or the shards its ``model.safetensors.index.json`` lists)."""
    if path.is_file():
        return [path]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / shard for shard in shards]
    return [path / "model.safetensors"]


def load_hf_attention(
    path: str | os.PathLike, layer: int, *, prefix: str = "model.layers.{layer}.self_attn."
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The canonical weights and :func:`module_options` of attention layer ``layer`` of a
    Hugging Face checkpoint (a ``save_pretrained`` folder with its ``config.json``), reading
    only that layer's tensors (``model.layers.N.self_attn.q_proj.weight``, ...)."""
    path = Path(path)
    config = json.loads(((path if path.is_dir() else path.parent) / "config.json").read_text())
    latent = _is_latent(config)
    options = module_options(config, layer)  # refuses what we cannot express, before reading
    family = None if latent else _family(config)
    head = prefix.format(layer=layer)
    state: dict[str, torch.Tensor] = {}
    for file in _checkpoint_files(path):
        with safe_open(os.fspath(file), framework="pt") as f:
            for key in f.keys():
                if key.startswith(head):
                    state[key[len(head) :]] = f.get_tensor(key)
    if "o_proj.weight" not in state:
        raise KeyError(f"no tensor {head}o_proj.weight in {path}")
    if latent:
        return _mla_canonical_from_state(state), options
    return _canonical_from_state(state, family.extra_weights), options


def interleave_qk(weights: Mapping[str, np.ndarray], *, n_heads: int, n_kv_heads: int) -> dict:
    """Canonical weights whose query and key features of each head are reordered from
    half-split pairs ``(p, p + D/2)`` (Hugging Face) to interleaved pairs ``(2p, 2p + 1)``
    (Meta's Llama, GPT-J): a module with ``rope_interleaved=True`` on the result computes what
    one with ``rope_interleaved=False`` computes on ``weights``."""
    out = dict(weights)
    for name, heads in (("q_proj", n_heads), ("k_proj", n_kv_heads)):
        kernel = weights[f"{name}.kernel"]  # (M, heads*D)
        D = kernel.shape[1] // heads
        order = np.arange(D).reshape(2, D // 2).T.reshape(D)  # slot 2p <- p, 2p+1 <- p + D/2
        columns = (np.arange(heads)[:, None] * D + order[None, :]).reshape(-1)  # (heads*D,)
        out[f"{name}.kernel"] = kernel[:, columns]
        if f"{name}.bias" in weights:
            out[f"{name}.bias"] = weights[f"{name}.bias"][columns]
    return out


# ---------------------------------------------------------------------------------------------
# Our module for a layer
# ---------------------------------------------------------------------------------------------


def attention_module(
    impl: ModuleType, weights: Mapping[str, np.ndarray], options: Mapping[str, Any], **kw: Any
) -> Any:
    """``impl.GroupedQueryAttention`` (``impl_numpy``, ``impl_torch`` or ``impl_jax``) holding
    ``weights`` with the settings ``options`` of :func:`module_options`; ``kw`` goes to
    ``from_canonical`` (``dtype=``, torch's ``device=``).

    Raises:
        NotImplementedError: an option the module does not take, named.
    """
    if "qk_rope_head_dim" in options:  # mla_options: a latent attention layer
        return latent_attention_module(impl, weights, options, **kw)
    load = impl.GroupedQueryAttention.from_canonical
    settings = {k: v for k, v in options.items() if k not in SIZE_KEYS}
    missing = [k for k in settings if k not in inspect.signature(load).parameters]
    if missing:
        wanted = ", ".join(f"{k}={settings[k]!r}" for k in missing)
        raise NotImplementedError(
            f"this layer needs the module option(s) {wanted} (SEMANTICS.md, contract v2), which "
            f"{impl.__name__}.GroupedQueryAttention does not take yet"
        )
    return load(
        dict(weights), n_heads=options["n_heads"], n_kv_heads=options["n_kv_heads"], **settings,
        **kw,
    )


# ---------------------------------------------------------------------------------------------
# Multi-head latent attention (DeepSeek-V3: DeepseekV3Attention)
# ---------------------------------------------------------------------------------------------

#: ``config.model_type`` -> the transformers class of a multi-head latent attention layer.
LATENT_FAMILIES = {"deepseek_v3": "DeepseekV3Attention"}


def _is_latent(config: Any) -> bool:
    return _get(config, "model_type") in LATENT_FAMILIES


def _rope_parameters(config: Any) -> dict[str, Any]:
    rope = dict(_get(config, "rope_parameters") or _get(config, "rope_scaling") or {})
    rope.setdefault("rope_type", rope.pop("type", "default"))
    rope.setdefault("rope_theta", _get(config, "rope_theta", 10000.0))
    return rope


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's ``m(a) = 0.1 a ln(factor) + 1`` (1 when ``factor <= 1``), DeepSeek's form."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_softmax_scale(config: Any) -> float:
    """DeepSeek-V3's softmax scale: ``(Dn + Dr) ** -0.5``, times ``m(mscale_all_dim) ** 2``
    under a rope scaling with ``mscale_all_dim`` (once for the query's, once for the key's
    share of the correction the rotary factor divides out)."""
    scale = (int(_get(config, "qk_nope_head_dim")) + int(_get(config, "qk_rope_head_dim"))) ** -0.5
    rope = _rope_parameters(config)
    if rope["rope_type"] != "default" and rope.get("mscale_all_dim"):
        scale *= yarn_mscale(float(rope["factor"]), float(rope["mscale_all_dim"])) ** 2
    return scale


def _mla_rope(config: Any) -> dict[str, Any]:
    """``rope_theta`` for the default RoPE; otherwise the frequencies and the cos/sin factor of
    Hugging Face's own rope function (``ROPE_INIT_FUNCTIONS``, float32 as the layer holds them):
    ``rope_inv_freq (Dr/2,)`` and ``rope_attention_factor``."""
    rope = _rope_parameters(config)
    if rope["rope_type"] == "default":
        return {"rope_theta": float(rope["rope_theta"])}
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope["rope_type"] not in ROPE_INIT_FUNCTIONS:
        raise NotImplementedError(f"transformers has no rope_type {rope['rope_type']!r}")
    if isinstance(config, Mapping):  # a config.json: transformers' own config of it
        config = transformers.DeepseekV3Config(
            **{k: v for k, v in config.items() if k != "model_type"}
        )
    inv_freq, factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu")
    return {
        "rope_inv_freq": inv_freq.to(torch.float64).numpy(),  # (Dr/2,)
        "rope_attention_factor": float(factor),
    }


def mla_options(config: Any, layer: int = 0) -> dict[str, Any]:
    """The keywords of ``MultiHeadLatentAttention.from_canonical`` that reproduce an attention
    layer of a DeepSeek-V3 model (every layer's is the same): ``n_heads``,
    ``qk_rope_head_dim``, ``rope_interleaved`` (``rope_interleave``), the RoPE (``rope_theta``,
    or YaRN's ``rope_inv_freq`` and ``rope_attention_factor = m(mscale) / m(mscale_all_dim)``),
    ``scale`` (:func:`mla_softmax_scale`) and ``rms_norm_eps`` (the layer's norms use 1e-6
    whatever the config says).

    Raises:
        DimensionMismatchError ``weight_shape``: ``attention_bias=True`` (biases on
        ``q_a_proj``, ``kv_a_proj_with_mqa`` and ``o_proj``; MLA's canonical weights have none).
    """
    if _get(config, "attention_bias", False):
        raise make_error(
            "weight_shape",
            f"{LATENT_FAMILIES[_get(config, 'model_type')]} with attention_bias=True has biases "
            "on q_a_proj, kv_a_proj_with_mqa and o_proj; MultiHeadLatentAttention's canonical "
            "weights have none",
            expected="attention_bias=False",
            actual="attention_bias=True",
        )
    return {
        "n_heads": int(_get(config, "num_attention_heads")),
        "qk_rope_head_dim": int(_get(config, "qk_rope_head_dim")),
        "rope_interleaved": bool(_get(config, "rope_interleave", True)),
        **_mla_rope(config),
        "scale": mla_softmax_scale(config),
        "rms_norm_eps": 1e-6,
    }


def _mla_canonical_from_state(state: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Canonical MLA weights: every ``nn.Linear`` weight ``(out, in)`` as a kernel ``(in, out)``,
    the norms' ``*_layernorm.weight`` as they are; a bias is refused (``weight_shape``)."""
    weights = {}
    for name, tensor in state.items():
        module, _, kind = name.rpartition(".")
        if kind == "bias":
            raise make_error(
                "weight_shape",
                f"MultiHeadLatentAttention's canonical weights have no biases; got {name}",
                expected="no biases",
                actual=name,
            )
        if module.endswith("layernorm"):
            weights[name] = tensor_to_numpy(tensor)  # (Q,) or (R,)
        else:
            weights[f"{module}.kernel"] = tensor_to_numpy(linear_weight(tensor))
    return weights


def latent_attention_module(
    impl: ModuleType, weights: Mapping[str, np.ndarray], options: Mapping[str, Any], **kw: Any
) -> Any:
    """``impl.MultiHeadLatentAttention`` holding ``weights`` with the settings of
    :func:`mla_options`; ``kw`` goes to ``from_canonical`` (``dtype=``, torch's ``device=``)."""
    return impl.MultiHeadLatentAttention.from_canonical(dict(weights), **options, **kw)
