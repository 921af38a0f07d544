"""``torch.nn.functional.scaled_dot_product_attention`` as a port: PyTorch's own kernel.

Run through the same fixtures as the implementations, its failures are a measured list of
where torch's kernel differs from the contract (``torch_fused.xfails``, and the table in
docs/CONFORMANCE.md). The generator also uses it to cross-check the goldens.

The wrapper only translates the contract's keywords into torch's, and never fixes semantics:

- ``mask`` and ``bias`` become one ``attn_mask`` (torch takes one): a bool mask alone, else the
  bias with -inf where the mask is False;
- ``is_causal`` alone with top_left is torch's ``is_causal=True``; alone with bottom_right it is
  ``torch.nn.attention.bias.causal_lower_right``; together with a mask or bias (which torch
  refuses next to ``is_causal``) the causal rule is folded into ``attn_mask``;
- GQA is ``enable_gqa=True``;
- ``softcap`` does not exist in torch: NotImplementedError;
- float32 runs with IEEE float32 matmuls whatever the process allows (TF32 off inside the call,
  :mod:`conformance.ports.precision`): the fixtures' float32 bounds are ~1e-6, TF32's errors
  1e-4 to 1e-3, and that is a global setting, not the kernel's semantics.
- fp8 (contract v3): the fp8 tensors go to SDPA as they are, ``q_descale * k_descale`` folded
  into ``scale`` where each is one number and the output times ``v_descale``
  (:mod:`conformance.ports.descales`); on CPU the kernel refuses fp8 (measured in the xfails).

:func:`pinned` gives this port with one SDPA backend forced (``sdpa_kernel([backend])``), so a
backend is checked on its own kernel; a backend that has no kernel for a case raises torch's
"No available kernel" error, which the benchmark's gate reports as unsupported.

Contract v3's packed rows (SDPA has no varlen or paged form): :func:`varlen_attention` calls
SDPA once per sequence on its slice of the packed rows, :func:`paged_attention` once per
sequence on its keys gathered from the pool through ``block_table``; each call's rules are
this port's SDPA translation, on the sequence's own (L_n, S_n).

torch has no weights function; :func:`attention_weights` runs the same kernel with the identity
as value (one value column per key), so the output *is* the weight matrix. There is no public
causal-mask function, so this port has no ``causal_mask``.
"""

from __future__ import annotations

import contextlib
import functools
import types
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from attention_spec import AttentionGrads
from conformance.ports.descales import takes_descales, torch_output
from conformance.ports.packed import packed_rows, page_slots
from conformance.ports.precision import torch_ieee_float32
from conformance.ports.torch_adapter import from_numpy, to_numpy

__all__ = [
    "BACKENDS",
    "attention_weights",
    "backend",
    "from_numpy",
    "paged_attention",
    "pinned",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_vjp",
    "to_numpy",
    "varlen_attention",
]

#: The SDPA backends by the short names the benchmark's rows use.
BACKENDS: dict[str, SDPBackend] = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


@contextlib.contextmanager
def backend(name: str | None) -> Iterator[None]:
    """Force one SDPA backend (``math``, ``flash``, ``efficient``, ``cudnn``) in the block;
    None leaves torch's own dispatch."""
    if name is None:
        yield
        return
    with sdpa_kernel([BACKENDS[name]]):
        yield


#: The kernel, as the fp8 descales' error names it (:mod:`conformance.ports.descales`).
_KERNEL = "torch.nn.functional.scaled_dot_product_attention"


@takes_descales(_KERNEL, torch_output)
def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """torch's SDPA on the contract's layout: query (..., H, L, D), key (..., K, S, D),
    value (..., K, S, E) -> (..., H, L, E). The v2 rules are what a torch user hands SDPA: a
    window and packed segments as a boolean ``attn_mask``, ALiBi as an additive one (built
    here, from the formulas, not from this project's rules)."""
    if softcap is not None:
        raise NotImplementedError("torch.nn.functional.scaled_dot_product_attention has no softcap")
    if sinks is not None:
        raise NotImplementedError("torch.nn.functional.scaled_dot_product_attention has no sinks")
    H, L = query.shape[-3], query.shape[-2]
    K, S = key.shape[-3], key.shape[-2]
    mask, bias = _extra_as_mask_and_bias(
        mask, bias, query.device, L, S, causal_alignment, window, q_segment_ids,
        kv_segment_ids, alibi_slopes,
    )

    attn_mask = None
    if bias is not None:
        attn_mask = bias if mask is None else torch.where(mask, bias, float("-inf"))
    elif mask is not None:
        attn_mask = mask

    torch_is_causal = False
    if is_causal:
        if causal_alignment not in ("top_left", "bottom_right"):
            raise ValueError(f"torch has no causal alignment {causal_alignment!r}")
        if attn_mask is None and causal_alignment == "top_left":
            torch_is_causal = True
        elif attn_mask is None:
            with warnings.catch_warnings():  # "will produce NaNs when L > S": the suite measures
                warnings.simplefilter("ignore", UserWarning)  # what it does (zeros, on CPU)
                attn_mask = causal_lower_right(L, S)
        else:
            diagonal = 0 if causal_alignment == "top_left" else S - L
            allowed = torch.ones(L, S, dtype=torch.bool, device=query.device).tril(diagonal)
            if attn_mask.dtype == torch.bool:
                attn_mask = attn_mask & allowed
            else:
                attn_mask = torch.where(allowed, attn_mask, float("-inf"))

    with torch_ieee_float32():
        return F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attn_mask,
            is_causal=torch_is_causal,
            scale=scale,
            enable_gqa=H != K,
        )


