"""What a run gives: its :class:`Outcome`, and a port's :class:`Report` (the summary line, the
table per family, the JSON that ``--report`` writes)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from conformance.fixtures import Case


@dataclass(frozen=True)
class Run:
    """One fixture against one port function."""

    case: Case
    function: str  # alias, a key of FUNCTIONS
    shards: int | None = None  # n, for a sharded alias's value run

    @property
    def id(self) -> str:
        n = "" if self.shards is None else f".n{self.shards}"
        return self.function + n + self.case.id[len(self.case.op) :]

    @property
    def family(self) -> str:
        return f"{self.function}.{self.case.feature}"


#: The statuses of a run. ``ok``: pass, xfail (failed as listed), skip (listed ``skip:``, not
#: run) and retried (the port killed its process once, and the run passed in a fresh one:
#: counted and listed apart, so a flaky crash is seen); a failure: fail, xpass (listed, but
#: passed: so the list stays true) and crash (the port killed its process, a signal or an
#: abort, and did again on the retry).
STATUSES = ("pass", "fail", "xfail", "xpass", "skip", "crash", "retried")


@dataclass
class Outcome:
    """The result of one run (``status``: one of :data:`STATUSES`)."""

    run_id: str
    family: str
    dtype: str
    device: str
    status: str
    message: str = ""
    error: float | None = None
    bound: float | None = None
    xfail_reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("pass", "xfail", "skip", "retried")

    @property
    def ratio(self) -> float | None:
        if self.error is None or not self.bound:
            return None
        return self.error / self.bound

    def shown(self, show_xfails: bool = False) -> bool:
        """Whether the run gets its own line: a failure or a retry; xfails and skips if asked."""
        return (
            not self.ok
            or self.status == "retried"
            or (show_xfails and self.status in ("xfail", "skip"))
        )

    def line(self) -> str:
        tags = {"fail": "FAIL", "xpass": "XPASS", "crash": "CRASH", "retried": "RETRIED"}
        text = f"{tags.get(self.status, self.status)} {self.run_id} [{self.device} {self.dtype}]: "
        text += self.message
        if self.status == "xpass":
            text += f" (listed as known failure: {self.xfail_reason}; remove it from the xfails)"
        return text


@dataclass
class Report:
    """All outcomes of one port on one device."""

    port: str
    device: str
    outcomes: list[Outcome]
    seconds: float = 0.0
    error: str = ""  # set when the port could not be loaded at all
    host_port: bool = False  # a NumPy port asked for another device: it ran on the host
    complete: bool = True  # False while the run is going on, or when it was interrupted
    planned: int | None = None  # the runs of its plan (None: the plan was never made)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    @property
    def ok(self) -> bool:
        return not self.error and not self.failures and self.complete

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for o in self.outcomes:
            out[o.status] += 1
        return out

    def families(self) -> dict[str, list[Outcome]]:
        groups: dict[str, list[Outcome]] = {}
        for o in self.outcomes:
            groups.setdefault(o.family, []).append(o)
        return groups

    def summary(self) -> str:
        """``impl_numpy on cpu: 503 runs: 500 passed, 1 failed, ...`` (crashed, retried and
        skipped runs counted when there are any)."""
        if self.error:
            return f"{self.port} [{self.device}]: could not load the port: {self.error}"
        c = self.counts()
        where = self.device + (" (NumPy port, computes on the host)" if self.host_port else "")
        parts = [f"{c['pass']} passed", f"{c['fail']} failed", f"{c['xfail']} xfail",
                 f"{c['xpass']} xpass"]
        for status, done in (("crash", "crashed"), ("retried", "retried"), ("skip", "skipped")):
            if c[status]:
                parts.append(f"{c[status]} {done}")
        note = "" if self.complete else " INCOMPLETE (interrupted)"
        return (
            f"{self.port} on {where}: {len(self.outcomes)} runs: {', '.join(parts)} "
            f"({self.seconds:.1f} s){note}"
        )

    def table(self, *, show_xfails: bool = False, failures: bool = True) -> str:
        """A compact table per family (a column of retried runs when there are any), then
        (``failures``) one line per failure and per retried run."""
        if self.error:
            return self.summary()
        retried = any(o.status == "retried" for o in self.outcomes)
        head = f"  {'family':<30} {'passed':>8} {'xfail':>6} {'skip':>5} {'failed':>7}"
        lines = [self.summary(), head + f" {'retried':>8}" * retried + "  worst err/bound"]
        for family, outs in sorted(self.families().items()):
            n = {s: sum(o.status == s for o in outs) for s in ("pass", "xfail", "skip", "retried")}
            n_fail = sum(not o.ok for o in outs)
            ratios = [o.ratio for o in outs if o.status in ("pass", "retried")]
            ratios = [r for r in ratios if r is not None]
            worst = f"{max(ratios):.2f}" if ratios else "-"
            passed = f"{n['pass']}/{len(outs)}"
            row = (
                f"  {family:<30} {passed:>8} {n['xfail'] or '':>6} {n['skip'] or '':>5} "
                f"{n_fail or '':>7}"
            )
            lines.append(row + f" {n['retried'] or '':>8}" * retried + f"  {worst}")
        if failures:
            lines += ["  " + o.line() for o in self.outcomes if o.shown(show_xfails)]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "device": self.device,
            "ok": self.ok,
            "complete": self.complete,
            "planned": self.planned,
            "error": self.error,
            "seconds": round(self.seconds, 3),
            "counts": self.counts(),
            "outcomes": [asdict(o) for o in self.outcomes],
        }


def write_report(reports: Sequence[Report], path: str | Path) -> None:
    """Write the reports as JSON, atomically (a run killed while writing leaves the last one)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps([r.to_json() for r in reports], indent=1) + "\n")
    os.replace(tmp, path)
