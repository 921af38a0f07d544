"""One validated attention call: :class:`AttentionCall`, what :func:`check_attention` returns.

:class:`AttentionDims` (the sizes and the scalar keywords as Python values) was what validation
returned before; :class:`AttentionCall` extends it, with the same attribute names, by what every
implementation used to work out again after validating: the causal offset, the band decision and
every keyword's converted value. So a public function reads: validate, then the numbered steps.

Shape letters: B batch (``batch`` holds all leading dims), H query heads, K key/value heads
(G = H // K), L query length, S key/value length, D query/key head dim, E value head dim.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from attention_spec.arrays import Shape

__all__ = ["AttentionCall", "AttentionDims", "Keywords"]


@dataclass(frozen=True)
class AttentionDims:
    """The sizes of one attention call, after validation.

    ``batch`` is the broadcast of the leading dims of query, key and value; ``scale`` is the
    resolved score scale (``1/sqrt(D)`` unless given), ``softcap`` the cap as a Python float (or
    None), ``is_causal`` the flag as a Python bool, ``window`` the pair ``(left, right)`` of
    Python ints or None: the implementations compute with these, not the caller's objects.
    """

    batch: Shape
    H: int
    K: int
    L: int
    S: int
    D: int
    E: int
    scale: float
    softcap: float | None = None
    is_causal: bool = False
    window: tuple[int | None, int | None] | None = None

    @property
    def G(self) -> int:
        """Query heads per key/value head (H // K)."""
        return self.H // self.K

    @property
    def scores_shape(self) -> Shape:
        """(..., H, L, S)."""
        return (*self.batch, self.H, self.L, self.S)

    @property
    def output_shape(self) -> Shape:
        """(..., H, L, E)."""
        return (*self.batch, self.H, self.L, self.E)


class Keywords(Mapping):
    """Every keyword of one call by name, as validation converted it: read-only and hashable
    (a JAX static argument may hold it).

    Scalars are Python values (``scale`` resolved to a float, ``softcap`` a float or None,
    ``window`` a pair or None, ``is_causal`` a bool, ``causal_alignment`` a string); array
    keywords are the :class:`~attention_spec.ArraySpec` of the array given, or None: ``mask``
    and ``bias`` broadcastable to ``(..., H, L, S)``, ``q_segment_ids (..., L)``,
    ``kv_segment_ids (..., S)``, ``sinks (H,)``, ``alibi_slopes (H,)``.
    """

    __slots__ = ("_items", "_values")

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values = dict(values or {})
        self._items = tuple(self._values.items())

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keywords) and self._items == other._items

    def __repr__(self) -> str:
        return f"Keywords({self._values!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Keywords, (self._values,))


@dataclass(frozen=True)
class AttentionCall(AttentionDims):
    """One attention call after validation: its sizes, its causal diagonal, its band decision
    and every keyword as a Python value. A drop-in for :class:`AttentionDims` (a subclass, with
    the same attribute names), and what :func:`~attention_spec.check_attention` returns.

    Fields, besides :class:`AttentionDims`'s ``batch, H, K, L, S, D, E`` (query
    ``(*batch, H, L, D)``, key ``(*batch, K, S, D)``, value ``(*batch, K, S, E)``, scores
    ``(*batch, H, L, S)``) and ``scale, softcap, is_causal, window``:

    - ``causal_alignment``: ``"top_left"`` or ``"bottom_right"``.
    - ``offset``: the diagonal of that alignment, ``causal_offset(L, S, causal_alignment)``:
      query i sits at key position ``i + offset`` for the causal rule, the window and ALiBi.
    - ``bands``: whether the causal and window rules mask some of the ``L x S`` pairs. False
      when there is neither, or when they allow every pair (a window wider than the keys), so
      an implementation builds no ``(L, 1)``/``(1, S)`` index for them.
    - ``keywords``: :class:`Keywords`, every keyword of the call by name, converted. A keyword
      that is not a field is also an attribute: ``call.sinks`` is ``call.keywords["sinks"]``
      (an ``ArraySpec`` of shape ``(H,)``, or None).

    Adding a keyword adds one rule to ``attention_spec.validate.KEYWORDS``; its converted value
    then appears here by its name, with no new field.
    """

    causal_alignment: str = "top_left"
    offset: int = 0
    bands: bool = False
    keywords: Keywords = field(default_factory=Keywords)

    def __getattr__(self, name: str) -> Any:
        # Called only for names that are not attributes: a keyword's converted value.
        if name.startswith("_") or name == "keywords":
            raise AttributeError(name)
        try:
            return self.keywords[name]
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r}"
            ) from None
