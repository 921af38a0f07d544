"""What an exception raised while preparing or timing a case means: ``unsupported``, ``oom`` or
``error``.

A kernel that has no implementation for the inputs says so in its own words (torch's "No
available kernel", cuDNN's "no execution plans support the graph", the ``NotImplementedError``
of JAX's cuDNN checks); only those become ``unsupported`` (:data:`UNSUPPORTED`). Anything else
a kernel raises, a cuDNN library failure included, is an ``error``: it may be real breakage,
and hiding it as "unsupported" would make it invisible.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

__all__ = [
    "UNSUPPORTED",
    "UnsupportedError",
    "classify_error",
    "kernel_says_unsupported",
    "reason",
    "unsupported_in_own_words",
]


class UnsupportedError(RuntimeError):
    """The row cannot run this workload here (no kernel for the dtype/shape); not a failure."""


#: Each kernel's own words for "no kernel for these inputs": (exception class name, regular
#: expression over its message). Nothing else is ``unsupported``.
UNSUPPORTED: dict[str, tuple[tuple[str, str], ...]] = {
    "torch_sdpa": (
        ("RuntimeError", r"No available kernel"),  # sdpa_kernel([...]) left no backend
        ("RuntimeError", r"No viable backend"),  # the same, older torch
        ("RuntimeError", r"[Nn]o (valid )?execution plans"),  # cuDNN frontend: no plan for it
    ),
    "jax_cudnn": (  # jax/_src/cudnn's applicability checks (dtype, head dim, lengths, arch)
        ("NotImplementedError", r"must be|[Uu]nsupported|requires|only support"),
    ),
}


def kernel_says_unsupported(kernel: str | None, type_name: str, message: str) -> bool:
    """Whether an exception ``type_name: message`` is ``kernel``'s own "not supported"."""
    return any(
        type_name == name and re.search(pattern, message)
        for name, pattern in UNSUPPORTED.get(kernel or "", ())
    )


@contextlib.contextmanager
def unsupported_in_own_words(kernel: str | None) -> Iterator[None]:
    """Turn ``kernel``'s own "no kernel for this" into :class:`UnsupportedError`; anything else
    passes through unchanged."""
    try:
        yield
    except Exception as e:
        if kernel_says_unsupported(kernel, type(e).__name__, str(e)):
            raise UnsupportedError(reason(e)) from e
        raise


def classify_error(e: BaseException, kernel: str | None = None) -> str:
    """``unsupported``, ``oom`` or ``error`` for an exception raised while preparing or timing
    a row whose kernel (``Row.kernel``) is ``kernel``: unsupported only in the kernel's own
    words (:data:`UNSUPPORTED`)."""
    if isinstance(e, UnsupportedError):
        return "unsupported"
    if isinstance(e, MemoryError):
        return "oom"
    text = f"{type(e).__name__}: {e}"
    if "OutOfMemoryError" in text or "RESOURCE_EXHAUSTED" in text or "out of memory" in text:
        return "oom"
    if kernel_says_unsupported(kernel, type(e).__name__, str(e)):
        return "unsupported"
    return "error"


def reason(e: BaseException) -> str:
    """``Type: message``, the message's first line, at most 300 characters: how a record (and an
    :class:`UnsupportedError`) tells what was raised."""
    return f"{type(e).__name__}: {str(e).strip()}".splitlines()[0][:300]
