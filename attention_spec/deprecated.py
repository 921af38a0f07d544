"""What API 1.0's forms share: shapes and dtype names in place of arrays, and the warning.

API 1.0 (conformance/PORTING.md of 2026-11-30) passed each array as two arguments, its shape
and its dtype's name (``query_shape, query_dtype``, ``mask_shape=, mask_dtype=``). API 1.1
takes the arrays (or an :class:`~attention_spec.ArraySpec`). The 1.0 forms of
``check_attention``, ``check_canonical``, ``check_module_inputs`` and ``check_decode_inputs``
still work: each turns its pairs into ArraySpecs with :func:`spec_1_0`, warns with
:func:`warn_1_0` and returns what the 1.1 form returns. They go in 2.0 at the earliest.
"""

from __future__ import annotations

import warnings
from typing import Any

from attention_spec.arrays import ArraySpec

__all__ = ["ARRAY_KEYWORDS_1_0", "masks_1_0", "spec_1_0", "warn_1_0"]

#: API 1.0's keywords for the mask and the bias, as ``(shape, dtype)`` pairs.
ARRAY_KEYWORDS_1_0: frozenset[str] = frozenset(
    {"mask_shape", "mask_dtype", "bias_shape", "bias_dtype"}
)


def spec_1_0(shape: Any, dtype: Any) -> ArraySpec | None:
    """API 1.0's ``(shape, dtype name)`` pair as an ArraySpec; ``(None, None)`` is no array."""
    if shape is None and dtype is None:
        return None
    return ArraySpec(tuple(int(n) for n in shape), str(dtype))


def masks_1_0(keywords: dict[str, Any]) -> dict[str, ArraySpec | None]:
    """``mask=`` and ``bias=`` from API 1.0's ``mask_shape=, mask_dtype=, bias_shape=,
    bias_dtype=``, taken out of ``keywords``."""
    pairs = {name: keywords.pop(name, None) for name in sorted(ARRAY_KEYWORDS_1_0)}
    return {
        "mask": spec_1_0(pairs["mask_shape"], pairs["mask_dtype"]),
        "bias": spec_1_0(pairs["bias_shape"], pairs["bias_dtype"]),
    }


def warn_1_0(form: str, instead: str, stacklevel: int = 4) -> None:
    """The DeprecationWarning of a 1.0 form, pointed at the caller's line (``stacklevel``
    counts this function, the 1.0 form's shim and the public function)."""
    warnings.warn(
        f"{form} is API 1.0's form, deprecated since attention_spec API 1.1 and removed in 2.0 "
        f"at the earliest: {instead}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
