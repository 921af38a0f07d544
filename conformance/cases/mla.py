"""Multi-head latent attention cases (Contract v3): ``MultiHeadLatentAttention`` from its
canonical weights (Hugging Face ``DeepseekV3Attention``'s names, ``(in, out)`` kernels).

``module.mla.*``: one forward of the module (self-attention); the golden is the oracle's own
MLA (:func:`conformance.oracle.mla_forward`: every head's key and value built from the latent,
the one rotated key head copied into each). ``decode.mla.*``: the same sequence through
``init_cache`` / ``decode``, the absorbed step over the latent cache (``c_kv``, rotated
``k_pe``), token by token and in chunks, against the rows of one causal forward. The module's
settings (``qk_rope_head_dim``, ``rope_*``, ``window``, ``softcap``, ``scale``) travel in the
manifest's module spec, the keywords of ``from_canonical``.

Sizes pairwise distinct: B=2, L=5, M=24, H=3, Q=7, R=11, Dn=5, Dr=4, E=6 (D = Dn + Dr = 9 and
R + Dr = 15 differ too, so a scale from the wrong width is a wrong number).
"""

from __future__ import annotations

import math

import numpy as np

from conformance.cases.base import ALL_DTYPES, MB, ML, MM, ModuleCall, case, normal, z
from conformance.cases.decode import DECODE_T
from conformance.cases.errors import construct, load, module_error_case
from conformance.cases.rope import yarn_inv_freq

H, Q, R, Dn, Dr, E = 3, 7, 11, 5, 4, 6
MLA = "MultiHeadLatentAttention"
#: MLA's forward runs are ``module`` alone: ``head_parallel_gqa`` shards a GQA module's key/value
#: heads, and latent attention has no sharded form in the contract.
MODULE_ONLY = ("module",)


def mla_weights(rng, *, q_lora: int | None = Q, m: int = MM, sinks: bool = False) -> dict:
    """Canonical MLA weights: kernels of order 1/sqrt(in), the two norms' weights in
    [0.5, 1.5] (a norm applied without its weight, or not at all, shows), sinks near h/2 - 1."""
    shapes = {}
    if q_lora is None:
        shapes["q_proj.kernel"] = (m, H * (Dn + Dr))
    else:
        shapes |= {"q_a_proj.kernel": (m, q_lora), "q_a_layernorm.weight": (q_lora,),
                   "q_b_proj.kernel": (q_lora, H * (Dn + Dr))}
    shapes |= {"kv_a_proj_with_mqa.kernel": (m, R + Dr), "kv_a_layernorm.weight": (R,),
               "kv_b_proj.kernel": (R, H * (Dn + E)), "o_proj.kernel": (H * E, m)}
    weights = {}
    for name, shape in shapes.items():
        if name.endswith(".weight"):
            weights[name] = rng.uniform(0.5, 1.5, shape)
        else:
            weights[name] = normal(rng, *shape) / math.sqrt(shape[0])
    if sinks:
        weights["sinks"] = normal(rng, H) * 0.5 + np.arange(H) / 2.0 - 1.0
    return weights


def _mla(weights, x, *, keywords=None, mask=None, **options) -> ModuleCall:
    options = {"qk_rope_head_dim": Dr, **options}
    return ModuleCall(weights, x, n_heads=H, n_kv_heads=1, cls=MLA, mask=mask,
                      keywords=keywords or {}, options=options)


def yarn_settings(factor: float = 4.0, mscale: float = 1.0, mscale_all_dim: float = 0.5):
    """DeepSeek's YaRN for this module, from the published formulas: the frequencies and
    ``attention_factor = m(mscale) / m(mscale_all_dim)`` on cos and sin, and the softmax scale
    ``(Dn + Dr) ** -0.5 * m(mscale_all_dim) ** 2``, with ``m(a) = 0.1 a ln(factor) + 1``."""

    def m(a: float) -> float:
        return 0.1 * a * math.log(factor) + 1.0 if factor > 1 else 1.0

    inv_freq, _ = yarn_inv_freq(10000.0, Dr, factor, 16)
    return {"rope_inv_freq": [float(f) for f in inv_freq],
            "rope_attention_factor": m(mscale) / m(mscale_all_dim),
            "scale": (Dn + Dr) ** -0.5 * m(mscale_all_dim) ** 2}


@case("module", "mla.q_proj.causal", ALL_DTYPES, functions=MODULE_ONLY)
def module_mla_q_proj(rng, dtype):
    """q_lora_rank None (one q_proj), causal, the weights of every head: keys and values of the
    three heads from one latent, the rope part of every key the same rotated k_pe."""
    return _mla(mla_weights(rng, q_lora=None), normal(rng, MB, ML, MM),
                keywords={"is_causal": True, "return_weights": True})


