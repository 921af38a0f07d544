"""Devices: which one to run on, where each framework's tensors live, and what the machine is.

A run resolves all of it once, :func:`resolve` -> :class:`Machine`: the device (``auto`` picks
``cuda`` when torch or JAX sees an NVIDIA GPU, then ``tpu`` when JAX sees one, else ``cpu``),
each framework's device (NumPy always runs on the host CPU) and its class, the memory each
framework may use, the run's float32 matmul precision (``--tf32``, set here) and the
environment a report records. The plan, the gates, the session and the report read its fields.
Everything here imports torch and JAX lazily, so a machine without one of them still gets a
report with that framework's rows marked "not available".
"""

from __future__ import annotations

import datetime as _dt
import functools
import importlib
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEVICES",
    "FRAMEWORKS",
    "JAX_MEM_FRACTION",
    "CpuSnapshot",
    "Machine",
    "configure_environment",
    "cpu_name",
    "cpu_snapshot",
    "environment",
    "float32_precision",
    "framework_device",
    "jax_platforms",
    "memory_budgets",
    "others_share",
    "peak_key",
    "resolve",
    "resolve_device",
    "set_tf32",
    "tf32_state",
    "torch_cuda_available",
]

#: The device classes the harness knows.
DEVICES: tuple[str, ...] = ("cpu", "cuda", "tpu")
#: The frameworks a run places, in the order its cases run.
FRAMEWORKS: tuple[str, ...] = ("numpy", "torch", "jax")
_JAX_PLATFORM = {"cpu": "cpu", "cuda": "gpu", "tpu": "tpu"}
#: The share of GPU memory XLA may use. With preallocation off XLA still stops at this fraction
#: (75% when unset), so it is set explicitly, and JAX rows are planned against XLA's own limit.
JAX_MEM_FRACTION = "0.90"


def peak_key(fdevice: str) -> str:
    """The device class a framework device belongs to (``gpu`` and ``cuda`` are one)."""
    return "cuda" if fdevice in ("cuda", "gpu") else fdevice


@dataclass(frozen=True)
class Machine:
    """What a run knows of its devices, resolved once (:func:`resolve`).

    Attributes:
        device: the run's device, ``cpu``, ``cuda`` or ``tpu``.
        fdevices: where each framework's tensors live (NumPy ``cpu``; torch ``cpu`` or
            ``cuda``; JAX ``cpu``, ``gpu`` or ``tpu``), None where it cannot run on ``device``.
        memory: what a workload may use, per framework (:func:`memory_budgets`); None: unknown.
        tf32: the run's ``--tf32`` (``default``, ``on``, ``off``), set in both frameworks.
        environment: what a report records of the machine (:func:`environment`).
        classes: each framework device's class (``gpu`` and ``cuda`` are one,
            :func:`peak_key`): the size of its peak matmul, the device its gates run on.
    """

    device: str
    fdevices: Mapping[str, str | None]
    memory: Mapping[str, int | None] = field(default_factory=dict)
    tf32: str = "default"
    environment: Mapping[str, Any] = field(default_factory=dict)
    classes: Mapping[str, str | None] = field(init=False)

    def __post_init__(self) -> None:
        classes = {fw: None if d is None else peak_key(d) for fw, d in self.fdevices.items()}
        object.__setattr__(self, "classes", classes)


def resolve(requested: str, *, tf32: str = "default") -> Machine:
    """The machine of a run on ``--device requested``: the device (:func:`resolve_device`),
    each framework's (:func:`framework_device`), their memory, the float32 matmul precision
    ``tf32`` set in torch and JAX (:func:`set_tf32`), then the environment as the rows will
    run in it. Raises ValueError for an unknown device, RuntimeError for one not present."""
    device = resolve_device(requested)
    fdevices = {fw: framework_device(fw, device) for fw in FRAMEWORKS}
    memory = memory_budgets(device)
    set_tf32(tf32)
    return Machine(device, fdevices, memory, tf32, environment(device))


def configure_environment(*, own_session: bool = True) -> dict[str, str | None]:
    """Set what must be set before JAX starts; returns the variables as they now are.

    - ``XLA_PYTHON_CLIENT_PREALLOCATE=false``: JAX would otherwise take 75% of a GPU that
      torch shares; ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (:data:`JAX_MEM_FRACTION`): the cap XLA
      still applies without preallocation. A value the user exported is kept.
    - ``own_session``: the benchmark is its own pytest session; started from inside a
      pytest-xdist worker (the project's end-to-end test is), it inherits
      ``PYTEST_XDIST_WORKER``, and pytest-benchmark then silently disables timing. Those
      variables are dropped.

    Called by ``main()`` (and, with ``own_session=False``, when ``bench_attention.py`` runs under
    plain pytest), never at import.
    """
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", JAX_MEM_FRACTION)
    if own_session:
        os.environ.pop("PYTEST_XDIST_WORKER", None)
        os.environ.pop("PYTEST_XDIST_WORKER_COUNT", None)
    names = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION")
    return {v: os.environ.get(v) for v in names}


