"""``torch.compile(flex_attention)``, ``dynamic=None``, fails to build a second shape on CPU.

transformers compiles FlexAttention once per process with torch's defaults
(``integrations/flex_attention.py``: ``torch.compile(flex_attention)``), so a model run with
``attn_implementation="flex_attention"`` on CPU sees this: the first shape compiles with static
sizes; the second makes dynamo recompile the frame with dynamic sizes, and inductor's C++ flex
template for that graph does not compile when the ``score_mod`` reads a captured tensor (a
bias, as ``position_bias`` or ALiBi are): ``CppCompileError`` with ``error: 'cur_qSplitSize5'
was not declared in this scope`` (and more undeclared names) in the generated ``.cpp``. The same
two shapes compile under ``dynamic=False``, so the failure is the dynamic-shape kernel's, not
the shapes'; the dynamic one builds too when the tensor is bound as a default argument of the
``score_mod`` instead of captured by its closure (measured). The conformance port ``hf_flex``
resets dynamo before every call for this reason (docs/CONFORMANCE.md, "Hugging Face, flex").
Runs on CPU with torch alone and a C++ compiler (measured with torch 2.13.0, gcc 12). Exit
status 0: the dynamic recompile fails and the static one builds (the bug reproduces); 1: it
does not.
"""

import sys

import torch
from torch.nn.attention.flex_attention import flex_attention

SHAPES = [(1, 2, 4, 6, 8), (1, 4, 3, 9, 16)]  # (B, H, L, S, D): the second forces a recompile


def adding(bias: torch.Tensor):
    """A ``score_mod`` that adds the captured ``bias (B, H, L, S)``, as a position bias does."""

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[b, h, q_idx, kv_idx]

    return score_mod


def second_shape_builds(compiled) -> bool:
    """Run both shapes through one compiled function; whether the second one built."""
    for B, H, L, S, D in SHAPES:
        q, k, v = torch.randn(B, H, L, D), torch.randn(B, H, S, D), torch.randn(B, H, S, D)
        bias = torch.randn(B, H, L, S)

        try:
            compiled(q, k, v, score_mod=adding(bias))
        except Exception as exc:  # torch._inductor.exc.InductorError wrapping CppCompileError
            print(f"{(B, H, L, S, D)}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            return False
        print(f"{(B, H, L, S, D)}: built")
    return True


torch.manual_seed(0)
print("torch.compile(flex_attention), as transformers does (dynamic=None):")
dynamic = second_shape_builds(torch.compile(flex_attention))
torch._dynamo.reset()
print("torch.compile(flex_attention, dynamic=False):")
static = second_shape_builds(torch.compile(flex_attention, dynamic=False))
sys.exit(0 if not dynamic and static else 1)
