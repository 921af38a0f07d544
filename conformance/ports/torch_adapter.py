"""NumPy <-> torch for conformance: the adapter functions of any torch port.

``impl_torch`` gets these through :data:`conformance.ports.BUILTIN_ADAPTERS`; a torch port of
your own can import them (``from conformance.ports.torch_adapter import from_numpy, to_numpy``).
NumPy has no native bfloat16 (it comes from ``ml_dtypes``) and ``torch.from_numpy`` does not
take it, so bfloat16 goes through float32, which is exact in both directions. Nor does it take
the fp8 formats (contract v3): they go through their bytes, a ``uint8`` view on either side.

:func:`prepare` runs a sharded function (one that takes ``n_shards``: ``ring_attention``,
``head_parallel_attention``, ``head_parallel_gqa``, ``ulysses_attention``; or the group sizes
``ulysses_shards`` and ``ring_shards``: ``usp_attention``, on their product of ranks, which it
splits into its own sub-groups) the way ``torch.distributed`` code runs: on n processes at
once, one per rank. Outside a process group it forks n ranks for each call
(gloo; they meet through a file store in a temporary folder, which needs no server thread here:
a thread that holds a lock at the moment of a fork, say the resolver's, leaves the child unable
ever to take it), each rank calls the function with the same arguments, and every rank's
result comes back; they must be equal (every rank returns the whole output), and rank 0's is
the call's result. A call that raises in a rank raises here; a rank that dies or hangs (past
:data:`RANK_TIMEOUT`) is a :class:`RankError`. Forking needs no new interpreter, so a call
costs about 0.1 s (2 ranks) to 0.2 s (4) on a loaded 2-core machine. Inside a process group
already (``torchrun``), or with a size that is not a positive integer (the function's own
error says so), the function is called as it is, and the group must have n ranks.
"""

from __future__ import annotations

import inspect
import math
import os
import pickle
import select
import signal
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import ml_dtypes
import numpy as np
import torch

__all__ = ["from_numpy", "on_ranks", "prepare", "to_numpy"]


#: The fp8 formats (contract v3), by name: NumPy's ``ml_dtypes`` dtype -> torch's.
FP8_TORCH: dict[str, torch.dtype] = {
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}


def from_numpy(array: np.ndarray, device: str = "cpu") -> torch.Tensor:
    """A torch tensor on ``device`` ("cpu", "cuda", "cuda:1", ...) equal to ``array``."""
    array = np.asarray(array)
    if array.dtype.name in FP8_TORCH:  # the bytes as uint8, viewed as the torch fp8 dtype
        tensor = torch.from_numpy(np.array(array).view(np.uint8)).view(FP8_TORCH[array.dtype.name])
    elif array.dtype == ml_dtypes.bfloat16:
        tensor = torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    else:
        tensor = torch.from_numpy(np.array(array))  # a writable, contiguous copy
    return tensor.to(device)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """The tensor as a NumPy array of the same dtype (bfloat16 as ``ml_dtypes.bfloat16``)."""
    tensor = tensor.detach().cpu()
    for name, dtype in FP8_TORCH.items():
        if tensor.dtype == dtype:
            return tensor.view(torch.uint8).numpy().view(getattr(ml_dtypes, name))
    if tensor.dtype == torch.bfloat16:
        return tensor.float().numpy().astype(ml_dtypes.bfloat16)
    return tensor.numpy()


#: The keywords whose product is a sharded function's number of ranks, by the function's kind:
#: ``n_shards`` (ring, head-parallel, Ulysses), or USP's two group sizes.
SIZE_KEYWORDS: tuple[tuple[str, ...], ...] = (("n_shards",), ("ulysses_shards", "ring_shards"))


