"""transformers' eager and sdpa attention functions ignore their ``sliding_window`` argument.

Mistral, Gemma 2, gpt-oss and other sliding-window layers pass ``sliding_window=...`` to the
attention function of their config, next to the mask. The eager function
(``LlamaForCausalLM``'s, which Mistral copies) and ``sdpa_attention_forward`` take the keyword
and do nothing with it: only the mask (``masking_utils.create_sliding_window_causal_mask``)
carries the window. Any caller that hands these functions a plain causal mask and relies on
``sliding_window`` gets full causal attention. Runs on CPU with torch and transformers alone
(measured with transformers 5.24, torch 2.13). Exit status 0: the keyword is ignored by both
(reproduces); 1: at least one of them applies it.
"""

import sys
import types

import torch
from transformers import masking_utils as mu
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import eager_attention_forward

torch.manual_seed(0)
B, H, L, D, W = 1, 2, 6, 8, 2
q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
module = types.SimpleNamespace(num_key_value_groups=1, training=False, is_causal=True)
causal = mu.eager_mask(batch_size=B, q_length=L, kv_length=L)  # float: 0 or finfo.min
windowed = mu.eager_mask(batch_size=B, q_length=L, kv_length=L,
                         mask_function=mu.sliding_window_causal_mask_function(W))

ignored = []
for name, function, mask in (
    ("eager", eager_attention_forward, causal),
    ("sdpa", sdpa_attention_forward, causal.eq(0)),  # sdpa takes the boolean form
):
    full, _ = function(module, q, k, v, mask, scaling=D**-0.5)
    keyword, _ = function(module, q, k, v, mask, scaling=D**-0.5, sliding_window=W)
    window_mask = windowed if name == "eager" else windowed.eq(0)
    want, _ = function(module, q, k, v, window_mask, scaling=D**-0.5)
    print(f"{name}: sliding_window={W} changes the output by {(keyword - full).abs().max():.3g};"
          f" the windowed mask by {(want - full).abs().max():.3g}")
    ignored.append(torch.equal(keyword, full) and not torch.allclose(want, full))
print("sliding_window is ignored by both" if all(ignored) else "sliding_window is applied")
sys.exit(0 if all(ignored) else 1)
