"""The float64 oracle: attention written out one query row at a time, for clarity, not speed.

Why one file of ~1,100 lines: it is the specification in code, read top to bottom in the
order of SEMANTICS.md (attention, rotary, modules, the backward, then contract v3's varlen,
paged and latent attention), and nothing else in the repository may be imported by it; its
sections share the row loop and the rounding helpers, so splitting would scatter the one
definition a golden value comes from.

This file is the definition the golden fixtures are computed from. It follows the steps of
SEMANTICS.md literally, with explicit loops over the batch, the query heads and the query rows,
Python's ``math.fsum`` for every sum (exactly rounded, so the result does not depend on a BLAS
or on the order of a reduction) and ``math.exp``/``math.tanh`` for the elementwise steps. It
imports nothing from ``impl_numpy``, ``impl_torch`` or ``impl_jax`` and validates nothing:
the cases are written to be valid, and error cases state their expected error themselves.

The attention modules (:func:`module_forward`) are the same steps with four projections around
them, also written out element by element from the canonical weights: ``q_proj``, ``k_proj``,
``v_proj`` (``y = x @ kernel + bias``), heads split off the feature axis (head h owns features
``[h*D:(h+1)*D]``), :func:`attention`, heads merged back, ``o_proj``.

Rotary position embedding (:func:`rotary`) is written the same way: one feature pair of one token
at a time, ``math.cos``/``math.sin`` of the angle ``position * theta ** (-2p / rotary_dim)``; a
module with ``rope_theta`` rotates its queries and keys with it right after the projections.

The same loop, told to round to a dtype after every step (``round_to="float16"``), is the
"plain same-dtype implementation" of the tolerance rule: inputs, scores, softcapped scores,
biased scores, exponentials, row sums, weights and outputs are each rounded to that dtype.
Its error against the float64 golden sets the case's bound (see :func:`tolerance_bound`).

Shape letters (SEMANTICS.md): B batch (any number of leading dims, ``...``), H query heads,
K key/value heads (G = H // K), L query length, S key/value length, D query/key head dim,
E value head dim, M model width (d_model).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = [
    "NOISE_FLOOR",
    "Fp8CacheGolden",
    "Golden",
    "GoldenGrads",
    "ModuleGolden",
    "assert_within",
    "attention",
    "attention_vjp",
    "causal_mask",
    "dequantized",
    "fp8_cache_decode",
    "fp8_margin",
    "fp8_rounded",
    "linear",
    "module_forward",
    "paged_attention",
    "paged_cache_write",
    "paged_key_rows",
    "quantize_fp8",
    "rotary",
    "rounded",
    "rounding",
    "tolerance_bound",
    "varlen_attention",
    "varlen_attention_vjp",
]

#: Noise floor per dtype, added to 2 x the plain implementation's error, and multiplied by
#: max(1, largest |golden|). About one unit in the last place at 1.0 for the two 16-bit
#: types, ~17 ulp for float32 (fused and reordered float32 kernels agree to about 1e-6),
#: and 1e-12 for float64 (summation order, FMA).
NOISE_FLOOR: dict[str, float] = {
    "float64": 1e-12,
    "float32": 2e-6,
    "float16": 1e-3,
    "bfloat16": 8e-3,
}


@dataclass(frozen=True)
class Golden:
    """What the oracle returns.

    output:  ``(..., H, L, E)`` float64, or None when no value was given.
    weights: ``(..., H, L, S)`` float64 (batch = broadcast of query and key batch dims).
    allowed: ``(..., H, L, S)`` bool, True where the mask, the causal rule and the bias
             (not -inf) all allow the key.
    lse:     ``(..., H, L)`` float64, the log-sum-exp of each row's allowed scores (the
             normalizer ``flash_attention(return_lse=True)`` returns); -inf for a row with none.
    scores:  ``(..., H, L, S)`` float64, the scores after softcap, bias and ALiBi (steps 1-3)
             where ``allowed``, -inf elsewhere.
    """

    output: np.ndarray | None
    weights: np.ndarray
    allowed: np.ndarray
    lse: np.ndarray
    scores: np.ndarray


def rounded(x: np.ndarray | float, dtype: str) -> np.ndarray:
    """``x`` (float64) rounded to the float dtype ``dtype``: the one rounding rule of the
    fixtures' inputs and of the plain same-dtype computation.

    bfloat16 goes through float32: round to nearest even into float32, then into bfloat16, as a
    float32 program's cast does. Rounding float64 directly would differ where the float32 value
    lands on a bfloat16 midpoint (1.17578127... becomes 1.171875 this way, 1.1796875 directly),
    and ml_dtypes itself changed from the first to the second in 0.7, so the rule is written
    here, not taken from the installed version (the fixtures are byte for byte reproducible).
    """
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore"):  # overflow to inf is what the dtype does
        if dtype == "bfloat16":
            return x.astype(np.float32).astype(ml_dtypes.bfloat16)
        return x.astype(np.dtype(dtype))  # float64, float32, float16: one rounding, IEEE


def rounding(dtype: str | None) -> Callable[[float], float]:
    """A function rounding a Python float to ``dtype`` (identity for None and float64), by
    :func:`rounded`'s rule."""
    if dtype is None or dtype == "float64":
        return float
    scalar = {"float32": np.float32, "float16": np.float16, "bfloat16": np.float32}[dtype]
    narrow = ml_dtypes.bfloat16 if dtype == "bfloat16" else float  # (scalars: no array per call)

    def rnd(x: float) -> float:
        with np.errstate(over="ignore"):  # overflow to inf is what the dtype does
            return float(narrow(scalar(x)))

    return rnd


#: Each fp8 format: its mantissa bits, its smallest normal exponent and its largest value.
FP8_FORMATS: dict[str, tuple[int, int, float]] = {
    "float8_e4m3fn": (3, -6, 448.0),
    "float8_e5m2": (2, -14, 57344.0),
}


def fp8_rounded(x: np.ndarray | float, fmt: str) -> np.ndarray:
    """``x`` (float64 values) rounded to nearest even in the fp8 format ``fmt``, saturating:
    clipped to ``[-max, max]`` first, then rounded on the grid of its binade (``2**(e - m)``
    for a normal value of exponent e with m mantissa bits; the subnormal step below the
    smallest normal), written from the formats' bits (np.frexp), not from ml_dtypes. Returns
    float64 values that are exactly representable in ``fmt``."""
    mant, emin, top = FP8_FORMATS[fmt]
    x = np.clip(np.asarray(x, np.float64), -top, top)
    _, e = np.frexp(np.abs(x))  # |x| = f 2**e, f in [0.5, 1)
    step = np.ldexp(1.0, np.maximum(e - 1, emin) - mant)
    return np.copysign(np.round(np.abs(x) / step) * step, x)  # np.round: half to even


def quantize_fp8(
    x: np.ndarray, fmt: str = "float8_e4m3fn", axes: tuple[int, ...] = (-2, -1), descale=None
) -> tuple[np.ndarray, np.ndarray]:
    """The contract's ``quantize_fp8``: x to float32 first, the descale (dynamic
    ``max(max|x| over axes / fp8_max, 2**-126)``, 1.0 where max|x| is 0, in float32; or the
    given one), the quotient ``x / descale`` in float32, then :func:`fp8_rounded`. Returns the
    fp8 values (float64) and the descale (float32, x's shape without ``axes``)."""
    x32 = np.asarray(x).astype(np.float32)
    axes = tuple(a % x32.ndim for a in axes)
    shape = tuple(n for a, n in enumerate(x32.shape) if a not in axes)
    keep = tuple(1 if a in axes else n for a, n in enumerate(x32.shape))
    if descale is None:
        amax = np.abs(x32).max(axis=axes, keepdims=True)
        d = np.maximum(amax / np.float32(FP8_FORMATS[fmt][2]), np.float32(2.0**-126))
        d = np.where(amax == 0, np.float32(1.0), d).astype(np.float32)
    else:
        d = np.broadcast_to(np.asarray(descale, np.float32), shape).reshape(keep)
    quotient = x32 / d  # float32, correctly rounded
    return fp8_rounded(quotient.astype(np.float64), fmt), d.reshape(shape)


