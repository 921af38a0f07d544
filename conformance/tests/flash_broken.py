"""Deliberately broken tiled attention: the classic bugs of the online softmax, one per port.

Each port is ``impl_numpy.flash.flash_attention`` itself, in a copy of its module with one step
replaced, so it validates, tiles and scores exactly like it and is right except for one bug, the
kind that passes a test with one block or no masking:

- ``no_rescale``: the accumulator and the running sum are not rescaled by ``exp(m_old - m_new)``
  when a new key block raises the row max; blocks summed under different maxima are mixed.
- ``early_normalize``: the accumulator is divided by the running sum after every key block, and
  the sum of the earlier blocks is then forgotten: right with one key block, wrong with two.
- ``skip_partial_block``: under causal masking, the blocks the diagonal crosses (partly masked)
  are skipped along with the blocks above it (fully masked).
- ``unguarded_max``: the row max of a row with nothing allowed yet (-inf) is used as the shift,
  so ``exp(-inf - -inf)`` is NaN in fully masked rows and blocks.

Two more replace step 0, the dequantize of an fp8 input (Contract v3), so the fp8 runs of the
tiled path have broken ports of their own: ``fp8_v_descale_dropped`` and ``fp8_k_descale_twice``
(the suite's ``flash_fp8_*`` bugs; not in :data:`BROKEN`, whose checks are tests/test_flash.py's).

The first, second and fourth replace ``_forward`` (the loop over key blocks, steps 5-6) by
:func:`_forward` below, which is impl_numpy's with the bug switched in; the third replaces
``_Blocks`` by a subclass whose ``key_blocks`` drops the blocks the diagonal crosses.

tests/test_flash.py proves that its checks catch every one of them; the conformance suite's
broken ports (``broken_ports.py``) reuse :data:`BROKEN`.

The tiled paged read (``impl_numpy.flash.paged_flash_attention``, each sequence's pages in
blocks) has broken ports of its own, :data:`PAGED_BROKEN`: the module's source with one line of
the block walk replaced (:data:`PAGED_BUGS`), the kind of bug a block of one page, or a
sequence of one block, hides. tests/test_paged.py proves its multi-block test catches each;
the suite's ``paged_flash_*`` bugs (``broken_ports.py``) are those the fixtures catch at the
default block size.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType

import numpy as np

__all__ = ["BROKEN", "PAGED_BROKEN", "PAGED_BUGS"]


def _flash_module() -> ModuleType:
    """A fresh copy of ``impl_numpy.flash`` (not the one in ``sys.modules``): replacing one of
    its steps changes nothing for the real package."""
    spec = importlib.util.find_spec("impl_numpy.flash")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _forward(blocks, *, bug: str) -> tuple[np.ndarray, np.ndarray]:
    """``impl_numpy.flash._forward`` with ``bug`` (``no_rescale``, ``early_normalize`` or
    ``unguarded_max``): ``(output (..., H, L, E), lse (..., H, L))`` in the compute dtype."""
    dims, sinks, ct = blocks.call, blocks.sinks, blocks.q.dtype
    H, K, G, L, E = dims.H, dims.K, dims.G, dims.L, dims.E
    out = np.empty((*dims.batch, H, L, E), ct)
    lse = np.empty((*dims.batch, H, L), ct)
    for i0, i1 in blocks.query_blocks():
        bq = i1 - i0
        m = np.full((*dims.batch, H, bq, 1), -np.inf, ct)
        l = np.zeros((*dims.batch, H, bq, 1), ct)
        acc = np.zeros((*dims.batch, H, bq, E), ct)
        for j0, j1, every in blocks.key_blocks(i0, i1):
            s, _, v_blk, _, _ = blocks.scores(i0, i1, j0, j1, every)  # (..., H, bq, bk)
            bk = j1 - j0
            # 5. online softmax
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
            if bug == "unguarded_max":  # BUG: -inf - -inf = NaN in a row with nothing allowed
                shift = m_new
            else:
                shift = np.where(m_new == -np.inf, 0.0, m_new)
            alpha = np.exp(m - shift)
            if bug == "no_rescale":  # BUG: what was summed under the old max is kept as it was
                alpha = np.where(np.isfinite(m), 1.0, 0.0)
            p = np.exp(np.minimum(s - shift, 0.0))
            l_new = alpha * l + p.sum(axis=-1, keepdims=True)
            # 6. output, accumulated
            pv = p.reshape(*dims.batch, K, G, bq, bk) @ v_blk  # (..., K, G, bq, E)
            acc = alpha * acc + pv.reshape(*dims.batch, H, bq, E)
            if bug == "early_normalize":  # BUG: divides now, and forgets l_old next time
                acc = acc / np.where(l_new == 0.0, 1.0, l_new)
            l, m = l_new, m_new
        empty = l == 0.0
        if sinks is not None and bug != "early_normalize":  # one more logit, no value
            m_sink = np.maximum(m, sinks[:, None, None])
            shift = np.where(m_sink == -np.inf, 0.0, m_sink)
            alpha = np.exp(m - shift)
            l = alpha * l + np.exp(np.minimum(sinks[:, None, None] - shift, 0.0))
            acc, m = alpha * acc, m_sink
        l = np.where(empty, 1.0, l)
        out[..., i0:i1, :] = acc if bug == "early_normalize" else acc / l
        lse[..., i0:i1] = np.where(empty, -np.inf, m + np.log(l))[..., 0]
    return out, lse


def _skipping_partial_blocks(blocks_class: type) -> type:
    """``_Blocks`` whose ``key_blocks`` also skips, under causal masking, every block the
    diagonal crosses (``every`` False: some of its positions are masked by the rule)."""

    class SkippingPartialBlocks(blocks_class):
        def key_blocks(self, i0: int, i1: int):
            for j0, j1, every in super().key_blocks(i0, i1):
                if every or not self.call.is_causal:  # BUG: a partly masked block is skipped
                    yield j0, j1, every

    return SkippingPartialBlocks


def _dequantized(x, name: str, call, kw, *, real: Callable, bug: str) -> np.ndarray:
    """``impl_numpy``'s step 0 (``real``: an fp8 input as float32 times its descale ``name``)
    with an fp8 ``bug``: ``fp8_v_descale_dropped`` (the value widened, not descaled) or
    ``fp8_k_descale_twice`` (the key's descale multiplied in a second time)."""
    out = real(x, name, call, kw)
    descale = call.keywords[name]
    if out is x or descale is None:  # not an fp8 input, or no descale: nothing to get wrong
        return out
    d = np.asarray(descale if isinstance(descale, float) else kw[name], np.float32)
    if bug == "fp8_v_descale_dropped" and name == "v_descale":  # BUG: float(v), not float(v) * d
        return x.astype(np.float32)
    if bug == "fp8_k_descale_twice" and name == "k_descale":  # BUG: float(k) * d * d
        return out * d[..., None, None]
    return out


def broken_flash(bug: str) -> Callable:
    """``impl_numpy.flash.flash_attention`` with ``bug`` (a key of :data:`BROKEN`, an fp8 bug
    of step 0's dequantize, ``fp8_v_descale_dropped`` or ``fp8_k_descale_twice``, or ``none``
    for none), quiet about the NaN it makes."""
    module = _flash_module()
    if bug.startswith("fp8_"):
        module._dequantized = partial(_dequantized, real=module._dequantized, bug=bug)
    elif bug == "skip_partial_block":
        module._Blocks = _skipping_partial_blocks(module._Blocks)
    elif bug != "none":
        module._forward = partial(_forward, bug=bug)

    def flash_attention(*args, **kwargs):
        with np.errstate(invalid="ignore", divide="ignore"):
            return module.flash_attention(*args, **kwargs)

    flash_attention.__name__ = flash_attention.__qualname__ = f"flash_attention.{bug}"
    return flash_attention


#: name -> a flash_attention with that bug.
BROKEN: dict[str, Callable] = {
    bug: broken_flash(bug)
    for bug in ("no_rescale", "early_normalize", "skip_partial_block", "unguarded_max")
}


#: The block walk's bugs: name -> (the line of ``impl_numpy.flash.paged_flash_attention``, the
#: line that replaces it). Each line is found exactly once, so a change to the real line makes
#: the broken port fail to build rather than silently test nothing.
PAGED_BUGS: dict[str, tuple[str, str]] = {
    # every page of a block numbered as the block's first page: positions and the j < S mask
    # right for a block of one page only
    "page_offsets_from_block_start": (
        "j = p0 * page_size + np.arange((p1 - p0) * page_size)  # (bk,)",
        "j = p0 * page_size + np.arange((p1 - p0) * page_size) % page_size  # BUG",
    ),
    # each block gathers the first pages of the sequence's row (p0 dropped from the gather, kept
    # in j): right for a sequence of one block that starts at its first page
    "pages_from_row_start": (
        "pages = block_table[n, p0:p1]  # (p1 - p0,)",
        "pages = block_table[n, : p1 - p0]  # BUG",
    ),
    # the last page's tail (keys >= S, NaN in the fixtures) kept in the values: masked in the
    # scores only, so its zero weight meets NaN (0 * NaN)
    "tail_values_kept": (
        "v[S - p0 * page_size :] = 0.0  # the last page's slots past S, in the block's copy",
        "pass  # BUG",
    ),
}


def broken_paged_flash(bug: str) -> Callable:
    """``impl_numpy.flash.paged_flash_attention`` with ``bug`` (a key of :data:`PAGED_BUGS`):
    a fresh module built from impl_numpy/flash.py's source with that one line replaced, quiet
    about the NaN it makes."""
    right, wrong = PAGED_BUGS[bug]
    spec = importlib.util.find_spec("impl_numpy.flash")
    source = Path(spec.origin).read_text()
    if source.count(right) != 1:
        raise AssertionError(f"{bug}: impl_numpy/flash.py no longer has the line {right!r} once")
    module = ModuleType(f"impl_numpy.flash.{bug}")
    module.__file__ = spec.origin
    exec(compile(source.replace(right, wrong), spec.origin, "exec"), module.__dict__)

    def paged_flash_attention(*args, **kwargs):
        with np.errstate(invalid="ignore", divide="ignore"):
            return module.paged_flash_attention(*args, **kwargs)

    paged_flash_attention.__name__ = f"paged_flash_attention.{bug}"
    paged_flash_attention.__qualname__ = paged_flash_attention.__name__
    return paged_flash_attention


#: name -> a paged_flash_attention with that bug of the block walk.
PAGED_BROKEN: dict[str, Callable] = {bug: broken_paged_flash(bug) for bug in PAGED_BUGS}
