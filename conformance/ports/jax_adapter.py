"""NumPy <-> JAX for conformance: the adapter functions of any JAX port.

Importing this module turns on ``jax_enable_x64``, because float64 is one of the contract's four
dtypes (without it JAX silently computes float64 inputs in float32). JAX understands
``ml_dtypes.bfloat16`` natively, so no dtype needs special handling.

:func:`prepare` is the optional third adapter function: the runner wraps each port function with
it once. Here it is ``jax.jit`` with the scalar keywords static, so a fixture costs one XLA
compilation instead of one per primitive (eager JAX recompiles every operation for every new
shape, which made the suite several times slower), and every port is checked the way JAX code
runs in practice: traced and compiled.

A sharded function (one that takes ``n_shards``) is jitted with ``n_shards`` and ``layout``
static too, and gets its arrays uncommitted: :func:`from_numpy` commits each array to one
device, and a program over a mesh of n devices refuses arguments committed elsewhere. The n
devices themselves must exist when JAX starts: ``python -m conformance`` starts its worker with
``XLA_FLAGS=--xla_force_host_platform_device_count=<n>``; with fewer, the sharded function
raises ``shard_devices`` and the runner reports the run as skipped.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

__all__ = ["from_numpy", "prepare", "to_numpy"]

#: conformance's device names -> JAX platform names.
_PLATFORMS = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "tpu": "tpu"}


def from_numpy(array: np.ndarray, device: str = "cpu") -> jax.Array:
    """A JAX array on the first device of the platform (``"cpu"``, ``"cuda"``, ``"tpu"``)."""
    platform, _, index = device.partition(":")
    target = jax.devices(_PLATFORMS.get(platform, platform))[int(index or 0)]
    return jax.device_put(np.asarray(array), target)


def to_numpy(array: jax.Array) -> np.ndarray:
    """The array as a NumPy array of the same dtype."""
    return np.asarray(array)


#: Keywords that are Python scalars or strings: static under jit.
_STATIC_KEYWORDS = (
    "is_causal",
    "causal_alignment",
    "scale",
    "softcap",
    "window",
    "block_q",
    "block_k",
    "return_lse",
    "theta",
    "rotary_dim",
    "interleaved",
    "attention_factor",
)


#: Keywords of the module call and the decode step that are Python scalars or strings.
_MODULE_STATIC_KEYWORDS = ("is_causal", "causal_alignment", "return_weights")

#: Keywords of the sharded functions that decide the mesh and the program (USP's two sizes too:
#: it takes no ``n_shards``).
_SHARD_KEYWORDS = ("n_shards", "layout", "ulysses_shards", "ring_shards")


def prepare(alias: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``jax.jit(function)`` with the scalar arguments static (all of them for causal_mask).

    The module aliases (``module``, ``decode``) get the runner's call of a ``flax.nnx`` module
    and go through ``nnx.jit``, which splits the module into its graph and its arrays. The
    cache's ``position`` is static (part of ``KVCache``'s pytree structure), so each decode step
    at a new position, or with a new number of tokens, compiles once.
    """
    if alias in ("module", "decode"):
        from flax import nnx

        return nnx.jit(function, static_argnames=_MODULE_STATIC_KEYWORDS)
    if alias == "causal_mask":
        return jax.jit(function, static_argnums=(0, 1), static_argnames=("alignment",))
    if alias == "paged_flash":
        return _lengths_closed_over(function)
    if alias in _HOST_SCHEDULED:
        return function
    params = inspect.signature(function).parameters
    if "n_shards" in params or "ulysses_shards" in params:  # usp_attention: u x r devices
        return _on_mesh(function, params)
    if alias in _FP8_ALIASES and any(n in params for n in _DESCALES):  # a port that takes fp8
        return _fp8_jitted(alias, function, params)
    if alias in _VALUES_CHECKED_FIRST:
        return _values_checked_first(alias, function, params)
    return jax.jit(function, static_argnames=[n for n in _STATIC_KEYWORDS if n in params])


#: The tiled paths that schedule their blocks on the host (Contract v3): the varlen one from the
#: concrete boundaries (``attention_spec.sequence_bounds``), the paged read from the concrete
#: ``cu_seqlens_q`` and ``seq_lens`` (``attention_spec.sequence_pages``), as a serving loop does
#: before its compiled steps. So they are not jitted with those arrays traced (traced
#: boundaries or lengths are ConfigError ``cu_seqlens_value`` / ``seq_lens_value``): the varlen
#: ones are called as they are (their own validation reads every value on the concrete arrays,
#: and their number descales stay numbers), the paged read is jitted with its lengths closed
#: over (:func:`_lengths_closed_over`).
_HOST_SCHEDULED = ("varlen_flash", "varlen_flash_grad", "paged_flash")


def _lengths_closed_over(function: Callable[..., Any]) -> Callable[..., Any]:
    """The tiled paged read, checked on its concrete arrays first (as :func:`_values_checked_first`
    does), then jitted with its ``seq_lens``, ``cu_seqlens_q`` and keywords closed over as
    constants, as a serving loop compiles a step for one batch's lengths: the schedule is made
    from them on the host while tracing, and the call is one compilation where running it op by
    op compiles each op (43 ``paged_flash`` runs: ~20 s against ~74 s)."""
    from attention_spec import check_paged_attention

    def call(query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q, **kwargs):
        checked = {n: v for n, v in kwargs.items() if n != "block_k"}
        check_paged_attention(query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q,
                              **checked)

        def step(query, key_cache, value_cache, block_table):
            return function(query, key_cache, value_cache, block_table, seq_lens, cu_seqlens_q,
                            **kwargs)

        return jax.jit(step)(query, key_cache, value_cache, block_table)

    return call


