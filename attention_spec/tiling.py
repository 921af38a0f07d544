"""The tiled path's block sizes: the default pair, the narrow-band rule, and their check.

The rule is the contract's; the numbers a package tiles a narrow band with are the package's:
each ``impl_*/flash.py`` owns its ``BAND_BLOCKS = (rows, widest)`` pair (measured on its own
framework, docs/FLASH.md, "Block sizes") and hands it to :func:`tiled_blocks`.
"""

from __future__ import annotations

from attention_spec.keywords import check_size

__all__ = ["BLOCK_K", "BLOCK_Q", "check_block_sizes", "tiled_blocks"]

#: The default block sizes of the tiled path, in all three implementations: blocks of 256 query
#: rows by 512 keys, whose scores are ``H x 256 x 512`` numbers (4 MiB at H = 8 in float32). The
#: measurements behind them (CPU; a GPU kernel wants other sizes): docs/FLASH.md, "Block sizes".
BLOCK_Q: int = 256
BLOCK_K: int = 512


def check_block_sizes(block_q: int, block_k: int) -> None:
    """Block sizes of a tiled path are integers >= 1 (ConfigError ``non_positive_size``)."""
    check_size("block_q", block_q)
    check_size("block_k", block_k)


def tiled_blocks(
    band_blocks: tuple[int, int],
    block_q: int | None,
    block_k: int | None,
    is_causal: bool,
    window: tuple[int | None, int | None] | None,
) -> tuple[int, int]:
    """The block sizes ``(block_q, block_k)`` of one tiled call: each size given as it is, each
    None from the default pair; then :func:`check_block_sizes`.

    The default pair is ``BLOCK_Q x BLOCK_K``, or, under a narrow band, ``rows x (rows + left +
    right)`` for the caller's ``band_blocks = (rows, widest)``: a call whose ``window`` is
    bounded on the left, and on the right or by ``is_causal`` (which ends every row's band at
    the diagonal), leaves each query row at most ``left + 1 + right`` keys; when
    ``rows + left + right <= widest`` it is tiled in blocks of ``rows`` query rows and the band
    of one such block, so a block holds one band and as little outside it as the rows allow.
    """
    if isinstance(band_blocks, str):  # API 1.0's tiled_blocks("numpy", ...): see PORTING.md
        raise TypeError(
            f"tiled_blocks takes the package's (rows, widest) pair, not a package name "
            f"({band_blocks!r}): e.g. tiled_blocks(impl_numpy.flash.BAND_BLOCKS, ...)"
        )
    rows, widest = band_blocks
    left, right = (None, None) if window is None else window
    if is_causal:  # the causal rule ends every row's band at the diagonal
        right = 0 if right is None else min(right, 0)
    default = (BLOCK_Q, BLOCK_K)
    if left is not None and right is not None and rows + left + right <= widest:
        default = (rows, rows + left + right)
    sizes = (default[0] if block_q is None else block_q, default[1] if block_k is None else block_k)
    check_block_sizes(*sizes)
    return sizes
