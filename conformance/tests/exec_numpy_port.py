"""An ``--exec`` port for the tests: impl_numpy behind the line protocol (PORTING.md, "Any
language: --exec"), run as its own process: ``python conformance/tests/exec_numpy_port.py``.

For the crash and timeout tests, ``EXEC_TEST_CRASH`` (a glob over run ids) makes the process
kill itself with SIGSEGV in those runs, and ``EXEC_TEST_HANG`` makes it stop answering.
"""

from __future__ import annotations

import fnmatch
import json
import os
import signal
import sys
import time
from pathlib import Path

import impl_numpy
from attention_spec import AttentionError
from conformance.fixtures import decode_keywords, read_tensors, tensor_bytes

FUNCTIONS = {
    "sdpa": (impl_numpy.scaled_dot_product_attention, ("query", "key", "value"), "output"),
    "weights": (impl_numpy.attention_weights, ("query", "key"), "weights"),
    "causal_mask": (impl_numpy.causal_mask, ("q_len", "kv_len"), "mask"),
}


def answer(request: dict) -> dict:
    run = request.get("run") or ""
    if fnmatch.fnmatchcase(run, os.environ.get("EXEC_TEST_CRASH", "-")):
        os.kill(os.getpid(), signal.SIGSEGV)
    if fnmatch.fnmatchcase(run, os.environ.get("EXEC_TEST_HANG", "-")):
        time.sleep(3600)
    fn, positional, result = FUNCTIONS[request["function"]]
    named = decode_keywords(request["keywords"])
    if "inputs" in request:
        named |= read_tensors(Path(request["inputs"]).read_bytes())
    named |= {name: None for name in request["null_inputs"]}
    args = [named.pop(name) for name in positional]
    try:
        out = fn(*args, **named)
    except AttentionError as exc:
        return {"error": {"class": type(exc).__name__, "code": exc.code, "message": str(exc)}}
    Path(request["output"]).write_bytes(tensor_bytes({result: out}, run))
    return {"output": request["output"]}


def main() -> None:
    print(json.dumps({"protocol": 1, "functions": list(FUNCTIONS)}), flush=True)
    for line in sys.stdin:
        print(json.dumps(answer(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