#: The paged key/value cache aliases that jit (Contract v3): their integer arrays' values (block
#: table, lengths, offsets, slots) are tracers under jit, which validation cannot read
#: (SEMANTICS.md: unchecked under jit); :func:`_values_checked_first` checks them on the
#: concrete arrays first. (``paged_flash`` is host-scheduled, above.)
_VALUES_CHECKED_FIRST = ("paged", "paged_write")


def _values_checked_first(alias: str, function: Callable[..., Any], params) -> Callable[..., Any]:
    """``function`` jitted, after attention_spec's check of the call on its concrete arrays, as
    a serving loop validates a batch before its compiled step: the value errors of the paged
    calls then come from JAX ports too. An fp8 cache's descales given as numbers
    (``paged.fp8.*``) are static, one compilation per set of them, as :func:`_fp8_jitted`'s (a
    traced Python float would be a float64 array under x64: ``descale_dtype``)."""
    from attention_spec import check_paged_attention, check_paged_cache_write

    check = check_paged_cache_write if alias == "paged_write" else check_paged_attention
    static = [n for n in _STATIC_KEYWORDS if n in params]
    takes = [n for n in _DESCALES if n in params]
    jitted: dict[tuple[str, ...], Callable[..., Any]] = {}

    def call(*args: Any, **kwargs: Any) -> Any:
        check(*args, **kwargs)
        numbers = tuple(n for n in takes if isinstance(kwargs.get(n), (int, float)))
        if numbers not in jitted:
            jitted[numbers] = jax.jit(function, static_argnames=[*static, *numbers])
        return jitted[numbers](*args, **kwargs)

    return call


#: The descales of the fp8 calls (Contract v3): a number is static under jit (a traced Python
#: float would be a float64 array under x64, and its value unchecked), an array is traced.
_DESCALES = ("q_descale", "k_descale", "v_descale", "descale")
#: The aliases with fp8 fixtures (sdpa.fp8.*, quantize.*, varlen.fp8.*): jitted by
#: :func:`_fp8_jitted`. varlen's call is not checked first: its values (the boundaries, a
#: descale array's) stay unchecked under jit, as before it took fp8 (impl_jax.xfails lists
#: varlen.error.cu_seqlens_short_of_total for that); only its number descales become static.
_FP8_ALIASES = ("sdpa", "weights", "flash", "quantize", "varlen")
#: flash_attention's own keywords, which check_attention does not take.
_TILING_KEYWORDS = ("block_q", "block_k", "return_lse")


def _fp8_jitted(alias: str, function: Callable[..., Any], params) -> Callable[..., Any]:
    """A function with descales (or ``quantize_fp8``, whose ``dtype`` and ``axes`` are static),
    jitted once per set of descales given as numbers, those static (the arrays traced).
    attention_spec checks the call on its concrete arrays first (a descale array's values, a
    quantized x's finiteness are tracers under jit), as :func:`_values_checked_first` does."""
    static = [n for n in (*_STATIC_KEYWORDS, "dtype", "axes") if n in params]
    takes = [n for n in _DESCALES if n in params]
    jitted: dict[tuple[str, ...], Callable[..., Any]] = {}

    def call(*args: Any, **kwargs: Any) -> Any:
        if alias != "quantize":  # the function's descales, None included: fp8 is taken
            kwargs = {n: None for n in takes} | kwargs
        _check_fp8(alias, *args, **kwargs)
        numbers = tuple(n for n in takes if isinstance(kwargs.get(n), (int, float)))
        if numbers not in jitted:
            jitted[numbers] = jax.jit(function, static_argnames=[*static, *numbers])
        return jitted[numbers](*args, **kwargs)

    return call


def _check_fp8(alias: str, *args: Any, **kwargs: Any) -> None:
    """attention_spec's check of an fp8 call on its concrete arrays (the same errors as the
    implementation's own check, raised before jit traces them)."""
    from attention_spec import SUPPORTED_DTYPES, check_attention, check_quantize_fp8, dtype_name

    if alias == "varlen":  # checked under jit, by the function itself (see _FP8_ALIASES)
        return
    if alias != "quantize":
        check_attention(*args, **{n: x for n, x in kwargs.items() if n not in _TILING_KEYWORDS})
        return
    x, *rest = args
    dtype = rest[0] if rest else kwargs.get("dtype", "float8_e4m3fn")
    finite = None
    if x is not None and dtype_name(x.dtype) in SUPPORTED_DTYPES:
        with np.errstate(over="ignore"):  # a float64 beyond float32's range is inf: refused
            finite = bool(np.isfinite(np.asarray(x).astype(np.float32)).all())
    check_quantize_fp8(x, dtype, kwargs.get("axes", (-2, -1)), kwargs.get("descale"), finite)


def _on_mesh(function: Callable[..., Any], params) -> Callable[..., Any]:
    """A sharded function, jitted (``nnx.jit`` when it takes a module), called with its arrays
    uncommitted so that the program places them on its mesh."""
    static = [n for n in (*_STATIC_KEYWORDS, *_SHARD_KEYWORDS) if n in params]
    if "module" in params:
        from flax import nnx

        jitted = nnx.jit(function, static_argnames=static)
    else:
        jitted = jax.jit(function, static_argnames=static)

    def uncommitted(x: Any) -> Any:
        return np.asarray(x) if isinstance(x, jax.Array) else x

    def on_mesh(*args: Any, **kwargs: Any) -> Any:
        args = tuple(uncommitted(a) for a in args)
        return jitted(*args, **{k: uncommitted(v) for k, v in kwargs.items()})

    return on_mesh
