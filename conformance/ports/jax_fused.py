"""``jax.nn.dot_product_attention`` as a port: JAX's own kernel (flax's attention uses it too).

Run through the same fixtures as the implementations, its failures are a measured list of
where JAX's kernel differs from the contract (``jax_fused.xfails``, and the table in
docs/CONFORMANCE.md). The generator also uses it to cross-check the goldens.

The wrapper does layout plumbing only, never semantics:

- heads-first ``(..., H, L, D)`` in and out, heads-second ``(B, L, H, D)`` for JAX, with the
  leading batch dims flattened into one (JAX takes exactly one; it does not broadcast batch
  dims, so query/key/value with different batch dims still fail inside JAX);
- JAX requires the value head dim to equal the query/key head dim; the wrapper pads the smaller
  side with zeros (zero columns change neither the scores nor the output) and passes the
  default scale 1/sqrt(D) of the unpadded D;
- mask and bias are broadcast to ``(..., H, L, S)`` and flattened like the batch;
- bottom_right causal alignment and softcap do not exist in JAX: NotImplementedError;
- under ``jax.jit`` on CPU, float16 fails to compile (JAX asks XLA for an ``F16_F16_F32`` dot,
  which XLA:CPU rejects; eager JAX catches that and retries with the default precision, but
  under jit the error only comes at compile time, outside JAX's ``try``). :func:`prepare` jits
  like every JAX port and falls back to eager execution for exactly that error, so float16 is
  still measured;
- fp8 (contract v3): the fp8 arrays go to JAX as they are, ``q_descale * k_descale`` folded into
  ``scale`` where each is one number and the output times ``v_descale``
  (:mod:`conformance.ports.descales`). :func:`prepare` runs a call with descales eagerly: they
  fold as numbers, and the adapter's fp8 jit would check the call with ``attention_spec`` first,
  validation this port does not have. On CPU JAX refuses fp8 (measured in the xfails).

float32 runs with HIGHEST-precision matmuls (``jax.default_matmul_precision("highest")``
entered inside the function, so it holds while ``jit`` traces it): JAX's DEFAULT precision is
TF32 on recent NVIDIA GPUs, whose errors (1e-4 to 1e-3) are far above the fixtures' float32
bounds (~1e-6); that is a precision setting, not the kernel's semantics.

:func:`pinned` gives this port with ``implementation=`` fixed (``"cudnn"``: JAX's cuDNN
attention), so the benchmark gates that row on its own kernel.

Contract v3's packed rows: :func:`varlen_attention` and :func:`paged_attention` are one call of
the kernel on a padded batch, the form its ``query_seq_lengths``/``key_value_seq_lengths``
arguments are for (traceable: the boundaries stay arrays under ``jit``); the paged keys are
gathered through ``block_table`` by the wrapper, the kernel having no paged form.

:func:`attention_weights` runs the same kernel with the identity as value, so the output is the
weight matrix. There is no public causal-mask function, so this port has no ``causal_mask``.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from attention_spec import AttentionGrads
from conformance.ports import jax_adapter
from conformance.ports.descales import DESCALES, jax_output, takes_descales, without_descales
from conformance.ports.jax_adapter import from_numpy, to_numpy
from conformance.ports.precision import jax_highest

__all__ = [
    "attention_weights",
    "from_numpy",
    "paged_attention",
    "pinned",
    "prepare",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_vjp",
    "to_numpy",
    "varlen_attention",
]


def _pad_last(x: jax.Array, size: int) -> jax.Array:
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - x.shape[-1])])


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "jax.nn.dot_product_attention"


@takes_descales(_KERNEL, jax_output)
def scaled_dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    sinks: jax.Array | None = None,
    alibi_slopes: jax.Array | None = None,
    implementation: str | None = None,
) -> jax.Array:
    """JAX's dot_product_attention on the contract's layout: query (..., H, L, D),
    key (..., K, S, D), value (..., K, S, E) -> (..., H, L, E). ``implementation`` is passed
    through (None: JAX's default, XLA). A window goes to JAX's own ``local_window_size``
    (top-left only, as its causal rule); packed segments become a boolean mask and ALiBi an
    additive bias, built here from the formulas."""
    if softcap is not None:
        raise NotImplementedError("jax.nn.dot_product_attention has no softcap")
    if sinks is not None:
        raise NotImplementedError("jax.nn.dot_product_attention has no sinks")
    if (is_causal or window is not None) and causal_alignment != "top_left":
        raise NotImplementedError(
            "jax.nn.dot_product_attention's is_causal and local_window_size are top-left only; "
            f"got {causal_alignment!r}"
        )
    local_window = None
    if window is not None:  # JAX's (left, right) in keys before and after the diagonal
        left, right = window
        big = max(query.shape[-2], key.shape[-2])  # an unbounded side: the whole sequence
        local_window = (big if left is None else left, big if right is None else right)
    if q_segment_ids is not None:
        same = q_segment_ids[..., None, :, None] == kv_segment_ids[..., None, None, :]
        mask = same if mask is None else mask & same
    if alibi_slopes is not None:
        rows = jnp.arange(query.shape[-2])[:, None]  # top-left: the diagonal is j = i
        distance = jnp.abs(rows - jnp.arange(key.shape[-2])[None, :]).astype(alibi_slopes.dtype)
        alibi = -alibi_slopes[:, None, None] * distance  # (H, L, S)
        bias = alibi if bias is None else bias + alibi
    H, L, D = query.shape[-3:]
    S, E = key.shape[-2], value.shape[-1]
    batch = jnp.broadcast_shapes(query.shape[:-3], key.shape[:-3], value.shape[:-3])
    if scale is None:
        scale = 1.0 / math.sqrt(D)

    # Head dims: JAX wants value's E equal to D; zero columns change nothing.
    width = max(D, E)
    query, key, value = _pad_last(query, width), _pad_last(key, width), _pad_last(value, width)

    # One batch dim, heads second: (..., N, T, X) -> (B, T, N, X). Each of query, key and
    # value keeps its own batch: JAX does not broadcast them.
    def to_jax(x):
        return jnp.swapaxes(x.reshape(math.prod(x.shape[:-3]), *x.shape[-3:]), -3, -2)

    def flat_scores(x):  # (..., H, L, S)-broadcastable -> (B, H, L, S)
        if x is None:
            return None
        return jnp.broadcast_to(x, (*batch, H, L, S)).reshape(math.prod(batch), H, L, S)

    with jax_highest():  # traced inside: float32 matmuls in float32, never TF32
        out = jax.nn.dot_product_attention(
            to_jax(query),
            to_jax(key),
            to_jax(value),
            bias=flat_scores(bias),
            mask=flat_scores(mask),
            scale=scale,
            is_causal=is_causal,
            local_window_size=local_window,
            implementation=implementation,
        )  # (B, L, H, width)
    out = jnp.swapaxes(out, -3, -2)[..., :E]  # (B, H, L, E)
    return out.reshape(*batch, H, L, E)


def scaled_dot_product_attention_vjp(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    grad_output: jax.Array,
    *,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    sinks: jax.Array | None = None,
    alibi_slopes: jax.Array | None = None,
    implementation: str | None = None,
) -> AttentionGrads:
    """JAX's own backward of its kernel: ``jax.vjp`` of :func:`scaled_dot_product_attention`
    (the same call, the same translation) with ``grad_output`` as the cotangent. Gradients for
    query, key, value and bias (None where not given); no sinks (NotImplementedError)."""
    keywords = dict(mask=mask, is_causal=is_causal, causal_alignment=causal_alignment,
                    scale=scale, softcap=softcap, window=window, q_segment_ids=q_segment_ids,
                    kv_segment_ids=kv_segment_ids, sinks=sinks, alibi_slopes=alibi_slopes,
                    implementation=implementation)

    def forward(query, key, value, bias):
        return scaled_dot_product_attention(query, key, value, bias=bias, **keywords)

    with jax_highest():
        out, pullback = jax.vjp(forward, query, key, value, bias)
        dq, dk, dv, dbias = pullback(grad_output.astype(out.dtype))
    return AttentionGrads(dq, dk, dv, dbias, None)


@takes_descales(_KERNEL, jax_output)
def attention_weights(
    query: jax.Array,
    key: jax.Array,
    *,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    implementation: str | None = None,
    **extra: Any,  # window, segment ids, sinks, ALiBi slopes
) -> jax.Array:
    """The weights (..., H, L, S) from JAX's kernel: attention with value = identity (S x S)."""
    K, S = key.shape[-3], key.shape[-2]
    identity = jnp.broadcast_to(jnp.eye(S, dtype=query.dtype), (*key.shape[:-3], K, S, S))
    return scaled_dot_product_attention(
        query,
        key,
        identity,
        mask=mask,
        bias=bias,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        scale=scale,
        softcap=softcap,
        implementation=implementation,
        **extra,
    )


# ---------------------------------------------------------------------------------------------
# Contract v3: varlen and paged as one call on a padded batch (query/key_value_seq_lengths)
# ---------------------------------------------------------------------------------------------


def _refuse(softcap: float | None, sinks: jax.Array | None) -> None:
    """The kernel's missing arguments, refused before it runs."""
    if softcap is not None:
        raise NotImplementedError("jax.nn.dot_product_attention has no softcap")
    if sinks is not None:
        raise NotImplementedError("jax.nn.dot_product_attention has no sinks")


def _padded_call(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    q_lens: jax.Array | None,
    kv_lens: jax.Array,
    is_causal: bool,
    window: tuple[int | None, int | None] | None,
    scale: float | None,
    alibi_slopes: jax.Array | None,
    implementation: str | None,
    alibi_offsets: jax.Array | None = None,
) -> jax.Array:
    """The kernel on a padded batch, its own layout: query (N, L, H, D), key (N, S, K, D),
    value (N, S, K, E), ``q_lens``/``kv_lens`` (N,) its ``query_seq_lengths`` and
    ``key_value_seq_lengths`` -> (N, L, H, E). Rules top-left on the padded positions: JAX's
    ``is_causal`` and ``local_window_size``; ALiBi an additive (1|N, H, L, S) bias built here,
    ``-slope[h] * |i + offset[n] - j|`` (``alibi_offsets`` (N,); None: 0)."""
    L, D = query.shape[1], query.shape[-1]
    S, E = key.shape[1], value.shape[-1]
    local_window = None
    if window is not None:  # JAX's (left, right) in keys before and after the diagonal
        left, right = window
        big = max(L, S)  # an unbounded side: the whole sequence
        local_window = (big if left is None else left, big if right is None else right)
    bias = None
    if alibi_slopes is not None:
        rows = jnp.arange(L)[None, :, None]  # (1, L, 1)
        if alibi_offsets is not None:
            rows = rows + alibi_offsets[:, None, None]  # (N, L, 1)
        distance = jnp.abs(rows - jnp.arange(S)[None, None, :])  # (1|N, L, S)
        bias = -alibi_slopes[None, :, None, None] * distance[:, None].astype(alibi_slopes.dtype)
    width = max(D, E)  # JAX wants value's E equal to D; zero columns change nothing
    query, key, value = _pad_last(query, width), _pad_last(key, width), _pad_last(value, width)
    with jax_highest():  # traced inside: float32 matmuls in float32, never TF32
        out = jax.nn.dot_product_attention(
            query, key, value, bias=bias, scale=1.0 / math.sqrt(D) if scale is None else scale,
            is_causal=is_causal, query_seq_lengths=q_lens, key_value_seq_lengths=kv_lens,
            local_window_size=local_window, implementation=implementation,
        )  # (N, L, H, width)
    return out[..., :E]


def _sequence_of(cu_seqlens: jax.Array, T: int) -> tuple[jax.Array, jax.Array]:
    """Per packed row ``0 .. T-1``: its sequence (T,) and its index within the sequence (T,)."""
    rows = jnp.arange(T)
    seq = jnp.searchsorted(cu_seqlens[1:], rows, side="right")
    return seq, rows - cu_seqlens[seq]


def _pad_sequences(x: jax.Array, cu_seqlens: jax.Array) -> jax.Array:
    """Packed rows ``x`` (T, N_heads, X) -> padded (N, T, N_heads, X): sequence n's rows first,
    zeros after its length (T rows each: the static bound on any sequence's length)."""
    T = x.shape[0]
    i = jnp.arange(T)[None, :]  # (1, T)
    rows = cu_seqlens[:-1, None] + i  # (N, T)
    inside = i < (cu_seqlens[1:] - cu_seqlens[:-1])[:, None]  # (N, T)
    gathered = x[jnp.where(inside, rows, 0)]  # (N, T, N_heads, X)
    return jnp.where(inside[..., None, None], gathered, jnp.zeros((), x.dtype))


@takes_descales(_KERNEL, jax_output, token_major=True)
def varlen_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    cu_seqlens_q: jax.Array,
    cu_seqlens_k: jax.Array,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: jax.Array | None = None,
    alibi_slopes: jax.Array | None = None,
    implementation: str | None = None,
) -> jax.Array:
    """Packed sequences as one kernel call on a padded batch: query (Tq, H, D), key (Tk, K, D),
    value (Tk, K, E), ``cu_seqlens_q``/``cu_seqlens_k`` (N + 1,) -> (Tq, H, E).

    Sequence n's rows become batch row n, zero-padded to (Tq, H, D) and (Tk, K, D|E), and its
    lengths the kernel's ``query_seq_lengths``/``key_value_seq_lengths``: the form JAX's kernel
    has for sequences of different lengths (it has no packed, segment-id argument), one call
    whose boundaries stay traced under ``jit``. Each sequence starts at padded position 0, so
    JAX's top-left ``is_causal``/``local_window_size`` are the contract's top-left rules per
    sequence; bottom-right is NotImplementedError, as in :func:`scaled_dot_product_attention`,
    and so are softcap and sinks. ALiBi is a bias built here on each sequence's diagonal
    (``S_n - L_n`` bottom-right)."""
    _refuse(softcap, sinks)
    if (is_causal or window is not None) and causal_alignment != "top_left":
        raise NotImplementedError(
            "jax.nn.dot_product_attention's is_causal and local_window_size are top-left only; "
            f"got {causal_alignment!r}"
        )
    cu_q, cu_k = cu_seqlens_q.astype(jnp.int32), cu_seqlens_k.astype(jnp.int32)
    q_lens, kv_lens = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]  # (N,), (N,)
    out = _padded_call(
        _pad_sequences(query, cu_q), _pad_sequences(key, cu_k), _pad_sequences(value, cu_k),
        q_lens=q_lens, kv_lens=kv_lens, is_causal=is_causal, window=window, scale=scale,
        alibi_slopes=alibi_slopes, implementation=implementation,
        alibi_offsets=kv_lens - q_lens if causal_alignment == "bottom_right" else None,
    )  # (N, Tq, H, E)
    seq, row = _sequence_of(cu_q, query.shape[0])  # (Tq,), (Tq,)
    return out[seq, row]  # (Tq, H, E)


