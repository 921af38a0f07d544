"""Deliberately broken variable-length attention: the mistakes of packed (``cu_seqlens``) code.

:func:`make_port` returns a port with ``varlen_attention`` and ``varlen_attention_vjp`` (the
signatures of ``impl_numpy/varlen.py``), written here as a small dense NumPy port on the packed
rows: validation through ``attention_spec.check_varlen``, a ``(Tq, Tk)`` allowed rule
(same sequence, causal, window, at each sequence's own positions), the forward with the row
log-sum-exp, and FlashAttention-2's backward (``P = exp(S - lse)``). With no bug it passes
every ``varlen`` and ``varlen_grad`` run (a test asserts that), so a run it fails is failed
because of its one bug:

- ``cu_off_by_one``: sequence n's keys are read from ``cu_k[n] - 1``: the last key of the
  document before leaks into it (and its positions shift by one).
- ``window_packed_diagonal``: the window's diagonal is computed from the packed rows
  (``j_packed <= i_packed + right``, no offset), not from each sequence's own positions and
  ``S_n - L_n``.
- ``grad_dk_other_sequence``: the backward rebuilds ``P`` for dK without the same-sequence
  rule: a key's gradient sums over other sequences' queries too.
- ``fp8_descale_sequence_0``: an fp8 input is dequantized with sequence 0's descale row for
  every sequence (a per-sequence ``(N, H|K)`` descale read as if it were per tensor).
- ``fp8_k_descale_dropped``: ``k_descale`` is ignored (the keys' fp8 values taken as they are,
  as vLLM's FA4 path once did with its descales).

fp8 inputs are dequantized first (float32 times the descale of each row's sequence), as
``impl_numpy/varlen.py``'s step 0.

conformance/tests/test_broken_ports.py proves that the runner catches every one of them
(:data:`BUGS` names one run each must fail).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from attention_spec import (
    AttentionGrads,
    check_varlen,
    check_varlen_grad_output,
    dtype_name,
    is_fp8,
    output_dtype,
)
from conformance.fixtures import NP_DTYPES

__all__ = ["BUGS", "make_port"]

#: bug -> (what it does, a run id that must fail because of it)
BUGS: dict[str, tuple[str, str]] = {
    "cu_off_by_one": (
        "sequence n's keys start at cu_seqlens_k[n] - 1: a document's last token leaks into the "
        "next",
        "varlen.n3.mixed.float32",
    ),
    "window_packed_diagonal": (
        "the window's diagonal from the packed rows, not the sequence's positions and S_n - L_n",
        "varlen.n5.window_across_boundaries.float32",
    ),
    "grad_dk_other_sequence": (
        "backward: dK summed over other sequences' queries (P rebuilt without the sequence rule)",
        "varlen_grad.n3.causal_bottom_right.float32",
    ),
    "fp8_descale_sequence_0": (
        "fp8: sequence 0's descale row applied to every sequence's rows",
        "varlen.fp8.all.per_sequence.causal.float8_e4m3fn",
    ),
    "fp8_k_descale_dropped": (
        "fp8: k_descale ignored, the keys' fp8 values used as they are",
        "varlen.fp8.kv_cache.bfloat16_query.causal_sinks.float8_e4m3fn",
    ),
}


def _dequantized(bug, x, checked, given, cu):
    """An fp8 ``x (T, H|K, D|E)`` as float32 times the descale of each row's sequence
    (``checked``: check_varlen's; ``given``: the descale as passed); anything else as given."""
    if not is_fp8(dtype_name(x.dtype)):
        return x
    x = x.astype(np.float32)
    if checked is None:
        return x
    d = np.asarray(checked if isinstance(checked, float) else given, np.float32)
    per_sequence = np.broadcast_to(d, (len(cu) - 1, x.shape[1]))  # (N, H|K)
    seq = np.searchsorted(cu, np.arange(x.shape[0]), side="right") - 1  # (T,)
    if bug == "fp8_descale_sequence_0":
        seq = 0 * seq
    return x * per_sequence[seq][:, :, None]


def _rules(bug, varlen, cu_q, cu_k):
    """The allowed rule ``(Tq, Tk)``, the same-sequence rule alone, and the ALiBi distance
    ``(Tq, Tk)`` (at each sequence's diagonal)."""
    Tq, Tk, call = varlen.Tq, varlen.Tk, varlen.call
    rows, keys = np.arange(Tq), np.arange(Tk)
    seq_q = np.searchsorted(cu_q, rows, side="right") - 1  # (Tq,)
    starts_k = cu_k.copy()
    if bug == "cu_off_by_one":
        starts_k[1:-1] = np.maximum(starts_k[1:-1] - 1, 0)  # a sequence starts one key early
    seq_k = np.searchsorted(starts_k, keys, side="right") - 1  # (Tk,)
    len_q, len_k = np.diff(cu_q), np.diff(starts_k)
    pos_q, pos_k = rows - cu_q[seq_q], keys - starts_k[seq_k]
    offset = (len_k - len_q)[seq_q] if call.causal_alignment == "bottom_right" else 0 * seq_q
    i, j, at = pos_q[:, None], pos_k[None, :], offset[:, None]  # (Tq, 1), (1, Tk), (Tq, 1)
    same = seq_q[:, None] == seq_k[None, :]  # (Tq, Tk)
    allowed = same.copy()
    if call.is_causal:
        allowed &= j <= i + at
    if call.window is not None:
        left, right = call.window
        wi, wj, wat = (rows[:, None], keys[None, :], 0) if bug == "window_packed_diagonal" else (
            i, j, at)
        if left is not None:
            allowed &= wj >= wi + wat - left
        if right is not None:
            allowed &= wj <= wi + wat + right
    return allowed, same, np.abs(i + at - j)


def _forward(bug, given):
    """Validation, then the packed forward: ``(varlen, state)`` with the scores, lse, weights,
    output and the rules, in the compute dtype, heads-first ``(H, Tq, Tk)``."""
    q, k, v = (np.asarray(given[n]) for n in ("query", "key", "value"))
    cu_q, cu_k = np.asarray(given["cu_seqlens_q"]), np.asarray(given["cu_seqlens_k"])
    sinks, slopes = given.get("sinks"), given.get("alibi_slopes")
    sinks = None if sinks is None else np.asarray(sinks)
    slopes = None if slopes is None else np.asarray(slopes)
    keywords = {n: given[n] for n in ("is_causal", "causal_alignment", "window", "scale",
                                      "softcap", "q_descale", "k_descale", "v_descale")
                if n in given}
    varlen = check_varlen(q, k, v, cu_q, cu_k, sinks=sinks, alibi_slopes=slopes, **keywords)
    call = varlen.call
    k_given = None if bug == "fp8_k_descale_dropped" else given.get("k_descale")
    k_checked = None if bug == "fp8_k_descale_dropped" else varlen.k_descale
    q = _dequantized(bug, q, varlen.q_descale, given.get("q_descale"), cu_q)
    k = _dequantized(bug, k, k_checked, k_given, cu_k)
    v = _dequantized(bug, v, varlen.v_descale, given.get("v_descale"), cu_k)
    ct = np.float64 if q.dtype == np.float64 else np.float32
    allowed, same, distance = _rules(bug, varlen, cu_q.astype(np.int64), cu_k.astype(np.int64))
    heads = np.arange(varlen.H) // varlen.G
    qh = q.astype(ct).transpose(1, 0, 2)  # (H, Tq, D)
    kh = np.take(k.astype(ct), heads, axis=1).transpose(1, 0, 2)  # (H, Tk, D)
    attended = allowed.any(axis=0)  # (Tk,): keys some query attends
    vh = np.where(attended[:, None, None], v.astype(ct), 0.0)
    vh = np.take(vh, heads, axis=1).transpose(1, 0, 2)  # (H, Tk, E)
    kh = np.where(attended[None, :, None], kh, 0.0)
    raw = qh @ kh.transpose(0, 2, 1) * ct(call.scale)  # (H, Tq, Tk)
    s = raw if call.softcap is None else call.softcap * np.tanh(raw / call.softcap)
    if slopes is not None:
        s = s - slopes.astype(ct)[:, None, None] * distance
    m = np.max(np.where(allowed, s, -np.inf), axis=-1, keepdims=True, initial=-np.inf)
    if sinks is not None:
        m = np.maximum(m, sinks.astype(ct)[:, None, None])
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(allowed, np.exp(np.minimum(s - m, 0.0)), 0.0)
    z = e.sum(axis=-1, keepdims=True)
    has_key = z > 0
    sink = (
        0.0 if sinks is None else np.where(has_key, np.exp(sinks.astype(ct)[:, None, None] - m), 0)
    )
    z = z + sink
    lse = np.where(has_key, m + np.log(np.where(has_key, z, 1.0)), -np.inf)  # (H, Tq, 1)
    w = e / np.where(has_key, z, 1.0)
    out = w @ vh  # (H, Tq, E)
    state = SimpleNamespace(q=qh, k=kh, v=vh, raw=raw, s=s, lse=lse, w=w, out=out, ct=ct,
                            allowed=allowed, same=same, heads=heads, sinks=sinks)
    return varlen, state


def make_port(bug: str | None) -> SimpleNamespace:
    """``varlen_attention`` and ``varlen_attention_vjp`` with ``bug`` (a key of :data:`BUGS`,
    or None for none), as a port the conformance runner takes (``functions=("varlen",
    "varlen_grad")``)."""
    if bug is not None and bug not in BUGS:
        raise KeyError(bug)

    def varlen_attention(query, key, value, cu_seqlens_q, cu_seqlens_k, *, is_causal=False,
                         causal_alignment="top_left", window=None, scale=None, softcap=None,
                         sinks=None, alibi_slopes=None, q_descale=None, k_descale=None,
                         v_descale=None):
        with np.errstate(all="ignore"):
            _, st = _forward(bug, locals())
        out = output_dtype(dtype_name(np.asarray(query).dtype))  # bfloat16 for an fp8 query
        return st.out.transpose(1, 0, 2).astype(NP_DTYPES[out])

    def varlen_attention_vjp(query, key, value, cu_seqlens_q, cu_seqlens_k, grad_output, *,
                             is_causal=False, causal_alignment="top_left", window=None,
                             scale=None, softcap=None, sinks=None, alibi_slopes=None):
        with np.errstate(all="ignore"):
            varlen, st = _forward(bug, locals())
            check_varlen_grad_output(varlen, grad_output)
            call, ct = varlen.call, st.ct
            do = np.asarray(grad_output).astype(ct).transpose(1, 0, 2)  # (H, Tq, E)
            dv_h = st.w.transpose(0, 2, 1) @ do  # (H, Tk, E)
            dw = do @ st.v.transpose(0, 2, 1)  # (H, Tq, Tk)
            delta = (do * st.out).sum(-1, keepdims=True)  # (H, Tq, 1)
            ds = st.w * (dw - delta)
            ds_k = ds
            if bug == "grad_dk_other_sequence":  # P rebuilt from lse without the sequence rule
                rule = np.where(st.same, st.allowed, True)
                p = np.where(rule & np.isfinite(st.lse), np.exp(st.s - st.lse), 0.0)
                ds_k = p * (dw - delta)
            if call.softcap is not None:
                factor = 1.0 - np.tanh(st.raw / call.softcap) ** 2
                ds, ds_k = ds * factor, ds_k * factor
            dq = ds @ st.k * ct(call.scale)  # (H, Tq, D)
            dk_h = ds_k.transpose(0, 2, 1) @ st.q * ct(call.scale)  # (H, Tk, D)
            K, G = varlen.K, varlen.G
            Tk = varlen.Tk
            dk = dk_h.reshape(K, G, Tk, -1).sum(1).transpose(1, 0, 2)  # (Tk, K, D)
            dv = dv_h.reshape(K, G, Tk, -1).sum(1).transpose(1, 0, 2)  # (Tk, K, E)
            dsinks = None
            if st.sinks is not None:
                w_sink = np.where(np.isfinite(st.lse), np.exp(st.sinks.astype(ct)[:, None, None]
                                                              - st.lse), 0.0)
                dsinks = -(w_sink * delta).sum(axis=(1, 2)).astype(st.sinks.dtype)
        dtype = np.asarray(query).dtype
        return AttentionGrads(
            query=dq.transpose(1, 0, 2).astype(dtype), key=dk.astype(dtype),
            value=dv.astype(dtype), sinks=dsinks,
        )

    return SimpleNamespace(
        __name__=f"varlen_broken.{bug or 'correct'}",
        varlen_attention=varlen_attention,
        varlen_attention_vjp=varlen_attention_vjp,
    )