def _try_import(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except Exception:  # a broken install is "not available", reported, never a crash
        return None


@functools.cache
def torch_cuda_available() -> bool:
    """True when torch is importable and sees a CUDA device."""
    torch = _try_import("torch")
    return bool(torch is not None and torch.cuda.is_available())


@functools.cache
def jax_platforms() -> frozenset[str]:
    """The platforms JAX can see (``cpu``, ``gpu``, ``tpu``); empty without JAX."""
    jax = _try_import("jax")
    if jax is None:
        return frozenset()
    found = set()
    for p in ("cpu", "gpu", "tpu"):
        try:
            if jax.devices(p):
                found.add(p)
        except RuntimeError:  # "Unknown backend" / no such platform
            pass
    return frozenset(found)


def resolve_device(
    requested: str, *, cuda: bool | None = None, platforms: frozenset[str] | None = None
) -> str:
    """``auto`` -> the best device found; anything else is checked and returned.

    ``cuda`` and ``platforms`` override detection (tests use them to stand in for a GPU box).
    Raises ValueError for an unknown name, RuntimeError when the device is not present.
    """
    if requested not in ("auto", *DEVICES):
        raise ValueError(f"--device must be one of auto, {', '.join(DEVICES)}; got {requested!r}")
    cuda = torch_cuda_available() if cuda is None else cuda
    platforms = jax_platforms() if platforms is None else platforms
    present = {"cpu": True, "cuda": cuda or "gpu" in platforms, "tpu": "tpu" in platforms}
    if requested == "auto":
        return "cuda" if present["cuda"] else "tpu" if present["tpu"] else "cpu"
    if not present[requested]:
        raise RuntimeError(
            f"--device {requested}: neither torch nor JAX sees a {requested} device here "
            f"(torch CUDA: {cuda}, JAX platforms: {sorted(platforms) or 'none'})"
        )
    return requested


def framework_device(framework: str, device: str) -> str | None:
    """Where ``framework``'s tensors live on a ``device`` run, or None when it cannot run there.

    NumPy: always ``cpu``. torch: ``cpu`` or ``cuda`` (no TPU). JAX: ``cpu``, ``gpu``, ``tpu``.
    """
    if framework == "numpy":
        return "cpu"
    if framework == "torch":
        if device == "cuda":
            return "cuda" if torch_cuda_available() else None
        return "cpu" if device == "cpu" else None
    if framework == "jax":
        platform_ = _JAX_PLATFORM[device]
        return platform_ if platform_ in jax_platforms() else None
    raise ValueError(f"unknown framework {framework!r}")


def _host_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _torch_cuda_free() -> int | None:
    if not torch_cuda_available():
        return None
    import torch

    free, _total = torch.cuda.mem_get_info()
    return int(free)


def _jax_limit(platform_: str) -> int | None:
    """What XLA lets JAX allocate on the platform's first device: ``bytes_limit`` (which
    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` sets) minus ``bytes_in_use``; None when not reported."""
    jax = _try_import("jax")
    if jax is None or platform_ not in jax_platforms():
        return None
    stats = jax.devices(platform_)[0].memory_stats()
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def memory_budgets(device: str) -> dict[str, int | None]:
    """Memory a workload may use on a ``device`` run, per framework; None when unknown.

    NumPy: the host's MemAvailable. torch on CUDA: free device memory. JAX on a GPU or TPU:
    XLA's own limit (``bytes_limit - bytes_in_use``), on a GPU also at most what is free now,
    since XLA's limit is a share of the whole device and torch's context lives there too.
    On a CPU run every framework gets the host's MemAvailable.
    """
    host = _host_available()
    if device == "cpu":
        return {"numpy": host, "torch": host, "jax": host}
    torch_free = _torch_cuda_free() if device == "cuda" else None
    jax_limit = _jax_limit(_JAX_PLATFORM[device])
    if device == "cuda" and jax_limit is not None and torch_free is not None:
        jax_limit = min(jax_limit, torch_free)
    return {"numpy": host, "torch": torch_free, "jax": jax_limit}


CpuSnapshot = tuple[float, float, float]


def cpu_snapshot() -> CpuSnapshot | None:
    """``(wall s, busy CPU s of the whole machine, CPU s of this process)`` from /proc (Linux);
    None elsewhere. Two snapshots tell how much CPU other processes took in between."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(
                int, f.readline().split()[1:9]
            )
        with open("/proc/self/stat") as f:
            own = f.read().rpartition(")")[2].split()  # fields after the command name
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    busy = user + nice + system + irq + softirq + steal  # steal: taken by the hypervisor
    return time.monotonic(), busy / hz, (int(own[11]) + int(own[12])) / hz  # utime + stime


def others_share(
    before: CpuSnapshot | None, after: CpuSnapshot | None, n_cpus: int | None = None
) -> float | None:
    """The share of the machine's CPU time that other processes (and the hypervisor) used
    between two snapshots, 0..1; None when unknown. Anything well above 0 means the timings
    were taken on a busy machine."""
    if before is None or after is None:
        return None
    n_cpus = n_cpus or os.cpu_count() or 1
    wall = after[0] - before[0]
    if wall <= 0:
        return None
    others = (after[1] - before[1]) - (after[2] - before[2])
    return min(1.0, max(0.0, others / (wall * n_cpus)))


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def set_tf32(mode: str) -> None:
    """``on`` / ``off``: allow or forbid TF32 for float32 matmuls in torch and JAX alike (torch
    through ``set_float32_matmul_precision``, which keeps its legacy and new APIs in step);
    ``default``: leave each framework's default (torch: off for matmuls; JAX on GPU: its
    DEFAULT precision, TF32). The timed rows run with it; the gates never do (IEEE float32)."""
    from conformance.ports.precision import set_float32_matmul

    set_float32_matmul(mode)


def float32_precision(mode: str) -> str:
    """The precision the peak matmul of float32 is measured at for ``--tf32 mode``: ``tf32``
    when TF32 was asked for, else ``highest`` (IEEE float32, what the project's rows pin)."""
    return "tf32" if mode == "on" else "highest"


def tf32_state() -> dict[str, Any]:
    """The TF32 / float32-matmul settings in force, as each framework reports them (every
    getter read defensively: torch's legacy getters raise once its two APIs disagree)."""
    state: dict[str, Any] = {}
    torch = _try_import("torch")
    if torch is not None:
        from conformance.ports.precision import torch_float32_state

        state.update(torch_float32_state(torch))
    jax = _try_import("jax")
    if jax is not None:
        state["jax_default_matmul_precision"] = jax.config.jax_default_matmul_precision
        state["note"] = (
            "gates run with IEEE float32 matmuls (torch TF32 off, JAX HIGHEST) whatever this "
            "says; impl_jax pins Precision.HIGHEST; jax.nn.dot_product_attention and flax use "
            "the default, which on NVIDIA GPUs runs float32 matmuls in TF32"
        )
    return state


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10,
            cwd=Path(__file__).resolve().parent.parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _version(name: str) -> str | None:
    mod = _try_import(name)
    return getattr(mod, "__version__", None) if mod is not None else None


def environment(device: str) -> dict[str, Any]:
    """Everything needed to read (and reproduce) a run: device names, versions, threads, TF32."""
    env: dict[str, Any] = {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "host": platform.node(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "versions": {
            n: _version(n)
            for n in ("numpy", "torch", "jax", "jaxlib", "flax", "ml_dtypes", "pytest_benchmark")
        },
        "threads": {
            v: os.environ.get(v)
            for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "XLA_FLAGS")
        },
        "tf32": tf32_state(),
        "git": {"commit": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain"))},
        "env": {
            v: os.environ.get(v)
            for v in (
                "XLA_PYTHON_CLIENT_PREALLOCATE",
                "XLA_PYTHON_CLIENT_MEM_FRACTION",
                "CUDA_VISIBLE_DEVICES",
                "JAX_PLATFORMS",
            )
        },
    }
    torch = _try_import("torch")
    if torch is not None:
        env["threads"]["torch.get_num_threads"] = torch.get_num_threads()
        if device == "cuda" and torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env["device_name"] = torch.cuda.get_device_name(0)
            env["cuda"] = {
                "torch.version.cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(),
                "capability": f"{props.major}.{props.minor}",
                "memory_bytes": props.total_memory,
            }
    jax = _try_import("jax")
    if jax is not None:
        env["jax_devices"] = [f"{d.platform}:{d.device_kind}" for d in jax.devices()]
        env["jax_enable_x64"] = bool(jax.config.jax_enable_x64)  # the rows' (gates: on)
        if device == "tpu":
            env["device_name"] = jax.devices("tpu")[0].device_kind
    env.setdefault("device_name", env["cpu"] if device == "cpu" else device)
    return env