def scaled_dot_product_attention_vjp(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    grad_output: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    **keywords: Any,
) -> AttentionGrads:
    """torch's own backward of its SDPA kernel: ``torch.autograd.grad`` of
    :func:`scaled_dot_product_attention` (the same call, keywords translated the same way) with
    ``grad_output`` as the cotangent. Gradients for query, key, value and bias (None where not
    given); sinks do not exist in torch (NotImplementedError, from the forward)."""
    wanted = [x.detach().requires_grad_() for x in (query, key, value)]
    if bias is not None:
        bias = bias.detach().requires_grad_(bias.is_floating_point())
    with torch.enable_grad():
        out = scaled_dot_product_attention(*wanted, bias=bias, sinks=sinks, **keywords)
        inputs = wanted + ([bias] if bias is not None and bias.requires_grad else [])
        with torch_ieee_float32():
            grads = torch.autograd.grad(out, inputs, grad_output, allow_unused=True)
    dbias = grads[3] if len(grads) > 3 else None
    return AttentionGrads(grads[0], grads[1], grads[2], dbias, None)


def _extra_as_mask_and_bias(mask, bias, device, L, S, alignment, window, q_ids, kv_ids, slopes):
    """The window and segments folded into the boolean mask, ALiBi into the bias."""
    offset = 0 if alignment == "top_left" else S - L
    rows = torch.arange(L, device=device)[:, None] + offset  # (L, 1): each row's diagonal key
    keys = torch.arange(S, device=device)[None, :]  # (1, S)
    extra = []
    if window is not None:
        left, right = window
        if left is not None:
            extra.append(keys >= rows - left)
        if right is not None:
            extra.append(keys <= rows + right)
    if q_ids is not None:
        extra.append(q_ids[..., None, :, None] == kv_ids[..., None, None, :])  # (..., 1, L, S)
    for allowed in extra:
        mask = allowed if mask is None else mask & allowed
    if slopes is not None:
        distance = (rows - keys).abs().to(slopes.dtype)  # (L, S)
        alibi = -slopes[:, None, None] * distance  # (H, L, S)
        bias = alibi if bias is None else bias + alibi
    return mask, bias


@takes_descales(_KERNEL, torch_output)
def attention_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    softcap: float | None = None,
    **extra: Any,  # window, segment ids, sinks, ALiBi slopes
) -> torch.Tensor:
    """The weights (..., H, L, S) from torch's kernel: SDPA with value = identity (S x S)."""
    K, S = key.shape[-3], key.shape[-2]
    identity = torch.eye(S, dtype=query.dtype, device=query.device)  # (S, E=S)
    identity = identity.expand(*key.shape[:-3], K, S, S)  # (..., K, S, S)
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
        **extra,
    )


# ---------------------------------------------------------------------------------------------
# Contract v3: varlen and paged, one SDPA call per sequence (SDPA has neither form)
# ---------------------------------------------------------------------------------------------


def _refuse(softcap: float | None, sinks: torch.Tensor | None) -> None:
    """SDPA's missing arguments, refused before any sequence's call."""
    if softcap is not None:
        raise NotImplementedError("torch.nn.functional.scaled_dot_product_attention has no softcap")
    if sinks is not None:
        raise NotImplementedError("torch.nn.functional.scaled_dot_product_attention has no sinks")


