"""Rotary position embedding cases: ``apply_rotary`` itself, and modules built with RoPE.

``@rope_case`` functions build ``x (..., heads, L, D)`` and integer ``positions`` for one call of
``apply_rotary(x, positions, **keywords)`` (``rope.<name>.<dtype>``); the golden is the oracle's
:func:`~conformance.oracle.rotary`, one pair of one token at a time. ``@rope_error_case``
functions give the shapes, dtypes and keywords of a call that must raise
(``rope.error.<name>.<dtype>``). The module and decode cases at the end build
``GroupedQueryAttention``/``MultiHeadAttention`` with ``rope_theta`` (``module.rope.*``,
``decode.rope.*``) and with scaled frequencies, ``rope_inv_freq`` / ``rope_attention_factor``
(``module.rope_scaled.*``, ``decode.rope_scaled.*``): the settings travel in the manifest's
module spec, which the runner passes to ``from_canonical``.

Sizes: B=2, 3 heads, L=5, D=12 (pairwise distinct with the pair count P = 6), so a pair built
across the wrong axis or from the wrong end is a wrong number, not a silent pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from conformance.cases.base import (
    ALL_DTYPES,
    F32,
    MB,
    ML,
    MM,
    MS,
    H,
    K,
    ModuleCall,
    ModuleErrorCall,
    Zeros,
    canonical,
    case,
    normal,
    z,
)
from conformance.cases.decode import DECODE_T

RB, RH, RL, RD = 2, 3, 5, 12


@dataclass
class RopeCall:
    """One ``apply_rotary(x, positions, **keywords)`` call: float64 ``x``, integer
    ``positions`` (stored as int64), or :class:`Zeros` of both for an error case (an ``x`` of
    dtype ``"none"`` is None)."""

    x: Any
    positions: Any
    keywords: dict[str, Any] = field(default_factory=dict)
    inv_freq: Any = None  # (R/2,) float64 frequencies (stored as a tensor), or Zeros, or None
    #: Hugging Face's ``rope_parameters`` that should give ``inv_freq`` and the attention factor
    #: (the generator's cross-check against transformers' ``ROPE_INIT_FUNCTIONS``), or None.
    hf_rope_parameters: dict[str, Any] | None = None


def rope(x, positions, *, inv_freq=None, hf_rope_parameters=None, **keywords) -> RopeCall:
    return RopeCall(x, positions, keywords, inv_freq, hf_rope_parameters)


rope_case = partial(case, "rope", functions=("rope",))


def rope_error_case(name: str, error_class: str, code: str):
    """Register ``fn() -> RopeCall`` (of :class:`Zeros`) as ``rope.error.<name>.<x dtype>``."""

    def register(fn):
        x = fn().x
        dtype = x.dtype if x.dtype != "none" else "float32"
        return case("rope", name, (dtype,), functions=("rope",), error=(error_class, code))(fn)

    return register


def _x(rng, *shape: int) -> np.ndarray:
    return normal(rng, *shape) if shape else normal(rng, RB, RH, RL, RD)


# ---------------------------------------------------------------------------------------------
# apply_rotary: the two pair conventions, partial rotary dims, positions
# ---------------------------------------------------------------------------------------------


@rope_case("half.d12", ALL_DTYPES)
def rope_half(rng, dtype):
    """Half-split pairs (x[p], x[p + 6]) (Llama, GPT-NeoX, Hugging Face rotate_half) at
    positions 0..4, theta 10000: pair p turns by t * 10000 ** (-p / 6). A port pairing
    (x[2p], x[2p + 1]) instead fails here."""
    return rope(_x(rng), np.arange(RL))


@rope_case("interleaved.d12", ALL_DTYPES)
def rope_interleaved(rng, dtype):
    """Interleaved pairs (x[2p], x[2p + 1]) (GPT-J, RoFormer), the same positions: a port that
    half-splits fails here."""
    return rope(_x(rng), np.arange(RL), interleaved=True)


@rope_case("partial.half.r4_d12", ALL_DTYPES)
def rope_partial_half(rng, dtype):
    """rotary_dim = 4 of D = 12 (as GPT-NeoX's rotary_pct): pairs (x[p], x[p + 2]) for p < 2 turn
    by t * 10000 ** (-p / 2); features 4..11 pass through unchanged, in the input dtype."""
    return rope(_x(rng), np.arange(RL), rotary_dim=4)


@rope_case("partial.interleaved.r6_d12", ("float32", "bfloat16"))
def rope_partial_interleaved(rng, dtype):
    """rotary_dim = 6, interleaved: pairs (0, 1), (2, 3), (4, 5); features 6..11 pass through.
    The frequencies use rotary_dim, not D (theta ** (-2p / 6))."""
    return rope(_x(rng), np.arange(RL), rotary_dim=6, interleaved=True)


@rope_case("rotary_dim_2", F32)
def rope_one_pair(rng, dtype):
    """rotary_dim = 2: one pair, frequency 1, angle = position (in radians)."""
    return rope(_x(rng), np.array([0, 1, 2, 3, 4]), rotary_dim=2)


@rope_case("positions.per_example", ALL_DTYPES)
def rope_positions_per_example(rng, dtype):
    """Positions (B, L) that are neither contiguous nor sorted nor shared: example 0 at
    [3, 0, 9, 2, 2] (a repeat), example 1 at [17, 5, 6, 1, 40]. Every head of a token turns
    alike; a port indexing positions by head, or assuming arange(L), fails."""
    return rope(_x(rng), np.array([[3, 0, 9, 2, 2], [17, 5, 6, 1, 40]]))


@rope_case("positions.negative")
def rope_positions_negative(rng, dtype):
    """Negative positions (-2 .. 2) turn the other way: a module with bottom-right alignment
    and L > S puts its first queries there."""
    return rope(_x(rng), np.array([-2, -1, 0, 1, 2]))


@rope_case("positions.large_1e5", ALL_DTYPES)
def rope_large_positions(rng, dtype):
    """Positions near 1e5 (a long context), (B, L) with odd values: the angle of pair 0 is
    ~1e5 rad, where one float32 ulp is 0.0078. The plain float32 computation (angles, cos and
    sin in float32, as SEMANTICS.md prescribes) is then off by about 1e-2 and the bound says
    so; a port computing its angles in float16 or bfloat16 is off by O(1) and fails."""
    positions = np.array([[100000, 100001, 99999, 123457, 65536], [99991, 0, 104729, 7, 100003]])
    return rope(_x(rng), positions)


@rope_case("theta.llama3")
def rope_theta_llama3(rng, dtype):
    """theta = 500000 (Llama 3): pair p turns by t * 500000 ** (-p / 6); a port that ignores
    theta (10000 always) fails."""
    return rope(_x(rng), np.arange(RL), theta=500000.0)


@rope_case("theta.small", ("float64", "float32"))
def rope_theta_small(rng, dtype):
    """theta = 10 at positions 0..4: every pair turns by a large angle, so a frequency exponent
    off by a factor 2 (theta ** (-p / R) instead of theta ** (-2p / R)) is a large error."""
    return rope(_x(rng), np.arange(RL), theta=10.0)


@rope_case("batch.many_dims")
def rope_batch_many_dims(rng, dtype):
    """x (2, 3, 4, 5, 8) with positions (3, 5): two batch dims (2, 3), positions broadcast
    along the first and shared by the 4 heads."""
    positions = np.array([[0, 1, 2, 3, 4], [5, 3, 1, 0, 2], [9, 8, 7, 6, 5]])
    return rope(_x(rng, 2, 3, 4, 5, 8), positions)


@rope_case("batch.none")
def rope_batch_none(rng, dtype):
    """x (heads, L, D) = (3, 5, 12) with no batch dim, positions (L,)."""
    return rope(_x(rng, RH, RL, RD), np.array([4, 3, 2, 1, 0]))


@rope_case("shapes.l0")
def rope_l0(rng, dtype):
    """L = 0 tokens: an empty result of x's shape."""
    return rope(_x(rng, RB, RH, 0, RD), np.zeros((0,), dtype=np.int64))


# ---------------------------------------------------------------------------------------------
# apply_rotary: scaled frequencies (inv_freq=, attention_factor=; Contract v3)
# ---------------------------------------------------------------------------------------------


def llama3_inv_freq(
    theta: float, rotary_dim: int, factor: float, low_freq_factor: float,
    high_freq_factor: float, original_max_position_embeddings: int,
) -> np.ndarray:
    """Llama 3.1's ``rope_scaling={"rope_type": "llama3", ...}`` from its published formula:
    wavelengths ``2 pi / f`` longer than ``original / low_freq_factor`` are divided by
    ``factor``, shorter than ``original / high_freq_factor`` kept, and the band between blends
    the two with ``smooth = (original / wavelength - low) / (high - low)``."""
    base = np.array([theta ** (-2 * p / rotary_dim) for p in range(rotary_dim // 2)])
    wavelength = 2 * np.pi / base
    low_wavelength = original_max_position_embeddings / low_freq_factor
    high_wavelength = original_max_position_embeddings / high_freq_factor
    smooth = (original_max_position_embeddings / wavelength - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    blended = (1 - smooth) * base / factor + smooth * base
    return np.where(wavelength > low_wavelength, base / factor,
                    np.where(wavelength < high_wavelength, base, blended))


def yarn_inv_freq(
    theta: float, rotary_dim: int, factor: float, original_max_position_embeddings: int,
    beta_fast: float = 32.0, beta_slow: float = 1.0,
) -> tuple[np.ndarray, float]:
    """YaRN (Peng et al. 2023) from its published formulas: the pairs that turn fewer than
    ``beta_slow`` times over the original context are interpolated (``f / factor``), those that
    turn more than ``beta_fast`` times kept, a linear ramp between; the attention factor is
    ``0.1 ln(factor) + 1``. Returns ``(inv_freq (R/2,), attention_factor)``."""
    P = rotary_dim // 2

    def pair_of(turns: float) -> float:  # the pair index that turns `turns` times
        ratio = original_max_position_embeddings / (turns * 2 * np.pi)
        return rotary_dim * np.log(ratio) / (2 * np.log(theta))

    low = max(int(np.floor(pair_of(beta_fast))), 0)
    high = min(int(np.ceil(pair_of(beta_slow))), rotary_dim - 1)
    ramp = np.clip((np.arange(P) - low) / max(high - low, 1e-3), 0.0, 1.0)
    base = np.array([theta ** (-2 * p / rotary_dim) for p in range(P)])
    keep = 1.0 - ramp  # 1 for the fast pairs (extrapolated), 0 for the slow (interpolated)
    return base / factor * (1 - keep) + base * keep, 0.1 * float(np.log(factor)) + 1.0


#: Hugging Face's rope_parameters of the YaRN cases (rotary_dim 8 is the config's head_dim there).
YARN_HF = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
           "original_max_position_embeddings": 2048}

#: Positions spread over a long context, so the scaled low frequencies turn visibly.
LONG_POSITIONS = np.array([[0, 7, 300, 5000, 12000], [9000, 1, 2047, 64, 30000]])


@rope_case("inv_freq.llama3.half.d12", ALL_DTYPES)
def rope_inv_freq_llama3(rng, dtype):
    """Llama 3.1's scaling (factor 8, low 1, high 4, original 8192) of theta = 500000, D = 12:
    pairs 0..2 kept, pair 3 blended, pairs 4, 5 divided by 8. theta is given too and unused
    (inv_freq wins): a port that ignores inv_freq, or blends it with theta, fails."""
    inv_freq = llama3_inv_freq(500000.0, RD, 8.0, 1.0, 4.0, 8192)
    hf = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    return rope(_x(rng), LONG_POSITIONS, theta=500000.0, inv_freq=inv_freq, hf_rope_parameters=hf)


@rope_case("inv_freq.yarn.interleaved.r8_d12", ALL_DTYPES)
def rope_inv_freq_yarn_interleaved(rng, dtype):
    """YaRN (factor 4, original 2048, theta 10000) on rotary_dim = 8 of D = 12, interleaved
    pairs, attention_factor 0.1 ln 4 + 1 = 1.1386 on cos and sin: pairs 0, 1 kept, pair 2
    half-way, pair 3 divided by 4; features 8..11 pass through unscaled."""
    inv_freq, factor = yarn_inv_freq(10000.0, 8, 4.0, 2048)
    return rope(_x(rng), LONG_POSITIONS, rotary_dim=8, interleaved=True, inv_freq=inv_freq,
                attention_factor=factor, hf_rope_parameters=YARN_HF)


@rope_case("inv_freq.yarn.half.r8_d12", ("float64", "float32"))
def rope_inv_freq_yarn_half(rng, dtype):
    """The same YaRN frequencies and factor with half-split pairs (x[p], x[p + 4])."""
    inv_freq, factor = yarn_inv_freq(10000.0, 8, 4.0, 2048)
    return rope(_x(rng), LONG_POSITIONS, rotary_dim=8, inv_freq=inv_freq,
                attention_factor=factor, hf_rope_parameters=YARN_HF)


@rope_case("attention_factor.d12", ("float64", "float32"))
def rope_attention_factor(rng, dtype):
    """attention_factor = 1.5 with theta's own frequencies: the rotated features grow by 1.5
    (cos and sin both scaled); a port scaling only one of them, or the features beyond
    rotary_dim, fails."""
    return rope(_x(rng), np.arange(RL), rotary_dim=8, attention_factor=1.5)


# ---------------------------------------------------------------------------------------------
# apply_rotary: errors
# ---------------------------------------------------------------------------------------------

RX = z(RB, RH, RL, RD)
RP = z(RL, dtype="int64")


@rope_error_case("rotary_dim_odd", "ConfigError", "rotary_dim")
def rope_err_rotary_dim_odd():
    """rotary_dim = 5: features rotate in pairs, so it must be even."""
    return rope(RX, RP, rotary_dim=5)


@rope_error_case("rotary_dim_beyond_d", "ConfigError", "rotary_dim")
def rope_err_rotary_dim_beyond_d():
    """rotary_dim = 14 > D = 12."""
    return rope(RX, RP, rotary_dim=14)


@rope_error_case("rotary_dim_zero", "ConfigError", "rotary_dim")
def rope_err_rotary_dim_zero():
    """rotary_dim = 0 (for no rotation, do not call apply_rotary)."""
    return rope(RX, RP, rotary_dim=0)


@rope_error_case("rotary_dim_default_odd_d", "ConfigError", "rotary_dim")
def rope_err_rotary_dim_default_odd():
    """No rotary_dim with an odd head dim D = 11: the default (D) cannot be paired."""
    return rope(z(RB, RH, RL, 11), RP)


@rope_error_case("theta_zero", "ConfigError", "rope_theta")
def rope_err_theta_zero():
    """theta = 0: the frequencies 0 ** (-2p / R) are infinite."""
    return rope(RX, RP, theta=0.0)


@rope_error_case("theta_negative", "ConfigError", "rope_theta")
def rope_err_theta_negative():
    """theta = -10000: no real frequencies."""
    return rope(RX, RP, theta=-10000.0)


@rope_error_case("positions_float", "DTypeError", "positions_dtype")
def rope_err_positions_float():
    """float32 positions: positions are token indices (integers)."""
    return rope(RX, z(RL, dtype="float32"))


@rope_error_case("positions_bool", "DTypeError", "positions_dtype")
def rope_err_positions_bool():
    """Boolean positions (a mask passed by mistake)."""
    return rope(RX, z(RL, dtype="bool"))


@rope_error_case("positions_length", "DimensionMismatchError", "positions_shape")
def rope_err_positions_length():
    """Positions for L + 1 = 6 tokens, x has 5."""
    return rope(RX, z(RL + 1, dtype="int64"))


@rope_error_case("positions_per_head", "DimensionMismatchError", "positions_shape")
def rope_err_positions_per_head():
    """Positions (B, heads, L): one position per token is shared by every head, so positions
    broadcast to (B, L), x's batch dims without its heads axis."""
    return rope(RX, z(RB, RH, RL, dtype="int64"))


@rope_error_case("positions_more_batch", "DimensionMismatchError", "positions_shape")
def rope_err_positions_more_batch():
    """Positions (3, B, L) with more batch dims than x: they would broadcast x up; refused."""
    return rope(RX, z(3, RB, RL, dtype="int64"))


@rope_error_case("inv_freq_length", "DimensionMismatchError", "inv_freq_shape")
def rope_err_inv_freq_length():
    """inv_freq of 7 frequencies for D = 12 (6 pairs)."""
    return rope(RX, RP, inv_freq=z(RD // 2 + 1, dtype="float64"))


@rope_error_case("inv_freq_of_d", "DimensionMismatchError", "inv_freq_shape")
def rope_err_inv_freq_of_d():
    """rotary_dim = 8 with an inv_freq of D/2 = 6 frequencies: it has rotary_dim/2 = 4."""
    return rope(RX, RP, rotary_dim=8, inv_freq=z(RD // 2, dtype="float64"))


@rope_error_case("inv_freq_2d", "DimensionMismatchError", "inv_freq_shape")
def rope_err_inv_freq_2d():
    """inv_freq (1, 6): one frequency per pair, shared by every token, is 1-D."""
    return rope(RX, RP, inv_freq=z(1, RD // 2, dtype="float64"))


@rope_error_case("inv_freq_int", "DTypeError", "inv_freq_dtype")
def rope_err_inv_freq_int():
    """int64 inv_freq: frequencies are floating."""
    return rope(RX, RP, inv_freq=z(RD // 2, dtype="int64"))


@rope_error_case("attention_factor_zero", "ConfigError", "attention_factor")
def rope_err_attention_factor_zero():
    """attention_factor = 0 would zero every rotated feature."""
    return rope(RX, RP, attention_factor=0.0)


@rope_error_case("attention_factor_nan", "ConfigError", "attention_factor")
def rope_err_attention_factor_nan():
    """attention_factor = NaN."""
    return rope(RX, RP, attention_factor=float("nan"))


@rope_error_case("x_rank", "DimensionMismatchError", "rank")
def rope_err_x_rank():
    """x (L, D): the heads axis is missing."""
    return rope(z(RL, RD), RP)


@rope_error_case("x_int", "DTypeError", "unsupported_dtype")
def rope_err_x_int():
    """int32 x."""
    return rope(z(RB, RH, RL, RD, dtype="int32"), RP)


@rope_error_case("x_none", "DTypeError", "not_an_array")
def rope_err_x_none():
    """x = None."""
    return rope(Zeros((), "none"), RP)


@rope_error_case("interleaved_string", "ConfigError", "not_a_bool")
def rope_err_interleaved_string():
    """interleaved="False": a string, not a bool (it would be true)."""
    return rope(RX, RP, interleaved="False")


# ---------------------------------------------------------------------------------------------
# Modules with RoPE: rope_theta, rope_interleaved, rotary_dim
# ---------------------------------------------------------------------------------------------

#: The RoPE module cases' head dims: D = 8 (four pairs), E = 4.
MRD, MRE = 8, 4


def _rope_options(theta=10000.0, interleaved=False, rotary_dim=None) -> dict[str, Any]:
    options: dict[str, Any] = {"rope_theta": theta, "rope_interleaved": interleaved}
    if rotary_dim is not None:
        options["rotary_dim"] = rotary_dim
    return options


@case("module", "rope.gqa.h6_k2", ALL_DTYPES)
def module_rope_gqa(rng, dtype):
    """GQA 6:2 self-attention with RoPE (rope_theta=10000, half-split, D = 8): queries and keys
    rotated at positions 0..4 after the projections, before the attention; with the weights of
    every head (the rotation changes every score)."""
    return ModuleCall(canonical(rng, d=MRD, e=MRE), normal(rng, MB, ML, MM), n_heads=H,
                      n_kv_heads=K, keywords={"return_weights": True},
                      options=_rope_options())


@case("module", "rope.mha.interleaved.r4", ("float32", "bfloat16"))
def module_rope_mha_interleaved(rng, dtype):
    """MultiHeadAttention with interleaved RoPE on the first 4 of D = 8 features, theta 100:
    features 4..7 of every query and key pass through."""
    return ModuleCall(canonical(rng, k=H, d=MRD, e=MRE), normal(rng, MB, ML, MM), n_heads=H,
                      n_kv_heads=H, cls="MultiHeadAttention", keywords={"is_causal": True},
                      options=_rope_options(100.0, True, 4))


@case("module", "rope.cross.bottom_right.l5_s7")
def module_rope_cross_bottom_right(rng, dtype):
    """Cross-attention with RoPE, causal bottom_right, L = 5 < S = 7: key j sits at position j,
    query i at i + (S - L) = i + 2, the diagonal the alignment puts it on (as a KV cache does);
    the relative position of query i and key j is i + 2 - j."""
    return ModuleCall(canonical(rng, d=MRD, e=MRE), normal(rng, MB, ML, MM), n_heads=H,
                      n_kv_heads=K, context=normal(rng, MB, MS, MM),
                      keywords={"is_causal": True, "causal_alignment": "bottom_right",
                                "return_weights": True},
                      options=_rope_options(theta=100.0))


@case("module", "rope.cross.top_left.l5_s7")
def module_rope_cross_top_left(rng, dtype):
    """Cross-attention with RoPE, not causal, top_left: query i at position i, key j at j."""
    return ModuleCall(canonical(rng, d=MRD, e=MRE), normal(rng, MB, ML, MM), n_heads=H,
                      n_kv_heads=K, context=normal(rng, MB, MS, MM),
                      options=_rope_options(theta=100.0))


@case("decode", "rope.gqa.h6_k2", ALL_DTYPES)
def decode_rope_gqa(rng, dtype):
    """KV-cache decoding with RoPE (GQA 6:2, theta 100): each new token's query and key are
    rotated at cache.position + its index in the chunk, and the cache holds rotated keys, so
    any chunking gives the full forward. A port rotating every chunk from position 0 fails at
    its second step."""
    return ModuleCall(canonical(rng, d=MRD, e=MRE), normal(rng, MB, DECODE_T, MM), n_heads=H,
                      n_kv_heads=K, keywords={"is_causal": True},
                      options=_rope_options(theta=100.0))


@case("decode", "rope.mqa.interleaved.r6", F32)
def decode_rope_mqa_interleaved(rng, dtype):
    """MQA with interleaved RoPE on 6 of D = 8 features, decoded token by token and in chunks."""
    return ModuleCall(canonical(rng, k=1, d=MRD, e=MRE), normal(rng, MB, DECODE_T, MM),
                      n_heads=H, n_kv_heads=1, keywords={"is_causal": True},
                      options=_rope_options(100.0, True, 6))


def _construct_error(name: str, arguments: dict[str, Any], error_class: str, code: str, doc: str):
    def build() -> ModuleErrorCall:
        return ModuleErrorCall("construct", arguments=dict(arguments))

    build.__doc__ = doc
    case("module", name, ("float32",), error=(error_class, code))(build)


_SIZES = {"d_model": 24, "n_heads": 6, "n_kv_heads": 2}
_construct_error(
    "rope_rotary_dim_odd",
    {**_SIZES, "rope_theta": 10000.0, "rotary_dim": 3},
    "ConfigError",
    "rotary_dim",
    "GroupedQueryAttention(24, 6, 2, rope_theta=10000.0, rotary_dim=3): odd.",
)
_construct_error(
    "rope_rotary_dim_beyond_d",
    {**_SIZES, "rope_theta": 10000.0, "rotary_dim": 6},
    "ConfigError",
    "rotary_dim",
    "rotary_dim=6 with head dim D = 24 // 6 = 4.",
)
_construct_error(
    "rope_theta_zero",
    {**_SIZES, "rope_theta": 0.0},
    "ConfigError",
    "rope_theta",
    "rope_theta=0: no frequencies.",
)
_construct_error(
    "rope_options_without_theta",
    {**_SIZES, "rotary_dim": 2},
    "ConfigError",
    "rope_theta",
    "rotary_dim=2 without rope_theta: refused, not ignored.",
)


# ---------------------------------------------------------------------------------------------
# Modules with scaled rotary frequencies: rope_inv_freq, rope_attention_factor (Contract v3)
# ---------------------------------------------------------------------------------------------

#: Llama 3.1's scaling shrunk to the module cases' few positions: theta 100 over D = 8 has the
#: wavelengths 6.3, 19.9, 62.8, 199; with original 16, low 1, high 4 and factor 4, pair 0 is
#: blended and pairs 1..3 divided by 4, so every pair turns differently from theta's.
MODULE_LLAMA3 = llama3_inv_freq(100.0, MRD, 4.0, 1.0, 4.0, 16)
#: YaRN (factor 4, original 16) of theta 100 on rotary_dim 4: pair 0 kept, pair 1 divided by
#: 4; attention_factor 0.1 ln 4 + 1 on cos and sin (so 1.296 on the scores).
MODULE_YARN = yarn_inv_freq(100.0, 4, 4.0, 16)


def _scaled_options(inv_freq, attention_factor=1.0, theta=100.0, **rope) -> dict[str, Any]:
    """A module's RoPE options with ``rope_inv_freq`` as the JSON list a fixture holds."""
    options = _rope_options(theta, **rope) | {"rope_inv_freq": [float(f) for f in inv_freq]}
    if attention_factor != 1.0:
        options["rope_attention_factor"] = float(attention_factor)
    return options


@case("module", "rope_scaled.llama3.gqa.h6_k2", ALL_DTYPES)
def module_rope_scaled_llama3(rng, dtype):
    """GQA 6:2 with Llama 3.1's scaled frequencies as ``rope_inv_freq`` (:data:`MODULE_LLAMA3`),
    rope_theta 100 given and unused: a module rotating by theta's frequencies fails on every
    score (with the weights of every head)."""
    return ModuleCall(canonical(rng, d=MRD, e=MRE), normal(rng, MB, ML, MM), n_heads=H,
                      n_kv_heads=K, keywords={"return_weights": True, "is_causal": True},
                      options=_scaled_options(MODULE_LLAMA3))


@case("module", "rope_scaled.yarn.mha.interleaved.r4", ("float64", "float32"))
def module_rope_scaled_yarn(rng, dtype):
    """MultiHeadAttention with YaRN on the first 4 of D = 8 features, interleaved:
    ``rope_inv_freq`` and ``rope_attention_factor`` 1.1386 on cos and sin of queries and keys,
    so the rotated part of every score by 1.296; a module applying the factor once (to the
    queries only) or not at all fails."""
    inv_freq, factor = MODULE_YARN
    return ModuleCall(canonical(rng, k=H, d=MRD, e=MRE), normal(rng, MB, ML, MM), n_heads=H,
                      n_kv_heads=H, cls="MultiHeadAttention", keywords={"return_weights": True},
                      options=_scaled_options(inv_freq, factor, rotary_dim=4,
                                              interleaved=True))


@case("decode", "rope_scaled.gqa.h6_k2", F32)
def decode_rope_scaled_gqa(rng, dtype):
    """KV-cache decoding with Llama 3.1's frequencies and an attention factor of 1.25: each
    chunk's queries and keys rotated at cache.position + i with the module's rope_inv_freq, the
    cache holding the scaled rotated keys; any chunking gives the full forward."""
    return ModuleCall(canonical(rng, d=MRD, e=MRE), normal(rng, MB, DECODE_T, MM), n_heads=H,
                      n_kv_heads=K, keywords={"is_causal": True},
                      options=_scaled_options(MODULE_LLAMA3, 1.25))


_construct_error(
    "rope_inv_freq_shape",
    {**_SIZES, "rope_theta": 10000.0, "rope_inv_freq": [1.0, 0.5, 0.25]},
    "DimensionMismatchError",
    "inv_freq_shape",
    "rope_inv_freq of 3 frequencies for D = 4 (2 pairs): one per rotated pair.",
)
_construct_error(
    "rope_attention_factor_without_theta",
    {**_SIZES, "rope_attention_factor": 1.5},
    "ConfigError",
    "rope_theta",
    "rope_attention_factor=1.5 without rope_theta: refused, not ignored.",
)
