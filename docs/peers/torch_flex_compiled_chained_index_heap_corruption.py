"""A compiled FlexAttention ``score_mod`` indexing ``bias[b][0][q_idx][kv_idx]`` corrupts the heap.

``torch.compile(flex_attention)`` on CPU with a ``score_mod`` reading a captured bias by
chained indexing (``bias[b][0][q_idx][kv_idx]``, one index at a time) aborts the process
(glibc: "corrupted double-linked list", exit 134 / SIGABRT; SIGSEGV, 139, on other runs).
The same bias read with one multi-index, ``bias[b, 0, q_idx, kv_idx]`` (run with
``--comma``), computes the right answer, and eager FlexAttention takes both. Both are plain
tensor indexing, so the chained form should either work or be refused at compile time.
Runs on CPU with torch alone (measured with torch 2.13.0, inductor's C++ backend, gcc).

The bad read shows in one of two ways, by machine: where the generated kernel keeps
inductor's indirect-index check, that check fires (``RuntimeError: index out of bounds:
0 <= tmpN < cur_qSplitSize``: the query index of the captured bias bounded by the kernel's
query block size, not by the bias's own axis); where it does not, the read runs past the
buffer and the allocator aborts later. Both are the one bug. Seen: exit 134 here (AMD EPYC,
AVX-512), the RuntimeError on CI's machine of 2026-12-04, same torch.

Exit status: 134 or 139 (killed by the allocator) or 3 (the index check fired): the bug
reproduces; 0: it was fixed (the compiled answer is printed against eager's).
"""

import sys

import torch
from torch.nn.attention.flex_attention import flex_attention

torch.manual_seed(0)
B, H, L, S, D = 1, 2, 4, 6, 8
q, k, v = torch.randn(B, H, L, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
bias = torch.randn(B, 1, L, S)  # one bias for every head
comma = "--comma" in sys.argv[1:]


def score_mod(score, b, h, q_idx, kv_idx):
    if comma:
        return score + bias[b, 0, q_idx, kv_idx]
    return score + bias[b][0][q_idx][kv_idx]  # the chained form: the compiled kernel crashes


try:
    compiled = torch.compile(flex_attention)(q, k, v, score_mod=score_mod)
except RuntimeError as error:
    if "index out of bounds" not in str(error):
        raise
    print("compiled kernel indexed out of bounds:", str(error).splitlines()[-1])
    sys.exit(3)
eager = flex_attention(q, k, v, score_mod=score_mod)
print("compiled vs eager: max diff", (compiled - eager).abs().max().item())
sys.exit(0)
