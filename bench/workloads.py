"""What the benchmark runs: workloads and the grids of them.

A :class:`Workload` is one attention problem (sizes, causal or not, dtype); a grid is the list
of workloads for a device class (``cpu``, ``cuda``, ``tpu``) and a size (``quick``, ``full``).
Each workload's FLOPs are counted by ``bench/flops.py``'s formulas.

Shape letters (SEMANTICS.md): B batch, H query heads, K key/value heads, L query length,
S key/value length, D query/key head dim, E value head dim, M model width (= H * D here).

A run takes every grid of its device (:func:`grids`): its own grid's workloads are crossed
with the rows, and the others say which grid runs a goal that its own does not.

A *train* workload is one training step of attention on the shapes of an attention workload:
the forward and the backward, ``(dQ, dK, dV)`` from query, key, value and a random
``grad_output`` (the project's ``*_vjp`` functions, the frameworks' autograd of their kernels).
Its useful FLOPs are three times the forward's (:func:`train_flops`), and its peak memory is
counted beyond the inputs, the output and the gradients (:meth:`Workload.result_bytes`).

A *decode* workload is one step of KV-cache decoding: one new token (L = 1) attends over the P
cached tokens and itself (S = P + 1, bottom-right causal, which with L = 1 masks nothing). Its
FLOPs are the four projections of that one token plus the attention over S keys
(:func:`decode_flops`); its KV cache holds K heads, so a GQA cache is K/H of MHA's. A decode
workload with a ``window`` W steps a module with ``window=(W, 0)`` through a *rolling* cache
(``init_cache(..., rolling=True)``): a ring of ``W + 1`` slots at position P, whose step
attends the last W cached tokens and itself whatever P is (:attr:`Workload.slots`).

An *MLA decode* workload (``op="mla_decode"``) is one decode step of the project's
``MultiHeadLatentAttention`` after P cached tokens, with the latent dims ``R`` (kv_lora_rank)
and ``Dr`` (the one shared rotary key head) besides ``D`` = Dn and ``E``; M = H * Dn. Two rows
step it: the absorbed decode through the latent cache (R + Dr numbers per token) and the naive
one through every head's keys and values (H (Dn + Dr + E) per token). Its FLOPs are the naive
step's (:func:`mla_decode_flops`: the absorbed step does (2R + Dr) / (Dn + Dr + E) times the
attention arithmetic per key, 3.4x at R = 512, Dr = 64, Dn = E = 128, and the same count is
kept for both rows, so the TFLOP/s of the absorbed row is the naive-equivalent rate), and its
cache bytes per token are set against an MHA and a GQA cache of the same H and D
(:meth:`Workload.cache_bytes_per_token`).

An *MLA prefill* workload (``op="mla_prefill"``) is one causal self-attention forward of
``MultiHeadLatentAttention`` on ``x (B, L, M)`` (the same sizes, M = H * Dn), against the
same-size GQA module: ``GroupedQueryAttention(M, H, K = H / MLA_GQA_GROUP, head_dim = Dn + Dr,
value_head_dim = E, rope_theta=10000.0, rotary_dim = Dr)``, whose scores have MLA's width and
whose RoPE turns the same Dr features. Its FLOPs are MLA's (:func:`mla_prefill_flops`), kept for
both rows as for the decode step.

A *paged decode* workload (``op="paged_decode"``, issue 27) is the attention of one decode step
of B = 8 sequences of different lengths (:func:`paged_lengths`) against a paged key/value cache
of pages of :data:`PAGE_SIZE` tokens: one query token per sequence, ``P`` cached keys in total
(``S = P + 1`` keeps ``P = S - L``), no projections. Its FLOPs are ``2 * H * P * (D + E)``; its
:meth:`Workload.cache_bytes` are the bytes the tiled paged read takes from the pool (whole pages:
``pages * PAGE_SIZE * K * (D + E) * itemsize``), and :meth:`Workload.padded_cache_bytes` those
of the same sequences padded to the longest in a contiguous ``(B, K, S_max, D)`` cache.

A *varlen* workload (``op="varlen"``, issue 27) is one causal prefill of B = 8 packed sequences
of lengths 64..2048 (:func:`varlen_lengths`), L = S = their total; its FLOPs are the sum of the
sequences' own causal attention (``dense``: every pair within a sequence).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bench.flops import (
    attention_flops,
    decode_flops,
    mla_decode_flops,
    mla_prefill_flops,
    module_flops,
    train_flops,
)

__all__ = [
    "DECODE_GOAL_WORKLOADS",
    "DTYPE_BYTES",
    "GOAL_WORKLOAD",
    "GRIDS",
    "MLA_GOAL_WORKLOAD",
    "MLA_GQA_GROUP",
    "PAGED_FIXED_BLOCK_K",
    "PAGED_GOAL_WORKLOAD",
    "PAGE_SIZE",
    "ROLLING_GOAL_WORKLOAD",
    "SHARDS",
    "TRAIN_GOAL_WORKLOAD",
    "TRAIN_MEMORY_WORKLOAD",
    "VARLEN_GOAL_WORKLOAD",
    "WINDOW_GOAL_WORKLOAD",
    "Workload",
    "grid",
    "grids",
    "paged_lengths",
    "varlen_lengths",
]

#: Bytes per element of the benchmarked dtypes.
DTYPE_BYTES: dict[str, int] = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
#: The devices of a ``sharded`` workload (bench/sharded.py): 4 simulated JAX CPU devices, 4 torch
#: gloo processes.
SHARDS = 4
_SHORT = {"float64": "f64", "float32": "f32", "bfloat16": "bf16", "float16": "f16"}


#: The page size of the paged decode workloads (issue 27: vLLM's default block size).
PAGE_SIZE = 16
#: The fixed block of the ``paged_decode_fixed`` rows: 8 pages, shorter than the longest
#: sequence at every P of the grids, so that every P holds the same block (issue 27's memory).
PAGED_FIXED_BLOCK_K = 8 * PAGE_SIZE
#: The varlen prefill's sequence lengths at 8192 tokens (issue 27: 64..2048, total 8192).
_VARLEN_PROFILE = (64, 128, 256, 576, 1024, 2048, 2048, 2048)


def paged_lengths(P: int, B: int = 8) -> tuple[int, ...]:
    """The B different sequence lengths of a paged decode workload with ``P`` keys in total:
    ``P * n // 36`` for n = 1..8 (B = 8), the last taking what rounding left, so they sum to P."""
    lengths = [P * n // (B * (B + 1) // 2) for n in range(1, B + 1)]
    lengths[-1] += P - sum(lengths)
    return tuple(lengths)


def varlen_lengths(T: int) -> tuple[int, ...]:
    """The 8 sequence lengths of a varlen prefill of ``T`` tokens: 64, 128, 256, 576, 1024,
    2048, 2048, 2048 scaled by ``T / 8192`` (T a multiple of 128), summing to T."""
    if T % 128:
        raise ValueError(f"a varlen workload's total must be a multiple of 128, got {T}")
    return tuple(n * T // 8192 for n in _VARLEN_PROFILE)


#: The GQA cache an MLA decode workload's cache is set against: H / 4 key/value heads (16:4).
MLA_GQA_GROUP = 4


@dataclass(frozen=True)
class Workload:
    """One benchmarked problem.

    ``op`` is ``"attention"`` (functional rows: query ``(B, H, L, D)``, key ``(B, K, S, D)``,
    value ``(B, K, S, E)``), ``"train"`` (the same inputs and a ``grad_output (B, H, L, E)``;
    a forward and a backward, the gradients of query, key and value), ``"module"`` (module
    rows: input ``(B, L, M)``, self-attention, so S = L and M = H * D) or ``"decode"`` (one
    KV-cache decode step: input ``(B, 1, M)``, a cache holding ``P = S - 1`` tokens, L = 1),
    ``"mla_decode"`` (the same step of ``MultiHeadLatentAttention``: K = H, D = Dn, and ``R``,
    ``Dr`` set, None for every other op) or ``"sharded"`` (the attention inputs on
    :data:`SHARDS` devices: bench/sharded.py).
    """

    op: str
    B: int
    H: int
    K: int
    L: int
    S: int
    D: int
    E: int
    is_causal: bool = False
    dtype: str = "float32"
    window: int | None = None  # window=(window, 0), the W keys before and itself (decode: rolling)
    R: int | None = None  # mla_decode: kv_lora_rank, the latent's width
    Dr: int | None = None  # mla_decode: qk_rope_head_dim, the one shared rotary key head

    @property
    def M(self) -> int:
        """Model width of module workloads (H * D)."""
        return self.H * self.D

    @property
    def P(self) -> int:
        """Decode workloads: the tokens already in the KV cache (``S - L``)."""
        return self.S - self.L

    @property
    def slots(self) -> int:
        """Decode workloads: T, the cache buffers' length: ``S = P + 1`` tokens, or a rolling
        cache's ``min(window + 1, S)`` ring slots."""
        return self.S if self.window is None else min(self.window + 1, self.S)

    @property
    def seq(self) -> int:
        """The length a plot puts on its x axis: L (= S) for attention and modules, the cached
        context P for decode steps."""
        return self.P if self.op in ("decode", "mla_decode", "paged_decode") else self.L

    @property
    def lengths(self) -> tuple[int, ...]:
        """Paged decode and varlen workloads: the B sequences' lengths (keys of each sequence,
        :func:`paged_lengths`; tokens of each, :func:`varlen_lengths`); empty for the others."""
        if self.op == "paged_decode":
            return paged_lengths(self.P, self.B)
        if self.op == "varlen":
            return varlen_lengths(self.L)
        return ()

    @property
    def variant(self) -> str:
        """``MHA`` (K = H), ``MQA`` (K = 1) or ``GQA H:K``; ``MLA`` for an MLA decode step."""
        if self.op in ("mla_decode", "mla_prefill"):
            return "MLA"
        if self.K == self.H:
            return "MHA"
        if self.K == 1:
            return "MQA"
        return f"GQA {self.H}:{self.K}"

    @property
    def id(self) -> str:
        """Stable key, e.g. ``attention.mha.b1.h8.k8.l2048.s2048.d64.e64.f32.causal``, or
        ``decode.gqa.b1.h8.k2.p4096.d64.e64.f32`` for a decode step."""
        mode = ("causal" if self.is_causal else "full") + (
            "" if self.window is None else f".w{self.window}"
        )
        heads = f"{self.variant.split()[0].lower()}.b{self.B}.h{self.H}.k{self.K}"
        if self.op == "mla_prefill":  # mla_prefill.b1.h16.k4.l512.r512.dr64.dn128.e128.f32
            dims = f"k{self.K}.l{self.L}.r{self.R}.dr{self.Dr}.dn{self.D}.e{self.E}"
            return f"mla_prefill.b{self.B}.h{self.H}.{dims}.{_SHORT[self.dtype]}.{mode}"
        if self.op == "mla_decode":  # mla_decode.b1.h16.p8192.r512.dr64.dn128.e128.f32
            dims = f"p{self.P}.r{self.R}.dr{self.Dr}.dn{self.D}.e{self.E}"
            return f"mla_decode.b{self.B}.h{self.H}.{dims}.{_SHORT[self.dtype]}"
        if self.op == "paged_decode":  # paged_decode.gqa.b8.h8.k2.p4096.page16.d64.e64.f32
            return f"paged_decode.{heads}.p{self.P}.page{PAGE_SIZE}.d{self.D}.e{self.E}" + (
                f".{_SHORT[self.dtype]}"
            )
        if self.op == "decode":
            ring = "" if self.window is None else f".rolling{self.window}"
            return f"decode.{heads}.p{self.P}.d{self.D}.e{self.E}.{_SHORT[self.dtype]}{ring}"
        return (
            f"{self.op}.{self.variant.split()[0].lower()}.b{self.B}.h{self.H}.k{self.K}"
            f".l{self.L}.s{self.S}.d{self.D}.e{self.E}.{_SHORT[self.dtype]}.{mode}"
        )

    @property
    def label(self) -> str:
        """Short human label, e.g. ``MHA B1 H8 L=S=2048 D64 f32 causal`` or
        ``decode GQA 8:2 B1 H8 P=4096 D64 f32``."""
        if self.op == "mla_decode":
            dims = f"B{self.B} H{self.H} P={self.P} R{self.R} Dr{self.Dr} Dn{self.D} E{self.E}"
            return f"decode MLA {dims} {_SHORT[self.dtype]}"
        if self.op == "mla_prefill":
            dims = f"B{self.B} H{self.H} L=S={self.L} R{self.R} Dr{self.Dr} Dn{self.D} E{self.E}"
            return f"prefill MLA {dims} {_SHORT[self.dtype]}{' causal' * self.is_causal}"
        if self.op == "paged_decode":
            dims = f"B{self.B} H{self.H} P={self.P} page {PAGE_SIZE} D{self.D}"
            return f"paged decode {self.variant} {dims} {_SHORT[self.dtype]}"
        if self.op == "decode":
            dims = f"B{self.B} H{self.H} P={self.P} D{self.D}"
            ring = "" if self.window is None else f" rolling ({self.window}, 0)"
            return f"decode {self.variant} {dims} {_SHORT[self.dtype]}{ring}"
        lengths = f"L=S={self.L}" if self.L == self.S else f"L={self.L} S={self.S}"
        kind = {"module": "module ", "train": "train ", "sharded": f"sharded n={SHARDS} ",
                "varlen": f"varlen N={self.B} "}.get(self.op, "")
        mode = (" causal" if self.is_causal else "") + (
            "" if self.window is None else f" window ({self.window}, 0)"
        )
        return (
            f"{kind}{self.variant} B{self.B} H{self.H} {lengths} D{self.D} "
            f"{_SHORT[self.dtype]}{mode}"
        )

    @property
    def series(self) -> str:
        """The plot panel a workload belongs to: everything but the sequence length."""
        mode = (" causal" if self.is_causal else "") + (
            ""
            if self.window is None
            else f" {'rolling' if self.op == 'decode' else 'window'} {self.window}"
        )
        kind = {"module": "module ", "decode": "decode ", "train": "train ",
                "sharded": f"sharded n={SHARDS} "}.get(self.op, "")
        if self.op in ("mla_decode", "mla_prefill"):
            dims = f"B{self.B} H{self.H} R{self.R} Dr{self.Dr} Dn{self.D} E{self.E}"
            step = "decode" if self.op == "mla_decode" else "prefill"
            return f"{step} MLA {dims} {_SHORT[self.dtype]}"
        return f"{kind}{self.variant} B{self.B} H{self.H} D{self.D} {_SHORT[self.dtype]}{mode}"

    def flops(self) -> tuple[int, int]:
        """``(dense, useful)`` FLOPs (see :func:`attention_flops`, :func:`module_flops`,
        :func:`decode_flops`; an MLA decode step: the naive step's, :func:`mla_decode_flops`)."""
        if self.op == "mla_prefill":
            return mla_prefill_flops(self.B, self.H, self.L, self.R, self.Dr, self.D, self.E,
                                     self.M, is_causal=self.is_causal)
        if self.op == "mla_decode":
            n = mla_decode_flops(
                self.B, self.H, self.P, self.R, self.Dr, self.D, self.E, self.M, absorbed=False
            )
            return n, n
        if self.op == "paged_decode":  # H query heads over every cached key, one token each
            n = 2 * self.H * self.P * (self.D + self.E)
            return n, n
        if self.op == "varlen":  # each sequence's own causal attention
            per = [attention_flops(1, self.H, n, n, self.D, self.E, is_causal=self.is_causal)
                   for n in self.lengths]
            return sum(d for d, _ in per), sum(u for _, u in per)
        if self.op == "decode":
            n = decode_flops(
                self.B, self.H, self.K, self.P, self.D, self.E, self.M, window=self.window
            )
            return n, n
        if self.op == "train":
            return train_flops(
                self.B, self.H, self.L, self.S, self.D, self.E, is_causal=self.is_causal
            )
        if self.op == "module":
            return module_flops(
                self.B, self.H, self.K, self.L, self.S, self.D, self.E, self.M,
                is_causal=self.is_causal,
            )
        return attention_flops(
            self.B, self.H, self.L, self.S, self.D, self.E, is_causal=self.is_causal,
            window=self.window,
        )

    def score_bytes(self) -> int:
        """Bytes of one float32 ``(B, H, L, S)`` score tensor: the quadratic wall (a varlen
        workload: the packed call's ``(H, T, T)``)."""
        if self.op == "varlen":
            return self.H * self.L * self.S * 4
        return self.B * self.H * self.L * self.S * 4

    def cache_bytes(self) -> int:
        """Decode workloads: bytes of the KV cache, ``B * K * T * (D + E) * itemsize`` (it holds
        exactly the S = P + 1 tokens of the step; a rolling cache its T = W + 1 ring slots,
        :attr:`slots`); an MLA decode step: its naive cache, the larger of its two (the latent
        one is :meth:`cache_bytes_per_token` ``["MLA latent"]`` per token); 0 for the other ops."""
        if self.op == "mla_decode":
            return self.B * self.S * self.cache_bytes_per_token()["MLA naive"]
        if self.op == "paged_decode":  # the whole pages the tiled paged read takes
            pages = sum(-(-n // PAGE_SIZE) for n in self.lengths)
            return pages * PAGE_SIZE * self.K * (self.D + self.E) * DTYPE_BYTES[self.dtype]
        if self.op != "decode":
            return 0
        return self.B * self.K * self.slots * (self.D + self.E) * DTYPE_BYTES[self.dtype]

    def fp8_cache_bytes(self) -> int:
        """Paged decode workloads: the bytes the same tiled paged read takes from a
        ``float8_e4m3fn`` pool, one byte per number (the fp8 row; its descales, ``2 K`` float32,
        are not counted); 0 for the other ops."""
        if self.op != "paged_decode":
            return 0
        return self.cache_bytes() // DTYPE_BYTES[self.dtype]

    def padded_cache_bytes(self) -> int:
        """Paged decode workloads: the bytes of the contiguous cache the paged read is set
        against, the B sequences padded to the longest, ``B * K * S_max * (D + E) * itemsize``
        (what a masked contiguous step reads); 0 for the other ops."""
        if self.op != "paged_decode":
            return 0
        S_max = max(self.lengths)
        return self.B * self.K * S_max * (self.D + self.E) * DTYPE_BYTES[self.dtype]

    def cache_bytes_per_token(self) -> dict[str, int]:
        """MLA decode workloads: the bytes one cached token takes, ``itemsize`` times ``R + Dr``
        (``MLA latent``: c_kv and the rotated k_pe), ``H * (Dn + Dr + E)`` (``MLA naive``: every
        head's key and value), ``2 * H * D`` (``MHA`` of the same H and D = Dn = E) and
        ``2 * K * D`` (``GQA``, K = H / :data:`MLA_GQA_GROUP`); empty for the other ops."""
        if self.op != "mla_decode":
            return {}
        n, H, D = DTYPE_BYTES[self.dtype], self.H, self.D
        return {
            "MLA latent": (self.R + self.Dr) * n,
            "MLA naive": H * (D + self.Dr + self.E) * n,
            "MHA": 2 * H * D * n,
            "GQA": 2 * (H // MLA_GQA_GROUP) * D * n,
        }

    def result_bytes(self) -> int:
        """Train workloads: bytes of the output ``(B, H, L, E)`` and the gradients dQ
        ``(B, H, L, D)``, dK ``(B, K, S, D)``, dV ``(B, K, S, E)``, which a training step's
        peak-memory probe subtracts (its memory is counted beyond inputs, output and
        gradients); 0 for the other ops."""
        if self.op != "train":
            return 0
        B, H, K, L, S, D, E = self.B, self.H, self.K, self.L, self.S, self.D, self.E
        return (B * H * L * (E + D) + B * K * S * (D + E)) * DTYPE_BYTES[self.dtype]

    def input_bytes(self) -> int:
        """Bytes of query, key, value and output (input and output for modules; input, output
        and the KV cache for decode steps; for a training step also ``grad_output`` and the
        gradients)."""
        n = DTYPE_BYTES[self.dtype]
        if self.op in ("decode", "mla_decode"):
            return 2 * self.B * self.M * n + self.cache_bytes()
        if self.op == "paged_decode":  # one query and one output token per sequence
            return self.B * self.H * (self.D + self.E) * n + self.padded_cache_bytes()
        if self.op in ("module", "mla_prefill"):
            return 2 * self.B * self.L * self.M * n
        q = self.B * self.H * self.L * self.D
        kv = self.B * self.K * self.S * (self.D + self.E)
        grad_output = self.B * self.H * self.L * self.E if self.op == "train" else 0
        return (q + kv + self.B * self.H * self.L * self.E + grad_output) * n + self.result_bytes()

    def peak_bytes(self, materializes: bool) -> int:
        """Rough peak bytes of one call on this workload (what a plan holds against the memory
        a framework may use): :meth:`input_bytes`, plus three float32 score-sized temporaries
        for a call that ``materializes`` the ``(B, H, L, S)`` scores (seven for a training step:
        what autograd saves and the backward's dW, dS and products; torch's plain step measured
        7.2 at L = S = 1024, JAX's plan 6), plus projections for modules and decode steps."""
        n = self.input_bytes()
        if materializes:
            n += (7 if self.op == "train" else 3) * self.score_bytes()
        if self.op in ("module", "decode", "mla_decode", "mla_prefill"):
            n += 4 * self.B * self.L * self.M * 4
        return n

    def to_dict(self) -> dict:
        """Fields plus id, label, variant, FLOPs and (decode) the cache, for the JSON report."""
        dense, useful = self.flops()
        return {
            **asdict(self),
            "id": self.id,
            "label": self.label,
            "variant": self.variant,
            "series": self.series,
            "seq": self.seq,
            "cache_bytes": self.cache_bytes(),
            "padded_cache_bytes": self.padded_cache_bytes(),
            "fp8_cache_bytes": self.fp8_cache_bytes(),
            "lengths": list(self.lengths),
            "cache_bytes_per_token": self.cache_bytes_per_token(),
            "flops_dense": dense,
            "flops_useful": useful,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Workload:
        """Inverse of :meth:`to_dict` (extra keys ignored)."""
        fields = ("op", "B", "H", "K", "L", "S", "D", "E", "is_causal", "dtype")
        return cls(
            **{f: d[f] for f in fields}, window=d.get("window"), R=d.get("R"), Dr=d.get("Dr")
        )


def _attn(B, H, K, L, D, *, causal=False, dtype="float32") -> Workload:
    return Workload("attention", B, H, K, L, L, D, D, causal, dtype)


def _train(B, H, K, L, D, *, causal=False, dtype="float32") -> Workload:
    return Workload("train", B, H, K, L, L, D, D, causal, dtype)


def _module(B, H, K, L, D, *, causal=False, dtype="float32") -> Workload:
    return Workload("module", B, H, K, L, L, D, D, causal, dtype)


def _sharded(B, H, K, L, D, *, causal=False, dtype="float32") -> Workload:
    """Attention on :data:`SHARDS` devices (the ring, Ulysses and USP rows, bench/sharded.py)."""
    return Workload("sharded", B, H, K, L, L, D, D, causal, dtype)


def _decode(B, H, K, P, D, *, dtype="float32", rolling: int | None = None) -> Workload:
    """One decode step after ``P`` cached tokens: L = 1, S = P + 1 (``rolling=W``: through a
    rolling cache of a module with ``window=(W, 0)``)."""
    return Workload("decode", B, H, K, 1, P + 1, D, D, False, dtype, window=rolling)


def _mla_decode(P: int, *, B: int = 1, H: int = 16, R: int = 512, Dr: int = 64, D: int = 128
                ) -> Workload:
    """One MLA decode step after ``P`` cached tokens (issue 29's sizes: H = 16, R = 512,
    Dr = 64, Dn = E = 128; M = H * Dn = 2048), float32."""
    return Workload("mla_decode", B, H, H, 1, P + 1, D, D, R=R, Dr=Dr)


def _mla_prefill(L: int, *, B: int = 1, H: int = 16, R: int = 512, Dr: int = 64, D: int = 128
                 ) -> Workload:
    """One causal MLA forward on L tokens (the decode rows' sizes), K = H / MLA_GQA_GROUP for
    the same-size GQA module it is set against, float32."""
    return Workload("mla_prefill", B, H, H // MLA_GQA_GROUP, L, L, D, D, True, R=R, Dr=Dr)


def _paged_decode(P: int, *, dtype: str = "float32") -> Workload:
    """One paged decode step of 8 sequences holding ``P`` keys in all (issue 27's sizes: GQA
    8:2, D = E = 64, pages of :data:`PAGE_SIZE`)."""
    return Workload("paged_decode", 8, 8, 2, 1, P + 1, 64, 64, False, dtype)


def _varlen(T: int, *, dtype: str = "float32") -> Workload:
    """One causal varlen prefill of 8 sequences, ``T`` tokens in all (H = K = 8, D = 64)."""
    return Workload("varlen", 8, 8, 8, T, T, 64, 64, True, dtype)


#: The workload the performance goals of issue 5 are stated for (CPU, float32, B=1, H=8, D=64,
#: N=2048); the causal goal compares its causal twin with it.
GOAL_WORKLOAD = _attn(1, 8, 8, 2048, 64)
#: The sliding-window goal's workload (issue 11): L = S = 8192, causal with window=(256, 0); it
#: is compared with the same row's causal run without the window.
WINDOW_GOAL_WORKLOAD = Workload("attention", 1, 8, 8, 8192, 8192, 64, 64, True, window=256)
#: The decode goals' workloads (issue 11): one step at P = 4096, MHA and GQA 8:2, against the
#: framework's fused decode step on the same workload.
DECODE_GOAL_WORKLOADS = (_decode(1, 8, 8, 4096, 64), _decode(1, 8, 2, 4096, 64))
#: The rolling-cache goal's workload (issue 11): a step through a rolling cache of a (256, 0)
#: window at P = 4096, compared with the same row's step at P = 1024 (O(W): the same time).
ROLLING_GOAL_WORKLOAD = _decode(1, 8, 8, 4096, 64, rolling=256)
#: The MLA goal's workload (issue 29): the absorbed decode step at P = 8192, at most 1.0x the
#: naive step on the same workload, timed interleaved.
MLA_GOAL_WORKLOAD = _mla_decode(8192)
#: The paged decode goal's workload (issue 27): 8 sequences, P = 4096 keys in pages of 16,
#: GQA 8:2, D = 64, within 1.15x the same framework's contiguous step, interleaved.
PAGED_GOAL_WORKLOAD = _paged_decode(4096)
#: The varlen goal's workload (issue 27): 8 sequences of 64..2048 tokens (8192 in all), causal,
#: at most 0.6x the same batch padded to 2048 and masked, interleaved.
VARLEN_GOAL_WORKLOAD = _varlen(8192)
#: The training-step goals of issue 10: the time goals on the goal workload's shapes as one
#: forward + backward; the memory goal (peak extra memory of the tiled step) at L = S = 8192.
TRAIN_GOAL_WORKLOAD = _train(1, 8, 8, 2048, 64)
TRAIN_MEMORY_WORKLOAD = _train(1, 8, 8, 8192, 64)


def _cpu_quick() -> list[Workload]:
    # MHA sweep: 4096 (a seventh of the grid's time on 2 cores) and the L = S = 8192 goals
    # (window, training memory: Goal.grid_workloads) are the full grid's
    w = [_attn(1, 8, 8, n, 64) for n in (256, 512, 1024, 2048)]
    w += [_attn(1, 8, 8, n, 64, causal=True) for n in (1024, 2048)]  # causal, incl. the goal
    w += [_attn(1, 32, 8, 1024, 64), _attn(1, 8, 1, 1024, 64)]  # GQA 32:8, MQA
    w += [_module(1, 8, 8, n, 64) for n in (256, 1024, 2048)]  # module rows (M = 512)
    w += [_module(1, 8, 2, 1024, 64)]  # GQA module
    w += [_train(1, 8, 8, n, 64) for n in (512, 2048)]  # training steps, incl. the goal
    w += [_train(1, 8, 8, 1024, 64, causal=True)]  # a causal step: the skipped blocks
    w += [_mla_decode(1024)]  # MLA absorbed vs naive (P = 8192 and its goal: the full grid's)
    w += [_mla_prefill(512)]  # MLA prefill vs the same-size GQA module (2048: the full grid)
    w += [_sharded(1, 8, 8, 1024, 64)]  # ring, Ulysses, USP on 4 devices (4096: the full grid)
    # paged decode vs contiguous (P = 1024; the goal's 4096 and 8192: the full grid); its bf16
    # twin for the fp8 cache row
    w += [_paged_decode(1024), _paged_decode(1024, dtype="bfloat16")]
    w += [_varlen(2048)]  # varlen prefill vs padded (8192, the goal's: the full grid)
    w += [_decode(1, 8, k, p, 64) for k in (8, 2) for p in (1024, 4096)]  # decode, MHA and GQA
    w += [_decode(1, 8, 8, p, 64, rolling=256) for p in (1024, 4096)]  # rolling cache: O(W)
    return w


def _cpu_full() -> list[Workload]:
    lengths = (256, 512, 1024, 2048, 4096, 8192)
    w = []
    for causal in (False, True):
        w += [_attn(1, 8, 8, n, 64, causal=causal) for n in lengths]
        w += [_attn(1, 32, 8, n, 64, causal=causal) for n in lengths[:-1]]
        w += [_attn(1, 8, 1, n, 64, causal=causal) for n in lengths]
        w += [_module(1, 8, 8, n, 64, causal=causal) for n in lengths[:-1]]
        w += [_module(1, 8, 2, n, 64, causal=causal) for n in lengths[:-1]]
        w += [_train(1, 8, 8, n, 64, causal=causal) for n in lengths]  # 8192: the memory point
    w += [_sharded(1, 8, 8, n, 64) for n in (1024, 4096)]  # issue 30's L = S = 4096 on 4 devices
    # decode, incl. the goals' P = 4096 (MHA, GQA 8:2) and the rolling goal's P = 1024, 4096
    w += [_decode(1, 8, k, p, 64) for k in (8, 2, 1) for p in (512, 2048, 4096, 8192, 32768)]
    w += [_decode(1, 8, 8, p, 64, rolling=256) for p in (1024, 2048, 4096, 32768)]  # O(W)
    w += [_mla_decode(p) for p in (1024, 8192)]  # MLA absorbed vs naive, incl. the goal's 8192
    w += [_mla_prefill(n) for n in (512, 2048)]  # MLA prefill vs the same-size GQA module
    w += [_paged_decode(p) for p in (1024, 4096, 8192)]  # paged vs contiguous, incl. the goal
    w += [_paged_decode(p, dtype="bfloat16") for p in (1024, 4096)]  # the fp8 cache's twin
    w += [_varlen(t) for t in (2048, 8192)]  # varlen vs padded, incl. the goal's 8192
    return w


def _accel_quick(dtypes: tuple[str, ...]) -> list[Workload]:
    w = []
    for dt in dtypes:
        for causal in (False, True):
            w += [_attn(2, 16, 16, n, 128, causal=causal, dtype=dt) for n in (1024, 4096, 16384)]
    lo = dtypes[0]
    w += [_attn(2, 32, 8, 4096, 128, dtype=lo), _attn(2, 16, 1, 4096, 128, dtype=lo)]
    w += [_attn(2, 16, 16, n, 128, dtype="float32") for n in (1024, 4096)]
    w += [_module(2, 16, 16, n, 128, dtype=lo) for n in (1024, 4096)]
    w += [_module(2, 16, 4, 4096, 128, dtype=lo)]
    w += [_decode(2, 16, 16, p, 128, dtype=dt) for dt in dtypes for p in (4096, 32768)]
    w += [_decode(2, 16, 4, 32768, 128, dtype=lo), _decode(2, 16, 16, 4096, 128)]  # GQA, f32
    w += [_train(2, 16, 16, n, 128, dtype=lo) for n in (1024, 4096)]  # training steps
    w += [_paged_decode(4096, dtype=lo)]  # paged decode (bf16 and fp8 pools), the kernels' too
    w += [_varlen(8192, dtype=lo)]  # varlen prefill vs padded, the kernels' too
    w += [_mla_decode(8192), _mla_prefill(2048)]  # MLA absorbed vs naive, prefill vs GQA
    return w


def _accel_full(dtypes: tuple[str, ...]) -> list[Workload]:
    lengths = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
    w = []
    for dt in dtypes:
        for causal in (False, True):
            w += [_attn(2, 16, 16, n, 128, causal=causal, dtype=dt) for n in lengths]
    lo = dtypes[0]
    for causal in (False, True):
        w += [_attn(2, 32, 8, n, 128, causal=causal, dtype=lo) for n in lengths[2:8]]
        w += [_attn(2, 16, 1, n, 128, causal=causal, dtype=lo) for n in lengths[2:8]]
        w += [_attn(2, 16, 16, n, 128, causal=causal, dtype="float32") for n in lengths[:7]]
        w += [_module(2, 16, 16, n, 128, causal=causal, dtype=lo) for n in lengths[1:7]]
        w += [_module(2, 16, 4, n, 128, causal=causal, dtype=lo) for n in lengths[1:7]]
    contexts = (1024, 4096, 16384, 65536, 131072)
    w += [_decode(2, 16, 16, p, 128, dtype=dt) for dt in dtypes for p in contexts]
    w += [_decode(2, 16, k, p, 128, dtype=lo) for k in (4, 1) for p in contexts]
    w += [_decode(2, 16, 16, p, 128) for p in contexts[:3]]  # float32
    for causal in (False, True):
        w += [_train(2, 16, 16, n, 128, causal=causal, dtype=lo) for n in lengths[1:6]]
    w += [_paged_decode(p, dtype=lo) for p in (4096, 32768)]  # paged decode, the kernels' too
    w += [_varlen(t, dtype=lo) for t in (8192, 32768)]  # varlen prefill, the kernels' too
    w += [_mla_decode(p) for p in (8192, 65536)] + [_mla_prefill(n) for n in (2048, 8192)]
    return w


def _accel_small(dtypes: tuple[str, ...]) -> list[Workload]:
    """A few minutes on one GPU with every row (``make gpu-check``): each dtype at 1k and 4k,
    causal and not; float32 at 1k; GQA and MQA at 2k; MHA and GQA modules at 1k; MHA and GQA
    decode at P = 4096; one training step at 1k; paged decode at P = 4096 (the kernel ports'
    too); varlen prefill of 8192 tokens (the kernel ports' too); MLA decode at P = 8192 and its
    prefill at 2048 (float32: issue 29's sizes)."""
    w = []
    for dt in dtypes:
        for causal in (False, True):
            w += [_attn(2, 16, 16, n, 128, causal=causal, dtype=dt) for n in (1024, 4096)]
    lo = dtypes[0]
    w += [_attn(2, 16, 16, 1024, 128, dtype="float32")]
    w += [_attn(2, 32, 8, 2048, 128, dtype=lo), _attn(2, 16, 1, 2048, 128, dtype=lo)]
    w += [_module(2, 16, 16, 1024, 128, dtype=lo), _module(2, 16, 4, 1024, 128, dtype=lo)]
    w += [_decode(2, 16, k, 4096, 128, dtype=lo) for k in (16, 4)]
    w += [_train(2, 16, 16, 1024, 128, dtype=lo)]
    w += [_paged_decode(4096, dtype=lo)]  # paged decode (bf16 and fp8 pools), the kernels' too
    w += [_varlen(8192, dtype=lo)]  # varlen prefill vs padded, the kernels' too
    w += [_mla_decode(8192), _mla_prefill(2048)]  # MLA absorbed vs naive, prefill vs GQA
    return w


def _smoke() -> list[Workload]:
    """Seconds, not minutes: proves the harness end to end (tests use it)."""
    w = [_attn(1, 2, 2, n, 16) for n in (32, 64)] + [_attn(1, 2, 1, 64, 16, causal=True)]
    return [*w, _train(1, 2, 2, 64, 16)]


#: Grid builders by (device class, grid name). GPU grids run bfloat16 and float16 (TPU: bfloat16)
#: up to 128k where memory allows; rows that cannot fit a workload are skipped with a reason.
GRIDS = {
    ("cpu", "quick"): _cpu_quick,
    ("cpu", "full"): _cpu_full,
    ("cuda", "quick"): lambda: _accel_quick(("bfloat16", "float16")),
    ("cuda", "full"): lambda: _accel_full(("bfloat16", "float16")),
    ("cuda", "small"): lambda: _accel_small(("bfloat16", "float16")),
    ("tpu", "small"): lambda: _accel_small(("bfloat16",)),
    ("tpu", "quick"): lambda: _accel_quick(("bfloat16",)),
    ("tpu", "full"): lambda: _accel_full(("bfloat16",)),
    **{(d, "smoke"): _smoke for d in ("cpu", "cuda", "tpu")},
}


def grid(device: str, name: str) -> list[Workload]:
    """The workloads of grid ``name`` (``quick`` | ``full`` | ``small`` (GPU/TPU) | ``smoke``)
    for ``device`` (cpu | cuda | tpu)."""
    try:
        build = GRIDS[(device, name)]
    except KeyError:
        known = sorted({g for _, g in GRIDS})
        raise ValueError(f"no grid {name!r} for device {device!r}; grids: {known}") from None
    workloads = build()
    if len(set(workloads)) != len(workloads):
        raise AssertionError(f"grid ({device}, {name}) lists a workload twice")
    return workloads


def grids(device: str, name: str) -> dict[str, list[Workload]]:
    """Every grid of ``device`` by name, built (:func:`grid`), for a run of grid ``name``:
    ValueError when ``device`` has no grid ``name``."""
    chosen = grid(device, name)
    return {g: chosen if g == name else grid(device, g) for d, g in GRIDS if d == device}
