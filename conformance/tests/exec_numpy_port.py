"""An ``--exec`` port for the tests: impl_numpy behind the line protocol (PORTING.md, "Any
language: --exec"), run as its own process: ``python conformance/tests/exec_numpy_port.py``.

For the crash and timeout tests, ``EXEC_TEST_CRASH`` (a glob over run ids) makes the process
kill itself with SIGSEGV in those runs, and ``EXEC_TEST_HANG`` makes it stop answering; with
``EXEC_TEST_FORGET_CACHE`` set, a decode step does not keep its cache (a broken port: every
step after the first attends to an empty cache).
"""

from __future__ import annotations

import fnmatch
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import impl_numpy
from attention_spec import AttentionError
from conformance.fixtures import decode_keywords, read_tensors, tensor_bytes

FUNCTIONS = {
    "sdpa": (impl_numpy.scaled_dot_product_attention, ("query", "key", "value"), "output"),
    "weights": (impl_numpy.attention_weights, ("query", "key"), "weights"),
    "causal_mask": (impl_numpy.causal_mask, ("q_len", "kv_len"), "mask"),
}


#: The modules and caches of the run in progress, by handle (a new run may drop them).
HANDLES: dict[int, Any] = {}
RUN: list[str] = [""]


def answer(request: dict) -> dict:
    run = request.get("run") or ""
    if fnmatch.fnmatchcase(run, os.environ.get("EXEC_TEST_CRASH", "-")):
        os.kill(os.getpid(), signal.SIGSEGV)
    if fnmatch.fnmatchcase(run, os.environ.get("EXEC_TEST_HANG", "-")):
        time.sleep(3600)
    if run != RUN[0]:
        HANDLES.clear()
        RUN[0] = run
    named = decode_keywords(request["keywords"])
    if "inputs" in request:
        named |= read_tensors(Path(request["inputs"]).read_bytes())
    named |= {name: None for name in request["null_inputs"]}
    try:
        if request["function"] in ("module", "decode"):
            out = module_request(request, named)
        else:
            fn, positional, result = FUNCTIONS[request["function"]]
            out = {result: fn(*[named.pop(name) for name in positional], **named)}
    except AttentionError as exc:
        return {"error": {"class": type(exc).__name__, "code": exc.code, "message": str(exc)}}
    if isinstance(out, int):
        return {"handle": out}
    Path(request["output"]).write_bytes(tensor_bytes(out, run))
    return {"output": request["output"]}


def module_request(request: dict, named: dict) -> dict | int:
    """A module or decode request: a new handle, or the output tensors by name."""
    method = request["method"]
    if method in ("construct", "load", "init_cache"):
        if method == "construct":
            made = getattr(impl_numpy, request["class"])(**named)
        elif method == "load":
            weights = {k: v for k, v in named.items() if isinstance(v, np.ndarray)}
            keywords = {k: v for k, v in named.items() if k not in weights}
            made = getattr(impl_numpy, request["class"]).from_canonical(weights, **keywords)
        else:
            made = HANDLES[request["module"]].init_cache(**named)
        HANDLES[len(HANDLES) + 1] = made
        return len(HANDLES)
    module = HANDLES[request["module"]]
    if method == "forward":
        x, context = named.pop("x"), named.pop("context")  # no context: self-attention (MLA)
        result = module(x, **named) if context is None else module(x, context, **named)
    else:  # step
        *result, cache = module.decode(named.pop("x"), HANDLES[request["cache"]], **named)
        if not os.environ.get("EXEC_TEST_FORGET_CACHE"):
            HANDLES[request["cache"]] = cache
        result = tuple(result) if len(result) > 1 else result[0]
    output, weights = result if named.get("return_weights") else (result, None)
    return {"output": output} | ({} if weights is None else {"weights": weights})


def main() -> None:
    functions = [*FUNCTIONS, "module", "decode"]
    print(json.dumps({"protocol": 1, "functions": functions}), flush=True)
    for line in sys.stdin:
        print(json.dumps(answer(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
