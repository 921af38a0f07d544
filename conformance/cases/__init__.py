"""The case list: every point of the contract, one short named function each, in one registry.

Read these files as documentation. Each case is a function registered by
:func:`~conformance.cases.base.case` (through its named forms) in
:data:`~conformance.cases.base.REGISTRY`, split by op:

- :mod:`~conformance.cases.sdpa`: the functional API (``sdpa.*``, also run against
  ``attention_weights`` and ``flash_attention``) and ``causal_mask``;
- :mod:`~conformance.cases.flash`: block sizes for ``flash_attention`` (``flash.tiling.*``);
- :mod:`~conformance.cases.masks`: contract v2's windows, segments, sinks and ALiBi;
- :mod:`~conformance.cases.modules`: ``GroupedQueryAttention``/``MultiHeadAttention`` calls;
- :mod:`~conformance.cases.decode`: KV-cache decoding in several chunkings;
- :mod:`~conformance.cases.errors`: every error of the taxonomy, functional and module;
- :mod:`~conformance.cases.module_masks`: the modules and KV-cache decoding with contract v2's
  window, sinks, ALiBi, softcap and segment ids (``module.v2.*``, ``decode.v2.*``), a rolling
  cache included;
- :mod:`~conformance.cases.grads`: the backward pass (``grad.*``, also run against
  ``flash_attention_vjp``) and its tiling (``flash_grad.*``).
- :mod:`~conformance.cases.ring`: sharded attention, ring and head-parallel (``ring.*``), and
  the sharded rules of the taxonomy (``ring.error.*``);
- :mod:`~conformance.cases.rope`: ``apply_rotary`` (``rope.*``, its errors too) and the modules
  and KV-cache decoding with RoPE (``module.rope.*``, ``decode.rope.*``; scaled frequencies:
  ``module.rope_scaled.*``, ``decode.rope_scaled.*``);
- :mod:`~conformance.cases.varlen`: contract v3's packed variable-length batches
  (``varlen.*``, ``varlen_grad.*`` and their errors);
- :mod:`~conformance.cases.paged`: contract v3's paged key/value caches, ``paged_attention``
  (``paged.*``) and ``paged_cache_write`` (``paged_write.*``), their errors too.
- :mod:`~conformance.cases.fp8`: contract v3's fp8 inputs with descales (``sdpa.fp8.*``),
  ``quantize_fp8`` (``quantize.*``) and the fp8 error codes (registered last, so they follow
  every other case of their group);
- :mod:`~conformance.cases.fp8_cache`: the modules' fp8 KV cache (``decode.fp8_cache.*``),
  registered after every other decode case.

``conformance/generate/`` turns each registered case into fixtures, one per dtype it lists.
A new case is one decorated function in the file of its op; a new op is a new file here, a
fixture builder in generate/fixtures.py and a row in the runner's table.
"""

from conformance.cases import (  # noqa: F401
    decode,
    errors,
    flash,
    grads,
    masks,
    mla,
    module_masks,
    modules,
    paged,
    ring,
    rope,
    sdpa,
    varlen,
)
from conformance.cases.base import ALL_DTYPES, REGISTRY, CaseDef, cases
from conformance.cases.decode import (
    DECODE_CHUNKINGS,
    PAGED_CHUNKINGS,
    PAGED_DECODE_CASES,
    PAGED_DTYPE,
    ROLLING_CHUNKINGS,
)

__all__ = [
    "ALL_DTYPES", "DECODE_CHUNKINGS", "PAGED_CHUNKINGS", "PAGED_DECODE_CASES", "PAGED_DTYPE",
    "REGISTRY", "ROLLING_CHUNKINGS", "CaseDef", "cases",
]

# Registered last: fp8 after every sdpa case, fp8_cache after every decode case.
from conformance.cases import fp8, fp8_cache  # noqa: F401
