"""Apply the golden fixtures to any port and report, per case, pass or fail with the numbers.

A *port* is a module (or any object) exposing the public names of SEMANTICS.md. Each fixture
is run against one or more of its functions, named here by a short alias; :data:`FUNCTIONS` is
the table, one row per alias, saying which attribute of the port is called, how, and against
which golden:

=========== ================================ ============================================
alias       port attribute                   checked against
=========== ================================ ============================================
sdpa        ``scaled_dot_product_attention`` the golden output
weights     ``attention_weights``            the golden weights
causal_mask ``causal_mask``                  the golden boolean (L, S) mask, exactly
flash       ``flash_attention``              the golden output (optional; called with
                                             ``block_q=2, block_k=3`` unless the case
                                             gives its own block sizes)
module      ``GroupedQueryAttention``,       the golden output (and weights) of a module
            ``MultiHeadAttention``           loaded with ``from_canonical``
decode      ``GroupedQueryAttention``,       the golden rows of one full causal forward,
            ``MultiHeadAttention``           step by step through ``init_cache``/``decode``
grad        ``scaled_dot_product_attention_  the golden dq, dk, dv (dbias, dsinks) of
            vjp``                            ``fn(q, k, v, grad_output, **kw)`` (optional)
flash_grad  ``flash_attention_vjp``          the same, with ``block_q=2, block_k=3`` unless
                                             the case gives its own (optional)
ring        ``ring_attention``               the golden output (optional; sharded: called
                                             with ``n_shards=n, layout="contiguous"``)
ring_zigzag ``ring_attention``               the same, ``layout="zigzag"``
head_       ``head_parallel_attention``      the golden output (optional; sharded)
parallel
head_       ``head_parallel_gqa``            a module fixture's golden output (optional;
parallel_                                    sharded: ``head_parallel_gqa(module, x,
gqa                                          context, n_shards=n, **keywords)``)
ulysses     ``ulysses_attention``            the golden output (optional; sharded:
                                             ``n_shards=n``; contract v3)
usp         ``usp_attention``                the same (optional; sharded:
                                             ``ulysses_shards=2, ring_shards=n // 2,
                                             layout="zigzag"``; contract v3)
rope        ``apply_rotary``                 the golden rotated x (optional)
varlen      ``varlen_attention``             the golden output of ``fn(q, k, v,
                                             cu_seqlens_q, cu_seqlens_k, **kw)``, token-
                                             major (optional; contract v3)
varlen_grad ``varlen_attention_vjp``         the golden dq, dk, dv (dsinks) of
                                             ``fn(..., cu_seqlens_k, grad_output, **kw)``
                                             (optional; contract v3)
varlen_     ``varlen_flash_attention``       the same, the tiled path (optional;
flash                                        ``block_q=2, block_k=3``)
varlen_     ``varlen_flash_attention_vjp``   the same gradients, the tiled backward
flash_grad                                   (optional; ``block_q=2, block_k=3``)
paged       ``paged_attention``              the golden output (T, H, E) (optional;
                                             contract v3, conformance/runner/paged.py)
paged_      ``paged_flash_attention``        the same, the tiled read (optional)
flash
paged_      ``paged_cache_write``            the two caches it returns, exactly (optional)
write
=========== ================================ ============================================

One fixture and one function make one *run*, with the id ``<alias>.<feature>[.<variant>].
<dtype>`` (``weights.gqa.h6_k2.float32`` runs the fixture ``sdpa.gqa.h6_k2.float32`` against
``attention_weights``). A run passes when the port's result has the golden's shape and the
input dtype, and its max error against the float64 golden is at most the manifest's bound;
an error case passes when the call raises an exception whose class (or a base class) has the
expected name and whose ``.code`` is the expected code. A failure says where: the element with
the largest error, the expected and the got values to full precision, the relative error and
the error as a multiple of the bound; an exception names the line of the port that raised it,
and an exception inside the port's adapters (``from_numpy``, ``to_numpy``, ``prepare``) names
the adapter.

A missing required function (or module class, or module method) makes each of its runs fail
as "not implemented", one line each, and so does an optional one that is asked for
(``--function``). The optional functions (``flash``, ``grad``, ``flash_grad``, ``rope``,
``varlen``, ``varlen_grad``, ``varlen_flash``, ``varlen_flash_grad``, the paged ``paged``,
``paged_flash`` and ``paged_write``, and the
sharded ``ring``, ``ring_zigzag``, ``head_parallel``, ``head_parallel_gqa``, ``ulysses``,
``usp``, and contract v3's ``quantize`` (``quantize_fp8``): the rows of :data:`FUNCTIONS`
with ``required=False``) are run only when the port has
them or when they are asked for; every port is run on ``sdpa``, ``weights``, ``causal_mask``,
``module`` and ``decode``.

The sharded aliases run each fixture once per shard count n of ``shards`` (``--shards``, default
:data:`DEFAULT_SHARDS`) that fits it: n divides L and S (``ring``), 2n does (``ring_zigzag``), n
divides K (``head_parallel``, ``head_parallel_gqa``), n divides H, L and S with ``K % n == 0``
or ``n % K == 0`` (``ulysses``), n >= 4 is even, 2 divides H, K is even or 1 and 2n divides L
and S (``usp``, u = 2 and r = n/2: ``Function.shard_keywords``); a fixture that fits no n is not
run. Their run ids carry n: ``ring.n4.causal.top_left.l64_s64.float32``. A port's sharded
functions are found at its top level or in its ``sharded`` or ``ulysses`` submodule
(``impl_numpy.sharded``, ``impl_numpy.ulysses``). A
sharded run whose port says it lacks the devices (an error with code ``shard_devices``: one JAX
device where n are needed) is reported as ``skip`` with the port's message; ``python -m
conformance`` gives every port's child process
``XLA_FLAGS=--xla_force_host_platform_device_count=<largest n>`` before JAX starts, and the
torch adapter runs each sharded call on n forked gloo processes (docs/SHARDED.md).

Modules are loaded through the one documented loading function,
``<class>.from_canonical(weights, *, n_heads, n_kv_heads, dtype)`` with the canonical weights as
NumPy arrays (plus ``device=`` when the function takes it), and called as
``module(x, context, **keywords)`` and ``module.decode(x, cache, **keywords)`` after
``cache = module.init_cache(batch_size, max_len)``. Those two calls go through the port's
``prepare`` hook like every function (aliases ``module`` and ``decode``: the JAX adapter
``nnx.jit``s them).

Known failures live in the port's xfails file (see :class:`Xfails`); a listed run that passes
is reported as XPASS and counts as a failure, so the list stays true. A ``skip:`` entry is not
run at all (a case that crashes the port).

``run_suite(..., isolate=True)`` (what ``python -m conformance`` does) runs the port in a child
process (:mod:`conformance.worker`): when a port dies of a signal or an abort in one case, a new
child carries on with the remaining runs, that case first; a case that crashes again there is
reported as ``crash``, with the signal's name, and one that passes there as ``retried``
(``crashed once (SIGSEGV), passed on retry``): counted and listed apart, not a failure.

The package, one file per concern: :mod:`~conformance.runner.port` (a port and its adapters,
:func:`load_port`), :mod:`~conformance.runner.xfails` (:class:`Xfails`),
:mod:`~conformance.runner.functions` (the table, and what each alias's result is compared
with), :mod:`~conformance.runner.arguments` (what each alias is called with, one builder for
value and error cases), :mod:`~conformance.runner.comparison` (the bound, NaN and inf rules),
:mod:`~conformance.runner.failures` (how a run fails, and where),
:mod:`~conformance.runner.outcomes` (:class:`Outcome`, :class:`Report`),
:mod:`~conformance.runner.exec_port` (``--exec``: a port in any language, an executable driven
over a line protocol, as a port object), :mod:`~conformance.runner.isolation` (the child
processes, the retry) and
:mod:`~conformance.runner.suite` (:func:`plan_runs`, :func:`check`, :func:`run_suite`,
:func:`quick_check`).
"""