@takes_descales(_KERNEL, torch_output, token_major=True)
def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Packed sequences as one SDPA call per sequence: query (Tq, H, D), key (Tk, K, D), value
    (Tk, K, E), ``cu_seqlens_q``/``cu_seqlens_k`` (N + 1,) -> (Tq, H, E).

    Sequence n is SDPA on its slices ``query[cu_q[n]:cu_q[n+1]]`` (1, H, L_n, D) and
    ``key``/``value[cu_k[n]:cu_k[n+1]]`` (1, K, S_n, D|E), its rules on its own (L_n, S_n):
    ``is_causal`` top-left is SDPA's, bottom-right ``causal_lower_right``, the window a boolean
    mask and ALiBi an additive one (:func:`scaled_dot_product_attention`'s translation). This
    loop, rather than one call on the packed rows with a block-diagonal mask, is what SDPA
    users write (torch 2.13's ``torch.nn.attention.varlen.varlen_attn`` is flash attention,
    with no CPU kernel: measured, NotImplementedError): each call keeps SDPA's causal
    argument, and no sequence's keys are in another's call. No softcap, no sinks:
    NotImplementedError."""
    _refuse(softcap, sinks)
    rows = []
    for (q0, q1), (k0, k1) in zip(packed_rows(cu_seqlens_q), packed_rows(cu_seqlens_k)):
        if q1 == q0:  # a sequence without queries needs no call
            continue
        q, k, v = (x.transpose(0, 1)[None] for x in (query[q0:q1], key[k0:k1], value[k0:k1]))
        out = scaled_dot_product_attention(
            q, k, v, is_causal=is_causal, causal_alignment=causal_alignment, window=window,
            scale=scale, alibi_slopes=alibi_slopes,
        )  # (1, H, L_n, E)
        rows.append(out[0].transpose(0, 1))  # (L_n, H, E)
    return torch.cat(rows) if rows else query.new_zeros(0, query.shape[1], value.shape[-1])


@takes_descales(_KERNEL, torch_output, token_major=True)
def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    is_causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """A paged cache as one SDPA call per sequence: query (T, H, D), key_cache (P, page, K, D),
    value_cache (P, page, K, E), block_table (N, max_pages), seq_lens (N,), cu_seqlens_q
    (N + 1,) -> (T, H, E).

    The wrapper gathers sequence n's ``seq_lens[n]`` keys and values through ``block_table``
    into a contiguous (1, K, S_n, D|E) (SDPA has no paged form; no slot past ``seq_lens[n]`` is
    read), then SDPA on its queries (1, H, L_n, D), the last L_n positions: the contract's
    bottom-right diagonal, ``causal_lower_right`` for ``is_causal``, and the window and ALiBi
    on the same diagonal. No softcap, no sinks: NotImplementedError."""
    _refuse(softcap, sinks)
    P, page, K, _ = key_cache.shape
    keys = key_cache.reshape(P * page, K, key_cache.shape[-1])  # (P * page, K, D)
    values = value_cache.reshape(P * page, K, value_cache.shape[-1])  # (P * page, K, E)
    rows = []
    for (q0, q1), slots in zip(packed_rows(cu_seqlens_q), page_slots(block_table, seq_lens, page)):
        if q1 == q0:  # a sequence without queries needs no call
            continue
        index = torch.from_numpy(slots).to(key_cache.device)  # (S_n,)
        q = query[q0:q1].transpose(0, 1)[None]  # (1, H, L_n, D)
        k, v = (x[index].transpose(0, 1)[None] for x in (keys, values))  # (1, K, S_n, D|E)
        out = scaled_dot_product_attention(
            q, k, v, is_causal=is_causal, causal_alignment="bottom_right", window=window,
            scale=scale, alibi_slopes=alibi_slopes,
        )  # (1, H, L_n, E)
        rows.append(out[0].transpose(0, 1))  # (L_n, H, E)
    return torch.cat(rows) if rows else query.new_zeros(0, query.shape[1], value_cache.shape[-1])


def pinned(name: str) -> types.ModuleType:
    """This port with the SDPA backend ``name`` forced (a key of :data:`BACKENDS`), named
    ``conformance.ports.torch_fused[<name>]``; its xfails are this port's own file."""
    if name not in BACKENDS:
        raise ValueError(f"no SDPA backend {name!r}; backends: {sorted(BACKENDS)}")
    port = types.ModuleType(f"{__name__}[{name}]", f"torch SDPA pinned to the {name} backend")
    port.__file__ = __file__

    def pin(function):
        @functools.wraps(function)
        def run(*args, **kwargs):
            with backend(name):
                return function(*args, **kwargs)

        return run

    port.scaled_dot_product_attention = pin(scaled_dot_product_attention)
    port.attention_weights = pin(attention_weights)
    port.scaled_dot_product_attention_vjp = pin(scaled_dot_product_attention_vjp)
    port.varlen_attention = pin(varlen_attention)
    port.paged_attention = pin(paged_attention)
    port.from_numpy, port.to_numpy = from_numpy, to_numpy
    return port
