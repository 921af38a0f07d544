"""How a run fails: the exceptions the runner raises inside a run, and where they came from.

A run's check raises :class:`_Failed` with the message the report prints (and, for a number
out of bounds, the error and the bound); :func:`_raised` turns a port's exception into one,
naming the class, the message and the line of the port that raised it.
"""

from __future__ import annotations

import traceback
from pathlib import Path


class _Failed(Exception):
    """A run's check failed; carries the numbers for the report."""

    def __init__(self, message: str, error: float | None = None, bound: float | None = None):
        super().__init__(message)
        self.error, self.bound = error, bound


class _NoDevices(_Failed):
    """A sharded value run that the port cannot place on this machine: reported as skip."""


class _AdapterFailed(_Failed):
    """One of the port's adapters (``from_numpy``, ``to_numpy``, ``prepare``) raised."""


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:limit]


def _frame(f: traceback.FrameSummary) -> str:
    return f"{Path(f.filename).name}:{f.lineno} in {f.name}"


def _where_raised(exc: BaseException) -> str:
    """`` (file.py:12 in function)``: the innermost frame that raised ``exc``."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {_frame(frames[-1])})" if frames else ""


def _raised(exc: BaseException, prefix: str = "") -> _Failed:
    """The failure of a port function that raised ``exc``: its class, message and line (a
    sharded function's ``shard_devices``: the machine lacks the devices, and the run is
    skipped)."""
    if isinstance(exc, _Failed):  # the runner's own verdict from inside the call (--exec)
        return exc
    if getattr(exc, "code", None) == "shard_devices":
        return _NoDevices(f"skipped: too few devices here: {_first_line(exc, 400)}")
    return _Failed(f"{prefix}raised {type(exc).__name__}: {_first_line(exc)}{_where_raised(exc)}")
