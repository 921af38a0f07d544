"""The FLOP counts of the benchmark's workloads (``bench/workloads.py``).

FLOPs count the two matmuls honestly, ``2*B*H*L*S*D`` for ``query @ key^T`` plus
``2*B*H*L*S*E`` for ``weights @ value`` (softmax, scale and masking are not counted, as in the
FlashAttention papers); with ``is_causal`` the *useful* count keeps only the allowed
(query, key) pairs, the *dense* count is what a kernel that does not skip masked blocks executes.
A module's, a decode step's and MLA's counts add their projections.

Shape letters (SEMANTICS.md): B batch, H query heads, K key/value heads, L query length,
S key/value length, D query/key head dim, E value head dim, M model width, P cached tokens;
MLA's R (kv_lora_rank), Dr (the shared rotary key head), Dn (the per-head non-rotary part).
"""

from __future__ import annotations

__all__ = [
    "allowed_pairs",
    "attention_flops",
    "decode_flops",
    "mla_decode_flops",
    "mla_prefill_flops",
    "module_flops",
    "train_flops",
]


def allowed_pairs(L: int, S: int, *, is_causal: bool, alignment: str = "top_left") -> int:
    """Number of (query i, key j) pairs the causal rule allows, out of ``L * S``.

    ``top_left``: ``j <= i``; ``bottom_right``: ``j <= i + (S - L)`` (SEMANTICS.md step 4).
    """
    if not is_causal:
        return L * S
    return _pairs_up_to_diagonal(L, S, 0 if alignment == "top_left" else S - L)


def _pairs_up_to_diagonal(L: int, S: int, offset: int) -> int:
    """Pairs with ``j <= i + offset`` (0 <= i < L, 0 <= j < S), in closed form: row i keeps
    ``clamp(i + offset + 1, 0, S)`` keys."""

    def ramp(n: int) -> int:  # sum_{i=0}^{n-1} (i + offset + 1) for rows that are neither 0 nor S
        return n * (offset + 1) + n * (n - 1) // 2

    # rows with i + offset + 1 <= 0 keep nothing; rows with i + offset + 1 >= S keep all S.
    first = min(max(-offset, 0), L)  # first row that keeps at least one key
    full = min(max(S - offset - 1, first), L)  # first row that keeps every key
    return (ramp(full) - ramp(first)) + (L - full) * S


def attention_flops(
    B: int,
    H: int,
    L: int,
    S: int,
    D: int,
    E: int,
    *,
    is_causal: bool = False,
    alignment: str = "top_left",
    window: int | None = None,
) -> tuple[int, int]:
    """``(dense, useful)`` matmul FLOPs of one attention call.

    dense = ``2*B*H*L*S*D + 2*B*H*L*S*E`` (every score computed); useful counts only the
    allowed pairs, ``2*B*H*pairs*(D + E)``; the two are equal without ``is_causal`` or a
    window. ``window=W`` is ``window=(W, 0)``: the pairs of causal minus those more than W keys
    before the diagonal.
    """
    pairs = allowed_pairs(L, S, is_causal=is_causal or window is not None, alignment=alignment)
    if window is not None:  # less the keys more than W before the diagonal
        offset = 0 if alignment == "top_left" else S - L
        pairs -= _pairs_up_to_diagonal(L, S, offset - window - 1)
    return 2 * B * H * L * S * (D + E), 2 * B * H * pairs * (D + E)


def train_flops(
    B: int, H: int, L: int, S: int, D: int, E: int, *, is_causal: bool = False
) -> tuple[int, int]:
    """``(dense, useful)`` matmul FLOPs of one training step: the forward's two matmuls and the
    backward's four, ``dV = P^T dO`` and ``dP = dO V^T`` (``2*L*S*E`` each), ``dQ = dS K`` and
    ``dK = dS^T Q`` (``2*L*S*D`` each): three times :func:`attention_flops`. A tiled backward
    that rebuilds ``P`` from the scores does one more ``query @ key^T`` per block; that
    recomputation is work the algorithm chooses, not work the step needs, so it is not counted.
    """
    dense, useful = attention_flops(B, H, L, S, D, E, is_causal=is_causal)
    return 3 * dense, 3 * useful


