"""The rows of the benchmark: one registry line each.

A row is a callable the harness can time: one of the project's implementations, or a
framework's own kernel as a clearly named baseline. Adding a row is one line in :data:`ROWS`;
a row whose target does not import (e.g. ``impl_torch.flash`` before it is written) stays in
the report as "not available" instead of disappearing.

``call`` says how a row is driven (one preparer each, ``bench/preparers.py``):

- ``functional``: ``fn(query (B,H,L,D), key (B,K,S,D), value (B,K,S,E), is_causal=...)``, the
  project's heads-first API (``scaled_dot_product_attention``, ``flash_attention``);
- ``torch_sdpa``: ``torch.nn.functional.scaled_dot_product_attention``, optionally pinned to one
  backend with ``torch.nn.attention.sdpa_kernel`` (``backend=``), GQA via ``enable_gqa``;
- ``jax_dpa``: ``jax.nn.dot_product_attention`` on heads-second ``(B, L, H, D)`` inputs,
  ``implementation=`` ``xla`` | ``cudnn``;
- ``module``: the project's ``GroupedQueryAttention`` / ``MultiHeadAttention`` on ``(B, L, M)``;
- ``torch_mha`` / ``nnx_mha``: ``torch.nn.MultiheadAttention`` (its fast path off, so its
  attention is ``F.scaled_dot_product_attention``, ``is_causal`` for causal workloads; the fast
  path would build the full scores for a causal mask) / ``flax.nnx.MultiHeadAttention``;
- ``decode``: one KV-cache step of the project's ``GroupedQueryAttention``,
  ``module.decode(x (B, 1, M), cache at position P)``;
- ``mla_decode`` / ``mla_decode_naive``: one decode step of the project's
  ``MultiHeadLatentAttention``, ``module.decode(x, latent cache at P)`` (the absorbed step) /
  ``module.decode_naive(x, naive cache at P)`` (every head's keys and values cached);
- ``mla_prefill`` / ``mla_prefill_gqa``: one causal forward of the project's
  ``MultiHeadLatentAttention`` on ``x (B, L, M)`` / of the same-size ``GroupedQueryAttention``
  (K = H / 4, head_dim Dn + Dr, value_head_dim E, RoPE on Dr features);
- ``torch_kernel`` / ``jax_kernel``: a kernel port of ``conformance/ports/`` (the Triton and
  Pallas flash kernels), called like ``functional`` (``flash_attention(q, k, v, is_causal=...)``
  heads-first) on torch tensors / on JAX arrays (jitted with the keywords bound); the call's
  prefix is the framework, since the target's package is ``conformance``;
- ``train``: one training step of the project's ``scaled_dot_product_attention_vjp`` /
  ``flash_attention_vjp``, ``fn(query, key, value, grad_output (B,H,L,E), is_causal=...)`` ->
  the gradients of query, key and value (the forward runs inside: a vjp is forward + backward);
- ``torch_sdpa_train``: ``F.scaled_dot_product_attention`` forward and its autograd backward,
  ``torch.autograd.grad(output, (query, key, value), grad_output)``;
- ``jax_dpa_train``: ``jax.vjp`` of ``jax.nn.dot_product_attention`` and its pullback of
  ``grad_output``, jitted together (heads-second inputs);
- ``torch_decode`` / ``jax_decode``: the same step written with framework ops around the fused
  kernel: the four projections of the token, the cache write at P, and
  ``torch.nn.functional.scaled_dot_product_attention`` (``enable_gqa``) /
  ``jax.nn.dot_product_attention`` of the one query over the S = P + 1 cached keys;
- ``paged_decode``: the project's ``paged_flash_attention`` (the tiled read, each sequence's
  pages in blocks) of one decode step: query ``(B, H, D)`` (one token per sequence), the pools
  ``(pages, 16, K, D|E)``, a shuffled block table, ``seq_lens`` and ``cu_seqlens_q``;
  ``paged_decode_fp8``: the same with the pools quantized to ``float8_e4m3fn`` by the
  framework's ``quantize_fp8`` (one descale per key/value head, ``k_descale``/``v_descale
  (K,)``) and the query as it is; ``paged_decode_fixed``: the same step with
  ``block_k=PAGED_FIXED_BLOCK_K`` (8 pages) instead of the default block, whose width follows
  the sequence up to 2048 keys: its memory column is the tiled read's own, the same at every P;
- ``contiguous_decode``: the same step through the framework's ``flash_attention`` on the same
  keys padded to the longest sequence, ``(B, K, S_max, D)``, masked by length;
- ``varlen``: the project's tiled ``varlen_flash_attention`` (each sequence's own blocks, the
  varlen function a prefill calls for speed; the plain ``varlen_attention`` is one packed
  ``T x T`` call, twice the padded batch's scores) on the packed batch ``(T, H, D)``,
  ``cu_seqlens_q = cu_seqlens_k``, causal; ``varlen_padded``: the framework's
  ``scaled_dot_product_attention`` of the same batch padded to the longest, ``(B, H, L_max,
  D)``, causal and masked by length;
- ``sharded``: ``impl_*.sharded``'s ``ring_attention``, ``impl_*.ulysses``'s
  ``ulysses_attention`` or ``usp_attention`` (``gate_op``: ``ring``, ``ulysses``, ``usp``) on 4
  devices in child processes (bench/sharded.py), the ratio against the same framework's ring.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any

from bench.sharded import METHODS, MODULES
from bench.workloads import (
    DECODE_GOAL_WORKLOADS,
    GOAL_WORKLOAD,
    MLA_GOAL_WORKLOAD,
    PAGED_GOAL_WORKLOAD,
    ROLLING_GOAL_WORKLOAD,
    TRAIN_GOAL_WORKLOAD,
    TRAIN_MEMORY_WORKLOAD,
    VARLEN_GOAL_WORKLOAD,
    WINDOW_GOAL_WORKLOAD,
    Workload,
)

__all__ = ["ROWS", "Goal", "Row", "row_by_name"]


@dataclass(frozen=True)
class Goal:
    """A performance goal, reported (never asserted) on :data:`GOAL_WORKLOAD` on CPU.

    ``kind="ratio"``: this row's median / ``ref``'s median must be <= ``limit``.
    ``kind="faster"``: the same ratio must be < ``limit`` (1.0: strictly faster than ``ref``).
    ``kind="causal"``: this row's causal median / its own non-causal median <= ``limit``.
    ``kind="window"``: this row with a sliding window (:data:`WINDOW_GOAL_WORKLOAD`, causal,
    ``window=(256, 0)`` at L = S = 8192) / the same row causal without it <= ``limit``: the
    tiled path's time follows the window, not L x S.
    ``kind="rolling"``: this row's decode step through a rolling cache
    (:data:`ROLLING_GOAL_WORKLOAD`, a (256, 0) window at P = 4096) / the same step at P = 1024
    <= ``limit``: the step costs O(W), not O(P).

    ``on``: the workload of a ``ratio`` goal stated elsewhere than :data:`GOAL_WORKLOAD` (the
    decode goals: :data:`DECODE_GOAL_WORKLOADS`).
    ``kind="memory"``: this row's peak extra memory on :data:`TRAIN_MEMORY_WORKLOAD` (a
    training step at L = S = 8192, beyond inputs, output and gradients) must be < ``limit``
    bytes; ``ref`` is the plain path, whose peak is measured and shown next to it.

    ``op``: the workloads the goal is stated on, ``attention`` (:data:`GOAL_WORKLOAD`) or
    ``train`` (:data:`TRAIN_GOAL_WORKLOAD`, the same shapes as one training step).
    """

    kind: str
    limit: float
    ref: str | None = None
    on: Workload | None = None
    op: str = "attention"

    def text(self) -> str:
        """How the goal reads in the table, e.g. ``<= 2.5x torch F.sdpa``."""
        if self.kind == "memory":
            w = TRAIN_MEMORY_WORKLOAD
            return f"peak extra < {self.limit / 2**20:g} MiB at L=S={w.L} (vs {self.ref})"
        if self.kind == "causal":
            return f"causal <= {self.limit:g}x own non-causal"
        if self.kind == "window":
            w = WINDOW_GOAL_WORKLOAD
            return f"window ({w.window}, 0) <= {self.limit:g}x own causal at L=S={w.L}"
        if self.kind == "rolling":
            w = ROLLING_GOAL_WORKLOAD
            return f"rolling ({w.window}, 0) step at P={w.P} <= {self.limit:g}x own at P=1024"
        op = "<" if self.kind == "faster" else "<="
        where = "" if self.on is None else f" ({self.on.variant} P={self.on.P})"
        if self.on is not None and self.on.op == "varlen":  # N sequences, T tokens in all
            where = f" (N={self.on.B} T={self.on.L})"
        return f"{op} {self.limit:g}x {self.ref}{where}"

    def met(self, ratio: float) -> bool:
        """Whether a measured ratio (bytes for ``kind="memory"``) meets the goal."""
        return ratio < self.limit if self.kind in ("faster", "memory") else ratio <= self.limit

    def workload(self) -> Workload:
        """The workload the goal is measured on (the causal twin for ``kind="causal"``)."""
        if self.kind == "memory":
            return TRAIN_MEMORY_WORKLOAD
        if self.op == "train":
            return TRAIN_GOAL_WORKLOAD
        if self.kind == "causal":
            return dataclasses.replace(GOAL_WORKLOAD, is_causal=True)
        if self.kind == "window":
            return WINDOW_GOAL_WORKLOAD
        if self.kind == "rolling":
            return ROLLING_GOAL_WORKLOAD
        return GOAL_WORKLOAD if self.on is None else self.on

    def grid_workloads(self) -> tuple[Workload, ...]:
        """The workloads a grid must list for the goal to run in it: both calls' (a ``causal``
        or ``rolling`` goal's twin too), except a ``window`` goal's windowed call, which no grid
        lists (only the project's tiled rows take a window): its causal run at L = S = 8192
        stands for it. The L = S = 8192 goals (``window``, ``memory``) therefore run in the
        ``full`` grid, not in ``quick``: each is minutes of calls on a 2-core machine."""
        if self.kind == "window":
            return (self.baseline(),)
        return tuple(dict.fromkeys((self.workload(), self.baseline())))

    def runs_in(self, workloads: list[Workload] | tuple[Workload, ...]) -> bool:
        """Whether a grid of these workloads runs the goal (:meth:`grid_workloads`)."""
        return all(w in workloads for w in self.grid_workloads())

    def baseline(self) -> Workload:
        """The workload of the goal's second call: the non-causal twin (``causal``), the causal
        run without the window (``window``), the rolling step at P = 1024 (``rolling``), else
        the goal's own workload (run by ``ref``)."""
        w = self.workload()
        if self.kind == "causal":
            return dataclasses.replace(w, is_causal=False)
        if self.kind == "window":
            return dataclasses.replace(w, window=None)
        if self.kind == "rolling":
            return dataclasses.replace(w, S=w.L + 1024)
        return w


@dataclass(frozen=True)
class Row:
    """One benchmarked callable.

    Attributes:
        name: the row's label in the table, JSON and plots.
        target: ``"module.path:attribute"``, imported lazily; ``impl_*`` targets are the
            project's rows (``kind="impl"``), anything else a framework baseline.
        call: how the row is driven (module docstring).
        ref: the row this one's time is divided by in the ratio column (the fused kernel).
        backend: torch SDPA backend (``math``, ``flash``, ``efficient``, ``cudnn``; None: torch
            picks) or ``jax.nn.dot_product_attention`` implementation (``xla``, ``cudnn``).
        skips_masked: whether the kernel skips fully masked causal blocks (True/False), or
            None when unknown; the table says so next to causal rows.
        materializes: whether it builds the ``(B, H, L, S)`` score tensor (memory estimate).
        devices: device classes the row runs on.
        workloads: ``op`` of the workloads it applies to; ``variants``: the head layouts
            (``MHA``, ``GQA``, ``MQA``) it accepts.
        goals: performance goals reported for it (CPU only).
        gate: the conformance port it is gated with; default: its ``impl_*`` package, or
            ``conformance.ports.<framework>_fused`` for a baseline (a module baseline is
            gated through the same framework's fused SDPA port, its attention core).
        dtypes: the workload dtypes it takes (None: every one).
        gate_op: the fixture op of the gate; default ``module`` for the project's modules
            (conformance runs the package's ``GroupedQueryAttention`` on the module fixtures),
            ``decode`` for their decode step (``init_cache``/``decode`` on the decode
            fixtures), ``flash`` for a ``flash_attention`` target, ``flash_grad`` for a
            ``flash_attention_vjp`` target, ``grad`` for the other training steps (their
            ``*_vjp`` on the gradient fixtures), else ``sdpa``.

    A row pinned to one kernel (a torch SDPA backend, JAX's cuDNN attention) is gated on that
    kernel (:attr:`gate_pin`), and only that kernel's own "not supported" errors make its
    cases ``unsupported`` (:attr:`kernel`).
    """

    name: str
    target: str
    call: str = "functional"
    ref: str | None = None
    backend: str | None = None
    skips_masked: bool | None = False
    materializes: bool = True
    devices: tuple[str, ...] = ("cpu", "cuda", "tpu")
    workloads: str = "attention"
    variants: tuple[str, ...] = ("MHA", "GQA", "MQA")
    goals: tuple[Goal, ...] = ()
    gate: str | None = None
    gate_op: str | None = None
    dtypes: tuple[str, ...] | None = None

    @property
    def package(self) -> str:
        """The target's top-level package (``impl_numpy``, ``torch``, ``flax``, ...)."""
        return self.target.split(":")[0].split(".")[0]

    @property
    def kind(self) -> str:
        """``impl`` for the project's own code, ``baseline`` for a framework's kernel."""
        return "impl" if self.package.startswith("impl_") else "baseline"

    @property
    def framework(self) -> str:
        """``numpy``, ``torch`` or ``jax``."""
        p = self.package
        if self.call in ("torch_kernel", "jax_kernel"):  # a kernel port in conformance/ports
            return self.call.removesuffix("_kernel")
        if p == "conformance":  # a kernel port's other calls (its paged decode): its framework's
            return _KERNEL_FRAMEWORKS[self.target.split(":")[0]]
        return p.removeprefix("impl_") if self.kind == "impl" else {"flax": "jax"}.get(p, p)

    @property
    def gate_port(self) -> str:
        """The module path handed to ``conformance.quick_check``."""
        if self.gate is not None:
            return self.gate
        if self.kind == "impl":
            return self.package
        return f"conformance.ports.{self.framework}_fused"

    @property
    def gate_alias(self) -> str:
        """The conformance function alias the gate checks (``sdpa``, ``flash``, ``module``,
        ``decode``)."""
        if self.gate_op is not None:
            return self.gate_op
        if self.call in ("module", "decode"):  # the port's GroupedQueryAttention on the
            return self.call  # module fixtures, or stepped through its KV cache (decode)
        if self.target.endswith(":flash_attention_vjp"):
            return "flash_grad"
        if self.call in _TRAIN_CALLS:  # the port's scaled_dot_product_attention_vjp
            return "grad"
        return "flash" if self.target.endswith(":flash_attention") else "sdpa"

    @property
    def kernel(self) -> str | None:
        """The kernel whose "not supported" messages this row may report as unsupported
        (``errors.UNSUPPORTED``): ``torch_sdpa`` for a pinned SDPA backend, ``jax_cudnn``
        for JAX's cuDNN attention, else None (every error is an error)."""
        if self.call in ("torch_sdpa", "torch_sdpa_train") and self.backend is not None:
            return "torch_sdpa"
        if self.call in ("jax_dpa", "jax_decode", "jax_dpa_train") and self.backend == "cudnn":
            return "jax_cudnn"
        return None

    @property
    def gate_pin(self) -> str | None:
        """The backend the gate forces (``torch_fused.pinned`` / ``jax_fused.pinned``), or
        None for a row gated on its port as is."""
        return self.backend if self.kernel is not None else None

    def resolve(self) -> Any:
        """Import the target. Raises ImportError/AttributeError when it does not exist (yet)."""
        module_name, _, attr = self.target.partition(":")
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj

    def applies_to(self, w: Workload) -> bool:
        """Whether the row is meant for workload ``w`` at all (op and head variant; a window
        only for the project's functions, the frameworks' kernels have no such keyword)."""
        if w.window is not None and (
            self.call not in ("functional", "decode") or self.kind != "impl"
        ):  # a decode workload's window is the project module's rolling cache
            return False
        if self.dtypes is not None and w.dtype not in self.dtypes:
            return False
        return w.op == self.workloads and w.variant.split()[0] in self.variants


#: The call styles of a training step (forward + backward).
_TRAIN_CALLS = ("train", "torch_sdpa_train", "jax_dpa_train")

_T, _J = "torch.nn.functional:scaled_dot_product_attention", "jax.nn:dot_product_attention"
_SDPA, _FLASH = "functional:scaled_dot_product_attention", "flash:flash_attention"
_MHA, _GQA = "modules:MultiHeadAttention", "modules:GroupedQueryAttention"
_TF, _JF = "torch F.sdpa", "jax.nn.dpa[xla]"  # the fused kernels the ratio column divides by
_TD, _JD = "torch F.sdpa decode", "jax.nn.dpa decode"  # the same decode step around them
_TILED = {"skips_masked": True, "materializes": False}  # never builds (B,H,L,S) scores
_MHA_MOD = {"workloads": "module", "variants": ("MHA",)}
_GQA_MOD = {"workloads": "module", "variants": ("GQA", "MQA")}
_DECODE = {"workloads": "decode", "materializes": False}  # scores (B, H, 1, S): one row
_CUDA = ("cuda",)
_TRITON_PORT, _PALLAS_PORT = "conformance.ports.triton_flash", "conformance.ports.pallas_flash"
#: The framework whose arrays a kernel port takes (Triton: torch tensors; Pallas: JAX arrays).
_KERNEL_FRAMEWORKS = {_TRITON_PORT: "torch", _PALLAS_PORT: "jax"}
_TRITON, _PALLAS = f"{_TRITON_PORT}:flash_attention", f"{_PALLAS_PORT}:flash_attention"
_VJP, _FLASH_VJP = "functional:scaled_dot_product_attention_vjp", "flash:flash_attention_vjp"
_TFT, _JFT = "torch F.sdpa train", "jax.nn.dpa[xla] train"  # the frameworks' fwd+bwd
_TRAIN = {"workloads": "train", "variants": ("MHA", "GQA", "MQA")}
_SHARDED = {"workloads": "sharded", "devices": ("cpu",), "skips_masked": True,
            "materializes": False}


def _sharded(framework: str, method: str) -> Row:
    """A sharded row (``call="sharded"``), gated on its conformance alias on 4 devices, its ratio
    against the same framework's ring."""
    target = f"impl_{framework}.{MODULES[method]}:{METHODS[method]}"
    return Row(f"{framework} {method}", target, "sharded",
               ref=f"{framework} ring", gate_op=method, **_SHARDED)


def _ratio(limit: float, ref: str = _TF) -> Goal:
    return Goal("ratio", limit, ref)


_HALF = Goal("causal", 0.6)  # causal at most 0.6x its own non-causal time
_BAND = Goal("window", 0.15)  # a (256, 0) window at most 0.15x its own causal time at 8192
_NF, _TFL = (_ratio(2.5), _HALF, _BAND), (_ratio(1.5), _HALF, _BAND)  # numpy, torch flash goals
_ROLL = Goal("rolling", 1.2)  # a rolling cache's step: the same time at P = 4096 as at 1024


def _decode_goals(ref: str) -> tuple[Goal, ...]:
    """A decode step within 2x the framework's fused step (MHA and GQA 8:2 at P = 4096), and the
    rolling cache's O(W) step."""
    return (*(Goal("ratio", 2.0, ref, on=w) for w in DECODE_GOAL_WORKLOADS), _ROLL)


_TDG, _JDG = _decode_goals(_TD), _decode_goals(_JD)  # the decode rows' goals
_MLA = "mla:MultiHeadLatentAttention"
# gated on the decode fixtures (decode.mla.* among them)
_MLA_DECODE = {"workloads": "mla_decode", "variants": ("MLA",), "materializes": False,
               "gate_op": "decode"}


def _mla_rows(fw: str) -> tuple[Row, Row]:
    """The absorbed MLA decode step and the naive one of ``fw``; the absorbed one's ratio is
    against the naive one, its goal (issue 29) at most 1.0x it at P = 8192, interleaved."""
    naive = f"{fw} MLA naive decode"
    goal = Goal("ratio", 1.0, naive, on=MLA_GOAL_WORKLOAD)
    return (
        Row(f"{fw} MLA decode", f"impl_{fw}.{_MLA}", "mla_decode", ref=naive, goals=(goal,),
            **_MLA_DECODE),
        Row(naive, f"impl_{fw}.{_MLA}", "mla_decode_naive", **_MLA_DECODE),
    )


# gated on the module fixtures (module.mla.* among them)
_MLA_PREFILL = {"workloads": "mla_prefill", "variants": ("MLA",), "materializes": False,
                "gate_op": "module"}


def _mla_prefill_rows(fw: str) -> tuple[Row, Row]:
    """MLA's causal prefill of ``fw`` and the same-size GQA module's; MLA's ratio is against
    the GQA module (no goal: issue 29 asks for the comparison, not a bound)."""
    gqa = f"{fw} GQA prefill (MLA size)"
    return (
        Row(f"{fw} MLA prefill", f"impl_{fw}.{_MLA}", "mla_prefill", ref=gqa, **_MLA_PREFILL),
        Row(gqa, f"impl_{fw}.{_GQA}", "mla_prefill_gqa", **_MLA_PREFILL),
    )


# the paged rows gated on the paged_flash fixtures (paged.*), the contiguous step on the flash
# ones, varlen on varlen.*, its padded twin on sdpa's (issue 27's goals: the CPU's, as all goals)
_PAGED = {"workloads": "paged_decode", "variants": ("GQA",), "materializes": False}
_VARLEN = {"workloads": "varlen", "variants": ("MHA",)}


def _paged_rows(fw: str) -> tuple[Row, Row, Row, Row]:
    """``fw``'s paged decode step (issue 27: within 1.15x the contiguous step at P = 4096,
    interleaved), the contiguous masked step it is set against, the same paged step with a
    fixed 128-key block (issue 27: its extra memory independent of P, at P = 1024 and 8192;
    the CPU's memory column),
    and the fp8 e4m3 cache's step (issue 28) against the bfloat16 cache's, on the bfloat16
    workloads."""
    paged, contiguous = f"{fw} paged decode", f"{fw} contiguous decode"
    goal = Goal("ratio", 1.15, contiguous, on=PAGED_GOAL_WORKLOAD)
    target = f"impl_{fw}.flash:paged_flash_attention"
    return (
        Row(paged, target, "paged_decode", ref=contiguous, goals=(goal,), gate_op="paged_flash",
            **_PAGED),
        Row(contiguous, f"impl_{fw}.{_FLASH}", "contiguous_decode", gate_op="flash", **_PAGED),
        Row(f"{fw} paged decode 128-key blocks", target, "paged_decode_fixed", ref=paged,
            gate_op="paged_flash", dtypes=("float32",), **_PAGED, devices=("cpu",)),
        Row(f"{fw} paged decode fp8", target, "paged_decode_fp8", ref=paged,
            gate_op="paged_flash", dtypes=("bfloat16",), **_PAGED),
    )


def _kernel_paged_rows(kernel: str, port: str) -> tuple[Row, Row]:
    """A kernel port's paged decode step on a GPU box (issues 27, 28: the token-major kernel
    reading the pages through the block table), and the same step on the pools quantized to
    fp8 e4m3 (converted in the kernel) against it, on the bfloat16 workloads; gated on the
    port's own ``paged`` fixtures (``paged.fp8.*`` among them)."""
    paged, target = f"{kernel} paged decode", f"{port}:paged_attention"
    kernel_rows = {**_PAGED, "devices": _CUDA, "gate": port, "gate_op": "paged"}
    return (
        Row(paged, target, "paged_decode", **kernel_rows),
        Row(f"{paged} fp8", target, "paged_decode_fp8", ref=paged, dtypes=("bfloat16",),
            **kernel_rows),
    )


def _kernel_varlen_row(kernel: str, port: str) -> Row:
    """A kernel port's varlen prefill on a GPU box (issue 27: the token-major kernel over the
    packed rows, one program per query block and head of a sequence), against the same
    framework's padded batch; gated on the port's own ``varlen`` fixtures."""
    fw = _KERNEL_FRAMEWORKS[port]
    return Row(f"{kernel} varlen", f"{port}:varlen_attention", "varlen", ref=f"{fw} varlen padded",
               devices=_CUDA, gate=port, gate_op="varlen", **_VARLEN)


def _varlen_rows(fw: str) -> tuple[Row, Row]:
    """``fw``'s varlen prefill through the tiled path (issue 27: at most 0.6x the padded batch
    at 8192 tokens, interleaved) and the padded, masked batch through
    ``scaled_dot_product_attention``."""
    padded = f"{fw} varlen padded"
    goal = Goal("ratio", 0.6, padded, on=VARLEN_GOAL_WORKLOAD)
    return (
        Row(f"{fw} varlen", f"impl_{fw}.varlen:varlen_flash_attention", "varlen", ref=padded,
            goals=(goal,), gate_op="varlen_flash", **_VARLEN),
        Row(padded, f"impl_{fw}.{_SDPA}", "varlen_padded", gate_op="sdpa", **_VARLEN),
    )


def _train_goals(limit: float | None, ref: str, plain: str, kind: str = "ratio") -> tuple:
    """A tiled training step's goals (issue 10): its time against the framework's fwd+bwd, and
    its peak extra memory at L = S = 8192 under 64 MiB, the plain path's shown next to it."""
    time_goal = (Goal(kind, limit, ref, op="train"),) if limit is not None else ()
    return (*time_goal, Goal("memory", 64 * 2**20, plain, op="train"))


#: The registry, one line per row; order is the order of the table.
ROWS: tuple[Row, ...] = (
    # the project's implementations (one readable code path each)
    Row("numpy sdpa", f"impl_numpy.{_SDPA}", ref=_TF, goals=(_ratio(2.5),)),
    Row("torch sdpa", f"impl_torch.{_SDPA}", ref=_TF, goals=(_ratio(3.3),)),
    Row("jax sdpa", f"impl_jax.{_SDPA}", ref=_JF, goals=(Goal("faster", 1.0, _JF),)),
    # the tiled path (impl_*/flash.py)
    Row("numpy flash", f"impl_numpy.{_FLASH}", ref=_TF, goals=_NF, **_TILED),
    Row("torch flash", f"impl_torch.{_FLASH}", ref=_TF, goals=_TFL, **_TILED),
    Row("jax flash", f"impl_jax.{_FLASH}", ref=_JF, goals=(_HALF, _BAND), **_TILED),
    # the project's modules (impl_*/modules.py): MultiHeadAttention on MHA, GQA on GQA/MQA
    Row("numpy MHA module", f"impl_numpy.{_MHA}", "module", ref="torch nn.MHA", **_MHA_MOD),
    Row("torch MHA module", f"impl_torch.{_MHA}", "module", ref="torch nn.MHA", **_MHA_MOD),
    Row("jax MHA module", f"impl_jax.{_MHA}", "module", ref="flax nnx.MHA", **_MHA_MOD),
    Row("numpy GQA module", f"impl_numpy.{_GQA}", "module", **_GQA_MOD),
    Row("torch GQA module", f"impl_torch.{_GQA}", "module", **_GQA_MOD),
    Row("jax GQA module", f"impl_jax.{_GQA}", "module", ref="flax nnx.MHA", **_GQA_MOD),
    # one KV-cache decode step of the project's GroupedQueryAttention (MHA, GQA, MQA)
    Row("numpy decode", f"impl_numpy.{_GQA}", "decode", ref=_TD, goals=_TDG, **_DECODE),
    Row("torch decode", f"impl_torch.{_GQA}", "decode", ref=_TD, goals=_TDG, **_DECODE),
    Row("jax decode", f"impl_jax.{_GQA}", "decode", ref=_JD, goals=_JDG, **_DECODE),
    # one decode step of the project's MultiHeadLatentAttention: absorbed (latent cache), naive
    *_mla_rows("numpy"), *_mla_rows("torch"), *_mla_rows("jax"),
    # MLA's prefill against the same-size GQA module
    *_mla_prefill_rows("numpy"), *_mla_prefill_rows("torch"), *_mla_prefill_rows("jax"),
    # paged decode vs the contiguous masked step, and the fp8 cache (issues 27, 28)
    *_paged_rows("numpy"), *_paged_rows("torch"), *_paged_rows("jax"),
    # varlen prefill vs the padded, masked batch (issue 27)
    *_varlen_rows("numpy"), *_varlen_rows("torch"), *_varlen_rows("jax"),
    # baselines: the frameworks' own kernels, each SDPA backend a row of its own
    Row(_TF, _T, "torch_sdpa", **_TILED),
    Row("torch F.sdpa[math]", _T, "torch_sdpa", ref=_TF, devices=_CUDA, backend="math"),
    Row("torch F.sdpa[flash]", _T, "torch_sdpa", ref=_TF, devices=_CUDA, backend="flash", **_TILED),
    Row("torch F.sdpa[efficient]", _T, "torch_sdpa", ref=_TF, devices=_CUDA, backend="efficient", **_TILED),  # noqa: E501
    Row("torch F.sdpa[cudnn]", _T, "torch_sdpa", ref=_TF, devices=_CUDA, backend="cudnn", **_TILED),
    Row(_JF, _J, "jax_dpa", backend="xla"),
    Row("jax.nn.dpa[cudnn]", _J, "jax_dpa", ref=_JF, devices=_CUDA, backend="cudnn", **_TILED),
    # the kernel ports (conformance/ports): compiled on CUDA only (on a CPU they interpret)
    Row("triton flash", _TRITON, "torch_kernel", ref=_TF, devices=_CUDA, gate=_TRITON_PORT, **_TILED),  # noqa: E501
    Row("pallas flash", _PALLAS, "jax_kernel", ref=_JF, devices=_CUDA, gate=_PALLAS_PORT, **_TILED),
    *_kernel_paged_rows("triton", _TRITON_PORT), *_kernel_paged_rows("pallas", _PALLAS_PORT),
    _kernel_varlen_row("triton", _TRITON_PORT), _kernel_varlen_row("pallas", _PALLAS_PORT),
    Row("torch nn.MHA", "torch.nn:MultiheadAttention", "torch_mha", **_MHA_MOD, **_TILED),
    Row("flax nnx.MHA", "flax.nnx:MultiHeadAttention", "nnx_mha", workloads="module"),
    Row(_TD, _T, "torch_decode", **_DECODE),
    Row(_JD, _J, "jax_decode", backend="xla", **_DECODE),
    # one training step (forward + backward: dQ, dK, dV): the plain and tiled *_vjp, and the
    # frameworks' kernels differentiated by their own autograd
    Row("numpy sdpa train", f"impl_numpy.{_VJP}", "train", ref=_TFT, **_TRAIN),
    Row("torch sdpa train", f"impl_torch.{_VJP}", "train", ref=_TFT, **_TRAIN),
    Row("jax sdpa train", f"impl_jax.{_VJP}", "train", ref=_JFT, **_TRAIN),
    Row("numpy flash train", f"impl_numpy.{_FLASH_VJP}", "train", ref=_TFT, **_TRAIN, **_TILED,
        goals=_train_goals(3.0, _TFT, "numpy sdpa train")),
    Row("torch flash train", f"impl_torch.{_FLASH_VJP}", "train", ref=_TFT, **_TRAIN, **_TILED,
        goals=_train_goals(2.0, _TFT, "torch sdpa train")),
    Row("jax flash train", f"impl_jax.{_FLASH_VJP}", "train", ref=_JFT, **_TRAIN, **_TILED,
        goals=_train_goals(1.0, _JFT, "jax sdpa train", kind="faster")),
    Row(_TFT, _T, "torch_sdpa_train", **_TRAIN, **_TILED),
    Row(_JFT, _J, "jax_dpa_train", backend="xla", **_TRAIN),
    # sequence parallelism on 4 devices (issue 30): JAX's simulated CPU devices, torch's gloo
    # processes; each against its own framework's ring, the formula's bytes per device beside
    *(_sharded(fw, m) for fw in ("torch", "jax") for m in ("ring", "ulysses", "usp")),
)


def row_by_name(name: str, rows: tuple[Row, ...] = ROWS) -> Row:
    """The row called ``name``; KeyError listing the names otherwise."""
    for row in rows:
        if row.name == name:
            return row
    raise KeyError(f"no row {name!r}; rows: {[r.name for r in rows]}")
