"""transformers' sdpa attention silently ignores ``s_aux`` (gpt-oss's attention sinks).

gpt-oss's attention layer calls whichever attention function its config names with
``s_aux=self.sinks``. The eager function adds each head's sink logit to every row's softmax
denominator; ``sdpa_attention_forward`` accepts the keyword and drops it: no error, no warning,
and the output is the one without sinks. A gpt-oss model run with
``attn_implementation="sdpa"`` therefore computes a different attention than it was trained
with. Runs on CPU with torch and transformers alone (measured with transformers 5.24, torch
2.13). Exit status 0: the sinks are dropped (the bug reproduces); 1: sdpa applies them.
"""

import sys
import types

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

torch.manual_seed(0)
B, H, L, D = 1, 2, 4, 8
q, k, v = (torch.randn(B, H, L, D) for _ in range(3))
sinks = torch.tensor([2.0, -1.0])  # one sink logit per head, as GptOssAttention.sinks
module = types.SimpleNamespace(num_key_value_groups=1, training=False, is_causal=False,
                               sinks=sinks)
mask = torch.zeros(B, 1, L, L)  # the eager float mask: every key allowed

eager, _ = eager_attention_forward(module, q, k, v, mask, scaling=D**-0.5, s_aux=sinks)
sdpa, _ = sdpa_attention_forward(module, q, k, v, None, scaling=D**-0.5, s_aux=sinks)
no_sink, _ = sdpa_attention_forward(module, q, k, v, None, scaling=D**-0.5)

print("eager (with sinks) vs sdpa (s_aux passed): max diff", (eager - sdpa).abs().max().item())
print("sdpa with s_aux vs sdpa without:          max diff", (sdpa - no_sink).abs().max().item())
dropped = torch.equal(sdpa, no_sink) and not torch.allclose(eager, sdpa, atol=1e-4)
print("s_aux is silently dropped by sdpa" if dropped else "sdpa applies s_aux")
sys.exit(0 if dropped else 1)