def prepare(alias: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """A sharded function (it takes the keywords of one of :data:`SIZE_KEYWORDS`) as
    :func:`on_ranks`; any other as it is."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return function
    for sizes in SIZE_KEYWORDS:
        if all(name in parameters for name in sizes):
            return on_ranks(function, sizes)
    return function


#: Seconds a rank waits for the others (rendezvous, collectives) before it gives up; a call
#: whose ranks have not all answered some seconds after that is stopped.
RANK_TIMEOUT = 60


class RankError(RuntimeError):
    """A rank died, or raised something that could not be sent back as it was."""


def on_ranks(
    function: Callable[..., Any], sizes: tuple[str, ...] = ("n_shards",)
) -> Callable[..., Any]:
    """``function(*args, **kwargs)`` on n gloo ranks, n the product of the keywords ``sizes``
    (``n_shards=n``; USP: ``ulysses_shards * ring_shards``); rank 0's result."""

    def call(*args: Any, **kwargs: Any) -> Any:
        import torch.distributed as dist

        given = [kwargs.get(name) for name in sizes]
        ok = all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in given)
        if dist.is_initialized() or not ok:  # torchrun's group, or a bad size for it to refuse
            return function(*args, **kwargs)
        results = _fork_ranks(function, args, kwargs, math.prod(given))
        for rank, result in enumerate(results[1:], 1):
            if not _same(results[0], result):
                raise RankError(f"rank {rank} returned another output than rank 0")
        return results[0]

    call.__signature__ = inspect.signature(function)  # the runner reads its parameters
    call.__wrapped__ = function
    return call


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.isnan(), b.isnan()) and (
            torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
        )
    return type(a) is type(b)


def _fork_ranks(function, args, kwargs, n: int) -> list[Any]:
    """Fork n processes that join one gloo group and call ``function``; their results."""
    with tempfile.TemporaryDirectory(prefix="ranks") as folder:
        store = os.path.join(folder, "store")
        readers, pids = {}, []
        for rank in range(n):
            read, write = os.pipe()
            with warnings.catch_warnings():  # JAX, if imported, warns that it does not fork
                warnings.simplefilter("ignore", RuntimeWarning)
                pid = os.fork()
            if pid == 0:  # the rank
                os.close(read)
                _rank_main(function, args, kwargs, n, rank, store, write)
            os.close(write)
            readers[read] = rank
            pids.append(pid)
        answers = _read_all(readers, time.monotonic() + RANK_TIMEOUT + 15)
        hung = [r for fd, r in readers.items() if fd not in answers]
        for rank in hung:
            os.kill(pids[rank], signal.SIGKILL)
        statuses = [os.waitpid(pid, 0)[1] for pid in pids]
    if hung:
        raise RankError(f"rank {hung[0]} of {n} did not answer in {RANK_TIMEOUT + 15} s")
    results = []
    for fd, rank in readers.items():
        if not answers[fd]:
            raise RankError(f"rank {rank} of {n} died ({_status(statuses[rank])}) unanswered")
        results.append(pickle.loads(answers[fd]))
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def _read_all(readers: dict[int, int], deadline: float) -> dict[int, bytes]:
    """Everything each pipe of ``readers`` gives until it closes, or until ``deadline``."""
    chunks: dict[int, list[bytes]] = {fd: [] for fd in readers}
    done: dict[int, bytes] = {}
    while len(done) < len(readers) and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd for fd in readers if fd not in done], [], [], left)
        for fd in ready:
            data = os.read(fd, 1 << 20)
            if data:
                chunks[fd].append(data)
            else:
                done[fd] = b"".join(chunks[fd])
    for fd in readers:
        os.close(fd)
    return done


def _rank_main(function, args, kwargs, n, rank, store, write) -> None:
    """One rank: join the group, call, send the result (or the exception); never returns."""
    code = 0
    pipe = os.fdopen(write, "wb")
    try:
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"file://{store}", rank=rank, world_size=n,
            timeout=timedelta(seconds=RANK_TIMEOUT),
        )
        # Every rank past its handshake before any rank may finish: a rank whose call needs no
        # message (a wrong port, a shape error) would otherwise exit while a slower rank is
        # still connecting to it ("Connection closed by peer" in connectFullMesh).
        dist.barrier()
        try:
            result: Any = function(*args, **kwargs)
        except Exception as exc:  # the port's error is the answer
            result = exc if hasattr(exc, "code") else _located(exc, rank)
        finally:
            dist.destroy_process_group()
        try:
            data = pickle.dumps(result)
        except Exception:  # an exception that does not pickle: its class and message
            data = pickle.dumps(_located(result, rank))
    except BaseException:  # joining the group failed: say how
        data = pickle.dumps(RankError(f"rank {rank} of {n}: {traceback.format_exc()[-1500:]}"))
        code = 1
    try:
        pipe.write(data)
        pipe.close()
    finally:
        os._exit(code)


def _located(exc: BaseException, rank: int) -> RankError:
    """``exc`` as text, with the rank and the line that raised it (the traceback stays here)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    if frames:
        last = frames[-1]
        where = f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})"
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[0]
    return RankError(f"rank {rank}: {text}{where}")


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name
    return f"exit status {os.WEXITSTATUS(status)}"