def module_flops(
    B: int, H: int, K: int, L: int, S: int, D: int, E: int, M: int, *, is_causal: bool = False
) -> tuple[int, int]:
    """``(dense, useful)`` FLOPs of one attention module call (projections + attention).

    q: ``2*B*L*M*(H*D)``, k: ``2*B*S*M*(K*D)``, v: ``2*B*S*M*(K*E)``, out: ``2*B*L*(H*E)*M``;
    bias additions are not counted. Causal masking only changes the attention part.
    """
    proj = 2 * B * (L * M * H * D + S * M * K * D + S * M * K * E + L * H * E * M)
    dense, useful = attention_flops(B, H, L, S, D, E, is_causal=is_causal)
    return proj + dense, proj + useful


def decode_flops(
    B: int, H: int, K: int, P: int, D: int, E: int, M: int, *, window: int | None = None
) -> int:
    """FLOPs of one KV-cache decode step: one new token after ``P`` cached ones.

    The projections of the one token, q: ``2*B*M*(H*D)``, k: ``2*B*M*(K*D)``, v: ``2*B*M*(K*E)``,
    out: ``2*B*(H*E)*M``, plus its attention over ``S = P + 1`` keys (the cache and itself),
    ``2*B*H*S*(D + E)``; with ``window=W`` (a rolling cache) over ``min(P, W) + 1`` keys.
    Nothing is masked (bottom-right causal with L = 1), so dense = useful.
    """
    proj = 2 * B * (M * H * D + M * K * D + M * K * E + H * E * M)
    keys = P + 1 if window is None else min(P, window) + 1
    return proj + 2 * B * H * keys * (D + E)


def mla_decode_flops(
    B: int, H: int, P: int, R: int, Dr: int, Dn: int, E: int, M: int, *, absorbed: bool
) -> int:
    """FLOPs of one MLA decode step (one new token after ``P`` cached ones, ``S = P + 1`` keys).

    Both paths: q_proj ``2*B*M*H*(Dn+Dr)``, kv_a_proj_with_mqa ``2*B*M*(R+Dr)``, o_proj
    ``2*B*H*E*M``. Naive: kv_b_proj of the new token ``2*B*R*H*(Dn+E)`` and the attention of
    every head over S expanded keys, ``2*B*H*S*((Dn + Dr) + E)``. Absorbed: the two absorptions
    ``2*B*H*Dn*R + 2*B*H*R*E`` and one MQA over the latent keys, ``2*B*H*S*((R + Dr) + R)``.
    """
    proj = 2 * B * (M * H * (Dn + Dr) + M * (R + Dr) + H * E * M)
    S = P + 1
    if absorbed:
        return proj + 2 * B * H * R * (Dn + E) + 2 * B * H * S * (2 * R + Dr)
    return proj + 2 * B * R * H * (Dn + E) + 2 * B * H * S * (Dn + Dr + E)


def mla_prefill_flops(
    B: int, H: int, L: int, R: int, Dr: int, Dn: int, E: int, M: int, *, is_causal: bool = True
) -> tuple[int, int]:
    """``(dense, useful)`` FLOPs of one MLA forward on ``L`` tokens (self-attention): q_proj
    ``2*B*L*M*H*(Dn+Dr)``, kv_a_proj_with_mqa ``2*B*L*M*(R+Dr)``, kv_b_proj ``2*B*L*R*H*(Dn+E)``,
    o_proj ``2*B*L*H*E*M``, and the attention of H heads of ``Dn + Dr`` and E
    (:func:`attention_flops`)."""
    proj = 2 * B * L * (M * H * (Dn + Dr) + M * (R + Dr) + R * H * (Dn + E) + H * E * M)
    dense, useful = attention_flops(B, H, L, L, Dn + Dr, E, is_causal=is_causal)
    return proj + dense, proj + useful
