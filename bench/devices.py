"""Devices: which one to run on, where each framework's tensors live, and what the machine is.

``auto`` picks ``cuda`` when torch or JAX sees an NVIDIA GPU, then ``tpu`` when JAX sees one,
else ``cpu``. NumPy always runs on the host CPU. Everything here imports torch and JAX lazily,
so a machine without one of them still gets a report with that framework's rows marked
"not available".
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
from pathlib import Path
from typing import Any

__all__ = [
    "DEVICES",
    "CpuSnapshot",
    "available_memory_bytes",
    "cpu_name",
    "cpu_snapshot",
    "environment",
    "framework_device",
    "jax_platforms",
    "others_share",
    "resolve_device",
    "set_tf32",
    "tf32_state",
    "torch_cuda_available",
]

#: The device classes the harness knows.
DEVICES: tuple[str, ...] = ("cpu", "cuda", "tpu")
_JAX_PLATFORM = {"cpu": "cpu", "cuda": "gpu", "tpu": "tpu"}


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
        return set()
    found = set()
    for p in ("cpu", "gpu", "tpu"):
        try:
            if jax.devices(p):
                found.add(p)
        except RuntimeError:  # "Unknown backend" / no such platform
            pass
    return found


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


def available_memory_bytes(device: str) -> int | None:
    """Memory a workload may use on ``device``: free GPU memory, TPU bytes_limit, or the
    host's MemAvailable; None when unknown."""
    if device == "cuda" and torch_cuda_available():
        import torch

        free, _total = torch.cuda.mem_get_info()
        return int(free)
    if device == "tpu":
        jax = _try_import("jax")
        stats = jax.devices("tpu")[0].memory_stats() if jax is not None else None
        return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


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
    """``on`` / ``off``: set TF32 for float32 matmuls in torch and JAX alike; ``default``:
    leave each framework's default (torch: off for matmul, on for cuDNN conv; JAX on GPU:
    its DEFAULT precision, which may use TF32)."""
    if mode == "default":
        return
    if mode not in ("on", "off"):
        raise ValueError(f"--tf32 must be default, on or off; got {mode!r}")
    torch = _try_import("torch")
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = mode == "on"
        torch.backends.cudnn.allow_tf32 = mode == "on"
    jax = _try_import("jax")
    if jax is not None:
        precision = "tensorfloat32" if mode == "on" else "highest"
        jax.config.update("jax_default_matmul_precision", precision)


def tf32_state() -> dict[str, Any]:
    """The TF32 / float32-matmul settings in force, as each framework reports them."""
    state: dict[str, Any] = {}
    torch = _try_import("torch")
    if torch is not None:
        state["torch.backends.cuda.matmul.allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        state["torch.backends.cudnn.allow_tf32"] = torch.backends.cudnn.allow_tf32
        state["torch.get_float32_matmul_precision"] = torch.get_float32_matmul_precision()
    jax = _try_import("jax")
    if jax is not None:
        state["jax_default_matmul_precision"] = jax.config.jax_default_matmul_precision
        state["note"] = (
            "impl_jax pins Precision.HIGHEST; jax.nn.dot_product_attention and flax use the "
            "default, which on NVIDIA GPUs may run float32 matmuls in TF32"
        )
    return state


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10,
            cwd=Path(__file__).resolve().parent.parent,
        )  # fmt: skip
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
            for v in ("XLA_PYTHON_CLIENT_PREALLOCATE", "CUDA_VISIBLE_DEVICES", "JAX_PLATFORMS")
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
        env["jax_enable_x64"] = bool(jax.config.jax_enable_x64)
        if device == "tpu":
            env["device_name"] = jax.devices("tpu")[0].device_kind
    env.setdefault("device_name", env["cpu"] if device == "cpu" else device)
    return env
