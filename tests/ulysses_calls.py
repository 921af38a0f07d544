"""The Ulysses calls tests/test_ulysses.py checks, shared with its JAX and torch worker.

:func:`encoding_calls`: for H/K = 12/4, 12/12, 8/2, 8/1 at n = 2, 4, 8 (where n fits), values
that encode their batch, position and key/value head, and ``window=(0, 0)`` with L = S so that
every row attends exactly its own position: the output is then the value row itself, and it
tells which key/value head each query head read, at which position. :func:`random_calls`:
random inputs with every keyword the contract has, against the unsharded function.
"""

from __future__ import annotations

import numpy as np

#: (H, K) pairs and the device counts of the head-encoding test (contract v3's list).
HEAD_PAIRS = ((12, 4), (12, 12), (8, 2), (8, 1))
SHARD_COUNTS = (2, 4, 8)
B, L, D = 2, 16, 3


def fits(H: int, K: int, n: int) -> bool:
    """The contract's rule: n divides H, and K % n == 0 or n % K == 0 (L = 16 fits every n)."""
    return H % n == 0 and (K % n == 0 or n % K == 0)


def encoding(b: int, s: int, kv: int) -> float:
    """The value of key/value head ``kv`` at batch ``b``, position ``s``: exact in float64."""
    return 10_000.0 * b + 100.0 * s + kv


def encoding_call(H: int, K: int) -> tuple[tuple[np.ndarray, ...], dict]:
    """query, key, value for H/K; value[b, k, s, :] = encoding(b, s, k); window (0, 0)."""
    rng = np.random.default_rng(H * 100 + K)
    q = rng.standard_normal((B, H, L, D))
    k = rng.standard_normal((B, K, L, D))
    b, kv, s = np.meshgrid(np.arange(B), np.arange(K), np.arange(L), indexing="ij")
    v = np.repeat(encoding(b, s, kv)[..., None], 2, axis=-1)  # (B, K, L, 2)
    return (q, k, v), {"window": (0, 0)}


def expected_encoding(H: int, K: int) -> np.ndarray:
    """Query head h at row i reads kv head h // (H / K) at position i: ``(B, H, L, 2)``."""
    b, h, i = np.meshgrid(np.arange(B), np.arange(H), np.arange(L), indexing="ij")
    return np.repeat(encoding(b, i, h // (H // K))[..., None], 2, axis=-1)


def random_calls() -> dict[str, tuple[tuple[np.ndarray, ...], dict, tuple[int, ...]]]:
    """name -> ((query, key, value), keywords, shard counts): float64, L != S where it matters."""
    rng = np.random.default_rng(30)

    def qkv(H=8, K=2, L=16, S=24, batch=(2,)):
        return (rng.standard_normal((*batch, H, L, 5)), rng.standard_normal((*batch, K, S, 5)),
                rng.standard_normal((*batch, K, S, 3)))

    ids_q = np.repeat([[0, 1, 2, 2]], 2, axis=0).repeat(4, axis=1)  # (2, 16): documents
    ids_k = np.repeat([[0, 1, 1, 2]], 2, axis=0).repeat(6, axis=1)  # (2, 24)
    mask_heads = rng.random((2, 8, 16, 24)) > 0.3
    mask_heads[:, 3, 5] = False  # a fully masked row on head 3
    return {
        "causal_top_left": (qkv(), {"is_causal": True}, (2, 4, 8)),
        "causal_bottom_right": (qkv(), {"is_causal": True, "causal_alignment": "bottom_right"},
                                (2, 4, 8)),
        "window": (qkv(), {"window": (3, 2), "causal_alignment": "bottom_right"}, (2, 4, 8)),
        "sinks_alibi": (qkv(), {"is_causal": True, "sinks": rng.standard_normal(8),
                                "alibi_slopes": rng.random(8)}, (2, 4, 8)),
        "segment_ids": (qkv(), {"q_segment_ids": ids_q, "kv_segment_ids": ids_k}, (2, 4, 8)),
        "mask_with_heads": (qkv(), {"mask": mask_heads}, (2, 4, 8)),
        "mask_without_heads": (qkv(), {"mask": rng.random((2, 1, 16, 24)) > 0.3}, (2, 4)),
        "bias_with_heads_softcap": (qkv(), {"bias": rng.standard_normal((8, 16, 24)),
                                            "softcap": 2.0, "scale": 0.7}, (2, 4)),
        "gqa_12_4_split": (qkv(H=12, K=4), {"is_causal": True, "sinks": rng.standard_normal(12)},
                           (2, 4)),
        "mha_broadcast_batch": (qkv(H=4, K=4, batch=(2, 3)), {"is_causal": True}, (2, 4)),
    }


#: USP configurations (u, r, layout) and the random calls they run on (L = 16, S = 24: u r,
#: or 2 u r for zigzag, divides both): the ring across groups in both layouts, u = 4 with the
#: key/value heads replicated (K = 2), and r = 4.
USP_CONFIGS = ((2, 2, "zigzag"), (2, 2, "contiguous"), (4, 2, "contiguous"), (2, 4, "contiguous"))
USP_CALLS = ("causal_top_left", "causal_bottom_right", "window", "sinks_alibi", "segment_ids",
             "mask_with_heads", "bias_with_heads_softcap", "gqa_12_4_split")


def usp_fits(H: int, K: int, u: int) -> bool:
    """USP's head rule is Ulysses' for u (the random calls' lengths fit every config)."""
    return fits(H, K, u)
