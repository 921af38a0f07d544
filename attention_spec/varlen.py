"""Validation of a variable-length (packed) attention call: :func:`check_varlen`.

``varlen_attention(query (Tq, H, D), key (Tk, K, D), value (Tk, K, E), cu_seqlens_q (N + 1,),
cu_seqlens_k (N + 1,), *, is_causal, causal_alignment, window, scale, softcap, sinks,
alibi_slopes, q_descale, k_descale, v_descale)`` (SEMANTICS.md, Contract v3, "Variable-length
batches"): token-major packed sequences; sequence n is query rows ``[cu_q[n], cu_q[n+1])``
against key rows ``[cu_k[n], cu_k[n+1])``, and is exactly
``scaled_dot_product_attention`` of its own rows.

The checks run in a fixed order, so a call with several mistakes reports the same one in every
implementation:

1. each keyword on its own (the rules of ``attention_spec.validate.KEYWORDS``);
2. query, key and value: given, exactly 3 dims (token-major), dtypes, sizes, head dims,
   key/value heads and lengths, head divisibility;
3. ``cu_seqlens_q`` and ``cu_seqlens_k``: given, integer (``cu_seqlens_dtype``), one axis of
   N + 1 >= 1 entries, the same N (``cu_seqlens_count``), and, where the values are concrete
   (NumPy, torch, JAX outside ``jit``), starting at 0, non-decreasing and ending at Tq / Tk
   (``cu_seqlens_value``);
   then the fp8 descales, token-major as ``paged_attention``'s: ``()``, ``(H|K,)`` or per
   sequence ``(N, H|K)`` (:func:`~attention_spec.fp8.check_token_descale`);
4. the keywords against the sizes and the compute dtype (``check_attention`` on the
   heads-first ``(H, Tq, D)``, ``(K, Tk, D)``, ``(K, Tk, E)`` the call stands for).

Shape letters: T packed tokens (Tq queries, Tk keys), N sequences, H query heads, K key/value
heads (G = H // K), D query/key head dim, E value head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attention_spec.arrays import ArraySpec, check_dtype, check_given, describe, format_dims
from attention_spec.call import AttentionCall
from attention_spec.errors import make_error
from attention_spec.fp8 import check_token_descale
from attention_spec.keywords import divisors
from attention_spec.validate import KEYWORDS, _check_dtypes, check_attention

__all__ = [
    "VARLEN_KEYWORDS", "VarlenCall", "check_varlen", "check_varlen_grad_output",
    "sequence_bounds",
]

#: The keywords of ``varlen_attention``, in the order of its signature (no mask, no bias, no
#: segment ids: the sequences are the segments; see docs/SEMANTICS.md, "Contract v3
#: decisions: variable-length batches"). ``varlen_attention_vjp`` takes all but the descales.
VARLEN_KEYWORDS: tuple[str, ...] = (
    "is_causal", "causal_alignment", "window", "scale", "softcap", "sinks", "alibi_slopes",
    "q_descale", "k_descale", "v_descale",
)
_DESCALES = ("q_descale", "k_descale", "v_descale")
_ALONE = tuple(k for k in KEYWORDS if k.name in VARLEN_KEYWORDS and k.alone is not None)


@dataclass(frozen=True)
class VarlenCall:
    """One validated varlen call: its sizes, and ``call``, the :class:`AttentionCall` of the
    heads-first ``(H, Tq, D)`` x ``(K, Tk, D)`` x ``(K, Tk, E)`` call it stands for (its
    keywords converted: ``scale`` resolved, ``softcap`` a float or None, ``window`` a pair or
    None, ``is_causal`` a bool, ``causal_alignment`` a string). Its ``offset`` and ``bands``
    are the packed call's, not a sequence's: an implementation computes each sequence's
    diagonal from its own ``L_n`` and ``S_n``.

    ``dtype``: the query's dtype name (the compute dtype follows it; float32 for an fp8 call).
    ``cu_q`` and ``cu_k``: the boundaries as Python ints where they were concrete, else None
    (under ``jax.jit``: unchecked). ``q_descale``, ``k_descale``, ``v_descale``: an fp8 call's
    descales (None: 1.0, a float32-rounded float, or the ArraySpec of a ``()``, ``(H|K,)`` or
    ``(N, H|K)`` array)."""

    N: int
    Tq: int
    Tk: int
    H: int
    K: int
    D: int
    E: int
    dtype: str
    call: AttentionCall
    cu_q: tuple[int, ...] | None = None
    cu_k: tuple[int, ...] | None = None
    q_descale: float | ArraySpec | None = None
    k_descale: float | ArraySpec | None = None
    v_descale: float | ArraySpec | None = None

    @property
    def G(self) -> int:
        """Query heads per key/value head (H // K)."""
        return self.H // self.K

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """(Tq, H, E)."""
        return (self.Tq, self.H, self.E)


def _check_rank(name: str, shape: tuple[int, ...], letters: str) -> None:
    if len(shape) != 3:
        raise make_error(
            "rank",
            f"{name} of varlen_attention must have exactly 3 dims ({letters}), token-major "
            f"(packed sequences, no batch axis); got shape {shape}",
            expected=f"({letters})",
            actual=str(shape),
        )


def _sizes(query: Any, key: Any, value: Any, fp8: bool) -> tuple[int, int, int, int, int, int]:
    """Step 2: query ``(Tq, H, D)``, key ``(Tk, K, D)`` and value ``(Tk, K, E)`` fit together;
    returns ``(Tq, Tk, H, K, D, E)``. ``fp8``: the call takes descales (``varlen_attention``,
    not its vjp), so fp8 inputs of an allowed combination pass."""
    check_given(query=query, key=key, value=value)
    q, k, v = describe(query), describe(key), describe(value)
    _check_rank("query", q.shape, "Tq, H, D")
    _check_rank("key", k.shape, "Tk, K, D")
    _check_rank("value", v.shape, "Tk, K, E")
    _check_dtypes(q.dtype, k.dtype, v.dtype, fp8)
    Tq, H, D = q.shape
    Tk, K, Dk = k.shape
    Tv, Kv, E = v.shape
    shapes = f"query {q.shape}, key {k.shape}, value {v.shape}"
    for what, n in (
        ("query heads H", H),
        ("key heads K", K),
        ("value heads K", Kv),
        ("head dim D", D),
        ("value head dim E", E),
    ):
        if n < 1:
            raise make_error(
                "non_positive_size",
                f"{what} must be >= 1; got {n} ({shapes})",
                expected=">= 1",
                actual=str(n),
            )
    if Dk != D:
        raise make_error(
            "qk_head_dim_mismatch",
            f"query head dim (D={D}) must equal key head dim (D={Dk}); got {shapes}",
            expected=f"key (Tk, K, D={D})",
            actual=str(k.shape),
        )
    if Kv != K:
        raise make_error(
            "kv_heads_mismatch",
            f"key and value must have the same number of heads; got key K={K}, value K={Kv} "
            f"({shapes})",
            expected=f"value (Tk, K={K}, E)",
            actual=str(v.shape),
        )
    if Tv != Tk:
        raise make_error(
            "kv_length_mismatch",
            f"key tokens (Tk={Tk}) must equal value tokens (Tk={Tv}); got {shapes}",
            expected=f"value (Tk={Tk}, K, E)",
            actual=str(v.shape),
        )
    if H % K:
        choices = divisors(H)
        raise make_error(
            "heads_not_divisible",
            f"key heads (K={K}) must divide query heads (H={H})",
            expected="H % K == 0" + (f" (K in {choices})" if choices else ""),
            actual=f"H={H}, K={K}",
        )
    return Tq, Tk, H, K, D, E


def _int_values(x: Any) -> list[int] | None:
    """The values of a 1-D integer array as Python ints, or None where they are not concrete
    (a JAX tracer under ``jit``: unchecked, as JAX's own functions do)."""
    try:
        values = x.tolist()
    except Exception:  # a traced value
        return None
    return [int(v) for v in values]


def cu_seqlens_spec(name: str, cu: Any) -> ArraySpec:
    """One ``cu_seqlens`` array, given, integer (``cu_seqlens_dtype``) and of one axis of
    ``N + 1 >= 1`` entries (``cu_seqlens_count``): varlen_attention's two and paged_attention's
    ``cu_seqlens_q`` (attention_spec/paged.py)."""
    check_given(**{name: cu})
    spec = describe(cu)
    if not spec.dtype.startswith(("int", "uint")):
        raise make_error(
            "cu_seqlens_dtype",
            f"{name} must be integers (the cumulative sequence lengths, (N + 1,)); got "
            f"{spec.dtype}",
            expected="integer dtype",
            actual=spec.dtype,
        )
    if len(spec.shape) != 1 or spec.shape[0] < 1:
        raise make_error(
            "cu_seqlens_count",
            f"{name} must have one axis of N + 1 >= 1 entries (0, then each sequence's end); "
            f"got shape {spec.shape}",
            expected="(N + 1,)",
            actual=str(spec.shape),
        )
    return spec


def check_cu_seqlens_values(name: str, values: list[int], T: int, letter: str) -> None:
    """Concrete boundaries ``0 = cu[0] <= cu[1] <= ... <= cu[N] = T`` (``cu_seqlens_value``),
    the first broken rule named."""
    bad = ""
    if values[0] != 0:
        bad = f"{name}[0] = {values[0]}, not 0"
    elif values[-1] != T:
        bad = f"{name}[N] = {values[-1]}, not {letter}={T} (the packed tokens)"
    else:
        drop = next((n for n in range(len(values) - 1) if values[n + 1] < values[n]), None)
        if drop is not None:
            bad = (
                f"{name}[{drop + 1}] = {values[drop + 1]} < {name}[{drop}] = {values[drop]} "
                "(decreasing)"
            )
    if bad:
        shown = values if len(values) <= 12 else [*values[:5], "...", *values[-5:]]
        raise make_error(
            "cu_seqlens_value",
            f"{name} must start at 0, never decrease and end at {letter}={T}; got {bad}",
            expected=f"0 = cu[0] <= ... <= cu[N] = {T}",
            actual=str(tuple(shown)),
        )


def _check_cu_seqlens(name: str, cu: Any, T: int, letter: str) -> tuple[int, list[int] | None]:
    """One varlen boundary array: :func:`cu_seqlens_spec`, then its values where concrete.
    Returns ``(N, values or None)``."""
    spec = cu_seqlens_spec(name, cu)
    values = _int_values(cu)
    if values is not None:
        check_cu_seqlens_values(name, values, T, letter)
    return spec.shape[0] - 1, values


def check_varlen(
    query: Any, key: Any, value: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, **keywords: Any
) -> VarlenCall:
    """Validate one ``varlen_attention`` call (the module docstring's order); return it.

    ``keywords``: those of :data:`VARLEN_KEYWORDS` (``sinks`` and ``alibi_slopes`` as arrays, or
    anything :func:`describe` reads); a keyword outside it is a ``TypeError``. fp8 inputs pass
    only when ``k_descale`` is among the keywords (None included), as ``check_attention``'s.

    Raises:
        ConfigError, DimensionMismatchError, DTypeError: see SEMANTICS.md, "New errors".
    """
    unknown = next((name for name in keywords if name not in VARLEN_KEYWORDS), None)
    if unknown is not None:
        raise TypeError(f"varlen_attention() got an unexpected keyword argument {unknown!r}")
    for rule in _ALONE:  # 1. each keyword on its own
        if rule.name in keywords:
            rule.alone(keywords[rule.name])
    fp8 = "k_descale" in keywords  # the function takes descales: fp8 inputs may come
    Tq, Tk, H, K, D, E = _sizes(query, key, value, fp8)  # 2. query, key, value
    dtypes = describe(query).dtype, describe(key).dtype, describe(value).dtype
    N, cu_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, Tq, "Tq")  # 3. the boundaries
    Nk, cu_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, Tk, "Tk")
    if Nk != N:
        raise make_error(
            "cu_seqlens_count",
            f"cu_seqlens_q and cu_seqlens_k must describe the same N sequences (N + 1 "
            f"entries each); got {N + 1} and {Nk + 1} entries",
            expected=f"({N + 1},) and ({N + 1},)",
            actual=f"({N + 1},) and ({Nk + 1},)",
        )
    descales = {  # the fp8 descales, token-major: paged_attention's rule
        name: check_token_descale(name, keywords.pop(name, None), dtype, N, letter, n)
        for name, dtype, letter, n in (("q_descale", dtypes[0], "H", H),
                                       ("k_descale", dtypes[1], "K", K),
                                       ("v_descale", dtypes[2], "K", K))
    }
    plain = {name: None for name in _DESCALES} if fp8 else {}  # checked above, as token-major
    call = check_attention(  # 4. the keywords against the sizes and the compute dtype
        ArraySpec((H, Tq, D), dtypes[0]), ArraySpec((K, Tk, D), dtypes[1]),
        ArraySpec((K, Tk, E), dtypes[2]), **keywords, **plain,
    )
    return VarlenCall(
        N, Tq, Tk, H, K, D, E, dtypes[0], call,
        None if cu_q is None else tuple(cu_q), None if cu_k is None else tuple(cu_k),
        **descales,
    )