@case("module", "mla.q_lora.interleaved.causal", ALL_DTYPES, functions=MODULE_ONLY)
def module_mla_q_lora_interleaved(rng, dtype):
    """q_lora_rank 7 (q_a_proj, RMSNorm, q_b_proj), interleaved rope pairs (DeepSeek's
    checkpoints), causal with bottom_right alignment (L = S: the lower triangle too)."""
    return _mla(mla_weights(rng), normal(rng, MB, ML, MM), rope_interleaved=True,
                keywords={"is_causal": True, "causal_alignment": "bottom_right",
                          "return_weights": True})


@case("module", "mla.yarn.causal", ("float64", "float32"), functions=MODULE_ONLY)
def module_mla_yarn(rng, dtype):
    """DeepSeek's YaRN (factor 4, mscale 1, mscale_all_dim 0.5): scaled frequencies, attention
    factor 1.0648 on cos and sin, softmax scale (Dn + Dr) ** -0.5 * 1.0693 ** 2. A port taking
    the scale from R + Dr or squaring the attention factor into it fails."""
    return _mla(mla_weights(rng), normal(rng, MB, ML, MM), **yarn_settings(),
                keywords={"is_causal": True, "return_weights": True})


@case("module", "mla.mask.fully_masked_row", ("float32", "bfloat16"), functions=MODULE_ONLY)
def module_mla_fully_masked(rng, dtype):
    """A (B, 1, L, S) mask with query row 2 of example 1 masked everywhere: that row's output is
    o_proj of zeros, zero; the other rows see a ragged set of keys."""
    mask = np.tril(np.ones((MB, 1, ML, ML), bool), 1)
    mask[1, 0, 2, :] = False
    return _mla(mla_weights(rng, q_lora=None), normal(rng, MB, ML, MM), mask=mask,
                keywords={"return_weights": True})


@case("module", "mla.window.sinks.softcap", ("float64", "float32"), functions=MODULE_ONLY)
def module_mla_window_sinks(rng, dtype):
    """window (2, 0), learned sinks (H,), softcap 5, causal: the v2 settings on MLA's scores."""
    return _mla(mla_weights(rng, sinks=True), normal(rng, MB, ML, MM), window=[2, 0], softcap=5.0,
                keywords={"is_causal": True, "return_weights": True})


@case("decode", "mla.q_lora", ALL_DTYPES)
def decode_mla_q_lora(rng, dtype):
    """The absorbed decode through the latent cache (R + Dr = 15 numbers per token, against
    H (Dn + Dr + E) = 45 for the naive cache), q_lora_rank 7, half-split rope pairs."""
    return _mla(mla_weights(rng), normal(rng, MB, DECODE_T, MM), keywords={"is_causal": True})


@case("decode", "mla.q_proj.yarn.sinks", ("float64", "float32"))
def decode_mla_yarn(rng, dtype):
    """The absorbed decode with YaRN, interleaved pairs, sinks and softcap 5: the step's one
    MQA call takes the module's scale, (Dn + Dr) ** -0.5 * mscale ** 2, not (R + Dr) ** -0.5."""
    return _mla(mla_weights(rng, q_lora=None, sinks=True), normal(rng, MB, DECODE_T, MM),
                rope_interleaved=True, softcap=5.0, **yarn_settings(),
                keywords={"is_causal": True})


def _zeros(weights: dict) -> dict:
    return {name: z(*w.shape) for name, w in weights.items()}


@module_error_case("mla_odd_rope_dim", "ConfigError", "mla_dims")
def err_mla_odd_rope_dim():
    """MultiHeadLatentAttention with qk_rope_head_dim 5: RoPE rotates pairs."""
    return construct(MLA, d_model=MM, n_heads=H, kv_lora_rank=R, qk_nope_head_dim=Dn,
                     qk_rope_head_dim=5, v_head_dim=E)


@module_error_case("mla_zero_rank", "ConfigError", "mla_dims")
def err_mla_zero_rank():
    """MultiHeadLatentAttention with kv_lora_rank 0."""
    return construct(MLA, d_model=MM, n_heads=H, kv_lora_rank=0, qk_nope_head_dim=Dn,
                     qk_rope_head_dim=Dr, v_head_dim=E)


@module_error_case("mla_kv_b_transposed", "DimensionMismatchError", "weight_shape")
def err_mla_kv_b_transposed():
    """kv_b_proj.kernel given as torch's (out, in) = (H*(Dn+E), R), not (R, H*(Dn+E))."""
    weights = mla_weights(np.random.default_rng(0))
    weights["kv_b_proj.kernel"] = weights["kv_b_proj.kernel"].T
    call = load(_zeros(weights), cls=MLA, n_heads=H, n_kv_heads=None)
    call.arguments = {"qk_rope_head_dim": Dr}
    return call


@module_error_case("mla_norm_missing", "DimensionMismatchError", "weight_shape")
def err_mla_norm_missing():
    """The weights without kv_a_layernorm.weight: the latent's norm is part of the layer."""
    weights = mla_weights(np.random.default_rng(0))
    del weights["kv_a_layernorm.weight"]
    call = load(_zeros(weights), cls=MLA, n_heads=H, n_kv_heads=None)
    call.arguments = {"qk_rope_head_dim": Dr}
    return call