@takes_descales(_KERNEL, jax_output, token_major=True)
def paged_attention(
    query: jax.Array,
    key_cache: jax.Array,
    value_cache: jax.Array,
    block_table: jax.Array,
    seq_lens: jax.Array,
    cu_seqlens_q: jax.Array,
    *,
    is_causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: jax.Array | None = None,
    alibi_slopes: jax.Array | None = None,
    implementation: str | None = None,
) -> jax.Array:
    """A paged cache as one kernel call on a padded batch: query (T, H, D), key_cache
    (P, page, K, D), value_cache (P, page, K, E), block_table (N, max_pages), seq_lens (N,),
    cu_seqlens_q (N + 1,) -> (T, H, E).

    The wrapper gathers sequence n's keys and values through ``block_table`` into batch row n,
    (max_pages * page, K, D|E): key j from slot ``j % page`` of page ``block_table[n, j //
    page]`` for j < ``seq_lens[n]``, zeros past it (a slot or table entry past ``seq_lens[n]``
    never reaches the kernel), ``seq_lens`` the kernel's ``key_value_seq_lengths``. Each query
    goes to its absolute position ``seq_lens[n] - L_n + i`` of the padded row, so JAX's
    top-left ``is_causal`` and ``local_window_size`` (and an ALiBi bias on the padded positions)
    are the contract's bottom-right rules; the other padded rows are computed and dropped.
    No softcap, no sinks: NotImplementedError."""
    _refuse(softcap, sinks)
    P, page, K, _ = key_cache.shape
    S = block_table.shape[1] * page  # the static bound on any sequence's keys
    lens = seq_lens.astype(jnp.int32)  # (N,)
    j = jnp.arange(S)  # (S,)
    kept = j[None, :] < lens[:, None]  # (N, S)
    slots = jnp.where(kept, block_table[:, j // page] * page + j % page, 0)  # (N, S)

    def gathered(cache: jax.Array) -> jax.Array:  # (P, page, K, X) -> (N, S, K, X)
        rows = cache.reshape(P * page, K, cache.shape[-1])[slots]
        return jnp.where(kept[..., None, None], rows, jnp.zeros((), cache.dtype))

    cu = cu_seqlens_q.astype(jnp.int32)
    seq, row = _sequence_of(cu, query.shape[0])  # (T,), (T,)
    position = lens[seq] - (cu[1:] - cu[:-1])[seq] + row  # (T,): each query's key position
    padded = jnp.zeros((lens.shape[0], S, *query.shape[1:]), query.dtype)
    padded = padded.at[seq, position].set(query)  # (N, S, H, D)
    out = _padded_call(
        padded, gathered(key_cache), gathered(value_cache), q_lens=None, kv_lens=lens,
        is_causal=is_causal, window=window, scale=scale, alibi_slopes=alibi_slopes,
        implementation=implementation,
    )  # (N, S, H, E)
    return out[seq, position]  # (T, H, E)


#: paged_attention's keywords that are Python scalars: static under jit.
_PAGED_STATIC = ("is_causal", "window", "scale", "softcap")


def prepare(alias: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """Jit like every JAX port; eager only where XLA:CPU refuses JAX's float16 dot precision,
    and for an fp8 call with descales (the module docstring says why)."""
    if alias == "paged":  # jitted as it is: the adapter would check the call first (validation
        # this port does not have, as the other kernel ports do not)
        jitted = jax.jit(without_descales(function), static_argnames=_PAGED_STATIC)
    else:
        jitted = jax_adapter.prepare(alias, without_descales(function))

    def run(*args: Any, **kwargs: Any) -> Any:
        if any(kwargs.get(name) is not None for name in DESCALES):
            return function(*args, **kwargs)
        try:
            return jitted(*args, **kwargs)
        except ValueError as exc:
            if "not supported by dot_general" not in str(exc):
                raise
            return function(*args, **kwargs)

    return run


def pinned(implementation: str) -> types.ModuleType:
    """This port with ``implementation`` fixed (``"xla"`` or ``"cudnn"``), named
    ``conformance.ports.jax_fused[<implementation>]``; its xfails are this port's own file."""
    port = types.ModuleType(f"{__name__}[{implementation}]", f"jax.nn.dpa, {implementation}")
    port.__file__ = __file__
    for name in (
        "scaled_dot_product_attention",
        "attention_weights",
        "scaled_dot_product_attention_vjp",
        "varlen_attention",
        "paged_attention",
    ):
        setattr(port, name, functools.partial(globals()[name], implementation=implementation))
    port.from_numpy, port.to_numpy, port.prepare = from_numpy, to_numpy, prepare
    return port
