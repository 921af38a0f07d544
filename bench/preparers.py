"""Turn a (row, workload, device) into a timed callable: one preparer per call style.

A preparer says what the row computes on which inputs, as a function of them; the row's
framework (``bench/frameworks.py``) makes the inputs, the timed callable and the memory probe.
:func:`prepare` looks up the row's call style (``Row.call``, ``bench/rows.py``) in
:data:`PREPARERS`. The project's call styles (``functional``, ``module``, ``decode``,
``mla_decode``, ``mla_decode_naive``, ``mla_prefill``, ``mla_prefill_gqa``, ``train``) serve
the three frameworks with one path; a framework's own kernel has a preparer of its own
(``torch_sdpa``, ``jax_dpa``, ...).

Decode rows time one KV-cache step at a fixed position P, every round the same work; training
steps time one forward and its backward, their memory counted beyond the output and the
gradients (docs/BENCH.md, "Decode steps" and "Training steps").
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.errors import unsupported_in_own_words
from bench.frameworks import FRAMEWORKS, JAX, TORCH, Framework, Prepared, _np_dtype
from bench.rows import Row
from bench.sharded import prepare_sharded
from bench.workloads import PAGE_SIZE, PAGED_FIXED_BLOCK_K, Workload

__all__ = ["PREPARERS", "prepare"]


def prepare(row: Row, w: Workload, fdevice: str) -> Prepared:
    """Build the inputs and the timed callable of ``row`` on ``w`` (framework device ``fdevice``).

    Raises UnsupportedError when a framework kernel has no implementation for the case (in its
    own words, ``errors.UNSUPPORTED``); any other exception is the row's own error.
    """
    preparer = PREPARERS.get(row.call)
    if preparer is None:
        raise ValueError(f"row {row.name!r}: unknown call style {row.call!r}; {sorted(PREPARERS)}")
    return preparer(row, row.resolve(), w, fdevice)


# ------------------------------------------------------------------ the project's call styles


def _prepare_functional(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The project's heads-first function: ``fn(q, k, v, is_causal=..., [window=(W, 0)])``; a
    kernel port's ``flash_attention`` is called the same way (``torch_kernel``: the Triton
    kernel on torch tensors, ``jax_kernel``: the Pallas one on JAX arrays)."""
    fw = FRAMEWORKS[row.framework]
    kw = {"is_causal": w.is_causal} | ({} if w.window is None else {"window": (w.window, 0)})
    args = fw.inputs(w, fdevice)
    return fw.prepare(functools.partial(target, **kw), args, fdevice)


