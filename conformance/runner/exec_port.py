"""A port in any language: an executable the runner drives over a line protocol
(``python -m conformance --exec "CMD ARGS"``; the protocol is in conformance/PORTING.md, "Any
language: --exec").

:class:`ExecPort` is the port object: for each function alias the process declares, an attribute
named as SEMANTICS.md names the function, which writes its array arguments to a safetensors
file, sends one JSON line, reads one back, and returns the result as NumPy, raises the error the
process answered (an exception of that class name with its ``.code``), or fails the run as not
implemented. So the rest of the runner (xfails, ``--list``, ``-k``, ``--function``, the tables,
``--report``) treats it as any Python port.

A process that dies in a run ends the worker process the same way (the same signal, or the same
exit status), so the isolation reports that run as ``crash`` and carries on in a fresh worker,
with a fresh process, retrying the run once as for any port (in ``--in-process`` mode the run
fails instead). A process that answers nothing within the timeout (``--exec-timeout``, default
:data:`DEFAULT_TIMEOUT` seconds per run) is stopped, the run fails as timed out, and the next run
starts a fresh process.
"""

from __future__ import annotations

import atexit
import faulthandler
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from conformance.fixtures import encode_keywords, read_tensors, tensor_bytes
from conformance.runner.failures import _Failed

__all__ = [
    "DEFAULT_TIMEOUT",
    "EXEC_ALIASES",
    "EXEC_MODULE_ALIASES",
    "EXEC_MODULE_CLASSES",
    "EXEC_PREFIX",
    "HELLO_TIMEOUT",
    "PROTOCOL",
    "ExecPort",
]

#: The protocol's version: the first line a process writes names it.
PROTOCOL = 1
#: ``--exec CMD`` is the port named ``exec:CMD`` (what ``load_port`` and the reports see).
EXEC_PREFIX = "exec:"
#: Seconds a process may take to answer one request, unless ``ROSETTA_EXEC_TIMEOUT`` (set by
#: ``--exec-timeout``) says otherwise.
DEFAULT_TIMEOUT = 60.0
#: Seconds a process may take to start and say hello, whatever the request timeout: starting an
#: interpreter and importing its arrays on a loaded machine is not a request (a 1.5 s request
#: timeout made a Python port's start time out under a parallel test run).
HELLO_TIMEOUT = 60.0

#: The aliases the protocol carries: alias -> (the port attribute, the positional array
#: arguments in order, the result tensors the process writes, in the order they are returned).
EXEC_ALIASES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "sdpa": ("scaled_dot_product_attention", ("query", "key", "value"), ("output",)),
    "weights": ("attention_weights", ("query", "key"), ("weights",)),
    "causal_mask": ("causal_mask", ("q_len", "kv_len"), ("mask",)),
    "flash": ("flash_attention", ("query", "key", "value"), ("output",)),
    "rope": ("apply_rotary", ("x", "positions"), ("output",)),
    "grad": (
        "scaled_dot_product_attention_vjp",
        ("query", "key", "value", "grad_output"),
        ("dq", "dk", "dv", "dbias", "dsinks"),
    ),
    "flash_grad": (
        "flash_attention_vjp",
        ("query", "key", "value", "grad_output"),
        ("dq", "dk", "dv", "dbias", "dsinks"),
    ),
}
#: Aliases whose positional arguments are numbers (sent among the keywords), not arrays.
_SCALAR_ARGUMENTS = {"causal_mask"}
#: The module aliases: the process holds modules and caches between requests, by handle.
#: ``module`` gives the classes (``construct``, ``load``, ``forward``); ``decode`` adds
#: ``init_cache`` and ``step`` (and needs ``module``: its modules are loaded the same way).
EXEC_MODULE_ALIASES: tuple[str, ...] = ("module", "decode")
#: The module classes a case may name (``module.class`` in the manifest).
EXEC_MODULE_CLASSES: tuple[str, ...] = (
    "MultiHeadAttention",
    "GroupedQueryAttention",
    "MultiHeadLatentAttention",
)


class ExecError(Exception):
    """The base of the errors a process answers: one subclass per class name it gives (so the
    runner's check of the class name and ``.code`` applies as to a Python port's error)."""

    code: str | None = None