from __future__ import annotations

from conformance.runner.comparison import Comparison
from conformance.runner.functions import (
    FLASH_BLOCKS,
    FUNCTIONS,
    GRADS,
    SHARDED_ALIASES,
    Function,
    module_decode,
    module_forward,
)
from conformance.runner.isolation import _child_env as _child_env  # the child's environment
from conformance.runner.outcomes import STATUSES, Outcome, Report, Run, write_report
from conformance.runner.port import Port, load_port
from conformance.runner.release import RELEASE_EVERY, release_compiled_programs
from conformance.runner.suite import (
    DEFAULT_SHARDS,
    QuickCheckResult,
    check,
    check_part,
    plan_runs,
    quick_check,
    run_suite,
    runs_for,
    select_functions,
)
from conformance.runner.xfails import XfailEntry, Xfails

__all__ = [
    "DEFAULT_SHARDS",
    "FLASH_BLOCKS",
    "FUNCTIONS",
    "GRADS",
    "RELEASE_EVERY",
    "SHARDED_ALIASES",
    "STATUSES",
    "Comparison",
    "Function",
    "Outcome",
    "Port",
    "QuickCheckResult",
    "Report",
    "Run",
    "XfailEntry",
    "Xfails",
    "check",
    "check_part",
    "load_port",
    "module_decode",
    "module_forward",
    "plan_runs",
    "quick_check",
    "release_compiled_programs",
    "run_suite",
    "runs_for",
    "select_functions",
    "write_report",
]