def check_varlen_grad_output(varlen: VarlenCall, grad_output: Any) -> None:
    """``grad_output`` of ``varlen_attention_vjp``: an array of one of the four float dtypes
    with exactly the output's shape ``(Tq, H, E)`` (``grad_output_shape``)."""
    check_given(grad_output=grad_output)
    spec = describe(grad_output)
    check_dtype("grad_output", spec.dtype)
    if spec.shape != varlen.output_shape:
        text = format_dims(["Tq", "H", "E"], varlen.output_shape)
        raise make_error(
            "grad_output_shape",
            f"grad_output must have the output's shape {text}; got {spec.shape}",
            expected=text,
            actual=str(spec.shape),
        )


def sequence_bounds(varlen: VarlenCall) -> list[tuple[int, int, int, int]]:
    """The tiled varlen path's schedule: for each sequence n, ``(q0, q1, k0, k1)``, its query
    rows ``[q0, q1)`` and key rows ``[k0, k1)`` (``cu_q[n]``, ``cu_q[n+1]``, ``cu_k[n]``,
    ``cu_k[n+1]``), as Python ints. The tiled path tiles each sequence on its own, so no
    (query block, key block) pair it visits straddles two sequences (docs/SEMANTICS.md,
    "Contract v3 decisions: variable-length batches"). The schedule is made on the host from
    concrete boundaries, as flash-attn's varlen kernels size their grid; traced boundaries
    (under ``jax.jit``) are ConfigError ``cu_seqlens_value``, before any arithmetic."""
    if varlen.cu_q is None or varlen.cu_k is None:
        raise make_error(
            "cu_seqlens_value",
            "the tiled varlen path schedules its blocks from concrete cu_seqlens_q and "
            "cu_seqlens_k (host values); got traced boundaries (under jax.jit, close over "
            "them as NumPy arrays, or call the plain varlen_attention)",
            expected="concrete (N + 1,) integers",
            actual="traced",
        )
    cu_q, cu_k = varlen.cu_q, varlen.cu_k
    return [(cu_q[n], cu_q[n + 1], cu_k[n], cu_k[n + 1]) for n in range(varlen.N)]
