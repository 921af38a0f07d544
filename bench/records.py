"""What a case ends as: one :class:`Record`, as stored in results.json, and its one-line summary.

Statuses:

- ``ok``: gated and timed;
- ``failed``: the correctness gate did not pass; never timed;
- ``n/a``: the row's code does not exist (yet), or its framework cannot run on this device;
- ``skipped``: the workload does not fit (memory), or is outside what a host row runs on an
  accelerator grid, or the run's time budget was spent, or the pytest arguments deselected it;
- ``unsupported``: the framework has no kernel for it (e.g. an SDPA backend and a dtype);
- ``oom``: it ran out of memory; ``error``: anything else went wrong (``bench/errors.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bench.report import memory_text

__all__ = ["STATS", "Record", "summary"]

#: The pytest-benchmark statistics a timed record keeps.
STATS = ("min", "max", "mean", "stddev", "median", "iqr", "q1", "q3", "rounds")


@dataclass
class Record:
    """The outcome of one case, as stored in results.json."""

    case_id: str
    kind: str
    row: str
    row_kind: str
    framework: str
    device: str | None
    status: str
    reason: str = ""
    workload: dict[str, Any] | None = None
    gate: dict[str, Any] | None = None
    compile_s: float | None = None
    memory_bytes: int | None = None
    memory_method: str = ""
    skips_masked: bool | None = None
    stats: dict[str, float] | None = None
    iterations: int | None = None
    matmul: dict[str, Any] | None = None
    contention: float | None = None  # share of the CPUs other processes used while timing
    goal: dict[str, Any] | None = None  # a goal case: the pair, the per-round ratios, spread
    wall_s: float | None = None  # the case's own seconds: gate (its first use), prepare, calls
    #: numbers a timed call carries from its preparer (``Prepared.derived``: a sharded call's
    #: ``sent_bytes``); the report adds the timed ones beside them
    derived: dict[str, Any] | None = None

    def to_dict(self) -> dict:
        """The record as stored in results.json (``derived`` only where there are numbers)."""
        d = asdict(self)
        if d["derived"] is None:
            del d["derived"]
        return d


def summary(rec: Record) -> str:
    """One line for a finished case: ``numpy sdpa | attention.mha... | ok 12.3 ms``."""
    what = f"{rec.row} | {rec.workload['label'] if rec.workload else rec.case_id}"
    if rec.kind == "goal" and rec.status == "ok" and rec.goal and rec.goal["kind"] == "memory":
        g = rec.goal
        return f"goal {rec.row} {g['text']} | {memory_text(g)} {g['status']}"
    if rec.kind == "goal" and rec.status == "ok" and rec.goal:
        q = rec.goal["ratio"]
        return (
            f"goal {rec.row} {rec.goal['text']} | {q['median']:.2f}x "
            f"(IQR {q['q1']:.2f}-{q['q3']:.2f}, {rec.goal['rounds']} rounds) {rec.goal['status']}"
            + (
                f", peak {rec.goal['a_peak_bytes'] / 2**20:.1f} MiB"
                if rec.goal.get("a_peak_bytes") is not None
                else ""
            )
        )
    if rec.status == "ok" and rec.stats:
        return f"{what} | ok {rec.stats['median'] * 1e3:.3g} ms"
    return f"{what} | {rec.status}: {rec.reason[:100]}"