def _prepare_module(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The project's ``MultiHeadAttention`` / ``GroupedQueryAttention`` on ``x (B, L, M)``."""
    fw = FRAMEWORKS[row.framework]
    module = _module(fw, target, w, fdevice, gqa=row.target.endswith("GroupedQueryAttention"))
    fn, state = fw.bind(module)
    args = [*state, *fw.inputs(w, fdevice, layout="module")]
    prepared = fw.prepare(functools.partial(fn, is_causal=w.is_causal), args, fdevice, "module")
    prepared.module = module
    return prepared


def _prepare_decode(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """One KV-cache step of the project's ``GroupedQueryAttention.decode``: a token
    ``x (B, 1, M)`` after P cached tokens, in a cache of the module's own type, made at
    position P directly (its buffers of S = P + 1 tokens standard-normal: a prefill would cost
    a full (P, P) attention and change nothing in the step). A workload with a window W: a
    module with ``window=(W, 0)`` and its rolling cache, ``W + 1`` ring slots, at any P."""
    fw, P = FRAMEWORKS[row.framework], w.P
    rolling = w.window is not None
    options = {"window": (w.window, 0)} if rolling else {}
    module = _module(fw, target, w, fdevice, gqa=True, **options)
    x, key, value = fw.inputs(w, fdevice, layout="decode")
    empty = module.init_cache(w.B, w.S if rolling else 1, rolling=rolling)
    cache = dataclasses.replace(empty, key=key, value=value, position=P)
    return _step_at(fw, module, "decode", x, cache, fdevice, "decode")


def _prepare_mla_decode(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """One decode step of the project's ``MultiHeadLatentAttention`` after P cached tokens:
    ``decode`` through the latent cache (``init_cache``: one buffer ``[c_kv, rotated k_pe]``
    and a zero-width value, call ``mla_decode``) or ``decode_naive`` through every head's keys
    and values (``init_kv_cache``, call ``mla_decode_naive``), the cache made at position P
    directly as for ``decode`` rows."""
    fw = FRAMEWORKS[row.framework]
    naive = row.call == "mla_decode_naive"
    module = fw.module(target, [w.M, w.H], w, fdevice)
    layout = "mla_naive" if naive else "mla_latent"
    x, key, value = fw.inputs(w, fdevice, layout=layout)
    empty = (module.init_kv_cache if naive else module.init_cache)(w.B, 1)
    cache = dataclasses.replace(empty, key=key, value=value, position=w.P)
    return _step_at(fw, module, "decode_naive" if naive else "decode", x, cache, fdevice, layout)


def _prepare_mla_prefill(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """One causal self-attention forward on ``x (B, L, M)``: of the project's
    ``MultiHeadLatentAttention`` (call ``mla_prefill``), or of the same-size
    ``GroupedQueryAttention`` (call ``mla_prefill_gqa``: K = w.K, head_dim Dn + Dr, E, RoPE on
    the Dr leading features, bench/workloads.py)."""
    fw = FRAMEWORKS[row.framework]
    if row.call == "mla_prefill":
        module = fw.module(target, [w.M, w.H], w, fdevice)
    else:  # the GQA twin: module_dims of a plain module workload with D = Dn + Dr
        twin = dataclasses.replace(w, op="module", D=w.D + w.Dr, R=None, Dr=None)
        rope = dict(rope_theta=10000.0, rotary_dim=w.Dr, value_head_dim=w.E)
        module = fw.module(target, [w.M, w.H, w.K], twin, fdevice, **rope)
    fn, state = fw.bind(module)
    args = [*state, *fw.inputs(w, fdevice, layout="module")]
    prepared = fw.prepare(functools.partial(fn, is_causal=w.is_causal), args, fdevice, "module")
    prepared.module = module
    return prepared


def _step_at(fw: Framework, module: Any, method: str, x: Any, cache: Any, fdevice: str,
             layout: str) -> Prepared:
    """``module.method(x, cache)`` timed at the cache's position P, every round: the step's
    written buffers are carried to the next round with the position set back to P."""
    P = cache.position
    step, state = fw.bind(module, method)  # step(*state, x, cache) -> (y, the cache at P + 1)
    args = [*state, x, cache]

    def carry(args: list, out: Any) -> Any:  # the written buffers, back at P
        args[-1] = dataclasses.replace(out[1], position=P)
        return out[0]

    prepared = fw.prepare_step(step, args, fdevice, carry, (len(args) - 1,), layout)
    prepared.module = module
    return prepared


def _prepare_train(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The project's ``*_vjp``: ``fn(q, k, v, grad_output, is_causal=...)`` -> the gradients."""
    fw = FRAMEWORKS[row.framework]
    args = fw.inputs(w, fdevice, layout="train")
    fn = functools.partial(target, is_causal=w.is_causal)
    return _beyond_results(fw.prepare_train(fn, args, fdevice), w)


def _module(fw: Framework, cls: type, w: Workload, fdevice: str, gqa: bool, **options: Any
            ) -> Any:
    """A project module with the contract's constructor, ``(M, H[, K], head_dim=D)``."""
    return fw.module(cls, [w.M, w.H, w.K] if gqa else [w.M, w.H], w, fdevice, **options)


def _beyond_results(prepared: Prepared, w: Workload) -> Prepared:
    """A training step's memory: the probe's peak less the bytes of the output and the
    gradients (``w.result_bytes()``), all of which a step holds at its peak."""
    memory = prepared.memory

    def measure() -> tuple[int | None, str]:
        n, method = memory()
        return (None if n is None else n - w.result_bytes()), f"{method} - O, grads"

    prepared.memory = measure
    return prepared


# ------------------------------------------------------------------ paged decode and varlen


def paged_inputs(w: Workload) -> dict[str, np.ndarray]:
    """A paged decode workload's inputs, made once on the host (seed 0), float32 and integer:
    ``query (B, H, D)``; the contiguous ``key (B, K, S_max, D)``, ``value (B, K, S_max, E)``
    (positions past a sequence's length: noise, masked) and its ``mask (B, 1, 1, S_max)``; the
    same keys in ``key_cache``/``value_cache (pages, PAGE_SIZE, K, D|E)``, every sequence's
    pages at shuffled places of the pool (``block_table (B, max_pages)``, -1 past its pages;
    the last page's unused slots 0), ``seq_lens (B,)``, ``cu_seqlens_q = 0..B``."""
    rng = np.random.default_rng(0)
    B, H, K, D, E, lengths = w.B, w.H, w.K, w.D, w.E, w.lengths
    S_max = max(lengths)
    query = rng.standard_normal((B, H, D), dtype=np.float32)
    key = rng.standard_normal((B, K, S_max, D), dtype=np.float32)
    value = rng.standard_normal((B, K, S_max, E), dtype=np.float32)
    n_pages = [-(-n // PAGE_SIZE) for n in lengths]
    places = rng.permutation(sum(n_pages))  # page p of all, in sequence order, is pool page
    block_table = np.full((B, max(n_pages)), -1, dtype=np.int32)
    key_cache = np.zeros((sum(n_pages), PAGE_SIZE, K, D), dtype=np.float32)
    value_cache = np.zeros((sum(n_pages), PAGE_SIZE, K, E), dtype=np.float32)
    taken = 0
    for b, n in enumerate(lengths):
        for p in range(n_pages[b]):
            page, j0, j1 = places[taken], p * PAGE_SIZE, min((p + 1) * PAGE_SIZE, n)
            block_table[b, p], taken = page, taken + 1
            key_cache[page, : j1 - j0] = key[b, :, j0:j1].transpose(1, 0, 2)  # (slots, K, D)
            value_cache[page, : j1 - j0] = value[b, :, j0:j1].transpose(1, 0, 2)
    mask = (np.arange(S_max) < np.asarray(lengths)[:, None])[:, None, None, :]
    return {"query": query, "key": key, "value": value, "mask": mask,
            "key_cache": key_cache, "value_cache": value_cache, "block_table": block_table,
            "seq_lens": np.asarray(lengths, dtype=np.int32),
            "cu_seqlens_q": np.arange(B + 1, dtype=np.int32)}


def varlen_inputs(w: Workload) -> dict[str, np.ndarray]:
    """A varlen workload's inputs, made once on the host (seed 0): the packed ``query (T, H,
    D)``, ``key (T, K, D)``, ``value (T, K, E)`` and ``cu_seqlens (B + 1,)``; the same batch
    padded to the longest, ``padded_query (B, H, L_max, D)``, ``padded_key``, ``padded_value``
    (positions past a sequence's length 0) and ``mask (B, 1, 1, L_max)``, its keys by length."""
    rng = np.random.default_rng(0)
    lengths, T, H, K = w.lengths, w.L, w.H, w.K
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    packed = [rng.standard_normal((T, h, d), dtype=np.float32)
              for h, d in ((H, w.D), (K, w.D), (K, w.E))]
    L_max = max(lengths)
    padded = [np.zeros((w.B, x.shape[1], L_max, x.shape[2]), dtype=np.float32) for x in packed]
    for b, n in enumerate(lengths):
        for x, y in zip(packed, padded):
            y[b, :, :n] = x[cu[b] : cu[b + 1]].transpose(1, 0, 2)  # (heads, n, dim)
    mask = (np.arange(L_max) < np.asarray(lengths)[:, None])[:, None, None, :]
    return {"query": packed[0], "key": packed[1], "value": packed[2], "cu_seqlens": cu,
            "padded_query": padded[0], "padded_key": padded[1], "padded_value": padded[2],
            "mask": mask}


def _to(fw: Framework, x: np.ndarray, dtype: str | None, fdevice: str) -> Any:
    """A host array in ``fw`` on ``fdevice``: floats cast to ``dtype``; integer and boolean
    arrays (the block table, lengths, masks) as they are (JAX: NumPy, bound as constants of
    the jitted call, concrete as the validation wants them)."""
    floating = np.issubdtype(x.dtype, np.floating)
    if fw.name == "numpy":
        return x.astype(_np_dtype(dtype or "float32")) if floating else x
    if fw.name == "torch":
        import torch

        t = torch.from_numpy(x).to(fdevice)
        return t.to(getattr(torch, dtype)) if floating else t
    if not floating:
        return x
    import jax

    return jax.device_put(x.astype(np.float32), jax.devices(fdevice)[0]).astype(dtype)


def _prepare_paged_decode(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The project's ``paged_flash_attention`` of one decode step (:func:`paged_inputs`): the
    query and the pools are the timed call's inputs, the block table and lengths bound. Call
    ``paged_decode_fp8``: the pools quantized to ``float8_e4m3fn`` by the framework's own
    ``quantize_fp8`` (before timing), one descale per key/value head. Call
    ``paged_decode_fixed``: ``block_k=PAGED_FIXED_BLOCK_K`` rather than the default block."""
    fw, host = FRAMEWORKS[row.framework], paged_inputs(w)
    tables = [_to(fw, host[k], None, fdevice) for k in ("block_table", "seq_lens", "cu_seqlens_q")]
    args = [_to(fw, host[k], w.dtype, fdevice) for k in ("query", "key_cache", "value_cache")]
    keywords: dict[str, Any] = {}
    if row.call == "paged_decode_fixed":
        keywords["block_k"] = PAGED_FIXED_BLOCK_K
    if row.call == "paged_decode_fp8":
        quantize = importlib.import_module(f"impl_{row.framework}").quantize_fp8
        for i, name in ((1, "k_descale"), (2, "v_descale")):  # (pages, page, K, D): per head
            args[i], keywords[name] = quantize(args[i], "float8_e4m3fn", axes=(0, 1, 3))

    def step(query, key_cache, value_cache):  # -> (B, H, E)
        return target(query, key_cache, value_cache, *tables, **keywords)

    return fw.prepare(step, args, fdevice, "paged")


def _prepare_contiguous_decode(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The same step through the framework's ``flash_attention``: query ``(B, H, 1, D)`` over
    the keys padded to the longest sequence, ``(B, K, S_max, D)``, masked by length."""
    fw, host = FRAMEWORKS[row.framework], paged_inputs(w)
    host["query"] = host["query"][:, :, None]  # (B, H, 1, D)
    args = [_to(fw, host[k], w.dtype, fdevice) for k in ("query", "key", "value")]
    mask = _to(fw, host["mask"], None, fdevice)
    return fw.prepare(functools.partial(target, mask=mask), args, fdevice)


def _prepare_varlen(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The row's varlen function (the project's ``varlen_flash_attention``, a kernel port's
    ``varlen_attention``) of the packed batch (:func:`varlen_inputs`), causal, or (call
    ``varlen_padded``)
    ``scaled_dot_product_attention`` of the padded batch, causal and masked."""
    fw, host = FRAMEWORKS[row.framework], varlen_inputs(w)
    if row.call == "varlen":
        args = [_to(fw, host[k], w.dtype, fdevice) for k in ("query", "key", "value")]
        cu = _to(fw, host["cu_seqlens"], None, fdevice)  # bound, as the paged step's tables

        def packed(query, key, value):  # -> (T, H, E)
            return target(query, key, value, cu, cu, is_causal=w.is_causal)

        return fw.prepare(packed, args, fdevice, "varlen")
    names = ("padded_query", "padded_key", "padded_value")
    args = [_to(fw, host[k], w.dtype, fdevice) for k in names]
    mask = _to(fw, host["mask"], None, fdevice)
    return fw.prepare(functools.partial(target, mask=mask, is_causal=w.is_causal), args, fdevice)


# ------------------------------------------------------------------ the frameworks' kernels


def _prepare_torch_sdpa(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """``F.scaled_dot_product_attention``, torch's dispatch or one backend forced; one call
    now, so that a backend without a kernel for the case says so before it is timed."""
    from conformance.ports.torch_fused import backend

    kw = {"is_causal": w.is_causal, "enable_gqa": w.K != w.H}

    def fn(q, k, v):
        with backend(row.backend):
            return target(q, k, v, **kw)

    prepared = TORCH.prepare(fn, TORCH.inputs(w, fdevice), fdevice)
    with unsupported_in_own_words(row.kernel):
        prepared.call()
    return prepared


def _prepare_jax_dpa(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """``jax.nn.dot_product_attention(implementation=row.backend)`` on heads-second inputs."""
    args = JAX.inputs(w, fdevice, layout="heads_second")
    fn = functools.partial(target, is_causal=w.is_causal, implementation=row.backend)
    with unsupported_in_own_words(row.kernel):
        return JAX.prepare(fn, args, fdevice, "heads_second")


def _prepare_torch_mha(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """``torch.nn.MultiheadAttention`` with its fast path off, so that its attention is
    ``F.scaled_dot_product_attention`` (with ``is_causal`` for causal workloads).

    In inference mode the module's fast path (``torch._native_multi_head_attention``) takes a
    causal mask to ``_masked_softmax``, which builds the full ``(B, H, L, S)`` scores; on the
    slow path, with ``need_weights=False``, the mask becomes SDPA's ``is_causal=True`` (the
    mask is then a hint only), a fused kernel that skips masked blocks, as the row says.
    """
    import torch
    from torch.backends import mha

    c = w.is_causal
    m = target(w.M, w.H, batch_first=True, device=fdevice, dtype=getattr(torch, w.dtype))
    m = m.eval()
    # nn.MultiheadAttention's bool mask is True = masked out; is_causal is a hint that needs it
    mask = torch.ones(w.L, w.S, dtype=torch.bool, device=fdevice).triu(1) if c else None

    def fn(x):  # (output, None) without weights
        enabled = mha.get_fastpath_enabled()
        mha.set_fastpath_enabled(False)
        try:
            return m(x, x, x, need_weights=False, attn_mask=mask, is_causal=c)[0]
        finally:
            mha.set_fastpath_enabled(enabled)

    return TORCH.prepare(fn, TORCH.inputs(w, fdevice, layout="module"), fdevice, "module")


def _prepare_nnx_mha(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """``flax.nnx.MultiHeadAttention`` (GQA through ``num_kv_heads``), jitted split/merge."""
    from flax import nnx

    module = target(
        num_heads=w.H, in_features=w.M, qkv_features=w.H * w.D, out_features=w.M,
        dtype=w.dtype, param_dtype=w.dtype, decode=False, rngs=nnx.Rngs(JAX.key(0)),
        **({"num_kv_heads": w.K} if w.K != w.H else {}),
    )
    fn, state = JAX.bind(module)
    args = [*state, *JAX.inputs(w, fdevice, layout="module")]
    return JAX.prepare(functools.partial(fn, is_causal=w.is_causal), args, fdevice, "module")


def _prepare_torch_decode(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The decode step with torch ops around ``F.scaled_dot_product_attention``."""
    B, H, K, D, E, P = w.B, w.H, w.K, w.D, w.E, w.P

    def step(params, x, ck, cv):
        wq, bq, wk, bk, wv, bv, wo, bo = params
        q = (x @ wq + bq).view(B, 1, H, D).transpose(1, 2)  # (B, H, 1, D)
        k = (x @ wk + bk).view(B, 1, K, D).transpose(1, 2)  # (B, K, 1, D)
        v = (x @ wv + bv).view(B, 1, K, E).transpose(1, 2)  # (B, K, 1, E)
        ck[:, :, P : P + 1] = k  # the cache write at position P, in place
        cv[:, :, P : P + 1] = v
        # one query: bottom-right causal allows all S = P + 1 keys, so no mask
        out = target(q, ck[:, :, : P + 1], cv[:, :, : P + 1], enable_gqa=K != H)
        return out.transpose(1, 2).reshape(B, 1, H * E) @ wo + bo  # (B, 1, M)

    args = [_projection_weights(TORCH, w, fdevice), *TORCH.inputs(w, fdevice, layout="decode")]
    return TORCH.prepare(step, args, fdevice, "decode")


def _prepare_jax_decode(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """The same step with jnp ops around ``jax.nn.dot_product_attention`` (heads second),
    the cache donated."""
    B, H, K, D, E, P = w.B, w.H, w.K, w.D, w.E, w.P

    def step(params, x, ck, cv):
        wq, bq, wk, bk, wv, bv, wo, bo = params
        q = (x @ wq + bq).reshape(B, 1, H, D)  # (B, 1, H, D)
        k = (x @ wk + bk).reshape(B, 1, K, D)  # (B, 1, K, D)
        v = (x @ wv + bv).reshape(B, 1, K, E)  # (B, 1, K, E)
        ck = ck.at[:, P : P + 1].set(k)  # the cache write at position P (donated: in place)
        cv = cv.at[:, P : P + 1].set(v)
        out = target(q, ck[:, : P + 1], cv[:, : P + 1], implementation=row.backend)
        return out.reshape(B, 1, H * E) @ wo + bo, ck, cv  # (B, 1, M) and the cache

    def carry(args: list, out: Any) -> Any:
        args[2], args[3] = out[1], out[2]
        return out[0]

    inputs = JAX.inputs(w, fdevice, layout="decode_heads_second")
    args = [_projection_weights(JAX, w, fdevice), *inputs]
    return JAX.prepare_step(step, args, fdevice, carry, (2, 3), "decode_heads_second")


def _projection_weights(fw: Framework, w: Workload, fdevice: str) -> list:
    """``wq (M, H*D), bq, wk (M, K*D), bk, wv (M, K*E), bv, wo (H*E, M), bo``: normal / sqrt(M)
    kernels and biases in the canonical ``x @ W + b`` layout (seed 1)."""
    kernels = [(w.M, w.H * w.D), (w.M, w.K * w.D), (w.M, w.K * w.E), (w.H * w.E, w.M)]
    shapes = [s for kernel in kernels for s in (kernel, kernel[1:])]  # each kernel, its bias
    return [a * w.M**-0.5 for a in fw.arrays(shapes, w.dtype, fdevice, seed=1)]


def _prepare_torch_sdpa_train(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """``F.scaled_dot_product_attention`` and its autograd backward: ``torch.autograd.grad``
    of the output against fresh leaves, with ``grad_output``."""
    import torch

    from conformance.ports.torch_fused import backend

    kw = {"is_causal": w.is_causal, "enable_gqa": w.K != w.H}

    def fn(q, k, v, do):  # -> (dQ, dK, dV)
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        with backend(row.backend):
            out = target(*leaves, **kw)
        return torch.autograd.grad(out, leaves, do)

    prepared = TORCH.prepare_train(fn, TORCH.inputs(w, fdevice, layout="train"), fdevice)
    with unsupported_in_own_words(row.kernel):
        prepared.call()
    return _beyond_results(prepared, w)


def _prepare_jax_dpa_train(row: Row, target: Any, w: Workload, fdevice: str) -> Prepared:
    """``jax.vjp`` of ``jax.nn.dot_product_attention(implementation=row.backend)`` and its
    pullback of ``grad_output``, jitted together, on heads-second inputs."""
    import jax

    args = JAX.inputs(w, fdevice, layout="train_heads_second")
    attend = functools.partial(target, is_causal=w.is_causal, implementation=row.backend)

    def step(q, k, v, do):  # -> (dQ, dK, dV), heads second
        _, pullback = jax.vjp(attend, q, k, v)
        return pullback(do)

    with unsupported_in_own_words(row.kernel):
        prepared = JAX.prepare_train(step, args, fdevice, "train_heads_second")
    return _beyond_results(prepared, w)


#: Row.call -> the function that builds its inputs and timed callable (rows.py's docstring).
PREPARERS: dict[str, Callable[[Row, Any, Workload, str], Prepared]] = {
    "functional": _prepare_functional,
    "torch_kernel": _prepare_functional,
    "jax_kernel": _prepare_functional,
    "module": _prepare_module,
    "decode": _prepare_decode,
    "mla_decode": _prepare_mla_decode,
    "mla_decode_naive": _prepare_mla_decode,
    "mla_prefill": _prepare_mla_prefill,
    "mla_prefill_gqa": _prepare_mla_prefill,
    "train": _prepare_train,
    "torch_sdpa": _prepare_torch_sdpa,
    "jax_dpa": _prepare_jax_dpa,
    "torch_mha": _prepare_torch_mha,
    "nnx_mha": _prepare_nnx_mha,
    "torch_decode": _prepare_torch_decode,
    "jax_decode": _prepare_jax_decode,
    "torch_sdpa_train": _prepare_torch_sdpa_train,
    "jax_dpa_train": _prepare_jax_dpa_train,
    "paged_decode": _prepare_paged_decode,
    "paged_decode_fp8": _prepare_paged_decode,
    "paged_decode_fixed": _prepare_paged_decode,
    "contiguous_decode": _prepare_contiguous_decode,
    "varlen": _prepare_varlen,
    "varlen_padded": _prepare_varlen,
    "sharded": prepare_sharded,  # ring, Ulysses, USP on 4 devices in child processes
}
