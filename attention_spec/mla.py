"""Multi-head latent attention's own checks: its sizes, its rotary settings, its canonical
weights and its weight files (SEMANTICS.md, Contract v3, "Multi-head latent attention").

Pure Python on sizes, shapes and dtype names, like :mod:`attention_spec.modules`; the NumPy,
PyTorch and JAX ``MultiHeadLatentAttention`` call these before any arithmetic. The inputs of a
forward and of a cached step are checked by the GQA module's functions
(:func:`~attention_spec.modules.check_module_inputs`,
:func:`~attention_spec.cache.check_decode_inputs`) on the :class:`ModuleDims` of the attention
each path runs: :attr:`MlaDims.naive` (H heads, ``D = Dn + Dr``, E) or :attr:`MlaDims.latent`
(the absorbed step's one MQA: one key head of ``R + Dr``, values of R), which
:func:`check_latent_decode_inputs` asks of the contiguous latent cache (key ``[c_kv, k_pe]
(B, 1, T, R + Dr)``, its first R features the values, a zero-width value buffer) and
:attr:`MlaDims.paged` of the paged one's pools.

Canonical weights (Hugging Face ``DeepseekV3Attention``'s names, kernels ``(in, out)``, no
biases)::

    q_a_proj.kernel (M, Q)       q_a_layernorm.weight (Q,)     q_b_proj.kernel (Q, H*(Dn+Dr))
      or, with q_lora_rank None:  q_proj.kernel (M, H*(Dn+Dr))
    kv_a_proj_with_mqa.kernel (M, R + Dr)   kv_a_layernorm.weight (R,)
    kv_b_proj.kernel (R, H*(Dn+E))          o_proj.kernel (H*E, M)
    sinks (H,)                   (a module with sinks=True)

Letters: M model width, H heads, Q q_lora_rank, R kv_lora_rank, Dn qk_nope_head_dim,
Dr qk_rope_head_dim, E v_head_dim. Head h owns features ``[h*(Dn+Dr):(h+1)*(Dn+Dr)]`` of the
query (nope first, then rope), ``[h*(Dn+E):(h+1)*(Dn+E)]`` of ``kv_b_proj`` (its key part
first, then its value part) and ``[h*E:(h+1)*E]`` of the output projection's input.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from attention_spec.arrays import ArraySpec, check_dtype, check_given, describe, format_dims
from attention_spec.cache import _check_cache, check_decode_inputs
from attention_spec.call import AttentionCall
from attention_spec.errors import make_error
from attention_spec.keywords import check_flag, check_size, is_int, real_keyword, value_text
from attention_spec.modules import ModuleDims
from attention_spec.rotary import check_attention_factor, check_rope_inv_freq, check_theta
from attention_spec.weights import METADATA_KEY

__all__ = [
    "MLA_FORMAT",
    "MlaDims",
    "MlaRope",
    "check_latent_decode_inputs",
    "check_mla_canonical",
    "check_mla_config",
    "check_mla_rope",
    "check_rms_norm_eps",
    "mla_from_metadata",
    "mla_metadata",
]

#: The format a weight file of a ``MultiHeadLatentAttention`` names in its metadata.
MLA_FORMAT = "canonical-mla-v1"


@dataclass(frozen=True)
class MlaDims:
    """The sizes of one multi-head latent attention module."""

    M: int
    H: int
    R: int  # kv_lora_rank
    Dn: int  # qk_nope_head_dim
    Dr: int  # qk_rope_head_dim
    E: int  # v_head_dim
    Q: int | None = None  # q_lora_rank (None: one q_proj)
    sinks: bool = False

    @property
    def naive(self) -> ModuleDims:
        """The attention of the naive path: H heads of ``D = Dn + Dr``, values of E."""
        return ModuleDims(self.M, self.H, self.H, self.Dn + self.Dr, self.E, False, self.sinks)

    @property
    def latent(self) -> ModuleDims:
        """The absorbed step's one MQA as a one-head KV cache: keys ``[c_kv, k_pe]`` of
        ``D = R + Dr``, values ``c_kv`` of ``E = R``. The contiguous latent cache holds the keys
        ``(B, 1, T, R + Dr)`` and reads the values in place as their first R features
        (:func:`check_latent_decode_inputs`)."""
        return ModuleDims(self.M, self.H, 1, self.R + self.Dr, self.R, False, self.sinks)

    @property
    def paged(self) -> ModuleDims:
        """The paged latent cache's pools as a one-head paged KV cache, the same MQA as
        :attr:`latent`: key pages ``[c_kv, k_pe] (P, page_size, 1, R + Dr)``, value pages
        ``c_kv (P, page_size, 1, R)``."""
        return self.latent

    def canonical_shapes(self) -> dict[str, tuple[int, ...]]:
        """The canonical weight names and shapes, in forward order."""
        M, H, R, Dn, Dr, E, Q = self.M, self.H, self.R, self.Dn, self.Dr, self.E, self.Q
        shapes: dict[str, tuple[int, ...]] = {}
        if Q is None:
            shapes["q_proj.kernel"] = (M, H * (Dn + Dr))
        else:
            shapes["q_a_proj.kernel"] = (M, Q)
            shapes["q_a_layernorm.weight"] = (Q,)
            shapes["q_b_proj.kernel"] = (Q, H * (Dn + Dr))
        shapes["kv_a_proj_with_mqa.kernel"] = (M, R + Dr)
        shapes["kv_a_layernorm.weight"] = (R,)
        shapes["kv_b_proj.kernel"] = (R, H * (Dn + E))
        shapes["o_proj.kernel"] = (H * E, M)
        if self.sinks:
            shapes["sinks"] = (H,)
        return shapes

    def cache_numbers_per_token(self) -> dict[str, int]:
        """Numbers cached per token: the latent cache's ``R + Dr``, the naive cache's
        ``H (Dn + Dr + E)``."""
        return {"latent": self.R + self.Dr, "naive": self.H * (self.Dn + self.Dr + self.E)}

    def __str__(self) -> str:
        q = "" if self.Q is None else f", Q={self.Q}"
        sizes = (self.M, self.H, self.R, self.Dn, self.Dr, self.E)
        return format_dims(["M", "H", "R", "Dn", "Dr", "E"], sizes)[:-1] + q + ")"


def _mla_size(name: str, n: object) -> int:
    """An MLA size: an integer > 0 (ConfigError ``mla_dims``)."""
    if not (is_int(n) and n > 0):
        raise make_error(
            "mla_dims",
            f"{name} must be an integer > 0; got {value_text(n)}",
            expected="integer > 0",
            actual=value_text(n),
        )
    return int(n)


def check_mla_config(
    d_model: int,
    n_heads: int,
    *,
    kv_lora_rank: object,
    qk_nope_head_dim: object,
    qk_rope_head_dim: object,
    v_head_dim: object,
    q_lora_rank: object = None,
    sinks: object = False,
    dtype: str = "float32",
) -> MlaDims:
    """Validate the constructor's sizes and return them.

    Raises:
        ConfigError ``non_positive_size`` (d_model, n_heads); ConfigError ``mla_dims``: an MLA
        size not an integer > 0, or an odd ``qk_rope_head_dim`` (RoPE rotates pairs);
        ConfigError ``not_a_bool`` (sinks); DTypeError ``unsupported_dtype``.
    """
    check_size("d_model (M)", d_model)
    check_size("n_heads (H)", n_heads)
    check_dtype("dtype", dtype)
    R = _mla_size("kv_lora_rank (R)", kv_lora_rank)
    Dn = _mla_size("qk_nope_head_dim (Dn)", qk_nope_head_dim)
    Dr = _mla_size("qk_rope_head_dim (Dr)", qk_rope_head_dim)
    E = _mla_size("v_head_dim (E)", v_head_dim)
    Q = None if q_lora_rank is None else _mla_size("q_lora_rank (Q)", q_lora_rank)
    if Dr % 2:
        raise make_error(
            "mla_dims",
            f"qk_rope_head_dim (Dr) must be even (RoPE rotates pairs of features); got {Dr}",
            expected="an even integer > 0",
            actual=str(Dr),
        )
    return MlaDims(int(d_model), int(n_heads), R, Dn, Dr, E, Q, check_flag("sinks", sinks))


def check_rms_norm_eps(eps: object) -> float:
    """``rms_norm_eps`` a finite number > 0 (ConfigError ``mla_dims``: a size of the norm)."""
    value = real_keyword("rms_norm_eps", "mla_dims", eps)
    if not (value > 0 and math.isfinite(value)):
        raise make_error(
            "mla_dims",
            f"rms_norm_eps must be a finite number > 0; got {value_text(eps)}",
            expected="finite number > 0",
            actual=value_text(eps),
        )
    return value


@dataclass(frozen=True)
class MlaRope:
    """How the module rotates ``q_pe`` and ``k_pe`` (``rotary_dim = Dr``): ``apply_rotary``'s
    keywords, resolved; ``inv_freq`` as Python floats (None: theta's frequencies)."""

    theta: float
    interleaved: bool
    rotary_dim: int
    inv_freq: tuple[float, ...] | None = None
    attention_factor: float = 1.0

    def module_keywords(self) -> dict[str, Any]:
        """The constructor's keywords that rebuild this configuration (JSON values)."""
        config = {"rope_theta": self.theta, "rope_interleaved": self.interleaved,
                  "rope_attention_factor": self.attention_factor}
        if self.inv_freq is not None:
            config["rope_inv_freq"] = list(self.inv_freq)
        return config


def check_mla_rope(
    rope_theta: object,
    rope_interleaved: object,
    rope_inv_freq: Any,
    rope_attention_factor: object,
    dims: MlaDims,
) -> MlaRope:
    """The module's rotary keywords: rotary is always on, over the Dr rope features.

    Raises:
        ConfigError ``not_a_bool``, ``rope_theta``, ``attention_factor``;
        DimensionMismatchError ``inv_freq_shape``, DTypeError ``inv_freq_dtype``.
    """
    interleaved = check_flag("rope_interleaved", rope_interleaved)
    theta = check_theta(rope_theta, "rope_theta")
    factor = check_attention_factor(rope_attention_factor, "rope_attention_factor")
    inv_freq = check_rope_inv_freq(rope_inv_freq, dims.Dr)
    return MlaRope(theta, interleaved, dims.Dr, inv_freq, factor)


def _dims_from_shapes(shapes: Mapping[str, tuple[int, ...]], H: int, Dr: int) -> MlaDims:
    """M, R, Dn, E and Q read from ``kv_a_proj_with_mqa (M, R + Dr)``, ``o_proj (H*E, M)``,
    ``kv_b_proj (R, H*(Dn+E))`` and ``q_a_proj (M, Q)`` (when present)."""

    def need(name: str, letters: str) -> tuple[int, int]:
        shape = shapes.get(name)
        if shape is None or len(shape) != 2:
            raise make_error(
                "weight_shape",
                f"canonical MLA weights need {name} {letters}; got "
                f"{'no such key' if shape is None else shape} (keys {sorted(shapes)})",
                expected=f"{name} {letters}",
                actual=str(shape),
            )
        return shape

    M, r_dr = need("kv_a_proj_with_mqa.kernel", "(M, R + Dr)")
    he, _ = need("o_proj.kernel", "(H*E, M)")
    _, h_dn_e = need("kv_b_proj.kernel", "(R, H*(Dn+E))")
    q = shapes.get("q_a_proj.kernel")
    sizes = {"R": r_dr - Dr, "E": he // H if he % H == 0 else 0,
             "Dn": (h_dn_e // H - he // H) if h_dn_e % H == 0 else 0}
    if min(sizes.values()) <= 0:
        raise make_error(
            "weight_shape",
            f"canonical MLA weights give no positive sizes for H={H}, Dr={Dr}: "
            f"kv_a_proj_with_mqa (M, R + Dr)={shapes['kv_a_proj_with_mqa.kernel']}, "
            f"o_proj (H*E, M)={shapes['o_proj.kernel']}, kv_b_proj (R, H*(Dn+E))="
            f"{shapes['kv_b_proj.kernel']} give {sizes}",
            expected="R, Dn, E > 0",
            actual=str(sizes),
        )
    Q = None if q is None or len(q) != 2 else q[1]
    return MlaDims(M, H, sizes["R"], sizes["Dn"], Dr, sizes["E"], Q, "sinks" in shapes)


def check_mla_canonical(
    weights: Mapping[str, Any],
    *,
    n_heads: int,
    qk_rope_head_dim: int,
    expected: MlaDims | None = None,
    sinks: object = None,
) -> MlaDims:
    """Validate canonical MLA weights (names to arrays) and return the sizes: every weight of
    its canonical shape (:meth:`MlaDims.canonical_shapes`), none missing or extra, one
    supported dtype. H and Dr are given (``H*E`` does not say H, ``R + Dr`` does not say Dr);
    with ``expected`` every shape must be that module's.

    Raises:
        ConfigError ``non_positive_size``, ``mla_dims``; DimensionMismatchError
        ``weight_shape``; DTypeError ``dtype_mismatch``, ``unsupported_dtype``.
    """
    check_size("n_heads (H)", n_heads)
    Dr = _mla_size("qk_rope_head_dim (Dr)", qk_rope_head_dim)
    specs = {name: describe(w) for name, w in weights.items()}
    shapes = {name: spec.shape for name, spec in specs.items()}
    dims = expected if expected is not None else _dims_from_shapes(shapes, n_heads, Dr)
    if sinks is not None and check_flag("sinks", sinks) != dims.sinks:
        raise make_error(
            "weight_shape",
            f"sinks={sinks} was asked, but the canonical weights "
            f"{'hold' if dims.sinks else 'have no'} a sinks (H,) weight",
            expected=f"sinks ({dims.H},)" if sinks else "no sinks weight",
            actual="sinks weight present" if dims.sinks else "no sinks weight",
        )
    canonical = dims.canonical_shapes()
    for name in [*canonical, *(n for n in shapes if n not in canonical)]:
        if shapes.get(name) != canonical.get(name):
            got = "missing" if name not in shapes else shapes[name]
            want = "absent" if name not in canonical else canonical[name]
            raise make_error(
                "weight_shape",
                f"canonical MLA weight {name} must be {want} for {dims}; got {got} (kernels "
                "are (in, out): a torch nn.Linear weight is (out, in), transpose it)",
                expected=str(want),
                actual=str(got),
            )
    names = list(canonical)
    dtypes = {n: str(specs[n].dtype) for n in names}
    check_dtype(names[0], dtypes[names[0]])
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{n}={d}" for n, d in dtypes.items())
        raise make_error(
            "dtype_mismatch",
            f"canonical MLA weights must share one dtype; got {listing}",
            expected="one dtype",
            actual=listing,
        )
    return dims


def check_naive_cache(paged: bool) -> None:
    """``decode_naive`` takes ``init_kv_cache``'s cache (every head's keys and values); a
    paged latent cache (``init_cache(..., page_size=)``) is ``decode``'s alone.

    Raises:
        ConfigError ``paged_cache``: ``paged`` (the cache given is a paged one).
    """
    if paged:
        raise make_error(
            "paged_cache",
            "decode_naive has no paged form: a paged latent cache (init_cache(..., "
            "page_size=)) is read by decode; decode_naive takes init_kv_cache's cache",
            expected="init_kv_cache(batch_size, max_len)'s KVCache",
            actual="a PagedKVCache",
        )


def check_latent_decode_inputs(
    dims: MlaDims,
    param_dtype: str,
    x: Any,
    *,
    cache_key: Any,
    cache_value: Any,
    position: int,
    max_len: int,
    mask: Any = None,
    bias: Any = None,
    return_weights: object = False,
) -> AttentionCall:
    """Validate ``decode`` on the contiguous latent cache before any write: new tokens
    ``x (B, L, M)`` into a cache whose ``key`` is the latent ``[c_kv, k_pe] (B, 1, T, R + Dr)``
    and whose ``value`` is zero-width, ``(B, 1, T, 0)``: the step's values are the key's first
    R features, read in place. x, mask, bias and the key are checked by
    :func:`~attention_spec.cache.check_decode_inputs` as a one-head cache of
    :attr:`MlaDims.latent` (K = 1, D = R + Dr, E = R) whose values are ``key[..., :R]``.

    Raises:
        the errors of :func:`~attention_spec.cache.check_decode_inputs`;
        DimensionMismatchError ``cache_mismatch``: a value buffer that is not ``(B, 1, T, 0)``
        (a cache of another module, or of another layout).
    """
    check_given(cache_key=cache_key, cache_value=cache_value)
    key, value = describe(cache_key), describe(cache_value)
    c_kv = ArraySpec((*key.shape[:3], dims.R), key.dtype)  # the values read: key[..., :R]
    call = check_decode_inputs(
        dims.latent, param_dtype, x, cache_key=key, cache_value=c_kv, position=position,
        max_len=max_len, mask=mask, bias=bias, return_weights=return_weights,
    )
    buffers = replace(dims.latent, E=0)  # key (B, 1, T, R + Dr), value (B, 1, T, 0)
    _check_cache(buffers, param_dtype, key, value)
    return call


def mla_metadata(dims: MlaDims, rope: MlaRope, settings: Mapping[str, Any]) -> dict[str, str]:
    """A weight file's metadata: the format, H, Dr, the rotary settings and the module's other
    settings (``rms_norm_eps``, ``window``, ``softcap``, ``scale``), as one sorted JSON value."""
    config = {"format": MLA_FORMAT, "n_heads": dims.H, "qk_rope_head_dim": dims.Dr}
    config |= rope.module_keywords() | {k: v for k, v in settings.items() if v is not None}
    return {METADATA_KEY: json.dumps(config, sort_keys=True)}


def mla_from_metadata(metadata: Mapping[str, str] | None) -> dict[str, Any]:
    """``from_canonical``'s keywords from a file written with :func:`mla_metadata`."""
    try:
        config = json.loads((metadata or {})[METADATA_KEY])
        if config.pop("format") != MLA_FORMAT:
            raise ValueError("format")
    except (KeyError, TypeError, ValueError):
        raise make_error(
            "weight_shape",
            f"an MLA weight file needs the metadata {METADATA_KEY!r} (format {MLA_FORMAT!r}, "
            f"n_heads, qk_rope_head_dim); got {dict(metadata or {})}",
            expected=f"{METADATA_KEY}: format={MLA_FORMAT}",
            actual=str(dict(metadata or {})),
        ) from None
    if config.get("window") is not None:
        config["window"] = tuple(config["window"])
    return config