_ERROR_CLASSES: dict[str, type[ExecError]] = {}


def _error(answer: Any) -> ExecError:
    """The exception of an ``{"error": {"class", "code", "message"}}`` answer."""
    if not isinstance(answer, dict) or not isinstance(answer.get("class"), str):
        raise _Failed(f"the port answered a malformed error {answer!r} (want class and code)")
    name = answer["class"]
    if not name.isidentifier():
        raise _Failed(f"the port answered an error class {name!r} that is not a name")
    if name not in _ERROR_CLASSES:
        _ERROR_CLASSES[name] = type(name, (ExecError,), {"__module__": "port"})
    exc = _ERROR_CLASSES[name](str(answer.get("message", "")))
    exc.code = answer.get("code")
    return exc


class _Died(Exception):
    def __init__(self, returncode: int) -> None:
        super().__init__(returncode)
        self.returncode = returncode


class _TimedOut(Exception):
    pass


def _died_how(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def _in_worker() -> bool:
    """Whether this is the runner's isolated child (conformance/worker.py), which may die."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "conformance.worker"


class _Process:
    """One running port process: requests in on its stdin, answers on its stdout (one JSON line
    each); its stderr is this process's."""

    def __init__(self, argv: list[str], timeout: float) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.buffer = b""
        self.hello = self.read(timeout)

    def read(self, timeout: float) -> dict[str, Any]:
        """The next line, as JSON; raises _Died at EOF and _TimedOut after ``timeout``."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _TimedOut()
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise _Died(self.proc.wait())
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError:
            raise _Failed(f"the port wrote a line that is not JSON: {line[:200]!r}") from None
        if not isinstance(message, dict):
            raise _Failed(f"the port wrote {line[:200]!r}, not a JSON object")
        return message

    def request(self, message: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise _Died(self.proc.wait()) from None
        return self.read(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # end of requests: a port exits
                self.proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class ExecPort:
    """The port object of ``--exec CMD``: the functions the process declares in its hello line
    (``{"protocol": 1, "functions": [aliases]}``), each sending one request per call."""

    def __init__(self, command: str, timeout: float | None = None) -> None:
        self.command = command
        self.argv = shlex.split(command)
        if not self.argv:
            raise ValueError("--exec needs a command")
        self.__name__ = EXEC_PREFIX + command
        script = next((a for a in self.argv[1:] if Path(a).is_file()), None)
        if script is None and Path(self.argv[0]).is_file():
            script = self.argv[0]
        if script is not None:  # the xfails file is <script>.xfails, next to it
            self.__file__ = str(Path(script).resolve())
        if timeout is None:
            timeout = float(os.environ.get("ROSETTA_EXEC_TIMEOUT", DEFAULT_TIMEOUT))
        self.timeout = timeout
        self.run_id: str | None = None
        self._process: _Process | None = None
        self._folder = tempfile.mkdtemp(prefix="conformance-exec-")
        self._count = 0
        atexit.register(self.close)
        hello = self._started().hello
        if hello.get("protocol") != PROTOCOL:
            raise RuntimeError(f"{command}: the first line must be {{'protocol': {PROTOCOL}, ...}}")
        functions = set(hello.get("functions", []))
        unknown = sorted(functions - set(EXEC_ALIASES) - set(EXEC_MODULE_ALIASES))
        if unknown:
            raise RuntimeError(f"{command}: declares functions the protocol lacks: {unknown}")
        if "decode" in functions and "module" not in functions:
            raise RuntimeError(f"{command}: declares decode without module (decode's modules "
                               "are loaded through module's requests)")
        for alias in functions & set(EXEC_ALIASES):
            setattr(self, EXEC_ALIASES[alias][0], self._function(alias))
        if "module" in functions:
            for name in EXEC_MODULE_CLASSES:
                setattr(self, name, _module_class(self, name, decode="decode" in functions))

    def begin_run(self, run_id: str) -> None:
        """Called by the runner before each run: the id goes into the requests."""
        self.run_id = run_id

    def close(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None
        shutil.rmtree(self._folder, ignore_errors=True)

    def _started(self) -> _Process:
        if self._process is None:
            try:
                self._process = _Process(self.argv, max(self.timeout, HELLO_TIMEOUT))
            except _TimedOut:
                wait = max(self.timeout, HELLO_TIMEOUT)
                raise RuntimeError(f"{self.command}: no hello line in {wait:g} s") from None
            except _Died as died:
                raise RuntimeError(
                    f"{self.command}: ended before its hello line ({_died_how(died.returncode)})"
                ) from None
        return self._process

    def _function(self, alias: str):
        attribute, positional, results = EXEC_ALIASES[alias]

        def call(*args: Any, **keywords: Any) -> Any:
            named = dict(zip(positional, args)) | keywords
            return self._call(alias, named, results)

        call.__name__ = attribute
        return call

    def _call(self, alias: str, named: dict[str, Any], results: tuple[str, ...]) -> Any:
        """One function alias's request: ``named`` are its arguments, by name."""
        positional = EXEC_ALIASES[alias][1]
        null = [k for k, v in named.items() if v is None and k in positional]
        answer = self._send({"function": alias}, named, null, inputs=alias not in _SCALAR_ARGUMENTS)
        return self._results(answer, results[0], results)

    def _send(
        self,
        request: dict[str, Any],
        named: dict[str, Any],
        null: list[str],
        inputs: bool = True,
        output: bool = True,
    ) -> dict[str, Any]:
        """Send ``request`` with ``named``'s arrays in an inputs file (when ``inputs`` or when
        there are any), the names in ``null`` as null inputs, and the rest as its keywords; the
        answer, once it is neither an error (raised as the port's) nor "unsupported"."""
        self._count += 1
        stem = os.path.join(self._folder, f"{self._count}")
        arrays = {k: v for k, v in named.items() if isinstance(v, np.ndarray)}
        keywords = {k: v for k, v in named.items() if k not in arrays and k not in null}
        request = {"run": self.run_id, **request}
        if arrays or inputs:
            request["inputs"] = stem + ".in.safetensors"
            Path(request["inputs"]).write_bytes(tensor_bytes(arrays, self.run_id or "inputs"))
        request["null_inputs"] = null
        request["keywords"] = encode_keywords(keywords)
        if output:
            request["output"] = stem + ".out.safetensors"
        try:
            answer = self._exchange(request)
        finally:
            Path(stem + ".in.safetensors").unlink(missing_ok=True)
        if "error" in answer:
            raise _error(answer["error"])
        if "unsupported" in answer:
            raise _Failed(f"not implemented by the port: {answer['unsupported']}")
        return answer

    def _handle(self, request: dict[str, Any], named: dict[str, Any]) -> int:
        """A request that makes a module or a cache: the handle the process answers."""
        return self._handle_of(self._send(request, named, [], inputs=False, output=False))

    def _handle_of(self, answer: dict[str, Any]) -> int:
        handle = answer.get("handle")
        if not isinstance(handle, int) or isinstance(handle, bool):
            raise _Failed(f"the port answered {json.dumps(answer)[:200]}: no integer handle, "
                          "error or unsupported")
        return handle

    def _results(self, answer: dict[str, Any], first: str, results: tuple[str, ...]) -> Any:
        """The tensors ``results`` of an ``{"output": PATH}`` answer: one array when there is
        one name, else a tuple with None where the file lacks one (but ``first`` is needed)."""
        if "output" not in answer:
            raise _Failed(f"the port answered {json.dumps(answer)[:200]}: no output, error or "
                          "unsupported")
        path = Path(answer["output"])
        try:
            tensors = read_tensors(path.read_bytes())
        except Exception as exc:
            raise _Failed(f"the port's output file {path} cannot be read: {exc}") from None
        finally:
            path.unlink(missing_ok=True)
        if first not in tensors:
            raise _Failed(f"the port's output file has no tensor {first!r}")
        if len(results) == 1:
            return tensors[first]
        return tuple(tensors.get(name) for name in results)  # gradients: None where absent

    def _exchange(self, request: dict[str, Any]) -> dict[str, Any]:
        process = self._started()
        try:
            return process.request(request, self.timeout)
        except _TimedOut:
            process.proc.kill()
            process.proc.wait()
            self._process = None
            raise _Failed(
                f"timed out after {self.timeout:g} s: the port's process was stopped, and the "
                "next run starts a fresh one"
            ) from None
        except _Died as died:
            self._process = None
            how = _died_how(died.returncode)
            if not _in_worker():
                raise _Failed(f"crashed ({how}): the port's process died; the next run starts "
                              "a fresh one") from None
            self._die_as(died.returncode, how)

    def _die_as(self, returncode: int, how: str) -> None:
        """End this worker as the port's process ended, so the isolation blames the run."""
        print(f"conformance --exec: the port's process died ({how}) in {self.run_id}",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        faulthandler.disable()  # no Python stack: the crash is the port's, not the runner's
        shutil.rmtree(self._folder, ignore_errors=True)
        if returncode < 0:
            signal.signal(-returncode, signal.SIG_DFL)
            os.kill(os.getpid(), -returncode)
        os._exit(returncode if returncode > 0 else 1)


def _module_class(port: ExecPort, name: str, decode: bool) -> type:
    """The port's class ``name``: a stand-in whose instances are handles to modules in the
    process, with ``from_canonical`` and ``__call__`` (and ``init_cache`` and ``decode`` when
    the process declares ``decode``), each one request."""

    def __init__(self: Any, **arguments: Any) -> None:
        """``cls(**arguments)``: the ``construct`` request (the module error cases' call)."""
        request = {"function": "module", "method": "construct", "class": name}
        self.handle = port._handle(request, arguments)

    def from_canonical(cls: type, weights: dict[str, np.ndarray], **keywords: Any) -> Any:
        """``cls.from_canonical(weights, n_heads=, ...)``: the ``load`` request, the canonical
        weights in its inputs file."""
        module = cls.__new__(cls)
        request = {"function": "module", "method": "load", "class": name}
        answer = port._send(request, dict(weights) | keywords, [], output=False)
        module.handle = port._handle_of(answer)
        return module

    def __call__(self: Any, x: np.ndarray, context: np.ndarray | None = None, **keywords: Any):
        """``module(x, context, **keywords)``: the ``forward`` request; ``(output, weights)``
        when ``return_weights``."""
        request = {"function": "module", "method": "forward", "module": self.handle}
        named = {"x": x, "context": context} | keywords
        answer = port._send(request, named, ["context"] if context is None else [])
        return _module_result(port, answer, keywords)

    def init_cache(self: Any, batch_size: int, max_len: int, **keywords: Any) -> _ExecCache:
        """``module.init_cache(batch_size, max_len, **keywords)``: the ``init_cache`` request;
        the cache is a handle too."""
        request = {"function": "decode", "method": "init_cache", "module": self.handle}
        named = {"batch_size": batch_size, "max_len": max_len} | keywords
        return _ExecCache(port._handle(request, named))

    def decode_step(self: Any, x: np.ndarray, cache: Any, **keywords: Any) -> tuple:
        """``module.decode(x, cache, **keywords)``: the ``step`` request; the process updates
        the cache it holds, so the same handle comes back: ``(y, cache)`` or ``(y, weights,
        cache)``."""
        if not isinstance(cache, _ExecCache):
            raise _Failed(f"decode was given {type(cache).__name__}, not this port's cache")
        request = {"function": "decode", "method": "step", "module": self.handle}
        request["cache"] = cache.handle
        answer = port._send(request, {"x": x} | keywords, [])
        result = _module_result(port, answer, keywords)
        return (*result, cache) if isinstance(result, tuple) else (result, cache)

    methods: dict[str, Any] = {
        "__init__": __init__,
        "from_canonical": classmethod(from_canonical),
        "__call__": __call__,
        "__module__": "port",
    }
    if decode:
        methods |= {"init_cache": init_cache, "decode": decode_step}
    return type(name, (), methods)


def _module_result(port: ExecPort, answer: dict[str, Any], keywords: dict[str, Any]) -> Any:
    """``output``, or ``(output, weights)`` when the call asked for ``return_weights``."""
    if keywords.get("return_weights"):
        output, weights = port._results(answer, "output", ("output", "weights"))
        if weights is None:
            raise _Failed("return_weights=True, but the port's output file has no 'weights'")
        return output, weights
    return port._results(answer, "output", ("output",))


class _ExecCache:
    """A key/value cache held by the port's process: its handle."""

    def __init__(self, handle: int) -> None:
        self.handle = handle
