"""After ``recompile_limit`` graphs, ``torch.compile(flex_attention)`` silently runs uncompiled.

Each new input shape (or ``score_mod``/``mask_mod``) is a new graph of flex_attention's
frame. Once the frame has ``torch._dynamo.config.recompile_limit`` graphs (8 by default; 1
here, so the script needs two compiles, not nine), the next call runs flex_attention eagerly:
the unfused reference path that materializes the whole score matrix. No error is raised; torch
logs one warning ("hit config.recompile_limit") and the call returns an answer, so a program
that meant to run the fused kernel cannot tell without reading the logs (or catching the
"called without torch.compile()" performance warning, which only the uncompiled body gives).
Runs on CPU with torch alone (measured with torch 2.13.0). Exit status 0: the call fell back
silently (the behaviour reproduces); 1: it was compiled, or refused loudly.
"""

import sys
import warnings

import torch
import torch._dynamo
from torch.nn.attention.flex_attention import flex_attention

torch._dynamo.config.recompile_limit = 1
compiled = torch.compile(flex_attention, dynamic=False)
for length in (4, 8):  # the second shape needs a second graph: over the limit of 1
    x = torch.randn(1, 2, length, 8)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled(x, x, x)
    except Exception as exc:  # refused loudly: not the silent fallback
        print(f"L={length}: raised {type(exc).__name__}: {exc}")
        sys.exit(1)
    eager = any("without torch.compile()" in str(w.message) for w in caught)
    print(f"L={length}: {'ran eagerly (silently)' if eager else 'compiled'}")
sys.exit(0 if eager else 1)