def dequantized(x: np.ndarray, descale) -> np.ndarray:
    """What an fp8 input ``(..., H|K, L|S, D|E)`` stands for: its values in float64 times the
    descale ``(..., H|K)`` (None: 1.0) broadcast over the length and head-dim axes."""
    x = np.asarray(x).astype(np.float64)
    if descale is None:
        return x
    return x * np.asarray(descale, np.float64)[..., None, None]


def causal_mask(q_len: int, kv_len: int, alignment: str = "top_left") -> np.ndarray:
    """Boolean ``(L, S)``: query i may attend key j iff ``j <= i + offset``.

    offset = 0 for ``top_left``; ``S - L`` for ``bottom_right`` (the last query row lines up
    with the last key; with L > S the first L - S rows see nothing).
    """
    offset = 0 if alignment == "top_left" else kv_len - q_len
    allowed = np.zeros((q_len, kv_len), dtype=bool)
    for i in range(q_len):
        for j in range(kv_len):
            allowed[i, j] = j <= i + offset
    return allowed


def in_window(i: int, j: int, offset: int, window: tuple | None) -> bool:
    """The window rule, for one query row i and one key j: ``i + offset - left <= j <= i +
    offset + right``, both ends included, a side of None unbounded (no window: always)."""
    if window is None:
        return True
    left, right = window
    after_start = left is None or j >= i + offset - left
    before_end = right is None or j <= i + offset + right
    return after_start and before_end


def attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray | None = None,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    round_to: str | None = None,
    weights_to: str | None = None,
) -> Golden:
    """Attention by the book, one query row at a time, in float64.

    Args:
        query: ``(..., H, L, D)``; key: ``(..., K, S, D)``; value: ``(..., K, S, E)`` or None.
        mask: bool, broadcastable to ``(..., H, L, S)`` (batch dims of query and key only).
        bias: float, broadcastable like mask; may hold -inf.
        is_causal, causal_alignment, scale, softcap: as in SEMANTICS.md.
        window, q_segment_ids, kv_segment_ids, sinks, alibi_slopes: as in SEMANTICS.md's
            contract v2 (the window's and ALiBi's diagonal is ``causal_alignment``'s).
        round_to: None for the oracle; a dtype name for the plain same-dtype implementation,
            which rounds to that dtype after every step.
        weights_to: None, or an fp8 format: the weights are rounded to it before the value
            product (FlashAttention 3 keeps P in the value's fp8 format: the kernels' practice
            the fp8 ``bound`` allows). ``Golden.weights`` stays unrounded.
    """
    rnd = rounding(round_to)
    q = np.asarray(query, dtype=np.float64)
    k = np.asarray(key, dtype=np.float64)
    H, L, D = q.shape[-3:]
    K, S, _ = k.shape[-3:]
    G = H // K  # query head h reads key/value head h // G (contiguous groups)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)

    # Broadcast everything to the scores' shape (batch of query and key only).
    batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3])
    q = np.broadcast_to(q, (*batch, H, L, D))
    k = np.broadcast_to(k, (*batch, K, S, D))
    scores_shape = (*batch, H, L, S)
    offset = 0 if causal_alignment == "top_left" else S - L  # the diagonal of causal and window
    keep = np.ones(scores_shape, dtype=bool)
    if mask is not None:
        keep = keep & np.broadcast_to(np.asarray(mask, dtype=bool), scores_shape)
    if is_causal:
        keep = keep & causal_mask(L, S, causal_alignment)  # (L, S) broadcasts
    q_ids = kv_ids = None
    if q_segment_ids is not None:  # one segment per query row and per key, for each batch
        q_ids = np.broadcast_to(np.asarray(q_segment_ids), (*batch, L))
        kv_ids = np.broadcast_to(np.asarray(kv_segment_ids), (*batch, S))
    add = None
    if bias is not None:
        add = np.broadcast_to(np.asarray(bias, dtype=np.float64), scores_shape)
    slopes = None if alibi_slopes is None else [float(x) for x in alibi_slopes]  # (H,)
    sink = None if sinks is None else [float(x) for x in sinks]  # (H,)

    weights = np.zeros(scores_shape, dtype=np.float64)
    allowed = np.zeros(scores_shape, dtype=bool)
    lse = np.full(scores_shape[:-1], -math.inf, dtype=np.float64)
    kept_scores = np.full(scores_shape, -math.inf, dtype=np.float64)
    for b in np.ndindex(*batch):
        for h in range(H):
            kv = h // G
            keys = k[(*b, kv)].tolist()  # S rows of D numbers
            for i in range(L):
                q_row = q[(*b, h, i)].tolist()  # D numbers
                scores = []  # (s_j, allowed_j) for j in 0..S-1
                for j in range(S):
                    # 1. score = (query . key) * scale
                    s = rnd(math.fsum(a * c for a, c in zip(q_row, keys[j])))
                    s = rnd(s * scale)
                    # 2. softcap, before bias and mask
                    if softcap is not None:
                        s = rnd(softcap * rnd(math.tanh(rnd(s / softcap))))
                    # 3. bias (may be -inf)
                    excluded = False  # a -inf bias excludes the key, whatever its score
                    if add is not None:
                        excluded = float(add[(*b, h, i, j)]) == -math.inf
                        s = rnd(s + float(add[(*b, h, i, j)]))
                    # 3. ALiBi: -slope of the head times the distance to the diagonal
                    if slopes is not None:
                        s = rnd(s - rnd(slopes[h] * abs(i + offset - j)))
                    # 4. mask, causal, window and segments: a position any of them refuses is out
                    ok = bool(keep[(*b, h, i, j)]) and not excluded and s != -math.inf
                    ok = ok and in_window(i, j, offset, window)
                    if q_ids is not None:
                        ok = ok and q_ids[b][i] == kv_ids[b][j]
                    scores.append((s, ok))
                    if ok:
                        kept_scores[(*b, h, i, j)] = s
                # 6. softmax over the allowed keys and the head's sink (one more logit, with no
                #    value); no allowed key -> all-zero weights, sink or not
                row = [s for s, ok in scores if ok]
                if not row:
                    continue
                m = max(row) if sink is None else max(*row, sink[h])
                e = [rnd(math.exp(rnd(s - m))) if ok else 0.0 for s, ok in scores]
                sink_share = 0.0 if sink is None else rnd(math.exp(rnd(sink[h] - m)))
                total = rnd(math.fsum([*e, sink_share]))
                lse[(*b, h, i)] = rnd(m + rnd(math.log(total)))
                for j in range(S):
                    weights[(*b, h, i, j)] = rnd(e[j] / total)
                    allowed[(*b, h, i, j)] = scores[j][1]

    output = None
    if value is not None:
        # 7. output = weights @ value over the allowed keys only, over the batch of query, key
        #    and value together: a value row no query attends (padding holding NaN) is no term.
        v = np.asarray(value, dtype=np.float64)
        E = v.shape[-1]
        out_batch = np.broadcast_shapes(batch, v.shape[:-3])
        w = weights if weights_to is None else fp8_rounded(weights, weights_to)
        w = np.broadcast_to(w, (*out_batch, H, L, S))
        ok = np.broadcast_to(allowed, (*out_batch, H, L, S))
        v = np.broadcast_to(v, (*out_batch, K, S, E))
        output = np.zeros((*out_batch, H, L, E), dtype=np.float64)
        for b in np.ndindex(*out_batch):
            for h in range(H):
                v_rows = v[(*b, h // G)].T.tolist()  # E columns of S numbers
                for i in range(L):
                    terms = [
                        (a, j) for j, a in enumerate(w[(*b, h, i)].tolist()) if ok[(*b, h, i, j)]
                    ]
                    for e_ in range(E):
                        output[(*b, h, i, e_)] = rnd(math.fsum(a * v_rows[e_][j] for a, j in terms))
    return Golden(output=output, weights=weights, allowed=allowed, lse=lse, scores=kept_scores)


# ---------------------------------------------------------------------------------------------
# Rotary position embedding
# ---------------------------------------------------------------------------------------------


def rotary(
    x: np.ndarray,
    positions: np.ndarray,
    *,
    theta: float = 10000.0,
    rotary_dim: int | None = None,
    interleaved: bool = False,
    inv_freq: np.ndarray | None = None,
    attention_factor: float = 1.0,
    round_to: str | None = None,
) -> np.ndarray:
    """RoPE by the book, one pair of one token of one head at a time, in float64.

    Args:
        x: ``(..., heads, L, D)``; positions: integers broadcastable to ``(..., L)`` (x's batch
            dims without the heads axis: every head of token t sits at ``positions[..., t]``).
        theta, rotary_dim (default D), interleaved: as in SEMANTICS.md.
        inv_freq: ``(R/2,)`` frequencies replacing ``theta ** (-2p / R)`` (Contract v3).
        attention_factor: multiplies cos and sin (Contract v3).
        round_to: None for the oracle; a dtype name for the plain same-dtype computation. Its
            angle, cos and sin are rounded to the *compute* dtype (float32 for float32, float16
            and bfloat16; SEMANTICS.md says where angles are computed), the products and sums of
            the rotation to ``round_to`` itself.

    Pair p is ``(x[p], x[p + R/2])`` (half-split) or ``(x[2p], x[2p + 1])`` (interleaved), and
    turns by ``positions[t] * theta ** (-2p / R)``: ``(a, b) -> (a cos - b sin, b cos + a sin)``.
    Features ``R .. D-1`` are copied.
    """
    rnd = rounding(round_to)
    angle_rnd = rounding(None if round_to in (None, "float64") else "float32")
    x = np.asarray(x, dtype=np.float64)
    *batch, heads, L, D = x.shape
    R = D if rotary_dim is None else rotary_dim
    pos = np.broadcast_to(np.asarray(positions), (*batch, L))
    out = x.copy()
    for b in np.ndindex(*batch):
        for t in range(L):
            position = angle_rnd(float(pos[(*b, t)]))
            for p in range(R // 2):
                given = theta ** (-2 * p / R) if inv_freq is None else float(inv_freq[p])
                frequency = angle_rnd(given)
                angle = angle_rnd(position * frequency)
                c = angle_rnd(angle_rnd(math.cos(angle)) * attention_factor)
                s = angle_rnd(angle_rnd(math.sin(angle)) * attention_factor)
                i, j = (2 * p, 2 * p + 1) if interleaved else (p, p + R // 2)
                for h in range(heads):
                    a, bb = float(x[(*b, h, t, i)]), float(x[(*b, h, t, j)])
                    out[(*b, h, t, i)] = rnd(rnd(a * c) - rnd(bb * s))
                    out[(*b, h, t, j)] = rnd(rnd(bb * c) + rnd(a * s))
    return out


# ---------------------------------------------------------------------------------------------
# The attention modules: four projections around attention()
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleGolden:
    """What :func:`module_forward` returns: output ``(B, L, M)`` and weights ``(B, H, L, S)``."""

    output: np.ndarray
    weights: np.ndarray


def linear(
    x: np.ndarray, kernel: np.ndarray, bias: np.ndarray | None, round_to: str | None = None
) -> np.ndarray:
    """``y = x @ kernel + bias`` one output element at a time: x ``(B, T, in)``, kernel
    ``(in, out)`` (canonical: input features on the first axis), bias ``(out,)`` or None."""
    rnd = rounding(round_to)
    n_batch, n_tokens, _ = x.shape
    n_out = kernel.shape[1]
    columns = np.asarray(kernel, dtype=np.float64).T.tolist()  # out columns of in numbers
    y = np.zeros((n_batch, n_tokens, n_out), dtype=np.float64)
    for b in range(n_batch):
        for t in range(n_tokens):
            row = np.asarray(x[b, t], dtype=np.float64).tolist()  # in numbers
            for o in range(n_out):
                value = rnd(math.fsum(a * c for a, c in zip(row, columns[o])))
                if bias is not None:
                    value = rnd(value + float(bias[o]))
                y[b, t, o] = value
    return y


def _split_heads(y: np.ndarray, n_heads: int) -> np.ndarray:
    """``(B, T, n*X)`` -> ``(B, n, T, X)``: head h is features ``[h*X:(h+1)*X]``."""
    n_batch, n_tokens, width = y.shape
    size = width // n_heads
    heads = np.zeros((n_batch, n_heads, n_tokens, size), dtype=np.float64)
    for h in range(n_heads):
        heads[:, h, :, :] = y[:, :, h * size : (h + 1) * size]
    return heads


def _merge_heads(out: np.ndarray) -> np.ndarray:
    """``(B, H, L, E)`` -> ``(B, L, H*E)``: head h goes to features ``[h*E:(h+1)*E]``."""
    n_batch, n_heads, q_len, size = out.shape
    merged = np.zeros((n_batch, q_len, n_heads * size), dtype=np.float64)
    for h in range(n_heads):
        merged[:, :, h * size : (h + 1) * size] = out[:, h, :, :]
    return merged


def module_forward(
    weights: dict[str, np.ndarray],
    x: np.ndarray,
    context: np.ndarray | None = None,
    *,
    n_heads: int,
    n_kv_heads: int,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    rope_theta: float | None = None,
    rope_interleaved: bool = False,
    rotary_dim: int | None = None,
    rope_inv_freq: np.ndarray | list | None = None,
    rope_attention_factor: float = 1.0,
    window: tuple | list | None = None,
    alibi: bool = False,
    softcap: float | None = None,
    scale: float | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
    round_to: str | None = None,
) -> ModuleGolden:
    """The attention module of SEMANTICS.md, from its canonical weights, in float64.

    Args:
        weights: ``q_proj.kernel (M, H*D)``, ``k_proj.kernel (M, K*D)``, ``v_proj.kernel
            (M, K*E)``, ``o_proj.kernel (H*E, M)`` and, all or none, the four ``*.bias``.
        x: ``(B, L, M)``; context: ``(B, S, M)`` or None (self-attention, S = L).
        n_heads, n_kv_heads: H and K (``H*D`` alone does not say H).
        mask, bias, is_causal, causal_alignment: as in :func:`attention`, to ``(B, H, L, S)``.
        rope_theta, rope_interleaved, rotary_dim: RoPE (:func:`rotary`) of the queries and keys
            after the projections, when ``rope_theta`` is given: query i at position
            ``i + offset``, key j at position ``j``, with ``offset`` the causal alignment's
            (0 for top_left, S - L for bottom_right; 0 for self-attention either way).
        rope_inv_freq, rope_attention_factor: :func:`rotary`'s ``inv_freq`` (the frequencies
            of pair p, instead of theta's) and ``attention_factor`` (on cos and sin).
        window, softcap, scale: the module's own settings, passed to :func:`attention`; alibi:
            ALiBi with :func:`alibi_slopes` of H; the weight ``sinks (H,)``, if present, is the
            sink logit of each query head; q_segment_ids, kv_segment_ids: as in
            :func:`attention` (packed sequences).
        round_to: None for the oracle; a dtype name for the plain same-dtype module, which rounds
            after every step (projections, bias additions, attention, output projection).
    """
    x = np.asarray(x, dtype=np.float64)
    context = x if context is None else np.asarray(context, dtype=np.float64)

    def project(name: str, inp: np.ndarray) -> np.ndarray:
        return linear(inp, weights[f"{name}.kernel"], weights.get(f"{name}.bias"), round_to)

    # 1. projections: q (B, L, H*D), k (B, S, K*D), v (B, S, K*E)
    q = _split_heads(project("q_proj", x), n_heads)  # (B, H, L, D)
    k = _split_heads(project("k_proj", context), n_kv_heads)  # (B, K, S, D)
    v = _split_heads(project("v_proj", context), n_kv_heads)  # (B, K, S, E)
    if rope_theta is not None:  # rotary positions: query i at i + offset, key j at j
        q_len, kv_len = q.shape[2], k.shape[2]
        offset = 0 if causal_alignment == "top_left" else kv_len - q_len
        inv = None if rope_inv_freq is None else np.asarray(rope_inv_freq, np.float64)
        rope = dict(theta=rope_theta, rotary_dim=rotary_dim, interleaved=rope_interleaved,
                    inv_freq=inv, attention_factor=rope_attention_factor,
                    round_to=round_to)
        q = rotary(q, np.array([i + offset for i in range(q_len)]), **rope)  # (B, H, L, D)
        k = rotary(k, np.array(list(range(kv_len))), **rope)  # (B, K, S, D)
    # 2. attention of every head (query head h reads key/value head h // (H // K))
    golden = attention(
        q, k, v, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, round_to=round_to,
        window=None if window is None else tuple(window), softcap=softcap, scale=scale,
        sinks=weights.get("sinks"), alibi_slopes=alibi_slopes(n_heads) if alibi else None,
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
    )
    # 3. heads merged back, output projection: (B, L, H*E) -> (B, L, M)
    y = project("o_proj", _merge_heads(golden.output))
    return ModuleGolden(output=y, weights=golden.weights)


@dataclass(frozen=True)
class Fp8CacheGolden:
    """What :func:`fp8_cache_decode` returns: the output ``(B, T, M)`` of every step, the
    cache's fp8 keys ``(B, K, T, D)`` and values ``(B, K, T, E)`` (their values, float64), its
    descales ``(K,)`` (float32), ``margin``: the least distance of an unsaturated quotient
    ``x / descale`` to a rounding boundary of the format, in steps of its grid (0.5 at best),
    and ``saturated``: how many quotients exceed the format's max by more than 1%."""

    output: np.ndarray
    key: np.ndarray
    value: np.ndarray
    k_descale: np.ndarray
    v_descale: np.ndarray
    margin: float
    saturated: int


def fp8_margin(x: np.ndarray, descale: np.ndarray, fmt: str) -> float:
    """The least distance of ``float32(x) / descale`` (x ``(B, K, T, D)``, descale ``(K,)``) to
    a midpoint of ``fmt``'s grid, in steps of that grid, over the values below the format's max
    (a saturated value has no boundary near it): how far a port's own float32 rounding of x may
    move before its fp8 value differs from this one."""
    mant, emin, top = FP8_FORMATS[fmt]
    d = np.asarray(descale, np.float32).reshape(1, -1, 1, 1)
    quotient = np.abs((np.asarray(x).astype(np.float32) / d).astype(np.float64))
    quotient = quotient[quotient < top]
    if quotient.size == 0:
        return 0.5
    _, e = np.frexp(quotient)
    step = np.ldexp(1.0, np.maximum(e - 1, emin) - mant)
    units = quotient / step  # the value in steps: a midpoint is at n + 0.5
    return float(np.min(np.abs(units - np.floor(units) - 0.5)))


def fp8_cache_decode(
    weights: dict[str, np.ndarray],
    x: np.ndarray,
    chunks: list[int],
    *,
    fmt: str,
    n_heads: int,
    n_kv_heads: int,
    k_descale: np.ndarray | float | None = None,
    v_descale: np.ndarray | float | None = None,
    rope_theta: float | None = None,
    rope_interleaved: bool = False,
    rotary_dim: int | None = None,
    window: tuple | list | None = None,
    round_to: str | None = None,
) -> Fp8CacheGolden:
    """The modules' fp8 KV cache (the project's SEMANTICS.md, "FP8 KV cache"), written here
    from the rule alone: ``x (B, T, M)`` decoded in ``chunks`` into a cache of format ``fmt``.

    Each token's key and value are its projections (the key rotated at its position when
    ``rope_theta`` is given), quantized by :func:`quantize_fp8` over (B, tokens, head dim) with
    one descale per key/value head ``(K,)``: ``k_descale``/``v_descale`` when given, else the
    dynamic descale of the FIRST chunk's keys and values, fixed for every later token (which
    saturates past it). Step n's queries (rotated at their positions) attend, bottom-right
    causal within ``window``, to every key so far dequantized in float64 (:func:`dequantized`);
    the output projection follows. ``round_to``: the plain same-dtype computation (projections,
    rotation and attention rounded to it; the fp8 values are the same where the margin holds).
    """
    x = np.asarray(x, dtype=np.float64)
    B, T, _ = x.shape

    def project(name: str) -> np.ndarray:
        return linear(x, weights[f"{name}.kernel"], weights.get(f"{name}.bias"), round_to)

    # 1. projections of every token (a token's own: the chunking does not change them).
    q = _split_heads(project("q_proj"), n_heads)  # (B, H, T, D)
    k = _split_heads(project("k_proj"), n_kv_heads)  # (B, K, T, D)
    v = _split_heads(project("v_proj"), n_kv_heads)  # (B, K, T, E)
    if rope_theta is not None:  # token t at position t, query and key alike
        positions = np.array(list(range(T)))
        rope = dict(theta=rope_theta, rotary_dim=rotary_dim, interleaved=rope_interleaved,
                    round_to=round_to)
        q, k = rotary(q, positions, **rope), rotary(k, positions, **rope)
    # 2. the cache's descales: the caller's, or the first chunk's dynamic ones, then fixed.
    first = chunks[0]
    if k_descale is None:
        _, k_descale = quantize_fp8(k[:, :, :first], fmt, axes=(0, 2, 3))  # (K,)
    if v_descale is None:
        _, v_descale = quantize_fp8(v[:, :, :first], fmt, axes=(0, 2, 3))  # (K,)
    k_d = np.broadcast_to(np.asarray(k_descale, np.float32), (n_kv_heads,))
    v_d = np.broadcast_to(np.asarray(v_descale, np.float32), (n_kv_heads,))
    # 3. every token stored in fp8 at those descales (static form, saturating).
    key8, _ = quantize_fp8(k, fmt, axes=(0, 2, 3), descale=k_d)  # (B, K, T, D) values
    value8, _ = quantize_fp8(v, fmt, axes=(0, 2, 3), descale=v_d)  # (B, K, T, E) values
    k64, v64 = dequantized(key8, k_d), dequantized(value8, v_d)
    # 4. each step's queries over the keys written so far, bottom-right causal.
    out = np.zeros((B, n_heads, T, v.shape[-1]), dtype=np.float64)
    start = 0
    for n in chunks:
        stop = start + n
        step = attention(q[:, :, start:stop], k64[:, :, :stop], v64[:, :, :stop],
                         is_causal=True, causal_alignment="bottom_right", round_to=round_to,
                         window=None if window is None else tuple(window))
        out[:, :, start:stop] = step.output
        start = stop
    # 5. heads merged back, output projection.
    y = linear(_merge_heads(out), weights["o_proj.kernel"], weights.get("o_proj.bias"), round_to)
    margin = min(fp8_margin(k, k_d, fmt), fp8_margin(v, v_d, fmt))
    top = FP8_FORMATS[fmt][2]
    saturated = sum(
        int(np.sum(np.abs(a.astype(np.float32) / d.reshape(1, -1, 1, 1)) > 1.01 * top))
        for a, d in ((k, k_d), (v, v_d))
    )
    return Fp8CacheGolden(y, key8, value8, k_d.copy(), v_d.copy(), margin, saturated)


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi's slopes, written here from the paper (Press et al. 2022, and its reference code)
    independently of ``attention_spec.rules``: a power of two n gives the geometric sequence
    starting at and stepping by ``2 ** (-8 / n)``; any other H takes all the slopes of the power
    of two just below it, then every second one (the 0th, 2nd, ...) of the
    sequence for twice that power, as many as are missing. ``(H,)`` float64."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    closest = 1
    while closest * 2 <= n_heads:
        closest *= 2
    slopes = power_of_two(closest)
    slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return np.array(slopes, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# The backward pass: the gradients of <attention(...).output, grad_output>, element by element
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoldenGrads:
    """What :func:`attention_vjp` returns, each of its input's shape, float64: ``query
    (..., H, L, D)``, ``key (..., K, S, D)``, ``value (..., K, S, E)``, ``bias`` (the bias's
    own shape, or None without one) and ``sinks`` ``(H,)`` (None without sinks)."""

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    bias: np.ndarray | None = None
    sinks: np.ndarray | None = None


def _source(index: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The element of an input of ``shape`` that reached ``index`` of a broadcast result: the
    last ``len(shape)`` axes of ``index``, with 0 along the axes where ``shape`` has 1."""
    tail = index[len(index) - len(shape) :]
    return tuple(0 if n == 1 else i for i, n in zip(tail, shape))


def attention_vjp(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    grad_output: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    round_to: str | None = None,
) -> GoldenGrads:
    """The gradients of ``sum(attention(...).output * grad_output)``, by the book, in float64.

    Derived here, not taken from any implementation: for one query row i of head h (key/value
    head ``h // G``), with the weights ``w_ij`` and output ``O_i`` of :func:`attention`,

    - output ``O_i = sum_j w_ij v_j``:  ``dv_j += w_ij dO_i`` and ``dw_ij = dO_i . v_j``;
    - softmax over the allowed keys and the sink (a logit with a zero value):
      ``ds_ij = w_ij (dw_ij - dO_i . O_i)``, ``dsink_h += -w_sink,i (dO_i . O_i)`` with
      ``w_sink,i = exp(sink_h - lse_i)``; a key that is not allowed has ``w_ij = 0``, so no
      term; a row with no allowed key adds nothing at all;
    - bias (added after softcap): ``dbias_ij = ds_ij``; ALiBi is not differentiated;
    - softcap ``c tanh(s / c)``: ``ds_ij *= 1 - tanh^2(s_ij / c)``, s the scaled scores;
    - scores ``s_ij = scale q_i . k_j``: ``dq_i += scale ds_ij k_j``, ``dk_j += scale ds_ij q_i``.

    Every term is collected, per element of each input (a broadcast input's element collects
    the terms of every position it reached; a key/value head those of its G query heads), and
    summed once with ``math.fsum``. ``round_to`` (the plain same-dtype backward of the tolerance
    rule) rounds the forward (as :func:`attention` does) and every step here to that dtype.
    """
    rnd = rounding(round_to)
    keywords = dict(
        mask=mask, bias=bias, is_causal=is_causal, causal_alignment=causal_alignment, scale=scale,
        softcap=softcap, window=window, q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids, sinks=sinks, alibi_slopes=alibi_slopes,
    )
    golden = attention(query, key, value, **keywords, round_to=round_to)
    q = np.asarray(query, dtype=np.float64)
    k = np.asarray(key, dtype=np.float64)
    v = np.asarray(value, dtype=np.float64)
    do = np.asarray(grad_output, dtype=np.float64)
    H, L, D = q.shape[-3:]
    K, S, E = k.shape[-3], k.shape[-2], v.shape[-1]
    G = H // K
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out_batch = do.shape[:-3]  # the batch of query, key and value together
    weights = np.broadcast_to(golden.weights, (*out_batch, H, L, S))
    allowed = np.broadcast_to(golden.allowed, (*out_batch, H, L, S))
    lse = np.broadcast_to(golden.lse, (*out_batch, H, L))
    sink = None if sinks is None else [float(x) for x in sinks]  # (H,)

    terms: dict[str, dict[tuple[int, ...], list[float]]] = {
        name: {} for name in ("query", "key", "value", "bias", "sinks")
    }

    def add(name: str, index: tuple[int, ...], term: float) -> None:
        terms[name].setdefault(index, []).append(term)

    for b in np.ndindex(*out_batch):
        for h in range(H):
            kv = h // G
            keys = k[_source((*b, kv), k.shape[:-2])].tolist()  # S rows of D numbers
            values = v[_source((*b, kv), v.shape[:-2])].tolist()  # S rows of E numbers
            for i in range(L):
                ok = [j for j in range(S) if allowed[(*b, h, i, j)]]
                if not ok:  # no allowed key: zero output, zero gradient
                    continue
                w = weights[(*b, h, i)].tolist()  # S numbers
                q_row = q[_source((*b, h, i), q.shape[:-1])].tolist()  # D numbers
                do_row = do[(*b, h, i)].tolist()  # E numbers
                o_row = golden.output[(*b, h, i)].tolist()  # E numbers
                q_at = _source((*b, h, i), q.shape[:-1])
                # 6. output: dv_j += w_ij dO_i; dw_ij = dO_i . v_j
                dw = {}
                for j in ok:
                    v_at = _source((*b, kv, j), v.shape[:-1])
                    for e in range(E):
                        add("value", (*v_at, e), rnd(w[j] * do_row[e]))
                    dw[j] = rnd(math.fsum(a * c for a, c in zip(do_row, values[j])))
                # 5. softmax: ds_ij = w_ij (dw_ij - dO_i . O_i); the sink's share of the row
                row_dot = rnd(math.fsum(a * c for a, c in zip(do_row, o_row)))
                ds = {j: rnd(w[j] * rnd(dw[j] - row_dot)) for j in ok}
                if sink is not None:
                    w_sink = rnd(math.exp(rnd(sink[h] - float(lse[(*b, h, i)]))))
                    add("sinks", (h,), -rnd(w_sink * row_dot))
                for j in ok:
                    # 3. bias: dbias_ij = ds_ij, into the bias element that reached (i, j)
                    if bias is not None:
                        add("bias", _source((*b, h, i, j), np.shape(bias)), ds[j])
                    # 2. softcap: ds_ij *= 1 - tanh^2(s_ij / c), s the scaled scores
                    if softcap is not None:
                        s = rnd(rnd(math.fsum(a * c for a, c in zip(q_row, keys[j]))) * scale)
                        t = rnd(math.tanh(rnd(s / softcap)))
                        ds[j] = rnd(ds[j] * rnd(1.0 - rnd(t * t)))
                    # 1. scores: dq_i += scale ds_ij k_j; dk_j += scale ds_ij q_i
                    k_at = _source((*b, kv, j), k.shape[:-1])
                    for d in range(D):
                        add("query", (*q_at, d), rnd(rnd(ds[j] * keys[j][d]) * scale))
                        add("key", (*k_at, d), rnd(rnd(ds[j] * q_row[d]) * scale))

    def total(name: str, shape: tuple[int, ...]) -> np.ndarray:
        grad = np.zeros(shape, dtype=np.float64)
        for index, collected in terms[name].items():
            grad[index] = rnd(math.fsum(collected))
        return grad

    return GoldenGrads(
        query=total("query", q.shape),
        key=total("key", k.shape),
        value=total("value", v.shape),
        bias=None if bias is None else total("bias", np.shape(bias)),
        sinks=None if sinks is None else total("sinks", (H,)),
    )


def _round_up_2_digits(x: float) -> float:
    """The bound as stored: rounded up to two significant digits (stable, readable JSON)."""
    if x <= 0.0 or not math.isfinite(x):
        return x
    exponent = math.floor(math.log10(x)) - 1
    return float(f"{math.ceil(x / 10.0**exponent - 1e-9) * 10.0**exponent:.2g}")


def tolerance_bound(golden: np.ndarray, plain: np.ndarray, dtype: str) -> float:
    """SEMANTICS.md's rule: ``2 * max|plain - golden| + floor(dtype) * max(1, max|golden|)``.

    ``plain`` is the same case computed by :func:`attention` with ``round_to=dtype``.
    """
    finite = np.isfinite(golden)  # a log-sum-exp is -inf where a row has no key: exact there
    if not finite.any():
        return _round_up_2_digits(NOISE_FLOOR[dtype])
    err = float(np.max(np.abs(plain[finite] - golden[finite])))
    scale = max(1.0, float(np.max(np.abs(golden[finite]))))
    return _round_up_2_digits(2.0 * err + NOISE_FLOOR[dtype] * scale)


def assert_within(
    got: np.ndarray, golden: np.ndarray, dtype: str, plain: np.ndarray | None = None, *,
    what: str = "",
) -> float:
    """The tests' one tolerance: ``got`` against the float64 ``golden`` under
    :func:`tolerance_bound`, as a port's result is checked; returns the max error.

    ``plain`` is the same call computed with ``round_to=dtype``. A float64 call needs none: its
    plain computation is the golden itself (rounding to float64 is the identity), so its bound is
    the floor, ``NOISE_FLOOR["float64"] * max(1, max|golden|)``. ``golden`` may also be another
    implementation's float64 result for the same call. NaN and inf follow the conformance
    runner: a golden NaN or infinity is met only by the same value; a NaN or infinity anywhere
    else is an infinite error. A number ``golden`` is compared with every element of ``got``.
    """
    if plain is None and dtype != "float64":
        raise ValueError(f"a {dtype} bound needs plain, the call with round_to={dtype!r}")
    values = np.asarray(got).astype(np.float64)
    want = np.asarray(golden, dtype=np.float64)
    if want.ndim == 0:
        want = np.broadcast_to(want, values.shape)
    assert values.shape == want.shape, f"{what}shape {values.shape}, expected {want.shape}"
    bound = tolerance_bound(want, want if plain is None else np.asarray(plain, np.float64), dtype)
    if want.size == 0:
        return 0.0
    with np.errstate(invalid="ignore"):
        diff = np.abs(values - want)
    same = (values == want) | (np.isnan(values) & np.isnan(want))  # -inf lse, NaN of a +inf bias
    diff = np.where(same, 0.0, np.where(np.isnan(diff), math.inf, diff))
    flat = int(np.argmax(diff))
    err = float(diff.flat[flat])
    where = tuple(int(i) for i in np.unravel_index(flat, want.shape))
    assert err <= bound, (
        f"{what}max |got - golden| = {err:.3g} > the {dtype} bound {bound:.3g} at {where}: "
        f"golden {float(want[where])!r}, got {float(values[where])!r}"
    )
    return err


# ---------------------------------------------------------------------------------------------
# Variable-length (packed) batches (Contract v3)
# ---------------------------------------------------------------------------------------------


def varlen_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    cu_seqlens_q: np.ndarray,
    cu_seqlens_k: np.ndarray,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    round_to: str | None = None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
) -> np.ndarray:
    """Packed attention by the book, ``(Tq, H, E)`` float64: one sequence, one query head and
    one query row at a time, written out here (not through :func:`attention`, which the
    fixture generator compares it with, sequence by sequence).

    query ``(Tq, H, D)``, key ``(Tk, K, D)``, value ``(Tk, K, E)``; sequence n is query rows
    ``cu_seqlens_q[n] .. cu_seqlens_q[n+1] - 1`` (L_n) against key rows ``cu_seqlens_k[n] ..
    cu_seqlens_k[n+1] - 1`` (S_n). Within a sequence, query i (from 0) and key j (from 0) are
    positions of that sequence: the causal rule ``j <= i + offset_n``, the window and ALiBi
    use ``offset_n = 0`` (top_left) or ``S_n - L_n`` (bottom_right). A row with no allowed key
    (S_n = 0, or everything masked) is zeros; keys of other sequences are never terms.
    ``round_to``: the plain same-dtype computation, rounding after every step.
    ``q_descale``, ``k_descale``, ``v_descale`` (fp8 inputs; None: 1.0): a number, ``(H|K,)``
    or per sequence ``(N, H|K)``; sequence n's rows are dequantized in float64 with its own
    descale row (:func:`dequantized`, heads-first) before anything else.
    """
    rnd = rounding(round_to)
    q = np.asarray(query).astype(np.float64)
    k = np.asarray(key).astype(np.float64)
    v = np.asarray(value).astype(np.float64)
    Tq, H, D = q.shape
    K, E = k.shape[1], v.shape[2]
    G = H // K
    cu_q = [int(x) for x in cu_seqlens_q]
    cu_k = [int(x) for x in cu_seqlens_k]
    for x, cu, d, heads in ((q, cu_q, q_descale, H), (k, cu_k, k_descale, K),
                            (v, cu_k, v_descale, K)):
        if d is None:
            continue
        rows = np.broadcast_to(np.asarray(d, np.float64), (len(cu) - 1, heads))  # (N, H|K)
        for n in range(len(cu) - 1):  # sequence n's rows, heads-first, times its descale
            part = x[cu[n] : cu[n + 1]].transpose(1, 0, 2)  # (H|K, L_n|S_n, D|E)
            x[cu[n] : cu[n + 1]] = dequantized(part, rows[n]).transpose(1, 0, 2)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    slopes = None if alibi_slopes is None else [float(x) for x in alibi_slopes]  # (H,)
    sink = None if sinks is None else [float(x) for x in sinks]  # (H,)
    out = np.zeros((Tq, H, E), dtype=np.float64)
    for n in range(len(cu_q) - 1):
        q0, k0 = cu_q[n], cu_k[n]
        L_n, S_n = cu_q[n + 1] - q0, cu_k[n + 1] - k0
        offset = 0 if causal_alignment == "top_left" else S_n - L_n
        for h in range(H):
            kv = h // G
            for i in range(L_n):
                q_row = q[q0 + i, h].tolist()  # D numbers
                kept = []  # (j, score) of the allowed keys of this sequence
                for j in range(S_n):
                    if is_causal and j > i + offset:
                        continue
                    if not in_window(i, j, offset, window):
                        continue
                    # 1. score = (query . key) * scale; 2. softcap; 3. ALiBi
                    s = rnd(math.fsum(a * c for a, c in zip(q_row, k[k0 + j, kv].tolist())))
                    s = rnd(s * scale)
                    if softcap is not None:
                        s = rnd(softcap * rnd(math.tanh(rnd(s / softcap))))
                    if slopes is not None:
                        s = rnd(s - rnd(slopes[h] * abs(i + offset - j)))
                    kept.append((j, s))
                if not kept:  # no allowed key: zeros, sink or not
                    continue
                # 5. softmax over the allowed keys and the head's sink
                m = max(s for _, s in kept) if sink is None else max(*(s for _, s in kept), sink[h])
                e = [rnd(math.exp(rnd(s - m))) for _, s in kept]
                sink_share = 0.0 if sink is None else rnd(math.exp(rnd(sink[h] - m)))
                total = rnd(math.fsum([*e, sink_share]))
                w = [rnd(x / total) for x in e]
                # 6. output = weights @ value of this sequence's allowed keys
                for c in range(E):
                    terms = (a * float(v[k0 + j, kv, c]) for a, (j, _) in zip(w, kept))
                    out[q0 + i, h, c] = rnd(math.fsum(terms))
    return out


def varlen_attention_vjp(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    cu_seqlens_q: np.ndarray,
    cu_seqlens_k: np.ndarray,
    grad_output: np.ndarray,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    round_to: str | None = None,
) -> GoldenGrads:
    """The gradients of ``sum(varlen_attention(...) * grad_output)``: per sequence, as the
    contract defines them, :func:`attention_vjp` of its own rows (heads-first), placed back at
    its packed rows; ``dsinks`` is the sum over the sequences. Query ``(Tq, H, D)``, key
    ``(Tk, K, D)``, value ``(Tk, K, E)``, sinks ``(H,)`` (None without sinks); bias None."""
    rnd = rounding(round_to)
    q = np.asarray(query, dtype=np.float64)
    k = np.asarray(key, dtype=np.float64)
    v = np.asarray(value, dtype=np.float64)
    do = np.asarray(grad_output, dtype=np.float64)
    H = q.shape[1]
    cu_q = [int(x) for x in cu_seqlens_q]
    cu_k = [int(x) for x in cu_seqlens_k]
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    dsinks: list[list[float]] = [[] for _ in range(H)]
    for n in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[n], cu_q[n + 1]), slice(cu_k[n], cu_k[n + 1])
        grads = attention_vjp(
            q[rows].transpose(1, 0, 2), k[keys].transpose(1, 0, 2), v[keys].transpose(1, 0, 2),
            do[rows].transpose(1, 0, 2), is_causal=is_causal, causal_alignment=causal_alignment,
            scale=scale, softcap=softcap, window=window, sinks=sinks, alibi_slopes=alibi_slopes,
            round_to=round_to,
        )
        dq[rows] = grads.query.transpose(1, 0, 2)  # (L_n, H, D)
        dk[keys] = grads.key.transpose(1, 0, 2)  # (S_n, K, D)
        dv[keys] = grads.value.transpose(1, 0, 2)  # (S_n, K, E)
        if grads.sinks is not None:
            for h in range(H):
                dsinks[h].append(float(grads.sinks[h]))
    return GoldenGrads(
        query=dq, key=dk, value=dv,
        sinks=None if sinks is None else np.array([rnd(math.fsum(t)) for t in dsinks]),
    )


# ---------------------------------------------------------------------------------------------
# Paged key/value caches (Contract v3): one token, one head, one key at a time
# ---------------------------------------------------------------------------------------------


def paged_key_rows(cache: np.ndarray, block_table: np.ndarray, seq_len: int, n: int) -> list:
    """Sequence n's ``seq_len`` key (or value) rows of a paged ``cache (P, page_size, K, X)``,
    one at a time: key j is slot ``j % page_size`` of page ``block_table[n, j // page_size]``.
    A list of ``seq_len`` arrays ``(K, X)``; nothing past ``seq_len`` is looked at."""
    page_size = cache.shape[1]
    rows = []
    for j in range(seq_len):
        page = int(block_table[n][j // page_size])
        rows.append(np.asarray(cache[page][j % page_size], dtype=np.float64))
    return rows


def paged_attention(
    query: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_table: np.ndarray,
    seq_lens: np.ndarray,
    cu_seqlens_q: np.ndarray,
    *,
    is_causal: bool = False,
    window: tuple | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
    alibi_slopes: np.ndarray | None = None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    round_to: str | None = None,
) -> np.ndarray:
    """Attention over a paged cache by the book, one query token, head and key at a time, in
    float64: ``(T, H, E)``.

    query ``(T, H, D)``; caches ``(P, page_size, K, D|E)``; ``block_table (N, max_pages)``,
    ``seq_lens (N,)``, ``cu_seqlens_q (N + 1,)`` (SEMANTICS.md, "Paged key/value caches").
    Query row i of sequence n sits at position ``p = seq_lens[n] - L_n + i`` and sees key j
    when ``j < seq_lens[n]``, ``j <= p`` if causal, and ``p - left <= j <= p + right`` for a
    window; ALiBi adds ``-slope[h] * |p - j|``. ``round_to``: the plain same-dtype computation
    (rounded after every step), as :func:`attention`'s. An fp8 input stands for ``float(x) *
    descale``: the descales (None: 1.0; a number, ``(H|K,)`` or ``(N, H|K)``) multiply each
    query row, key row and value row as it is read, in float64.
    """
    rnd = rounding(round_to)
    q = np.asarray(query, dtype=np.float64)
    T, H, D = q.shape
    K, E = key_cache.shape[2], value_cache.shape[3]
    G = H // K  # query head h reads key/value head h // G
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    slopes = None if alibi_slopes is None else [float(x) for x in alibi_slopes]
    sink = None if sinks is None else [float(x) for x in sinks]
    N = len(seq_lens)

    def per_sequence(d, heads: int) -> list:  # a descale as N rows of one number per head
        d = np.ones(()) if d is None else np.asarray(d, dtype=np.float64)
        return np.broadcast_to(d, (N, heads)).tolist()  # (), (heads,) or (N, heads)

    qd, kd, vd = per_sequence(q_descale, H), per_sequence(k_descale, K), per_sequence(v_descale, K)
    out = np.zeros((T, H, E), dtype=np.float64)
    for n in range(len(seq_lens)):
        S_n = int(seq_lens[n])
        first, last = int(cu_seqlens_q[n]), int(cu_seqlens_q[n + 1])
        L_n = last - first
        keys = paged_key_rows(key_cache, block_table, S_n, n)  # S_n rows (K, D)
        values = paged_key_rows(value_cache, block_table, S_n, n)  # S_n rows (K, E)
        for i in range(L_n):
            t, p = first + i, S_n - L_n + i  # the token and its position in the sequence
            for h in range(H):
                kv = h // G
                q_row = [x * qd[n][h] for x in q[t, h].tolist()]
                scores = []  # (j, s_j) of the allowed keys
                for j in range(S_n):
                    if is_causal and j > p:
                        continue
                    if window is not None:
                        left, right = window
                        if (left is not None and j < p - left) or (
                            right is not None and j > p + right
                        ):
                            continue
                    # 1. score; 2. softcap; 3. ALiBi
                    k_row = [x * kd[n][kv] for x in keys[j][kv].tolist()]
                    s = rnd(math.fsum(a * c for a, c in zip(q_row, k_row)))
                    s = rnd(s * scale)
                    if softcap is not None:
                        s = rnd(softcap * rnd(math.tanh(rnd(s / softcap))))
                    if slopes is not None:
                        s = rnd(s - rnd(slopes[h] * abs(p - j)))
                    scores.append((j, s))
                if not scores:
                    continue  # no key: a zero row, sink or not
                # 5. softmax with the head's sink; 6. weights @ value
                m = max(s for _, s in scores)
                if sink is not None:
                    m = max(m, sink[h])
                e = [rnd(math.exp(rnd(s - m))) for _, s in scores]
                extra = 0.0 if sink is None else rnd(math.exp(rnd(sink[h] - m)))
                total = rnd(math.fsum([*e, extra]))
                w = [rnd(x / total) for x in e]
                for c in range(E):
                    terms = (
                        a * float(values[j][kv][c]) * vd[n][kv] for a, (j, _) in zip(w, scores)
                    )
                    out[t, h, c] = rnd(math.fsum(terms))
    return out


def paged_cache_write(
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    slot_mapping: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The caches after writing token t into slot ``slot_mapping[t] = page * page_size +
    offset`` (-1: skipped), one token at a time, on copies."""
    key_cache, value_cache = np.array(key_cache), np.array(value_cache)
    page_size = key_cache.shape[1]
    for t, slot in enumerate(int(s) for s in slot_mapping):
        if slot == -1:
            continue
        key_cache[slot // page_size][slot % page_size] = key[t]
        value_cache[slot // page_size][slot % page_size] = value[t]
    return key_cache, value_cache


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, round_to: str | None = None):
    """``x / sqrt(mean(x^2) + eps) * weight`` of each row ``x[..., :]``, one row at a time
    (``math.fsum``), rounded to ``round_to`` once at the end (the plain module's one rounding)."""
    rnd = rounding(round_to)
    x = np.asarray(x, np.float64)
    out = np.zeros_like(x)
    for index in np.ndindex(*x.shape[:-1]):
        row = x[index].tolist()
        inv = 1.0 / math.sqrt(math.fsum(a * a for a in row) / len(row) + eps)
        out[index] = [rnd(a * inv * float(w)) for a, w in zip(row, weight)]
    return out


def mla_forward(
    weights: dict[str, np.ndarray],
    x: np.ndarray,
    *,
    n_heads: int,
    qk_rope_head_dim: int,
    rope_theta: float = 10000.0,
    rope_interleaved: bool = False,
    rope_inv_freq: np.ndarray | list | None = None,
    rope_attention_factor: float = 1.0,
    rms_norm_eps: float = 1e-6,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple | list | None = None,
    softcap: float | None = None,
    scale: float | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
    round_to: str | None = None,
) -> ModuleGolden:
    """Multi-head latent attention (SEMANTICS.md, Contract v3) from its canonical weights, in
    float64, written from the contract: every head's key and value built from the latent, the
    one rotary key head copied into each, then :func:`attention`.

    Args:
        weights: ``q_proj.kernel (M, H*(Dn+Dr))`` or ``q_a_proj.kernel (M, Q)``,
            ``q_a_layernorm.weight (Q,)``, ``q_b_proj.kernel (Q, H*(Dn+Dr))``;
            ``kv_a_proj_with_mqa.kernel (M, R+Dr)``, ``kv_a_layernorm.weight (R,)``,
            ``kv_b_proj.kernel (R, H*(Dn+E))``, ``o_proj.kernel (H*E, M)``; ``sinks (H,)``.
        x: ``(B, L, M)``, self-attention (S = L), token i at position i.
        n_heads, qk_rope_head_dim: H and Dr (the other sizes are the weights').
        rope_*: :func:`rotary` of q_pe and k_pe with ``rotary_dim = Dr``.
        scale: default ``(Dn + Dr) ** -0.5``; the other keywords as in :func:`attention`.
        round_to: None for the oracle; a dtype for the plain same-dtype module.
    """
    x = np.asarray(x, np.float64)
    n_batch, n_tokens, _ = x.shape
    H, Dr = n_heads, qk_rope_head_dim
    w = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    R = w["kv_a_proj_with_mqa.kernel"].shape[1] - Dr
    E = w["o_proj.kernel"].shape[0] // H
    Dn = w["kv_b_proj.kernel"].shape[1] // H - E

    def project(name: str, inp: np.ndarray) -> np.ndarray:
        return linear(inp, w[f"{name}.kernel"], None, round_to)

    # 1. the query: q_proj, or q_a_proj -> RMSNorm -> q_b_proj; (B, L, H*(Dn+Dr))
    if "q_proj.kernel" in w:
        q_flat = project("q_proj", x)
    else:
        q_lat = rms_norm(project("q_a_proj", x), w["q_a_layernorm.weight"], rms_norm_eps, round_to)
        q_flat = project("q_b_proj", q_lat)
    # 2. the latent and the shared rotary key: [c_kv (R), k_pe (Dr)] per token
    kv = project("kv_a_proj_with_mqa", x)  # (B, L, R+Dr)
    c_kv = rms_norm(kv[..., :R], w["kv_a_layernorm.weight"], rms_norm_eps, round_to)
    kv_heads = project("kv_b_proj", c_kv)  # (B, L, H*(Dn+E))
    # 3. per head: q_nope, q_pe, k_nope, v by index; rotate q_pe and the one k_pe
    q = np.zeros((n_batch, H, n_tokens, Dn + Dr))
    k = np.zeros((n_batch, H, n_tokens, Dn + Dr))
    v = np.zeros((n_batch, H, n_tokens, E))
    q_pe = np.zeros((n_batch, H, n_tokens, Dr))
    for h in range(H):
        q[:, h, :, :Dn] = q_flat[..., h * (Dn + Dr) : h * (Dn + Dr) + Dn]
        q_pe[:, h] = q_flat[..., h * (Dn + Dr) + Dn : (h + 1) * (Dn + Dr)]
        k[:, h, :, :Dn] = kv_heads[..., h * (Dn + E) : h * (Dn + E) + Dn]
        v[:, h] = kv_heads[..., h * (Dn + E) + Dn : (h + 1) * (Dn + E)]
    positions = np.arange(n_tokens)
    inv = None if rope_inv_freq is None else np.asarray(rope_inv_freq, np.float64)
    rope = dict(theta=rope_theta, interleaved=rope_interleaved, inv_freq=inv,
                attention_factor=rope_attention_factor, round_to=round_to)
    q[..., Dn:] = rotary(q_pe, positions, **rope)
    k_pe = rotary(kv[:, None, :, R:], positions, **rope)[:, 0]  # (B, L, Dr), one head
    for h in range(H):
        k[:, h, :, Dn:] = k_pe  # the same rotated key part in every head
    # 4. attention of every head, scale (Dn + Dr) ** -0.5 unless given
    golden = attention(
        q, k, v, mask=mask, bias=bias, is_causal=is_causal,
        causal_alignment=causal_alignment, round_to=round_to,
        window=None if window is None else tuple(window), softcap=softcap,
        scale=(Dn + Dr) ** -0.5 if scale is None else scale, sinks=w.get("sinks"),
        q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
    )
    # 5. heads merged back, output projection
    y = project("o_proj", _merge_heads(golden.output))
    return ModuleGolden(output=y, weights=golden.weights)
